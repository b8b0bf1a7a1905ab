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
  four float32 values (16 bytes); give RANK ``*``, or the others wait for it.
- ``copy``: from that step on, every step copies every parameter once more.

The last two change what a step does, not only how long it takes: the work
counters' own test of detection.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

KINDS = ("raise", "hang", "kill", "slow", "allreduce", "copy")


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
        return cls(parts[0], parts[1], int(parts[2]), value)

    def applies(self, rank: int, step: int) -> bool:
        return self.rank in ("*", str(rank)) and step >= self.step


def from_options(options: dict[str, str]) -> Fault | None:
    return Fault.parse(options["fault"]) if options.get("fault") else None


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
    """Call inside each training step: the ``allreduce`` and ``copy`` faults."""
    if fault is None or fault.kind not in ("allreduce", "copy") or not fault.applies(rank, step):
        return
    import torch

    if fault.kind == "allreduce":
        import torch.distributed as dist

        dist.all_reduce(torch.ones(4, device=next(model.parameters()).device))
    else:
        for param in model.parameters():
            param.detach().clone()
