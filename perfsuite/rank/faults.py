"""Injected faults, for the suite's own tests and its detection benchmark.

Given as a workload option ``fault=KIND:RANK:STEP[:VALUE]``:

- ``raise``: the rank raises RuntimeError at that training step;
- ``hang``: the rank sleeps forever at that step (a peer then waits in its
  next collective), as a dead peer or a stuck collective would;
- ``kill``: the rank sends itself SIGKILL at that step;
- ``slow``: from that step on, every step of the rank takes VALUE (a
  fraction, 0.1 = 10 %) longer: the step's own duration times VALUE is added
  as a sleep after it. RANK ``*`` applies to every rank.
- ``allreduce``: from that step on, every step does one extra all-reduce of
  VALUE float32 values (default four: 16 bytes); give RANK ``*``, or the
  others wait for it.
- ``copy``: from that step on, every step clones every parameter once more
  (VALUE times, default once).
- ``conv-spin``: from that step on, the first ``Conv2d`` of the model spins
  (Python, inside its forward) for VALUE (a fraction, 0.1 = 10 %) of a step;
- ``slow-linear``: likewise the first ``Linear``, by computing its output
  again (the same operators, under no_grad) until VALUE of a step is spent.
  Both size the step from the steps before STEP (their median, the first
  left out: STEP of at least 2) and act once a step: what the attribution
  diff must find in one module (``perfsuite selftest attribution``).

- ``gpu-sleep``: from that step on, every step of the rank adds VALUE (a
  fraction, 0.02 = 2 %) of its measured duration as device time: after the
  optimizer step, ``torch.cuda._sleep(cycles)`` on the current stream, so
  the host goes on queueing and nothing is synchronised. The sleep is sized
  once, at STEP: the median of the steps before STEP (timed, synchronised:
  STEP of at least ``CALIBRATION_STEPS``, e.g. the warm-up), times the
  cycles a second that ``torch.cuda._sleep`` took when timed with CUDA
  events (``calibrate_sleep``). Where ``slow`` adds host time, which a
  GPU-bound step hides behind its queued kernels, this adds what a slower
  kernel would: acceptance runs of ``perfsuite ab`` on a GPU give it to
  side B (``--b-option fault=gpu-sleep:*:5:0.02``). A CUDA cell's only: a
  CPU cell's ranks fail with "needs a CUDA cell". The image workload's.

The ``allreduce`` and ``copy`` faults change what a step does, not only how
long it takes: the work counters' own test of detection.
"""

from __future__ import annotations

import os
import signal
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

GPU_SLEEP = "gpu-sleep"
MODULE_FAULTS = {"conv-spin": "Conv2d", "slow-linear": "Linear"}  # kind: the class it slows
KINDS = ("raise", "hang", "kill", "slow", "allreduce", "copy", GPU_SLEEP, *MODULE_FAULTS)
CALIBRATION_STEPS = 3  # gpu-sleep: steps measured before STEP; their median sizes the sleep
CALIBRATION_S = 0.02  # a timed calibration sleep lasts at least this: its launch is then noise


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: str  # a rank number, or "*"
    step: int
    value: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Fault:
        parts = text.split(":")
        if len(parts) not in (3, 4) or parts[0] not in KINDS:
            raise ValueError(f"fault {text!r}: expected KIND:RANK:STEP[:VALUE], KIND in {KINDS}")
        value = float(parts[3]) if len(parts) == 4 else 0.0
        fault = cls(parts[0], parts[1], int(parts[2]), value)
        if fault.kind == GPU_SLEEP:
            if len(parts) != 4 or not value > 0:
                raise ValueError(f"fault {text!r}: give gpu-sleep:RANK:STEP:FRACTION, FRACTION above 0 "
                                 "(0.02: 2 % of a step)")
            if fault.step < CALIBRATION_STEPS:
                raise ValueError(f"fault {text!r}: gpu-sleep needs a STEP of at least {CALIBRATION_STEPS}: "
                                 "the steps before it are timed to size the sleep (e.g. the warm-up's)")
        if fault.kind in MODULE_FAULTS and (len(parts) != 4 or not 0 < value < 10 or fault.step < 2):
            raise ValueError(f"fault {text!r}: give {fault.kind}:RANK:STEP:FRACTION, FRACTION above 0 "
                             "(0.1: 10 % of a step) and STEP of at least 2 (the steps before it size it)")
        if fault.kind in ("allreduce", "copy") and len(parts) == 4 and not (value >= 1 and value == int(value)):
            raise ValueError(f"fault {text!r}: {fault.kind}'s VALUE is a whole number of at least 1 "
                             "(all-reduced float32 values, or clones of every parameter)")
        return fault

    def applies(self, rank: int, step: int) -> bool:
        return self.rank in ("*", str(rank)) and step >= self.step


