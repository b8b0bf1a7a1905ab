"""Verdicts a pull request can act on: one Markdown comment per pull
request, the same from an A/B session (ab.json) and from a run against the
baselines (results.json's step-time checks).

A table, one row a cell: its verdict, the ratio and its interval, the
smallest change its scatter could resolve on this runner (``detectable``),
the top rows of its profile's attribution where there is one, and the
runner's published error rates where given (``perfsuite selftest
error-rates``'s file); then one command a cell that measures it again on
one's own machine, with the options the session used, and the artifacts'
link. The first line is a hidden marker, so that a workflow finds its own
comment and edits it in place (.ci/perfsuite-action comment).
"""

from __future__ import annotations

import html
import math
import shlex
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from perfsuite.options import DEFAULT_LAUNCH_STATISTIC, DEFAULT_MAX_PAIRS, DEFAULT_QUADS, DEFAULT_WINDOW_STEPS
from perfsuite.report import error_rates as rates_table
from perfsuite.stats.samples import DEFAULT_CONFIDENCE
from perfsuite.stats.windows import detectable_change

AB_MARKER = "<!-- perfsuite-ab -->"  # .ci/perfsuite-action finds the comment by it
AB_MAX_LAUNCHES, AB_ATTRIBUTE = 12, "changed"  # perfsuite ab's --max-launches and --attribute defaults
SAFE_PATH = "PYTHONSAFEPATH"  # every side's launches get it: not an option given
# Step-time checks: image cells' step time, LLM cells' time per token.
STEP_METRICS = ("step_time", "time_per_token")
MAX_ROWS = 60  # a comment is cut at 65536 characters; a row and its line to measure it again ~600
MAX_TEXT = 300  # characters of one message
TOP_ROWS = 3  # attribution rows a cell shows
MARKS = {"regressed": "❌", "error": "❌", "fail": "❌", "unknown": "⚠️", "interrupted": "⚠️",
         "untrustworthy": "⚠️", "same": "✅", "pass": "✅", "improved": "✅", "skipped": "⏭️"}


@dataclass
class Row:
    """One cell's line of the table."""

    cell: str
    verdict: str
    ratio: float | None
    ci_low: float | None
    ci_high: float | None
    confidence: float | None
    detectable: float | None
    repro: str
    attribution: Mapping[str, Any] | None = None
    reason: str | None = None
    accepted: Mapping[str, Any] | None = None  # perfsuite.judge.accepted's judgement of an accepted change


def text(value: Any) -> str:
    """One table cell: escaped, on one line, pipes kept from splitting the row."""
    said = " ".join(str("" if value is None else value).split())
    said = said if len(said) <= MAX_TEXT else said[:MAX_TEXT - 1] + "…"
    return html.escape(said, quote=False).replace("|", "\\|")


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def error_rate_text(rates: Mapping[str, Any] | None) -> str:
    """"0/40 false calls; detects 1.2 %; 2.4 min a verdict", or "–" where not measured."""
    if not rates:
        return "–"
    parts = []
    if rates.get("sessions") is not None:
        parts.append(f"{rates.get('false_calls', 0)}/{rates['sessions']} false calls")
    if _number(rates.get("detectable")) is not None:
        parts.append(f"detects {rates['detectable'] * 100:.1f} %")
    if _number(rates.get("minutes_per_verdict")) is not None:
        parts.append(f"{rates['minutes_per_verdict']:.1f} min a verdict")
    return "; ".join(parts) or "–"


# ------------------------------------------------------------- attribution
def _ms(seconds: Any) -> str:
    value = _number(seconds)
    return "–" if value is None else f"{value * 1e3:+.2f} ms"


def _share(value: Any) -> str:
    return "" if _number(value) is None else f" ({value * 100:.0f} %)"


