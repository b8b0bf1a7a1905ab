"""The A/B session's figure and report section (ab.png, ab.html).

The figure puts every launch's value at the time it ran, A and B in two
colours: a machine that drifted moves both sides' points alike, a change
separates them at every time.
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
            + "".join(f'<p class="muted">{esc(n)}</p>' for n in notes))


def ab_section_html(ab: Mapping[str, Any], png_name: str) -> str:
    """The A/B section of a report: the sides, a small table per cell, the figure
    (``png_name``, beside the page; empty: no figure)."""
    settings = ab.get("settings", {})
    sides = "".join(_side(s) for s in settings.get("sides", {}).values())
    intro = (f"<p class='muted'>Launches in ABBA rounds, judged by each launch's "
             f"{esc(settings.get('launch_statistic'))} at ±{settings.get('tolerance', 0):.0%} "
             f"after every round; at most {esc(settings.get('max_launches'))} a side.</p>")
    figure = png_name and (f'<figure><img alt="launch values over time" src="{esc(png_name)}"><figcaption>'
              "Each launch's value at the time it ran: drift moves A and B alike, a change "
              "separates them.</figcaption></figure>")
    return ("<h2>A/B</h2>" + intro + f"<ul>{sides}</ul>"
            + "".join(_cell(c) for c in ab.get("cells", [])) + figure)


def write_ab_reports(ab: Mapping[str, Any], out_dir: Path | str) -> dict[str, Path]:
    """ab.png (when a launch was measured) and ab.html beside ab.json."""
    out_dir = Path(out_dir)
    written = {}
    png = ab_figure_png(ab)
    if png is not None:
        written["ab.png"] = out_dir / "ab.png"
        atomic_write_bytes(written["ab.png"], png)
    written["ab.html"] = out_dir / "ab.html"
    atomic_write_text(written["ab.html"], (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>perfsuite A/B</title>"
        f"<style>{CSS}</style></head><body>{ab_section_html(ab, 'ab.png' if png else '')}"
        "</body></html>\n"))
    return written
