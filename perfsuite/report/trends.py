"""The history's trends page (trends.html): per cell and metric, the values
over commits, the change points marked, each hardware profile its own series.

Read from a history store (``perfsuite.history.store.History``): one figure per
cell and metric, x the commits in the order they were first measured (short
sha labels), y the commit's value (``Point.value``: the median of its runs,
a step time's run the median of its launches' medians, or floors, when it
was launched more than once: ``History.series``) with the spread where the
store has it as error bars (the range of those launch values, or of the
runs, of that commit; else the run's samples' IQR around the value). A change point found by Apache Otava's
E-Divisive (``perfsuite.history.changes.find_changes``) is a vertical line
at its first bad commit with its ratio and interval; each hardware profile
is its own series (colour, marker) and a dash-dot line marks where the
machine measuring the series changed. A table lists the changes (cell,
metric, profile, last good, first bad, ratio [interval], work counters).

The page is self-contained (figures as base64 PNG); it is put together by
``perfsuite.report.trends_page``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from perfsuite.history.changes import DEFAULT_MAX_PVALUE, DEFAULT_WINDOW, find_changes
from perfsuite.history.rows import DEFAULT_LAUNCH_STATISTIC, launch_key
from perfsuite.history.schema import metrics as metrics_table
from perfsuite.report.plotting import PALETTE, figure_legend, new_figure, png_bytes

TEMPLATES = Path(__file__).with_name("templates")
DEFAULT_NAME = "trends.html"
DEFAULT_METRICS = ("step_time",)
PROFILE_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
REGRESSED_COLOUR, IMPROVED_COLOUR, HARDWARE_COLOUR = "#d62728", "#2ca02c", "#555555"
MAX_TICKS = 40  # commit labels on one axis; more are thinned
SHORT_SHA = 8


@dataclass
class Trend:
    """One series of the page: a cell, a metric, a hardware profile."""

    cell: str
    metric: str
    profile: str
    points: list  # perfsuite.history.store.Point, in the order the commits were first measured
    changes: list = field(default_factory=list)  # perfsuite.history.changes.Change
    spreads: list = field(default_factory=list)  # per point: (low, high, kind) or None


# ----------------------------------------------------------------------------- reading the store

def _matching(history: Any, cells: Sequence[str] | None, metric: str, since: str | None,
              branch: str | None, statistic: str,
              include: Sequence[str] = ()) -> dict[tuple[str, str, str], list]:
    # runs only, as `history changes` takes them, unless other purposes are included
    if not cells:
        return history.series(metric=metric, since=since, branch=branch, launch_statistic=statistic,
                              include=tuple(include))
    out: dict[tuple[str, str, str], list] = {}
    for pattern in cells:
        out.update(history.series(cell=pattern, metric=metric, since=since, branch=branch,
                                  launch_statistic=statistic, include=tuple(include)))
    return dict(sorted(out.items()))


def _stored_spread(history: Any, metric: str, statistic: str) -> dict[tuple[int, str], tuple[float | None, list]]:
    """(run id, cell) -> (IQR of the run's samples, its launch values) of ``metric``."""
    query = sa.select(metrics_table.c.run_id, metrics_table.c.cell, metrics_table.c.iqr,
                      metrics_table.c.launches).where(metrics_table.c.metric == metric)
    with history.engine.connect() as conn:
        rows = conn.execute(query).all()
    out = {}
    for run_id, cell, iqr, launches in rows:
        launched = [float(v) for v in (launches or {}).get(launch_key(metric, statistic)) or []
                    if _finite(v)]
        out[(run_id, cell)] = (float(iqr) if _finite(iqr) else None, launched)
    return out


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def launch_values_phrase(metric: str, statistic: str) -> str:
    """What a repeated run takes of each launch, in the header's and the captions' words."""
    return "launch floors (fastest steps)" if launch_key(metric, statistic) == "floors" else "launch medians"


def point_spread(point: Any, cell: str, stored: dict) -> tuple[float, float, str] | None:
    """The error bar of one commit: the range of its launch values (a run
    launched more than once) and of its runs' values (a commit measured more
    than once), else the run's samples' IQR centred on the value, else None."""
    spread: list[float] = []
    launched = False
    for run_id, value in zip(point.run_ids, point.values):
        launch_values = stored.get((run_id, cell), (None, []))[1]
        if len(launch_values) >= 2:
            spread += launch_values
            launched = True
        else:
            spread.append(value)
    if len(spread) >= 2:
        return min(spread), max(spread), "launches" if launched else "runs"
    iqr = stored.get((point.run_ids[0], cell), (None, []))[0] if point.run_ids else None
    if iqr is not None and iqr > 0:
        return point.value - iqr / 2, point.value + iqr / 2, "iqr"
    return None


def read_trends(history: Any, cells: Sequence[str] | None = None,
                metrics: Iterable[str] = DEFAULT_METRICS, *, since: str | None = None,
                branch: str | None = None, max_pvalue: float | None = None,
                window: int | None = None, launch_statistic: str | None = None,
                include: Sequence[str] = ()) -> list[Trend]:
    """Every series of the given cells (ids or globs; None: all) and metrics,
    with its change points and error bars; of the runs stored as ``run``,
    and of the purposes in ``include`` (``experiment``, ``ad-hoc``)."""
    statistic = launch_statistic or DEFAULT_LAUNCH_STATISTIC
    trends = []
    for metric in dict.fromkeys(metrics):
        series = _matching(history, cells, metric, since, branch, statistic, include)
        stored = _stored_spread(history, metric, statistic) if series else {}
        for (cell, name, profile), points in series.items():
            changes = find_changes(points, cell=cell, metric=name, profile=profile,
                                   max_pvalue=max_pvalue or DEFAULT_MAX_PVALUE,
                                   window=window or DEFAULT_WINDOW)
            trends.append(Trend(cell, name, profile, points, changes,
                                [point_spread(p, cell, stored) for p in points]))
    return trends


# ----------------------------------------------------------------------------- the figure

def commit_order(trends: Sequence[Trend]) -> list[str]:
    """The commits of one cell and metric over all profiles, in the order
    they were first measured (the x axis)."""
    first: dict[str, tuple[float, int]] = {}
    for t in trends:
        for k, p in enumerate(t.points):
            stamp = (p.time if p.time is not None else math.inf, k)
            if p.commit not in first or stamp < first[p.commit]:
                first[p.commit] = stamp
    return sorted(first, key=lambda c: first[c])


def hardware_changes(trends: Sequence[Trend], order: Sequence[str]) -> list[tuple[int, list[str], list[str]]]:
    """(x, profiles before, profiles from x on) wherever no profile that
    measured the commit before x measured the commit at x: another machine."""
    at: dict[str, set[str]] = {}
    for t in trends:
        for p in t.points:
            at.setdefault(p.commit, set()).add(t.profile)
    out = []
    for x in range(1, len(order)):
        before, now = at.get(order[x - 1], set()), at.get(order[x], set())
        if before and now and not before & now:
            out.append((x, sorted(before), sorted(now)))
    return out


def _scale(unit: str | None, values: list[float]) -> tuple[float, str]:
    if unit == "s" and values and max(abs(v) for v in values) < 1:
        return 1e3, "ms"
    return 1.0, unit or ""


def ratio_text(ratio: Any) -> str:
    if ratio is None:
        return "–"
    high = "∞" if not math.isfinite(ratio.high) else f"{ratio.high:.3f}"
    return f"×{ratio.estimate:.3f} [{ratio.low:.3f}, {high}]"


def _ticks(order: Sequence[str], marked: Iterable[int]) -> list[int]:
    step = max(1, math.ceil(len(order) / MAX_TICKS))
    marked = sorted(set(marked))
    ticks = set(marked)
    for x in range(0, len(order), step):
        if all(abs(x - m) * 2 >= step for m in marked):
            ticks.add(x)
    return sorted(ticks)


def trend_figure(cell: str, metric: str, trends: Sequence[Trend]):
    """One cell and metric: every profile's series over the commits."""
    from matplotlib.lines import Line2D

    order = commit_order(trends)
    xs_of = {c: x for x, c in enumerate(order)}
    unit = next((p.unit for t in trends for p in t.points if p.unit), None)
    factor, shown_unit = _scale(unit, [p.value for t in trends for p in t.points])
    width = min(16.0, max(8.0, 4.0 + 0.22 * len(order)))
    fig, [ax] = new_figure(1, width, 4.2)
    for i, t in enumerate(trends):
        colour, marker = PALETTE[i % len(PALETTE)], PROFILE_MARKERS[i % len(PROFILE_MARKERS)]
        xs = [xs_of[p.commit] for p in t.points]
        ys = [p.value * factor for p in t.points]
        # a solid line between neighbouring commits; a dotted one across commits
        # measured only on other hardware (the series has a gap there)
        for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
            ax.plot([x0, x1], [y0, y1], color=colour, linewidth=1.2,
                    linestyle="-" if x1 - x0 == 1 else ":", zorder=2)
        lows = [y - s[0] * factor if s else 0.0 for y, s in zip(ys, t.spreads)]
        highs = [s[1] * factor - y if s else 0.0 for y, s in zip(ys, t.spreads)]
        has_bars = any(t.spreads)
        ax.errorbar(xs, ys, yerr=[lows, highs] if has_bars else None, fmt=marker, color=colour,
                    markersize=5, capsize=2.5 if has_bars else 0, linewidth=0.9, zorder=3,
                    label=t.profile)
    extras = []
    switches = hardware_changes(trends, order)
    for x, _before, _after in switches:
        ax.axvline(x - 0.5, color=HARDWARE_COLOUR, linestyle="-.", linewidth=1.2, zorder=1)
    if switches:  # which machine took over, above the axes: nothing of the data is covered
        top = ax.secondary_xaxis("top")
        top.set_xticks([x - 0.5 for x, _, _ in switches],
                       labels=[f"hardware → {', '.join(after)}" for _, _, after in switches],
                       fontsize=7, color=HARDWARE_COLOUR, parse_math=False)
        top.tick_params(length=0, pad=2)
        extras.append(Line2D([], [], color=HARDWARE_COLOUR, linestyle="-.",
                             label="another hardware profile from here"))
    marked: dict[int, str] = {}
    for k, change in enumerate(c for t in trends for c in t.changes):
        x = xs_of[change.first_bad.commit]
        colour = REGRESSED_COLOUR if change.direction == "regressed" else IMPROVED_COLOUR
        marked[x] = colour
        ax.axvline(x, color=colour, linestyle="--", linewidth=1.3, zorder=1)
        label = ax.annotate(f"{change.direction} {ratio_text(change.ratio)}", (x, 0.97 - 0.09 * (k % 3)),
                            xycoords=("data", "axes fraction"), xytext=(4, 0), textcoords="offset points",
                            fontsize=7.5, ha="left", va="top", color=colour, parse_math=False,
                            bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": colour, "alpha": 0.9})
        label.set_in_layout(False)
        first = "first bad" if change.direction == "regressed" else "first after"
        extras.append(Line2D([], [], color=colour, linestyle="--", label=f"{change.direction}: {first} commit"))
    for handle in {h.get_label(): h for h in extras}.values():
        ax.add_line(handle)  # an empty line: only its legend entry shows
    if marked:  # headroom for the change points' labels at the top
        low, high = ax.get_ylim()
        ax.set_ylim(low, high + 0.2 * (high - low))
    ticks = _ticks(order, marked)
    ax.set_xticks(ticks)
    ax.set_xticklabels([order[x][:SHORT_SHA] for x in ticks], rotation=90, fontsize=7,
                       fontfamily="monospace", parse_math=False)
    for x, label in zip(ticks, ax.get_xticklabels()):
        if x in marked:  # the first bad commit's label in the change's colour
            label.set_fontweight("bold")
            label.set_color(marked[x])
    ax.set_xlim(-0.7, max(len(order) - 0.3, 0.7))
    ax.set_xlabel("commit, in the order first measured")
    ax.set_ylabel(f"{metric} ({shown_unit})" if shown_unit else metric, parse_math=False)
    ax.grid(axis="y", color="#e5e5e5", linewidth=0.6)
    ax.set_title(f"{cell}  ·  {metric}", fontsize=10, fontfamily="monospace", parse_math=False)
    figure_legend(fig, ncols=3)
    return fig


def trend_png(cell: str, metric: str, trends: Sequence[Trend]) -> bytes:
    return png_bytes(trend_figure(cell, metric, trends))
