"""The A/B session's figures and report section (ab.png, ab-attribution.png, ab.html).

The figure puts every launch's value at the time it ran, A and B in two
colours: a machine that drifted moves both sides' points alike, a change
separates them at every time. A cell with an attribution (both sides
profiled after the timing: perfsuite.ab.attributing) gets a table of its
top rows, and a panel of ab-attribution.png with its largest contributors
as bars, B's slower rows to the right and its faster ones to the left.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from perfsuite.report.formatting import esc, td
from perfsuite.report.html import CSS
from perfsuite.report.plotting import legend, new_figure, png_bytes
from perfsuite.system.atomic import atomic_write_bytes, atomic_write_text

SIDE_COLOURS = {"A": "#1f77b4", "B": "#d62728"}
SIDE_MARKERS = {"A": "o", "B": "s"}
ATTRIBUTION_PNG = "ab-attribution.png"
TABLE_ROWS, BARS = 10, 8  # an attribution's rows in its table, and as bars in its panel


def ab_figure_png(ab: Mapping[str, Any]) -> bytes | None:
    """Launch values over wall-clock minutes, one panel per cell (None: nothing measured)."""
    cells = [c for c in ab.get("cells", []) if any(x["value"] is not None for x in c["launches"])]
    if not cells:
        return None
    start = min(x["started"] for c in cells for x in c["launches"])
    statistic = ab.get("settings", {}).get("launch_statistic", "")
    fig, axes = new_figure(len(cells), 5.0, 3.4)
    for ax, cell in zip(axes, cells):
        for side, colour in SIDE_COLOURS.items():
            points = [x for x in cell["launches"] if x["side"] == side and x["value"] is not None]
            ax.plot([(x["started"] - start) / 60 for x in points],
                    [x["value"] * 1e3 for x in points], SIDE_MARKERS[side], color=colour,
                    label=side, linestyle="none")
        ratio = f", ratio {cell['ratio']:.3g}" if cell.get("ratio") is not None else ""
        ax.set_title(f"{cell['id']}\n{cell['verdict']}{ratio}", fontsize=8.5)
        ax.set_xlabel("minutes since the first launch")
        ax.set_ylabel(f"launch {statistic} (ms)")
        legend(ax, loc="best")
    return png_bytes(fig)


def _attributed(ab: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [c for c in ab.get("cells", []) if (c.get("attribution") or {}).get("top")]


def _row_label(row: Mapping[str, Any], width: int = 60) -> str:
    tag = {"appeared": " (appeared)", "vanished": " (vanished)", "capped": " (at least)"}.get(row.get("status"), "")
    text = f"{row['level']}: {row['name']}{tag}"
    return text if len(text) <= width else text[:width - 1] + "…"


def attribution_figure_png(ab: Mapping[str, Any]) -> bytes | None:
    """The largest contributors of each attributed cell's step-time change,
    in ms a step, both signs (None: no cell has a listed row)."""
    cells = _attributed(ab)
    if not cells:
        return None
    fig, axes = new_figure(len(cells), 6.5, 3.6, max_per_row=2)
    for ax, cell in zip(axes, cells):
        found = cell["attribution"]
        rows = found["top"][:BARS]
        deltas = [row["delta_s"] * 1e3 for row in rows]
        ax.barh(range(len(rows)), deltas, height=0.6,
                color=[SIDE_COLOURS["B"] if d > 0 else SIDE_COLOURS["A"] for d in deltas])
        ax.set_ylim(max(len(rows), 4) - 0.5, -0.5)  # the largest at the top; one row stays a bar, not a block
        ax.set_yticks(range(len(rows)), [_row_label(row, 48) for row in rows], fontsize=7)
        ax.axvline(0, color="#555555", linewidth=0.8)
        explained = found.get("explained")
        share = f", explained {100 * explained:.0f} %" if explained is not None else ""
        ax.set_title(f"{cell['id']}\nchange {found['change_s'] * 1e3:+.2f} ms a step{share}", fontsize=8.5)
        ax.set_xlabel("B - A (ms a step; > 0: B slower)")
    return png_bytes(fig)


def _ms(seconds: Any) -> str:
    return f"{seconds * 1e3:+.3f}" if isinstance(seconds, (int, float)) else "?"


def _table_row(row: Mapping[str, Any]) -> str:
    name = esc(_row_label(row, 120).split(": ", 1)[1])
    share = "-" if row.get("share") is None else f"{100 * row['share']:.0f} %"
    return (f"<tr><td>{esc(row['level'])}</td><td><code>{name}</code></td>{td(row['a_s'] * 1e3)}"
            f'{td(row["b_s"] * 1e3)}<td class="num">{_ms(row["delta_s"])}</td><td class="num">{share}</td>'
            f"<td>{row['a_calls']:g} → {row['b_calls']:g}</td></tr>")


def _attribution(cell: Mapping[str, Any]) -> str:
    """An attributed cell's table of its top rows (or why it has none)."""
    found = cell.get("attribution")
    if not found:
        return ""
    profiled = found.get("profiled") or {}
    steps = f" of {profiled['steps']} steps" if profiled.get("steps") else ""
    how = (f"Profiled: one {esc(profiled.get('how'))} a side{steps} after the judged ones, "
           f"{profiled.get('wall_s') or 0:.1f} s.") if profiled else ""
    if found.get("error"):
        return f'<p class="muted">attribution: not made ({esc(found["error"])}); the verdict stands. {how}</p>'
    rows = "".join(_table_row(row) for row in found.get("top", [])[:TABLE_ROWS])
    levels = ", ".join(f"{esc(name)} {100 * level['explained']:.0f} %" for name, level in found["levels"].items()
                       if level.get("explained") is not None)
    head = (f"<p>Where the step time went: measured change {_ms(found['change_s'])} ms a step; profiled steps "
            f"{found['a_step_s'] * 1e3:.2f} → {found['b_step_s'] * 1e3:.2f} ms, noise {found['noise_s'] * 1e3:.2f} ms"
            f"; explained per level: {levels or '-'}.</p>")
    if not rows:
        return head + f'<p class="muted">No row changed by more than the noise. {how}</p>'
    return (head + '<table class="attribution"><thead><tr><th>level</th><th>row</th><th>A ms/step</th>'
            "<th>B ms/step</th><th>change ms</th><th>share</th><th>calls/step A → B</th></tr></thead>"
            f'<tbody>{rows}</tbody></table><p class="muted">{how}</p>')


