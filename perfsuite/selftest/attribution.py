"""Whether the attribution diff names what changed: a change made to side B
of a cell, both sides profiled launches (``perfsuite run CELL --profiler
torch``'s launch path), the two results diffed
(perfsuite.profiling.attribution).

On a CPU cell (default: a 2-rank smoke cell) the changes are faults in the
step: a spin in Conv2d's forward, an extra all-reduce, a clone of every
parameter, a slower Linear. On a CUDA cell (a one-GPU gate cell) they are a
device-side slowdown (``torch.cuda._sleep`` after each optimizer step) and
the same cell at fp16 against fp32, whose kernels differ.

Per change and session: the top row's name against the changed place, the
explained share of the top row's level, and the step-time change; for the
unchanged pair (no change on either side) the rows listed above the noise
the diff reports (there should be none). One unprofiled launch per session
of the unchanged pair gives what profiling adds to a launch's wall time.
"""

from __future__ import annotations

import re
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfsuite import cells
from perfsuite.launch.launch import LaunchOptions, run_cell
from perfsuite.profiling.attribution import attribute_results
from perfsuite.rank.faults import GPU_SLEEP
from perfsuite.selftest.detection import ab_fault
from perfsuite.system.atomic import atomic_write_json

CELL = "smoke/image/ddp/c2/fp32/px32/nopin/nchw"
GPU_CELL = "gate/image/ddp-ds/g1/fp32/px500/pin/nchw"
MOBILENET_PARAMETERS = 2_236_682  # MobileNetV2 with 10 classes: an all-reduce of all its gradients
FRACTION = 0.1  # how much of a step a slowing fault adds
# a convolution's or a matrix product's kernel, as cuDNN, cuBLAS and CUTLASS name them
CONV_OR_GEMM = re.compile(r"conv|gemm|xmma|cudnn|fprop|dgrad|wgrad|implicit|winograd|cutlass|s884|h884|hmma",
                          re.IGNORECASE)


def _same(cell: cells.Cell) -> cells.Cell:
    return cell


@dataclass(frozen=True)
class Change:
    """What side B changes against side A, and whether a diff's row names its place."""

    fault: Callable[[cells.Cell], str | None]  # side B's fault option, from the cell (its warm-up)
    names_place: Callable[[Mapping[str, Any]], bool]
    b_cell: Callable[[cells.Cell], cells.Cell] = _same
    device: str | None = None  # the one device whose cells it applies to (None: any)


def _fp16(cell: cells.Cell) -> cells.Cell:
    return cell.replace(precision="fp16")


# The profiled window starts after the cell's warm-up: a fault starts there.
CHANGES: dict[str, Change] = {
    "conv-spin": Change(lambda c: f"conv-spin:*:{c.warmup_steps}:{FRACTION}",
                        lambda row: row["level"] == "module" and "(Conv2d) forward" in row["name"]),
    "allreduce": Change(lambda c: f"allreduce:*:{c.warmup_steps}:{MOBILENET_PARAMETERS}",
                        lambda row: row["level"] == "collective" or "all_reduce" in row["name"]
                        or "allreduce" in row["name"]),
    "copy": Change(lambda c: f"copy:*:{c.warmup_steps}",
                   lambda row: row["level"] == "operator" and ("clone" in row["name"] or "copy_" in row["name"])),
    "slow-linear": Change(lambda c: f"slow-linear:*:{c.warmup_steps}:{FRACTION}",
                          lambda row: "(Linear)" in row["name"] or "addmm" in row["name"]),
    # torch.cuda._sleep runs ATen's spin_kernel on the device
    GPU_SLEEP: Change(lambda c: ab_fault(GPU_SLEEP, c, FRACTION),
                      lambda row: row["level"] == "kernel" and "spin_kernel" in row["name"], device="cuda"),
    "precision": Change(lambda c: None, lambda row: row["level"] == "kernel" and bool(CONV_OR_GEMM.search(row["name"])),
                        b_cell=_fp16, device="cuda"),
    "unchanged": Change(lambda c: None, lambda row: False),
}
DEFAULT_CHANGES = {"cpu": ("conv-spin", "allreduce", "copy", "slow-linear", "unchanged"),
                   "cuda": (GPU_SLEEP, "precision", "unchanged")}


def _launch(cell: Any, out: Path, fault: str | None, profiler: str) -> tuple[dict[str, Any], float]:
    began = time.perf_counter()
    result = run_cell(cell, out, LaunchOptions(profiler=profiler, options={"fault": fault} if fault else {}))
    wall = time.perf_counter() - began
    if result["status"] != "ok":
        raise RuntimeError(f"{cell.id}: a launch ({fault or 'no fault'}, profiler {profiler}) ended "
                           f"{result['status']}: {result.get('reason')}; its log is in {out}")
    return result, wall


def default_cell() -> str:
    """A one-GPU gate cell where torch sees a GPU, else the 2-rank smoke cell."""
    import torch

    return GPU_CELL if torch.cuda.is_available() else CELL


