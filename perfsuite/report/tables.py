"""results.json as flat tables: results.csv (one row per cell and metric) and
checks.csv (one row per cell and check), for spreadsheets and pandas.

A cell without metrics (skipped, error, timeout) still gets one row, with an
empty metric, so its status and reason are not lost in the CSV.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from perfsuite.system.atomic import atomic_write_text

PARAM_COLUMNS = ("tier", "workload", "strategy", "device", "world_size", "precision",
                 "pin_memory", "image_size", "memory_format", "dataset")
RESULT_COLUMNS = ("id", *PARAM_COLUMNS, "status", "reason", "metric", "value", "unit", "median",
                  "iqr", "p10", "p90", "n")
CHECK_COLUMNS = ("id", "name", "verdict", "metric", "observed", "expected", "unit", "ratio",
                 "ci_low", "ci_high", "confidence", "tolerance", "p_value", "baseline", "message")
_SUMMARY = ("median", "iqr", "p10", "p90", "n")


def _cells(results: Mapping[str, Any] | list) -> list[dict]:
    return list(results) if isinstance(results, list) else list(results.get("cells", []))


def _head(cell: Mapping[str, Any]) -> dict[str, Any]:
    params = cell.get("params") or {}
    return {"id": cell.get("id"), **{k: params.get(k) for k in PARAM_COLUMNS},
            "status": cell.get("status"), "reason": cell.get("reason")}


def _scalar(value: Any) -> Any:
    """Numbers and text stay; anything else (lists, dicts) is written as text."""
    return value if value is None or isinstance(value, (int, float, str, bool)) else str(value)


def results_frame(results: Mapping[str, Any] | list) -> pd.DataFrame:
    """One row per cell x metric, in the order of results.json."""
    rows = []
    for cell in _cells(results):
        head = _head(cell)
        metrics = cell.get("metrics") or {}
        if not metrics:
            rows.append(head)
        for name, data in metrics.items():
            data = data if isinstance(data, Mapping) else {"value": data}
            rows.append({**head, "metric": name, "value": _scalar(data.get("value")),
                         "unit": data.get("unit"),
                         **{k: _scalar(data.get(k)) for k in _SUMMARY}})
    return pd.DataFrame(rows, columns=list(RESULT_COLUMNS))


def checks_frame(results: Mapping[str, Any] | list) -> pd.DataFrame:
    """One row per cell x check (sanity, baseline and cross-cell checks alike)."""
    rows = [{"id": cell.get("id"), **{k: _scalar(check.get(k)) for k in CHECK_COLUMNS[1:]}}
            for cell in _cells(results) for check in cell.get("checks") or []]
    return pd.DataFrame(rows, columns=list(CHECK_COLUMNS))


def _write(frame: pd.DataFrame, path: Path | str) -> Path:
    path = Path(path)
    atomic_write_text(path, frame.to_csv(index=False, lineterminator="\n"))
    return path


def write_results_csv(results: Mapping[str, Any] | list, path: Path | str) -> Path:
    return _write(results_frame(results), path)


def write_checks_csv(results: Mapping[str, Any] | list, path: Path | str) -> Path:
    return _write(checks_frame(results), path)
