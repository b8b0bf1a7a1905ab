"""Which rows moved between two profile summaries: a plain per-row delta
(``attribute_change``) of two ProfileSummary objects, kept for the report's
profile table (summary.py imports it: no import back). The
attribution diff with matching, levels and a noise floor is
perfsuite.profiling.attribution."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RowDelta:
    name: str
    category: str
    baseline_s: float
    current_s: float

    @property
    def delta_s(self) -> float:
        return self.current_s - self.baseline_s

    @property
    def relative(self) -> float | None:
        """Change as a fraction of the baseline; None for a row new in current."""
        return None if self.baseline_s <= 0 else self.delta_s / self.baseline_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "category": self.category,
            "baseline_s": self.baseline_s,
            "current_s": self.current_s,
            "delta_s": self.delta_s,
            "relative": self.relative,
            "status": "new" if self.baseline_s <= 0 else ("gone" if self.current_s <= 0 else "changed"),
        }


def attribute_change(
    baseline: Any,
    current: Any,
    *,
    top: int = 10,
    by: str = "abs",
    categories: Sequence[str] | None = None,
    min_abs_s: float = 0.0,
) -> list[RowDelta]:
    """The rows that moved most from baseline to current.

    by="abs" orders by |delta seconds|; by="rel" by |relative change| (new rows
    first), ignoring rows whose |delta| is under min_abs_s so tiny rows do not
    dominate. Times are per step when both summaries know their step count.
    """
    if by not in ("abs", "rel"):
        raise ValueError("by must be 'abs' or 'rel'")
    base_scale = 1.0 / baseline.steps if baseline.steps and current.steps else 1.0
    cur_scale = 1.0 / current.steps if baseline.steps and current.steps else 1.0
    base = {r.key: r.total_s * base_scale for r in baseline.rows}
    cur = {r.key: r.total_s * cur_scale for r in current.rows}
    deltas = []
    for key in set(base) | set(cur):
        category, name = key
        if categories is not None and category not in categories:
            continue
        delta = RowDelta(name, category, base.get(key, 0.0), cur.get(key, 0.0))
        if delta.delta_s == 0 or abs(delta.delta_s) < min_abs_s:
            continue
        deltas.append(delta)
    if by == "abs":
        deltas.sort(key=lambda d: (-abs(d.delta_s), d.category, d.name))
    else:
        deltas.sort(key=lambda d: (-(math.inf if d.relative is None else abs(d.relative)),
                                   -abs(d.delta_s), d.category, d.name))
    return deltas[:top]
