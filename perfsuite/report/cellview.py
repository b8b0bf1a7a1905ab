"""Read-only views of cell results for the report: parameters, metrics, twins.

Cells are the dicts of results.json. Twins are matched on the parameters that
change what a step measures; epochs, step caps and timeouts are left out so a
longer accuracy cell still pairs with its short twin (step times are taken
in steady state either way).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

CONFIG_KEYS = ("workload", "strategy", "device", "dataset", "model", "precision", "pin_memory",
               "image_size", "memory_format", "batch_size", "loader_workers", "max_seq_len",
               "world_size")
# Checks whose observed value (with its interval) is the ratio a figure plots.
RATIO_CHECKS = {"precision": "precision_speedup", "pin_memory": "pin_memory_gain"}


def params(cell: Mapping[str, Any]) -> dict[str, Any]:
    return dict(cell.get("params") or {})


def short_id(cell: Mapping[str, Any]) -> str:
    """The id without its tier and workload, for axis labels."""
    parts = str(cell.get("id", "")).split("/")
    return "/".join(parts[2:]) if len(parts) > 2 else str(cell.get("id", ""))


def ok_cells(cells: Iterable[Mapping[str, Any]], workload: str | None = None) -> list[dict]:
    return [dict(c) for c in cells if c.get("status") == "ok"
            and (workload is None or params(c).get("workload") == workload)]


def number(value: Any) -> float | None:
    """A finite float, or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def metric(cell: Mapping[str, Any], name: str, field: str = "value") -> float | None:
    return number(((cell.get("metrics") or {}).get(name) or {}).get(field))


def unit(cell: Mapping[str, Any], name: str) -> str:
    return str(((cell.get("metrics") or {}).get(name) or {}).get("unit") or "")


def config(cell: Mapping[str, Any], without: Iterable[str] = ()) -> tuple:
    """The measurement-defining parameters, minus ``without``, as a hashable key."""
    p, skip = params(cell), set(without)
    return tuple((k, _plain(p.get(k))) for k in CONFIG_KEYS if k not in skip)


def _plain(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def pick(cells: list[dict]) -> dict:
    """One cell among duplicates of a configuration: the one with most step samples."""
    return max(cells, key=lambda c: metric(c, "step_time", "n") or 0)


def series(cells: Iterable[dict], axis: str) -> dict[tuple, dict[Any, dict]]:
    """{configuration without ``axis``: {axis value: cell}}."""
    grouped: dict[tuple, dict[Any, list[dict]]] = {}
    for cell in cells:
        grouped.setdefault(config(cell, (axis,)), {}).setdefault(
            params(cell).get(axis), []).append(cell)
    return {key: {value: pick(found) for value, found in sorted(points.items(),
                                                                 key=lambda kv: str(kv[0]))}
            for key, points in grouped.items()}


def label(key: tuple, differing: Iterable[str]) -> str:
    """A legend label from the parameters that differ between plotted series."""
    values = dict(key)
    parts = []
    for name in differing:
        value = values.get(name)
        if name == "pin_memory":
            parts.append("pin" if value else "nopin")
        elif name == "image_size":
            parts.append(f"{value} px")
        elif name == "world_size":
            parts.append(f"{value} ranks")
        else:
            parts.append(str(value))
    return " ".join(parts) or "all"


def differing(keys: Iterable[tuple], first: Iterable[str] = ()) -> list[str]:
    """Parameters whose value differs among ``keys`` (``first`` ones first)."""
    keys = [dict(k) for k in keys]
    names = [n for n in CONFIG_KEYS if len({repr(k.get(n)) for k in keys}) > 1]
    return [n for n in first if n in names] + [n for n in names if n not in first]


def twin_ratio(cell: dict, twin: dict, quantity: str = "throughput") -> float | None:
    """throughput(cell) / throughput(twin) (a speed-up), or step time ratio."""
    if quantity == "step_time":
        a, b = metric(cell, "step_time"), metric(twin, "step_time")
    else:
        a, b = metric(cell, "throughput"), metric(twin, "throughput")
    return a / b if a and b else None


def check_interval(cell: Mapping[str, Any], name: str) -> tuple[float, float, float] | None:
    """(observed, low, high) of a cell's named check, when it has all three."""
    for check in cell.get("checks") or []:
        if check.get("name") == name:
            values = [number(check.get(k)) for k in ("observed", "ci_low", "ci_high")]
            if all(v is not None for v in values):
                return values[0], values[1], values[2]
    return None


def ratios_to_twin(cells: Iterable[dict], axis: str, reference: Any) -> list[dict[str, Any]]:
    """Cells compared with their twin at ``axis`` = ``reference`` (e.g. precision
    vs fp64): one dict per pair with the ratio and, from the cell's own check
    when present, its confidence interval."""
    cells = list(cells)
    by_key: dict[tuple, list[dict]] = {}
    for cell in cells:
        by_key.setdefault(config(cell, (axis,)), []).append(cell)
    out = []
    for key, group in by_key.items():
        twins = [c for c in group if params(c).get(axis) == reference]
        if not twins:
            continue
        twin = pick(twins)
        for cell in group:
            if params(cell).get(axis) == reference:
                continue
            ratio = twin_ratio(cell, twin)
            interval = check_interval(cell, RATIO_CHECKS.get(axis, ""))
            if interval is not None:
                ratio = interval[0]
            if ratio is None:
                continue
            out.append({"cell": cell, "twin": twin, "key": key, "ratio": ratio,
                        "low": interval[1] if interval else None,
                        "high": interval[2] if interval else None,
                        "value": params(cell).get(axis),
                        "world_size": params(cell).get("world_size")})
    return out


def env_of(cells: Iterable[Mapping[str, Any]], run_env: Mapping[str, Any] | None = None) -> dict:
    for cell in cells:
        if cell.get("env"):
            return dict(cell["env"])
    return dict(run_env or {})


def on_gpu(cells: Iterable[Mapping[str, Any]]) -> bool:
    return any(params(c).get("device") == "cuda" for c in cells)


def hardware_label(cells: Iterable[Mapping[str, Any]], run_env: Mapping[str, Any] | None = None
                   ) -> str:
    """"ours: NVIDIA H100 80GB HBM3 x4, torch 2.x" or "ours: CPU AMD EPYC, 2 cores, torch 2.x"."""
    cells = list(cells)
    env = env_of(cells, run_env)
    torch = f", torch {env['torch']}" if env.get("torch") else ""
    if on_gpu(cells) and env.get("gpu_name"):
        count = f" x{env['gpu_count']}" if env.get("gpu_count") else ""
        return f"ours: {env['gpu_name']}{count}{torch}"
    cores = f", {env['cpu_cores']} cores" if env.get("cpu_cores") else ""
    return f"ours: CPU {env.get('cpu_model') or 'unknown'}{cores}{torch}"
