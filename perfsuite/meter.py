"""Measurement inside one rank: step times, wall windows, memory.

On CUDA a step is the span between CUDA events recorded at consecutive step
boundaries on the current stream, read after one synchronisation at the end,
so timing adds no synchronisation inside the measured loop. On CPU it is
``time.perf_counter`` at the same boundaries. Steps before ``warmup_steps``
are recorded but excluded from the samples.
"""

from __future__ import annotations

import resource
import time
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

    @property
    def steps(self) -> int:
        return sum(max(len(seg) - 1, 0) for seg in self._segments)

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

    def __enter__(self) -> "WallClock":
        self.started = self._now()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped = self._now()

    @property
    def seconds(self) -> float:
        return self.stopped - self.started


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> dict[str, dict[str, Any]]:
    """Peak CUDA allocated/reserved bytes, and the process's peak RSS."""
    # ru_maxrss is in KiB on Linux: the kernel's own high-water mark.
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
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
