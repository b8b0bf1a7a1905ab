"""Figures mirroring the papers' (2503.15252 Fig. 1-6, Tables 2, 3, 5), ours
beside the paper's published numbers.

Every figure function takes the list of cell results (results.json dicts) and
returns a matplotlib Figure, or None when the run has nothing it could plot.
Paper values come from the paper baseline folder (see perfsuite.report.paper);
where the paper printed only a chart, its statements are quoted, never
numbers read off the chart. Ratios (speed-ups, efficiency) share one axes
with the paper's when the run is on GPUs; a CPU run gets the paper's H100
numbers on an axes of their own, as a reference.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import LogFormatter, ScalarFormatter

from perfsuite.report import cellview as cv
from perfsuite.report.paper import PaperReference, with_default
from perfsuite.report.plotting import (
    DPI,
    PAPER_COLOUR,
    colour,
    figure_legend,
    integer_ticks,
    line,
    new_figure,
    note,
    ratio_bars,
    titled,
)

Cells = Sequence[dict[str, Any]]
_TABLE = re.compile(r"Table \d+")


def _paper_curve(rows) -> tuple[dict[int, float], str]:
    """({world size: value}, table) from the first paper table among the rows (Table 2
    and Table 3 both print FP32 speed-ups; one curve must not mix them). 1 GPU is
    1.0 by the tables' definition."""
    records = [r for r in rows.to_dict("records")
               if r.get("value") == r.get("value") and r.get("world_size") == r.get("world_size")]
    tables = [m.group(0) for r in records if (m := _TABLE.search(str(r.get("source", ""))))]
    table = tables[0] if tables else ""
    curve = {int(r["world_size"]): float(r["value"]) for r in records
             if table in str(r.get("source", ""))}
    return ({1: 1.0, **curve} if curve else {}), table


def _scaling_groups(cells: Cells, axis: str) -> dict[tuple, dict[tuple, dict]]:
    """Series over world size, grouped by everything but ``axis`` (the legend)."""
    groups: dict[tuple, dict[tuple, dict]] = {}
    for key, points in cv.series(cv.ok_cells(cells, "image"), "world_size").items():
        rest = tuple(kv for kv in key if kv[0] != axis)
        groups.setdefault(rest, {})[key] = points
    return groups


def _best_group(groups: dict[tuple, dict[tuple, dict]]) -> dict[tuple, dict] | None:
    """The group comparing most series that actually scale (>= 2 world sizes)."""
    def score(item):
        series = item[1]
        return (sum(len(p) >= 2 for p in series.values()), len(series),
                sum(len(p) for p in series.values()))
    if not groups:
        return None
    best = max(groups.items(), key=score)[1]
    return best if any(len(p) >= 2 for p in best.values()) else None


def _speedups(points: dict[Any, dict]) -> dict[int, tuple[float, float | None, float | None]]:
    """{N: (throughput(N) / throughput(1), low, high)}; the interval from the
    cell's scaling_efficiency check (efficiency x N) when it has one, else a
    bootstrap of both cells' step-time samples (as the check computes it)."""
    base = points.get(1)
    out = {}
    for n, cell in points.items():
        interval = cv.check_interval(cell, "scaling_efficiency")
        if interval and n:
            out[n] = tuple(v * n for v in interval)
        elif cell is base:
            out[n] = (1.0, None, None)  # the reference itself: 1 by definition
        elif base is not None and (found := cv.ratio_with_interval(cell, base)) is not None:
            out[n] = found
    return out


def _scaled(values: tuple[float, float | None, float | None], factor: float) -> tuple:
    return tuple(None if v is None else v * factor for v in values)


