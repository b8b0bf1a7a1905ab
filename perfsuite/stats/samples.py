"""Statistics over measured samples: pure functions of numbers (numpy, scipy).

A comparison of a new run against a baseline answers with a confidence
interval of the ratio new/base and one of four verdicts:

- ``regressed``: the whole interval lies on the bad side of 1 (the change is
  real at the stated confidence, and a rank test agrees) and the point
  estimate lies beyond ``1 + tolerance`` (the change is large enough to
  matter);
- ``improved``: the same on the good side;
- ``same``: the whole interval lies within ``[1 - tolerance, 1 + tolerance]``;
- ``unknown``: anything else; the caller measures again (more launches) or says what would decide.

Asking the whole interval to clear the tolerance instead needs an interval
narrower than (change - tolerance): resampling launch floors measured on
the shared 2-core VM, 12 launches a side caught a 10 % slowdown at a 5 %
tolerance half the time that way, against 95 % with 10 a side this way;
unchanged code is held to the confidence level either way (1-2 % called).

Everything is deterministic: samples are sorted before resampling and the
bootstrap generator has a fixed seed, so a verdict does not change when the
samples are permuted, and (up to rounding at 1e-9) when both sides are
scaled by the same factor.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

DEFAULT_CONFIDENCE = 0.95
DEFAULT_TOLERANCE = 0.05
DEFAULT_RESAMPLES = 2000
SEED = 20250319
# Interval ends are rounded before they meet a threshold, so that rounding
# noise of the last bit (scaling both sides) cannot flip a verdict.
_DECIMALS = 9
# Bootstrap replicates are computed in chunks of at most this many draws.
_CHUNK_DRAWS = 4_000_000

VERDICTS = ("same", "regressed", "improved", "unknown")


def as_samples(samples: Sequence[float], what: str = "samples",
               positive: bool = True) -> np.ndarray:
    """A sorted float array; raises ValueError naming ``what`` on bad input."""
    arr = np.sort(np.asarray(list(samples), dtype=float).ravel())
    if arr.size and not np.all(np.isfinite(arr)):
        raise ValueError(f"{what}: every value must be finite, got {arr[~np.isfinite(arr)][:3]}")
    if positive and arr.size and arr[0] <= 0:
        raise ValueError(f"{what}: values must be positive (times, rates), got {arr[0]}")
    return arr


def summary(samples: Sequence[float]) -> dict[str, float]:
    """n, median, IQR, p10, p90, MAD (unscaled), min, max: robust to outliers."""
    arr = as_samples(samples, positive=False)
    if arr.size == 0:
        nan = float("nan")
        return {"n": 0, "median": nan, "iqr": nan, "p10": nan, "p90": nan, "mad": nan,
                "min": nan, "max": nan}
    p10, q1, med, q3, p90 = np.quantile(arr, [0.10, 0.25, 0.50, 0.75, 0.90])
    return {"n": int(arr.size), "median": float(med), "iqr": float(q3 - q1),
            "p10": float(p10), "p90": float(p90),
            "mad": float(np.median(np.abs(arr - med))),
            "min": float(arr[0]), "max": float(arr[-1])}


@dataclass(frozen=True)
class Interval:
    """A point estimate with a confidence interval; ``method`` says how."""

    estimate: float
    low: float
    high: float
    confidence: float
    method: str

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def scaled(self, factor: float) -> Interval:
        """The interval of ``factor * x`` (factor > 0)."""
        return Interval(self.estimate * factor, self.low * factor, self.high * factor,
                        self.confidence, self.method)

    def to_dict(self) -> dict:
        return asdict(self)


def _unbounded(estimate: float, confidence: float, method: str) -> Interval:
    """Too few samples to bound a ratio: say so instead of a narrow guess."""
    return Interval(estimate, 0.0, math.inf, confidence, method)


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")


# Resampling is done here rather than with scipy.stats.bootstrap: its seed
# argument changed name across the scipy versions this package supports, and
# drawing indices into sorted samples is what makes the result order-free.
def _bootstrap_medians(arr: np.ndarray, rng: np.random.Generator, n_resamples: int) -> np.ndarray:
    out = np.empty(n_resamples)
    rows = max(1, _CHUNK_DRAWS // arr.size)
    for start in range(0, n_resamples, rows):
        stop = min(n_resamples, start + rows)
        idx = rng.integers(0, arr.size, size=(stop - start, arr.size))
        out[start:stop] = np.median(arr[idx], axis=1)
    return out


def median_ratio_interval(numerator: Sequence[float], denominator: Sequence[float], *,
                          factor: float = 1.0, confidence: float = DEFAULT_CONFIDENCE,
                          n_resamples: int = DEFAULT_RESAMPLES, seed: int = SEED) -> Interval:
    """``factor * median(numerator) / median(denominator)`` with a bootstrap interval.

    Percentile bootstrap, both sides resampled independently. It also serves
    cross-cell ratios, e.g. scaling efficiency from the 1-GPU and N-GPU cells'
    step times with ``factor = images_per_step_N / (N * images_per_step_1)``.
    The interval is widened to include the estimate: for tiny discrete
    samples the percentile interval can miss it.
    """
    _check_confidence(confidence)
    num = as_samples(numerator, "numerator")
    den = as_samples(denominator, "denominator")
    if num.size == 0 or den.size == 0:
        raise ValueError("median_ratio_interval needs at least one sample on each side")
    estimate = factor * float(np.median(num)) / float(np.median(den))
    method = "bootstrap-percentile median ratio"
    if num.size < 2 or den.size < 2:
        return _unbounded(estimate, confidence, method)
    rng = np.random.default_rng(seed)
    ratios = factor * _bootstrap_medians(num, rng, n_resamples) / _bootstrap_medians(
        den, rng, n_resamples)
    alpha = 1.0 - confidence
    low, high = np.quantile(ratios, [alpha / 2, 1 - alpha / 2])
    return Interval(estimate, min(float(low), estimate), max(float(high), estimate),
                    confidence, method)


def _mann_whitney_lower_cdf(m: int, n: int) -> np.ndarray:
    """P(U <= u) for u = 0..m*n under the null, exact (no ties).

    The counts are the coefficients of the Gaussian binomial [m+n choose m]_q,
    built as prod_i (1 - q^(n+i)) / (1 - q^i); dividing by (1 - q^i) is a
    running sum with stride i.
    """
    size = m * n + 1
    counts = np.zeros(size)
    counts[0] = 1.0
    for i in range(1, m + 1):
        shifted = np.zeros(size)
        shifted[n + i:] = counts[:size - (n + i)]
        counts = counts - shifted
        pad = (-size) % i
        blocks = np.concatenate([counts, np.zeros(pad)]).reshape(-1, i)
        counts = np.cumsum(blocks, axis=0).ravel()[:size]
    return np.cumsum(counts) / counts.sum()


def _rank_critical(m: int, n: int, alpha: float) -> int:
    """Largest k with P(U < k) <= alpha/2 (k = 0: no bounded interval)."""
    if m + n <= 200:
        cdf = _mann_whitney_lower_cdf(min(m, n), max(m, n))
        return int(np.searchsorted(cdf, alpha / 2 * (1 + 1e-12), side="right"))
    from scipy import stats as sps  # here: a rank hands in its record through this module

    z = sps.norm.ppf(1 - alpha / 2)
    return max(0, math.floor(m * n / 2 - z * math.sqrt(m * n * (m + n + 1) / 12.0)))


def shift_ratio_interval(numerator: Sequence[float], denominator: Sequence[float], *,
                         confidence: float = DEFAULT_CONFIDENCE) -> Interval:
    """Hodges-Lehmann ratio with the interval from inverting Mann-Whitney.

    Works on logs, so the estimate is the typical ratio between a numerator
    and a denominator sample; distribution-free and without randomness.
    """
    _check_confidence(confidence)
    lx = np.log(as_samples(numerator, "numerator"))
    ly = np.log(as_samples(denominator, "denominator"))
    if lx.size == 0 or ly.size == 0:
        raise ValueError("shift_ratio_interval needs at least one sample on each side")
    diffs = np.sort(np.subtract.outer(lx, ly).ravel())
    estimate = float(np.exp(np.median(diffs)))
    method = "Hodges-Lehmann ratio, Mann-Whitney interval"
    k = _rank_critical(lx.size, ly.size, 1.0 - confidence)
    if k < 1:
        return _unbounded(estimate, confidence, method)
    low, high = float(np.exp(diffs[k - 1])), float(np.exp(diffs[diffs.size - k]))
    return Interval(estimate, min(low, estimate), max(high, estimate), confidence, method)


def mann_whitney_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided Mann-Whitney U p-value (1.0 when a side is empty or all tie)."""
    x, y = as_samples(a, positive=False), as_samples(b, positive=False)
    if x.size == 0 or y.size == 0 or (np.all(x == x[0]) and np.all(y == x[0])):
        return 1.0
    from scipy import stats as sps

    return float(sps.mannwhitneyu(x, y, alternative="two-sided").pvalue)


