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

from perfsuite.stats.samples import median_ratio_interval

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
    """(observed, low, high) of a cell's named check, the interval bounding the
    observed value. A check that compared with a baseline value bounds its
    ratio observed / expected (checks.Verdict): scaled back by ``expected``."""
    for check in cell.get("checks") or []:
        if check.get("name") == name:
            values = [number(check.get(k)) for k in ("observed", "ci_low", "ci_high")]
            if any(v is None for v in values):
                return None
            observed, low, high = values
            expected, ratio = number(check.get("expected")), number(check.get("ratio"))
            if expected and ratio is not None:
                low, high = low * expected, high * expected
            if not low <= observed <= high:  # not an interval of the observed value
                return None
            return observed, low, high
    return None


def sample_ratio_interval(cell: Mapping[str, Any], twin: Mapping[str, Any],
                          confidence: float = 0.95) -> tuple[float, float | None, float | None] | None:
    """throughput(cell) / throughput(twin) with a bootstrap interval from both
    cells' step-time samples, as the cross-cell checks compute it
    (``checks.CrossCellRatio``); (ratio, None, None) when too few samples bound it."""
    # perfsuite.judge.checks (pandas, scipy) only here: perfsuite.report's terminal
    # lines import this module, also after a pytest run whose cells all were skipped.
    from perfsuite.judge.checks import samples_per_step

    def samples(c: Mapping[str, Any]) -> list[float]:
        raw = ((c.get("metrics") or {}).get("step_time") or {}).get("samples") or []
        return [float(x) for x in raw if number(x) is not None and x > 0]

    mine, theirs = samples(cell), samples(twin)
    if not mine or not theirs:
        return None
    factor = samples_per_step(cell) / samples_per_step(twin)
    interval = median_ratio_interval(theirs, mine, factor=factor, confidence=confidence)
    low, high = number(interval.low), number(interval.high)
    if low is None or high is None or low <= 0:
        return interval.estimate, None, None
    return interval.estimate, low, high


def ratio_with_interval(cell: Mapping[str, Any], twin: Mapping[str, Any] | None,
                        check: str = "") -> tuple[float, float | None, float | None] | None:
    """A cell's throughput ratio over its twin with an interval: the named
    check's when the cell has one, else from both cells' step-time samples."""
    found = check_interval(cell, check) if check else None
    if found is not None:
        return found
    if twin is None:
        return None
    from_samples = sample_ratio_interval(cell, twin)
    if from_samples is not None:
        return from_samples
    ratio = twin_ratio(cell, dict(twin))
    return None if ratio is None else (ratio, None, None)


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
            found = ratio_with_interval(cell, twin, RATIO_CHECKS.get(axis, ""))
            if found is None:
                continue
            out.append({"cell": cell, "twin": twin, "key": key, "ratio": found[0],
                        "low": found[1], "high": found[2],
                        "value": params(cell).get(axis),
                        "world_size": params(cell).get("world_size")})
    return out


def accuracy_meaningful(cell: Mapping[str, Any]) -> bool:
    """Whether the cell's accuracy means something: it has an accuracy target
    (``min_accuracy`` > 0; the image workload evaluates its test split only
    then) or says it evaluated a test split. A brief run's accuracy is chance
    level (10 % on ten classes) and reads like a failure."""
    if (number(params(cell).get("min_accuracy")) or 0.0) > 0:
        return True
    info = cell.get("info") or {}
    return bool(info.get("evaluated") or info.get("accuracy_split"))


def shown_accuracy(cell: Mapping[str, Any]) -> float | None:
    """The accuracy to show, or None where it is not meaningful."""
    return metric(cell, "accuracy") if accuracy_meaningful(cell) else None


def pin_memory_inactive(cell: Mapping[str, Any]) -> bool:
    """pin_memory cannot act here: no host-to-device copy (a CPU cell)."""
    effective = (cell.get("info") or {}).get("pin_memory_effective")
    if params(cell).get("pin_memory") and effective is not None:
        return effective is False  # the pinned cell says whether pinning acted
    return params(cell).get("device") != "cuda"


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