def attribution_rows(data: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    """The attribution's rows, largest change first (its ``top``, else every level's)."""
    if not data:
        return []
    rows = list(data.get("top") or [])
    if not rows:
        rows = [row for level in (data.get("levels") or {}).values() for row in level.get("rows") or []]
    return sorted(rows, key=lambda r: -abs(_number(r.get("delta_s")) or 0.0))


def attribution_cell(data: Mapping[str, Any] | None, top: int = 2) -> str:
    """The table's cell: the largest rows, "`aten::mm` +1.20 ms (40 %)"."""
    if data and data.get("error"):
        return f"not attributed: {data['error']}"
    rows = attribution_rows(data)[:top]
    if not rows:
        return "no row above the noise" if data else "–"
    return "; ".join(f"{row.get('level')} `{row.get('name')}` {_ms(row.get('delta_s'))}{_share(row.get('share'))}"
                     for row in rows)


def attribution_block(data: Mapping[str, Any], top: int = TOP_ROWS) -> str:
    """The attribution's table: profiling's own rendering where the record can
    be read back into an Attribution, else its rows as they are."""
    from perfsuite.profiling import attribution as attr

    from_dict = getattr(attr.Attribution, "from_dict", None)
    if from_dict is not None:
        try:
            return attr.markdown_attribution(from_dict(data), top=top)
        except (AttributeError, KeyError, TypeError, ValueError):
            pass  # a record of another version: its rows below
    lines = [f"Measured change {_ms(data.get('change_s'))} a step, noise {_ms(data.get('noise_s'))}.", ""]
    if not attribution_rows(data):
        return "\n".join([*lines, "No row changed by more than the noise."])
    lines += ["| level | row | A ms/step | B ms/step | change | share |", "|---|---|---:|---:|---:|---:|"]
    for row in attribution_rows(data)[:top]:
        a_s, b_s = _number(row.get("a_s")), _number(row.get("b_s"))
        lines.append(f"| {text(row.get('level'))} | `{text(row.get('name'))}` | "
                     f"{'–' if a_s is None else f'{a_s * 1e3:.3f}'} | {'–' if b_s is None else f'{b_s * 1e3:.3f}'} | "
                     f"{_ms(row.get('delta_s'))} | {_share(row.get('share')).strip(' ()') or '–'} |")
    return "\n".join(lines)


# ------------------------------------------------------------------- table
def verdict_table(rows: list[Row], ratio_label: str,
                  error_rates: Mapping[str, Any] | None = None) -> list[str]:
    """The table, the attributions folded under it, and the commands that
    measure each cell again."""
    header = ["cell", "verdict", ratio_label, "interval", "detectable", "where the time went"]
    if error_rates is not None:
        header.append("this runner's error rates")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    rates = (error_rates or {}).get("cells") or {}
    for row in rows[:MAX_ROWS]:
        ratio = _number(row.ratio)
        low, high = _number(row.ci_low), _number(row.ci_high)
        confidence = row.confidence or DEFAULT_CONFIDENCE
        interval = ("–" if low is None else
                    f"{low:.4g}–{'∞' if high is None else f'{high:.4g}'} ({confidence * 100:.0f} %)")
        detectable = row.detectable if row.detectable is not None else detectable_change(low, high)
        verdict = f"{MARKS.get(row.verdict, '')} {text(row.verdict)}".strip()
        if row.accepted:
            verdict = f"{'✅' if row.accepted.get('within') else '❌'} {text(row.verdict)}, accepted on purpose"
        cells = [f"`{text(row.cell)}`", verdict,
                 "–" if ratio is None else f"{ratio:.4g}", interval,
                 "–" if detectable is None else f"{detectable * 100:.2f} %", text(attribution_cell(row.attribution))]
        if error_rates is not None:
            cells.append(text(error_rate_text(rates.get(row.cell))))
        lines.append("| " + " | ".join(cells) + " |")
    if len(rows) > MAX_ROWS:
        lines += ["", f"{len(rows) - MAX_ROWS} more cells: see the artifacts"]
    said = [(row.cell, (row.accepted or {}).get("line") or row.reason) for row in rows[:MAX_ROWS]
            if row.accepted or (row.reason and row.verdict not in ("same", "improved"))]
    if said:
        lines.append("")
        lines += [f"- `{text(cell)}`: {text(reason)}" for cell, reason in said]
    for row in rows[:MAX_ROWS]:
        if row.attribution and not row.attribution.get("error"):
            lines += ["", f"<details><summary>{text(row.cell)}: where the step-time change went</summary>", "",
                      attribution_block(row.attribution), "", "</details>"]
    lines += ["", "Measure a cell again on your machine:", "", "```sh"]
    lines += [row.repro for row in rows[:MAX_ROWS]]
    lines.append("```")
    return lines


def _counts(rows: list[Row]) -> str:
    return ", ".join(f"{n} {verdict}" for verdict, n in Counter(r.verdict for r in rows).most_common()) or "no cell"


def _footer(artifacts_url: str | None, error_rates: Mapping[str, Any] | None, what: str) -> list[str]:
    lines = []
    if error_rates is not None:
        lines += ["", f"This runner's error rates, from `perfsuite selftest error-rates`: "
                      f"{text(rates_table.caption(error_rates))}"]
    if artifacts_url:
        lines += ["", f"Artifacts ({what}): {artifacts_url}"]
    return lines


# ---------------------------------------------------------------------- A/B
def ab_repro(data: Mapping[str, Any], cell_id: str) -> str:
    """The ``perfsuite ab`` command line that measures ``cell_id`` as the
    session did: its sides (commits, interpreters where they differ, their
    own environment and workload options) and its settings where they are not
    ab's defaults (the tolerance always)."""
    settings = data.get("settings") or {}
    sides = settings.get("sides") or {}
    words = ["perfsuite", "ab", cell_id]
    pythons = {(side or {}).get("python") for side in sides.values()}
    for name in "AB":
        side, flag = sides.get(name) or {}, name.lower()
        if side.get("ref"):
            words += [f"--{flag}-ref", side.get("commit") or side["ref"]]
        elif len(pythons) > 1 and side.get("python"):
            words += [f"--{flag}-python", side["python"]]
        words += [w for k, v in (side.get("env") or {}).items() if (k, v) != (SAFE_PATH, "1")
                  for w in (f"--{flag}-env", f"{k}={v}")]
        words += [w for k, v in (side.get("workload_options") or {}).items() for w in (f"--{flag}-option", f"{k}={v}")]
    words += ["--tolerance", f"{settings.get('tolerance', 0.05):g}"]
    resident = settings.get("resident") or {}
    for flag, value, default in (
            ("--launch-statistic", settings.get("launch_statistic"), DEFAULT_LAUNCH_STATISTIC),
            ("--max-launches", settings.get("max_launches"), AB_MAX_LAUNCHES),
            ("--attribute", settings.get("attribute"), AB_ATTRIBUTE),
            ("--mode", settings.get("mode"), "auto"),
            ("--window-steps", resident.get("window_steps"), DEFAULT_WINDOW_STEPS),
            ("--quads", resident.get("quads_per_pair"), DEFAULT_QUADS),
            ("--max-pairs", resident.get("max_pairs"), DEFAULT_MAX_PAIRS)):
        if value is not None and value != default:
            words += [flag, str(value)]
    words += launch_words(settings.get("launch") or {})
    return shlex.join(words)


def launch_words(launch: Mapping[str, Any]) -> list[str]:
    """The launching group's options of a session's ``launch`` settings."""
    words: list[str] = []
    if launch.get("data_dir"):
        words += ["--data-dir", str(launch["data_dir"])]
    words += [w for k, v in (launch.get("options") or {}).items() for w in ("--option", f"{k}={v}")]
    if launch.get("timeout_s") is not None:
        words += ["--timeout", f"{launch['timeout_s']:g}"]
    for key, flag in (("profiler", "--profiler"), ("rank_start", "--rank-start")):
        if launch.get(key):
            words += [flag, str(launch[key])]
    if launch.get("gpus"):
        words += ["--gpus", ",".join(str(g) for g in launch["gpus"])]
    if launch.get("slurm"):
        words.append("--slurm")
    elif (launch.get("nnodes") or 1) > 1:
        words += ["--nnodes", str(launch["nnodes"])]
    return words


def ab_rows(data: Mapping[str, Any]) -> list[Row]:
    return [Row(cell=record["id"], verdict=str(record.get("verdict") or "not judged"),
                ratio=record.get("ratio"), ci_low=record.get("ci_low"), ci_high=record.get("ci_high"),
                confidence=record.get("confidence"), detectable=record.get("detectable"),
                repro=ab_repro(data, record["id"]), attribution=record.get("attribution"),
                reason=record.get("reason"), accepted=record.get("accepted"))
            for record in data.get("cells") or []]


def _side(side: Mapping[str, Any] | None) -> str:
    side = side or {}
    if side.get("ref"):
        return f"{side['ref']} ({str(side.get('commit') or '')[:12]})".replace(" ()", "")
    options = " ".join(f"{k}={v}" for k, v in (side.get("workload_options") or {}).items())
    return f"{side.get('python') or 'this interpreter'}" + (f" with {options}" if options else "")


def ab_comment(data: Mapping[str, Any], *, error_rates: Mapping[str, Any] | None = None,
               artifacts_url: str | None = None) -> str:
    """The comment of an A/B session (a loaded ab.json)."""
    settings = data.get("settings") or {}
    sides = settings.get("sides") or {}
    rows = ab_rows(data)
    state = " (interrupted: what was measured until then)" if data.get("interrupted") else ""
    lines = [AB_MARKER, "## perfsuite ab: B against A on this runner", "",
             f"**{_counts(rows)}**{state}; ratio B/A of step time (> 1: B slower), a change within "
             f"±{settings.get('tolerance', 0.05):.0%} is the same.", "",
             f"A: {text(_side(sides.get('A')))}  ", f"B: {text(_side(sides.get('B')))}", ""]
    lines += verdict_table(rows, "ratio B/A", error_rates)
    others = [(record["id"], check) for record in data.get("cells") or [] for check in record.get("checks") or []
              if check.get("verdict") not in ("same", "pass", "skipped")]
    if others:
        lines += ["", "Other checks, B against A:", ""]
        lines += [f"- `{text(cell)}` {text(check.get('name'))} {text(str(check.get('verdict')).upper())}: "
                  f"{text(check.get('message'))}" for cell, check in others]
    return "\n".join([*lines, *_footer(artifacts_url, error_rates, "ab.json, the reports, every launch"), ""])


# ---------------------------------------------------------------- the gate
def step_checks(cell: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [k for k in cell.get("checks") or [] if k.get("name") in STEP_METRICS or k.get("metric") in STEP_METRICS]


def run_repro(cell: Mapping[str, Any]) -> str:
    """The ``perfsuite run`` command line that measures ``cell`` again: its
    workload options and data folder as its launch was given them, its repeats."""
    words = ["perfsuite", "run", str(cell.get("id"))]
    argv = [str(a) for a in cell.get("argv") or []]
    for i, word in enumerate(argv[:-1]):
        if word in ("--option", "--data-dir") and not (word == "--option" and argv[i + 1].startswith("count_steps=")):
            words += [word, argv[i + 1]]
    if (cell.get("repeats") or 1) > 1:
        words += ["--repeats", str(cell["repeats"])]
    return shlex.join(words)


def gate_rows(run: Mapping[str, Any]) -> list[Row]:
    """A row per step-time check of a run (results.json), against its baseline."""
    rows = []
    for cell in run.get("cells") or []:
        for check in step_checks(cell):
            found = check.get("attribution") or cell.get("attribution")
            found = found.get("record", found) if isinstance(found, Mapping) else None  # a check's: with its context
            rows.append(Row(cell=str(cell.get("id")), verdict=str(check.get("verdict")), ratio=check.get("ratio"),
                            ci_low=check.get("ci_low"), ci_high=check.get("ci_high"),
                            confidence=check.get("confidence"), detectable=check.get("detectable"),
                            repro=run_repro(cell), attribution=found,
                            reason=check.get("message") if check.get("verdict") not in ("same", "improved") else None,
                            accepted=check.get("accepted")))
    return rows


def gate_table(run: Mapping[str, Any], *, error_rates: Mapping[str, Any] | None = None,
               artifacts_url: str | None = None) -> list[str]:
    """The step-time table of a run against its baselines (the job summary's, report/markdown.py)."""
    rows = gate_rows(run)
    if not rows:
        return []
    lines = ["### Step time against the baselines", "",
             f"**{_counts(rows)}**; ratio of this run to its baseline (> 1: slower).", ""]
    return [*lines, *verdict_table(rows, "ratio / baseline", error_rates),
            *_footer(artifacts_url, error_rates, "results.json, the reports, every cell's folder")]