def measure_attribution(sessions: int = 10, faults: tuple[str, ...] | None = None, cell_id: str | None = None,
                        work_dir: Path | None = None, log=print, steps: int | None = None) -> dict[str, Any]:
    """Every change's ``sessions`` sessions, one after another; the figures
    (written after each session, so a stopped run keeps what it measured)."""
    cell = cells.get(cell_id or default_cell())
    if steps is not None:
        if steps <= cell.warmup_steps:
            raise ValueError(f"--steps {steps}: give more than {cell.id}'s {cell.warmup_steps} warm-up steps")
        cell = cell.replace(max_steps=steps)
    faults = tuple(faults or DEFAULT_CHANGES["cuda" if cell.device == "cuda" else "cpu"])
    unknown = [f for f in faults if f not in CHANGES]
    if sessions < 1 or not faults or unknown:
        raise ValueError(f"--sessions {sessions}, faults {', '.join(faults)}: give at least one session and "
                         f"faults among {', '.join(CHANGES)}")
    elsewhere = [f for f in faults if CHANGES[f].device not in (None, cell.device)]
    if elsewhere:
        raise ValueError(f"{', '.join(elsewhere)}: a {CHANGES[elsewhere[0]].device} cell's change only; {cell.id} "
                         f"runs on {cell.device} (give --cell a {CHANGES[elsewhere[0]].device} cell)")
    sides = {name: (CHANGES[name].fault(cell), CHANGES[name].b_cell(cell)) for name in faults}  # refused up front
    work = Path(work_dir or tempfile.mkdtemp(prefix="perfsuite-attribution-"))
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in faults}
    walls: dict[str, list[float]] = {"profiled": [], "unprofiled": []}
    for session in range(sessions):
        for name in faults:
            fault, b_cell = sides[name]
            folder = work / name / f"s{session}"
            a, wall_a = _launch(cell, folder / "a", None, "torch")
            b, _ = _launch(b_cell, folder / "b", fault, "torch")
            walls["profiled"].append(wall_a)
            if name == "unchanged":
                walls["unprofiled"].append(_launch(cell, folder / "bare", None, "off")[1])
            diff = attribute_results(a, b)
            if diff is None:
                raise RuntimeError(f"{cell.id}: a profiled launch left no profile summary; see {folder}")
            record = diff.to_dict()
            top = record["top"][0] if record["top"] else None
            entry = {"session": session, "fault": fault, "b_cell": b_cell.id,
                     "hit": bool(top and CHANGES[name].names_place(top)),
                     "top": top and f"{top['level']}: {top['name']}", "explained": record["explained"],
                     "change_s": record["change_s"], "a_step_s": a["metrics"]["step_time"]["value"],
                     "noise_s": record["noise_s"], "rows_above_noise": sum(len(level["rows"]) for level in
                                                                          record["levels"].values()),
                     "kernels": _kernel_rows(record), "dir": str(folder)}
            runs[name].append(entry)
            atomic_write_json(folder / "attribution.json", record)
            log(f"{name} session {session + 1}/{sessions}: change {1e3 * entry['change_s']:+.2f} ms "
                f"({100 * entry['change_s'] / entry['a_step_s']:+.1f} %), top {entry['top'] or '-'}, "
                f"explained {_percent(entry['explained'])}, rows above noise {entry['rows_above_noise']}")
            atomic_write_json(work / "attribution-selftest.json", _document(cell, sessions, runs, walls, work))
    return _document(cell, sessions, runs, walls, work)


def _kernel_rows(record: Mapping[str, Any], top: int = 5) -> list[str]:
    """The largest kernel rows as named in the profile, with their status: on a
    GPU, what the diff says of the device's own work."""
    rows = (record["levels"].get("kernel") or {}).get("rows") or []
    return [f"{row['name']} ({row['status']}, {1e3 * row['delta_s']:+.3f} ms)" for row in rows[:top]]


def _document(cell: cells.Cell, sessions: int, runs: dict[str, list[dict[str, Any]]],
              walls: dict[str, list[float]], work: Path) -> dict[str, Any]:
    figures = {name: _figures(entries) for name, entries in runs.items() if entries}
    overhead = None
    if walls["unprofiled"]:
        overhead = statistics.median(walls["profiled"]) / statistics.median(walls["unprofiled"]) - 1
    return {"cell": cell.id, "steps": cell.max_steps, "sessions": sessions, "figures": figures,
            "profiling_wall_overhead": overhead, "walls": walls, "runs": runs, "work_dir": str(work)}


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f} %"


def _figures(entries: list[dict[str, Any]]) -> dict[str, Any]:
    explained = [e["explained"] for e in entries if e["explained"] is not None]
    return {"hits": sum(e["hit"] for e in entries), "sessions": len(entries),
            "median_explained": statistics.median(explained) if explained else None,
            "median_change_s": statistics.median(e["change_s"] for e in entries),
            "sessions_with_rows_above_noise": sum(e["rows_above_noise"] > 0 for e in entries),
            "median_noise_s": statistics.median(e["noise_s"] for e in entries),
            "kernels": next((e["kernels"] for e in reversed(entries) if e.get("kernels")), [])}


def figure_lines(out: dict[str, Any]) -> list[str]:
    lines = []
    for name, f in out["figures"].items():
        if name == "unchanged":
            lines.append(f"unchanged: sessions with a row above the noise {f['sessions_with_rows_above_noise']}/"
                         f"{f['sessions']} (goal 0), median noise {1e3 * f['median_noise_s']:.2f} ms a step")
        else:
            lines.append(f"{name}: top row names the changed place {f['hits']}/{f['sessions']} (goal 9 in 10), "
                         f"median explained {_percent(f['median_explained'])} (goal >= 70 %), median change "
                         f"{1e3 * f['median_change_s']:+.2f} ms")
        if f.get("kernels"):
            lines.append(f"  {name}: its kernel rows (the last session's): " + "; ".join(f["kernels"]))
    if out["profiling_wall_overhead"] is not None:
        lines.append(f"profiling adds {100 * out['profiling_wall_overhead']:.0f} % to a launch's wall time "
                     "(median profiled / unprofiled; goal <= 20 %)")
    return lines
