"""Tests for the self-speculative decoding cost model (LayerSkip §4.3; Leviathan et al. 2023 eq. (1), Thm 3.8)."""

from __future__ import annotations

import itertools
import math

import pytest

from exitbench.cost_model import (
    acceptance_rate_from_alpha,
    alpha_from_acceptance_rate,
    expected_tokens_per_round,
    fraction_of_ideal,
    ideal_speedup,
    optimal_speculations,
    predict_speedup,
)
from exitbench.errors import ExitbenchError

ALPHAS = [0.0, 0.05, 0.3, 0.5, 0.8, 0.95, 0.999, 1.0]
DS = [1, 2, 3, 4, 8, 16]


@pytest.mark.parametrize("d", DS)
@pytest.mark.parametrize("a", ALPHAS)
def test_expected_tokens_matches_geometric_sum(a: float, d: int) -> None:
    assert expected_tokens_per_round(a, d) == pytest.approx(sum(a**k for k in range(d + 1)), rel=1e-12)


def test_expected_tokens_known_values_and_limits() -> None:
    assert expected_tokens_per_round(0.5, 3) == pytest.approx(1.875, rel=1e-15)
    assert expected_tokens_per_round(0.0, 5) == 1.0
    assert expected_tokens_per_round(1.0, 5) == 6.0
    # Continuous at a -> 1 (no catastrophic cancellation in (1 - a^(d+1)) / (1 - a)).
    assert expected_tokens_per_round(1.0 - 1e-12, 5) == pytest.approx(6.0, rel=1e-9)
    assert expected_tokens_per_round(1e-12, 5) == pytest.approx(1.0, rel=1e-9)


@pytest.mark.parametrize("d", DS)
def test_expected_tokens_increases_with_alpha(d: int) -> None:
    values = [expected_tokens_per_round(i / 100, d) for i in range(101)]
    assert all(b > a for a, b in itertools.pairwise(values))


def test_ideal_speedup_matches_leviathan_theorem_3_8_when_verify_costs_one_step() -> None:
    # Thm 3.8: (1 - a^(g+1)) / ((1 - a)(g c + 1)).
    for a, g, c in [(0.6, 4, 0.1), (0.9, 7, 0.05), (0.3, 2, 0.5)]:
        expected = (1 - a ** (g + 1)) / ((1 - a) * (g * c + 1))
        assert ideal_speedup(a, g, c, 1.0) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("d", "c_e", "c_v"), [(1, 0.25, 0.8), (4, 0.1, 0.9), (12, 0.3, 0.7)])
def test_ideal_speedup_edge_cases(d: int, c_e: float, c_v: float) -> None:
    cost = d * c_e + c_v
    assert ideal_speedup(0.0, d, c_e, c_v) == pytest.approx(1.0 / cost, rel=1e-15)
    assert ideal_speedup(1e-12, d, c_e, c_v) == pytest.approx(1.0 / cost, rel=1e-9)
    assert ideal_speedup(1.0, d, c_e, c_v) == pytest.approx((d + 1) / cost, rel=1e-15)
    assert ideal_speedup(1.0 - 1e-12, d, c_e, c_v) == pytest.approx((d + 1) / cost, rel=1e-9)


def test_ideal_speedup_worked_example() -> None:
    # a = 0.5, d = 3 -> 1.875 tokens per round; cost 3 * 0.2 + 0.6 = 1.2 -> 1.5625x.
    assert ideal_speedup(0.5, 3, 0.2, 0.6) == pytest.approx(1.5625, rel=1e-14)


def test_acceptance_rate_known_values() -> None:
    assert acceptance_rate_from_alpha(0.0, 4) == 0.0
    assert acceptance_rate_from_alpha(1.0, 4) == 1.0
    assert acceptance_rate_from_alpha(0.37, 1) == pytest.approx(0.37, rel=1e-15)
    assert acceptance_rate_from_alpha(0.5, 2) == pytest.approx((0.5 + 0.25) / 2, rel=1e-15)
    assert acceptance_rate_from_alpha(0.5, 4) == pytest.approx((0.5 + 0.25 + 0.125 + 0.0625) / 4, rel=1e-15)
    # Accepting a prefix makes the rate strictly below a for d >= 2 and 0 < a < 1.
    assert acceptance_rate_from_alpha(0.8, 6) < 0.8


