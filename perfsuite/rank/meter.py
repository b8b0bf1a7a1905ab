"""Measurement inside one rank: step times, wall windows, memory.

On CUDA a step is the span between CUDA events recorded at consecutive step
boundaries on the current stream, read after one synchronisation at the end,
so timing adds no synchronisation inside the measured loop. On CPU it is
``time.perf_counter`` at the same boundaries. Steps before ``warmup_steps``
are recorded but excluded from the samples.
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path
from typing import Any

import torch


class StepTimer:
    """Call ``mark()`` at the start of every step and once after the last.

    ``close_epoch()`` ends a segment, so the gap between two epochs (loader
    start-up, evaluation) is never counted as a step.
    """

    def __init__(self, device: torch.device, warmup_steps: int) -> None:
        self.cuda = device.type == "cuda"
        self.warmup_steps = warmup_steps
        self._segments: list[list[Any]] = [[]]

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._segments[-1].append(event)
        else:
            self._segments[-1].append(time.perf_counter())

    def close_epoch(self) -> None:
        if self._segments[-1]:
            self._segments.append([])

    def all_step_times(self) -> list[float]:
        """Seconds per step, warm-up included (synchronises once on CUDA)."""
        times: list[float] = []
        for marks in self._segments:
            if len(marks) < 2:
                continue
            if self.cuda:
                marks[-1].synchronize()
                times += [a.elapsed_time(b) / 1e3 for a, b in zip(marks, marks[1:])]
            else:
                times += [b - a for a, b in zip(marks, marks[1:])]
        return times

    def samples(self) -> list[float]:
        """Seconds per measured step, warm-up excluded."""
        return self.all_step_times()[self.warmup_steps:]


class WallClock:
    """Wall time of a window, with device work finished before each reading."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.started = self.stopped = 0.0

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def __enter__(self) -> WallClock:
        self.started = self._now()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped = self._now()

    @property
    def seconds(self) -> float:
        return self.stopped - self.started


class Progress:
    """The step and phase this rank last entered, for diagnosing a hang.

    One fixed-width record rewritten in place with ``os.pwrite``: a few
    microseconds a step, no fsync, readable by the launcher at any time.
    """

    WIDTH = 64

    def __init__(self, path: Path | None) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644) if path else None

    def update(self, step: int, phase: str = "step", total: int = 0) -> None:
        if self._fd is not None:
            line = f"{step} {time.time():.3f} {phase} {total}"[: self.WIDTH - 1]
            os.pwrite(self._fd, line.ljust(self.WIDTH - 1).encode() + b"\n", 0)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_rss_bytes() -> int:
    """This process's own resident-set high-water mark.

    Linux's VmHWM belongs to the process's memory map, new at exec. Not
    ru_maxrss: that one is inherited through fork and exec, so a rank would
    report the pytest process's peak whenever that was larger than its own.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def peak_memory(device: torch.device) -> dict[str, dict[str, Any]]:
    """Peak CUDA allocated/reserved bytes, and the process's peak RSS."""
    rss = peak_rss_bytes()
    out = {"peak_rss": {"value": float(rss), "unit": "bytes"}}
    if device.type == "cuda":
        out["peak_mem_allocated"] = {"value": float(torch.cuda.max_memory_allocated(device)),
                                     "unit": "bytes"}
        out["peak_mem_reserved"] = {"value": float(torch.cuda.max_memory_reserved(device)),
                                    "unit": "bytes"}
    return out


def metric(value: float, unit: str, samples: list[float] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"value": float(value), "unit": unit}
    if samples is not None:
        out["samples"] = [float(s) for s in samples]
    return out
