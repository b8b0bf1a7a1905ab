"""The report page's content as plain values for its templates (numbers,
strings, lists): the run's header, the probe, the cells' table and details
(checks, work counters, profiles, attribution, links to their files), the
figures, the skipped cells and the environment. ``report_context`` gathers
them; ``perfsuite.report.html`` renders them.
"""

from __future__ import annotations

import base64
import os
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from perfsuite.judge.recording import fingerprint
from perfsuite.rank.counters import headline
from perfsuite.report import cellview as cv
from perfsuite.report.formatting import fmt, fmt_bytes, quantity, sort_key, utc_time
from perfsuite.report.page_checks import BAD, FOREST_RANGE, GOOD, against_baseline, attention, check_row
from perfsuite.report.plotting import ReportFigure

PROFILE_ROWS = 12
OUTPUT_TAIL_LINES = 40
TRACE_SUFFIXES = (".trace.json", ".trace.json.gz", ".pt.trace.json", ".nsys-rep", ".qdrep")


def _fingerprint(env: Mapping[str, Any]) -> str:
    """The baselines' short hash of hardware and software, to match runs by eye."""
    try:
        return fingerprint(env)
    except Exception:  # noqa: BLE001 - the page is still worth having without it
        return "–"


def _header(results: Mapping[str, Any], cells: list[dict]) -> dict[str, Any]:
    run = results.get("run") or {}
    started, finished = cv.number(run.get("started")), cv.number(run.get("finished"))
    env = dict(results.get("env") or {}) or cv.env_of(cells)
    versions = ", ".join(f"{k} {env[k]}" for k in ("torch", "torchvision", "torchtune", "cuda",
                                                    "nccl", "driver", "python") if env.get(k))
    return {
        "tiers": ", ".join(sorted({str(cv.params(c).get("tier")) for c in cells
                                   if cv.params(c).get("tier")})) or "–",
        "started": utc_time(started), "finished": utc_time(finished),
        "took": f"{finished - started:.0f} s" if started and finished else "–",
        "schema": results.get("schema"),
        "hardware": cv.hardware_label(cells, env).removeprefix("ours: "),
        "versions": versions, "commit": str(env.get("commit") or "")[:12],
        "fingerprint": _fingerprint(env),
        "argv": " ".join(str(a) for a in run.get("argv") or []),
        "statuses": sorted(Counter(str(c.get("status")) for c in cells).items()),
        "verdicts": sorted(Counter(str(k.get("verdict")) for c in cells
                                   for k in c.get("checks") or []).items()),
    }