def from_options(options: dict[str, str]) -> Fault | None:
    return Fault.parse(options["fault"]) if options.get("fault") else None


def timed(fault: Fault | None, rank: int, step: int) -> bool:
    """Whether the workload times this step itself, synchronising the device
    after it: every step of a launch with a fault, except that ``gpu-sleep``
    times only the steps that size it (before STEP, on its ranks), so that
    what it adds is device time alone."""
    if fault is None:
        return False
    if fault.kind == GPU_SLEEP:
        return fault.rank in ("*", str(rank)) and step < fault.step
    return True


def at_step(fault: Fault | None, rank: int, step: int) -> None:
    """Call at the start of each training step."""
    if fault is None or fault.kind not in ("raise", "kill", "hang") or not fault.applies(rank, step):
        return
    if fault.kind == "raise":
        raise RuntimeError(f"injected fault: rank {rank} raised at step {step}")
    if fault.kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault.kind == "hang":
        while True:
            time.sleep(3600)


def slow_down(fault: Fault | None, rank: int, step: int, step_seconds: float) -> None:
    """Call after a step with its duration; sleeps the injected share of it."""
    if fault is not None and fault.kind == "slow" and fault.applies(rank, step):
        time.sleep(step_seconds * fault.value)


def extra_work(fault: Fault | None, rank: int, step: int, model) -> None:
    """Call at the start of each training step: the ``allreduce`` and ``copy``
    faults, and the module faults' clock (``ModuleSlowdown``)."""
    if fault is not None and fault.kind in MODULE_FAULTS and fault.rank in ("*", str(rank)):
        ModuleSlowdown.of(fault, model).at_step(step)
    if fault is None or fault.kind not in ("allreduce", "copy") or not fault.applies(rank, step):
        return
    import torch

    if fault.kind == "allreduce":
        import torch.distributed as dist

        dist.all_reduce(torch.ones(int(fault.value or 4), device=next(model.parameters()).device))
    else:
        for _ in range(int(fault.value or 1)):
            for param in model.parameters():
                param.detach().clone()


_SLOWDOWNS: dict[int, ModuleSlowdown] = {}  # id(model): the module fault installed in it


