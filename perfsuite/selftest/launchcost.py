"""Where a launch's wall time goes, for each way its ranks can start.

The same cell launched ``launches`` times per rank start (perfsuite.launch.
starting: ``fork`` from a zygote, ``exec`` fresh interpreters), one launch at
a time; each result's timeline (perfsuite.launch.launch.timeline) split into
the seconds before training (the agent's and the rank's start and imports,
the workload's import and set-up), training, the counting window, the rest and the
exit. The first forked launch of a process also starts the zygote; it is
reported on its own and left out of the medians.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from perfsuite import cells
from perfsuite.launch.launch import LaunchOptions, run_cell
from perfsuite.launch.starting import RANK_STARTS
from perfsuite.system.atomic import atomic_write_json

PARTS = ("start_and_imports", "workload_import", "workload_setup", "training", "counting",
         "workload_other", "exit")


def before_training(timeline: dict[str, float]) -> float:
    return timeline["start_and_imports"] + timeline["workload_import"] + timeline["workload_setup"]


def measure_launch_cost(cell_id: str, launches: int = 3, starts: tuple[str, ...] = RANK_STARTS,
                        steps: int | None = None, work_dir: Path | None = None,
                        log=lambda line: print(line, flush=True)) -> dict[str, Any]:
    """Each start's launches, in the order given, and their medians."""
    if launches < 1 or not starts or any(s not in RANK_STARTS for s in starts):
        raise ValueError(f"--launches {launches}, --rank-start {','.join(starts)}: give at least one "
                         f"launch and rank starts among {', '.join(RANK_STARTS)}")
    cell = cells.get(cell_id)
    if steps:
        cell = cell.replace(max_steps=steps)
    work = Path(work_dir or tempfile.mkdtemp(prefix="perfsuite-launch-cost-"))
    runs: dict[str, list[dict[str, Any]]] = {start: [] for start in starts}
    first_fork: dict[str, Any] | None = None
    for start in starts:
        for index in range(launches + (start == "fork" and first_fork is None)):
            began = time.time()
            result = run_cell(cell, work / f"{start}{index}", LaunchOptions(rank_start=start))
            timeline = result.get("timeline")
            if result["status"] != "ok" or not timeline:
                raise RuntimeError(f"{cell.id}: a launch ({start}) ended {result['status']}: "
                                   f"{result.get('reason')}; its log is in {work / f'{start}{index}'}")
            record = {"launch": index, "rank_start": result["info"].get("rank_start"),
                      "rank_start_note": result["info"].get("rank_start_note"),
                      "seconds": round(time.time() - began, 3),
                      "before_training": round(before_training(timeline), 3),
                      **{k: round(v, 3) for k, v in timeline.items()}}
            log(f"{start} launch {index}: wall {timeline['wall']:.2f} s, before training "
                f"{record['before_training']:.2f} s ({', '.join(f'{k} {timeline[k]:.2f}' for k in PARTS)})")
            if start == "fork" and first_fork is None:
                first_fork = record  # the zygote's own start
                continue
            runs[start].append(record)
    medians = {start: {key: round(statistics.median(r[key] for r in records), 3)
                       for key in ("wall", "before_training", *PARTS)}
               for start, records in runs.items()}
    out = {"cell": cell.id, "launches": launches, "starts": list(starts), "medians": medians,
           "first_fork": first_fork, "runs": runs, "work_dir": str(work)}
    atomic_write_json(work / "launch-cost.json", out)
    return out