@pytest.mark.parametrize("d", DS)
@pytest.mark.parametrize("a", ALPHAS)
def test_alpha_round_trip(a: float, d: int) -> None:
    rate = acceptance_rate_from_alpha(a, d)
    assert alpha_from_acceptance_rate(rate, d) == pytest.approx(a, abs=1e-9)


@pytest.mark.parametrize("d", [1, 3, 8])
def test_alpha_from_rate_is_monotone_with_fixed_endpoints(d: int) -> None:
    assert alpha_from_acceptance_rate(0.0, d) == 0.0
    assert alpha_from_acceptance_rate(1.0, d) == 1.0
    alphas = [alpha_from_acceptance_rate(i / 50, d) for i in range(51)]
    assert all(b > a for a, b in itertools.pairwise(alphas))
    if d > 1:  # the rate understates alpha, so the inverse lies above the diagonal
        assert all(alpha > i / 50 for i, alpha in enumerate(alphas[1:-1], start=1))


def test_optimal_speculations_matches_brute_force() -> None:
    def c_verify(d: int) -> float:
        return 0.5 + 0.02 * (d + 1)

    for a in [0.2, 0.6, 0.9, 0.99]:
        d_values = range(1, 21)
        best_d, best = optimal_speculations(a, 0.15, c_verify, d_values)
        brute = max(d_values, key=lambda d: ideal_speedup(a, d, 0.15, c_verify(d)))
        assert best_d == brute
        assert best == pytest.approx(ideal_speedup(a, brute, 0.15, c_verify(brute)), rel=1e-15)


def test_optimal_speculations_trends() -> None:
    # Nothing is ever accepted: drafting more only costs more, so the fewest drafts win.
    assert optimal_speculations(0.0, 0.2, lambda d: 0.8, [4, 2, 8, 1])[0] == 1
    # Everything is accepted and drafting is cheap: the most drafts win.
    best_d, best = optimal_speculations(1.0, 0.05, lambda d: 0.9, [1, 2, 4, 8])
    assert best_d == 8
    assert best == pytest.approx(9 / (8 * 0.05 + 0.9))
    # Higher acceptance never favours fewer drafts here.
    picks = [optimal_speculations(a, 0.2, lambda d: 0.7, range(1, 31))[0] for a in (0.3, 0.6, 0.8, 0.95)]
    assert picks == sorted(picks) and picks[0] < picks[-1]


def test_optimal_speculations_ties_go_to_smallest_d() -> None:
    # Constant speed-up for every d: tokens (d+1) at a = 1 over cost (d+1) * 1.
    assert optimal_speculations(1.0, 1.0, lambda d: 1.0, [3, 1, 2]) == (1, 1.0)


def test_optimal_speculations_rejects_bad_input() -> None:
    with pytest.raises(ExitbenchError, match="empty"):
        optimal_speculations(0.5, 0.2, lambda d: 0.8, [])
    with pytest.raises(ExitbenchError, match="c_verify_fn"):
        optimal_speculations(0.5, 0.2, lambda d: 0.0, [1, 2])
    with pytest.raises(ExitbenchError):
        optimal_speculations(0.5, 0.2, lambda d: 0.8, [0, 1])


