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
allocator reserved: perfsuite.ab.memory plans how (``plan_memory``), and the
second side of a pair is started only where it fits (``memory_short``).

A launch's timeout (--timeout, else the cell's) bounds each side's start
until its ranks are ready and each window, not the pair: the launch's own
bound (``launch_bound``) is their sum. However a pair stops (a timeout, a
failed side, Ctrl-C, a full disk) it stops as perfsuite.ab.stopping says.
"""

from __future__ import annotations

import json
import select
import shutil
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from perfsuite.ab.memory import (  # noqa: F401 - the plan's names, where callers find them
    CONTEXT_BYTES,
    LAUNCH_ROUNDS,
    MARGIN,
    PARKED_SHARE,
    RELEASE,
    RESIDENT,
    MemoryPlan,
    choose_plan,
    device_memory,
    memory_short,
    plan_memory,
    recorded_peak,
)
from perfsuite.ab.stopping import deferred_interrupts, end_processes, join_all, socket_folder
from perfsuite.cells import Cell
from perfsuite.launch.launch import LaunchOptions, run_cell
from perfsuite.rank.windows import RELEASE_ENV, SIDE_ENV, SOCKET_ENV
from perfsuite.stats.windows import ORDER, quad_log_ratios, serial_correlation, window_value

RESIDENT_WORKLOADS = ("image",)
READY_TIMEOUT_S = 600.0  # both sides' start-up and warm-up on a loaded machine
# Quads run first in each pair and kept in ab.json, never judged: just after
# both sides are ready, one side still settles while the other measures. On
# an H200 (gate ddp-ds g1 pinned, 126.3 ms steps) side A's first window ran
# 164-297 ms a step while side B's DataLoader workers filled their queues;
# that one quad widened a pair's interval from +-0.05 % to +-8 %.
SETTLING_QUADS = 1
STOP_TIMEOUT_S = 600.0  # after the windows: counters, accuracy, the results
INTERRUPTED_STOP_S = 30.0  # Ctrl-C: the ranks find the coordinator gone; those that do not are ended




class ResidentError(RuntimeError):
    """A side's ranks did not come up, or went away during the windows (``side``: which)."""

    def __init__(self, message: str, side: str | None = None) -> None:
        super().__init__(message)
        self.side = side


