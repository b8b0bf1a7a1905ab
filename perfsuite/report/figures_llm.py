"""LLM fine-tuning figures: iteration time per dataset and GPU count (Fig. 4,
Table 5) and the pin_memory gain (Table 5).

Iteration times are absolute, so the paper's (Llama3-8B on H100) always get
an axes of their own: a tiny model on other hardware is not on the same scale.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure

from perfsuite.report import cellview as cv
from perfsuite.report.figures import pin_memory_figure
from perfsuite.report.paper import PaperReference, with_default
from perfsuite.report.plotting import (
    PAPER_COLOUR,
    colour,
    figure_legend,
    integer_ticks,
    line,
    new_figure,
    note,
    titled,
)


def llm_iteration_figure(cells: Sequence[dict[str, Any]],
                         paper: PaperReference | None = None) -> Figure | None:
    """Fig. 4 / Table 5: median s/it vs GPU count, per dataset; pin solid, nopin dashed."""
    llm = cv.ok_cells(cells, "llm")
    llm = [c for c in llm if cv.metric(c, "step_time") is not None]
    if not llm:
        return None
    paper = with_default(paper)
    grouped = cv.series(llm, "world_size")
    names = cv.differing(grouped, first=("dataset", "pin_memory")) or ["dataset"]
    # One colour per series (pin and nopin of one configuration share it, line
    # style tells them apart): five recipes on one dataset must not share a colour.
    tints = list(dict.fromkeys(cv.config(points[min(points)], ("world_size", "pin_memory"))
                               for _, points in sorted(grouped.items(), key=lambda kv: str(kv[0]))))
    rows = paper.values("step_time", "llm")
    fig, axes = new_figure(2 if not rows.empty else 1, 5.6, 4.0)
    sizes: set[int] = set()
    for key, points in sorted(grouped.items(), key=lambda kv: str(kv[0])):
        values = dict(key)
        xs = sorted(points)
        sizes.update(xs)
        ys = [cv.metric(points[n], "step_time") for n in xs]
        lows = [cv.metric(points[n], "step_time", "p10") for n in xs]
        highs = [cv.metric(points[n], "step_time", "p90") for n in xs]
        line(axes[0], xs, ys, lows, highs, label=cv.label(key, names),
             color=colour(None, tints.index(cv.config(points[min(points)],
                                                      ("world_size", "pin_memory")))),
             linestyle="-" if values.get("pin_memory") else "--")
    axes[0].set(title=cv.hardware_label(llm), ylabel="iteration time (s/it, median)")
    note(axes[0], "whiskers: p10-p90 of the measured steps")
    if not rows.empty:
        for pin, style in (("false", "s--"), ("true", "o-")):
            part = rows[rows["pin_memory"].astype(str) == pin].sort_values("world_size")
            if part.empty:
                continue
            label = f"paper {part['dataset'].iloc[0]} {'pin' if pin == 'true' else 'nopin'}"
            axes[1].plot(part["world_size"].astype(int), part["value"], style,
                         color=PAPER_COLOUR if pin == "false" else "#1f77b4", label=label)
            sizes.update(int(n) for n in part["world_size"])
        axes[1].set(title=f"{paper.label} (reference)", ylabel="iteration time (s/it)")
        note(axes[1], "Table 5: Llama3-8B LoRA, batch 2; Fig. 4's other datasets: "
                      "chart only, no numbers")
        axes[1].set_ylim(0, float(rows["value"].max()) * 1.3)
    for ax in axes:
        ax.set_xlabel("GPUs / ranks (world size)")
        integer_ticks(ax, sizes)
        ax.grid(alpha=0.3)
    figure_legend(fig, ncols=5)
    axes[0].set_ylim(bottom=0)
    return titled(fig, "LLM fine-tuning iteration time (mirrors Fig. 4 and Table 5)", "")


def llm_pin_memory_figure(cells: Sequence[dict[str, Any]], paper: PaperReference | None = None) -> Figure | None:
    return pin_memory_figure(cells, paper, workload="llm")


# name, title, function, caption
FIGURES = (
    ("llm_iteration", "LLM iteration time (Fig. 4, Table 5)", llm_iteration_figure,
     ("Median seconds per iteration of each LLM cell (pin_memory solid, without dashed); the "
      "paper's Table 5 iteration times (alpaca_cleaned) on their own axes.")),
    ("llm_pin_memory", "LLM pin_memory (Table 5)", llm_pin_memory_figure,
     ("Throughput ratio of pin_memory=True over the same LLM cell without it, with its 95 % "
      "interval (a point around 1, 'no effect expected', where pin_memory cannot act: a CPU "
      "run); the paper finds the gain negligible (Table 5: 0.04 % to 3.5 %).")),
)
