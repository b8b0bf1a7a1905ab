"""Cell results: rank records aggregated into a cell's result, launches of
one cell merged, and the run's results.json written whole after every cell
(``ResultsFile``). The file's format and the checks against it:
perfsuite.schemas.results.
"""

from __future__ import annotations

import fcntl
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from perfsuite.cells import Cell
from perfsuite.profiling import ProfileSummary, merge_rank_summaries
from perfsuite.rank import counters
from perfsuite.schemas.records import CellResult, RankRecord
from perfsuite.schemas.results import SCHEMA, json_safe
from perfsuite.stats.samples import summary
from perfsuite.system.atomic import atomic_write_json

# How each metric of the ranks becomes the cell's. A data-parallel step ends
# when its slowest rank ends, so step times take the per-step maximum.
_SUM = {"h2d_bytes", "tokens"}
_MAX = {"peak_mem_allocated", "peak_mem_reserved", "peak_rss", "total_time"}
_MIN = {"throughput"}
# Metrics other than step_time with a sample per measured step (LLM cells:
# tokens, time per token): repeated launches keep them apart, like step times.
PER_STEP_SAMPLES = ("time_per_token", "tokens")


def _base(cell: Cell, status: str, reason: str | None) -> CellResult:
    return {"id": cell.id, "params": cell.params(), "status": status, "reason": reason,
            "env": {}, "metrics": {}, "checks": [], "ranks": []}


def skipped_result(cell: Cell, reason: str, partner: bool = False,
                   needs_gpus: tuple[int, int] | None = None) -> CellResult:
    """A cell not measured here, and why. ``needs_gpus``: (needed, present),
    it needs that many GPUs (per node) and the machine has fewer: not run,
    which is no failure of the run (``perfsuite.judge.judging.unjudged``)."""
    result = _base(cell, "skipped", reason)
    if needs_gpus is not None:
        result["needs_gpus"], result["gpus_present"] = needs_gpus
    if partner:  # measured here, reported by another node: not this node's result
        result["partner"] = True
    return result


def _timed(records: list[dict]) -> list[dict]:
    """Ranks that time steps (torchtune's recipes log on rank 0 only)."""
    return [r for r in records if "step_time" in r.get("metrics", {})]


def _step_time(records: list[dict]) -> dict[str, Any]:
    per_rank = [r["metrics"]["step_time"].get("samples", []) for r in _timed(records)]
    steps = min(len(s) for s in per_rank)
    samples = [max(s[i] for s in per_rank) for i in range(steps)]
    stats = summary(samples) if samples else {"n": 0}
    return {"value": stats.get("median", float("nan")), "unit": "s", "samples": samples,
            **stats}


