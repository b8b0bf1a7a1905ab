"""Matplotlib helpers shared by the report's figures.

Figures are built on ``matplotlib.figure.Figure`` with the Agg canvas, never
through pyplot: no global figure registry to leak, no display backend needed.
"""

from __future__ import annotations

import io
import textwrap
from dataclasses import dataclass

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

# One colour per strategy / precision / dataset, stable across figures.
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2",
           "#17becf", "#bcbd22", "#7f7f7f")
PAPER_COLOUR = "#555555"
FIXED_COLOURS = {"dp": "#7f7f7f", "ddp": "#d62728", "ddp-rr": "#ff7f0e", "ddp-ds": "#1f77b4",
                 "fp64": "#9467bd", "fp32": "#1f77b4", "fp16": "#2ca02c", "bf16": "#17becf"}
DPI = 100


def colour(name: object, index: int = 0) -> str:
    return FIXED_COLOURS.get(str(name), PALETTE[index % len(PALETTE)])


def new_figure(panels: int, width_per_panel: float = 5.0, height: float = 4.0,
               max_per_row: int = 3) -> tuple[Figure, list[Axes]]:
    """A figure with ``panels`` axes, at most ``max_per_row`` side by side."""
    rows = (panels + max_per_row - 1) // max_per_row
    cols = min(panels, max_per_row)
    fig = Figure(figsize=(width_per_panel * cols, height * rows), dpi=DPI,
                 layout="constrained")
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(rows, cols, i + 1) for i in range(panels)]
    return fig, axes


def titled(fig: Figure, title: str, hardware: str) -> Figure:
    """Figure title naming what it mirrors, and the hardware it ran on."""
    fig.suptitle(f"{title}\n{hardware}" if hardware else title, fontsize=11)
    return fig


def integer_ticks(ax: Axes, values) -> None:
    ticks = sorted({int(v) for v in values if v is not None})
    if ticks:
        ax.set_xticks(ticks)
        ax.set_xlim(min(ticks) - 0.5, max(ticks) + 0.5)


def note(ax: Axes, text: str) -> None:
    """A short line under the axes' title (what the reference is, where from)."""
    title = ax.get_title()
    inches = ax.get_position().width * ax.figure.get_figwidth()
    text = textwrap.fill(text, width=max(30, int(inches * 15)))  # ~15 chars per inch at 8.5 pt
    ax.set_title(f"{title}\n{text}" if title else text, fontsize=8.5)


def legend(ax: Axes, **options) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, framealpha=0.85, **options)


def figure_legend(fig: Figure, ncols: int = 4) -> None:
    """One legend for all axes, under them: curves stay uncovered."""
    seen: dict[str, object] = {}
    for ax in fig.axes:
        for handle, text in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(text, handle)
    if seen:
        fig.legend(list(seen.values()), list(seen), loc="outside lower center", ncols=ncols,
                   fontsize=8, frameon=False)


def line(ax: Axes, xs, ys, lows=None, highs=None, **style) -> None:
    """A marked line with optional asymmetric error bars (None: no bar there)."""
    err = None
    if lows and any(lo is not None for lo in lows):
        err = [[y - (lo if lo is not None else y) for y, lo in zip(ys, lows)],
               [(hi if hi is not None else y) - y for y, hi in zip(ys, highs)]]
    ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, **style)


def grouped_bars(ax: Axes, groups: list, bars: list[tuple[str, dict, dict]], *,
                 errors: dict | None = None) -> None:
    """Bars side by side per group. ``bars``: (label, {group: value}, style)."""
    width = min(0.8 / max(len(bars), 1), 0.3)  # a lone group keeps slim bars
    for i, (name, values, style) in enumerate(bars):
        xs = [g + (i - (len(bars) - 1) / 2) * width for g in range(len(groups))]
        heights = [values.get(g) for g in groups]
        shown = [(x, h, g) for x, h, g in zip(xs, heights, groups) if h is not None]
        if not shown:
            continue
        err = None
        if errors and name in errors:
            pairs = [errors[name].get(g) for _, _, g in shown]
            if any(p is not None for p in pairs):
                err = [[max(0.0, h - p[0]) if p else 0 for (_, h, _), p in zip(shown, pairs)],
                       [max(0.0, p[1] - h) if p else 0 for (_, h, _), p in zip(shown, pairs)]]
        container = ax.bar([s[0] for s in shown], [s[1] for s in shown], width * 0.95,
                           label=name, yerr=err, capsize=3 if err else 0, **style)
        crowded = len(bars) * len(groups) > 12  # vertical numbers when bars are slim
        ax.bar_label(container, fmt="%.2f", fontsize=6.5 if crowded else 7, padding=2,
                     rotation=90 if crowded else 0)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([str(g) for g in groups])
    ax.set_xlim(-0.7, len(groups) - 0.3)