def test_predict_speedup() -> None:
    out = predict_speedup(0.75, 2, 0.2, 0.6)
    assert set(out) == {"alpha", "tokens_per_round", "predicted_speedup"}
    # rate 0.75 at d = 2: (a + a^2) / 2 = 0.75 -> a = 0.5 * (sqrt(7) - 1).
    alpha = 0.5 * (math.sqrt(7.0) - 1.0)
    assert out["alpha"] == pytest.approx(alpha, abs=1e-12)
    assert out["tokens_per_round"] == pytest.approx(1 + alpha + alpha**2, rel=1e-12)
    assert out["predicted_speedup"] == pytest.approx((1 + alpha + alpha**2) / (2 * 0.2 + 0.6), rel=1e-12)
    # Tokens per round = 1 + d * rate, whatever alpha is.
    for rate, d in [(0.1, 5), (0.6, 8), (0.93, 3)]:
        assert predict_speedup(rate, d, 0.1, 0.9)["tokens_per_round"] == pytest.approx(1 + d * rate, rel=1e-9)
    full = predict_speedup(1.0, 4, 0.1, 0.8)
    assert full == {"alpha": 1.0, "tokens_per_round": 5.0, "predicted_speedup": pytest.approx(5.0 / 1.2)}


def test_fraction_of_ideal() -> None:
    assert fraction_of_ideal(1.5, 2.0) == 0.75
    assert fraction_of_ideal(0.0, 1.3) == 0.0
    with pytest.raises(ExitbenchError):
        fraction_of_ideal(1.0, 0.0)
    with pytest.raises(ExitbenchError):
        fraction_of_ideal(-0.1, 1.0)
    with pytest.raises(ExitbenchError):
        fraction_of_ideal(float("nan"), 1.0)


@pytest.mark.parametrize("a", [-0.01, 1.01, float("nan"), float("inf"), True, "0.5"])
def test_bad_alpha_raises(a: object) -> None:
    with pytest.raises(ExitbenchError, match="in \\[0, 1\\]"):
        expected_tokens_per_round(a, 3)  # type: ignore[arg-type]
    with pytest.raises(ExitbenchError):
        ideal_speedup(a, 3, 0.1, 0.9)  # type: ignore[arg-type]
    with pytest.raises(ExitbenchError):
        alpha_from_acceptance_rate(a, 3)  # type: ignore[arg-type]


@pytest.mark.parametrize("d", [0, -2, 1.5, True, None])
def test_bad_d_raises(d: object) -> None:
    with pytest.raises(ExitbenchError, match="d \\(number of drafted tokens\\)"):
        expected_tokens_per_round(0.5, d)  # type: ignore[arg-type]
    with pytest.raises(ExitbenchError):
        acceptance_rate_from_alpha(0.5, d)  # type: ignore[arg-type]
    with pytest.raises(ExitbenchError):
        predict_speedup(0.5, d, 0.1, 0.9)  # type: ignore[arg-type]


@pytest.mark.parametrize("cost", [0.0, -0.5, float("inf"), float("nan")])
def test_bad_costs_raise(cost: float) -> None:
    with pytest.raises(ExitbenchError, match="c_draft"):
        ideal_speedup(0.5, 3, cost, 0.9)
    with pytest.raises(ExitbenchError, match="c_verify"):
        ideal_speedup(0.5, 3, 0.1, cost)
    with pytest.raises(ExitbenchError):
        optimal_speculations(0.5, cost, lambda d: 0.9, [1, 2])


def test_error_messages_are_one_line() -> None:
    with pytest.raises(ExitbenchError) as info:
        ideal_speedup(2.0, 0, 0.1, 0.9)
    assert "\n" not in str(info.value)


def test_the_tail_of_a_round_is_paid_once_per_round():
    """c_tail (the last draft's early layers, run by a verification that starts at the exit) adds to the round's
    cost once, whatever d; 0 gives the paper's form."""
    assert ideal_speedup(0.5, 3, 0.2, 0.6, 0.0) == ideal_speedup(0.5, 3, 0.2, 0.6)
    tokens = (1 - 0.5**4) / 0.5
    assert ideal_speedup(0.5, 3, 0.2, 0.6, 0.15) == pytest.approx(tokens / (3 * 0.2 + 0.15 + 0.6), rel=1e-14)
    for bad in (-0.1, float("nan"), True):
        with pytest.raises(ExitbenchError, match="c_tail"):
            ideal_speedup(0.5, 3, 0.2, 0.6, bad)