def _probe(probe: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The pre-flight probe: figures, trust, and what was compared or not."""
    if not probe:
        return None
    out: dict[str, Any] = {"id": probe.get("id"), "status": str(probe.get("status")),
                           "reason": probe.get("reason"), "rows": [], "flags": [], "notes": []}
    if probe.get("status") != "ok":
        return out
    assessment = probe.get("assessment") or {}
    figures = assessment.get("figures") or {}
    for name, m in (probe.get("metrics") or {}).items():
        judged = figures.get(name) or {}
        fraction = cv.number(judged.get("fraction"))
        out["rows"].append({
            "name": name, "value": quantity(m.get("value"), m.get("unit")),
            "sort": sort_key(m.get("value")),
            "expected": quantity(judged.get("expected"), m.get("unit"))
            if cv.number(judged.get("expected")) is not None else "–",
            "fraction": "–" if fraction is None else f"{fraction:.0%}",
            "verdict": judged.get("verdict") or "–", "against": judged.get("against") or ""})
    out.update(trusted=bool(assessment.get("trusted", True)),
               flags=list(assessment.get("flags") or []), notes=list(assessment.get("notes") or []))
    return out


def _memory(cell: Mapping[str, Any]) -> tuple[float | None, str]:
    for name, what in (("peak_mem_allocated", "GPU alloc"), ("peak_rss", "RSS")):
        value = cv.metric(cell, name)
        if value is not None:
            return value, what
    return None, ""


def _cell_dir(cell: Mapping[str, Any], base: Path | None) -> str:
    """The cell's folder relative to the page: where the launcher put it when
    that is under the run folder, else the usual cells/<id>."""
    if base is not None and cell.get("dir"):
        try:
            rel = os.path.relpath(Path(str(cell["dir"])).resolve(), base.resolve())
        except ValueError:  # another drive
            rel = ""
        if rel and not rel.startswith(".."):
            return Path(rel).as_posix()
    return f"cells/{cell.get('id')}"


def _traces(cell: Mapping[str, Any], folder: str, base: Path | None) -> list[str]:
    """Relative paths of the cell's profiler traces."""
    if base is not None:
        found = sorted(p for p in (base / folder).glob("profile/*")
                       if p.is_file() and p.name.endswith(TRACE_SUFFIXES))
        return [f"{folder}/{p.relative_to(base / folder).as_posix()}" for p in found]
    profile = cell.get("profile") if isinstance(cell.get("profile"), Mapping) else {}
    metas = [profile.get("meta") or {}] + [r.get("meta") or {} for r in profile.get("ranks") or []
                                           if isinstance(r, Mapping)]
    names = dict.fromkeys(Path(str(m["trace"])).name for m in metas if m.get("trace"))
    return [f"{folder}/profile/{name}" for name in names]


def links(cell: Mapping[str, Any], base: Path | None = None) -> list[dict[str, str]]:
    """Relative links to the cell's output.log, result.json and traces. With
    ``base`` (the run folder) only files that exist; without, the files every
    launched cell writes."""
    folder = _cell_dir(cell, base)
    launched = cell.get("status") != "skipped" or bool(cell.get("dir"))
    out = []
    for name, label in (("output.log", "log"), ("result.json", "result.json")):
        if (base is not None and (base / folder / name).is_file()) or (base is None and launched):
            out.append({"label": label, "href": quote(f"{folder}/{name}")})
    traces = _traces(cell, folder, base)
    for path in traces:
        label = "trace" if len(traces) == 1 else f"trace {Path(path).name.split('.')[0]}"
        out.append({"label": label, "href": quote(path)})
    return out


def _step_check(cell: Mapping[str, Any]) -> dict[str, Any] | None:
    for check in cell.get("checks") or []:
        if check.get("name") == "step_time":
            return check_row(check, cell)
    return None


def _cells_table(cells: list[dict], base: Path | None) -> list[dict[str, Any]]:
    rows = []
    for i, cell in enumerate(cells):
        step, iqr = cv.metric(cell, "step_time"), cv.metric(cell, "step_time", "iqr")
        accuracy = cv.shown_accuracy(cell)
        memory, where = _memory(cell)
        thr = cv.metric(cell, "throughput")
        verdicts = Counter(str(k.get("verdict")) for k in cell.get("checks") or [])
        attention = (cell.get("status") not in ("ok", "skipped")
                     or any(v in (*BAD, "unknown") for v in verdicts))
        rows.append({
            "anchor": f"cell-{i}", "id": cell.get("id"), "status": str(cell.get("status")),
            "step_ms": None if step is None else step * 1e3,
            "iqr_ms": None if iqr is None else iqr * 1e3,
            "n": cv.metric(cell, "step_time", "n"),
            "throughput": thr, "throughput_unit": cv.unit(cell, "throughput"),
            "accuracy": None if accuracy is None else 100 * accuracy,
            "memory": memory, "memory_where": where,
            "wall": cv.number(cell.get("duration_s")),
            "gpu_busy": None if cv.number(cell.get("gpu_busy_share")) is None
            else 100 * cell["gpu_busy_share"],
            "verdicts": sorted(verdicts.items()), "attention": attention,
            "step_check": _step_check(cell), "links": links(cell, base)})
    return rows


def _figures(figures: list[ReportFigure]) -> list[dict[str, Any]]:
    return [{"name": f.name, "title": f.title, "caption": f.caption, "error": f.error,
             "data": base64.b64encode(f.png).decode("ascii") if f.png is not None else None}
            for f in figures]


def _per_step_scale(profile: Mapping[str, Any]) -> float | None:
    """Seconds in the window -> ms per measured step, averaged over the merged
    ranks (their times add up in a merged profile; a step is one rank's)."""
    steps = cv.number(profile.get("steps"))
    ranks = len(profile.get("ranks") or []) or 1
    return 1e3 / (steps * ranks) if steps else None


def _profile(profile: Mapping[str, Any]) -> dict[str, Any]:
    scale = _per_step_scale(profile)
    ranks = len(profile.get("ranks") or [])
    meta = profile.get("meta") or {}
    exported_inside = (profile.get("source") == "torch" and not any(
        (r.get("meta") or {}).get("exported") for r in [profile, *(profile.get("ranks") or [])]
        if isinstance(r, Mapping)))
    metrics = [{"name": name, "total": m.get("total_s"), "calls": m.get("calls"),
                "per_step": None if scale is None else (cv.number(m.get("total_s")) or 0) * scale,
                "share": 100 * (cv.number(m.get("share_of_category")) or 0.0),
                "selected": cv.number(m.get("percent_of_selected"))}
               for name, m in (profile.get("paper_metrics") or {}).items() if m.get("present")]
    rows = sorted(profile.get("rows") or [], key=lambda r: -(cv.number(r.get("total_s")) or 0))
    top = [{"category": r.get("category"), "name": str(r.get("name"))[:100],
            "total": r.get("total_s"), "calls": r.get("calls"), "avg": r.get("avg_s"),
            "per_step": None if scale is None else (cv.number(r.get("total_s")) or 0) * scale,
            "share": 100 * (cv.number(r.get("share")) or 0.0),
            "bytes": fmt_bytes(r.get("bytes")) if cv.number(r.get("bytes")) is not None else "–"}
           for r in rows[:PROFILE_ROWS]]
    h2d = profile.get("h2d") or {}
    return {"source": profile.get("source"), "steps": profile.get("steps"),
            "window": cv.number(profile.get("window_s")), "ranks": ranks,
            "world_size": meta.get("world_size"), "metrics": metrics, "top": top,
            "total_rows": len(rows), "per_step": scale is not None,
            "h2d_bytes": fmt_bytes(h2d.get("bytes")) if cv.number(h2d.get("bytes")) else None,
            "exported_inside": exported_inside}


def _counters(counted: Mapping[str, Any]) -> dict[str, Any]:
    """A cell's work counters per step (summed over its ranks)."""
    unstable = counted.get("unstable") or []
    note = (f"per training step, summed over {counted.get('ranks', 1)} rank(s), counted over "
            f"{counted.get('window_steps')} steps after the timed ones"
            + (f"; unstable, not judged: {', '.join(unstable)}" if unstable else ""))
    return {"note": note, "rows": headline(counted["per_step"])}


def _profiled_outliers(cell: Mapping[str, Any], profile: Mapping[str, Any] | None) -> str:
    """A profiled cell whose trace was written inside a timed step (results
    from before the export moved after the loop): name the step it slowed."""
    samples = [s for s in ((cell.get("metrics") or {}).get("step_time") or {}).get("samples") or []
               if cv.number(s) is not None]
    if not profile or not profile.get("exported_inside") or len(samples) < 3:
        return ""
    ordered = sorted(samples)
    median = ordered[len(ordered) // 2]
    worst = max(samples)
    if worst < 5 * median:
        return ""
    return (f"One judged step took {worst:.3g} s against a median of {median * 1e3:.4g} ms: "
            "this run's profiler wrote its trace inside that step (the trace is now written after "
            "the timed steps). Read this cell's step-time spread with that in mind.")


def _details(cells: list[dict], base: Path | None) -> list[dict[str, Any]]:
    out = []
    for i, cell in enumerate(cells):
        if cell.get("status") == "skipped":
            continue
        checks = [check_row(k, cell) for k in cell.get("checks") or []]
        profile = _profile(cell["profile"]) if isinstance(cell.get("profile"), Mapping) else None
        tail = ("\n".join(str(cell["output_tail"]).splitlines()[-OUTPUT_TAIL_LINES:])
                if cell.get("output_tail") else "")
        accuracy = cv.metric(cell, "accuracy")
        out.append({
            "anchor": f"cell-{i}", "id": cell.get("id"), "status": str(cell.get("status")),
            "sources": "; ".join(str(s) for s in cv.params(cell).get("sources") or []),
            "reason": cell.get("reason"), "links": links(cell, base),
            "against": against_baseline(cell), "checks": checks,
            "checks_open": any(k["verdict"] not in GOOD for k in checks),
            "counters": _counters(cell["counters"])
            if (cell.get("counters") or {}).get("per_step") else None,
            "profile": profile, "profile_note": _profiled_outliers(cell, profile),
            "accuracy_hidden": (accuracy is not None and cv.shown_accuracy(cell) is None),
            "tail": tail})
    return out


def _skipped(cells: list[dict]) -> list[dict[str, Any]]:
    return [{"anchor": f"cell-{i}", "id": c.get("id"), "reason": c.get("reason")}
            for i, c in enumerate(cells) if c.get("status") == "skipped"]


def _env(results: Mapping[str, Any], cells: list[dict]) -> list[dict[str, Any]]:
    env = dict(results.get("env") or {}) or cv.env_of(cells)

    def shown(key: str, value: Any) -> str:
        return fmt_bytes(value) if key.endswith("_bytes") and cv.number(value) else fmt(value)

    rows = []
    for key in sorted(set(env) | {k for c in cells for k in (c.get("env") or {})}):
        others = sorted({shown(key, (c.get("env") or {}).get(key)) for c in cells
                         if c.get("env") and (c["env"].get(key) != env.get(key))})
        rows.append({"key": key, "value": shown(key, env.get(key)),
                     "differs": f"cells: {', '.join(others)}" if others else ""})
    return rows


def report_context(results: Mapping[str, Any], figures: list[ReportFigure],
                   base: Path | None = None) -> dict[str, Any]:
    """Everything the page shows, as plain values (the templates' input)."""
    cells = list(results.get("cells") or [])
    return {"header": _header(results, cells), "attention": attention(cells),
            "probe": _probe(results.get("probe")), "cells": _cells_table(cells, base),
            "figures": _figures(figures), "details": _details(cells, base),
            "skipped": _skipped(cells), "env": _env(results, cells),
            "forest_range": FOREST_RANGE}


