"""Whether the attribution diff names what changed: faults injected into
side B of a 2-rank CPU cell, both sides profiled launches (``perfsuite run
CELL --profiler torch``'s launch path), the two results diffed
(perfsuite.profiling.attribution).

Per fault and session: the top row's name against the injected place, the
explained share of the top row's level, and the step-time change; for the
unchanged pair (no fault on either side) the rows listed above the noise the
diff reports (there should be none). One unprofiled launch per session of
the unchanged pair gives what profiling adds to a launch's wall time.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from perfsuite import cells
from perfsuite.launch.launch import LaunchOptions, run_cell
from perfsuite.profiling.attribution import attribute_results
from perfsuite.system.atomic import atomic_write_json

CELL = "smoke/image/ddp/c2/fp32/px32/nopin/nchw"
MOBILENET_PARAMETERS = 2_236_682  # MobileNetV2 with 10 classes: an all-reduce of all its gradients
# fault on side B, and whether the top row names its place; STEP 3: the profiled window's first
FAULTS: dict[str, tuple[str | None, Callable[[dict[str, Any]], bool]]] = {
    "conv-spin": ("conv-spin:*:3:0.1", lambda row: row["level"] == "module" and "(Conv2d) forward" in row["name"]),
    "allreduce": (f"allreduce:*:3:{MOBILENET_PARAMETERS}",
                  lambda row: row["level"] == "collective" or "all_reduce" in row["name"]
                  or "allreduce" in row["name"]),
    "copy": ("copy:*:3", lambda row: row["level"] == "operator" and ("clone" in row["name"] or "copy_" in row["name"])),
    "slow-linear": ("slow-linear:*:3:0.1", lambda row: "(Linear)" in row["name"] or "addmm" in row["name"]),
    "unchanged": (None, lambda row: False),
}


def _launch(cell: Any, out: Path, fault: str | None, profiler: str) -> tuple[dict[str, Any], float]:
    began = time.perf_counter()
    result = run_cell(cell, out, LaunchOptions(profiler=profiler, options={"fault": fault} if fault else {}))
    wall = time.perf_counter() - began
    if result["status"] != "ok":
        raise RuntimeError(f"{cell.id}: a launch ({fault or 'no fault'}, profiler {profiler}) ended "
                           f"{result['status']}: {result.get('reason')}; its log is in {out}")
    return result, wall


def measure_attribution(sessions: int = 10, faults: tuple[str, ...] = tuple(FAULTS), cell_id: str = CELL,
                        work_dir: Path | None = None, log=print) -> dict[str, Any]:
    """Every fault's ``sessions`` sessions, one after another; the figures."""
    unknown = [f for f in faults if f not in FAULTS]
    if sessions < 1 or not faults or unknown:
        raise ValueError(f"--sessions {sessions}, faults {', '.join(faults)}: give at least one session and "
                         f"faults among {', '.join(FAULTS)}")
    cell = cells.get(cell_id)
    work = Path(work_dir or tempfile.mkdtemp(prefix="perfsuite-attribution-"))
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in faults}
    walls: dict[str, list[float]] = {"profiled": [], "unprofiled": []}
    for session in range(sessions):
        for name in faults:
            fault, names_place = FAULTS[name]
            folder = work / name / f"s{session}"
            a, wall_a = _launch(cell, folder / "a", None, "torch")
            b, _ = _launch(cell, folder / "b", fault, "torch")
            walls["profiled"].append(wall_a)
            if name == "unchanged":
                walls["unprofiled"].append(_launch(cell, folder / "bare", None, "off")[1])
            diff = attribute_results(a, b)
            if diff is None:
                raise RuntimeError(f"{cell.id}: a profiled launch left no profile summary; see {folder}")
            record = diff.to_dict()
            top = record["top"][0] if record["top"] else None
            entry = {"session": session, "fault": fault, "hit": bool(top and names_place(top)),
                     "top": top and f"{top['level']}: {top['name']}", "explained": record["explained"],
                     "change_s": record["change_s"], "a_step_s": a["metrics"]["step_time"]["value"],
                     "noise_s": record["noise_s"], "rows_above_noise": sum(len(level["rows"]) for level in
                                                                          record["levels"].values()),
                     "dir": str(folder)}
            runs[name].append(entry)
            atomic_write_json(folder / "attribution.json", record)
            log(f"{name} session {session + 1}/{sessions}: change {1e3 * entry['change_s']:+.2f} ms "
                f"({100 * entry['change_s'] / entry['a_step_s']:+.1f} %), top {entry['top'] or '-'}, "
                f"explained {_percent(entry['explained'])}, rows above noise {entry['rows_above_noise']}")
    figures = {name: _figures(entries) for name, entries in runs.items()}
    overhead = None
    if walls["unprofiled"]:
        overhead = statistics.median(walls["profiled"]) / statistics.median(walls["unprofiled"]) - 1
    out = {"cell": cell.id, "sessions": sessions, "figures": figures, "profiling_wall_overhead": overhead,
           "walls": walls, "runs": runs, "work_dir": str(work)}
    atomic_write_json(work / "attribution-selftest.json", out)
    return out


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f} %"


def _figures(entries: list[dict[str, Any]]) -> dict[str, Any]:
    explained = [e["explained"] for e in entries if e["explained"] is not None]
    return {"hits": sum(e["hit"] for e in entries), "sessions": len(entries),
            "median_explained": statistics.median(explained) if explained else None,
            "median_change_s": statistics.median(e["change_s"] for e in entries),
            "sessions_with_rows_above_noise": sum(e["rows_above_noise"] > 0 for e in entries),
            "median_noise_s": statistics.median(e["noise_s"] for e in entries)}


def figure_lines(out: dict[str, Any]) -> list[str]:
    lines = []
    for name, f in out["figures"].items():
        if name == "unchanged":
            lines.append(f"unchanged: sessions with a row above the noise {f['sessions_with_rows_above_noise']}/"
                         f"{f['sessions']} (goal 0), median noise {1e3 * f['median_noise_s']:.2f} ms a step")
        else:
            lines.append(f"{name}: top row names the injected place {f['hits']}/{f['sessions']} (goal 9/10), "
                         f"median explained {_percent(f['median_explained'])} (goal >= 70 %), median change "
                         f"{1e3 * f['median_change_s']:+.2f} ms")
    if out["profiling_wall_overhead"] is not None:
        lines.append(f"profiling adds {100 * out['profiling_wall_overhead']:.0f} % to a launch's wall time "
                     "(median profiled / unprofiled; goal <= 20 %)")
    return lines
