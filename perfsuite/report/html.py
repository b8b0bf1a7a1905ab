"""One self-contained HTML page per run: environment, cells, checks, figures,
profiles; figures embedded as base64 PNG so the file travels alone (a CI
artifact, an e-mail), links to each cell's files beside it (relative, so the
run folder can move).

The page is built from Jinja2 templates (``templates/*.html.j2``) with
autoescaping on: every text from results.json is escaped by the template,
nothing here concatenates HTML. This module turns results.json into plain
values for the templates (numbers, strings, lists); formatting lives in the
filters registered below.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import math
import os
from collections import Counter
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import quote

from perfsuite.fsutil import atomic_write_text
from perfsuite.report import cellview as cv
from perfsuite.report.plotting import ReportFigure

GOOD, BAD = ("pass", "same", "improved"), ("fail", "regressed")
PROFILE_ROWS = 12
OUTPUT_TAIL_LINES = 40
TEMPLATES = Path(__file__).with_name("templates")
# The forest plot of a check against its baseline: ratios from 1/RANGE to RANGE.
FOREST_RANGE = 3.0
TRACE_SUFFIXES = (".trace.json", ".trace.json.gz", ".pt.trace.json", ".nsys-rep", ".qdrep")


CSS = (TEMPLATES / "report.css").read_text(encoding="utf-8")  # report/ab.py's page uses it too


def esc(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def fmt(value: Any, digits: int = 4) -> str:
    """Numbers to `digits` significant digits; None as an en dash; text as is."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        number = cv.number(value)
        return "–" if number is None else f"{number:.{digits}g}"
    return str(value)


def fmt_bytes(value: Any) -> str:
    """A byte count in binary units: 995 MiB, 1.5 GiB (never 9.951e+08)."""
    number = cv.number(value)
    if number is None:
        return "–"
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(number) >= scale:
            return f"{number / scale:.4g} {unit}"
    return f"{number:.0f} B"


def quantity(value: Any, unit: str | None = None, digits: int = 4) -> str:
    """A value with its unit in the unit a person reads: bytes in MiB/GiB,
    sub-second times in ms, fractions in percent."""
    unit = unit or ""
    number = cv.number(value)
    if number is None:
        return fmt(value, digits)
    if unit == "bytes":
        return fmt_bytes(number)
    if unit == "s" and abs(number) < 1:
        return f"{number * 1e3:.{digits}g} ms"
    if unit == "fraction":
        return f"{number * 100:.{digits}g} %"
    return f"{number:.{digits}g} {unit}".strip()


def td(value: Any, cls: str = "", digits: int = 4) -> str:
    """One table cell as a string (kept for report/ab.py's hand-built page)."""
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    classes = " ".join(c for c in (cls, "num" if numeric else "") if c)
    return f'<td class="{classes}">{esc(fmt(value, digits))}</td>'


