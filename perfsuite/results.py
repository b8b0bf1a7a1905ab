"""Cell results: rank records aggregated, and the run's results.json.

Schema ``perfsuite.results/1`` (docs/reference/results.md): a run object with its env and a
list of cells; each cell has id, params, status, reason, env, metrics (value,
unit; step_time also samples and their summary) and checks. Its JSON Schema
is ``SCHEMA_FILE``; ``load`` checks every file it reads against it.
"""

from __future__ import annotations

import functools
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from perfsuite.cells import Cell
from perfsuite.rank import counters
from perfsuite.stats.samples import summary
from perfsuite.system.atomic import atomic_write_json

SCHEMA = "perfsuite.results/1"
STATUSES = ("ok", "failed", "error", "timeout", "skipped")
# The JSON Schema (draft 2020-12) of SCHEMA, shipped as package data, for
# other tools to validate results.json with.
SCHEMA_FILE = Path(__file__).resolve().parent / "schemas" / "results.schema.json"
MAX_PROBLEMS = 3  # schema problems a load error lists

# How each metric of the ranks becomes the cell's. A data-parallel step ends
# when its slowest rank ends, so step times take the per-step maximum.
_SUM = {"h2d_bytes", "tokens"}
_MAX = {"peak_mem_allocated", "peak_mem_reserved", "peak_rss", "total_time"}
_MIN = {"throughput"}
# Metrics other than step_time with a sample per measured step (LLM cells:
# tokens, time per token): repeated launches keep them apart, like step times.
PER_STEP_SAMPLES = ("time_per_token", "tokens")


def _base(cell: Cell, status: str, reason: str | None) -> dict[str, Any]:
    return {"id": cell.id, "params": cell.params(), "status": status, "reason": reason,
            "env": {}, "metrics": {}, "checks": [], "ranks": []}


def skipped_result(cell: Cell, reason: str, partner: bool = False,
                   needs_gpus: tuple[int, int] | None = None) -> dict[str, Any]:
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


def aggregate(cell: Cell, records: list[dict | None], *, status: str, reason: str | None,
              duration_s: float) -> dict[str, Any]:
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
            from perfsuite.profiling import ProfileSummary, merge_rank_summaries

            merged = merge_rank_summaries([ProfileSummary.from_dict(p) for p in profiles])
            result["profile"] = merged.to_dict()
    return result


def merge_repeats(results: list[dict[str, Any]]) -> dict[str, Any]:
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


