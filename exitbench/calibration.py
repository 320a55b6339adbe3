"""Risk-controlling calibration of CALM's early-exit threshold (CALM §4, arXiv:2207.07061).

CALM picks a confidence threshold ``lambda`` such that, with probability at least ``1 - epsilon`` over
the calibration sample, the expected risk of early exiting (e.g. inconsistency between the early-exit
and the full-model output, a loss in ``[0, 1]``) is at most ``delta``. It does so with Learn-then-Test
(LTT; Angelopoulos et al. 2021, arXiv:2110.01052): for each candidate ``lambda_j`` it tests the null
``H_j: R(lambda_j) > delta`` with a valid p-value (the Hoeffding-Bentkus p-value), and controls the
family-wise error with fixed-sequence testing from the most conservative threshold downwards.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np
from scipy.special import xlogy
from scipy.stats import binom

from exitbench.errors import ExitbenchError


@dataclass(frozen=True)
class CalibrationResult:
    """Outcome of :func:`calibrate_threshold` (CALM §4 / LTT fixed-sequence testing).

    ``threshold``: the calibrated ``lambda`` (1.0 when no candidate was certified: never exit early).
    ``index``: its position in the candidate list, or -1 for the 1.0 fallback.
    ``pvalues`` and ``mean_risks``: per candidate, in the order given. ``n``: calibration-set size.
    """

    threshold: float
    index: int
    pvalues: tuple[float, ...]
    mean_risks: tuple[float, ...]
    n: int


def _check_unit(x: float, name: str) -> float:
    if isinstance(x, bool) or not isinstance(x, Real) or not 0.0 <= float(x) <= 1.0:
        raise ExitbenchError(f"{name} must be in [0, 1], got {x!r}")
    return float(x)


def _check_open_unit(x: float, name: str) -> float:
    if isinstance(x, bool) or not isinstance(x, Real) or not 0.0 < float(x) < 1.0:
        raise ExitbenchError(f"{name} must be in the open interval (0, 1), got {x!r}")
    return float(x)


def _check_n(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, Integral) or int(n) < 1:
        raise ExitbenchError(f"n (calibration-set size) must be an integer >= 1, got {n!r}")
    return int(n)


def _h1(a: float, b: float) -> float:
    """Bernoulli KL divergence ``h1(a, b) = a log(a/b) + (1-a) log((1-a)/(1-b))`` (LTT, Hoeffding p-value)."""
    return float(xlogy(a, a / b) + xlogy(1.0 - a, (1.0 - a) / (1.0 - b)))


def hoeffding_pvalue(mean_risk: float, n: int, delta: float) -> float:
    """Hoeffding p-value for ``H: R > delta``: ``exp(-n * h1(min(mean_risk, delta), delta))``.

    Hoeffding's inequality in its tighter KL (Chernoff) form, as used by LTT (Angelopoulos et al.
    2021, the Hoeffding part of its Hoeffding-Bentkus p-value) and CALM §4. Equals 1 when
    ``mean_risk >= delta``; at ``mean_risk = 0`` it is ``(1 - delta)^n``.
    """
    mean_risk = _check_unit(mean_risk, "mean_risk")
    n = _check_n(n)
    delta = _check_open_unit(delta, "delta")
    return math.exp(-n * _h1(min(mean_risk, delta), delta))


def bentkus_pvalue(mean_risk: float, n: int, delta: float) -> float:
    """Bentkus p-value for ``H: R > delta``: ``min(1, e * P(Binomial(n, delta) <= ceil(n * mean_risk)))``.

    Bentkus 2004 ("On Hoeffding's inequalities"), as the Bentkus p-value of LTT (Angelopoulos et al.
    2021) used by CALM §4. ``n * mean_risk`` within 1e-9 of an integer is taken as that integer, so a
    mean of ``k / n`` (which floating point may store as ``k/n + ulp``) is not bumped to ``k + 1``.
    """
    mean_risk = _check_unit(mean_risk, "mean_risk")
    n = _check_n(n)
    delta = _check_open_unit(delta, "delta")
    x = n * mean_risk
    k = round(x) if abs(x - round(x)) <= 1e-9 else math.ceil(x)
    return min(1.0, math.e * float(binom.cdf(k, n, delta)))


def hoeffding_bentkus_pvalue(mean_risk: float, n: int, delta: float) -> float:
    """Hoeffding-Bentkus p-value: ``min(hoeffding_pvalue, bentkus_pvalue)``.

    LTT's p^HB (Angelopoulos et al. 2021), the p-value CALM uses to certify each threshold (CALM §4,
    Eq. 7 context). Valid for losses bounded in ``[0, 1]``.
    """
    return min(hoeffding_pvalue(mean_risk, n, delta), bentkus_pvalue(mean_risk, n, delta))


def fixed_sequence_test(pvalues_in_order: Sequence[float], epsilon: float) -> int:
    """Fixed-sequence testing (LTT, Angelopoulos et al. 2021, family-wise error control; CALM §4).

    The p-values are ordered from the most conservative threshold (high ``lambda``) to the least.
    Nulls are rejected in that order while ``p <= epsilon``; testing stops at the first ``p > epsilon``.
    Returns the index of the last rejected null, or -1 if none is rejected. Controls the family-wise
    error rate at ``epsilon`` with no multiplicity correction.
    """
    epsilon = _check_open_unit(epsilon, "epsilon")
    last = -1
    for i, p in enumerate(pvalues_in_order):
        p = _check_unit(p, f"p-value {i}")
        if p > epsilon:
            break
        last = i
    return last


def calibrate_threshold(
    thresholds: Sequence[float],
    risks_per_threshold: Sequence[Sequence[float]],
    delta: float,
    epsilon: float,
) -> CalibrationResult:
    """Smallest threshold ``lambda`` certified to have risk ``<= delta`` w.p. ``>= 1 - epsilon`` (CALM §4, LTT).

    ``thresholds`` are candidate confidence thresholds in ``[0, 1]``, strictly decreasing (most
    conservative first); ``risks_per_threshold[j]`` holds the per-example losses in ``[0, 1]`` of
    exiting with ``thresholds[j]`` on the same ``n`` calibration examples. Each candidate gets the
    Hoeffding-Bentkus p-value of its mean risk, and fixed-sequence testing (LTT) walks down the list;
    the last rejected null gives the threshold.

    When no null is rejected the result is ``threshold = 1.0`` with ``index = -1``: CALM's
    ``lambda = 1``, i.e. never exit early, which trivially meets the risk bound (the full model is
    consistent with itself).
    """
    delta = _check_open_unit(delta, "delta")
    epsilon = _check_open_unit(epsilon, "epsilon")
    lams = [_check_unit(t, f"threshold {j}") for j, t in enumerate(thresholds)]
    if not lams:
        raise ExitbenchError("thresholds is empty: give at least one candidate confidence threshold")
    if any(b >= a for a, b in itertools.pairwise(lams)):
        raise ExitbenchError("thresholds must be strictly decreasing (most conservative, highest, first)")
    if len(risks_per_threshold) != len(lams):
        raise ExitbenchError(
            f"risks_per_threshold has {len(risks_per_threshold)} rows but there are {len(lams)} thresholds"
        )
    rows = [np.asarray(r, dtype=float) for r in risks_per_threshold]
    n = rows[0].size
    for j, row in enumerate(rows):
        if row.ndim != 1 or row.size != n or n == 0:
            raise ExitbenchError(
                f"risks for threshold {j} must be a non-empty 1-D list of the same n examples as threshold 0 "
                f"(got shape {row.shape}, expected ({n},))"
            )
        if not np.all((row >= 0.0) & (row <= 1.0)):
            raise ExitbenchError(f"risks for threshold {j} must all lie in [0, 1] (bounded loss required by LTT)")
    mean_risks = tuple(min(1.0, max(0.0, float(row.mean()))) for row in rows)
    pvalues = tuple(hoeffding_bentkus_pvalue(m, n, delta) for m in mean_risks)
    index = fixed_sequence_test(pvalues, epsilon)
    threshold = lams[index] if index >= 0 else 1.0
    return CalibrationResult(threshold=threshold, index=index, pvalues=pvalues, mean_risks=mean_risks, n=n)


def min_calibration_size(delta: float, epsilon: float) -> int:
    """The least calibration-set size ``n`` at which any threshold can be certified (CALM §4, LTT).

    A threshold is certified when its Hoeffding-Bentkus p-value is at most ``epsilon``; the smallest
    p-value ``n`` examples can give is at zero mean risk, ``(1 - delta)^n`` (both parts agree there), so
    ``n >= log(epsilon) / log(1 - delta)``. Below this size only the fallback ``lambda = 1`` is possible.
    """
    delta = _check_open_unit(delta, "delta")
    epsilon = _check_open_unit(epsilon, "epsilon")
    n = max(1, math.ceil(math.log(epsilon) / math.log1p(-delta) - 1e-9))
    while hoeffding_bentkus_pvalue(0.0, n, delta) > epsilon:  # guard the float rounding of the bound
        n += 1
    return n


def decaying_threshold(lam: float, t: int, num_tokens: int, tau: float) -> float:
    """CALM Eq. 5: ``lambda'(t) = clip_[0,1](0.9 * lam + 0.1 * exp(-tau * t / N))``.

    Starts at ``0.9 lam + 0.1`` for ``t = 0`` and decays towards ``0.9 lam`` as the output grows
    (``N = num_tokens``, the maximum output length). ``tau`` is CALM's temperature; any finite value
    is accepted (a negative one makes the threshold grow, which the clip bounds at 1).
    """
    lam = _check_unit(lam, "lam")
    if isinstance(t, bool) or not isinstance(t, Integral) or int(t) < 0:
        raise ExitbenchError(f"t (decoding step) must be an integer >= 0, got {t!r}")
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, Integral) or int(num_tokens) < 1:
        raise ExitbenchError(f"num_tokens (N, maximum output length) must be an integer >= 1, got {num_tokens!r}")
    if isinstance(tau, bool) or not isinstance(tau, Real) or not math.isfinite(float(tau)):
        raise ExitbenchError(f"tau (decay temperature) must be a finite number, got {tau!r}")
    exponent = -float(tau) * int(t) / int(num_tokens)
    value = 0.9 * lam + 0.1 * math.exp(min(exponent, 50.0))  # e^50 / 10 >> 1: clipped anyway, no overflow
    return min(1.0, max(0.0, value))