def _time(stamp: Any) -> str:
    number = cv.number(stamp)
    if number is None:
        return "–"
    return _dt.datetime.fromtimestamp(number, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _sort_key(value: Any) -> str:
    """A cell's data-sort attribute: the raw number, so sorting is numeric."""
    number = cv.number(value)
    return "" if number is None else repr(number)


@lru_cache(maxsize=1)
def _environment():
    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    env = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=True,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(fmt=fmt, quantity=quantity, bytes=fmt_bytes, sortkey=_sort_key,
                       pct=lambda v, digits=3: fmt(None if cv.number(v) is None
                                                   else 100 * cv.number(v), digits))
    return env


# -- what the templates get ---------------------------------------------------

def _fingerprint(env: Mapping[str, Any]) -> str:
    """The baselines' short hash of hardware and software, to match runs by eye."""
    try:
        from perfsuite.recording import fingerprint
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
        "started": _time(started), "finished": _time(finished),
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


def _interval(check: Mapping[str, Any]) -> str:
    ratio, low, high = (cv.number(check.get(k)) for k in ("ratio", "ci_low", "ci_high"))
    confidence = cv.number(check.get("confidence"))
    interval = f" [{fmt(low)}, {fmt(high)}]" if low is not None and high is not None else ""
    level = f" {confidence:.0%} CI" if interval and confidence else ""
    return f"{fmt(ratio)}{interval}{level}" if ratio is not None or interval else "–"


def _ratio_short(check: Mapping[str, Any]) -> str:
    """"1.13x [0.83-1.55]": a ratio and its interval in a narrow column."""
    ratio, low, high = (cv.number(check.get(k)) for k in ("ratio", "ci_low", "ci_high"))
    if ratio is None:
        return "–"
    interval = f" [{low:.3g}–{high:.3g}]" if low is not None and high is not None else ""
    return f"{ratio:.3g}×{interval}"


def _expected(check: Mapping[str, Any], unit: str) -> str:
    expected = check.get("expected")
    tolerance = cv.number(check.get("tolerance"))
    text = quantity(expected, unit) if cv.number(expected) is not None else fmt(expected)
    if tolerance and expected is not None:
        text += f" ±{tolerance:.0%}"
    return text


def _forest(check: Mapping[str, Any]) -> dict[str, Any] | None:
    """Positions (percent of the strip) of a ratio, its interval and the
    tolerance band on a log scale from 1/FOREST_RANGE to FOREST_RANGE."""
    ratio = cv.number(check.get("ratio"))
    if ratio is None or ratio <= 0:
        return None
    span = math.log(FOREST_RANGE)

    def at(value: float | None) -> float | None:
        if value is None or value <= 0 or math.isinf(value):
            return None
        return round(50 + 50 * max(-1.0, min(1.0, math.log(value) / span)), 2)

    low, high = cv.number(check.get("ci_low")), cv.number(check.get("ci_high"))
    tolerance = cv.number(check.get("tolerance")) or 0.0
    band_low = at(max(1 - tolerance, 1 / FOREST_RANGE)) if tolerance < 1 else 0.0
    band_high = at(min(1 + tolerance, FOREST_RANGE))
    lo = at(low) if low is not None else None
    hi = at(high) if high is not None else (100.0 if high is None and low is not None else None)
    return {"at": at(ratio), "low": lo, "high": hi,
            "band_low": band_low or 0.0, "band_high": band_high or 100.0,
            "clipped": ratio < 1 / FOREST_RANGE or ratio > FOREST_RANGE}


def _unit(check: Mapping[str, Any], cell: Mapping[str, Any]) -> str:
    """The check's unit, else that of the cell metric it checks ("sanity.peak_rss"
    checks peak_rss, in bytes)."""
    if check.get("unit"):
        return str(check["unit"])
    name = str(check.get("metric") or check.get("name") or "").removeprefix("sanity.")
    return cv.unit(cell, name)


def _check(check: Mapping[str, Any], cell: Mapping[str, Any]) -> dict[str, Any]:
    unit = _unit(check, cell)
    return {
        "cell": check.get("cell") or cell.get("id"), "name": check.get("name"),
        "metric": check.get("metric"), "verdict": str(check.get("verdict")),
        "expected": _expected(check, unit), "baseline": check.get("baseline") or "",
        "observed": quantity(check.get("observed"), unit),
        "observed_sort": _sort_key(check.get("observed")),
        "ratio": _interval(check), "ratio_sort": _sort_key(check.get("ratio")),
        "ratio_short": _ratio_short(check),
        "message": check.get("message") or "", "forest": _forest(check),
    }


def against_baseline(cell: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The cell's checks that compared it with a baseline value (a ratio
    observed / expected with an interval): what changed, and how surely."""
    return [_check(k, cell) for k in cell.get("checks") or []
            if cv.number(k.get("ratio")) is not None and k.get("expected") is not None]


def _attention(cells: list[dict]) -> dict[str, Any]:
    """Checks that did not pass, first, so a failing run is read from the top;
    and what was not judged at all, so a green run that compared nothing does
    not read like one that compared everything."""
    picked = [_check(k, c) for c in cells for k in c.get("checks") or []
              if k.get("verdict") in (*BAD, "unknown")]
    broken = [{"id": c.get("id"), "status": str(c.get("status")), "reason": c.get("reason")}
              for c in cells if c.get("status") not in ("ok", "skipped")]
    checks = [k for c in cells for k in c.get("checks") or []]
    skipped = [k for k in checks if k.get("verdict") == "skipped"]
    judged = [k for k in checks if k.get("verdict") not in ("skipped", None)]
    step_checks = [k for k in checks if k.get("name") == "step_time"]
    step_skipped = [k for k in step_checks if k.get("verdict") == "skipped"]
    notes = []
    if step_checks and len(step_skipped) == len(step_checks):
        why = Counter(str(k.get("message") or "no reason given") for k in step_skipped)
        notes.append(f"No step time was compared with a baseline: all {len(step_checks)} "
                     "step_time check(s) were skipped ("
                     + "; ".join(f"{n} x {reason}" for reason, n in why.most_common(3)) + ").")
    if skipped:
        names = Counter(str(k.get("name")) for k in skipped)
        notes.append(f"{len(skipped)} comparison(s) could not be made (skipped, see each cell "
                     "for why): nothing was judged there ("
                     + ", ".join(f"{n} {name}" for name, n in names.most_common(6))
                     + (", ..." if len(names) > 6 else "") + ").")
    if broken or any(k["verdict"] in BAD for k in picked):
        headline, level = "Something failed or regressed: see below.", "bad"
    elif picked:
        headline, level = ("No check failed or regressed, but some could not decide "
                           "(unknown): measure more.", "warn")
    elif not judged:
        headline, level = "Nothing was judged: no check made a comparison.", "warn"
    elif step_checks and len(step_skipped) == len(step_checks):
        headline, level = (f"Every cell ran and none of the {len(judged)} judged check(s) failed, "
                           "but step times were not judged.", "warn")
    elif skipped:
        headline, level = (f"Every cell ran and none of the {len(judged)} judged check(s) "
                           f"failed or regressed; {len(skipped)} could not be made.", "warn")
    else:
        headline, level = (f"Every cell ran and none of the {len(judged)} check(s) failed or "
                           "regressed.", "ok")
    return {"headline": headline, "level": level, "notes": notes, "broken": broken,
            "checks": picked}


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
            "sort": _sort_key(m.get("value")),
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
            return _check(check, cell)
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


def _attribution(deltas: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [{"category": d.get("category"), "name": str(d.get("name"))[:100],
             "baseline": d.get("baseline_s"), "current": d.get("current_s"),
             "delta": d.get("delta_s"),
             "relative": None if cv.number(d.get("relative")) is None else 100 * d["relative"],
             "status": d.get("status")} for d in deltas]


def _counters(counted: Mapping[str, Any]) -> dict[str, Any]:
    """A cell's work counters per step (summed over its ranks)."""
    from perfsuite.counters import headline

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
        checks = [_check(k, cell) for k in cell.get("checks") or []]
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
            "attribution": _attribution(list(cell["attribution"])) if cell.get("attribution") else [],
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
    return {"css": CSS, "header": _header(results, cells), "attention": _attention(cells),
            "probe": _probe(results.get("probe")), "cells": _cells_table(cells, base),
            "figures": _figures(figures), "details": _details(cells, base),
            "skipped": _skipped(cells), "env": _env(results, cells),
            "forest_range": FOREST_RANGE}


def render_html(results: Mapping[str, Any], figures: list[ReportFigure] | None = None,
                base: Path | str | None = None) -> str:
    """The page as a string; figures are drawn here unless given. ``base``, the
    run folder the page is written to, makes the links point at files that exist."""
    if figures is None:
        from perfsuite.report.figures import render_figures

        figures = render_figures(list(results.get("cells") or []))
    context = report_context(results, figures, Path(base) if base is not None else None)
    return _environment().get_template("report.html.j2").render(**context)


def write_html_report(results: Mapping[str, Any], out_path: Path | str,
                      figures: list[ReportFigure] | None = None) -> Path:
    """Write the run's report page (written whole, then renamed into place)."""
    out_path = Path(out_path)
    atomic_write_text(out_path, render_html(results, figures, base=out_path.parent))
    return out_path


def write_reports(results_dir: Path | str, *, figure_dir: str | None = "figures"
                  ) -> dict[str, Path]:
    """results.csv, checks.csv and report.html (plus each figure as a PNG under
    ``figure_dir``, unless None) next to a run's results.json."""
    from perfsuite.report.figures import render_figures
    from perfsuite.report.tables import write_checks_csv, write_results_csv
    from perfsuite.results import load

    results_dir = Path(results_dir)
    if results_dir.name == "results.json":
        results_dir = results_dir.parent
    results = load(results_dir)
    written = {"results_csv": write_results_csv(results, results_dir / "results.csv"),
               "checks_csv": write_checks_csv(results, results_dir / "checks.csv")}
    figures = render_figures(list(results.get("cells") or []))
    if figure_dir:
        folder = results_dir / figure_dir
        folder.mkdir(parents=True, exist_ok=True)
        for fig in figures:
            if fig.png is not None:
                (folder / f"{fig.name}.png").write_bytes(fig.png)
    written["report_html"] = write_html_report(results, results_dir / "report.html", figures)
    return written
