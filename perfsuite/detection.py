"""Detection power of the suite's step-time verdict, measured on a real cell.

Every trial launches a CPU smoke cell in four groups: a reference, the same
code unchanged, and with an injected slowdown of every training step (the
``slow`` fault) of 10 % and 5 %. Each group gets ``launches`` launches, and
the groups take turns launch by launch (the order rotating every round), so
a machine that drifts over minutes drifts under all four alike. The
reference is recorded as a baseline (in a scratch baselines root) with the
suite's own ``record_run``; each group is then judged against it by the
suite's own checks, exactly as a cell launched with ``--perf-repeats`` is
judged against a baseline recorded that way. The figures: how often
unchanged code is called "regressed" (false alarms) and how often a 10 % and
a 5 % slowdown are. A trial's launches are fixed in advance, so there is no
re-measure on "unknown": it counts as not caught.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from perfsuite import cells
from perfsuite.baselines import load_all, record_run
from perfsuite.judge import judge
from perfsuite.launch import LaunchOptions, run_cell
from perfsuite.results import SCHEMA, merge_repeats

DEFAULT_CELL = "smoke/image/ddp-ds/c1/fp32/px32/nopin/nchw"
CONDITIONS = {"unchanged": 0.0, "slow 10%": 0.10, "slow 5%": 0.05}
GROUPS = ("reference", *CONDITIONS)


def launch_order(round_: int) -> list[str]:
    """The groups' order in one round, rotated so none always follows another."""
    k = round_ % len(GROUPS)
    return [*GROUPS[k:], *GROUPS[:k]]


def _step_check(result: dict[str, Any]) -> dict[str, Any]:
    for check in result.get("checks", []):
        if check["name"] == "step_time":
            return check
    return {"verdict": f"no step_time check ({result['status']}: {result.get('reason')})"}


def _label(group: str) -> str:
    return group.replace(" ", "").replace("%", "")


def run_trial(cell: cells.Cell, trial_dir: Path, launches: int,
              environment: dict[str, Any] | None = None) -> dict[str, Any]:
    """One trial: interleaved launches, the reference recorded, the rest judged."""
    launched: dict[str, list[dict[str, Any]]] = {g: [] for g in GROUPS}
    for round_ in range(launches):
        for group in launch_order(round_):
            slowdown = CONDITIONS.get(group, 0.0)
            options = {"fault": f"slow:*:0:{slowdown}"} if slowdown else {}
            result = run_cell(cell, trial_dir / _label(group) / f"launch{round_}",
                              LaunchOptions(options=options))
            if result["status"] != "ok":
                raise RuntimeError(f"{group} launch {round_ + 1} of {cell.id} ended "
                                   f"{result['status']}: {result.get('reason')}; see "
                                   f"{trial_dir / _label(group)}")
            launched[group].append(result)
    merged = {group: merge_repeats(results) for group, results in launched.items()}
    root = trial_dir / "baselines"
    reference = merged["reference"]
    record_run({"schema": SCHEMA, "env": environment or reference.get("env", {}),
                "cells": [reference]}, root=root)
    sets = load_all(root)
    checks = {group: _step_check({**merged[group], "checks": judge(
        cell, merged[group], None, sets, {"trusted": True})}) for group in CONDITIONS}
    medians = {group: merged[group]["metrics"]["step_time"].get(
        "launch_medians") or [merged[group]["metrics"]["step_time"]["median"]]
        for group in GROUPS}
    return {"checks": checks, "launch_medians": medians}


def launch_spread(medians: dict[str, list[float]]) -> float:
    """Standard deviation of log launch medians within groups, pooled (the
    slowdown factors removed by centring each group on its own mean)."""
    centred = [x for ms in medians.values() if len(ms) > 1
               for x in np.log(ms) - np.mean(np.log(ms))]
    groups = sum(len(ms) > 1 for ms in medians.values())
    dof = len(centred) - groups
    return float(math.sqrt(sum(x * x for x in centred) / dof)) if dof > 0 else float("nan")


def measure_detection(trials: int = 20, cell_id: str = DEFAULT_CELL, steps: int = 30,
                      launches: int = 4, work_dir: Path | None = None,
                      log=print) -> dict[str, Any]:
    cell = cells.get(cell_id).replace(max_steps=steps)
    work = Path(work_dir or tempfile.mkdtemp(prefix="perfsuite-detection-"))
    verdicts: dict[str, Counter] = {name: Counter() for name in CONDITIONS}
    reference_medians, spreads = [], []
    started = time.time()
    for trial in range(trials):
        out = run_trial(cell, work / f"trial{trial}", launches)
        ref = out["launch_medians"]["reference"]
        reference_medians.append(float(np.median(ref)))
        spreads.append(launch_spread(out["launch_medians"]))
        for name, check in out["checks"].items():
            verdicts[name][check["verdict"]] += 1
            ratio = check.get("ratio")
            interval = (f"ratio {ratio:.3f}, CI {check['ci_low']:.3f}-{check['ci_high']:.3f}"
                        if isinstance(ratio, float) else check.get("message", ""))
            log(f"trial {trial + 1}/{trials} (reference launch medians "
                f"{', '.join(f'{m * 1e3:.1f}' for m in ref)} ms) {name:<9} -> "
                f"{check['verdict']} ({interval})")
    return {
        "cell": cell.id, "steps": steps, "launches": launches, "trials": trials,
        "reference_medians_ms": [round(m * 1e3, 2) for m in reference_medians],
        "launch_spread_log_sd": [round(s, 4) for s in spreads],
        "verdicts": {name: dict(count) for name, count in verdicts.items()},
        "false_alarms": verdicts["unchanged"]["regressed"],
        "caught_10": verdicts["slow 10%"]["regressed"],
        "caught_5": verdicts["slow 5%"]["regressed"],
        "seconds": time.time() - started, "work_dir": str(work),
    }
