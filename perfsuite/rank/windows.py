"""Measured windows on a coordinator's word: a rank's side of a resident A/B session.

``perfsuite ab`` can keep one launch of each side up and alternate short
measured windows between them (perfsuite.ab.resident). A launch started
that way has ``PERFSUITE_WINDOWS`` (the coordinator's Unix socket) in its
environment; each rank connects at its start, says it is ready once
warmed up (the first time it parks), then waits for a window:
it runs the steps it is asked for (and in their place any that are other
work, as the timed loop leaves them out), synchronises (CUDA), sends their
times, and waits again. While it waits it is parked on a blocking socket read: no
collective spinning, no GPU kernel, no core held, so the other side measures
alone. An empty window ends the windows; the workload then goes on as after
its last step (work counters, accuracy), and its samples are the windows'
step times.

Two sides' caches may not fit on one GPU together (perfsuite.ab.resident's
memory plan): with ``PERFSUITE_WINDOWS_RELEASE=1`` a CUDA rank empties its
cache (``torch.cuda.empty_cache``) every time it parks, before it says it is
ready or sends a window's times, so the other side's window finds the
memory free; the first step after it wakes grows the cache again and is
run but not timed. Every time it parks a CUDA rank also tells what it holds
(``parked_memory``), so the coordinator can see whether the other side fits.

Messages are JSON lines: rank -> coordinator ``{"ready": side, "rank": r,
"world_size": n, "pid": p, "memory": {...}}`` and ``{"times": [s, ...],
"memory": {...}}`` (``memory`` on CUDA only: ``reserved``, ``peak_reserved``,
``free``, ``total`` bytes and ``released``); coordinator -> rank
``{"steps": n}`` (0: no more windows).
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from typing import Any

import torch

from perfsuite.rank.meter import StepTimer

SOCKET_ENV = "PERFSUITE_WINDOWS"  # the coordinator's socket path
SIDE_ENV = "PERFSUITE_WINDOWS_SIDE"  # "A" or "B"
RELEASE_ENV = "PERFSUITE_WINDOWS_RELEASE"  # "1": empty the CUDA cache whenever parked


# A window runs at most this many times its steps: where a loader's epochs
# are one or two batches every step is an epoch's first or partial one.
OTHER_WORK_LIMIT = 3


class WindowsLost(RuntimeError):
    """The coordinator went away (the A/B session ended or was interrupted)."""


def parked_memory(device: Any, release: bool) -> dict[str, Any]:
    """What a rank about to park tells of its device memory (nothing on CPU),
    its cache emptied first where ``release``: bytes its caching allocator
    holds and held at most, and the device's free and total bytes."""
    if getattr(device, "type", None) != "cuda":
        return {}
    if release:
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    return {"memory": {"reserved": int(torch.cuda.memory_reserved(device)),
                       "peak_reserved": int(torch.cuda.max_memory_reserved(device)),
                       "free": int(free), "total": int(total), "released": release}}


class Windows:
    """A rank's connection to the coordinator of a resident A/B session."""

    def __init__(self, path: str, side: str, rank: int, world_size: int, release: bool = False) -> None:
        self.side, self.rank, self.release = side, rank, release
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.connect(path)
        except OSError as err:
            self._sock.close()
            raise WindowsLost(f"cannot reach the A/B coordinator at {path}: {err}") from None
        self._file = self._sock.makefile("rw", encoding="utf-8", newline="\n")
        self._hello: dict[str, Any] | None = {"ready": side, "rank": rank, "world_size": world_size,
                                              "pid": os.getpid()}

    @classmethod
    def from_env(cls, rank: int, world_size: int, env: dict[str, str] | None = None) -> Windows | None:
        """The session's windows where this launch is resident, else None."""
        env = os.environ if env is None else env
        path = env.get(SOCKET_ENV)
        return (cls(path, env.get(SIDE_ENV, "?"), rank, world_size, env.get(RELEASE_ENV) == "1")
                if path else None)

    def _ready(self, memory: dict[str, Any]) -> None:
        """Ready, once: the first time this rank parks (after its warm-up)."""
        if self._hello is not None:
            hello, self._hello = self._hello, None
            self._send({**hello, **memory})

    def _send(self, message: dict[str, Any]) -> None:
        try:
            self._file.write(json.dumps(message) + "\n")
            self._file.flush()
        except OSError as err:
            raise WindowsLost(f"the A/B coordinator went away ({err})") from None

    def next_window(self) -> int:
        """Steps in the next window, 0 for none; blocks (parked) until told."""
        self._ready({})
        try:
            line = self._file.readline()
        except OSError as err:
            raise WindowsLost(f"the A/B coordinator went away ({err})") from None
        if not line:
            raise WindowsLost("the A/B coordinator went away before it ended the windows")
        return max(int(json.loads(line).get("steps", 0)), 0)

    def serve(self, step: Callable[[], Any], device: Any) -> list[float]:
        """Run windows of ``step()`` until told to stop; every measured step's seconds.

        A step that returns False was other work (an epoch's partial batch, a
        loader's restart): it runs, but a window's times are the steps asked
        for without it, as the timed loop leaves such steps out. Every rank
        and side meet them at the same steps, so the sides stay in step. A
        window that finds too few steps of the cell's own within
        ``OTHER_WORK_LIMIT`` times its steps times every step it ran.

        Where the rank releases its cache when parked, the first step after
        it wakes allocates it again: it runs first, untimed, as other work
        (both sides release alike, so they stay in step).
        """
        self._ready(parked_memory(device, self.release))  # warmed up: parked for the first time
        woken = self.release and getattr(device, "type", None) == "cuda"
        measured: list[float] = []
        while (steps := self.next_window()) > 0:
            if woken:
                step()
            timer, kept = StepTimer(device, 0), []
            while sum(kept) < steps and len(kept) < OTHER_WORK_LIMIT * steps:
                timer.mark()
                kept.append(step() is not False)
            timer.mark()
            times = timer.all_step_times()  # synchronises on CUDA: parked with nothing queued
            if sum(kept) == steps:  # else epochs of boundaries alone (one or two batches): all count
                times = [t for t, keep in zip(times, kept) if keep]
            self._send({"times": times, **parked_memory(device, self.release)})
            measured += times
        return measured

    def close(self) -> None:
        for closing in (self._file.close, self._sock.close):
            try:
                closing()
            except OSError:
                pass
