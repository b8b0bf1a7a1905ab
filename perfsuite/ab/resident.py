"""Resident A/B: one launch of each side kept up, measured windows alternated between them.

Two launches a minute apart differ by the machine's drift; two windows
seconds apart share it. For a cell whose workload serves windows
(``RESIDENT_WORKLOADS``: the rank side is perfsuite.rank.windows), both
sides' launches start together with the coordinator's socket in their
environment; once every rank of both has warmed up, the coordinator asks
for windows of ``window_steps`` steps in the order A B B A, A B B A, ...,
the other side parked on a blocking read meanwhile, and then ends the
windows, and the launches finish as usual (work counters, accuracy, their
results). One such *launch pair* sees the change; a few of them also see
what is tied to a launch (perfsuite.stats.windows).

Where two sides cannot be resident together (another workload, several
nodes, a profiler) ``resident_refusal`` says why and ``perfsuite ab``
compares whole launches in rounds instead, and says so in ab.json.

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

import json
import os
import select
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from perfsuite import hardware
from perfsuite.cells import Cell
from perfsuite.judge.baselines import BaselineError, load_all
from perfsuite.judge.lookup import find_expectation
from perfsuite.launch.launch import LaunchOptions, run_cell
from perfsuite.rank.windows import RELEASE_ENV, SIDE_ENV, SOCKET_ENV
from perfsuite.stats.windows import ORDER, window_value

RESIDENT_WORKLOADS = ("image",)
READY_TIMEOUT_S = 600.0  # both sides' start-up and warm-up on a loaded machine
# Quads run first in each pair and kept in ab.json, never judged: just after
# both sides are ready, one side still settles while the other measures. On
# an H200 (gate ddp-ds g1 pinned, 126.3 ms steps) side A's first window ran
# 164-297 ms a step while side B's DataLoader workers filled their queues;
# that one quad widened a pair's interval from +-0.05 % to +-8 %.
SETTLING_QUADS = 1
STOP_TIMEOUT_S = 600.0  # after the windows: counters, accuracy, the results


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


class ResidentError(RuntimeError):
    """A side's ranks did not come up, or went away during the windows."""


class MemoryShort(ResidentError):
    """The second side of a pair would not fit beside the first, parked."""


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
    try:
        sets = load_all()
    except BaselineError as err:
        return None, f"no baselines read ({err})"
    found = find_expectation(cell.params(), "peak_mem_reserved", hardware.profile_id(hardware.fingerprint()),
                             sets=sets)
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


def resident_refusal(cell: Cell, launch: LaunchOptions | None) -> str | None:
    """Why the two sides of ``cell`` cannot be resident together; None where they can."""
    launch = launch or LaunchOptions()
    if cell.workload not in RESIDENT_WORKLOADS:
        return (f"the {cell.workload} workload does not serve measured windows; "
                "its launches are compared in ABBA rounds")
    if launch.nodes.nnodes > 1 or launch.nodes.slurm:
        return "a cell across nodes is compared in ABBA rounds of whole launches"
    if launch.profiler not in (None, "off") or cell.profile:
        return "a profiled launch measures the profiler too; its launches are compared in rounds"
    return None


@dataclass
class _Rank:
    sock: socket.socket
    file: Any
    pid: int