def png_bytes(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


@dataclass
class ReportFigure:
    """One rendered (or failed) figure of the report."""

    name: str
    title: str
    caption: str
    png: bytes | None = None
    error: str | None = None



NEUTRAL_COLOUR = "#7f7f7f"


def ratio_bars(title: str, hardware: str, ylabel: str, ours: dict[str, dict],
               paper: dict[str, dict], *, same_axes: bool, paper_label: str,
               paper_note: str = "", ours_note: str = "", neutral: dict[str, dict] | None = None,
               neutral_label: str = "no effect expected") -> Figure:
    """Ratios per GPU count, ours beside the paper's, each of ours with its interval.

    ours: {series: {world_size: (ratio, low, high)}}; paper: {series: {world_size:
    value}}. On the paper's kind of hardware both share one axes (paper bars
    hatched, next to ours of the same series); elsewhere the paper gets its own
    axes, as a reference only. ``neutral``: ratios where no effect is expected
    (e.g. pin_memory on a CPU): drawn as points with their interval around the
    line at 1, not as bars, so noise does not read as a finding.
    """
    neutral = neutral or {}
    names = list(dict.fromkeys([*ours, *paper]))
    tint = {n: colour(n.split()[0], i) for i, n in enumerate(names)}
    prefix = ("ours ", "paper ") if same_axes else ("", "")
    ours_bars = [(prefix[0] + n, {w: v[0] for w, v in ours[n].items()}, {"color": tint[n]})
                 for n in names if n in ours]
    paper_bars = [(prefix[1] + n, dict(paper[n]), {"color": tint[n], "alpha": 0.35,
                                                   "hatch": "//", "edgecolor": tint[n]})
                  for n in names if n in paper]
    errors = {prefix[0] + n: {w: (v[1], v[2]) for w, v in pts.items()
                              if v[1] is not None and v[2] is not None}
              for n, pts in ours.items()}
    if same_axes:
        by_name = {b[0]: b for b in ours_bars + paper_bars}
        bars = [by_name[p + n] for n in names for p in prefix if p + n in by_name]
        panels = [(bars, f"{hardware}  |  {paper_label}" if paper_bars else hardware, errors, True)]
    else:
        panels = [(ours_bars, hardware, errors, True)]
        if paper_bars:
            panels.append((paper_bars, paper_label, None, False))
    fig, axes = new_figure(len(panels), 7.0 if len(panels) == 1 else 5.2, 4.2)
    for ax, (bars, who, errs, mine) in zip(axes, panels):
        worlds = {w for _, values, _ in bars for w in values}
        if mine:
            worlds |= {w for pts in neutral.values() for w in pts}
        groups = sorted(worlds)
        grouped_bars(ax, groups, bars, errors=errs)
        if mine:
            _neutral_points(ax, groups, neutral, neutral_label)
        ax.set_title(who, fontsize=9)
    ours_highs = [hi for e in errors.values() for _, hi in e.values()]
    neutral_values = [x for pts in neutral.values() for v in pts.values() for x in v if x is not None]
    top = max([v for _, vals, _ in ours_bars + paper_bars for v in vals.values()]
              + ours_highs + neutral_values + [1.0])
    for ax in axes:
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle=":", zorder=0)
        ax.set_xlabel("GPUs / ranks (world size)")
        ax.set_ylabel(ylabel)
        ax.set_ylim(0, top * 1.3)
        if not same_axes:  # labels repeat across the two axes: one legend each
            legend(ax, loc="upper left", ncols=2)
    if same_axes:
        figure_legend(fig)
    if paper_note:
        note(axes[-1], paper_note)
    unbounded = [n for n, pts in {**ours, **neutral}.items() for v in pts.values() if v[1] is None]
    if unbounded:
        ours_note = (ours_note + "; " if ours_note else "") + (
            "no interval where a cell has too few step samples: " + ", ".join(dict.fromkeys(unbounded)))
    if ours_note:
        note(axes[0], ours_note)
    return titled(fig, title, "")


def _neutral_points(ax: Axes, groups: list, neutral: dict[str, dict], label: str) -> None:
    """Ratios where no effect is expected: a grey point with its interval and
    the numbers written beside it, around the dotted line at 1."""
    for i, (name, points) in enumerate(neutral.items()):
        offset = (i - (len(neutral) - 1) / 2) * 0.15
        shown = [(groups.index(w) + offset, v) for w, v in sorted(points.items()) if w in groups]
        if not shown:
            continue
        xs, values = [x for x, _ in shown], [v for _, v in shown]
        err = [[max(0.0, v[0] - v[1]) if v[1] is not None else 0 for v in values],
               [max(0.0, v[2] - v[0]) if v[2] is not None else 0 for v in values]]
        ax.errorbar(xs, [v[0] for v in values], yerr=err, fmt="D", color=NEUTRAL_COLOUR,
                    markerfacecolor="white", capsize=5, linewidth=1.5, label=f"{name}: {label}")
        for x, v in zip(xs, values):
            interval = f"\n[{v[1]:.2f}, {v[2]:.2f}]" if v[1] is not None and v[2] is not None else ""
            ax.annotate(f"{v[0]:.2f}{interval}", (x, v[2] if v[2] is not None else v[0]),
                        textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7,
                        color=NEUTRAL_COLOUR)