def scaling_figure(cells: Cells, paper: PaperReference | None = None) -> Figure | None:
    """Fig. 1: throughput, speed-up and efficiency T1/(N*TN) per strategy."""
    chosen = _best_group(_scaling_groups(cells, "strategy"))
    if chosen is None:
        return None
    paper = with_default(paper)
    every = [c for points in chosen.values() for c in points.values()]
    gpu, hardware = cv.on_gpu(every), cv.hardware_label(every)
    names = cv.differing(chosen, first=("strategy",)) or ["strategy"]
    precision = cv.params(every[0]).get("precision")
    paper_rows = paper.speedups("world_size=1", strategy="ddp-ds", precision=precision,
                                pin_memory="false")
    if paper_rows.empty:
        paper_rows = paper.speedups("world_size=1", strategy="ddp-ds", precision="fp32",
                                    pin_memory="false")
    paper_curve, table = _paper_curve(paper_rows)
    paper_what = (f"{table} DDP-DS {paper_rows['precision'].iloc[0].upper()}, "
                  f"{int(paper_rows['image_size'].iloc[0])} px" if paper_curve else "")
    separate = bool(paper_curve) and not gpu
    fig, axes = new_figure(4 if separate else 3, 4.6, 3.8, max_per_row=2 if separate else 3)
    sizes, paper_sizes, top_efficiency = set(), set(), 1.0
    for i, (key, points) in enumerate(sorted(chosen.items(), key=lambda kv: str(kv[0]))):
        strategy = dict(key).get("strategy")
        style = {"color": colour(strategy if names == ["strategy"] else None, i),
                 "label": cv.label(key, names)}
        xs = sorted(points)
        sizes.update(xs)
        known = [n for n in xs if cv.metric(points[n], "throughput") is not None]
        line(axes[0], known, [cv.metric(points[n], "throughput") for n in known], **style)
        speed = _speedups(points)
        if len(speed) >= 2:
            ns = sorted(speed)
            line(axes[1], ns, [speed[n][0] for n in ns], [speed[n][1] for n in ns],
                 [speed[n][2] for n in ns], **style)
            top_efficiency = max([top_efficiency] + [speed[n][0] / n for n in ns])
            line(axes[2], ns, [speed[n][0] / n for n in ns],
                 [None if speed[n][1] is None else speed[n][1] / n for n in ns],
                 [None if speed[n][2] is None else speed[n][2] / n for n in ns], **style)
    unit = cv.unit(every[0], "throughput") or "images/s"
    axes[0].set(title="throughput", ylabel=f"throughput ({unit})")
    axes[1].set(title="speed-up vs 1 rank", ylabel="T1 / TN (×)")
    axes[2].set(title="efficiency T1 / (N·TN)", ylabel="efficiency (fraction of ideal)")
    paper_axes = axes[3] if separate else None
    if paper_curve:
        ns = sorted(paper_curve)
        speed_axes = paper_axes if separate else axes[1]
        speed_axes.plot(ns, [paper_curve[n] for n in ns], "s--", color=PAPER_COLOUR,
                        label=f"paper {paper_what}")
        if not separate:
            axes[2].plot(ns, [paper_curve[n] / n for n in ns], "s--", color=PAPER_COLOUR,
                         label=f"paper {paper_what}")
        _finding_marks(speed_axes, paper)
        (paper_sizes if separate else sizes).update(ns)
    for ax, xs in ((axes[1], sizes), (paper_axes, paper_sizes)):
        if ax is not None and xs:
            ax.plot([1, max(xs)], [1, max(xs)], color="black", linewidth=0.8, linestyle=":",
                    label="ideal")
    axes[2].axhline(1.0, color="black", linewidth=0.8, linestyle=":")
    axes[2].set_ylim(0, max(1.3, top_efficiency * 1.1))
    note(axes[1], "error bars: 95 % interval of each ratio")
    if separate:
        paper_axes.set(title=f"{paper.label} (reference)", ylabel="T1 / TN (×)")
        note(paper_axes, f"{paper_what}; Fig. 1 marks at 4 GPUs, 700 px; "
                         "the paper has no CPU numbers")
    for ax in axes:
        ax.set_xlabel("GPUs / ranks (world size)")
        integer_ticks(ax, paper_sizes if ax is paper_axes else sizes)
        ax.grid(alpha=0.3)
    figure_legend(fig)
    return titled(fig, f"Scaling per strategy (mirrors Fig. 1): {_fixed(every[0], names)}",
                  hardware)


def _fixed(cell: dict, varying: list[str]) -> str:
    """What the plotted cells share, for a title: "fp32, nopin, digits, 32 px"."""
    keys = [k for k in ("precision", "pin_memory", "dataset", "image_size", "memory_format")
            if k not in varying]
    return cv.label(cv.config(cell), keys)


