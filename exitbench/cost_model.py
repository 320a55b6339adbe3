"""Analytic cost model for self-speculative decoding (LayerSkip §4.3, arXiv:2404.16710).

A round drafts ``d`` tokens through the first ``E`` layers plus the shared LM head, then verifies all
``d`` drafts with one forward of layers ``E..L-1`` over ``d + 1`` positions, reusing the draft's
KV cache. Costs are relative to one full greedy decoding step (a forward of all ``L`` layers):

- ``c_draft`` (c_E): cost of one draft step;
- ``c_verify`` (c_V): cost of one verification forward.

Acceptance follows the i.i.d. model of Leviathan et al. 2023 ("Fast Inference from Transformers via
Speculative Decoding", arXiv:2211.17192): each draft is accepted with probability ``a`` (their alpha),
independently, and a round stops at the first rejection.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from numbers import Integral, Real

from scipy.optimize import brentq

from exitbench.errors import ExitbenchError

#: the label suffix of a ``bench_decoding`` sweep row whose draft proposes from a sub-vocabulary (its own costs)
SUBVOCAB_TAG = "+subvocab"


def _check_alpha(a: float, name: str = "a") -> float:
    if isinstance(a, bool) or not isinstance(a, Real) or not 0.0 <= float(a) <= 1.0:
        raise ExitbenchError(f"{name} must be a probability in [0, 1], got {a!r}")
    return float(a)


def _check_d(d: int) -> int:
    if isinstance(d, bool) or not isinstance(d, Integral) or int(d) < 1:
        raise ExitbenchError(f"d (number of drafted tokens) must be an integer >= 1, got {d!r}")
    return int(d)


def _check_cost(c: float, name: str) -> float:
    if isinstance(c, bool) or not isinstance(c, Real) or not math.isfinite(float(c)) or float(c) <= 0.0:
        raise ExitbenchError(f"{name} must be a finite cost > 0 (relative to one full decoding step), got {c!r}")
    return float(c)


def expected_tokens_per_round(a: float, d: int) -> float:
    """Expected tokens emitted per draft-and-verify round: ``(1 - a^(d+1)) / (1 - a)``.

    Leviathan et al. 2023, eq. (1): with per-token acceptance probability ``a`` and ``d`` drafts, a
    round yields the accepted prefix plus one token from the verifier, in expectation
    ``sum_{k=0..d} a^k``. The limit as ``a -> 1`` is ``d + 1``; at ``a = 0`` it is 1. Computed as
    ``-expm1((d+1) log a) / (1 - a)`` so values near ``a = 1`` do not lose precision.
    """
    a = _check_alpha(a)
    d = _check_d(d)
    if a == 1.0:
        return float(d + 1)
    if a == 0.0:
        return 1.0
    return -math.expm1((d + 1) * math.log(a)) / (1.0 - a)


def ideal_speedup(a: float, d: int, c_draft: float, c_verify: float, c_tail: float = 0.0) -> float:
    """Ideal speed-up over greedy decoding: ``tokens_per_round / (d * c_draft + c_tail + c_verify)``.

    Leviathan et al. 2023, Theorem 3.8 (walltime improvement ``(1 - a^(d+1)) / ((1 - a)(d c + 1))``),
    adapted to LayerSkip's shared KVQ cache (§4.3): the verification pass runs only the remaining
    layers, so it costs ``c_verify`` instead of one full step. ``c_tail`` (default 0, the paper's form) is
    what a round spends on the last draft's own layers 0..E-1 without the head, which a verification that
    starts at layer E over d + 1 positions needs (exitbench's self-speculation runs it every round).
    ``a -> 0`` gives ``1 / (d c_E + c_T + c_V)``; ``a -> 1`` gives ``(d + 1) / (d c_E + c_T + c_V)``.
    """
    c_draft = _check_cost(c_draft, "c_draft")
    c_verify = _check_cost(c_verify, "c_verify")
    if isinstance(c_tail, bool) or not isinstance(c_tail, Real) or not math.isfinite(c_tail) or c_tail < 0:
        raise ExitbenchError(f"c_tail must be a finite cost >= 0 (relative to one full decoding step), got {c_tail!r}")
    tokens = expected_tokens_per_round(a, d)
    return tokens / (int(d) * c_draft + float(c_tail) + c_verify)


def acceptance_rate_from_alpha(a: float, d: int) -> float:
    """LayerSkip's acceptance rate (accepted drafts / drafted tokens) implied by per-token acceptance ``a``.

    Under the i.i.d. model behind Leviathan et al. 2023, eq. (1), the expected number of accepted
    drafts per round is ``sum_{k=1..d} a^k = a (1 - a^d) / (1 - a)``, i.e. eq. (1) minus the verifier's
    token; dividing by the ``d`` drafted tokens gives the acceptance rate LayerSkip reports for
    self-speculative decoding (§4.3 and its results).
    """
    return (expected_tokens_per_round(a, d) - 1.0) / _check_d(d)


def alpha_from_acceptance_rate(rate: float, d: int) -> float:
    """Per-token acceptance probability ``a`` whose implied acceptance rate equals ``rate``.

    Inverts :func:`acceptance_rate_from_alpha` (Leviathan et al. 2023, eq. (1) minus one, over ``d``),
    which is continuous and strictly increasing from 0 at ``a = 0`` to 1 at ``a = 1``; the root is found
    by Brent's bracketed method on ``[0, 1]``. ``rate = 0`` gives 0 and ``rate = 1`` gives 1.
    """
    rate = _check_alpha(rate, "acceptance rate")
    d = _check_d(d)
    if rate == 0.0 or rate == 1.0 or d == 1:
        return rate
    root = brentq(lambda x: acceptance_rate_from_alpha(x, d) - rate, 0.0, 1.0, xtol=1e-15)
    return float(root)


def optimal_speculations(
    a: float,
    c_draft: float,
    c_verify_fn: Callable[[int], float],
    d_values: Iterable[int],
) -> tuple[int, float]:
    """The number of drafts ``d`` in ``d_values`` that maximises :func:`ideal_speedup`, and that speed-up.

    Leviathan et al. 2023 (choosing gamma to maximise Theorem 3.8's walltime improvement), with
    the LayerSkip §4.3 verify cost ``c_verify_fn(d)`` (which may grow with the ``d + 1`` verified
    positions). Ties go to the smallest ``d``.
    """
    a = _check_alpha(a)
    c_draft = _check_cost(c_draft, "c_draft")
    candidates = [_check_d(d) for d in d_values]
    if not candidates:
        raise ExitbenchError("d_values is empty: give at least one number of drafted tokens to compare")
    best_d, best_speedup = 0, -math.inf
    for d in sorted(set(candidates)):
        speedup = ideal_speedup(a, d, c_draft, _check_cost(c_verify_fn(d), f"c_verify_fn({d})"))
        if speedup > best_speedup:
            best_d, best_speedup = d, speedup
    return best_d, best_speedup


def predict_speedup(
    acceptance_rate: float, d: int, c_draft: float, c_verify: float, c_tail: float = 0.0
) -> dict[str, float]:
    """Predicted speed-up from a measured LayerSkip acceptance rate.

    Converts the rate to per-token acceptance ``alpha`` (inverse of :func:`acceptance_rate_from_alpha`),
    then applies Leviathan et al. 2023 eq. (1) and Theorem 3.8 with the LayerSkip §4.3 verify cost (and
    ``c_tail``, see :func:`ideal_speedup`). Returns ``{"alpha", "tokens_per_round", "predicted_speedup"}``.
    """
    alpha = alpha_from_acceptance_rate(acceptance_rate, d)
    return {
        "alpha": alpha,
        "tokens_per_round": expected_tokens_per_round(alpha, d),
        "predicted_speedup": ideal_speedup(alpha, d, c_draft, c_verify, c_tail),
    }


def fraction_of_ideal(measured_speedup: float, ideal: float) -> float:
    """Measured speed-up as a fraction of the ideal one (Leviathan et al. 2023, Theorem 3.8 / LayerSkip §4.3).

    Values below 1 quantify overheads the cost model ignores (kernel launches, sampling, cache copies).
    """
    ideal = _check_cost(ideal, "ideal speed-up")
    if (
        isinstance(measured_speedup, bool)
        or not isinstance(measured_speedup, Real)
        or not math.isfinite(float(measured_speedup))
        or float(measured_speedup) < 0.0
    ):
        raise ExitbenchError(f"measured speed-up must be a finite number >= 0, got {measured_speedup!r}")
    return float(measured_speedup) / ideal
