"""Tests for CALM's risk-controlling threshold calibration (CALM §4, Learn-then-Test p-values and testing)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from exitbench.calibration import (
    CalibrationResult,
    bentkus_pvalue,
    calibrate_threshold,
    decaying_threshold,
    fixed_sequence_test,
    hoeffding_bentkus_pvalue,
    hoeffding_pvalue,
    min_calibration_size,
)
from exitbench.errors import ExitbenchError


def _hand_hoeffding(mean: float, n: int, delta: float) -> float:
    a = min(mean, delta)
    h1 = (a * math.log(a / delta) if a > 0 else 0.0) + (1 - a) * math.log((1 - a) / (1 - delta))
    return math.exp(-n * h1)


def _hand_bentkus(k: int, n: int, delta: float) -> float:
    cdf = math.fsum(math.comb(n, i) * delta**i * (1 - delta) ** (n - i) for i in range(k + 1))
    return min(1.0, math.e * cdf)


# (mean, n, delta, ceil(n * mean))
CASES = [(0.1, 100, 0.2, 10), (0.05, 40, 0.15, 2), (0.12, 50, 0.25, 6), (0.3, 30, 0.4, 9), (0.013, 77, 0.05, 2)]


@pytest.mark.parametrize(("mean", "n", "delta", "k"), CASES)
def test_pvalues_match_hand_computation(mean: float, n: int, delta: float, k: int) -> None:
    h = _hand_hoeffding(mean, n, delta)
    b = _hand_bentkus(k, n, delta)
    assert hoeffding_pvalue(mean, n, delta) == pytest.approx(h, rel=1e-9, abs=1e-15)
    assert bentkus_pvalue(mean, n, delta) == pytest.approx(b, rel=1e-9, abs=1e-15)
    assert hoeffding_bentkus_pvalue(mean, n, delta) == pytest.approx(min(h, b), rel=1e-9, abs=1e-15)


def test_pvalues_literal_anchors() -> None:
    # mean 0.1, n 100, delta 0.2: h1 = 0.1 ln 0.5 + 0.9 ln 1.125, p = exp(-100 h1).
    h1 = 0.1 * math.log(0.5) + 0.9 * math.log(1.125)
    assert hoeffding_pvalue(0.1, 100, 0.2) == pytest.approx(math.exp(-100 * h1), rel=1e-12)
    assert hoeffding_pvalue(0.1, 100, 0.2) == pytest.approx(0.025502, abs=1e-6)
    # mean 0: Hoeffding gives (1 - delta)^n, Bentkus e (1 - delta)^n; HB takes the smaller.
    assert hoeffding_pvalue(0.0, 20, 0.1) == pytest.approx(0.9**20, rel=1e-12)
    assert bentkus_pvalue(0.0, 20, 0.1) == pytest.approx(math.e * 0.9**20, rel=1e-12)
    assert hoeffding_bentkus_pvalue(0.0, 20, 0.1) == pytest.approx(0.9**20, rel=1e-12)


def test_bentkus_uses_exact_count_for_k_over_n_means() -> None:
    # 30 * 0.1 == 3.0000000000000004 in floating point; the count is 3, not 4.
    assert bentkus_pvalue(0.1, 30, 0.3) == pytest.approx(_hand_bentkus(3, 30, 0.3), rel=1e-12)
    assert bentkus_pvalue(3 / 30, 30, 0.3) == pytest.approx(_hand_bentkus(3, 30, 0.3), rel=1e-12)
    # A genuinely fractional n * mean still rounds up.
    assert bentkus_pvalue(0.105, 30, 0.3) == pytest.approx(_hand_bentkus(4, 30, 0.3), rel=1e-12)


@pytest.mark.parametrize("delta", [0.05, 0.2, 0.5])
def test_hoeffding_is_one_at_or_above_delta(delta: float) -> None:
    for mean in [delta, delta + 1e-9, (delta + 1) / 2, 1.0]:
        assert hoeffding_pvalue(mean, 500, delta) == 1.0
        assert hoeffding_bentkus_pvalue(mean, 500, delta) == 1.0
    assert hoeffding_pvalue(delta * 0.9, 500, delta) < 1.0


@pytest.mark.parametrize("pvalue", [hoeffding_pvalue, bentkus_pvalue, hoeffding_bentkus_pvalue])
def test_pvalues_increase_with_mean_risk(pvalue) -> None:
    n, delta = 200, 0.2
    ps = [pvalue(m, n, delta) for m in np.linspace(0.0, 0.3, 121)]
    assert all(b >= a for a, b in itertools.pairwise(ps))
    assert ps[0] < 1e-10 and ps[-1] == 1.0


def test_hoeffding_decreases_with_n() -> None:
    for mean in [0.0, 0.05, 0.15]:
        ps = [hoeffding_pvalue(mean, n, 0.2) for n in range(1, 400)]
        assert all(b < a for a, b in itertools.pairwise(ps))


@pytest.mark.parametrize("pvalue", [bentkus_pvalue, hoeffding_bentkus_pvalue])
def test_bentkus_and_hb_decrease_with_n(pvalue) -> None:
    # Bentkus uses ceil(n * mean), so it is monotone in n only along n with an integral n * mean.
    ps = [pvalue(0.1, n, 0.2) for n in range(10, 1001, 10)]
    assert all(b < a for a, b in itertools.pairwise(ps))
    assert ps[-1] < 1e-6


def test_fixed_sequence_stops_at_first_failure() -> None:
    assert fixed_sequence_test([0.01, 0.02, 0.5, 0.001, 0.001], 0.05) == 1
    assert fixed_sequence_test([0.2, 0.001, 0.001], 0.05) == -1
    assert fixed_sequence_test([0.01, 0.04, 0.049], 0.05) == 2
    assert fixed_sequence_test([0.05, 0.0500001], 0.05) == 0  # p <= epsilon rejects
    assert fixed_sequence_test([], 0.05) == -1
    with pytest.raises(ExitbenchError):
        fixed_sequence_test([0.01, 1.5], 0.05)
    with pytest.raises(ExitbenchError):
        fixed_sequence_test([0.01], 0.0)


def test_calibrate_threshold_picks_last_certified() -> None:
    n = 400
    thresholds = [0.9, 0.7, 0.5, 0.3, 0.1]
    # Empirical risks 0, 0.05, 0.1, 0.25, 0.0 (the last is certifiable but comes after a failure).
    rates = [0.0, 0.05, 0.1, 0.25, 0.0]
    risks = [[1.0] * round(r * n) + [0.0] * (n - round(r * n)) for r in rates]
    res = calibrate_threshold(thresholds, risks, delta=0.2, epsilon=0.05)
    assert isinstance(res, CalibrationResult)
    assert res.index == 2 and res.threshold == 0.5 and res.n == n
    assert res.mean_risks == pytest.approx(tuple(rates))
    assert res.pvalues == pytest.approx(tuple(hoeffding_bentkus_pvalue(r, n, 0.2) for r in rates))
    with pytest.raises(AttributeError):
        res.threshold = 0.1  # type: ignore[misc]


def test_calibrate_threshold_fallback_never_exits() -> None:
    # Too few examples to certify anything: lambda = 1 (never exit early).
    res = calibrate_threshold([0.8, 0.6], [[0.0] * 5, [0.0] * 5], delta=0.2, epsilon=0.05)
    assert res.index == -1 and res.threshold == 1.0
    res = calibrate_threshold([0.8, 0.6], [[1.0] * 300, [1.0] * 300], delta=0.2, epsilon=0.05)
    assert res.index == -1 and res.threshold == 1.0 and res.pvalues == (1.0, 1.0)


def test_calibrate_threshold_accepts_fractional_risks_and_arrays() -> None:
    rng = np.random.default_rng(7)
    risks = np.vstack([rng.uniform(0.0, 0.1, 500), rng.uniform(0.0, 0.9, 500)])
    res = calibrate_threshold(np.array([0.9, 0.4]), risks, delta=0.2, epsilon=0.1)
    assert res.index == 0 and res.threshold == 0.9


@pytest.mark.parametrize(
    ("thresholds", "risks", "match"),
    [
        ([0.5, 0.7], [[0.0], [0.0]], "strictly decreasing"),
        ([0.5, 0.5], [[0.0], [0.0]], "strictly decreasing"),
        ([], [], "empty"),
        ([0.9, 0.5], [[0.0]], "rows"),
        ([0.9, 0.5], [[0.0, 0.0], [0.0]], "same n"),
        ([0.9], [[]], "non-empty"),
        ([0.9], [[0.0, 1.2]], r"\[0, 1\]"),
        ([0.9], [[0.0, float("nan")]], r"\[0, 1\]"),
        ([1.5, 0.5], [[0.0], [0.0]], r"\[0, 1\]"),
    ],
)
def test_calibrate_threshold_rejects_bad_input(thresholds, risks, match: str) -> None:
    with pytest.raises(ExitbenchError, match=match) as info:
        calibrate_threshold(thresholds, risks, delta=0.2, epsilon=0.05)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("mean", "n", "delta"),
    [(-0.1, 10, 0.2), (1.1, 10, 0.2), (0.1, 0, 0.2), (0.1, 2.5, 0.2), (0.1, 10, 0.0), (0.1, 10, 1.0)],
)
def test_pvalues_reject_bad_input(mean: float, n: int, delta: float) -> None:
    for pvalue in (hoeffding_pvalue, bentkus_pvalue, hoeffding_bentkus_pvalue):
        with pytest.raises(ExitbenchError):
            pvalue(mean, n, delta)


def test_risk_guarantee_holds_over_random_splits() -> None:
    """CALM's guarantee: P(R(lambda_hat) <= delta) >= 1 - epsilon over calibration samples (delta 0.2, eps 0.05)."""
    delta, epsilon, n_cal, n_test, splits = 0.2, 0.05, 200, 200, 200
    true_means = np.linspace(0.0, 0.5, 20)  # risk grows as the threshold goes down
    thresholds = np.linspace(0.95, 0.0, 20)
    violations, naive_violations, chosen, test_risks = 0, 0, [], []
    for seed in range(splits):
        rng = np.random.default_rng(seed)
        # One latent difficulty per example: exiting at a lower threshold errs on a superset of examples,
        # with P(error at threshold i) = true_means[i]. Shuffle into a calibration and a test split.
        u = rng.random(n_cal + n_test)[rng.permutation(n_cal + n_test)]
        cal = (u[None, :n_cal] < true_means[:, None]).astype(float)
        res = calibrate_threshold(thresholds, cal, delta, epsilon)
        true_risk = true_means[res.index] if res.index >= 0 else 0.0  # fallback: never exit, no risk
        violations += true_risk > delta
        chosen.append(res.index)
        if res.index >= 0:
            test_risks.append(float(np.mean(u[n_cal:] < true_means[res.index])))
        # The uncorrected rule "lowest threshold whose empirical risk is <= delta" must fail often,
        # so this test can tell a valid calibrator from a naive one.
        ok = np.flatnonzero(cal.mean(axis=1) <= delta)
        naive_violations += true_means[ok.max()] > delta
    assert violations <= epsilon * splits
    assert naive_violations > epsilon * splits
    # Not vacuous: the calibrator does exit early, at a useful threshold, in most splits.
    assert np.mean(np.array(chosen) >= 3) >= 0.9
    assert np.mean(test_risks) <= delta  # held-out risk of the chosen thresholds