class Coordinator:
    """The ``perfsuite ab`` end of the windows: a Unix socket both sides' ranks
    connect to (in a short temporary folder: a socket path has 108 bytes)."""

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="perfsuite-ab-")
        self.path = os.path.join(self.folder, "windows.sock")
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(self.path)
        self.server.listen(64)
        self.ranks: dict[str, dict[int, _Rank]] = {"A": {}, "B": {}}
        self.world: dict[str, int] = {}
        self.memory: dict[str, dict[int, dict[str, Any]]] = {"A": {}, "B": {}}  # each rank's last word
        self._pending: dict[socket.socket, Any] = {}  # connected, not yet ready (warming up)

    def env(self, side: str) -> dict[str, str]:
        return {SOCKET_ENV: self.path, SIDE_ENV: side}

    def ready(self, side: str) -> bool:
        return side in self.world and len(self.ranks[side]) == self.world[side]

    def wait_ready(self, alive: Callable[[str], bool], timeout_s: float = READY_TIMEOUT_S,
                   sides: tuple[str, ...] = ("A", "B")) -> float:
        """Seconds until every rank of ``sides`` said it is ready."""
        started = time.monotonic()
        while not all(self.ready(side) for side in sides):
            for side in sides:
                if not self.ready(side) and not alive(side):
                    raise ResidentError(f"side {side}'s launch ended before its ranks were ready")
            if time.monotonic() - started > timeout_s:
                waiting = [s for s in sides if not self.ready(s)]
                raise ResidentError(f"side(s) {', '.join(waiting)} not ready within {timeout_s:.0f} s")
            readable, _, _ = select.select([self.server, *self._pending], [], [], 0.5)
            for sock in readable:
                if sock is self.server:
                    self._accept()
                else:
                    self._hello(sock)
        return time.monotonic() - started

    def _accept(self) -> None:
        """A rank connected at its start; it says it is ready once warmed up."""
        conn, _ = self.server.accept()
        conn.settimeout(60.0)
        self._pending[conn] = conn.makefile("rw", encoding="utf-8", newline="\n")

    def _hello(self, conn: socket.socket) -> None:
        file = self._pending.pop(conn)
        try:
            hello = json.loads(file.readline() or "{}")
            side, rank, world = hello["ready"], int(hello["rank"]), int(hello["world_size"])
        except (OSError, ValueError, KeyError, TypeError):
            conn.close()
            return  # not one of ours, or gone; the launch's own failure will tell
        if side not in self.ranks:
            conn.close()
            return
        self.world[side] = world
        self.ranks[side][rank] = _Rank(conn, file, int(hello.get("pid", 0)))
        if hello.get("memory"):
            self.memory[side][rank] = hello["memory"]

    def window(self, side: str, steps: int, timeout_s: float) -> list[list[float]]:
        """Each rank's step times of one window of ``side``."""
        ranks = [self.ranks[side][r] for r in sorted(self.ranks[side])]
        try:
            for rank in ranks:
                rank.sock.settimeout(timeout_s)
                rank.file.write(json.dumps({"steps": steps}) + "\n")
                rank.file.flush()
            replies = [rank.file.readline() for rank in ranks]
        except (OSError, TimeoutError) as err:
            raise ResidentError(f"side {side}: a rank did not finish its window ({err})") from None
        if not all(replies):
            raise ResidentError(f"side {side}: a rank went away during a window")
        messages = [json.loads(line) for line in replies]
        for rank, message in zip(sorted(self.ranks[side]), messages):
            if message.get("memory"):
                self.memory[side][rank] = message["memory"]
        return [list(message["times"]) for message in messages]

    def stop(self, sides: tuple[str, ...] = ("A", "B")) -> None:
        """No more windows: every rank of ``sides`` goes on to the end of its launch."""
        for side in (self.ranks[s] for s in sides):
            for rank in side.values():
                try:
                    rank.file.write(json.dumps({"steps": 0}) + "\n")
                    rank.file.flush()
                except OSError:
                    pass

    def close(self) -> None:
        for conn in list(self._pending):
            conn.close()
        self._pending.clear()
        for side in self.ranks.values():
            for rank in side.values():
                for closing in (rank.file.close, rank.sock.close):
                    try:
                        closing()
                    except OSError:
                        pass
        self.server.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def step_times_of(per_rank: list[list[float]]) -> list[float]:
    """A window's step times: each step as long as its slowest rank."""
    return [max(times) for times in zip(*per_rank)] if per_rank else []


