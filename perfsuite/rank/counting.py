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
- bytes and calls copied host-to-device and device-to-host; a scalar read
  from a device tensor (``.item()``: ``aten::_local_scalar_dense``) is a
  device-to-host copy and a host sync, a read of a CPU scalar is neither.

On CUDA the window also runs ``torch.profiler`` for the runtime API calls
the papers' Table 1 lists: kernel launches, memcpy and memset calls, and
synchronisations (cudaStreamSynchronize, cudaEventSynchronize,
cudaDeviceSynchronize); the memcpys the GPU ran, by direction; the GPU's
busy time (``device_time``); and the peak memory allocated in the window.

Only the step's own calls count. The window synchronises the device around
the step and torch.profiler synchronises it again when it stops, while it
still records (one cudaDeviceSynchronize each: the 2 per step a gate cell
once showed). These calls are the same for every window, whatever the step
does, so the window measures them once per process in a window with no
step in it (after a first one that sets the profiler up) and takes them off
every count: exact, where a cut by timestamps would rest on the host and
CUPTI clocks agreeing to the microsecond. The window adds no
``record_function`` of its own; the step's (the optimizer's, DDP's, a
workload's phase labels) are its operators and count.

What a gate cell's step (MobileNetV2, 158 parameter tensors, DDP on one
GPU, AdamW, fp32, pageable batches) counted, explained:

- 316 ``aten::_local_scalar_dense``: AdamW on CUDA defaults to its foreach
  implementation, whose bias corrections read each parameter's ``step``
  twice (``_get_value``, an ``.item()``); the ``step`` tensors live on the
  CPU unless capturable or fused, so these are host reads, no sync. On the
  CPU AdamW runs its single-tensor implementation: one read, 158.
- 351 memcpy calls, device-to-device but two: 158 ``copy_`` from DDP's
  buckets back into the gradients after the all-reduce, 156 ``copy_`` of
  the BatchNorm buffers DDP broadcasts each forward (running mean and
  variance, batches tracked), 35 ``clone`` inside the in-place ReLU6
  (``aten::hardtanh_``), and the 2 host-to-device copies of images and
  labels.
- 2 cudaStreamSynchronize: those pageable host-to-device copies wait.

Counters are flat ``{key: number}`` dicts per step, keys such as
``ops/aten::convolution``, ``flops``, ``collectives/allreduce/calls``,
``collectives/allreduce/bytes``, ``copies/h2d_bytes``, ``cuda/kernel_launches``,
``cuda/memcpy_d2d_calls``, ``cuda/syncs/cudaStreamSynchronize``,
``memory/peak_allocated``. A window's result has them per step, and beside
them ``device_time`` (seconds per step, None on the CPU): ``per_step_s`` the
time the GPU ran anything (kernels, memcpys, memsets; overlaps on several
streams or devices counted once), ``kernels_s``, ``memcpy_h2d_s``,
``memcpy_d2h_s``, ``memcpy_d2d_s``, ``memset_s`` the time each kind ran.
"""

from __future__ import annotations

import contextlib
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from perfsuite.rank import counters

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
# Memcpys the GPU ran, by direction: kineto names them "Memcpy HtoD (Pageable -> Device)",
# "Memcpy DtoH (Device -> Pinned)", "Memcpy DtoD (Device -> Device)", "Memcpy PtoP (...)"
# (H host, D device, A CUDA array, P a peer device).
_MEMCPY = re.compile(r"^Memcpy ([HDAP])to([HDAP])\b")
MEMCPY_DIRECTIONS = ("h2d", "d2h", "d2d")
DEVICE_TIME = "device_time/"  # per-step keys that carry device_time through a step's counts
DEVICE_TIME_FIELDS = ("per_step_s", "kernels_s", "memcpy_h2d_s", "memcpy_d2h_s", "memcpy_d2d_s",
                      "memset_s")
# GPU-side activity kinds (FunctionEvent.activity_type) that are GPU work; others on the
# device timeline (a record_function's copy, synchronisation records) are not.
_GPU_WORK = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}


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
        elif name == "_local_scalar_dense":  # .item(): a read to the host, a sync on a device
            src, dst = args[0].device, torch.device("cpu")
        else:
            return
        direction = {("cpu", "device"): "h2d", ("device", "cpu"): "d2h"}.get(
            (_device_kind(src), _device_kind(dst)))
        if direction:
            self.counts[f"copies/{direction}_calls"] += 1
            self.counts[f"copies/{direction}_bytes"] += _nbytes(out if name == "_to_copy"
                                                                else args[1] if name == "copy_"
                                                                else args[0])

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


def _memcpy_direction(name: str) -> str | None:
    match = _MEMCPY.match(name)
    if not match:
        return None
    src, dst = (side == "H" for side in match.groups())
    return "h2h" if src and dst else "h2d" if src else "d2h" if dst else "d2d"


def _gpu_work(event: Any) -> str | None:
    """"kernel", "memcpy" or "memset" for a GPU-side event that is GPU work, else None."""
    if getattr(event, "device_type", None) in (None, torch.autograd.DeviceType.CPU):
        return None
    activity = getattr(event, "activity_type", None)
    if activity:  # torch names the kind where it can
        return _GPU_WORK.get(activity)
    if getattr(event, "is_user_annotation", False):
        return None
    name = event.name
    return "memcpy" if name.startswith("Memcpy") else "memset" if name.startswith("Memset") else "kernel"


def _union_s(spans: list[tuple[float, float]]) -> float:
    """Seconds covered by (start, end) spans in microseconds, overlaps once."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(spans):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total * 1e-6


