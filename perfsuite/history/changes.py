"""Change points in the history: per cell, metric and hardware profile (another
profile starts another series), one point per commit in the order the commits
were first measured (``History.series``), found by Apache Otava's E-Divisive
implementation (``compute_change_points``: E-Divisive candidates, Student's
t-test significance, Hunter's split/merge), of which perfsuite keeps a copy
(``perfsuite.history.edivisive``; the package pins numpy exactly). Each change
is told with the last good and first bad commit, its size as a Hodges-Lehmann
ratio of the segments' values with its Mann-Whitney interval
(``perfsuite.stats.samples.shift_ratio_interval``) and what the work
counters of the two runs say (``counters.diff``). A change accepted on
purpose at a commit (perfsuite-accept.toml, ``perfsuite.judge.accepted``)
starts the series' level there: the next change point is looked for from it on.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from perfsuite.history.edivisive import compute_change_points
from perfsuite.history.store import DEFAULT_METRIC, Point, when
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

    def describe(self) -> list[str]:
        """The change as ``perfsuite history changes`` prints it: size, commits, work counters."""
        if self.ratio is not None:
            r = self.ratio
            size = (f"x{r.estimate:.4f} ({r.low:.4f}-{r.high:.4f}, {r.confidence:.0%} {r.method})")
        else:
            size = f"{_fmt(self.last_good.value, None)} -> {_fmt(self.first_bad.value, None)}"
        before, after = ("last good", "first bad") if self.direction == "regressed" else (
            "last before", "first after")
        lines = [f"  {self.direction} {size}, p={self.pvalue:.2g}",
                 f"    {before} {self.last_good.commit[:12]} ({when(self.last_good.time)}, "
                 f"{_fmt(self.last_good.value, self.last_good.unit)})",
                 f"    {after} {self.first_bad.commit[:12]} ({when(self.first_bad.time)}, "
                 f"{_fmt(self.first_bad.value, self.first_bad.unit)})"]
        if self.counter_lines is None:
            lines.append("    work counters: not recorded on both runs")
        elif not self.counter_lines:
            lines.append("    work counters: unchanged (the same work per step)")
        else:
            lines += [f"    work counters: {line}" for line in self.counter_lines]
        return lines


def _fmt(value: float, unit: str | None) -> str:
    return f"{value:.6g}{f' {unit}' if unit else ''}"


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


def level_start(points: list[Point], commits: Iterable[str]) -> int:
    """Where the series' level starts: the newest point whose commit is one of
    ``commits`` (full or 7+ character prefixes: a change accepted there), else 0."""
    prefixes = tuple(c.lower() for c in commits if c)
    found = [i for i, p in enumerate(points) if prefixes and p.commit.lower().startswith(prefixes)]
    return found[-1] if found else 0


def find_changes(points: list[Point], *, cell: str = "", metric: str = DEFAULT_METRIC,
                 profile: str = "", max_pvalue: float = DEFAULT_MAX_PVALUE,
                 min_change: float = 0.0, window: int = DEFAULT_WINDOW,
                 level_from: Iterable[str] = ()) -> list[Change]:
    """The change points of one series, oldest first, by Otava's E-Divisive
    (``perfsuite.history.edivisive.compute_change_points``). A commit of
    ``level_from`` (a change accepted there) starts the level: the points before
    it are not read, and no change point is at it."""
    start = level_start(points, level_from)
    if start:
        found = find_changes(points[start:], cell=cell, metric=metric, profile=profile, max_pvalue=max_pvalue,
                             min_change=min_change, window=window)
        return [replace(change, index=change.index + start) for change in found]
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

