"""Confidence intervals for every number the benchmark reports: seeded, paired bootstrap (scipy).

Each interval resamples SAMPLES (prompts), never tokens, so tokens of one prompt, which are not
independent, move together. Paired statistics (a method vs greedy decoding on the same prompts) resample
the pairs jointly, so the prompt-to-prompt spread both methods share cancels. ``scipy.stats.bootstrap``
does the resampling (BCa, 95%, seeded); when BCa is undefined (every resample gives the same value, e.g.
an exact method with zero mismatches everywhere) the interval is the point itself.

Statistics (all ratios of sums, as the summaries compute them, so the interval is around the reported
point estimate):

- :func:`mean_interval`: a per-sample metric's mean (exact match, ROUGE-2, pass@1, ...);
- :func:`ratio_interval`: sum(numerator) / sum(denominator), e.g. acceptance = accepted / drafted;
- :func:`speedup_interval`: LayerSkip's speed-up (Elhoushi et al. 2024 §5): greedy's time per token over
  the method's, ``(sum t_g / sum n_g) / (sum t_m / sum n_m)``, resampled as pairs of prompts.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
N_RESAMPLES = 2000
DEFAULT_SEED = 1234


@dataclass(frozen=True)
class Interval:
    """A point estimate with its two-sided confidence interval over ``n`` resampled samples."""

    estimate: float
    low: float
    high: float
    n: int
    confidence: float = CONFIDENCE
    method: str = "bootstrap BCa, paired by sample"

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2.0

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def to_dict(self) -> dict[str, float | int | str]:
        return {**asdict(self), "half_width": self.half_width}

    @classmethod
    def from_dict(cls, data: dict) -> Interval:
        keys = ("estimate", "low", "high", "n", "confidence", "method")
        return cls(**{key: data[key] for key in keys if key in data})


def _bootstrap(
    columns: Sequence[np.ndarray], statistic: Callable[..., np.ndarray], estimate: float, seed: int
) -> Interval:
    n = len(columns[0])
    if n < 2 or not math.isfinite(estimate):
        return Interval(estimate, estimate, estimate, n, method="point (fewer than 2 samples)")
    if all(np.ptp(column) == 0 for column in columns):
        return Interval(estimate, estimate, estimate, n, method="point (every sample equal)")
    rng = np.random.default_rng(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # BCa's degenerate-distribution warning: handled below
        result = stats.bootstrap(
            tuple(columns),
            statistic,
            paired=True,
            vectorized=True,
            axis=-1,
            n_resamples=N_RESAMPLES,
            confidence_level=CONFIDENCE,
            method="BCa",
            random_state=rng,
        )
        low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
        method = "bootstrap BCa, paired by sample"
        if not (math.isfinite(low) and math.isfinite(high)):
            result = stats.bootstrap(
                tuple(columns),
                statistic,
                paired=True,
                vectorized=True,
                axis=-1,
                n_resamples=N_RESAMPLES,
                confidence_level=CONFIDENCE,
                method="percentile",
                random_state=np.random.default_rng(seed),
            )
            low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
            method = "bootstrap percentile, paired by sample"
    if not (math.isfinite(low) and math.isfinite(high)):
        return Interval(estimate, estimate, estimate, n, method="point (bootstrap undefined)")
    return Interval(estimate, min(low, estimate), max(high, estimate), n, method=method)


def paired_interval(
    columns: Sequence[Sequence[float]],
    statistic: Callable[..., np.ndarray],
    seed: int = DEFAULT_SEED,
) -> Interval:
    """The interval of any ``statistic(*columns, axis=-1)`` of equally long columns, one entry per sample,
    samples resampled together (a gain of one fraction over another, say)."""
    arrays = [np.asarray(column, dtype=float) for column in columns]
    if not arrays or arrays[0].size == 0 or len({a.shape for a in arrays}) != 1:
        raise ValueError("paired_interval needs equally long, non-empty columns (one entry per sample)")
    return _bootstrap(arrays, statistic, float(statistic(*arrays, axis=-1)), seed)


def mean_interval(values: Sequence[float], seed: int = DEFAULT_SEED) -> Interval:
    """Mean of a per-sample metric with its bootstrap interval (samples resampled)."""
    column = np.asarray(values, dtype=float)
    if column.size == 0:
        raise ValueError("mean_interval needs at least one value")
    return _bootstrap([column], lambda x, axis=-1: np.mean(x, axis=axis), float(column.mean()), seed)


def _ratio(num: np.ndarray, den: np.ndarray, axis: int = -1) -> np.ndarray:
    total = np.sum(den, axis=axis)
    return np.sum(num, axis=axis) / np.where(total == 0, np.nan, total)


def ratio_interval(numerators: Sequence[float], denominators: Sequence[float], seed: int = DEFAULT_SEED) -> Interval:
    """``sum(numerators) / sum(denominators)`` over samples (e.g. acceptance), pairs resampled together."""
    num, den = np.asarray(numerators, dtype=float), np.asarray(denominators, dtype=float)
    if num.size == 0 or num.shape != den.shape or den.sum() == 0:
        raise ValueError("ratio_interval needs equally long, non-empty columns with a positive denominator total")
    return _bootstrap([num, den], _ratio, float(num.sum() / den.sum()), seed)


def _speedup(g_time: np.ndarray, g_tokens: np.ndarray, m_time: np.ndarray, m_tokens: np.ndarray, axis: int = -1):
    return _ratio(g_time, g_tokens, axis) / _ratio(m_time, m_tokens, axis)


def speedup_interval(
    greedy_seconds: Sequence[float],
    greedy_tokens: Sequence[float],
    method_seconds: Sequence[float],
    method_tokens: Sequence[float],
    seed: int = DEFAULT_SEED,
) -> Interval:
    """Speed-up = greedy's time per token / the method's, over the same prompts, prompts resampled as pairs."""
    columns = [np.asarray(c, dtype=float) for c in (greedy_seconds, greedy_tokens, method_seconds, method_tokens)]
    if columns[0].size == 0 or len({c.shape for c in columns}) != 1:
        raise ValueError("speedup_interval needs four equally long, non-empty columns (one entry per prompt)")
    if columns[1].sum() == 0 or columns[2].sum() == 0 or columns[3].sum() == 0:
        raise ValueError("speedup_interval: no tokens or no time measured")
    estimate = float(_speedup(*columns))
    return _bootstrap(columns, _speedup, estimate, seed)


def median_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """The sample median with its distribution-free interval from order statistics.

    For n independent draws, the number below the population median is Binomial(n, 1/2), so
    [x_(k), x_(n+1-k)] (1-based order statistics) covers the median with probability
    1 - 2 P(Bin(n, 1/2) <= k - 1); k is the largest index that keeps this >= ``confidence`` (Conover,
    *Practical Nonparametric Statistics*, 3rd ed., §3.2). For n = 7 that is [min, max] at 98.4%; with fewer
    than 6 values no k reaches 95% and the interval is [min, max] at its own, lower, confidence.
    """
    ordered = np.sort(np.asarray(values, dtype=float))
    n = ordered.size
    if n == 0:
        raise ValueError("median_interval needs at least one value")
    k = 1
    while k + 1 <= n // 2 and 1 - 2 * stats.binom.cdf(k, n, 0.5) >= confidence:
        k += 1
    covered = float(1 - 2 * stats.binom.cdf(k - 1, n, 0.5))
    return Interval(
        float(np.median(ordered)),
        float(ordered[k - 1]),
        float(ordered[n - k]),
        n,
        covered,
        "order statistics of the median (binomial, distribution-free)",
    )


def required_samples(half_width: float, proportion: float = 0.5, confidence: float = CONFIDENCE) -> int:
    """The least n whose normal-approximation interval of a proportion is at most ``half_width`` wide
    each side (worst case p = 0.5): n = z^2 p (1 - p) / h^2. Used to size the cpu profile's samples."""
    z = float(stats.norm.ppf(0.5 + confidence / 2))
    return math.ceil(z * z * proportion * (1 - proportion) / (half_width * half_width))