def cuda_facts(events: Iterable[Any]) -> tuple[dict[str, int], dict[str, float]]:
    """Counts and GPU seconds from ``torch.profiler``'s events (``prof.events()``):
    runtime API calls by key (``CUDA_API``), the memcpys the GPU ran by
    direction, and ``device_time``'s fields over the whole profile."""
    api: Counter[str] = Counter()
    directions: Counter[str] = Counter({d: 0 for d in MEMCPY_DIRECTIONS})
    spans: dict[str, list[tuple[float, float]]] = {}
    for event in events:
        work = _gpu_work(event)
        if work is None:
            if getattr(event, "device_type", None) in (None, torch.autograd.DeviceType.CPU):
                api[event.name] += 1
            continue
        if work == "memcpy":
            direction = _memcpy_direction(event.name) or "other"
            directions[direction] += 1
            work = f"memcpy_{direction}"
        span = (float(event.time_range.start), float(event.time_range.end))
        spans.setdefault(work, []).append(span)
        spans.setdefault("all", []).append(span)
    counts = cuda_api_counts(api.items())
    counts.update({f"cuda/memcpy_{d}_calls": n for d, n in directions.items()})
    seconds = {"per_step_s": _union_s(spans.get("all", [])), "kernels_s": _union_s(spans.get("kernel", [])),
               **{f"memcpy_{d}_s": _union_s(spans.get(f"memcpy_{d}", [])) for d in MEMCPY_DIRECTIONS},
               "memset_s": _union_s(spans.get("memset", []))}
    return counts, seconds


class _CudaWindow:
    """torch.profiler over part of a run on one CUDA device, from a synchronised
    start (earlier GPU work is not in it) to a synchronised end (its own GPU
    work all is)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._profile: Any = None

    def start(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self._profile = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
        self._profile.start()

    def stop(self) -> list[Any]:
        torch.cuda.synchronize(self.device)
        self._profile.stop()
        events, self._profile = list(self._profile.events()), None
        return events

    def abandon(self) -> None:
        if self._profile is not None:
            self._profile.stop()
            self._profile = None


# What a window with nothing in it counts, per device: taken off every window's counts.
_OWN_CALLS: dict[str, dict[str, int]] = {}


def own_calls(device: torch.device) -> dict[str, int]:
    """The runtime calls a counting window makes itself on ``device``: those
    of an empty window, measured once per process (the second of two: the
    first also sets the profiler up, which no later window repeats)."""
    key = str(device)
    if key not in _OWN_CALLS:
        for _ in range(2):
            window = _CudaWindow(device)
            window.start()
            events = window.stop()
        _OWN_CALLS[key] = cuda_facts(events)[0]
    return _OWN_CALLS[key]


def _step_facts(events: list[Any], own: dict[str, int], steps: int) -> dict[str, float]:
    """A window's CUDA counts less its own, and its GPU time, per step of ``steps``."""
    counts, seconds = cuda_facts(events)
    per_step = {k: (v - own.get(k, 0)) if steps == 1 else (v - own.get(k, 0)) / steps
                for k, v in counts.items()}
    per_step.update({DEVICE_TIME + k: v / steps for k, v in seconds.items()})
    return per_step