@dataclass
class ModuleSlowdown:
    """``conv-spin`` / ``slow-linear`` in one model: the first module of the
    class gets a forward that spends ``budget_s`` once a step from STEP on."""

    fault: Fault
    module: Any
    marks: list[float] = field(default_factory=list)  # step starts before STEP
    budget_s: float | None = None
    armed: bool = False

    @classmethod
    def of(cls, fault: Fault, model: Any) -> ModuleSlowdown:
        found = _SLOWDOWNS.get(id(model))
        if found is None:
            wanted = MODULE_FAULTS[fault.kind]
            target = next((m for m in model.modules() if type(m).__name__ == wanted), None)
            if target is None:
                raise ValueError(f"injected fault {fault.kind}: the model has no {wanted} to slow down")
            found = _SLOWDOWNS[id(model)] = cls(fault, target)
            found.install()
        return found

    def install(self) -> None:
        forward, slowdown = self.module.forward, self

        def slowed(*args: Any, **kwargs: Any) -> Any:
            out = forward(*args, **kwargs)
            if slowdown.armed:
                slowdown.armed = False
                slowdown.spend(args, kwargs)
            return out

        self.module.forward = slowed  # an instance attribute: inside the module's call and its hooks

    def at_step(self, step: int) -> None:
        if step < self.fault.step:
            self.marks.append(time.perf_counter())
            return
        if self.budget_s is None:
            self.marks.append(time.perf_counter())
            steps = [b - a for a, b in zip(self.marks, self.marks[1:])][1:] or [self.marks[-1] - self.marks[0]]
            self.budget_s = self.fault.value * statistics.median(steps)
        self.armed = True

    def spend(self, args: tuple, kwargs: dict) -> None:
        end = time.perf_counter() + (self.budget_s or 0.0)
        if self.fault.kind == "conv-spin":
            while time.perf_counter() < end:
                pass
            return
        import torch

        with torch.no_grad():
            while True:
                self.module.__class__.forward(self.module, *args, **kwargs)
                if time.perf_counter() >= end:
                    return


def calibrate_sleep(device: Any) -> float:
    """Cycles a second of ``torch.cuda._sleep`` on the current stream of
    ``device``, timed with CUDA events: a sleep of a million cycles, made
    longer until it lasts ``CALIBRATION_S`` (its launch is then a small
    part of it). The SMs' clock is what it counts."""
    import torch

    torch.cuda._sleep(1000)  # its first launch loads the kernel: not timed
    cycles, seconds = 1_000_000, 0.0
    for _ in range(12):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3
        if seconds >= CALIBRATION_S:
            break
        cycles = int(cycles * min(16.0, max(2.0, 1.5 * CALIBRATION_S / max(seconds, 1e-6))))
    if not seconds > 0:
        raise RuntimeError(f"gpu-sleep: torch.cuda._sleep({cycles}) took no time on {device}; "
                           "the sleep cannot be sized")
    return cycles / seconds


@dataclass
class GpuSleep:
    """The ``gpu-sleep`` fault on one rank: ``observe`` each step timed
    before STEP (``timed``), ``after_step`` after every step's optimizer."""

    fault: Fault
    device: Any
    seconds: list[float] = field(default_factory=list)  # the steps measured before STEP
    cycles: int | None = None  # the sleep after each step from STEP on
    step_s: float | None = None  # the median step it was sized from
    cycles_per_s: float | None = None

    @classmethod
    def for_rank(cls, fault: Fault | None, rank: int, device: Any) -> GpuSleep | None:
        """This rank's sleeper, None where the fault is another or another rank's;
        a ValueError on a CPU cell, where it could add nothing."""
        if fault is None or fault.kind != GPU_SLEEP:
            return None
        kind = getattr(device, "type", str(device).split(":")[0])
        if kind != "cuda":
            raise ValueError(f"injected fault {fault.kind}:{fault.rank}:{fault.step}:{fault.value}: "
                             f"gpu-sleep needs a CUDA cell (this one runs on {kind}); "
                             "slow:RANK:STEP:FRACTION slows a CPU cell")
        return cls(fault, device) if fault.rank in ("*", str(rank)) else None

    def observe(self, step: int, seconds: float) -> None:
        if step < self.fault.step:
            self.seconds.append(seconds)

    def after_step(self, step: int) -> None:
        """From STEP on, the sleep queued on the current stream (sized at the first)."""
        if step < self.fault.step:
            return
        if self.cycles is None:
            self.cycles = self.size()
        import torch

        torch.cuda._sleep(self.cycles)

    def size(self) -> int:
        if not self.seconds:
            raise RuntimeError(f"gpu-sleep: no step was timed before step {self.fault.step} to size it")
        self.step_s = float(statistics.median(self.seconds))
        self.cycles_per_s = calibrate_sleep(self.device)
        return max(1, round(self.fault.value * self.step_s * self.cycles_per_s))