def classify(low: float, high: float, tolerance: float, *, estimate: float | None = None,
             higher_is_better: bool = False, significant: bool = True) -> str:
    """Verdict for an interval of the ratio new/base around ``estimate`` (see
    module docstring); without an estimate, the end nearer to 1 stands for it."""
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    lo, hi = round(low, _DECIMALS), round(high, _DECIMALS)
    up, down = round(1.0 + tolerance, _DECIMALS), round(1.0 - tolerance, _DECIMALS)
    est = round(estimate, _DECIMALS) if estimate is not None else (
        lo if lo > 1.0 else hi if hi < 1.0 else 1.0)
    worse, better = ("improved", "regressed") if higher_is_better else ("regressed", "improved")
    if lo > 1.0 and est > up and significant:
        return worse
    if hi < 1.0 and est < down and significant:
        return better
    if lo >= down and hi <= up:
        return "same"
    return "unknown"


@dataclass(frozen=True)
class Comparison:
    """The answer of a comparison; ``ratio`` is new/base (or observed/expected)."""

    verdict: str
    ratio: float
    ci_low: float
    ci_high: float
    confidence: float | None
    p_value: float | None
    tolerance: float
    n_new: int
    n_base: int
    method: str
    reason: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def compare_values(new: float, base: float, tolerance: float = DEFAULT_TOLERANCE, *,
                   higher_is_better: bool = False) -> Comparison:
    """Two single numbers (peak memory, accuracy): the ratio against the tolerance."""
    if not (math.isfinite(base) and base > 0 and math.isfinite(new) and new >= 0):
        raise ValueError(f"values must be finite with a positive base, got {new} vs {base}")
    ratio = new / base
    verdict = classify(ratio, ratio, tolerance, estimate=ratio, higher_is_better=higher_is_better)
    return Comparison(verdict, ratio, ratio, ratio, None, None, tolerance, 1, 1, "single values")


