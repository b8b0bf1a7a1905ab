"""Work counters as data: merged over ranks and launches, and compared.

Counted in the rank by ``perfsuite.rank.counting`` (torch); everything here is
plain numbers, so results, baselines and checks can use it without torch.
A counter is exact for a code path: any difference is a change of what a
training step does, except for the counters named in ``INEXACT`` (allocator
state moves them a little), which have a relative tolerance. Times (GPU
seconds per step, ``device_time``) travel beside the counts and are never
judged as counts: they are a measurement, not a property of the code path.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Counters that are not exact from run to run, with the tolerance they get.
INEXACT = {"memory/peak_allocated": 0.05}
# Per-step keys that are times, not counts (a step's GPU seconds on their way to ``device_time``).
TIMES = ("device_time/",)


def is_time(key: str) -> bool:
    return key.startswith(TIMES)


def exact(key: str) -> bool:
    return key not in INEXACT and not is_time(key)


def mean_times(parts: list[Mapping[str, float] | None]) -> dict[str, float] | None:
    """GPU seconds per step of several ranks or launches: their mean (each rank
    drives its own GPU, so the mean is one GPU's); None where none has any."""
    have = [p for p in parts if p]
    if not have:
        return None
    return {k: sum(p.get(k, 0.0) for p in have) / len(have) for k in sorted({k for p in have for k in p})}


def sum_ranks(per_rank: list[Mapping[str, Any] | None]) -> dict[str, Any] | None:
    """The cell's counters: each rank's per-step counts summed over ranks (a
    change on any rank shows); a counter unstable on any rank is unstable."""
    have = [c for c in per_rank if c]
    if not have:
        return None
    per_step: dict[str, float] = {}
    for rank in have:
        for key, value in rank["per_step"].items():
            per_step[key] = per_step.get(key, 0) + value
    return {"window_steps": min(c["window_steps"] for c in have), "ranks": len(have),
            "per_step": dict(sorted(per_step.items())),
            "unstable": sorted({k for c in have for k in c.get("unstable", [])}),
            "device_time": mean_times([c.get("device_time") for c in have])}


def agree_launches(per_launch: list[Mapping[str, Any] | None]) -> dict[str, Any] | None:
    """One launch's counters for R launches of a cell; an exact counter that
    differs between launches is unstable (the path depends on more than the cell)."""
    have = [c for c in per_launch if c]
    if not have:
        return None
    first = have[0]
    moved = {k for c in have[1:] for k in set(c["per_step"]) | set(first["per_step"])
             if exact(k) and c["per_step"].get(k) != first["per_step"].get(k)}
    return {**first, "unstable": sorted(set(first.get("unstable", [])) | moved),
            "device_time": mean_times([c.get("device_time") for c in have])}


@dataclass(frozen=True)
class Change:
    key: str
    old: float
    new: float

    @property
    def delta(self) -> float:
        return self.new - self.old


def diff(new: Mapping[str, float], base: Mapping[str, float],
         tolerance: Mapping[str, float] | None = None,
         unstable: set[str] = frozenset()) -> list[Change]:
    """Counters whose per-step value differs (beyond their tolerance, for the
    inexact ones); unstable counters and times are left out, as nothing can
    judge them as counts."""
    tolerance = {**INEXACT, **(tolerance or {})}
    out = []
    for key in sorted(set(new) | set(base)):
        if key in unstable or is_time(key):
            continue
        old, now = float(base.get(key, 0)), float(new.get(key, 0))
        allowed = tolerance.get(key, 0.0) * abs(old)
        if abs(now - old) > allowed:
            out.append(Change(key, old, now))
    return out


def _count(x: float) -> str:
    return f"{x:.0f}" if x == int(x) else f"{x:.4g}"


def _bytes(x: float) -> str:
    sign = "+" if x >= 0 else "-"
    x = abs(x)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if x < 1000 or unit == "TB":
            return f"{sign}{_count(x) if unit == 'B' else f'{x:.3g}'} {unit}"
        x /= 1000
    return ""


def describe(changes: list[Change]) -> list[str]:
    """One line per change, collectives' calls and bytes together:
    "c10d allreduce per step 4 -> 5 (+16 B)", "aten::copy_ +158 per step"."""
    by_key = {c.key: c for c in changes}
    lines = []
    for change in changes:
        key = change.key
        if key.startswith("collectives/"):
            _, name, what = key.split("/")
            if what == "bytes" and f"collectives/{name}/calls" in by_key:
                continue  # told with its calls
            calls = by_key.get(f"collectives/{name}/calls")
            sent = by_key.get(f"collectives/{name}/bytes")
            text = f"c10d {name} per step"
            if calls:
                text += f" {_count(calls.old)} -> {_count(calls.new)}"
            if sent:
                text += f" ({_bytes(sent.delta)})" if calls else f" bytes {_bytes(sent.delta)}"
            lines.append(text)
        elif key.startswith("ops/"):
            lines.append(f"{key[4:]} {'+' if change.delta > 0 else ''}{_count(change.delta)} "
                         f"per step ({_count(change.old)} -> {_count(change.new)})")
        elif key.endswith("_bytes") or key.startswith("memory/"):
            lines.append(f"{key} per step {_bytes(change.delta)} "
                         f"({_count(change.old)} -> {_count(change.new)})")
        else:
            lines.append(f"{key} per step {_count(change.old)} -> {_count(change.new)}")
    return lines


def headline(per_step: Mapping[str, float]) -> list[tuple[str, str]]:
    """The counters a person reads first, as (what, per step) pairs: FLOPs,
    operator calls, each collective, copies and CUDA runtime calls."""
    ops = {k: v for k, v in per_step.items() if k.startswith("ops/")}
    rows = [("FLOPs", f"{per_step.get('flops', 0):.4g}"),
            ("operator calls", f"{_count(sum(ops.values()))} ({len(ops)} operators)")]
    for key in sorted(k for k in per_step if k.startswith("collectives/") and k.endswith("/calls")):
        name = key.split("/")[1]
        rows.append((f"c10d {name}", f"{_count(per_step[key])} calls, "
                     f"{_bytes(per_step.get(f'collectives/{name}/bytes', 0))[1:]}"))
    rows += [(key.split("/", 1)[1].replace("_", " "), _bytes(value)[1:] if key.endswith("bytes")
              else _count(value))
             for key, value in sorted(per_step.items()) if key.startswith(("copies/", "cuda/", "memory/"))]
    return rows
