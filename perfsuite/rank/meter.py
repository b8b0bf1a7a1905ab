"""Measurement inside one rank: step times, which of them are samples, the
host's waits for data, wall windows, memory.

On CUDA a step is the span between CUDA events recorded at consecutive step
boundaries on the current stream, read after one synchronisation at the end,
so timing adds no synchronisation inside the measured loop. On CPU it is
``time.perf_counter`` at the same boundaries. Steps before ``warmup_steps``
are recorded but excluded from the samples.
"""

from __future__ import annotations

import os
import resource
import statistics
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


TRAINING_PHASES = ("train", "window")  # the phases of ctx.report_progress that train


class Progress:
    """The step and phase this rank last entered, for diagnosing a hang.

    One fixed-width record rewritten in place with ``os.pwrite``: a few
    microseconds a step, no fsync, readable by the launcher at any time.
    """

    WIDTH = 64

    def __init__(self, path: Path | None) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644) if path else None
        self.first: dict[str, float] = {}  # phase -> time.time() it was first entered

    def update(self, step: int, phase: str = "step", total: int = 0) -> None:
        now = time.time()
        self.first.setdefault(phase, now)
        if self._fd is not None:
            line = f"{step} {now:.3f} {phase} {total}"[: self.WIDTH - 1]
            os.pwrite(self._fd, line.ljust(self.WIDTH - 1).encode() + b"\n", 0)

    def training_started(self) -> float | None:
        """When the first training step (or resident window's step) began."""
        begun = [self.first[p] for p in TRAINING_PHASES if p in self.first]
        return min(begun) if begun else None

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


class MeasuredSteps:
    """Which steps' times are samples: every step after the first
    ``warmup_steps``, except those that ``leave_out`` names. A step is left out
    when it does other work than the steps it is compared with: a batch
    smaller than the cell's (an epoch's last, partial batch: 29 of 64 images
    on the digits at 500 px, 68 ms against 138 ms, which then made the floor)
    and, where DataLoader workers fetch the batches, an epoch's first step
    (it waits for the workers to produce a batch nobody prefetched: 0.33-0.60 s
    on an H100 against 0.14-0.35 s). Steps are counted from 0 over the run."""

    def __init__(self, warmup_steps: int) -> None:
        self.warmup_steps = warmup_steps
        self.left_out: set[int] = set()

    def leave_out(self, step: int) -> None:
        self.left_out.add(step)

    def keep(self, per_step: list) -> list:
        """The samples among one value per step run (step times, shares)."""
        return [v for i, v in enumerate(per_step) if i >= self.warmup_steps and i not in self.left_out]


class DataWaits:
    """Host time each step spent getting its batch, against the step's span.

    ``mark()`` beside every ``StepTimer.mark()`` (the start of each step and
    once after an epoch's last), ``close_epoch()`` beside its
    ``close_epoch()``; ``add(fetch_s, copy_s)`` for each batch a step takes:
    seconds in ``next(loader)`` and in handing the batch to the device.
    ``time.perf_counter`` only, so it adds no synchronisation on a GPU. There
    the copy part is what the host spent issuing it: with pin_memory
    (non_blocking) little more than the enqueue, the DMA itself then runs on
    the stream inside the step's GPU time; without, torch copies pageable
    memory synchronously and that includes waiting for the previous step's
    GPU work. So ``data_wait_share`` (both parts) is an upper bound of the
    data's share, and ``loader_wait_share`` (``next(loader)`` alone: the GPU
    idles while the host waits there) is what tells a cell that measures its
    DataLoader rather than its GPUs. The steps are those of ``measured``
    (an int: that many warm-up steps, nothing else left out).
    """

    def __init__(self, measured: MeasuredSteps | int, clock=time.perf_counter) -> None:
        self.measured = MeasuredSteps(measured) if isinstance(measured, int) else measured
        self.clock = clock
        self._segments: list[list[list[float]]] = [[]]  # per epoch: [time, fetch_s, copy_s]

    def mark(self) -> None:
        self._segments[-1].append([self.clock(), 0.0, 0.0])

    def add(self, fetch_s: float, copy_s: float) -> None:
        if self._segments[-1]:
            self._segments[-1][-1][1] += fetch_s
            self._segments[-1][-1][2] += copy_s

    def close_epoch(self) -> None:
        if self._segments[-1]:
            self._segments.append([])

    def shares(self) -> dict[str, float | None]:
        """Medians over the measured steps of (fetch + copy) / span and
        fetch / span, each step's host span."""
        data, loader = [], []
        for marks in self._segments:
            for (began, fetch, copy), (ended, _, _) in zip(marks, marks[1:]):
                span = max(ended - began, 1e-12)
                data.append((fetch + copy) / span)
                loader.append(fetch / span)
        data, loader = self.measured.keep(data), self.measured.keep(loader)
        median = lambda xs: round(statistics.median(xs), 4) if xs else None  # noqa: E731
        return {"data_wait_share": median(data), "loader_wait_share": median(loader)}
