"""How two resident A/B sides share one GPU: the memory plan before a cell, and
whether the second side of a pair fits beside the first.

Both sides share the GPU, and a parked side keeps what its caching
allocator reserved. Before a CUDA cell ``plan_memory`` weighs its peak
reserved memory (the baselines' ``peak_mem_reserved`` for this cell on this
hardware) against the device's total (``choose_plan``): two sides that fit
at their peak stay plainly resident; where only one side's peak beside the
other's parked memory fits, each side empties its cache when it parks
(perfsuite.rank.windows); where not even that fits, the cell runs in launch
rounds. Without a recorded peak the ranks release, and the first side's
warm-up measures it. Whatever the plan, the first side of a pair says what
it holds once parked, and the second is started only where its peak fits
in what is free (``memory_short``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from perfsuite.cells import Cell
from perfsuite.judge.lookup import find_here
from perfsuite.launch.launch import LaunchOptions

# The memory plan's terms (choose_plan). Outside the caching allocator a
# process holds its CUDA context, cuDNN and cuBLAS handles and NCCL's
# buffers: about this much a side. A share of the device is kept free for
# fragmentation and what these estimates miss.
CONTEXT_BYTES = 1 << 30
MARGIN = 0.05
# What a parked side holds after emptying its cache, as a share of its peak,
# where no rank has said: its weights, gradients and optimizer state (an
# image cell's MobileNetV2: ~0.1 GB, in fp64) with room to spare.
PARKED_SHARE = 0.25
RESIDENT, RELEASE, LAUNCH_ROUNDS = "resident", "resident-release", "launch-rounds"


def _gb(value: float | None) -> str:
    return "?" if value is None else f"{value / 1e9:.1f} GB"


@dataclass(frozen=True)
class MemoryPlan:
    """How two sides of a CUDA cell share its GPU, and why (ab.json's ``memory``)."""

    plan: str  # RESIDENT, RELEASE or LAUNCH_ROUNDS
    peak_reserved: int | None  # bytes a side reserves at its peak (per GPU)
    device_total: int | None  # the device's bytes (the smallest of the cell's GPUs)
    source: str  # where peak_reserved came from
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"plan": self.plan, "peak_reserved": self.peak_reserved, "device_total": self.device_total,
                "source": self.source, "reason": self.reason}

    @property
    def release(self) -> bool:
        return self.plan == RELEASE

    @property
    def need_bytes(self) -> int | None:
        """What the second side of a pair needs free: its peak and its context."""
        return None if self.peak_reserved is None else int(self.peak_reserved) + CONTEXT_BYTES

    def line(self) -> str:
        """The terminal's word on it."""
        peak = (f"peak reserved {_gb(self.peak_reserved)} a side, from {self.source}"
                if self.peak_reserved is not None else f"peak reserved unknown: {self.source}")
        return f"memory plan: {self.plan} ({peak}; device {_gb(self.device_total)}): {self.reason}"


def choose_plan(peak: float | None, total: int | None, source: str, parked: float | None = None) -> MemoryPlan:
    """The plan for sides that reserve ``peak`` bytes each on a ``total``-byte
    device (``parked``: what a side holds with its cache emptied, where known)."""
    peak = None if peak is None else int(peak)
    if peak is None or total is None:
        missing = "no recorded peak" if peak is None else "the device's memory unknown here"
        return MemoryPlan(RELEASE, peak, total, source, (
            f"{missing}: each side empties its cache when parked, and the first side's warm-up "
            "measures what it holds before the second starts"))
    usable, side = total * (1 - MARGIN), peak + CONTEXT_BYTES
    held = (PARKED_SHARE * peak if parked is None else parked) + CONTEXT_BYTES
    kept = f"{_gb(usable)} usable of {_gb(total)} ({MARGIN * 100:.0f} % kept free)"
    if 2 * side <= usable:
        return MemoryPlan(RESIDENT, peak, total, source,
                          f"two sides at their peak, {_gb(2 * side)} with their contexts, fit in {kept}")
    if side + held <= usable:
        return MemoryPlan(RELEASE, peak, total, source, (
            f"two sides at their peak would need {_gb(2 * side)}, more than {kept}: each side empties "
            f"its cache when parked, so one side's {_gb(side)} beside the other's parked "
            f"{_gb(held)}{'' if parked is not None else ' (assumed)'} fits"))
    return MemoryPlan(LAUNCH_ROUNDS, peak, total, source, (
        f"one side's {_gb(side)} beside the other's parked {_gb(held)} would not fit in {kept}: "
        "its launches run in rounds, one at a time"))


def device_memory(cell: Cell, launch: LaunchOptions | None) -> int | None:
    """The total bytes of the smallest GPU the cell's ranks use, as torch sees
    it here; None where torch sees none."""
    import torch

    try:
        if not torch.cuda.is_available():
            return None
        count = torch.cuda.device_count()
        chosen = [g for g in ((launch.gpus if launch else None) or range(count)) if 0 <= g < count]
        chosen = chosen[:max(cell.world_size, 1)]
        return min(int(torch.cuda.get_device_properties(g).total_memory) for g in chosen) if chosen else None
    except (RuntimeError, AssertionError, AttributeError):
        return None


def recorded_peak(cell: Cell) -> tuple[float | None, str]:
    """The cell's peak reserved memory recorded on this hardware, and where
    it is from (or why there is none)."""
    found = find_here(cell.params(), "peak_mem_reserved")
    if found.value:
        return float(found.value), f"baselines {found.baseline} ({found.source})"
    return None, found.reason


def plan_memory(cell: Cell, launch: LaunchOptions | None) -> MemoryPlan | None:
    """The plan for a resident session of ``cell`` (None for a CPU cell)."""
    if cell.device != "cuda":
        return None
    peak, source = recorded_peak(cell)
    return choose_plan(peak, device_memory(cell, launch), source)


def memory_short(reports: dict[int, dict[str, Any]], need: int | None) -> str | None:
    """Why a second side would not fit beside a first that reported
    ``reports`` (rank -> what it holds, parked), None where it fits or the
    ranks told nothing (CPU). ``need``: the second side's bytes, else the
    first side's own peak and a context."""
    told = [r for r in reports.values() if r.get("free") is not None]
    if not told:
        return None
    peak = max(float(r.get("peak_reserved") or 0) for r in told)
    wanted = need if need is not None else peak + CONTEXT_BYTES
    free, total = min(float(r["free"]) for r in told), max(float(r.get("total") or 0) for r in told)
    if wanted <= free - MARGIN * total:
        return None
    return (f"the second side needs ~{_gb(wanted)} (its peak reserved and a context), and the first, "
            f"parked{' with its cache emptied' if all(r.get('released') for r in told) else ''}, "
            f"left {_gb(free)} free of {_gb(total)} ({MARGIN * 100:.0f} % kept free); the first side's peak "
            f"was {_gb(peak)}")
