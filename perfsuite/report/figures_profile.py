"""Profile breakdowns per cell (mirrors 2503.15252 Fig. 3, 5 and 6).

Reads the ProfileSummary dict a cell carries at result["profile"]. With CUDA
rows it plots the paper's Table 1 metrics: their share in percent among the
selected metrics (Fig. 3, Fig. 6 right) and their time per measured step
(Fig. 5, Fig. 6 left). A CPU profile has none of them, so it plots the
training phases (data, forward, backward, optimizer, comm) instead. The
paper's charts have no printed numbers; no paper series is drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure

from perfsuite.report import cellview as cv
from perfsuite.report.paper import PaperReference
from perfsuite.report.plotting import PALETTE, figure_legend, new_figure, titled

PHASES = ("data", "forward", "backward", "optimizer", "comm")
SHORT = {"CUDA memcpy Host-to-Device": "memcpy HtoD", "ncclDevKernel_AllGather": "nccl AllGather"}


def _paper_parts(profile: dict[str, Any]) -> dict[str, float]:
    """{Table 1 metric: seconds} for the metrics the profile has."""
    return {name: float(m.get("total_s") or 0.0)
            for name, m in (profile.get("paper_metrics") or {}).items() if m.get("present")}


def _phase_parts(profile: dict[str, Any]) -> dict[str, float]:
    """{phase: seconds} from the record_function / NVTX ranges, plus collectives."""
    parts = {p: 0.0 for p in PHASES}
    for row in profile.get("rows") or []:
        if row.get("category") == "nvtx" and row.get("name") in parts:
            parts[row["name"]] += float(row.get("total_s") or 0.0)
    return {k: v for k, v in parts.items() if v > 0}


def _per_step(profile: dict[str, Any]) -> tuple[float, str]:
    """Seconds in the window -> ms per measured step. A merged profile sums its
    ranks' times; a step is one rank's, so divide by the ranks too (the mean
    over ranks), or two ranks show twice the step."""
    steps = profile.get("steps")
    ranks = len(profile.get("ranks") or []) or 1
    if not steps:
        return 1.0, "seconds in the window"
    return 1e3 / (steps * ranks), "ms per measured step (mean over ranks)"


def profile_figure(cells: Sequence[dict[str, Any]],
                   paper: PaperReference | None = None) -> Figure | None:
    """Stacked bars per profiled cell: percent (left) and time (right)."""
    profiled = [c for c in cells if isinstance(c.get("profile"), dict)]
    if not profiled:
        return None
    table1 = any(_paper_parts(c["profile"]) for c in profiled)
    extract = _paper_parts if table1 else _phase_parts
    parts = [(c, extract(c["profile"])) for c in profiled]
    parts = [(c, p) for c, p in parts if sum(p.values()) > 0]
    if not parts:
        return None
    names = list(dict.fromkeys(n for _, p in parts for n in p))
    scales = [_per_step(c["profile"]) for c, _ in parts]
    time_unit = scales[0][1] if len({s[1] for s in scales}) == 1 else "seconds (mixed windows)"
    if time_unit.startswith("seconds"):
        scales = [(1.0, "") for _ in scales]
    fig, axes = new_figure(2, 6.0, 1.6 + 0.45 * len(parts), max_per_row=2)
    labels = [cv.short_id(c) for c, _ in parts]
    y = list(range(len(parts)))
    for (ax, percent) in ((axes[0], True), (axes[1], False)):
        left = [0.0] * len(parts)
        for i, name in enumerate(names):
            widths = []
            for (_cell, p), (scale, _) in zip(parts, scales):
                total = sum(p.values())
                value = p.get(name, 0.0)
                widths.append(100.0 * value / total if percent else value * scale)
            bars = ax.barh(y, widths, left=left, color=PALETTE[i % len(PALETTE)],
                           label=SHORT.get(name, name), height=0.6)
            if percent:  # numbers on segments wide enough to hold them
                ax.bar_label(bars, labels=[f"{w:.0f}%" if w >= 8 else "" for w in widths],
                             label_type="center", fontsize=7, color="white")
            left = [a + b for a, b in zip(left, widths)]
        ax.set_yticks(y)
        ax.set_yticklabels(labels if percent else [""] * len(labels), fontsize=8)
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
    axes[0].set(xlabel="percent of the plotted metrics (%)", xlim=(0, 100))
    axes[1].set(xlabel=time_unit)
    figure_legend(fig, ncols=len(names))
    what = ("CUDA metrics of Table 1 (mirrors Fig. 3, 5, 6)" if table1 else
            "training phases (CPU profile; Table 1's CUDA metrics need a GPU)")
    source = sorted({str(c["profile"].get("source")) for c, _ in parts})
    return titled(fig, f"Profile breakdown: {what}",
                  f"{cv.hardware_label([c for c, _ in parts])}; profiler {', '.join(source)}; "
                  "the paper's charts print no numbers")


# name, title, function, caption
FIGURES = (
    ("profile", "Profile breakdown (Fig. 3, 5, 6)", profile_figure,
     ("Share and time of the paper's Table 1 metrics (or, on CPU, of the training phases) in "
      "each profiled cell's capture window.")),
)
