"""Detection power of the suite's step-time verdict, measured on a real cell.

Every trial launches a CPU smoke cell in four groups: a reference, the same
code unchanged, and with an injected slowdown of every training step (the
``slow`` fault) of 10 % and 5 %. The reference is launched
``reference_launches`` times and recorded as a baseline (in a scratch
baselines root, with the suite's own ``record_run``), as a user records a
baseline once with many launches; each other group is launched
``launches`` times and judged against it by the suite's own checks, exactly
as a cell run with ``--perf-repeats`` is. A group whose verdict is
"unknown" is launched ``launches`` times more and judged again, up to the
runner's re-measure rounds, as the runner does. Launches take turns (the
reference spread evenly among the groups, the order rotating every round),
so a machine that drifts over minutes drifts under all groups alike.

The figures: how often unchanged code is called "regressed" (false alarms)
and how often a 10 % and a 5 % slowdown are; an "unknown" left after the
last round counts as not caught.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from perfsuite import cells, options
from perfsuite.hardware import git_commit
from perfsuite.judge.baselines import load_all
from perfsuite.judge.checks import WorkCountersUnchanged
from perfsuite.judge.judging import judge, needs_more_launches
from perfsuite.judge.lookup import find_counters
from perfsuite.judge.recording import record_run
from perfsuite.launch.launch import LaunchOptions, run_cell
from perfsuite.rank.faults import CALIBRATION_STEPS, GPU_SLEEP
from perfsuite.results import merge_repeats
from perfsuite.runner import REMEASURE_ROUNDS
from perfsuite.schemas.results import SCHEMA
from perfsuite.stats import launches as launchstats
from perfsuite.stats.windows import WITHIN, within_pair_variance
from perfsuite.system.atomic import atomic_write_json

DEFAULT_CELL = "smoke/image/ddp-ds/c1/fp32/px32/nopin/nchw"
CONDITIONS = {"unchanged": 0.0, "slow 10%": 0.10, "slow 5%": 0.05}
GROUPS = ("reference", *CONDITIONS)
# `perfsuite ab`'s own detection is judged at a tolerance well below the
# changes it must call (5 %, 10 %): a 5 % change at a 5 % tolerance is called
# half the time at best.
AB_TOLERANCE = 0.02


def launch_order(round_: int, groups: tuple[str, ...] = GROUPS,
                 reference_share: int = 1) -> list[str]:
    """One round's launches: every group once (the reference ``reference_share``
    times, spread among the others), rotated so none always follows another."""
    slots = [*groups]
    if "reference" in slots and reference_share > 1:
        others = [g for g in slots if g != "reference"]
        sizes = [len(others) // reference_share + (i < len(others) % reference_share)
                 for i in range(reference_share)]
        starts = np.cumsum([0, *sizes])
        slots = [g for i in range(reference_share)
                 for g in ("reference", *others[starts[i]:starts[i + 1]])]
    k = round_ % len(slots)
    return [*slots[k:], *slots[:k]]


def _step_check(checks: list[dict[str, Any]], result: dict[str, Any]) -> dict[str, Any]:
    for check in checks:
        if check["name"] == "step_time":
            return check
    return {"verdict": f"no step_time check ({result['status']}: {result.get('reason')})"}


def _label(group: str) -> str:
    return group.replace(" ", "").replace("%", "")


class _Launcher:
    """Launches of one trial, kept per group, each in its own directory."""

    def __init__(self, cell: cells.Cell, trial_dir: Path) -> None:
        self.cell, self.trial_dir = cell, trial_dir
        self.launched: dict[str, list[dict[str, Any]]] = {g: [] for g in GROUPS}

    def launch(self, group: str) -> None:
        slowdown = CONDITIONS.get(group, 0.0)
        options = {"fault": f"slow:*:0:{slowdown}"} if slowdown else {}
        index = len(self.launched[group])
        result = run_cell(self.cell, self.trial_dir / _label(group) / f"launch{index}",
                          LaunchOptions(options=options))
        if result["status"] != "ok":
            raise RuntimeError(f"{group} launch {index + 1} of {self.cell.id} ended "
                               f"{result['status']}: {result.get('reason')}; see "
                               f"{self.trial_dir / _label(group)}")
        self.launched[group].append(result)

    def rounds(self, groups: tuple[str, ...], count: int, reference_share: int = 1,
               reference_total: int = 0) -> None:
        for round_ in range(count):
            for group in launch_order(round_, groups, reference_share):
                if group != "reference" or len(self.launched[group]) < reference_total:
                    self.launch(group)


def run_trial(cell: cells.Cell, trial_dir: Path, launches: int,
              environment: dict[str, Any] | None = None, *,
              reference_launches: int | None = None, statistic: str = "floor",
              remeasure_rounds: int = REMEASURE_ROUNDS) -> dict[str, Any]:
    """One trial: interleaved launches, the reference recorded, the rest judged
    (and launched again while their verdict is unknown)."""
    reference_launches = reference_launches or launches
    share = max(1, math.ceil(reference_launches / launches))
    launcher = _Launcher(cell, trial_dir)
    launcher.rounds(GROUPS, launches, share, reference_launches)
    reference = merge_repeats(launcher.launched["reference"])
    root = trial_dir / "baselines"
    record_run({"schema": SCHEMA, "env": environment or reference.get("env", {}),
                "cells": [reference]}, root=root, launch_statistic=statistic)
    sets = load_all(root)
    checks: dict[str, dict[str, Any]] = {}
    pending = tuple(CONDITIONS)
    for round_ in range(remeasure_rounds + 1):
        if round_:
            launcher.rounds(pending, launches)
        for group in pending:
            merged = merge_repeats(launcher.launched[group])
            judged = judge(cell, merged, None, sets, {"trusted": True})
            checks[group] = {**_step_check(judged, merged), "remeasured": round_}
        pending = tuple(g for g in pending if needs_more_launches([checks[g]]))
        if not pending:
            break
    values = {group: launchstats.launch_values([r["metrics"]["step_time"]["samples"] for r in results],
                                   statistic)
              for group, results in launcher.launched.items()}
    return {"checks": checks, "launch_values": values, "statistic": statistic,
            "launches": {group: len(results) for group, results in launcher.launched.items()}}


def launch_spread(values: dict[str, list[float]]) -> float:
    """Standard deviation of log launch values within groups, pooled (the
    slowdown factors removed by centring each group on its own mean)."""
    return launchstats.launch_spread(list(values.values())).log_sd


SETTINGS = ("cell", "steps", "launches", "reference_launches", "statistic")


def _trial_record(trial: int, out: dict[str, Any], seconds: float) -> dict[str, Any]:
    """What one trial leaves in detection.json: enough to rebuild the summary."""
    keep = ("verdict", "ratio", "ci_low", "ci_high", "remeasured", "message")
    return {"trial": trial, "seconds": round(seconds, 1),
            "reference_launch_value_median_ms":
                round(float(np.median(out["launch_values"]["reference"])) * 1e3, 2),
            "launch_spread_log_sd": round(launch_spread(out["launch_values"]), 4),
            "launches": out["launches"],
            "checks": {name: {k: check[k] for k in keep if k in check}
                       for name, check in out["checks"].items()}}


def summarize(settings: dict[str, Any], records: list[dict[str, Any]],
              planned: int) -> dict[str, Any]:
    """The figures over the trials done so far."""
    done = len(records)
    verdicts = {name: Counter(r["checks"][name]["verdict"] for r in records)
                for name in CONDITIONS}
    launch_counts = Counter()
    for record in records:
        launch_counts.update(record["launches"])
    return {
        **settings, "trials": done, "trials_planned": planned,
        "reference_launch_value_median_ms": [r["reference_launch_value_median_ms"]
                                             for r in records],
        "launch_spread_log_sd": [r["launch_spread_log_sd"] for r in records],
        "launches_per_trial": {g: round(n / max(done, 1), 2) for g, n in launch_counts.items()},
        "verdicts": {name: dict(count) for name, count in verdicts.items()},
        "false_alarms": verdicts["unchanged"]["regressed"],
        "caught_10": verdicts["slow 10%"]["regressed"],
        "caught_5": verdicts["slow 5%"]["regressed"],
        "seconds": round(sum(r["seconds"] for r in records), 1),
        "per_trial": records,
    }


def _earlier_trials(path: Path, settings: dict[str, Any], resume: bool,
                   key: str = "per_trial") -> list[dict[str, Any]]:
    """The trials a stopped benchmark left in ``path`` (its list ``key``), if it is to go on."""
    if not path.exists():
        return []
    try:
        saved = json.loads(path.read_text())
        records = saved[key]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path} is not a detection summary this version can continue "
                         f"({err}); choose another --out") from err
    if not resume:
        raise ValueError(f"{path} already holds {len(records)} trial(s); pass --resume to "
                         f"go on with them or choose another --out")
    differ = {k: (saved.get(k), v) for k, v in settings.items() if saved.get(k) != v}
    if differ:
        raise ValueError(f"{path} was measured with other settings "
                         f"({', '.join(f'{k}: {a} there, {b} now' for k, (a, b) in differ.items())}); "
                         f"resume with the same settings or choose another --out")
    return records


def measure_detection(trials: int = 20, cell_id: str = DEFAULT_CELL, steps: int = 40,
                      launches: int = 4, reference_launches: int = 12,
                      statistic: str = "floor", work_dir: Path | None = None,
                      resume: bool = False,
                      log=lambda line: print(line, flush=True)) -> dict[str, Any]:
    """Run trials until ``trials`` are done (counting those a stopped run left
    in ``work_dir`` when ``resume``); detection.json is rewritten after each."""
    cell = cells.get(cell_id).replace(max_steps=steps)
    work = Path(work_dir or tempfile.mkdtemp(prefix="perfsuite-detection-"))
    settings = {"cell": cell.id, "steps": steps, "launches": launches, "perfsuite_commit": git_commit(),
                "reference_launches": reference_launches, "statistic": statistic}
    summary_path = work / "detection.json"
    records = _earlier_trials(summary_path, settings, resume)
    if records:
        log(f"going on from {len(records)} trial(s) in {summary_path}")
    for trial in range(len(records), trials):
        shutil.rmtree(work / f"trial{trial}", ignore_errors=True)  # a stopped trial's launches
        started = time.time()
        out = run_trial(cell, work / f"trial{trial}", launches,
                        reference_launches=reference_launches, statistic=statistic)
        records.append(_trial_record(trial, out, time.time() - started))
        ref = out["launch_values"]["reference"]
        for name, check in out["checks"].items():
            ratio = check.get("ratio")
            interval = (f"ratio {ratio:.3f}, CI {check['ci_low']:.3f}-{check['ci_high']:.3f}"
                        if isinstance(ratio, float) else check.get("message", ""))
            log(f"trial {trial + 1}/{trials} (reference launch {statistic}s median "
                f"{np.median(ref) * 1e3:.1f} ms) {name:<9} -> {check['verdict']} ({interval}; "
                f"{out['launches'][name]} launches vs {out['launches']['reference']})")
        # kept if stopped later: --resume goes on from here
        atomic_write_json(summary_path, {**summarize(settings, records, trials),
                                         "work_dir": str(work)})
    return {**summarize(settings, records, trials), "work_dir": str(work)}


# The work counters' own detection test: injected faults that change what a
# step does (faults.py), each launched once and judged alone.
COUNTER_CONDITIONS = {"unchanged": "", "extra allreduce": "allreduce:*:0",
                      "extra copy": "copy:*:0"}


def measure_counter_detection(trials: int = 20, cell_id: str = DEFAULT_CELL,
                              work_dir: Path | None = None,
                              log=lambda line: print(line, flush=True)) -> dict[str, Any]:
    """One unchanged launch recorded as the baseline; then per trial one
    single launch of each condition judged by the work-counter check, and
    one launch without a counting window (``count_steps=0``) beside an
    unchanged one, for the window's share of a launch's wall time."""
    cell = cells.get(cell_id)
    work = Path(work_dir or tempfile.mkdtemp(prefix="perfsuite-counters-"))
    reference = run_cell(cell, work / "reference", LaunchOptions())
    if reference["status"] != "ok":
        raise RuntimeError(f"reference launch of {cell.id}: {reference.get('reason')}")
    record_run({"schema": SCHEMA, "env": reference["env"], "cells": [reference]},
               root=work / "baselines")
    sets = load_all(work / "baselines")
    verdicts: dict[str, Counter] = {name: Counter() for name in COUNTER_CONDITIONS}
    walls: dict[str, list[float]] = {"counted": [], "bare": []}
    order = [*COUNTER_CONDITIONS, "bare"]
    for trial in range(trials):
        for group in order[trial % len(order):] + order[:trial % len(order)]:
            fault = COUNTER_CONDITIONS.get(group, "")
            options = {"fault": fault} if fault else {}
            if group == "bare":
                options["count_steps"] = "0"
            result = run_cell(cell, work / f"trial{trial}" / _label(group),
                              LaunchOptions(options=options))
            if result["status"] != "ok":
                raise RuntimeError(f"{group} launch of {cell.id}: {result.get('reason')}")
            if group in ("unchanged", "bare"):
                walls["counted" if group == "unchanged" else "bare"].append(
                    result["timeline"]["wall"])
            if group == "bare":
                continue
            found, why = find_counters(cell.params(), result["env"], sets)
            check = WorkCountersUnchanged(found, why).evaluate(result)
            verdicts[group][check.verdict] += 1
            log(f"trial {trial + 1}/{trials} {group:<15} -> {check.verdict}: {check.message[:160]}")
    overhead = float(np.median(walls["counted"]) / np.median(walls["bare"]) - 1.0)
    return {"cell": cell.id, "trials": trials, "work_dir": str(work),
            "verdicts": {k: dict(v) for k, v in verdicts.items()},
            "unchanged_passed": verdicts["unchanged"]["pass"],
            "allreduce_failed": verdicts["extra allreduce"]["fail"],
            "copy_failed": verdicts["extra copy"]["fail"],
            "wall_median_s": {k: round(float(np.median(v)), 2) for k, v in walls.items()},
            "window_overhead": round(overhead, 4)}


def ab_conditions(slowdowns: tuple[float, ...] | None = None) -> dict[str, float]:
    """The A/B benchmark's conditions: side B unchanged, then slowed by each
    fraction of ``slowdowns`` (default: 10 % and 5 %)."""
    if slowdowns is None:
        return dict(CONDITIONS)
    if any(not 0 < s < 1 for s in slowdowns):
        raise ValueError(f"slowdowns {list(slowdowns)}: give fractions between 0 and 1 (0.02 = 2 %)")
    return {"unchanged": 0.0, **{_slow_name(s): s for s in slowdowns}}


def _slow_name(slowdown: float) -> str:
    return f"slow {slowdown * 100:.4g}%"


AB_FAULT_KINDS = options.AB_FAULT_KINDS  # what slows side B: host time, or device time (a CUDA cell's)


def ab_fault(kind: str, cell: cells.Cell, slowdown: float) -> str:
    """Side B's fault option for a slowdown: ``slow`` (host time after every
    step), or ``gpu-sleep`` (device time after every optimizer step, sized
    from the warm-up's steps: perfsuite.rank.faults)."""
    if kind == "slow":
        return f"slow:*:0:{slowdown}"
    if kind == GPU_SLEEP:
        if cell.device != "cuda":
            raise ValueError(f"fault kind gpu-sleep needs a CUDA cell; {cell.id} runs on {cell.device}")
        return f"{GPU_SLEEP}:*:{max(cell.warmup_steps, CALIBRATION_STEPS)}:{slowdown}"
    raise ValueError(f"fault kind {kind!r}: use one of {', '.join(AB_FAULT_KINDS)}")


def run_ab_session(cell: cells.Cell, out_dir: Path, fault: str | None = None, *,
                   tolerance: float = AB_TOLERANCE, max_launches: int = 12, mode: str = "auto",
                   resident: dict[str, int] | None = None) -> dict[str, Any]:
    """One ``perfsuite ab`` session of ``cell`` on this interpreter, side B
    with the workload option ``fault=FAULT`` (None: B unchanged), into
    ``out_dir``: its verdict, interval, smallest detectable change, launches
    and wall time. A session ended by Ctrl-C raises KeyboardInterrupt: a
    benchmark counts only sessions that came to an end."""
    from perfsuite.ab.resident import judged_quads  # torch
    from perfsuite.ab.session import EXIT_INTERRUPTED, ABSession, python_side

    side_b = python_side("B", sys.executable)
    if fault:
        side_b.workload_options = {"fault": fault}
    started = time.time()
    session = ABSession([cell], python_side("A", sys.executable), side_b, out_dir, tolerance=tolerance,
                        max_launches=max_launches, mode=mode, log=lambda line: None, **(resident or {}))
    if session.run() == EXIT_INTERRUPTED:
        raise KeyboardInterrupt
    (judged,) = session.data["cells"]
    quads = [judged_quads(p["windows"]) for p in judged.get("pairs") or []]
    within = within_pair_variance(quads)
    return {"verdict": judged["verdict"], "ratio": judged.get("ratio"),
            # a quad's measured scatter beside what the recorded steps forecast (perfsuite.ab.forecast)
            "quad_sd": round(math.sqrt(within), 6) if within is not None else None,
            "forecast_quad_sd": (judged.get("forecast") or {}).get("quad_sd"),
            # whether a side's windows carried their noise into its next ones (the other's too)
            "serial": judged.get("serial"),
            "ci_low": judged.get("ci_low"), "ci_high": judged.get("ci_high"),
            "detectable": judged.get("detectable"), "confidence": judged.get("confidence"),
            "mode": judged.get("mode"), "pairs": len(judged.get("pairs") or []),
            # what the verdict weighed, so that a stored record can be judged again (its looks)
            "pair_quads": [{"first": p["first"], "quad_log_ratios": d} for p, d in zip(judged.get("pairs") or [], quads)],
            "launches": judged["n_a"] + judged["n_b"], "seconds": round(time.time() - started, 1)}


def session_line(judged: dict[str, Any]) -> str:
    """A session of ``run_ab_session`` in one line."""
    return (f"{judged['verdict']} (ratio {judged['ratio']}, {judged['ci_low']}-{judged['ci_high']}, "
            f"{judged['mode']}, {judged['launches']} launches, {judged['seconds']:.0f} s)")


def measure_ab_detection(trials: int = 20, cell_id: str = DEFAULT_CELL, steps: int = 40,
                         max_launches: int = 12, work_dir: Path | None = None, *,
                         tolerance: float = AB_TOLERANCE, mode: str = "auto",
                         slowdowns: tuple[float, ...] | None = None, resident: dict[str, int] | None = None,
                         fault_kind: str = "slow", resume: bool = False,
                         log=lambda line: print(line, flush=True)) -> dict[str, Any]:
    """``perfsuite ab`` judged on itself: per trial, one A/B session per
    condition, side B the same interpreter with every training step slowed
    by 10 % or 5 % (or ``slowdowns``; or unchanged), judged at ``tolerance``
    (resident windows where the cell allows them, else launch rounds, as
    ``perfsuite ab``; ``resident`` holds its window_steps, quads, max_pairs).
    ``fault_kind`` slows side B by host time (``slow``) or, on a CUDA cell,
    by device time (``gpu-sleep``: ``ab_fault``)."""
    conditions = ab_conditions(slowdowns)
    cell = cells.get(cell_id).replace(max_steps=steps)
    faults = {name: ab_fault(fault_kind, cell, slowdown) for name, slowdown in conditions.items() if slowdown}
    work = Path(work_dir or tempfile.mkdtemp(prefix="perfsuite-ab-detection-"))
    settings = {"cell": cell.id, "tolerance": tolerance, "fault_kind": fault_kind, "mode": mode,
                "perfsuite_commit": git_commit(),  # one version's trials: --resume goes on only at it
                "conditions": list(conditions), "resident": resident or {},
                "within": WITHIN}  # how a pair's error was weighed: a stored trial is judged again so
    # kept as each session ends (a trial cut between its sessions is "partial"):
    # --resume goes on from the sessions a stopped run left
    records = _earlier_trials(work / "ab-detection.json", settings, resume, key="trials")
    kept = records.pop()["conditions"] if records and records[-1].get("partial") else {}
    first = len(records)
    for trial in range(first, trials):
        record: dict[str, Any] = {"trial": trial, "conditions": kept if trial == first else {}}
        for name in (n for n in conditions if n not in record["conditions"]):
            judged = run_ab_session(cell, work / f"trial{trial}" / _label(name), faults.get(name),
                                    tolerance=tolerance, max_launches=max_launches, mode=mode,
                                    resident=resident)
            record["conditions"][name] = judged
            log(f"trial {trial + 1}/{trials} {name:<9} -> {session_line(judged)}")
            done = len(record["conditions"]) == len(conditions)
            atomic_write_json(work / "ab-detection.json", {**settings, "trials": [
                *records, {**record, **({} if done else {"partial": True})}]})
        records.append(record)
    called = {name: Counter(r["conditions"][name]["verdict"] for r in records)
              for name in conditions}
    return {"cell": cell.id, "steps": steps, "max_launches": max_launches, "tolerance": tolerance,
            "mode": mode, "fault_kind": fault_kind, "trials": len(records), "work_dir": str(work),
            "verdicts": {k: dict(v) for k, v in called.items()},
            "false_alarms": called["unchanged"]["regressed"],
            "unchanged_same": called["unchanged"]["same"],
            "caught": {name: called[name]["regressed"] for name in conditions if conditions[name]},
            **({"caught_10": called["slow 10%"]["regressed"], "caught_5": called["slow 5%"]["regressed"]}
               if conditions == CONDITIONS else {}),
            "median_seconds": {name: float(np.median([r["conditions"][name]["seconds"]
                                                      for r in records])) for name in conditions},
            "median_launches": {name: float(np.median([r["conditions"][name]["launches"]
                                                       for r in records])) for name in conditions}}
