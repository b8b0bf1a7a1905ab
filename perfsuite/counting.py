"""Work counters: what one training step does, counted exactly, in the rank.

A step's time moves with the machine; what the step does does not. In a
short counting window after the timed steps (never during them, so timing
is untouched) every step is run under one ``TorchDispatchMode`` that counts:

- aten (and other namespaces') operator calls by name, as the dispatcher
  sees them above the backend kernels, so AVX2 and AVX-512 hosts count
  alike;
- FLOPs, by the formulas of ``torch.utils.flop_counter`` (its
  ``flop_registry``, the formulas ``FlopCounterMode`` applies; an operator
  without a formula counts none, where ``FlopCounterMode`` would decompose
  it first, which would change the operator counts beside it);
- collectives (``c10d::*``) and the bytes of the tensors they send, as DDP's
  reducer and torchtune's FSDP issue them;
- bytes and calls copied host-to-device and device-to-host.

On CUDA the window also runs ``torch.profiler`` for the runtime API calls
the papers' Table 1 lists: kernel launches, memcpy and memset calls, and
synchronisations (cudaStreamSynchronize, cudaEventSynchronize,
cudaDeviceSynchronize), and reads the peak memory allocated in the window.

Counters are flat ``{key: number}`` dicts per step, keys such as
``ops/aten::convolution``, ``flops``, ``collectives/allreduce/calls``,
``collectives/allreduce/bytes``, ``copies/h2d_bytes``, ``cuda/kernel_launches``,
``cuda/syncs/cudaStreamSynchronize``, ``memory/peak_allocated``.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from perfsuite import counters

DEFAULT_WINDOW_STEPS = 2
# Arguments of a c10d operator that hold what it sends (by schema name).
_SENT = ("tensors", "tensor", "input_tensors", "input_tensor", "input", "inputs")
# Runtime API calls counted on CUDA, by the key they are kept under.
CUDA_API = {
    "cuda/kernel_launches": ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel",
                             "cuLaunchKernelEx", "cudaLaunchCooperativeKernel"),
    "cuda/memcpy_calls": ("cudaMemcpy", "cudaMemcpyAsync", "cudaMemcpy2D", "cudaMemcpy2DAsync",
                          "cudaMemcpyPeer", "cudaMemcpyPeerAsync"),
    "cuda/memset_calls": ("cudaMemset", "cudaMemsetAsync", "cudaMemsetD8Async",
                          "cudaMemsetD32Async"),
    **{f"cuda/syncs/{name}": (name,) for name in (
        "cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize")},
}


def _tensors(value: Any) -> Iterable[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def _nbytes(value: Any) -> int:
    return sum(t.numel() * t.element_size() for t in _tensors(value))


def _device_kind(device: Any) -> str:
    return "cpu" if torch.device(device).type == "cpu" else "device"


class WorkCounter(TorchDispatchMode):
    """Counts every operator call of the steps run under it (see module doc)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def _count_copy(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        name = func._overloadpacket.__name__
        if name == "_to_copy" and isinstance(out, torch.Tensor):
            src, dst = args[0].device, out.device
        elif name == "copy_" and len(args) >= 2 and isinstance(args[1], torch.Tensor):
            src, dst = args[1].device, args[0].device
        else:
            return
        direction = {("cpu", "device"): "h2d", ("device", "cpu"): "d2h"}.get(
            (_device_kind(src), _device_kind(dst)))
        if direction:
            self.counts[f"copies/{direction}_calls"] += 1
            self.counts[f"copies/{direction}_bytes"] += _nbytes(out if name == "_to_copy"
                                                                else args[1])

    def _count_collective(self, func: Any, args: tuple, kwargs: dict) -> None:
        name = func._overloadpacket.__name__.strip("_")
        values = {arg.name: (args[i] if i < len(args) else kwargs.get(arg.name))
                  for i, arg in enumerate(func._schema.arguments)}
        sent = next((values[k] for k in _SENT if values.get(k) is not None), None)
        self.counts[f"collectives/{name}/calls"] += 1
        self.counts[f"collectives/{name}/bytes"] += _nbytes(sent)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func._overloadpacket
        self.counts[f"ops/{func.namespace}::{packet.__name__}"] += 1
        if func.namespace == "c10d":
            self._count_collective(func, args, kwargs)
        elif func.namespace == "aten":
            self._count_copy(func, args, kwargs, out)
        formula = flop_registry.get(packet)
        if formula is not None:
            self.counts["flops"] += int(formula(*args, **kwargs, out_val=out))
        return out


def cuda_api_counts(events: Iterable[tuple[str, int]]) -> dict[str, int]:
    """Runtime API calls by counter key, from (event name, count) pairs as
    ``torch.profiler``'s ``key_averages()`` reports them."""
    by_name = {name: key for key, names in CUDA_API.items() for name in names}
    out = Counter({key: 0 for key in CUDA_API})
    for name, count in events:
        if name in by_name:
            out[by_name[name]] += int(count)
    return dict(out)


@contextlib.contextmanager
def counted_step(device: torch.device) -> Iterator[dict[str, int]]:
    """The body run inside counts as one step of a counting window; the
    yielded dict holds its counts once the body is done (on CUDA also the
    runtime calls and peak allocated). A step that is a function:
    ``count_window``; a step that is the body of a loop: this."""
    counter, counts = WorkCounter(), {}
    if device.type != "cuda":
        with counter:
            yield counts
        counts.update(counter.counts)
        return
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with counter:
            yield counts
        torch.cuda.synchronize(device)
    counts.update(counter.counts)
    counts.update(cuda_api_counts((e.key, e.count) for e in prof.key_averages()))
    counts["memory/peak_allocated"] = int(torch.cuda.max_memory_allocated(device))


def _count_step(step: Callable[[], Any], device: torch.device) -> dict[str, int]:
    with counted_step(device) as counts:
        step()
    return counts


def summarise_window(steps: list[dict[str, int]], steady: bool = True) -> dict[str, Any]:
    """One step's counters from a window's steps: their mean (exact where
    the steps agree). ``steady``: every step does the same work (a fixed
    batch shape), so a count that moved between the steps is named
    ``unstable``; steps of varying sequence lengths move FLOPs by design."""
    keys = sorted({k for step in steps for k in step})
    per_step, unstable = {}, []
    for key in keys:
        values = [step.get(key, 0) for step in steps]
        same = min(values) == max(values)
        per_step[key] = values[0] if same else sum(values) / len(values)
        if steady and not same and counters.exact(key):
            unstable.append(key)
    return {"window_steps": len(steps), "per_step": per_step, "unstable": unstable}


def count_window(step: Callable[[], Any], device: torch.device,
                 steps: int = DEFAULT_WINDOW_STEPS) -> dict[str, Any]:
    """Run ``step`` ``steps`` times, each counted on its own."""
    return summarise_window([_count_step(step, device) for _ in range(steps)])


class OptimizerStepWindow:
    """The counting window for training loops that are not the suite's own
    (torchtune's recipes): a step ends where an optimizer step ends, so the
    ``steps`` steps after the ``start``-th optimizer step are counted, each on
    its own, through torch's global optimizer step hook, on every rank.

    On CUDA a profiler spans the window; its runtime API calls and the peak
    allocated are divided evenly over the window's steps.
    """

    def __init__(self, start: int, steps: int, device: torch.device) -> None:
        self.start, self.steps, self.device = start, steps, device
        self.seen = 0
        self.counter: WorkCounter | None = None
        self.per_step: list[dict[str, int]] = []
        self._profile: Any = None

    def _after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.seen += 1
        if self.counter is not None:
            self.counter.__exit__(None, None, None)
            self.per_step.append(dict(self.counter.counts))
            self.counter = None
        if self.start <= self.seen < self.start + self.steps:
            if self._profile is None and self.device.type == "cuda":
                from torch.profiler import ProfilerActivity, profile

                torch.cuda.synchronize(self.device)
                torch.cuda.reset_peak_memory_stats(self.device)
                self._profile = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
                self._profile.start()
            self.counter = WorkCounter()
            self.counter.__enter__()
        elif self._profile is not None and self.seen == self.start + self.steps:
            torch.cuda.synchronize(self.device)
            self._profile.stop()
            self._cuda_facts()

    def _cuda_facts(self) -> None:
        counted = len(self.per_step) or 1
        totals = cuda_api_counts((e.key, e.count) for e in self._profile.key_averages())
        peak = int(torch.cuda.max_memory_allocated(self.device))
        for step in self.per_step:
            step.update({k: v / counted for k, v in totals.items()},
                        **{"memory/peak_allocated": peak})
        self._profile = None

    def __enter__(self) -> OptimizerStepWindow:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._handle = register_optimizer_step_post_hook(self._after_step)
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.remove()
        if self.counter is not None:  # a step the loop never finished: not counted
            self.counter.__exit__(None, None, None)
            self.counter = None
        if self._profile is not None:
            self._profile.stop()
            self._profile = None

    def result(self) -> dict[str, Any] | None:
        # recipe batches differ in sequence length: FLOPs move between steps
        return summarise_window(self.per_step, steady=False) if self.per_step else None
