"""Measured windows on a coordinator's word: a rank's side of a resident A/B session.

``perfsuite ab`` can keep one launch of each side up and alternate short
measured windows between them (perfsuite.gate.resident). A launch started
that way has ``PERFSUITE_WINDOWS`` (the coordinator's Unix socket) in its
environment; after its warm-up each rank says so, then waits for a window:
it runs the steps it is asked for (and in their place any that are other
work, as the timed loop leaves them out), synchronises (CUDA), sends their
times, and waits again. While it waits it is parked on a blocking socket read: no
collective spinning, no GPU kernel, no core held, so the other side measures
alone. An empty window ends the windows; the workload then goes on as after
its last step (work counters, accuracy), and its samples are the windows'
step times.

Messages are JSON lines: rank -> coordinator ``{"ready": side, "rank": r,
"world_size": n, "pid": p}`` and ``{"times": [s, ...]}``; coordinator ->
rank ``{"steps": n}`` (0: no more windows).
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from typing import Any

from perfsuite.rank.meter import StepTimer

SOCKET_ENV = "PERFSUITE_WINDOWS"  # the coordinator's socket path
SIDE_ENV = "PERFSUITE_WINDOWS_SIDE"  # "A" or "B"


# A window runs at most this many times its steps: where a loader's epochs
# are one or two batches every step is an epoch's first or partial one.
OTHER_WORK_LIMIT = 3


class WindowsLost(RuntimeError):
    """The coordinator went away (the A/B session ended or was interrupted)."""


class Windows:
    """A rank's connection to the coordinator of a resident A/B session."""

    def __init__(self, path: str, side: str, rank: int, world_size: int) -> None:
        self.side, self.rank = side, rank
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.connect(path)
        except OSError as err:
            self._sock.close()
            raise WindowsLost(f"cannot reach the A/B coordinator at {path}: {err}") from None
        self._file = self._sock.makefile("rw", encoding="utf-8", newline="\n")
        self._send({"ready": side, "rank": rank, "world_size": world_size, "pid": os.getpid()})

    @classmethod
    def from_env(cls, rank: int, world_size: int, env: dict[str, str] | None = None) -> Windows | None:
        """The session's windows where this launch is resident, else None."""
        env = os.environ if env is None else env
        path = env.get(SOCKET_ENV)
        return cls(path, env.get(SIDE_ENV, "?"), rank, world_size) if path else None

    def _send(self, message: dict[str, Any]) -> None:
        try:
            self._file.write(json.dumps(message) + "\n")
            self._file.flush()
        except OSError as err:
            raise WindowsLost(f"the A/B coordinator went away ({err})") from None

    def next_window(self) -> int:
        """Steps in the next window, 0 for none; blocks (parked) until told."""
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
        """
        measured: list[float] = []
        while (steps := self.next_window()) > 0:
            timer, kept = StepTimer(device, 0), []
            while sum(kept) < steps and len(kept) < OTHER_WORK_LIMIT * steps:
                timer.mark()
                kept.append(step() is not False)
            timer.mark()
            times = timer.all_step_times()  # synchronises on CUDA: parked with nothing queued
            if sum(kept) == steps:  # else epochs of boundaries alone (one or two batches): all count
                times = [t for t, keep in zip(times, kept) if keep]
            self._send({"times": times})
            measured += times
        return measured

    def close(self) -> None:
        for closing in (self._file.close, self._sock.close):
            try:
                closing()
            except OSError:
                pass