def _side(side: Mapping[str, Any]) -> str:
    origin = (f"{esc(side['ref'])} ({esc((side.get('commit') or '')[:12])}), " if side.get("ref")
              else "")
    env = " ".join(f"{k}={v}" for k, v in (side.get("env") or {}).items())
    return (f"<li><b>{esc(side['name'])}</b>: {origin}<code>{esc(side['python'])}</code>"
            f" torch {esc(side.get('torch') or '?')}"
            + (f", env <code>{esc(env)}</code>" if env else "")
            + (f", set up in {side['setup_s']:.1f} s" if side.get("setup_s") is not None else "")
            + "</li>")


def _gb(value: Any) -> str:
    return f"{value / 1e9:.1f} GB" if isinstance(value, (int, float)) else "?"


def _cell(cell: Mapping[str, Any]) -> str:
    verdict = cell["verdict"] or "interrupted"
    rows = [f'<tr><th>verdict</th><td class="v-{esc(verdict)}">{esc(verdict)}</td></tr>',
            f"<tr><th>ratio B/A</th>{td(cell.get('ratio'))}</tr>",
            f"<tr><th>95 % interval</th>{td(cell.get('ci_low'))}{td(cell.get('ci_high'))}</tr>",
            f"<tr><th>launches A, B</th>{td(cell['n_a'])}{td(cell['n_b'])}</tr>"]
    if cell.get("detectable") is not None:  # the interval's half-width: what its scatter resolved
        rows.append(f"<tr><th>smallest detectable change</th><td>{cell['detectable'] * 100:.2f} %</td></tr>")
    memory = cell.get("memory")
    if memory:  # how a CUDA cell's two resident sides shared its GPU
        rows.append(f"<tr><th>memory plan</th><td>{esc(memory.get('plan'))}: peak reserved "
                    f"{_gb(memory.get('peak_reserved'))} a side of {_gb(memory.get('device_total'))} "
                    f"({esc(memory.get('source'))}); {esc(memory.get('reason'))}</td></tr>")
    notes = [cell["reason"]] if cell.get("reason") else []
    notes += [f"{c['name']} {c['verdict']}: {c.get('message', '')}" for c in cell.get("checks", [])
              if c["verdict"] not in ("same", "pass", "skipped")]
    return (f"<h3>{esc(cell['id'])}</h3><table><tbody>{''.join(rows)}</tbody></table>"
            + "".join(f'<p class="muted">{esc(n)}</p>' for n in notes) + _attribution(cell))


def ab_section_html(ab: Mapping[str, Any], png_name: str, attribution_png: str = "") -> str:
    """The A/B section of a report: the sides, a small table per cell (and
    its attribution), the figures (``png_name``, ``attribution_png``, beside
    the page; empty: no such figure)."""
    settings = ab.get("settings", {})
    sides = "".join(_side(s) for s in settings.get("sides", {}).values())
    intro = (f"<p class='muted'>Launches in ABBA rounds, judged by each launch's "
             f"{esc(settings.get('launch_statistic'))} at ±{settings.get('tolerance', 0):.0%} "
             f"after every round; at most {esc(settings.get('max_launches'))} a side.</p>")
    figure = png_name and (f'<figure><img alt="launch values over time" src="{esc(png_name)}"><figcaption>'
              "Each launch's value at the time it ran: drift moves A and B alike, a change "
              "separates them.</figcaption></figure>")
    bars = attribution_png and (
        f'<figure><img alt="largest contributors to each cell\'s step-time change" src="{esc(attribution_png)}">'
        "<figcaption>Where each profiled cell's step time went: the rows of both sides' profiles that changed "
        "most, in ms a step, B's slower ones to the right.</figcaption></figure>")
    return ("<h2>A/B</h2>" + intro + f"<ul>{sides}</ul>"
            + "".join(_cell(c) for c in ab.get("cells", [])) + figure + bars)


def write_ab_reports(ab: Mapping[str, Any], out_dir: Path | str) -> dict[str, Path]:
    """ab.png (when a launch was measured) and ab.html beside ab.json."""
    out_dir = Path(out_dir)
    written = {}
    png = ab_figure_png(ab)
    if png is not None:
        written["ab.png"] = out_dir / "ab.png"
        atomic_write_bytes(written["ab.png"], png)
    bars = attribution_figure_png(ab)
    if bars is not None:
        written[ATTRIBUTION_PNG] = out_dir / ATTRIBUTION_PNG
        atomic_write_bytes(written[ATTRIBUTION_PNG], bars)
    written["ab.html"] = out_dir / "ab.html"
    section = ab_section_html(ab, "ab.png" if png else "", ATTRIBUTION_PNG if bars else "")
    atomic_write_text(written["ab.html"], (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>perfsuite A/B</title>"
        f"<style>{CSS}</style></head><body>{section}</body></html>\n"))
    return written
