"""The history's trends page (trends.html) and the run report's link to it.

Built from ``templates/trends.html.j2`` with autoescaping on, reusing the run
report's macros, CSS and table sorting, from the series and figures of
``perfsuite.report.trends``. ``perfsuite history report`` writes it.
"""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import quote

from perfsuite.history.changes import DEFAULT_MAX_PVALUE, DEFAULT_WINDOW, regressed_at_head
from perfsuite.history.rows import DEFAULT_LAUNCH_STATISTIC
from perfsuite.history.schema import DEFAULT_PATH, resolve_url, shown_url, sqlite_file
from perfsuite.history.store import History, when
from perfsuite.report.formatting import fmt, fmt_bytes, quantity, sort_key, utc_time
from perfsuite.report.trends import (
    DEFAULT_METRICS,
    DEFAULT_NAME,
    TEMPLATES,
    Trend,
    launch_values_phrase,
    ratio_text,
    read_trends,
    trend_png,
)
from perfsuite.system.atomic import atomic_write_text


def _commit(point: Any) -> dict[str, Any]:
    return {"short": point.commit[:12], "full": point.commit, "time": when(point.time),
            "value": quantity(point.value, point.unit), "sort": sort_key(point.time)}


def _change_row(change: Any, anchor: str) -> dict[str, Any]:
    if change.counter_lines is None:
        counters, counters_note = [], "not recorded on both runs"
    elif not change.counter_lines:
        counters, counters_note = [], "unchanged (the same work per step)"
    else:
        counters, counters_note = list(change.counter_lines), ""
    ratio = change.ratio
    return {"cell": change.cell, "anchor": anchor, "metric": change.metric, "profile": change.profile,
            "direction": change.direction, "last_good": _commit(change.last_good),
            "first_bad": _commit(change.first_bad),
            "ratio": ratio_text(ratio) if ratio is not None else
            f"{quantity(change.last_good.value, change.last_good.unit)} → "
            f"{quantity(change.first_bad.value, change.first_bad.unit)}",
            "ratio_sort": sort_key(ratio.estimate if ratio is not None else None),
            "method": f"{ratio.confidence:.0%} {ratio.method}" if ratio is not None else "",
            "pvalue": f"{change.pvalue:.2g}", "counters": counters, "counters_note": counters_note}


def _figure(cell: str, metric: str, trends: list[Trend], statistic: str) -> dict[str, Any]:
    spreads = {s[2] for t in trends for s in t.spreads if s}
    launch_values = launch_values_phrase(metric, statistic)
    bars = {"launches": f"the range of the commit's {launch_values} (and runs)",
            "runs": "the range of the commit's runs", "iqr": "the run's step samples' IQR, centred"}
    caption = ("Each commit's value (the median of its runs; a run launched more than once: "
               f"the median of its {launch_values})"
               + (f"; bars: {'; or '.join(bars[k] for k in bars if k in spreads)}" if spreads else "")
               + ". Dashed lines: change points (Apache Otava E-Divisive) at the first bad commit, "
               "with the ratio after / before and its interval; each hardware profile is its own "
               "series, a dash-dot line where another machine took over, a dotted line across "
               "commits a profile did not measure.")
    out = {"metric": metric, "alt": f"{metric} of {cell} over commits", "caption": caption,
           "data": None, "error": None,
           "profiles": [{"name": t.profile, "commits": len(t.points), "changes": len(t.changes)}
                        for t in trends]}
    try:
        out["data"] = base64.b64encode(trend_png(cell, metric, trends)).decode("ascii")
    except Exception as err:  # noqa: BLE001 - one figure that cannot be drawn must not lose the page
        out["error"] = f"{type(err).__name__}: {err}"
    return out


def trends_context(trends: list[Trend], *, store: str, metrics: Sequence[str],
                   cells: Sequence[str] | None, settings: dict[str, Any]) -> dict[str, Any]:
    """Plain values for templates/trends.html.j2."""
    statistic = settings["launch_statistic"]
    by_cell: dict[str, dict[str, list[Trend]]] = {}
    for t in trends:
        by_cell.setdefault(t.cell, {}).setdefault(t.metric, []).append(t)
    anchors = {cell: f"cell-{i}" for i, cell in enumerate(by_cell)}
    changes = [_change_row(c, anchors[t.cell]) for t in trends for c in t.changes]
    series = []
    for t in trends:
        latest = t.points[-1]
        series.append({"cell": t.cell, "anchor": anchors[t.cell], "metric": t.metric,
                       "profile": t.profile, "commits": len(t.points),
                       "first": t.points[0].commit[:12], "last": latest.commit[:12],
                       "latest": quantity(latest.value, latest.unit), "latest_sort": sort_key(latest.value),
                       "changes": len(t.changes), "at_head": regressed_at_head(t.changes)})
    sections = [{"id": cell, "anchor": anchors[cell],
                 "figures": [_figure(cell, metric, group, statistic) for metric, group in per_metric.items()]}
                for cell, per_metric in by_cell.items()]
    at_head = [s for s in series if s["at_head"]]
    if not trends:
        headline, level = "No series: the store holds no ok run of these cells and metrics.", "warn"
    elif at_head:
        headline, level = (f"{len(at_head)} series regressed at head (their newest change point "
                           "is a regression)", "bad")
    elif changes:
        headline, level = f"{len(changes)} change point(s); none is a regression at head", "ok"
    else:
        headline, level = "No change point in any series", "ok"
    return {"store": store, "written": utc_time(time.time()), "metrics": list(metrics),
            "cells_filter": ", ".join(cells) if cells else "", "settings": settings,
            "step_time_launch_values": launch_values_phrase("step_time", statistic),
            "headline": headline, "level": level, "changes": changes, "series": series,
            "sections": sections, "n_cells": len(by_cell), "profiles": sorted({t.profile for t in trends})}


