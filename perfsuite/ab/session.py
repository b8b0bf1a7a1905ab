"""A/B: two versions of the training stack, interleaved on one machine in one session.

One launch of each version cannot tell a change from drift: identical
launches on the shared 2-core VM had medians 82-131 ms minutes apart, so
"before" measured on Monday and "after" on Tuesday mostly compares Mondays
with Tuesdays. Two ways to interleave, both A B B A so that a machine that
drifts drifts under both alike and neither side always goes first:

- resident (where the cell allows it: perfsuite.ab.resident): one launch
  of each side kept up, windows of a few steps alternated between them
  seconds apart, judged from the quads' log-ratios over at least two such
  launch pairs (perfsuite.stats.windows); looked at where the orders weigh alike (``look_pairs``);
- launch rounds (any cell): whole launches in turns, each launch one
  observation (``launchstats.compare_launches``), judged after every round.

Either stops as soon as the verdict is decided, or at a cap with "unknown"
and what would decide it. Every decided or capped cell also says the
smallest change its scatter could resolve at the session's confidence
(``detectable``: its interval's half-width as a ratio, ``detectable_change``).
A CUDA cell's two resident sides share its GPU as its memory plan says
(``resident.plan_memory``: plainly, releasing their cache when parked, or
launch rounds where they cannot share it). The sides: perfsuite.ab.sides. Every other check
(memory, accuracy, work counters: ``comparing.compare_runs``) also compares A with B.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from perfsuite.ab.attributing import attribute_cell, check_attribute, session_line, wanted
from perfsuite.ab.forecast import cell_forecast, forecast_line
from perfsuite.ab.resident import (
    LAUNCH_ROUNDS,
    MemoryPlan,
    choose_plan,
    judged_quads,
    pairs_serial,
    plan_memory,
    resident_refusal,
    run_pair,
)
from perfsuite.ab.settings import (  # noqa: F401 - ab's face for its callers
    MIN_PAIRS,
    check_resident_cells,
    check_resident_settings,
    check_settings,
)
from perfsuite.ab.sides import (  # noqa: F401 - ab's face for its callers
    BASE_SITE_PTH,
    IMPORT_CHECK,
    ABError,
    Side,
    _run,
    check_interpreter,
    check_workload_options,
    checkout_side,
    launch_settings,
    parse_env,
    parse_options,
    python_side,
    side_imports,
)
from perfsuite.ab.stopping import deferred_interrupts, is_full, side_failed
from perfsuite.ab.verdicts import (  # noqa: F401 - ab's face for its callers
    DECIDED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_REGRESSED,
    EXIT_UNDECIDED,
    EXIT_USAGE,
    ORDER,
    check_room,
    exit_code,
    finite,
    interval,
    load_accepted,
    look_confidence,
    look_pairs,
    pair_failure,
    pair_look_confidence,
    resident_settings,
    summary_line,
    undecided_reason,
    undecided_rounds_reason,
)
from perfsuite.cells import Cell
from perfsuite.judge.comparing import compare_runs
from perfsuite.launch.launch import LaunchOptions, run_cell
from perfsuite.options import AB_MODES as MODES  # noqa: F401 - ab's face for its callers
from perfsuite.options import AUTO_QUADS, DEFAULT_LAUNCH_STATISTIC, DEFAULT_MAX_PAIRS, DEFAULT_QUADS, DEFAULT_WINDOW_STEPS
from perfsuite.report.ab import write_ab_reports
from perfsuite.results import merge_repeats
from perfsuite.schemas.records import ABRecord
from perfsuite.schemas.results import SCHEMA as RESULTS_SCHEMA
from perfsuite.stats import launches as launchstats
from perfsuite.stats.samples import DEFAULT_CONFIDENCE, DEFAULT_TOLERANCE
from perfsuite.stats.windows import compare_windows, detectable_change, pair_estimate
from perfsuite.system.atomic import atomic_write_json

SCHEMA = "perfsuite.ab/1"
# A side. Resampled launch floors of the 2-core VM: 10 a side caught a 10 %
# slowdown 95 % of the time (stats module docstring).
DEFAULT_MAX_LAUNCHES = 12
class ABSession:
    """Every cell launched on both sides in ABBA rounds until decided; ab.json
    is rewritten after every launch and every resident window, so a crash or
    Ctrl-C loses nothing measured. It says ``interrupted: true`` until the
    session ends in order (a session killed outright stays so)."""

    def __init__(self, cells: list[Cell], side_a: Side, side_b: Side, out_dir: Path | str, *,
                 tolerance: float = DEFAULT_TOLERANCE, statistic: str = DEFAULT_LAUNCH_STATISTIC,
                 max_launches: int = DEFAULT_MAX_LAUNCHES, argv: list[str] | None = None,
                 launch: LaunchOptions | None = None, mode: str = "auto",
                 window_steps: int = DEFAULT_WINDOW_STEPS, quads: int = DEFAULT_QUADS,
                 max_pairs: int = DEFAULT_MAX_PAIRS, attribute: str = "never",
                 log: Callable[[str], None] = lambda line: print(line, flush=True)) -> None:
        check_settings(tolerance, statistic, max_launches)
        check_resident_settings(mode, window_steps, quads, max_pairs)
        check_resident_cells(mode, cells, launch)
        self.attribute, self.attribution_s = check_attribute(attribute), 0.0  # bisect, selftests: "never"
        self.mode, self.window_steps, self.quads, self.max_pairs = mode, window_steps, quads, max_pairs
        self.cells, self.sides = list(cells), {"A": side_a, "B": side_b}
        self.launch = launch  # both sides launch with it, each by its own interpreter and env
        self.out_dir = Path(out_dir).resolve()
        self.path = self.out_dir / "ab.json"
        self.tolerance, self.statistic, self.max_launches = tolerance, statistic, max_launches
        self.log, self.accepted = log, load_accepted()  # perfsuite-accept.toml, refused before a launch
        self.data: ABRecord = {
            "schema": SCHEMA, "started": time.time(), "finished": None, "argv": argv or [],
            "settings": {"tolerance": tolerance, "confidence": DEFAULT_CONFIDENCE,
                         "look_confidence": look_confidence(max_launches),
                         "launch_statistic": statistic, "max_launches": max_launches, "attribute": attribute,
                         "min_launches": launchstats.MIN_LAUNCHES, "order": ORDER,
                         "launch": launch_settings(launch), "mode": mode,
                         "resident": resident_settings(window_steps, quads, max_pairs),
                         "sides": {s.name: asdict(s) for s in (side_a, side_b)}},
            "cells": [], "interrupted": True, "exit_code": None}

    def run(self) -> int:
        """Measure every cell; the exit code (see ``exit_code``, 130 on Ctrl-C)."""
        if self.mode != "launches":
            quads = "as many ABBA quads as each cell's forecast asks" if self.quads == AUTO_QUADS else (
                f"{self.quads} ABBA quads")
            self.log(f"resident windows where a cell allows them: ratio = B / A of {self.window_steps}-step "
                     f"windows' medians (> 1: B slower), {quads} a launch pair, "
                     f"{MIN_PAIRS}-{self.max_pairs} pairs; tolerance ±{self.tolerance:.0%}")
        if self.mode != "resident":
            self.log(f"launch rounds otherwise: ratio = B / A of launch {self.statistic}s; "
                     f"tolerance ±{self.tolerance:.0%}; up to {self.max_launches} launches a side")
        record = None
        try:
            for i, cell in enumerate(self.cells, 1):
                self.log(f"[{i}/{len(self.cells)}] {cell.id}")
                record = {"id": cell.id, "verdict": None, "reason": None, "ratio": None,
                          "ci_low": None, "ci_high": None, "detectable": None, "n_a": 0, "n_b": 0,
                          "memory": None, "launches": [], "rounds": [], "checks": []}
                self.data["cells"].append(record)
                results = self._measure(cell, record)
                self._other_checks(record, results)
                self.log(summary_line(self.accepted.judge(record, self.sides["A"].commit)))
                if record["verdict"] == "unknown":
                    self.log(f"    {record['reason']}")
                for check in record["checks"]:
                    if check["verdict"] not in ("same", "pass", "skipped"):
                        self.log(f"    {check['name']}  {check['verdict'].upper()}  {check.get('message', '')}")
                if wanted(record["verdict"], self.attribute):  # after the timing: nothing judged is profiled
                    attribute_cell(self, cell, record, run_cell)
            if self.attribution_s:
                self.log(session_line(self.attribution_s, time.time() - self.data["started"]))
            code = exit_code(self.data["cells"])
        except KeyboardInterrupt:
            if record is not None and record["verdict"] is None:
                record.update(verdict="interrupted", reason="Ctrl-C or SIGTERM during this cell")
            code = EXIT_INTERRUPTED
        except OSError as err:  # --out full, or not writable: said once, the session stopped
            said = self._no_room(err)
            if record is not None and record["verdict"] in (None, *DECIDED, "unknown"):
                record.update(verdict="error", reason=said)
            code = EXIT_USAGE
        self.data.update(exit_code=code, interrupted=code == EXIT_INTERRUPTED)
        with deferred_interrupts():  # a Ctrl-C now would only lose what is being written
            self._finish()
        return code

    def write(self) -> None:
        self.data["finished"] = time.time()
        atomic_write_json(self.path, self.data)

    def _no_room(self, err: OSError) -> str:
        where = err.filename or self.out_dir
        said = (f"perfsuite ab: cannot write {where}: {err.strerror or err}; the session stopped, and "
                f"{self.path} keeps every window and launch measured until then"
                + ("; free some space there (or choose another --out) and run it again" if is_full(err) else ""))
        self.log(said)
        return said

    def _finish(self) -> None:
        """ab.json and the reports, each where there is room, or said why not."""
        try:
            self.write()
            self.log(f"ab.json: {self.path}")
        except OSError as err:
            kept = "keeps the session as of its last write" if self.path.exists() else "was never written"
            self.log(f"ab.json: not written ({err.strerror or err}); {self.path} {kept}")
        try:
            for name, path in write_ab_reports(self.data, self.out_dir).items():
                self.log(f"{name}: {path}")
        except OSError as err:
            self.log(f"ab.html: not written ({err.strerror or err}: {err.filename or self.out_dir})")

    def _measure(self, cell: Cell, record: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
        """Resident windows where the cell (and its GPU's memory) allows them,
        else ABBA rounds of launches."""
        refusal = (resident_refusal(cell, self.launch) if self.mode != "launches"
                   else "launch rounds asked for (--mode launches)")
        plan = plan_memory(cell, self.launch) if refusal is None else None
        if plan is not None:
            self._plan(record, plan)
            if plan.plan == LAUNCH_ROUNDS:
                refusal = f"memory: {plan.reason}"
        record.update(mode="resident" if refusal is None else "launches", mode_reason=refusal)
        if refusal is None:
            record["forecast"] = cell_forecast(cell, self.window_steps, self.quads, self.max_pairs, self.tolerance)
            self.log(f"  {forecast_line(record['forecast'], self.tolerance)}")
            results = self._measure_resident(cell, record, plan, record["forecast"]["quads"])
            if record.get("memory") is None or record["memory"]["plan"] != LAUNCH_ROUNDS:
                return results
            refusal = f"memory: {record['memory']['reason']}"  # the first side left too little
            record.update(mode="launches", mode_reason=refusal, pairs=[])
        if self.mode == "resident":
            record.update(verdict="error", reason=f"--mode resident: {refusal}")
            self.write()
            return {"A": [], "B": []}
        self.log(f"  launch rounds: {refusal}")
        return self._measure_launches(cell, record)

    def _plan(self, record: dict[str, Any], plan: MemoryPlan) -> None:
        """The memory plan said and kept, where it is new or changed."""
        if record.get("memory") != plan.to_dict():
            record["memory"] = plan.to_dict()
            self.log(f"  {plan.line()}")
            self.write()

    def _measure_resident(self, cell: Cell, record: dict[str, Any], plan: MemoryPlan | None,
                          quads: int) -> dict[str, list[dict[str, Any]]]:
        """Launch pairs, both sides resident in each, until the verdict over the pairs is decided.
        A pair whose second side would not fit beside the first turns the cell's plan to launch rounds."""
        results: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
        record["pairs"], quads_by_pair = [], []
        confidence, looks = pair_look_confidence(self.max_pairs), look_pairs(self.max_pairs)
        for pair in range(1, self.max_pairs + 1):
            # Work counters are exact: the first pair's launches count them, the others need not.
            opts = {name: self._pair_options(side, pair) for name, side in self.sides.items()}
            dirs = {name: self.out_dir / "launches" / side.label / f"pair{pair}"
                    for name, side in self.sides.items()}
            started = time.time()
            # Which side starts first alternates, as every round's lead does:
            # the second launch comes up beside a resident first one.
            first = ORDER[(pair - 1) % 2]
            # Its windows kept as they end, until the pair is whole (then in "pairs").
            measuring: dict[str, Any] = {"pair": pair, "first": first, "windows": []}
            record.setdefault("partial_pairs", []).append(measuring)
            try:
                run = run_pair(cell, opts, dirs, quads=quads, window_steps=self.window_steps,
                               first=first, release=plan is not None and plan.release,
                               need_bytes=plan.need_bytes if plan is not None else None,
                               on_window=lambda window, m=measuring: self._window(m, window))
            except BaseException as err:
                measuring["ended"] = "interrupted" if isinstance(err, KeyboardInterrupt) else str(err)
                _settle(record, measuring, keep=True)
                raise
            failed, failure = pair_failure(run)
            _settle(record, measuring, keep=failure is not None)
            if run.short:
                peak = max((float(r.get("peak_reserved") or 0) for r in run.memory.get(first, [])),
                           default=None)
                self._plan(record, MemoryPlan(LAUNCH_ROUNDS, peak or (plan.peak_reserved if plan else None),
                                              plan.device_total if plan else None,
                                              f"side {first}'s warm-up in pair {pair}", run.short))
                return {"A": [], "B": []}
            for name in ORDER[:2]:
                result = run.results.get(name)
                if result is not None and failed is not None and name != failed and result["status"] != "ok":
                    result = {**result, "reason": f"ended with the pair (side {failed} failed): {result['reason']}"}
                if result is not None:
                    self._file_launch(self.sides[name], pair, result, started, record)
                check_room(result)
            if failure is not None:
                measuring["ended"] = failure
                self._stopped(record, run.results.get(failed or "") or {"status": "error"}, pair == 1,
                              f"pair {pair}: {failure}")
                return results
            for name in ORDER[:2]:
                results[name].append(run.results[name])
            quads_by_pair.append(judged_quads(run.windows))
            own = pair_estimate(quads_by_pair[-1])
            memory = _pair_memory(run.memory)
            record["pairs"].append({"pair": pair, "first": first, "quads": own.quads,
                                    "ratio": finite(own.ratio),
                                    "ci_low": finite(own.ci_low), "ci_high": finite(own.ci_high),
                                    "ready_s": run.ready_s, "windows": run.windows,
                                    **({"memory": memory} if memory else {})})
            if plan is not None and plan.peak_reserved is None and memory:  # now measured: plan again
                measured = choose_plan(max(m["peak_reserved"] for m in memory.values()), plan.device_total,
                                       f"the sides' warm-up in pair {pair}",
                                       parked=max(m["parked"] for m in memory.values()) if plan.release else None)
                if measured.plan == LAUNCH_ROUNDS:  # and yet it ran: go on as it did, each pair checked
                    measured = replace(measured, plan=plan.plan, reason=(
                        f"{measured.reason}; yet pair {pair} ran, its caches emptied when parked: the next "
                        "pairs run so too, each second side started only where it fits"))
                plan = measured
                self._plan(record, plan)
            self.log(f"  pair {pair}: {own.quads} quads, ratio {own.ratio:.4g} "
                     f"(95 % CI {own.ci_low:.4g}-{own.ci_high:.4g}); ready after {run.ready_s or 0:.1f} s")
            if pair not in looks:
                self.write()
                continue
            cmp = compare_windows(quads_by_pair, self.tolerance, confidence, min_pairs=MIN_PAIRS,
                                  firsts=[p["first"] for p in record["pairs"]])
            record.update(verdict=cmp.verdict, ratio=finite(cmp.ratio), ci_low=finite(cmp.ci_low),
                          ci_high=finite(cmp.ci_high), detectable=cmp.detectable,
                          confidence=confidence, method=cmp.method,
                          quads=cmp.quads, tau2=cmp.tau2, heterogeneity_p=cmp.heterogeneity_p, dof=cmp.dof,
                          order_effect=cmp.order_effect, reason=cmp.reason or None,
                          serial=pairs_serial(record["pairs"]))  # regimes of a process, or the machine's
            self.write()
            self.log(f"  after pair {pair}: {cmp.verdict.upper()}  {interval(record)}")
            if cmp.verdict in DECIDED:
                return results
        record["reason"] = undecided_reason(record, quads_by_pair, self.tolerance, quads, self.max_pairs)
        self.write()
        return results

    def _window(self, measuring: dict[str, Any], window: dict[str, Any]) -> None:
        measuring["windows"].append(window)
        self.write()

    def _stopped(self, record: dict[str, Any], result: dict[str, Any], first: bool, failed: str) -> None:
        """A cell stopped by a launch: ``skipped`` where its first launches
        skipped it (no GPU, no data), else an error saying ``failed``."""
        skipped = result["status"] == "skipped" and first
        record.update(verdict="skipped" if skipped else "error",
                      reason=result.get("reason") if skipped else failed)
        self.write()

    def _pair_options(self, side: Side, pair: int) -> LaunchOptions:
        opts = side.options(self.launch)
        return opts if pair == 1 else replace(opts, options={**opts.options, "count_steps": "0"})

    def _measure_launches(self, cell: Cell, record: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
        """ABBA rounds until the verdict is decided, the cap, or a failed launch."""
        results: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
        for round_ in range(1, self.max_launches // 2 + 1):
            for name in ORDER:
                result = self._launch(cell, self.sides[name], len(results[name]) + 1, record)
                check_room(result)
                if result["status"] != "ok":
                    self._stopped(record, result, not any(results.values()),
                                  side_failed(name, result, launch=f" launch {len(results[name]) + 1}"))
                    return results
                results[name].append(result)
            if self._judge(round_, results, record) in DECIDED:
                return results
        record["reason"] = undecided_rounds_reason([_launches(rs) for rs in results.values()], self.statistic,
                                                   self.max_launches, self.tolerance)
        self.write()
        return results

    def _launch(self, cell: Cell, side: Side, index: int, record: dict[str, Any]) -> dict[str, Any]:
        started = time.time()
        result = run_cell(cell, self.out_dir / "launches" / side.label / f"launch{index}",
                          side.options(self.launch))
        return self._file_launch(side, index, result, started, record)

    def _file_launch(self, side: Side, index: int, result: dict[str, Any], started: float,
                     record: dict[str, Any]) -> dict[str, Any]:
        samples = result.get("metrics", {}).get("step_time", {}).get("samples") or []
        value = launchstats.launch_values([samples], self.statistic)[0] if samples else None
        record["launches"].append({
            "side": side.name, "index": index, "started": started,
            "duration_s": round(time.time() - started, 3), "status": result["status"],
            "reason": result.get("reason"), "value": value, "samples": samples,
            "dir": result.get("dir")})
        record[f"n_{side.label}"] = index if result["status"] == "ok" else index - 1
        self.write()
        shown = f"{value * 1e3:.4g} ms" if value is not None else result["status"].upper()
        self.log(f"  {side.name} {index:<3} {shown}  ({record['launches'][-1]['duration_s']:.1f} s)"
                 + (f"  {result.get('reason')}" if result["status"] != "ok" else ""))
        return result

    def _judge(self, round_: int, results: dict[str, list[dict[str, Any]]],
               record: dict[str, Any]) -> str | None:
        """The round's verdict once both sides have enough launches."""
        n_a, n_b = len(results["A"]), len(results["B"])
        if min(n_a, n_b) < launchstats.MIN_LAUNCHES:
            self.log(f"  round {round_}: {n_b} vs {n_a} launches; a verdict weighs "
                     f"{launchstats.MIN_LAUNCHES} a side")
            return None
        cmp = launchstats.compare_launches(_launches(results["B"]), _launches(results["A"]),
                                           self.tolerance, look_confidence(self.max_launches),
                                           statistic=self.statistic)
        verdict = {"verdict": cmp.verdict, "ratio": finite(cmp.ratio),
                   "ci_low": finite(cmp.ci_low), "ci_high": finite(cmp.ci_high),
                   "detectable": detectable_change(cmp.ci_low, cmp.ci_high),
                   "confidence": cmp.confidence, "p_value": finite(cmp.p_value),
                   "n_a": n_a, "n_b": n_b, "method": cmp.method}
        record["rounds"].append({"round": round_, **verdict})
        record.update(verdict)
        self.write()
        self.log(f"  round {round_}: {cmp.verdict.upper()}  {interval(verdict)}, "
                 f"{n_b} vs {n_a} launches")
        return cmp.verdict

    def _other_checks(self, record: dict[str, Any], results: dict[str, list[dict[str, Any]]]) -> None:
        """compare_runs over both sides' launches: every check but step time,
        whose verdict the rounds gave."""
        if record["verdict"] not in (*DECIDED, "unknown"):
            return
        runs = [{"schema": RESULTS_SCHEMA, "env": merged.get("env", {}), "cells": [merged]}
                for merged in (merge_repeats(results["A"]), merge_repeats(results["B"]))]
        record["checks"] = [entry for entry in compare_runs(
            *runs, tolerance=self.tolerance, launch_statistic=self.statistic)
            if entry["name"] != "step_time"]
        self.write()


def _settle(record: dict[str, Any], measuring: dict[str, Any], keep: bool) -> None:
    """A pair's windows stay in ``partial_pairs`` where it did not end whole
    (and measured any); a whole pair's are in ``pairs``."""
    if not keep or not measuring["windows"]:
        record["partial_pairs"].remove(measuring)
    if not record["partial_pairs"]:
        del record["partial_pairs"]


def _pair_memory(told: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Each side's peak reserved bytes and what it held parked, over its ranks
    (their last word), from what the ranks of a CUDA cell said."""
    return {side: {"peak_reserved": max(float(r.get("peak_reserved") or 0) for r in ranks),
                   "parked": max(float(r.get("reserved") or 0) for r in ranks)}
            for side, ranks in sorted(told.items()) if ranks}


def _launches(results: list[dict[str, Any]]) -> list[list[float]]:
    return [r["metrics"]["step_time"]["samples"] for r in results]
