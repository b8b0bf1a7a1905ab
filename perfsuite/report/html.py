"""One self-contained HTML page per run: environment, cells, checks, figures,
profiles; figures embedded as base64 PNG so the file travels alone (a CI
artifact, an e-mail). Every text from results.json is escaped.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from perfsuite.fsutil import atomic_write_text
from perfsuite.report import cellview as cv
from perfsuite.report.plotting import ReportFigure

GOOD, BAD = ("pass", "same", "improved"), ("fail", "regressed")
PROFILE_ROWS = 12
OUTPUT_TAIL_LINES = 40

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;
 max-width:1500px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ccc}
h3{font-size:15px;margin:18px 0 6px;font-family:ui-monospace,Menlo,Consolas,monospace}
table{border-collapse:collapse;margin:6px 0 12px;font-size:13px}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f3f3f3;position:sticky;top:0}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.id,code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;white-space:nowrap}
td.msg{max-width:560px;font-size:12px;color:#444}
.v-pass,.v-same,.s-ok{background:#e3f4e1}.v-improved{background:#d9f0f5}
.v-regressed,.v-fail,.s-error,.s-timeout,.s-failed{background:#fbdcdc}
.v-unknown{background:#fff2cc}.v-skipped,.s-skipped{background:#eee;color:#555}
.badge{display:inline-block;padding:1px 8px;margin:0 6px 4px 0;border-radius:9px;font-size:12px}
.muted{color:#666;font-size:12px}figure{margin:12px 0 24px}
figure img{max-width:100%;border:1px solid #ddd}figcaption{font-size:12px;color:#555;max-width:1100px}
pre{background:#f7f7f7;border:1px solid #ddd;padding:8px;font-size:11px;overflow:auto;max-height:360px}
.grid{display:flex;flex-wrap:wrap;gap:18px}
"""


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