@dataclass
class PairRun:
    """What one launch pair gave: each side's launch result and the windows."""

    results: dict[str, dict[str, Any]]
    windows: list[dict[str, Any]]
    ready_s: float | None
    error: str | None = None
    memory: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # each side's ranks' last word
    short: str | None = None  # the second side not started: it would not have fit (memory_short)


def judged(windows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The windows a verdict weighs: all but the settling quads'."""
    return [w for w in windows if not w.get("settling")]


def run_pair(cell: Cell, options: dict[str, LaunchOptions], dirs: dict[str, Path], *, quads: int,
             window_steps: int, on_window: Callable[[dict[str, Any]], None] = lambda w: None,
             stop_after: Callable[[list[dict[str, Any]]], bool] = lambda ws: False,
             settling_quads: int = SETTLING_QUADS, first: str = "A", release: bool = False,
             need_bytes: int | None = None) -> PairRun:
    """One launch of each side, resident together (side ``first`` launched
    first), ``settling_quads`` ABBA quads of windows marked ``settling``, then
    ``quads`` judged ones (fewer where ``stop_after(judged windows)`` says so
    after a quad). ``release``: the ranks empty their CUDA cache whenever
    parked. The second side starts only where ``memory_short`` finds room
    for ``need_bytes`` (else the first side's own peak) beside the first."""
    coordinator = Coordinator()
    results: dict[str, dict[str, Any]] = {}
    threads: dict[str, threading.Thread] = {}
    windows: list[dict[str, Any]] = []
    ready_s, error, short = None, None, None
    timeout = float(options["A"].timeout_s or cell.timeout_s)
    started = time.monotonic()
    try:
        # One side after the other: two torchrun agents started at once can
        # pick the same free port for their rendezvous (seen: one waited in
        # the other's until its timeout), and on a small machine their
        # imports would only slow each other.
        for side in (first, "B" if first == "A" else "A"):
            if side != first:  # the first is warmed up and parked: is there room for this one?
                why = memory_short(coordinator.memory[first], need_bytes)
                if why:
                    raise MemoryShort(f"side {side} not started beside side {first}: {why}")
            # A launch never forks this launcher, which runs the other side's thread
            # (perfsuite.launch.starting): each side's agent is its zygote's fork.
            opts = replace(options[side], env={**options[side].env, **coordinator.env(side),
                                               **({RELEASE_ENV: "1"} if release else {})})
            threads[side] = threading.Thread(
                target=lambda s=side, o=opts: results.__setitem__(s, run_cell(cell, dirs[s], o)),
                name=f"perfsuite-ab-side-{side}", daemon=True)
            threads[side].start()
            coordinator.wait_ready(lambda s: threads[s].is_alive(), min(timeout, READY_TIMEOUT_S), (side,))
        ready_s = time.monotonic() - started
        for quad in range(settling_quads + quads):
            for side in ORDER:
                began = time.time()
                times = step_times_of(coordinator.window(side, window_steps, timeout))
                window = {"side": side, "value": window_value(times), "steps": times, "started": began,
                          **({"settling": True} if quad < settling_quads else {})}
                windows.append(window)
                on_window(window)
            if quad >= settling_quads and stop_after(judged(windows)):
                break
    except MemoryShort as err:
        error = short = str(err)
    except (ResidentError, ValueError) as err:
        error = str(err)
    except BaseException:  # Ctrl-C: the ranks find the coordinator gone and end at once
        coordinator.close()
        for thread in threads.values():
            thread.join(60.0)
        raise
    if release:  # one side at a time: each launch's end (counters, accuracy) trains at its peak again
        for side in threads:
            coordinator.stop((side,))
            threads[side].join(STOP_TIMEOUT_S + timeout)
    else:
        coordinator.stop()
    for thread in threads.values():
        thread.join(STOP_TIMEOUT_S + timeout)
    coordinator.close()
    memory = {side: [told[r] for r in sorted(told)] for side, told in coordinator.memory.items() if told}
    return PairRun(results, windows, ready_s, error, memory, short)
