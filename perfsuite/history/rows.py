"""A finished run's results.json, read for the history: refused while it
runs or when it was cut off, its identity (``run_key``), its fingerprint and
software versions, and its cells and metrics as the store's rows.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from perfsuite import options
from perfsuite.history.errors import HistoryError
from perfsuite.schemas.results import SCHEMA, load, validate

# The software a run is measured with: kept apart from the machine's fingerprint.
SOFTWARE_KEYS = ("python", "torch", "torchvision", "torchtune", "torchao", "perfsuite", "cuda",
                 "cudnn", "nccl", "driver", "driver_cuda", "platform")


def read_finished(results_path: Path | str) -> tuple[dict[str, Any], bytes]:
    """A finished run's results.json (checked against its schema) and its
    bytes; HistoryError with the reason for a run still running or cut off."""
    path = Path(results_path)
    if path.is_dir():
        path = path / "results.json"
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise HistoryError(f"{path}: no results file") from None
    except OSError as err:
        raise HistoryError(f"{path}: cannot read it ({err.strerror or err})") from None
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise HistoryError(f"{path}: not valid JSON ({err})") from None
    if isinstance(data, dict):
        run = data.get("run")
        if not isinstance(run, dict) or run.get("finished") is None:
            raise HistoryError(f"{path}: incomplete run: run.finished is missing (still running, or "
                               "stopped before it wrote its end); only finished runs go into the history")
        # Refused, not stored now and replaced later: the run finished with
        # --resume is a new session (its own run.started, so its own run_key),
        # and the partial run stored beside it would count its launches twice.
        status = run.get("status")  # absent in the files of perfsuite before it wrote one
        if status in ("interrupted", "running"):
            how = ("was interrupted (Ctrl-C or SIGTERM)" if status == "interrupted" else
                   "is still running, or its session was killed")
            raise HistoryError(f"{path}: incomplete run: it {how}; finish it first by running it again "
                               f"with --resume into {path.parent} (perfsuite run --resume --out DIR, pytest "
                               "--perf-resume --perf-out DIR), which adds it to the history")
        running = [c.get("id") for c in data.get("cells") or [] if isinstance(c, dict)
                   and c.get("status") == "running"]
        if running:
            raise HistoryError(f"{path}: incomplete run: cell {running[0]} is still 'running'"
                               f"{f' (and {len(running) - 1} more)' if len(running) > 1 else ''}")
        ids = [c.get("id") for c in data.get("cells") or [] if isinstance(c, dict)]
        twice = next((i for n, i in enumerate(ids) if i in ids[:n]), None)
        if twice is not None:  # which of the two would the series take?
            raise HistoryError(f"{path}: cell {twice} appears twice in it; a results.json holds each cell "
                               "once: keep one of them, then add it")
    try:
        if isinstance(data, dict) and data.get("schema") == SCHEMA:
            validate(data, path)
        else:  # not a results.json: load says what it is
            load(path)
    except ValueError as err:
        raise HistoryError(str(err)) from None
    return data, raw


def run_key(data: Mapping[str, Any], raw: bytes) -> str:
    """A run's identity: its start time and cell ids, or the file's bytes."""
    started = (data.get("run") or {}).get("started")
    if started is None:
        return hashlib.sha256(raw).hexdigest()
    ids = sorted(str(c.get("id")) for c in data.get("cells") or [])
    text = json.dumps({"started": started, "cells": ids}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def run_options(data: Mapping[str, Any]) -> dict[str, str]:
    """The workload options (``--option`` / ``--perf-option KEY=VALUE``) the
    run's cells were launched with, as their launch commands carry them."""
    options: dict[str, str] = {}
    for cell in data.get("cells") or []:
        argv = cell.get("argv") if isinstance(cell, dict) else None
        if not isinstance(argv, list):
            continue
        for flag, value in zip(argv, argv[1:]):
            if flag == "--option" and isinstance(value, str) and "=" in value:
                key, _, val = value.partition("=")
                options[key] = val
    return options