@contextlib.contextmanager
def counted_step(device: torch.device) -> Iterator[dict[str, Any]]:
    """The body run inside counts as one step of a counting window; the
    yielded dict holds its counts once the body is done (on CUDA also the
    runtime calls, GPU time and peak allocated). A step that is a function:
    ``count_window``; a step that is the body of a loop: this."""
    counter, counts = WorkCounter(), {}
    if device.type != "cuda":
        with counter:
            yield counts
        counts.update(counter.counts)
        return
    own = own_calls(device)
    window = _CudaWindow(device)
    window.start()
    try:
        with counter:
            yield counts
    except BaseException:
        window.abandon()
        raise
    events = window.stop()
    counts.update(counter.counts)
    counts.update(_step_facts(events, own, 1))
    counts["memory/peak_allocated"] = int(torch.cuda.max_memory_allocated(device))


def _count_step(step: Callable[[], Any], device: torch.device) -> dict[str, Any]:
    with counted_step(device) as counts:
        step()
    return counts


def summarise_window(steps: list[dict[str, Any]], steady: bool = True) -> dict[str, Any]:
    """One step's counters from a window's steps: their mean (exact where
    the steps agree). ``steady``: every step does the same work (a fixed
    batch shape), so a count that moved between the steps is named
    ``unstable``; steps of varying sequence lengths move FLOPs by design.
    GPU time goes apart, to ``device_time`` (mean over the steps; None
    where nothing ran on a GPU)."""
    keys = sorted({k for step in steps for k in step})
    per_step, unstable, device_time = {}, [], {}
    for key in keys:
        values = [step.get(key, 0) for step in steps]
        if key.startswith(DEVICE_TIME):
            device_time[key[len(DEVICE_TIME):]] = sum(values) / len(values)
            continue
        same = min(values) == max(values)
        per_step[key] = values[0] if same else sum(values) / len(values)
        if steady and not same and counters.exact(key):
            unstable.append(key)
    return {"window_steps": len(steps), "per_step": per_step, "unstable": unstable,
            "device_time": device_time or None}


def count_window(step: Callable[[], Any], device: torch.device,
                 steps: int = DEFAULT_WINDOW_STEPS) -> dict[str, Any]:
    """Run ``step`` ``steps`` times, each counted on its own."""
    return summarise_window([_count_step(step, device) for _ in range(steps)])


class OptimizerStepWindow:
    """The counting window for training loops that are not the suite's own
    (torchtune's recipes): a step ends where an optimizer step ends, so the
    ``steps`` steps after the ``start``-th optimizer step are counted, each on
    its own, through torch's global optimizer step hook, on every rank.

    On CUDA a profiler spans the window; its runtime API calls (less the
    window's own), GPU time and the peak allocated are divided evenly over
    the window's steps.
    """

    def __init__(self, start: int, steps: int, device: torch.device) -> None:
        self.start, self.steps, self.device = start, steps, device
        self.seen = 0
        self.counter: WorkCounter | None = None
        self.per_step: list[dict[str, Any]] = []
        self._window: _CudaWindow | None = None
        self._own: dict[str, int] = {}

    def _after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.seen += 1
        if self.counter is not None:
            self.counter.__exit__(None, None, None)
            self.per_step.append(dict(self.counter.counts))
            self.counter = None
        if self.start <= self.seen < self.start + self.steps:
            if self._window is None and self.device.type == "cuda":
                self._own = own_calls(self.device)
                self._window = _CudaWindow(self.device)
                self._window.start()
            self.counter = WorkCounter()
            self.counter.__enter__()
        elif self._window is not None and self.seen == self.start + self.steps:
            self._cuda_facts(self._window.stop())
            self._window = None

    def _cuda_facts(self, events: list[Any]) -> None:
        shared = _step_facts(events, self._own, len(self.per_step) or 1)
        shared["memory/peak_allocated"] = int(torch.cuda.max_memory_allocated(self.device))
        for step in self.per_step:
            step.update(shared)

    def __enter__(self) -> OptimizerStepWindow:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._handle = register_optimizer_step_post_hook(self._after_step)
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.remove()
        if self.counter is not None:  # a step the loop never finished: not counted
            self.counter.__exit__(None, None, None)
            self.counter = None
        if self._window is not None:
            self._window.abandon()
            self._window = None

    def result(self) -> dict[str, Any] | None:
        # recipe batches differ in sequence length: FLOPs move between steps
        return summarise_window(self.per_step, steady=False) if self.per_step else None