def _merge_metrics(records: list[dict]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    names = [n for r in records for n in r.get("metrics", {})]
    for name in dict.fromkeys(names):
        have = [r["metrics"][name] for r in records if name in r.get("metrics", {})]
        if name == "step_time":
            merged[name] = _step_time(records)
            continue
        values = [m["value"] for m in have]
        if name in _SUM:
            value = sum(values)
        elif name in _MAX:
            value = max(values)
        elif name in _MIN:
            value = min(values)
        else:  # rank 0's view: accuracy, loss, epoch time
            value = values[0]
        merged[name] = {**have[0], "value": value}
    return merged


def _share(seconds: Any, step_s: float) -> float | None:
    return round(seconds / step_s, 4) if isinstance(seconds, (int, float)) and step_s > 0 else None


def gpu_busy(record: dict | None) -> dict[str, float | None]:
    """How busy one rank's GPU was: the device time of a step in its counting
    window (``counters.device_time``: anything the GPU ran, overlaps once; see
    perfsuite.rank.counting) over the median of its timed steps, and the
    host-to-device copies' part of that step. None where either is missing:
    a CPU rank, a rank without a counting window (count_steps=0), a rank
    that times no steps."""
    device_time = ((record or {}).get("counters") or {}).get("device_time") or {}
    samples = (((record or {}).get("metrics") or {}).get("step_time") or {}).get("samples") or []
    step = statistics.median(samples) if samples else 0.0
    return {"gpu_busy_share": _share(device_time.get("per_step_s"), step),
            "h2d_copy_share": _share(device_time.get("memcpy_h2d_s"), step)}


def _least_busy(shares: list[Any]) -> float | None:
    known = [s for s in shares if isinstance(s, (int, float))]
    return min(known) if known else None


def aggregate(cell: Cell, records: list[RankRecord | None], *, status: str, reason: str | None,
              duration_s: float) -> CellResult:
    """One cell result from the rank records (None: the rank wrote none)."""
    result = _base(cell, status, reason)
    result["duration_s"] = duration_s
    result["ranks"] = [{"rank": i, "status": r.get("status") if r else "missing",
                        "steps": r.get("steps") if r else None,
                        "device": r.get("device") if r else None,
                        "host": r.get("host") if r else None,
                        "error": r.get("error") if r else None, **gpu_busy(r)}
                       for i, r in enumerate(records)]
    good = [r for r in records if r and r.get("status") == "ok"]
    if records and records[0]:
        result["env"] = records[0].get("env", {})
    if good and status == "ok":
        steps = {r.get("steps") for r in _timed(good)}
        if len(steps) > 1:  # a data-parallel run must step in lock-step
            result["status"] = "error"
            result["reason"] = f"ranks took different numbers of measured steps: {sorted(steps)}"
        result["metrics"] = _merge_metrics(good)
        result["counters"] = counters.sum_ranks([r.get("counters") for r in good])
        # the least busy GPU: a data-parallel step waits for its slowest rank
        result["gpu_busy_share"] = _least_busy([rank["gpu_busy_share"] for rank in result["ranks"]])
        result["info"] = good[0].get("info", {})
        profiles = [r["profile"] for r in good if r.get("profile")]
        if profiles:
            merged = merge_rank_summaries([ProfileSummary.from_dict(p) for p in profiles])
            result["profile"] = merged.to_dict()
    return result


def merge_repeats(results: list[CellResult]) -> CellResult:
    """One result from R launches of the same cell (``--perf-repeats``).

    Step times keep each launch's samples apart (``step_time.launches``), so a
    verdict can weigh the spread between launches, not only within one; the
    pooled samples and their summary stand for the cell. Other metrics take
    the median over launches, peaks too: the first launch of a session fills
    caches (14 % more peak RSS in one A/B session), and what a launch needs
    is what a comparison asks. A launch that did not
    finish ok is the result: the failure is what the cell reports.
    """
    if len(results) == 1:
        return results[0]
    bad = next((r for r in results if r["status"] != "ok"), None)
    if bad is not None:
        ok = sum(r["status"] == "ok" for r in results)
        return {**bad, "reason": f"launch {results.index(bad) + 1} of {len(results)}: "
                f"{bad.get('reason')} ({ok} launch(es) ok)"}
    merged = {**results[0], "duration_s": sum(r.get("duration_s", 0.0) for r in results),
              "repeats": len(results), "metrics": {},
              "counters": counters.agree_launches([r.get("counters") for r in results])}
    busy = [r["gpu_busy_share"] for r in results if isinstance(r.get("gpu_busy_share"), (int, float))]
    if "gpu_busy_share" in results[0]:
        merged["gpu_busy_share"] = round(float(np.median(busy)), 4) if busy else None
    for name in results[0]["metrics"]:
        have = [r["metrics"][name] for r in results if name in r["metrics"]]
        if name == "step_time":
            launches = [list(m.get("samples", [])) for m in have]
            pooled = [x for launch in launches for x in launch]
            pooled_summary, per_launch = summary(pooled), [summary(launch) for launch in launches]
            merged["metrics"][name] = {
                "value": pooled_summary["median"], "unit": "s", "samples": pooled,
                **pooled_summary, "launches": launches,
                "launch_medians": [s["median"] for s in per_launch],
                "launch_floors": [s["min"] for s in per_launch]}
            continue
        values = [m["value"] for m in have if isinstance(m.get("value"), (int, float))]
        value = float(np.median(values)) if values else None
        merged["metrics"][name] = {**have[0], "value": value}
        if name in PER_STEP_SAMPLES and all(m.get("samples") for m in have):  # apart, as step times
            merged["metrics"][name].update(samples=[x for m in have for x in m["samples"]],
                                           launches=[list(m["samples"]) for m in have])
    return merged


class ResultsFile:
    """The run's results.json, rewritten whole after every cell.

    A crash or Ctrl-C in a later cell therefore keeps every result already
    measured; a rerun of a cell replaces its earlier entry. ``shared``: the
    nodes of a multi-node run write one file, each the cells whose rank 0 it
    ran (either node, as the rendezvous places it): each writes under a lock
    and keeps the cells the others wrote, and a node with none writes nothing.
    """

    def __init__(self, out_dir: Path | str, env: dict[str, Any] | None = None,
                 argv: list[str] | None = None, shared: bool = False) -> None:
        self.path = Path(out_dir) / "results.json"
        self.shared = shared
        self.data: dict[str, Any] = {
            "schema": SCHEMA,
            "run": {"started": time.time(), "finished": None, "argv": argv or []},
            "env": env or {},
            "cells": [],
        }

    def add(self, result: dict[str, Any]) -> None:
        self.data["cells"] = [c for c in self.data["cells"] if c["id"] != result["id"]]
        self.data["cells"].append(result)
        self.write()

    def write(self) -> None:
        self.data["run"]["finished"] = time.time()
        if not self.shared:
            atomic_write_json(self.path, json_safe(self.data))
        elif self.data["cells"]:
            with open(self.path.with_name(".results.json.lock"), "a") as lock:
                try:
                    fcntl.lockf(lock, fcntl.LOCK_EX)  # POSIX locks: held across NFS too
                except OSError:  # a file system without locks (Lustre mounted without them): merged all the same
                    pass
                own = {c["id"]: c for c in self.data["cells"]}
                cells = [own.pop(c["id"], c) for c in self._cells_on_disk()] + list(own.values())
                atomic_write_json(self.path, json_safe({**self.data, "cells": cells}))

    def _cells_on_disk(self) -> list[dict[str, Any]]:
        try:
            cells = json.loads(self.path.read_text())["cells"]
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return []  # none yet (or not one this writer can keep)
        return [c for c in cells if isinstance(c, dict) and "id" in c]
