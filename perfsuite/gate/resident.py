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
what is tied to a launch (perfsuite.judge.windowstats).

Where two sides cannot be resident together (another workload, several
nodes, a profiler) ``resident_refusal`` says why and ``perfsuite ab``
compares whole launches in rounds instead, and says so in ab.json.
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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from perfsuite.cells import Cell
from perfsuite.judge.windowstats import ORDER, window_value
from perfsuite.launch.launch import LaunchOptions, run_cell
from perfsuite.rank.windows import SIDE_ENV, SOCKET_ENV

RESIDENT_WORKLOADS = ("image",)
READY_TIMEOUT_S = 600.0  # both sides' start-up and warm-up on a loaded machine
# Quads run first in each pair and kept in ab.json, never judged: just after
# both sides are ready, one side still settles while the other measures. On
# an H200 (gate ddp-ds g1 pinned, 126.3 ms steps) side A's first window ran
# 164-297 ms a step while side B's DataLoader workers filled their queues;
# that one quad widened a pair's interval from +-0.05 % to +-8 %.
SETTLING_QUADS = 1
STOP_TIMEOUT_S = 600.0  # after the windows: counters, accuracy, the results


class ResidentError(RuntimeError):
    """A side's ranks did not come up, or went away during the windows."""


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
            readable, _, _ = select.select([self.server], [], [], 0.5)
            if readable:
                self._accept()
        return time.monotonic() - started

    def _accept(self) -> None:
        conn, _ = self.server.accept()
        conn.settimeout(60.0)
        file = conn.makefile("rw", encoding="utf-8", newline="\n")
        try:
            hello = json.loads(file.readline() or "{}")
            side, rank, world = hello["ready"], int(hello["rank"]), int(hello["world_size"])
        except (OSError, ValueError, KeyError, TypeError):
            conn.close()
            return  # not one of ours; the launch's own failure will tell
        if side not in self.ranks:
            conn.close()
            return
        self.world[side] = world
        self.ranks[side][rank] = _Rank(conn, file, int(hello.get("pid", 0)))

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
        return [list(json.loads(line)["times"]) for line in replies]

    def stop(self) -> None:
        """No more windows: every rank goes on to the end of its launch."""
        for side in self.ranks.values():
            for rank in side.values():
                try:
                    rank.file.write(json.dumps({"steps": 0}) + "\n")
                    rank.file.flush()
                except OSError:
                    pass

    def close(self) -> None:
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


def judged(windows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The windows a verdict weighs: all but the settling quads'."""
    return [w for w in windows if not w.get("settling")]


def run_pair(cell: Cell, options: dict[str, LaunchOptions], dirs: dict[str, Path], *, quads: int,
             window_steps: int, on_window: Callable[[dict[str, Any]], None] = lambda w: None,
             stop_after: Callable[[list[dict[str, Any]]], bool] = lambda ws: False,
             settling_quads: int = SETTLING_QUADS, first: str = "A") -> PairRun:
    """One launch of each side, resident together (side ``first`` launched
    first), ``settling_quads`` ABBA quads of windows marked ``settling``, then
    ``quads`` judged ones (fewer where ``stop_after(judged windows)`` says so
    after a quad)."""
    coordinator = Coordinator()
    results: dict[str, dict[str, Any]] = {}
    threads: dict[str, threading.Thread] = {}
    windows: list[dict[str, Any]] = []
    ready_s, error = None, None
    timeout = float(options["A"].timeout_s or cell.timeout_s)
    started = time.monotonic()
    try:
        # One side after the other: two torchrun agents started at once can
        # pick the same free port for their rendezvous (seen: one waited in
        # the other's until its timeout), and on a small machine their
        # imports would only slow each other.
        for side in (first, "B" if first == "A" else "A"):
            # No forked agent: a fork from a process with another thread running can deadlock.
            opts = replace(options[side], env={**options[side].env, **coordinator.env(side),
                                               "PERFSUITE_FORK_AGENT": "0"})
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
    except (ResidentError, ValueError) as err:
        error = str(err)
    except BaseException:  # Ctrl-C: the ranks find the coordinator gone and end at once
        coordinator.close()
        for thread in threads.values():
            thread.join(60.0)
        raise
    coordinator.stop()
    for thread in threads.values():
        thread.join(STOP_TIMEOUT_S + timeout)
    coordinator.close()
    return PairRun(results, windows, ready_s, error)