@lru_cache(maxsize=1)
def _environment():
    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    env = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=True,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(fmt=fmt, quantity=quantity, bytes=fmt_bytes, sortkey=sort_key)
    return env


def render_trends(context: dict[str, Any]) -> str:
    return _environment().get_template("trends.html.j2").render(**context)


def default_out(url: str | os.PathLike | None) -> Path:
    """trends.html beside the store's SQLite file (``.perfsuite/trends.html``
    for the default store), else in the current directory."""
    path = sqlite_file(resolve_url(url))
    return path.with_name(DEFAULT_NAME) if path is not None else Path(DEFAULT_NAME)


def write_trends(url: str | os.PathLike | None, out_path: Path | str | None = None,
                 cells: Sequence[str] | str | None = None,
                 metrics: Sequence[str] | str = DEFAULT_METRICS, **options: Any) -> Path:
    """Write the trends page of the history at ``url`` (None: the default
    store, which must exist) to ``out_path`` (None: ``default_out``): the
    given cells (ids or globs; None: all) and metrics. ``options``: since,
    branch, max_pvalue, window, launch_statistic, include (as ``perfsuite
    history changes`` has them).
    Raises HistoryError when the store cannot be read, LookupError when
    ``cells`` match no series (nothing is written then)."""
    return write_trends_page(url, out_path, cells, metrics, **options)[0]


def write_trends_page(url: str | os.PathLike | None, out_path: Path | str | None = None,
                      cells: Sequence[str] | str | None = None,
                      metrics: Sequence[str] | str = DEFAULT_METRICS, *, since: str | None = None,
                      branch: str | None = None, max_pvalue: float | None = None,
                      window: int | None = None, launch_statistic: str | None = None,
                      include: Sequence[str] = ()) -> tuple[Path, list[Trend]]:
    """``write_trends``, returning the series the page shows as well. Raises
    LookupError, writing nothing, when ``cells`` match no series."""
    cells = [cells] if isinstance(cells, str) else list(cells or []) or None
    metrics = [metrics] if isinstance(metrics, str) else list(metrics or DEFAULT_METRICS)
    out_path = Path(out_path) if out_path is not None else default_out(url)
    settings = {"max_pvalue": max_pvalue or DEFAULT_MAX_PVALUE, "window": window or DEFAULT_WINDOW,
                "launch_statistic": launch_statistic or DEFAULT_LAUNCH_STATISTIC,
                "since": since, "branch": branch, "include": list(include)}
    with History(url, create=False) as history:
        trends = read_trends(history, cells, metrics, since=since, branch=branch,
                             max_pvalue=max_pvalue, window=window, launch_statistic=launch_statistic,
                             include=include)
        store = shown_url(history.url)
    if cells and not trends:  # a name that matches nothing must not overwrite a page quietly
        raise LookupError(f"no {', '.join(metrics)} history of {', '.join(cells)} "
                          "(`perfsuite history show CELL` lists a cell's runs)")
    page = render_trends(trends_context(trends, store=store, metrics=metrics, cells=cells,
                                        settings=settings))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_path, page)
    return out_path, trends


# ----------------------------------------------------------------------------- the run report's link

def trends_link(base: Path | str | None) -> dict[str, Any] | None:
    """For a run's report.html written to ``base``: where the trends page of
    the default history store (``.perfsuite/history.sqlite`` here) is,
    relative to the page, and whether it has been written; None when there
    is no such store."""
    if base is None:
        return None
    try:
        store = Path.cwd() / DEFAULT_PATH
    except OSError:  # the working directory removed under the session: no store here
        return None
    if not store.is_file():
        return None
    page = store.with_name(DEFAULT_NAME)
    href = Path(os.path.relpath(page, Path(base).resolve())).as_posix()
    exists = page.is_file()
    return {"href": quote(href), "exists": exists, "store": str(DEFAULT_PATH),
            "page": str(DEFAULT_PATH.with_name(DEFAULT_NAME)),
            "written": utc_time(page.stat().st_mtime) if exists else None}