def compare_interval(interval: Interval, expected: float, tolerance: float = DEFAULT_TOLERANCE,
                     *, higher_is_better: bool = True) -> Comparison:
    """A measured ratio's interval (speed-up, efficiency) against an expected ratio."""
    if not (math.isfinite(expected) and expected > 0):
        raise ValueError(f"expected value must be positive and finite, got {expected}")
    rel = interval.scaled(1.0 / expected)
    verdict = classify(rel.low, rel.high, tolerance, estimate=rel.estimate,
                       higher_is_better=higher_is_better)
    reason = "" if verdict != "unknown" else "interval straddles 1 or a tolerance bound; measure more"
    return Comparison(verdict, rel.estimate, rel.low, rel.high, interval.confidence, None,
                      tolerance, 0, 0, interval.method, reason)


def within_range(interval: Interval, low: float | None, high: float | None,
                 tolerance: float = 0.0) -> str:
    """"pass" when the interval lies in [low, high] widened by ``tolerance``,
    "fail" when it lies wholly outside, "unknown" when it straddles an end.
    A missing end is unbounded."""
    lo = -math.inf if low is None else low * (1.0 - tolerance)
    hi = math.inf if high is None else high * (1.0 + tolerance)
    a, b = round(interval.low, _DECIMALS), round(interval.high, _DECIMALS)
    lo, hi = round(lo, _DECIMALS), round(hi, _DECIMALS)
    if a >= lo and b <= hi:
        return "pass"
    if b < lo or a > hi:
        return "fail"
    return "unknown"