class MemoryShort(ResidentError):
    """The second side of a pair would not fit beside the first, parked."""


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
        self.folder = socket_folder()
        self.path = str(Path(self.folder) / "windows.sock")
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
                    raise ResidentError(f"side {side}'s launch ended before its ranks were ready", side)
            if time.monotonic() - started > timeout_s:
                waiting = [s for s in sides if not self.ready(s)]
                raise ResidentError(f"side {', '.join(waiting)}: its ranks were not ready within the "
                                    f"timeout of {timeout_s:.0f} s (--timeout)", waiting[0])
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
        except TimeoutError:
            raise ResidentError(f"side {side}: a rank did not finish its {steps}-step window within the "
                                f"timeout of {timeout_s:.0f} s (--timeout)", side) from None
        except OSError as err:
            raise ResidentError(f"side {side}: a rank did not finish its window ({err})", side) from None
        if not all(replies):
            raise ResidentError(f"side {side}: a rank went away during a window", side)
        messages = [json.loads(line) for line in replies]
        for rank, message in zip(sorted(self.ranks[side]), messages):
            if message.get("memory"):
                self.memory[side][rank] = message["memory"]
        return [list(message["times"]) for message in messages]

    def pids(self, side: str) -> list[int]:
        """The processes of ``side``'s ranks: those that said they are ready
        and, while the side is not, those still warming up (their socket's peer)."""
        found = [rank.pid for rank in self.ranks[side].values()]
        if not self.ready(side):
            for conn in self._pending:
                try:
                    found.append(struct.unpack("3i", conn.getsockopt(
                        socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[0])
                except (OSError, AttributeError, struct.error):
                    continue
        return [pid for pid in found if pid > 0]

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
    failed: str | None = None  # the side whose ranks hung, went away or never came up
    raised: dict[str, BaseException] = field(default_factory=dict)  # a side's launch that raised


def judged(windows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The windows a verdict weighs: all but the settling quads'."""
    return [w for w in windows if not w.get("settling")]


def judged_quads(windows: list[dict[str, Any]]) -> list[float]:
    """A launch pair's ABBA quad log-ratios, of the windows a verdict weighs."""
    return quad_log_ratios([(w["side"], w["value"]) for w in judged(windows)])


def pairs_serial(pairs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """``serial_correlation`` of the judged windows of a session's launch pairs."""
    return serial_correlation([[(w["side"], w["value"]) for w in judged(p["windows"])] for p in pairs])


def launch_bound(timeout: float, quads: int, settling_quads: int = SETTLING_QUADS) -> float:
    """A resident launch's own timeout: its start and the other side's, every
    window of the pair (both sides'), each within ``timeout``, and its end."""
    return timeout * (2 + len(ORDER) * (settling_quads + quads)) + STOP_TIMEOUT_S + timeout


def run_pair(cell: Cell, options: dict[str, LaunchOptions], dirs: dict[str, Path], *, quads: int,
             window_steps: int, on_window: Callable[[dict[str, Any]], None] = lambda w: None,
             stop_after: Callable[[list[dict[str, Any]]], bool] = lambda ws: False,
             settling_quads: int = SETTLING_QUADS, first: str = "A", release: bool = False,
             need_bytes: int | None = None) -> PairRun:
    """One launch of each side, resident together (side ``first`` launched
    first), ``settling_quads`` ABBA quads of windows marked ``settling``, then
    ``quads`` judged ones (fewer where ``stop_after(judged windows)`` says so
    after a quad), each window handed to ``on_window`` as it ends. ``release``:
    the ranks empty their CUDA cache whenever parked. The second side starts
    only where ``memory_short`` finds room for ``need_bytes`` (else the first
    side's own peak) beside the first. An interrupt (or any error of
    ``on_window``'s) ends both sides as a failure does, then is raised again."""
    coordinator = Coordinator()
    results: dict[str, dict[str, Any]] = {}
    raised: dict[str, BaseException] = {}
    threads: dict[str, threading.Thread] = {}
    windows: list[dict[str, Any]] = []
    ready_s, error, short, failed, stopped_by = None, None, None, None, None
    timeout = float(options["A"].timeout_s or cell.timeout_s)
    started = time.monotonic()

    def launch(side: str, opts: LaunchOptions) -> None:
        try:
            results[side] = run_cell(cell, dirs[side], opts)
        except BaseException as err:  # noqa: BLE001 - said as the side's result, not a thread's traceback
            raised[side] = err
            results[side] = {"status": "error", "reason": f"{type(err).__name__}: {err}"}

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
            opts = replace(options[side], timeout_s=launch_bound(timeout, quads, settling_quads),
                           env={**options[side].env, **coordinator.env(side),
                                **({RELEASE_ENV: "1"} if release else {})})
            threads[side] = threading.Thread(target=launch, args=(side, opts),
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
    except ResidentError as err:
        error, failed = str(err), err.side
    except ValueError as err:
        error = str(err)
    except BaseException as err:  # noqa: BLE001 - Ctrl-C, SIGTERM, a full disk: both sides end, then raised
        stopped_by = err
    with deferred_interrupts():
        _end_sides(coordinator, threads, timeout, failed=failed, interrupted=stopped_by is not None,
                   one_at_a_time=release)
    if stopped_by is not None:
        raise stopped_by
    memory = {side: [told[r] for r in sorted(told)] for side, told in coordinator.memory.items() if told}
    return PairRun(results, windows, ready_s, error, memory, short, failed, raised)


def _end_sides(coordinator: Coordinator, threads: dict[str, threading.Thread], timeout: float, *,
               failed: str | None, interrupted: bool, one_at_a_time: bool) -> None:
    """Every side's launch to its end, and only then the coordinator's socket
    closed. A side whose ranks hung or went away has them ended; on an
    interrupt the ranks find the coordinator gone and end at once (those that
    do not are ended); else each goes on to its launch's end (counters,
    accuracy), one side at a time where they release their cache when parked
    (each launch's end trains at its peak again)."""
    pids = {side: coordinator.pids(side) for side in threads}
    if failed in pids:
        end_processes(pids[failed])
    if interrupted:
        coordinator.close()
        left = join_all(list(threads.values()), INTERRUPTED_STOP_S)
    else:
        for side in (threads if one_at_a_time else ()):
            coordinator.stop((side,))
            join_all([threads[side]], STOP_TIMEOUT_S + timeout)
        coordinator.stop()
        left = join_all(list(threads.values()), STOP_TIMEOUT_S + timeout)
    if left:  # ranks that neither ended nor heard: ended, so no launch outlives its pair
        end_processes(pid for side, thread in threads.items() if thread in left for pid in pids[side])
        join_all(left, INTERRUPTED_STOP_S)
    coordinator.close()