def options_of_file(results_path: Path | str, key: str) -> dict[str, str] | None:
    """``run_options`` of a results.json (or its folder) that is still the
    run stored under ``key`` (its run_key); None when it cannot be read or
    now holds another run (an output folder used again, --overwrite)."""
    path = Path(results_path)
    try:
        raw = (path / "results.json" if path.is_dir() else path).read_bytes()
        data = json.loads(raw)
        if not isinstance(data, dict) or run_key(data, raw) != key:
            return None
    except (OSError, ValueError, AttributeError, TypeError):  # unreadable, or not a results.json
        return None
    return run_options(data)


def run_env(data: Mapping[str, Any]) -> dict[str, Any]:
    """The run's fingerprint; the first cell's where the run has none."""
    if data.get("env"):
        return dict(data["env"])
    return next((dict(c["env"]) for c in data.get("cells") or [] if c.get("env")), {})


def software_versions(env: Mapping[str, Any]) -> dict[str, Any]:
    return {k: env.get(k) for k in SOFTWARE_KEYS if env.get(k) is not None}


def finite_number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _numbers(values: Iterable[Any] | None) -> list[float] | None:
    if not values:
        return None
    out = [finite_number(v) for v in values]
    return [v for v in out if v is not None] or None


def json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


_VERDICT_KEYS = ("name", "verdict", "metric", "message", "ratio", "ci_low", "ci_high")


def rows_of_cells(cell_results: list[dict[str, Any]]) -> tuple[list[dict], list[dict]]:
    cell_rows, metric_rows = [], []
    for cell in cell_results:
        cell_rows.append({
            "cell": cell["id"], "status": cell["status"], "reason": cell.get("reason"),
            "repeats": cell.get("repeats"), "counters": json_safe(cell.get("counters")),
            "verdicts": [json_safe({k: c.get(k) for k in _VERDICT_KEYS if k in c})
                         for c in cell.get("checks") or []]})
        for name, metric in (cell.get("metrics") or {}).items():
            if not isinstance(metric, dict):
                continue
            launches = None
            if metric.get("launch_medians"):
                launches = {"medians": _numbers(metric.get("launch_medians")),
                            "floors": _numbers(metric.get("launch_floors"))}
            n = metric.get("n")
            metric_rows.append({
                "cell": cell["id"], "metric": name, "unit": metric.get("unit"),
                "value": finite_number(metric.get("value")), "median": finite_number(metric.get("median")),
                "n": n if isinstance(n, int) and not isinstance(n, bool) else None,
                "iqr": finite_number(metric.get("iqr")), "min": finite_number(metric.get("min")),
                "launches": launches})
    return cell_rows, metric_rows


# What each launch of a step time contributes to a run's point (as for
# ``perfsuite ab``): "median", its median step, or "floor", its fastest step.
LAUNCH_STATISTICS, DEFAULT_LAUNCH_STATISTIC = options.LAUNCH_STATISTICS, options.DEFAULT_LAUNCH_STATISTIC


def launch_key(metric: str, statistic: str) -> str:
    """Which of a metric's stored launch values a series takes: floors only
    for step times (other metrics keep no launches of their own)."""
    return "floors" if statistic == "floor" and metric == "step_time" else "medians"


def run_value(value: float | None, launches: Mapping[str, Any] | None, *, metric: str = "step_time",
              statistic: str = DEFAULT_LAUNCH_STATISTIC, minimum: float | None = None) -> float | None:
    """A run's point in a series. A step time launched more than once: the
    median over its launches of each one's floor (fastest step) or median
    (a noisy launch moves it least); launched once: its floor (the samples'
    minimum) or its value. Another metric: its value."""
    per_launch = (launches or {}).get(launch_key(metric, statistic)) or []
    if len(per_launch) >= 2:
        return float(np.median(per_launch))
    if launch_key(metric, statistic) == "floors" and finite_number(minimum) is not None:
        return finite_number(minimum)
    return finite_number(value)