def _json_safe(value: Any) -> Any:
    """NaN and infinities are not JSON: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


class ResultsFile:
    """The run's results.json, rewritten whole after every cell.

    A crash or Ctrl-C in a later cell therefore keeps every result already
    measured; a rerun of a cell replaces its earlier entry.
    """

    def __init__(self, out_dir: Path | str, env: dict[str, Any] | None = None,
                 argv: list[str] | None = None) -> None:
        self.path = Path(out_dir) / "results.json"
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
        atomic_write_json(self.path, _json_safe(self.data))


@functools.lru_cache(maxsize=1)
def _validator() -> Any:
    from jsonschema import Draft202012Validator

    return Draft202012Validator(json.loads(SCHEMA_FILE.read_text(encoding="utf-8")))


def metrics_problem(metrics: dict[str, Any]) -> str | None:
    """What the results schema would refuse in a record's ``metrics`` (a zero
    step time, a unit that is no string), as ``metrics/...: why``; None where
    nothing. Checked in the rank where the record is made, so one workload's
    bad value is its own cell's error, never the whole results.json's."""
    from jsonschema import Draft202012Validator

    schema = {"properties": {"metrics": {"$ref": "#/$defs/metrics"}}, "$defs": _validator().schema["$defs"]}
    errors = sorted(Draft202012Validator(schema).iter_errors({"metrics": _json_safe(metrics)}),
                    key=lambda e: _path_key(e.absolute_path))
    return _problem(errors[0], {}) if errors else None


_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
               type(None): "null", int: "a number", float: "a number"}


def _cell_of(path: Any, data: Any) -> str:
    """`` (cell ID)`` where a JSON path is inside a cell that has an id."""
    path = list(path)
    if path[:1] == ["cells"] and len(path) > 1 and isinstance(path[1], int):
        entry = data["cells"][path[1]]
        if isinstance(entry, dict) and isinstance(entry.get("id"), str) and path[2:] != ["id"]:
            return f" (cell {entry['id']})"
    return ""


def _problem(error: Any, data: Any) -> str:
    """One schema error as ``json/path: message``, a long value cut short."""
    where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
    message = error.message
    if error.validator in ("exclusiveMinimum", "minimum") and "metrics" in error.absolute_path:
        bound = "not above" if error.validator == "exclusiveMinimum" else "below"  # say why, not only the bound
        message = (f"{error.instance!r} is {bound} {error.validator_value}: no ratio or verdict can be made "
                   "of a time, rate or memory size like that")
    if len(message) > 200:
        if error.validator == "type":
            kind = _JSON_TYPES.get(type(error.instance), type(error.instance).__name__)
            expected = error.validator_value
            expected = expected if isinstance(expected, str) else "', '".join(expected)
            message = f"{kind} is not of type '{expected}'"
        else:
            message = message[:160] + " ..."
    return f"{where}: {message}{_cell_of(error.absolute_path, data)}"


def _path_key(where: Any) -> tuple:
    return tuple((0, p, "") if isinstance(p, int) else (1, 0, str(p)) for p in where)


def _non_finite(value: Any, where: tuple = ()) -> Any:
    """(path, value) of every NaN or infinity: Python's JSON reads them, and
    no verdict, ratio or log can be made of them."""
    if isinstance(value, float) and not math.isfinite(value):
        yield where, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _non_finite(item, (*where, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _non_finite(item, (*where, i))


def _beyond_schema(data: Any) -> list[tuple[tuple, str]]:
    """What JSON Schema cannot say: a cell id twice (which result would a
    verdict or a baseline take?), and NaN or infinities (written as null)."""
    out = [(where, f"{'/'.join(map(str, where))}: {json.dumps(value)} is not a finite number "
                   f"(perfsuite writes null where a value is not finite){_cell_of(where, data)}")
           for where, value in _non_finite(data)]
    first: dict[str, int] = {}
    cells = data.get("cells") if isinstance(data, dict) else None
    for i, entry in enumerate(cells if isinstance(cells, list) else []):
        cell_id = entry.get("id") if isinstance(entry, dict) else None
        if isinstance(cell_id, str) and first.setdefault(cell_id, i) != i:
            out.append((("cells", i), f"cells/{i}: id {cell_id!r} repeats cells/{first[cell_id]}; "
                                      "a results.json holds each cell once: keep one of them"))
    return out


def validate(data: Any, path: Path | str = "results.json") -> None:
    """Raise ValueError naming ``path`` and the first problems (JSON path:
    message) when ``data`` is not a valid ``perfsuite.results/1`` document:
    its schema, and what the schema cannot say (``_beyond_schema``)."""
    problems = sorted([(tuple(e.absolute_path), _problem(e, data)) for e in _validator().iter_errors(data)]
                      + _beyond_schema(data),
                      key=lambda p: _path_key(p[0]))
    if not problems:
        return
    lines = [f"{path}: {problem}" for _, problem in problems[:MAX_PROBLEMS]]
    if len(problems) > MAX_PROBLEMS:
        lines.append(f"... and {len(problems) - MAX_PROBLEMS} more problem(s)")
    lines.append(f"{path} does not match the {SCHEMA} schema ({SCHEMA_FILE}): it was edited or "
                 "written by another tool; fix the fields named above, or measure the run again "
                 "(pytest --perf-out DIR, or perfsuite run --out DIR)")
    raise ValueError("\n".join(lines))


def load(path: Path | str) -> dict[str, Any]:
    """A results.json (or a run directory holding one), checked against its
    schema (``SCHEMA_FILE``)."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no results file; run the suite with "
                                "--perf-out DIR first") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(data, dict):
        kind = _JSON_TYPES.get(type(data), type(data).__name__)
        raise ValueError(f"{path}: a JSON {kind.split()[-1]}, expected an object with "
                         f"schema {SCHEMA!r}")
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{path}: schema {data.get('schema')!r}, expected {SCHEMA!r}")
    validate(data, path)
    return data