def _time(stamp: Any) -> str:
    number = cv.number(stamp)
    if number is None:
        return "–"
    return _dt.datetime.fromtimestamp(number, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _table(headers: Iterable[str], rows: Iterable[Iterable[str]], cls: str = "") -> str:
    """Rows are already-escaped <td> strings."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join(f"<tr>{''.join(r)}</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def td(value: Any, cls: str = "", digits: int = 4) -> str:
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    classes = " ".join(c for c in (cls, "num" if numeric else "") if c)
    return f'<td class="{classes}">{esc(fmt(value, digits))}</td>'


def _badge(text: str, cls: str) -> str:
    return f'<span class="badge {esc(cls)}">{esc(text)}</span>'


# -- sections --------------------------------------------------------------

def _header(results: Mapping[str, Any], cells: list[dict]) -> str:
    run = results.get("run") or {}
    tiers = sorted({str(cv.params(c).get("tier")) for c in cells if cv.params(c).get("tier")})
    started, finished = cv.number(run.get("started")), cv.number(run.get("finished"))
    took = f"{finished - started:.0f} s" if started and finished else "–"
    statuses = Counter(c.get("status") for c in cells)
    verdicts = Counter(k.get("verdict") for c in cells for k in c.get("checks") or [])
    argv = " ".join(str(a) for a in run.get("argv") or [])
    env = dict(results.get("env") or {}) or cv.env_of(cells)
    versions = ", ".join(f"{k} {env[k]}" for k in ("torch", "torchvision", "torchtune", "cuda",
                                                    "nccl", "driver", "python") if env.get(k))
    commit = str(env.get("commit") or "")[:12]
    return (f"<h1>perfsuite report</h1><div class='muted'>tier {esc(', '.join(tiers) or '–')}"
            f" &middot; started {esc(_time(started))} &middot; finished {esc(_time(finished))}"
            f" ({esc(took)}) &middot; schema {esc(results.get('schema'))}</div>"
            + f"<p><b>{esc(cv.hardware_label(cells, env).removeprefix('ours: '))}</b>"
            f"<br><span class='muted'>{esc(versions)}"
            f"{' &middot; commit ' if commit else ''}{esc(commit)}"
            f" &middot; fingerprint {esc(_fingerprint(env))}</span></p>"
            + (f"<div class='muted'>argv: <code>{esc(argv)}</code></div>" if argv else "")
            + "<p>cells: " + "".join(_badge(f"{n} {s}", f"s-{s}") for s, n in sorted(
                statuses.items(), key=lambda kv: str(kv[0])))
            + "<br>checks: " + ("".join(_badge(f"{n} {v}", f"v-{v}") for v, n in sorted(
                verdicts.items(), key=lambda kv: str(kv[0]))) or "none") + "</p>")


def _fingerprint(env: Mapping[str, Any]) -> str:
    """The baselines' short hash of hardware and software, to match runs by eye."""
    try:
        from perfsuite.recording import fingerprint
        return fingerprint(env)
    except Exception:  # noqa: BLE001 - the page is still worth having without it
        return "–"


def _env(results: Mapping[str, Any], cells: list[dict]) -> str:
    env = dict(results.get("env") or {}) or cv.env_of(cells)
    rows = []
    for key in sorted(set(env) | {k for c in cells for k in (c.get("env") or {})}):
        others = sorted({fmt((c.get("env") or {}).get(key)) for c in cells
                         if c.get("env") and (c["env"].get(key) != env.get(key))})
        differs = f"cells: {', '.join(others)}" if others else ""
        rows.append([f'<td class="id">{esc(key)}</td>', td(env.get(key)),
                     f'<td class="msg">{esc(differs)}</td>'])
    return "<h2>Environment</h2>" + _table(["key", "run", "differs in"], rows)


def _memory(cell: Mapping[str, Any]) -> tuple[float | None, str]:
    for name, what in (("peak_mem_allocated", "GPU alloc"), ("peak_rss", "RSS")):
        value = cv.metric(cell, name)
        if value is not None:
            return value / 2**20, what
    return None, ""


def _check_summary(cell: Mapping[str, Any]) -> str:
    counts = Counter(k.get("verdict") for k in cell.get("checks") or [])
    return " ".join(_badge(f"{n} {v}", f"v-{v}") for v, n in sorted(counts.items(),
                                                                      key=lambda kv: str(kv[0])))


def _cells_table(cells: list[dict]) -> str:
    rows = []
    for i, cell in enumerate(cells):
        status = str(cell.get("status"))
        step, iqr = cv.metric(cell, "step_time"), cv.metric(cell, "step_time", "iqr")
        accuracy = cv.metric(cell, "accuracy")
        memory, where = _memory(cell)
        thr = cv.metric(cell, "throughput")
        rows.append([
            f'<td class="id"><a href="#cell-{i}">{esc(cell.get("id"))}</a></td>',
            f'<td class="s-{esc(status)}">{esc(status)}</td>',
            td(None if step is None else step * 1e3), td(None if iqr is None else iqr * 1e3),
            td(cv.metric(cell, "step_time", "n")),
            td(thr) if thr is None else f'<td class="num">{esc(fmt(thr))} '
                                        f'{esc(cv.unit(cell, "throughput"))}</td>',
            td(None if accuracy is None else 100 * accuracy),
            td(memory) if memory is None else f'<td class="num">{esc(fmt(memory))} '
                                              f'<span class="muted">{esc(where)}</span></td>',
            td(cv.number(cell.get("duration_s")), digits=3),
            f"<td>{_check_summary(cell)}</td>"])
    return ("<h2>Cells</h2>" + _table(["cell", "status", "step median (ms)", "step IQR (ms)", "n",
                                       "throughput", "accuracy (%)", "peak memory (MiB)",
                                       "wall (s)", "checks"], rows))


def _expected(check: Mapping[str, Any]) -> str:
    expected = check.get("expected")
    tolerance = cv.number(check.get("tolerance"))
    text = fmt(expected)
    if tolerance and expected is not None:
        text += f" ±{tolerance:.0%}"
    return text


def _ratio(check: Mapping[str, Any]) -> str:
    ratio, low, high = (cv.number(check.get(k)) for k in ("ratio", "ci_low", "ci_high"))
    confidence = cv.number(check.get("confidence"))
    interval = (f" [{fmt(low)}, {fmt(high)}]" if low is not None and high is not None else "")
    level = f" {confidence:.0%} CI" if interval and confidence else ""
    return f"{fmt(ratio)}{interval}{level}" if ratio is not None or interval else "–"


def checks_table(checks: list[Mapping[str, Any]], with_cell: bool = False) -> str:
    rows = []
    for check in checks:
        verdict = str(check.get("verdict"))
        unit = check.get("unit") or ""
        rows.append(([f'<td class="id">{esc(check.get("cell"))}</td>'] if with_cell else []) + [
            f'<td class="id">{esc(check.get("name"))}</td>', td(check.get("metric")),
            (f"<td>{esc(_expected(check))}<div class='muted'>"
             f"{esc(check.get('baseline') or '')}</div></td>"),
            f'<td class="num">{esc(fmt(check.get("observed")))} {esc(unit)}</td>',
            f"<td>{esc(_ratio(check))}</td>",
            f'<td class="v-{esc(verdict)}"><b>{esc(verdict)}</b></td>',
            f'<td class="msg">{esc(check.get("message") or "")}</td>'])
    headers = ["check", "metric", "baseline (expected)", "observed", "ratio [interval]",
               "verdict", "message"]
    return _table((["cell"] if with_cell else []) + headers, rows)


def _attention(cells: list[dict]) -> str:
    """Checks that did not pass, first, so a failing run is read from the top."""
    picked = [{**k, "cell": k.get("cell") or c.get("id")} for c in cells
              for k in c.get("checks") or [] if k.get("verdict") in (*BAD, "unknown")]
    broken = [c for c in cells if c.get("status") not in ("ok", "skipped")]
    skipped = sum(k.get("verdict") == "skipped" for c in cells for k in c.get("checks") or [])
    not_made = (f" {skipped} comparison(s) could not be made (skipped, see each cell for why): "
                "nothing was judged there." if skipped else "")
    if not picked and not broken:
        return f"<h2>Attention</h2><p>Every cell ran and no check failed or regressed.{esc(not_made)}</p>"
    out = f"<h2>Attention</h2><p>{esc(not_made)}</p>" if skipped else "<h2>Attention</h2>"
    if broken:
        out += _table(["cell", "status", "reason"], [
            [f'<td class="id">{esc(c.get("id"))}</td>',
             f'<td class="s-{esc(c.get("status"))}">{esc(c.get("status"))}</td>',
             f'<td class="msg">{esc(c.get("reason"))}</td>'] for c in broken])
    return out + (checks_table(picked, with_cell=True) if picked else "")


def _probe(probe: Mapping[str, Any] | None) -> str:
    """The pre-flight probe: figures, trust, and what was compared or not."""
    if not probe:
        return ""
    if probe.get("status") != "ok":
        return f"<h2>Pre-flight probe</h2><p class='muted'>{esc(probe.get('status'))}: {esc(probe.get('reason'))}</p>"
    assessment = probe.get("assessment", {})
    trusted = assessment.get("trusted", True)
    state = _badge("trusted", "pass") if trusted else _badge("NOT TRUSTED: regressions are untrustworthy", "fail")
    rows = [[esc(name), td(m.get("value")), esc(m.get("unit", ""))]
            for name, m in probe.get("metrics", {}).items()]
    notes = "".join(f"<li class='fail'>{esc(f)}</li>" for f in assessment.get("flags", []))
    notes += "".join(f"<li>{esc(n)}</li>" for n in assessment.get("notes", []))
    return (f"<h2>Pre-flight probe</h2><p>{esc(probe.get('id'))}: {state}</p>"
            + _table(["figure", "value", "unit"], rows) + (f"<ul>{notes}</ul>" if notes else ""))


def _figures(figures: list[ReportFigure]) -> str:
    if not figures:
        return "<h2>Figures</h2><p class='muted'>No figure: the run has no ok cell to plot.</p>"
    out = ["<h2>Figures</h2>"]
    for fig in figures:
        if fig.png is not None:
            data = base64.b64encode(fig.png).decode("ascii")
            out.append(f'<figure id="fig-{esc(fig.name)}"><img alt="{esc(fig.title)}" '
                       f'src="data:image/png;base64,{data}"><figcaption><b>{esc(fig.title)}.'
                       f"</b> {esc(fig.caption)}</figcaption></figure>")
        else:
            out.append(f"<figure><figcaption><b>{esc(fig.title)}</b>: could not be drawn"
                       f"</figcaption><pre>{esc(fig.error)}</pre></figure>")
    return "".join(out)


def _profile(profile: Mapping[str, Any]) -> str:
    steps = profile.get("steps")
    window = cv.number(profile.get("window_s"))
    head = (f"<div class='muted'>profile from {esc(profile.get('source'))}"
            f"{', ' + esc(steps) + ' steps' if steps else ''}"
            f"{', window ' + esc(fmt(window)) + ' s' if window else ''}"
            f"{', ' + esc(len(profile.get('ranks') or [])) + ' ranks merged' if profile.get('ranks') else ''}"
            "</div>")
    metrics = [[f'<td class="id">{esc(name)}</td>', td(m.get("total_s")), td(m.get("calls")),
                td(100 * (cv.number(m.get("share_of_category")) or 0.0), digits=3),
                td(cv.number(m.get("percent_of_selected")), digits=3)]
               for name, m in (profile.get("paper_metrics") or {}).items() if m.get("present")]
    rows = sorted(profile.get("rows") or [], key=lambda r: -(cv.number(r.get("total_s")) or 0))
    top = [[td(r.get("category")), f'<td class="id">{esc(str(r.get("name"))[:100])}</td>',
            td(r.get("total_s")), td(r.get("calls")), td(r.get("avg_s")),
            td(100 * (cv.number(r.get("share")) or 0.0), digits=3)] for r in rows[:PROFILE_ROWS]]
    out = head
    if metrics:
        out += _table(["Table 1 metric", "total (s)", "calls", "share of category (%)",
                       "of selected (%)"], metrics)
    if top:
        out += (f"<div class='muted'>top {len(top)} of {len(rows)} rows</div>"
                + _table(["category", "name", "total (s)", "calls", "avg (s)",
                          "share of category (%)"], top))
    return out


def _attribution(deltas: list[Mapping[str, Any]]) -> str:
    rows = [[td(d.get("category")), f'<td class="id">{esc(str(d.get("name"))[:100])}</td>',
             td(d.get("baseline_s")), td(d.get("current_s")), td(d.get("delta_s")),
             td(None if cv.number(d.get("relative")) is None else 100 * d["relative"], digits=3),
             td(d.get("status"))] for d in deltas]
    return ("<div class='muted'>what moved against the baseline profile (per step when both "
            "know their step count)</div>"
            + _table(["category", "name", "baseline (s)", "current (s)", "delta (s)",
                      "relative (%)", "status"], rows))


def _counters(counted: Mapping[str, Any]) -> str:
    """A cell's work counters per step (summed over its ranks)."""
    from perfsuite.counters import headline

    unstable = counted.get("unstable") or []
    note = (f"per training step, summed over {counted.get('ranks', 1)} rank(s), counted over "
            f"{counted.get('window_steps')} steps after the timed ones"
            + (f"; unstable, not judged: {', '.join(unstable)}" if unstable else ""))
    return (f"<div class='muted'>work counters {esc(note)}</div>"
            + _table(["counter", "per step"], [[f"<td>{esc(k)}</td>", f'<td class="num">{esc(v)}</td>']
                                              for k, v in headline(counted["per_step"])]))


def _cell_details(cells: list[dict]) -> str:
    out = ["<h2>Cells in detail</h2>"]
    for i, cell in enumerate(cells):
        if cell.get("status") == "skipped":
            continue
        status = str(cell.get("status"))
        sources = "; ".join(str(s) for s in cv.params(cell).get("sources") or [])
        out.append(f'<section id="cell-{i}"><h3>{esc(cell.get("id"))} '
                   f'<span class="badge s-{esc(status)}">{esc(status)}</span></h3>'
                   + (f"<div class='muted'>from: {esc(sources)}</div>" if sources else "")
                   + (f"<p>{esc(cell.get('reason'))}</p>" if cell.get("reason") else ""))
        if cell.get("checks"):
            out.append(checks_table(cell["checks"]))
        if (cell.get("counters") or {}).get("per_step"):
            out.append(_counters(cell["counters"]))
        if isinstance(cell.get("profile"), Mapping):
            out.append(_profile(cell["profile"]))
        if cell.get("attribution"):
            out.append(_attribution(list(cell["attribution"])))
        if cell.get("output_tail"):
            tail = "\n".join(str(cell["output_tail"]).splitlines()[-OUTPUT_TAIL_LINES:])
            out.append(f"<div class='muted'>last lines of output.log</div><pre>{esc(tail)}</pre>")
        out.append("</section>")
    return "".join(out)


def _skipped(cells: list[dict]) -> str:
    skipped = [c for c in cells if c.get("status") == "skipped"]
    if not skipped:
        return ""
    return "<h2>Skipped cells</h2>" + _table(["cell", "reason"], [
        [f'<td class="id" id="cell-{cells.index(c)}">{esc(c.get("id"))}</td>',
         f'<td class="msg">{esc(c.get("reason"))}</td>'] for c in skipped])


def render_html(results: Mapping[str, Any], figures: list[ReportFigure] | None = None) -> str:
    """The page as a string; figures are drawn here unless given."""
    cells = list(results.get("cells") or [])
    if figures is None:
        from perfsuite.report.figures import render_figures

        figures = render_figures(cells)
    body = "".join([_header(results, cells), _attention(cells), _probe(results.get("probe")),
                    _cells_table(cells),
                    _figures(figures), _cell_details(cells), _skipped(cells),
                    _env(results, cells)])
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width,initial-scale=1'>"
            f"<title>perfsuite report</title><style>{CSS}</style></head><body>{body}"
            "</body></html>\n")


def write_html_report(results: Mapping[str, Any], out_path: Path | str,
                      figures: list[ReportFigure] | None = None) -> Path:
    """Write the run's report page (written whole, then renamed into place)."""
    out_path = Path(out_path)
    atomic_write_text(out_path, render_html(results, figures))
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
