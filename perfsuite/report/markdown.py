"""A run's verdicts in Markdown, for a CI job's summary page
(``perfsuite report RUN --summary-md "$GITHUB_STEP_SUMMARY"``).

The same reading as report.html's top: the headline of what needs attention
(report/page_checks.attention), the cells that did not run, the checks that
did not pass with their ratios and intervals, each step-time check in the
pull-request comment's layout (report/pr_comment.py), then every cell in a
folded table. GitHub renders job summaries as GitHub-flavoured Markdown with HTML:
every value from the run is escaped, and a summary is cut at 1 MiB, so the
tables are capped.
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Mapping
from typing import Any

from perfsuite.report import cellview as cv
from perfsuite.report import error_rates as rates_table
from perfsuite.report.formatting import quantity
from perfsuite.report.page_checks import BAD, GOOD, attention
from perfsuite.report.pr_comment import gate_table
from perfsuite.report.terminal import probe_lines

MAX_ROWS = 200  # per table: a full-tier run has 106 cells, and a check row is ~300 bytes
MAX_TEXT = 300  # characters of one message
LEVEL_MARK = {"ok": "✅", "warn": "⚠️", "bad": "❌"}


def _text(value: Any) -> str:
    """One table cell: escaped, on one line, pipes kept from splitting the row."""
    text = " ".join(str("" if value is None else value).split())
    if len(text) > MAX_TEXT:
        text = text[:MAX_TEXT - 1] + "…"
    return html.escape(text, quote=False).replace("|", "\\|")


def _table(header: list[str], rows: list[list[Any]], what: str) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_text(v) for v in row) + " |" for row in rows[:MAX_ROWS]]
    if len(rows) > MAX_ROWS:
        lines.append(f"\n{len(rows) - MAX_ROWS} more {what}: see report.html")
    return lines


def _step(cell: Mapping[str, Any]) -> str:
    value = cv.metric(cell, "step_time")
    return quantity(value, "s") if value is not None else "–"


def _checks(cell: Mapping[str, Any]) -> str:
    """"12 pass, 1 regressed, 2 skipped"."""
    counts = Counter(str(k.get("verdict")) for k in cell.get("checks") or [])
    order = [*GOOD, *BAD, "unknown", "untrustworthy", "skipped"]
    ranked = sorted(counts.items(), key=lambda item: (order.index(item[0]) if item[0] in order else len(order)))
    return ", ".join(f"{n} {verdict}" for verdict, n in ranked) or "none"


def summary_markdown(run: Mapping[str, Any], title: str, *, error_rates: Mapping[str, Any] | None = None,
                     artifacts_url: str | None = None) -> str:
    """The Markdown of one run (a loaded results.json); ``title`` names it."""
    cells = list(run.get("cells") or [])
    seen = attention(cells)
    status = Counter(str(c.get("status")) for c in cells)
    verdicts = Counter(str(k.get("verdict")) for c in cells for k in c.get("checks") or [])
    lines = [f"## perfsuite: {_text(title)}", "",
             f"{LEVEL_MARK.get(seen['level'], '')} **{_text(seen['headline'])}**", "",
             f"{len(cells)} cell(s): " + ", ".join(f"{n} {s}" for s, n in status.most_common())
             + f"; {sum(verdicts.values())} check(s): "
             + ", ".join(f"{n} {v}" for v, n in verdicts.most_common()), ""]
    notes = [*seen["notes"], *probe_lines(run.get("probe"))[:1]]
    lines += [f"- {_text(note)}" for note in notes]
    if notes:
        lines.append("")
    if seen["broken"]:
        lines += ["### Cells that did not run to the end", ""]
        lines += _table(["cell", "status", "reason"],
                        [[c["id"], c["status"], c.get("reason")] for c in seen["broken"]], "cells")
        lines.append("")
    if seen["checks"]:
        lines += ["### Checks that failed, regressed or could not decide", ""]
        lines += _table(["cell", "check", "verdict", "observed", "expected", "ratio [CI]", "message"],
                        [[k["cell"], k["name"], k["verdict"].upper(), k["observed"], k["expected"],
                          k["ratio"], k["message"]] for k in seen["checks"]], "checks")
        lines.append("")
    step_time = gate_table(run, error_rates=error_rates, artifacts_url=artifacts_url)
    lines += [*step_time, ""] if step_time else []
    lines += [f"<details><summary>All {len(cells)} cells</summary>", ""]
    lines += _table(["cell", "status", "step time (median)", "checks"],
                    [[c.get("id"), c.get("status"), _step(c), _checks(c)] for c in cells], "cells")
    lines += ["", "</details>", ""]
    if error_rates:  # the runner's own: what a verdict here can be trusted to tell
        lines += [f"### {rates_table.TITLE}", "", _text(rates_table.caption(error_rates)), ""]
        lines += [*_table(rates_table.HEADER, rates_table.rows(error_rates), "cells"), ""]
    return "\n".join(lines)