def _finding_marks(ax, paper: PaperReference) -> None:
    """Fig. 1's statements at 4 GPUs: DDP-DS scales (>= low), DDP/DDP-RR do not (<= high)."""
    rows = [r for r in paper.findings_for("world_size=1").to_dict("records")
            if "Fig. 1" in str(r.get("source", "")) and r.get("world_size") == r.get("world_size")]
    for i, r in enumerate(rows):
        n = int(r["world_size"]) + (i - (len(rows) - 1) / 2) * 0.12  # marks side by side
        for bound, marker, sign in (("low", "^", "≥"), ("high", "v", "≤")):
            if r.get(bound) == r.get(bound):  # not NaN
                ax.plot([n], [r[bound]], marker, color=colour(r["strategy"]), markersize=9,
                        markerfacecolor="none", label=f"paper Fig. 1: {r['strategy']} {sign} "
                        f"{r[bound]:g} at {int(r['world_size'])} GPUs")
                break


def image_size_figure(cells: Cells, paper: PaperReference | None = None) -> Figure | None:
    """Fig. 2: time per image and efficiency vs GPU count, one line per image size."""
    groups = _scaling_groups(cells, "image_size")
    groups = {k: g for k, g in groups.items()
              if len({dict(s).get("image_size") for s in g}) >= 2}
    chosen = _best_group(groups)
    if chosen is None:
        return None
    paper = with_default(paper)
    every = [c for points in chosen.values() for c in points.values()]
    gpu = cv.on_gpu(every)
    fig, axes = new_figure(2, 5.5, 4.0)
    sizes = set()
    ordered = sorted(chosen.items(), key=lambda kv: dict(kv[0]).get("image_size") or 0)
    for i, (key, points) in enumerate(ordered):
        style = {"color": colour(None, i), "label": f"{dict(key).get('image_size')} px"}
        xs = sorted(points)
        sizes.update(xs)
        per_k = [1000.0 / t if (t := cv.metric(points[n], "throughput")) else None for n in xs]
        line(axes[0], [x for x, y in zip(xs, per_k) if y], [y for y in per_k if y], **style)
        speed = _speedups(points)
        if len(speed) >= 2:
            ns = sorted(speed)
            efficiency = [_scaled(speed[n], 1 / n) for n in ns]
            line(axes[1], ns, [e[0] for e in efficiency], [e[1] for e in efficiency],
                 [e[2] for e in efficiency], **style)
    axes[0].set(title="time per 1000 images (1000 / throughput)", ylabel="seconds")
    axes[1].set(title="efficiency T1 / (N·TN)", ylabel="efficiency (fraction of ideal)",
                ylim=(0, max([1.3] + [y * 1.1 for ln in axes[1].lines for y in ln.get_ydata()])))
    note(axes[1], "error bars: 95 % interval (bootstrap of both cells' step times)")
    axes[1].axhline(1.0, color="black", linewidth=0.8, linestyle=":")
    found = paper.findings_for("world_size=1")
    found = found[found["source"].astype(str).str.contains("Fig. 2")] if not found.empty else found
    effective = found[found["low"].notna()] if not found.empty else found
    if not effective.empty:
        first = effective.sort_values("image_size").iloc[0]
        ws, threshold = int(first["world_size"]), float(first["low"]) / int(first["world_size"])
        if gpu:  # an H100 statement: drawn only beside GPU measurements
            axes[1].plot([ws], [threshold], "^", color=PAPER_COLOUR, markersize=9,
                         markerfacecolor="none", label=f"paper Fig. 2: ≥ {threshold:g} at {ws} "
                         f"GPUs from {int(first['image_size'])} px")
        note(axes[1], f"{paper.label}, FP64: \"{first.get('stated', '')}\" (chart only, no "
                      "numbers" + (")" if gpu else "; not drawn on CPU)"))
    for ax in axes:
        ax.set_xlabel("GPUs / ranks (world size)")
        integer_ticks(ax, sizes)
        ax.grid(alpha=0.3)
    figure_legend(fig, ncols=6)
    p = cv.params(every[0])
    return titled(fig, f"Scaling per image size (mirrors Fig. 2): {p.get('strategy')}, "
                       f"{p.get('precision')}", cv.hardware_label(every))