def test_decaying_threshold_endpoints() -> None:
    for lam in [0.0, 0.3, 0.8, 1.0]:
        assert decaying_threshold(lam, 0, 64, 4.0) == pytest.approx(0.9 * lam + 0.1, rel=1e-15)
        assert decaying_threshold(lam, 10**6, 64, 4.0) == pytest.approx(0.9 * lam, abs=1e-12)
        # tau = 0: no decay.
        assert decaying_threshold(lam, 50, 64, 0.0) == pytest.approx(0.9 * lam + 0.1, rel=1e-15)
    assert decaying_threshold(0.5, 32, 64, 2.0) == pytest.approx(0.45 + 0.1 * math.exp(-1.0), rel=1e-15)
    ts = [decaying_threshold(0.6, t, 100, 3.0) for t in range(101)]
    assert all(b < a for a, b in itertools.pairwise(ts))


def test_decaying_threshold_clips_to_unit_interval() -> None:
    # A negative temperature grows the threshold; the clip holds it at 1 (and no overflow).
    assert decaying_threshold(1.0, 10, 10, -5.0) == 1.0
    assert decaying_threshold(0.9, 10**9, 1, -5.0) == 1.0
    assert 0.0 <= decaying_threshold(0.0, 10**9, 1, 5.0) <= 1e-12


