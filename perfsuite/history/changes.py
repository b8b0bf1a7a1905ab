"""Change points in the history: per cell, metric and hardware profile (another
profile starts another series), one point per commit in the order the commits
were first measured (``History.series``), found by Apache Otava's E-Divisive
implementation (``compute_change_points``: E-Divisive candidates, Student's
t-test significance, Hunter's split/merge), of which perfsuite keeps a copy
(``perfsuite.history.edivisive``; the package pins numpy exactly). Each change
is told with the last good and first bad commit, its size as a Hodges-Lehmann
ratio of the segments' values with its Mann-Whitney interval
(``perfsuite.stats.samples.shift_ratio_interval``) and what the work
counters of the two runs say (``counters.diff``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from perfsuite.history.edivisive import compute_change_points
from perfsuite.history.store import DEFAULT_METRIC, Point
from perfsuite.judge.baselines import HIGHER_IS_BETTER
from perfsuite.rank import counters as counters_mod
from perfsuite.stats.samples import shift_ratio_interval

# Otava defaults to p 0.001 and windows of 50 commits. Measured by `perfsuite
# selftest history-detection` (200 series): 0.001 called a change in 4-6 % of unchanged
# 30-commit series, 0.0001 in 1-2 % with the same power from 16 launches a
# run; windows of 20 keep a step and its fix 10 commits later apart (with
# windows of 30 or 50 and p 0.0001, neither was found in 50/50 series).
DEFAULT_MAX_PVALUE = 0.0001
DEFAULT_WINDOW = 20


def higher_is_better(metric: str) -> bool:
    return metric in HIGHER_IS_BETTER


@dataclass
class Change:
    """A change point of one series: ``points[index]`` is the first bad commit."""

    cell: str
    metric: str
    profile: str
    index: int
    last_good: Point
    first_bad: Point
    ratio: Any  # stats.Interval of after / before, or None (a non-positive value)
    pvalue: float
    direction: str  # "regressed" or "improved"
    counter_lines: list[str] | None  # None: a side has no counters

    def to_dict(self) -> dict[str, Any]:
        return {"cell": self.cell, "metric": self.metric, "profile": self.profile,
                "index": self.index, "direction": self.direction, "pvalue": self.pvalue,
                "last_good": {"commit": self.last_good.commit, "time": self.last_good.time,
                              "value": self.last_good.value},
                "first_bad": {"commit": self.first_bad.commit, "time": self.first_bad.time,
                              "value": self.first_bad.value},
                "ratio": self.ratio.to_dict() if self.ratio is not None else None,
                "counters": self.counter_lines}


def _size(after: list[float], before: list[float]) -> Any:
    try:
        return shift_ratio_interval(after, before)
    except ValueError:  # zero or negative values (a loss, an accuracy of 0): no ratio
        return None


def _counter_lines(good: Point, bad: Point) -> list[str] | None:
    if not good.counters or not bad.counters:
        return None
    unstable = set(good.counters.get("unstable") or []) | set(bad.counters.get("unstable") or [])
    changes = counters_mod.diff(bad.counters.get("per_step") or {}, good.counters.get("per_step") or {},
                                unstable=unstable)
    return counters_mod.describe(changes)


def find_changes(points: list[Point], *, cell: str = "", metric: str = DEFAULT_METRIC,
                 profile: str = "", max_pvalue: float = DEFAULT_MAX_PVALUE,
                 min_change: float = 0.0, window: int = DEFAULT_WINDOW) -> list[Change]:
    """The change points of one series, oldest first, by Otava's E-Divisive
    (``perfsuite.history.edivisive.compute_change_points``)."""
    values = [p.value for p in points]
    if len(values) < 3 or not all(math.isfinite(v) for v in values):
        return []
    found = compute_change_points(list(map(float, values)), window_len=window,
                                  max_pvalue=max_pvalue, min_magnitude=min_change)
    indexes = sorted({int(cp.index) for cp in found if 0 < int(cp.index) < len(values)})
    pvalues = {int(cp.index): float(cp.stats.pvalue) for cp in found}
    bounds = [0, *indexes, len(values)]
    out = []
    for k, index in enumerate(indexes):
        before, after = values[bounds[k]:index], values[index:bounds[k + 2]]
        ratio = _size(after, before)
        moved = ratio.estimate if ratio is not None else float(np.median(after)) / float(np.median(before) or 1)
        worse = moved < 1 if higher_is_better(metric) else moved > 1
        out.append(Change(cell=cell, metric=metric, profile=profile, index=index,
                          last_good=points[index - 1], first_bad=points[index], ratio=ratio,
                          pvalue=pvalues.get(index, float("nan")),
                          direction="regressed" if worse else "improved",
                          counter_lines=_counter_lines(points[index - 1], points[index])))
    return out


def regressed_at_head(changes: list[Change]) -> bool:
    """The newest run sits after a regression: the series' latest change
    point is a regression (none after it brought the metric back)."""
    return bool(changes) and changes[-1].direction == "regressed"