def _ours_by_world(pairs: list[dict], series_of: Callable[[dict], str]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    order = {"fp64": 0, "fp32": 1, "fp16": 2, "bf16": 3}  # the paper's table order
    for pair in sorted(pairs, key=lambda p: (order.get(str(p["value"]), 9), str(p["value"]),
                                             p["world_size"] or 0)):
        out.setdefault(series_of(pair), {})[pair["world_size"]] = (
            pair["ratio"], pair["low"], pair["high"])
    return out


def _pair_series(pairs: list[dict], axis: str) -> Callable[[dict], str]:
    """Legend of a ratio pair: the compared value, plus what else differs."""
    names = [n for n in cv.differing([p["key"] for p in pairs]) if n not in ("world_size", axis)]
    def series_of(pair: dict) -> str:
        head = str(pair["value"]) if axis == "precision" else ""
        rest = cv.label(pair["key"], names) if names else ""
        return " ".join(x for x in (head, rest) if x) or "ours"
    return series_of


def precision_figure(cells: Cells, paper: PaperReference | None = None) -> Figure | None:
    """Table 2: speed-up of each precision over FP64, per GPU count."""
    pairs = cv.ratios_to_twin(cv.ok_cells(cells, "image"), "precision", "fp64")
    if not pairs:
        return None
    paper = with_default(paper)
    rows = paper.speedups("precision=fp64", strategy="ddp-ds")
    theirs: dict[str, dict] = {}
    for r in rows.to_dict("records"):
        theirs.setdefault(str(r["precision"]), {})[int(r["world_size"])] = float(r["value"])
    every = [p["cell"] for p in pairs]
    gpu = cv.on_gpu(every)
    note_text = ("Table 2: DDP-DS, MNIST 500 px, 20 epochs" if theirs else "")
    if not gpu and theirs:
        note_text += "; bf16 is the CPU's reduced precision, the paper's is fp16"
    return ratio_bars("Precision speed-up vs FP64 (mirrors Table 2)", cv.hardware_label(every),
                      "speed-up vs FP64 (×, throughput ratio)",
                      _ours_by_world(pairs, _pair_series(pairs, "precision")), theirs,
                      same_axes=gpu, paper_label=paper.label, paper_note=note_text)


def pin_memory_figure(cells: Cells, paper: PaperReference | None = None,
                      workload: str = "image") -> Figure | None:
    """Table 3 (images) / Table 5 (LLM): speed-up of pin_memory=True over False."""
    pairs = cv.ratios_to_twin(cv.ok_cells(cells, workload), "pin_memory", False)
    if not pairs:
        return None
    paper = with_default(paper)
    rows = paper.speedups("pin_memory=false", workload=workload)
    rows = rows[rows["world_size"].notna()] if not rows.empty else rows
    named = _pair_series(pairs, "pin_memory")
    if workload == "llm":  # the paper measured one dataset: pair our bars by dataset
        def series_of(pair: dict) -> str:
            rest = named(pair)
            dataset = str(dict(pair["key"]).get("dataset"))
            return dataset if rest in ("ours", dataset) else f"{dataset} {rest}"
        paper_name = str(rows["dataset"].iloc[0]) if not rows.empty else ""
    else:
        def series_of(pair: dict) -> str:
            return "pin_memory" + (f" {s}" if (s := named(pair)) != "ours" else "")
        paper_name = "pin_memory"
    theirs = ({paper_name: {int(r["world_size"]): float(r["value"])
                            for r in rows.to_dict("records")}} if not rows.empty else {})
    every = [p["cell"] for p in pairs]
    table = "Table 3" if workload == "image" else "Table 5"
    what = ("DDP-DS FP32, MNIST 500 px" if workload == "image"
            else "Llama3-8B LoRA, alpaca_cleaned")
    inactive = [p for p in pairs if cv.pin_memory_inactive(p["cell"])]
    active = [p for p in pairs if not cv.pin_memory_inactive(p["cell"])]
    ours = _ours_by_world(active, series_of)
    neutral = _ours_by_world(inactive, series_of)
    gpu = cv.on_gpu(every)
    ours_note = ("pin_memory cannot act here (no host-to-device copy): the ratio is run-to-run "
                 "variation around 1, shown with its interval, not a gain" if inactive else "")
    title = (f"pin_memory (mirrors {table}, {workload})" + (": no effect expected on CPU"
                                                           if inactive and not active else " gain"))
    return ratio_bars(title, cv.hardware_label(every),
                      "throughput ratio pin / nopin (×)", ours, theirs,
                      same_axes=gpu, paper_label=paper.label,
                      paper_note=f"{table}: {what}" if theirs else "",
                      ours_note=ours_note, neutral=neutral,
                      neutral_label="no effect expected (95 % interval)")


def step_time_figure(cells: Cells, paper: PaperReference | None = None) -> Figure | None:
    """Step-time distribution of every ok cell (what the regression checks judge), one
    axes per workload: an LLM step and an image step are not on one scale."""
    ok = [c for c in cv.ok_cells(cells)
          if (c.get("metrics", {}).get("step_time") or {}).get("samples")]
    if not ok:
        return None
    workloads = list(dict.fromkeys(str(cv.params(c).get("workload")) for c in ok))
    groups = [[c for c in ok if str(cv.params(c).get("workload")) == w] for w in workloads]
    fig = Figure(figsize=(10.0, 1.0 + sum(0.6 + 0.24 * len(g) for g in groups)), dpi=DPI,
                 layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(groups), 1, squeeze=False,
                        gridspec_kw={"height_ratios": [len(g) + 2 for g in groups]})[:, 0]
    for ax, workload, group in zip(axes, workloads, groups):
        _boxes(ax, group)
        ax.set_title(workload, fontsize=9, loc="left")
    return titled(fig, "Step time per cell (measured steps after warm-up)",
                  cv.hardware_label(ok))


def _boxes(ax, cells: list[dict]) -> None:
    data = [[s * 1e3 for s in c["metrics"]["step_time"]["samples"] if s is not None]
            for c in cells]
    labels = [cv.short_id(c) for c in cells]
    try:
        ax.boxplot(data, orientation="horizontal", tick_labels=labels, widths=0.6)
    except TypeError:  # matplotlib < 3.10 names it vert=False
        ax.boxplot(data, vert=False, tick_labels=labels, widths=0.6)
    ax.invert_yaxis()  # first cell on top, as in the table
    flat = [x for d in data for x in d if x > 0]
    wide = bool(flat) and max(flat) / min(flat) > 20  # one slow cell must not flatten the rest
    if wide:
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 1)))
        ax.tick_params(axis="x", which="minor", labelsize=7)
    ax.set_xlabel(f"step time (ms{', log scale' if wide else ''}): box = IQR, line = median, "
                  "whiskers = 1.5 IQR, circles = outliers", fontsize=9)
    ax.tick_params(axis="y", labelsize=7.5)
    ax.grid(axis="x", alpha=0.3)


