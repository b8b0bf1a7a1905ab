"""Statistics over launches: what one launch contributes, how much identical
launches scatter, and a verdict between launches made at different times.

Steps of one launch share its process and the machine's state during it, so
comparisons between runs (a run against its baseline, run B against run A,
side B against side A) take each launch as one observation. Pure functions
of numbers, built on ``perfsuite.stats.samples``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats as _sps

from perfsuite.options import DEFAULT_LAUNCH_STATISTIC
from perfsuite.stats.samples import (
    DEFAULT_CONFIDENCE,
    DEFAULT_TOLERANCE,
    Comparison,
    as_samples,
    classify,
    mann_whitney_p,
    shift_ratio_interval,
)

# Launches per side before their spread is judged: with 4 and 4 the rank
# test can reach p = 0.029; with 3 and 3 it never goes below 0.10.
MIN_LAUNCHES = 4

# What one launch contributes to a launch-level comparison. "floor", the
# launch's fastest step, is for machines whose noise only ever adds time
# (neighbours on a shared host): there the steps the neighbours left alone
# show the code's own speed. The default, and why: perfsuite.options.
LAUNCH_STATISTICS = {"median": np.median, "floor": np.min}


def launch_values(launches: Sequence[Sequence[float]], statistic: str = DEFAULT_LAUNCH_STATISTIC) -> list[float]:
    """Each launch's median or floor (see ``LAUNCH_STATISTICS``)."""
    if statistic not in LAUNCH_STATISTICS:
        raise ValueError(f"launch statistic {statistic!r}: use one of {sorted(LAUNCH_STATISTICS)}")
    return [float(LAUNCH_STATISTICS[statistic](as_samples(run))) for run in launches if len(run)]


@dataclass(frozen=True)
class LaunchSpread:
    """How much identical launches' values scatter: the standard deviation of
    their logs, with its degrees of freedom (launches less one per group)."""

    log_sd: float
    dof: int

    def pooled(self, other: LaunchSpread | None) -> LaunchSpread:
        if other is None or other.dof < 1:
            return self
        if self.dof < 1:
            return other
        dof = self.dof + other.dof
        return LaunchSpread(math.sqrt((self.dof * self.log_sd ** 2 + other.dof * other.log_sd ** 2)
                                      / dof), dof)

    def to_dict(self) -> dict:
        return asdict(self)


def launch_spread(groups: Sequence[Sequence[float]]) -> LaunchSpread:
    """The pooled spread of launch values within groups of identical launches
    (each group centred on its own mean, so groups may differ in level)."""
    centred = [x for values in groups if len(values) > 1
               for x in np.log(np.sort(values)) - np.mean(np.log(np.sort(values)))]
    dof = len(centred) - sum(len(values) > 1 for values in groups)
    return LaunchSpread(float(math.sqrt(sum(x * x for x in centred) / dof)) if dof > 0
                        else math.nan, max(dof, 0))


DRIFT_UNKNOWN = ("one launch a side cannot separate a change from drift between launches; "
                 "run `perfsuite ab`, or record and run with --perf-repeats 4")


def _few_launch_comparison(values_new: list[float], values_base: list[float],
                           tolerance: float, confidence: float, higher_is_better: bool,
                           spread: LaunchSpread | None, plural: str) -> Comparison:
    """Launch values of two sides launched at different times, fewer than
    ``MIN_LAUNCHES`` on a side: a t interval of the mean log difference whose
    standard error is the between-launch spread (seen in these launches,
    pooled with one recorded before), never the steps' own."""
    values_new, values_base = sorted(values_new), sorted(values_base)  # order-free sums
    m, k = len(values_new), len(values_base)
    log_new, log_base = np.log(values_new), np.log(values_base)
    diff = float(np.mean(log_new) - np.mean(log_base))
    seen = launch_spread([values_new, values_base])
    known = seen.pooled(spread) if spread is not None else seen
    method = f"t interval of mean log launch {plural} with the between-launch spread"
    if known.dof < 1 or not math.isfinite(known.log_sd):
        return Comparison("unknown", math.exp(diff), 0.0, math.inf, confidence, None, tolerance,
                          m, k, method, DRIFT_UNKNOWN)
    half = float(_sps.t.ppf(0.5 + confidence / 2, known.dof)) * known.log_sd * math.sqrt(
        1 / m + 1 / k)
    low, high = math.exp(diff - half), math.exp(diff + half)
    verdict = classify(low, high, tolerance, estimate=math.exp(diff),
                       higher_is_better=higher_is_better)
    reason = (f"{m} vs {k} launch(es), interval widened by the between-launch spread "
              f"{known.log_sd:.1%} (s.d. of logs, {known.dof} d.o.f.)")
    if verdict == "unknown":
        reason += "; more launches a side, or `perfsuite ab`, would narrow it"
    return Comparison(verdict, math.exp(diff), low, high, confidence, None, tolerance, m, k,
                      method, reason)


def compare_launches(launches_new: Sequence[Sequence[float]],
                     launches_base: Sequence[Sequence[float]],
                     tolerance: float = DEFAULT_TOLERANCE, confidence: float = DEFAULT_CONFIDENCE,
                     *, higher_is_better: bool = False, statistic: str = DEFAULT_LAUNCH_STATISTIC,
                     spread: LaunchSpread | None = None) -> Comparison:
    """Judge launches of a cell against launches of its baseline made at another time.

    Steps of one launch share its process, its memory layout and the
    machine's state during it, so their spread understates how much a
    second launch differs: on a shared VM the medians of identical launches
    varied 82-131 ms while each launch's own IQR was ~10 %. Each launch's
    median (or floor, per ``statistic``) is therefore one observation. With
    at least ``MIN_LAUNCHES`` launches a side the rank-based comparison
    (Hodges-Lehmann ratio, Mann-Whitney interval and p-value) runs over
    launches. With fewer, the interval is a t interval whose spread is the
    between-launch spread seen in these launches and ``spread`` (recorded
    with the baseline); where none is known the verdict is "unknown": steps
    of one launch a side say nothing about drift between launches.
    """
    new = [as_samples(run, "new launch samples") for run in launches_new]
    base = [as_samples(run, "baseline launch samples") for run in launches_base]
    new, base = [r for r in new if r.size], [r for r in base if r.size]
    plural = {"median": "medians", "floor": "floors (fastest steps)"}.get(statistic, statistic)
    if not new or not base:
        return Comparison("unknown", math.nan, 0.0, math.inf, confidence, None, tolerance,
                          len(new), len(base), "launch values", "no launch on one side")
    values_new, values_base = launch_values(new, statistic), launch_values(base, statistic)
    if min(len(new), len(base)) < MIN_LAUNCHES:
        return _few_launch_comparison(values_new, values_base, tolerance, confidence,
                                      higher_is_better, spread, plural)
    interval = shift_ratio_interval(values_new, values_base, confidence=confidence)
    p_value = mann_whitney_p(values_new, values_base)
    verdict = classify(interval.low, interval.high, tolerance, estimate=interval.estimate,
                       higher_is_better=higher_is_better, significant=p_value < 1.0 - confidence)
    reason = "" if verdict != "unknown" else (
        "interval straddles 1 or a tolerance bound; measure more launches")
    return Comparison(verdict, interval.estimate, interval.low, interval.high, confidence,
                      p_value, tolerance, len(new), len(base),
                      f"Hodges-Lehmann ratio of launch {plural}, Mann-Whitney interval", reason)