@pytest.mark.parametrize(
    ("lam", "t", "num_tokens", "tau"),
    [
        (1.2, 0, 10, 1.0),
        (-0.1, 0, 10, 1.0),
        (0.5, -1, 10, 1.0),
        (0.5, 0, 0, 1.0),
        (0.5, 1.5, 10, 1.0),
        (0.5, 0, 10, float("inf")),
        (0.5, 0, 10, float("nan")),
    ],
)
def test_decaying_threshold_rejects_bad_input(lam: float, t: int, num_tokens: int, tau: float) -> None:
    with pytest.raises(ExitbenchError):
        decaying_threshold(lam, t, num_tokens, tau)


@pytest.mark.parametrize(("delta", "expected"), [(0.1, 29), (0.2, 14), (0.3, 9)])
def test_min_calibration_size_is_the_least_n_that_can_certify(delta, expected):
    """The params.yaml comment's numbers: at epsilon .05 a zero-risk threshold is certified from these n on."""
    n = min_calibration_size(delta, 0.05)
    assert n == expected
    assert hoeffding_bentkus_pvalue(0.0, n, delta) <= 0.05 < hoeffding_bentkus_pvalue(0.0, n - 1, delta)
    assert calibrate_threshold([0.5], [[0.0] * n], delta, 0.05).index == 0
    assert calibrate_threshold([0.5], [[0.0] * (n - 1)], delta, 0.05).index == -1
    assert min_calibration_size(0.99, 0.5) == 1