# name, title, function, caption
FIGURES: tuple[tuple[str, str, Callable[..., Figure | None], str], ...] = (
    ("step_time", "Step time per cell", step_time_figure,
     "Distribution of the measured step times of each cell (the samples the checks judge)."),
    ("scaling", "Scaling per strategy (Fig. 1)", scaling_figure,
     ("Throughput counts distinct images per second; speed-up and efficiency are against the "
      "1-rank cell of the same configuration, with 95 % intervals (the scaling_efficiency "
      "check's, else a bootstrap of both cells' step times). Paper: DDP-DS speed-ups of Table 2 "
      "and the statements of Fig. 1 (its chart has no printed numbers).")),
    ("image_size", "Scaling per image size (Fig. 2)", image_size_figure,
     ("Time per 1000 images and efficiency per image size (95 % intervals); the paper states "
      "only where 4 GPUs become effective.")),
    ("precision", "Precision (Table 2)", precision_figure,
     ("Throughput ratio of each precision over the FP64 cell of the same configuration; error "
      "bars are the 95 % interval of the ratio: the precision_speedup check's where the cell has "
      "one, else a bootstrap of both cells' step times.")),
    ("pin_memory", "pin_memory (Table 3)", pin_memory_figure,
     ("Throughput ratio of pin_memory=True over the same cell without it, with its 95 % interval. "
      "Where pin_memory cannot act (a CPU run: no host-to-device copy) the ratio is drawn as a "
      "point around 1, 'no effect expected', not as a gain.")),
)
