"""A ProfileSummary from a torch.profiler (Kineto) chrome trace, without torch.

torch.profiler's own ``key_averages()`` builds a Python object for every
event of the window, with some forty calls into C++ each: 6 s for 25 000 CPU
events on a 2-core VM, and a GPU step of an 8B model has far more events.
The chrome trace holds the same events and is written by Kineto in C++; one
``json.loads`` and one pass over it give the same rows (the tests hold the
two side by side) in a twentieth of the time, and the host-to-device bytes
that key_averages lacks.

Rows follow key_averages: CPU operators count their self time (their time
less that of the CPU events nested in them on the same thread, a child with
its parent's name that is its only child folded into it, as torch does);
labelled ranges, collectives and CUDA API calls their inclusive time; GPU
kernels, copies and sets their device time.

Module rows (category "module") come from the ranges perfsuite.profiling.
modules opens around each ``nn.Module``'s forward (``module::NAME (Class)``):
"NAME (Class) forward" is the range's time less that of the modules called
inside it (Python time in a module is its own), "NAME (Class) backward" the
autograd nodes its forward's operators made (matched by the operators'
sequence numbers). Every row also carries the spread of its time per step
(``step_sd_s``) over the trace's ``ProfilerStep`` ranges, whose durations go
to ``meta["step_times_s"]``: the attribution diff's noise.
"""

from __future__ import annotations

import bisect
import gzip
import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .summary import H2D, ProfileRow, ProfileSummary, api_base_name, canonical_memop

PHASES = ("data", "forward", "backward", "optimizer", "comm")

_COLLECTIVE = re.compile(r"^(c10d::|c10d_functional::|_c10d_functional::|gloo:|nccl:|record_param_comms)")
_CUDA_API = re.compile(r"^cu(da)?[A-Z]")
_MEMCPY_KIND = re.compile(r"^Memcpy\s+(\w+)")
MODULE_PREFIX = "module::"  # the ranges perfsuite.profiling.modules opens
_BACKWARD_NODE = "autograd::engine::evaluate_function: "

# Kineto's categories: host-side events nest on their thread; device-side
# ones are timed on the GPU. Others (flows, instants, overhead) are no rows.
CPU_CATEGORIES = frozenset({"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "python_function"})
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
# torch.autograd.profiler_util._filter_name: utility ops key_averages leaves out
_FILTERED = frozenset({"profiler::_record_function_enter", "profiler::_record_function_enter_new",
                       "profiler::_record_function_exit", "aten::is_leaf", "aten::output_nr", "aten::_version"})


def classify_event(key: str, on_device: bool, user_annotation: bool = False) -> tuple[str, str] | None:
    """(category, canonical name) for one profiler event or row; None to skip it."""
    if key.startswith("ProfilerStep"):
        return None if on_device else ("nvtx", "step")
    if key.startswith(MODULE_PREFIX):
        return None if on_device else ("module", key[len(MODULE_PREFIX):] + " forward")
    if on_device:
        if user_annotation:
            return None  # GPU-side copy of a record_function range
        if key.startswith("Memset"):
            return "memset", "CUDA memset"
        m = _MEMCPY_KIND.match(key)
        if m:  # "Memcpy HtoD (Pinned -> Device)" -> nsys's "CUDA memcpy Host-to-Device"
            return "memcpy", canonical_memop(f"CUDA memcpy {m.group(1)}")
        return "kernel", key
    if _COLLECTIVE.match(key):  # before annotations: c10d labels gloo ops with record_function
        return "collective", key
    if user_annotation or key in PHASES:
        return "nvtx", key
    if _CUDA_API.match(key):
        return "cuda_api", api_base_name(key)
    return "cpu_op", key


def read_chrome_trace(path: str | os.PathLike) -> dict[str, Any]:
    """A chrome trace file, plain or gzipped (``.gz``)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        return json.loads(handle.read())


class _Span:
    __slots__ = ("start", "end", "name", "cat", "parent", "children", "seq")

    def __init__(self, start: int, end: int, name: str, cat: str, seq: Any = None) -> None:
        self.start, self.end, self.name, self.cat, self.seq = start, end, name, cat, seq
        self.parent: _Span | None = None
        self.children: list[_Span] = []


def _nest(spans: list[_Span]) -> list[_Span]:
    """Parent links on one thread, as torch's EventList._build_tree makes them;
    returns the spans key_averages keeps (folded duplicates removed)."""
    ordered = sorted(spans, key=lambda s: (s.start, -s.end))
    stack: list[_Span] = []
    for span in ordered:
        while stack:
            parent = stack[-1]
            if span.start >= parent.end or span.end > parent.end:
                stack.pop()
            else:
                parent.children.append(span)
                span.parent = parent
                break
        stack.append(span)
    kept = ordered
    while True:  # EventList._remove_dup_nodes: an only child of the same name is its parent
        dropped = set()
        for span in kept:
            parent = span.parent
            if parent is not None and parent.name == span.name and len(parent.children) == 1:
                parent.children = span.children
                for child in span.children:
                    child.parent = parent
                dropped.add(id(span))
        if not dropped:
            return kept
        kept = [s for s in kept if id(s) not in dropped]


def _ns(value: Any) -> int:
    return round(float(value) * 1000)  # the trace's microseconds, ns exact


def summary_from_trace_events(events: Iterable[Mapping[str, Any]], *, rank: int | None = None,
                              steps: int | None = None, window_s: float | None = None,
                              meta: dict | None = None) -> ProfileSummary:
    """The rows of one chrome trace's ``traceEvents`` (see the module doc)."""
    threads: dict[tuple[Any, Any], list[_Span]] = {}
    device: list[tuple[tuple[str, str] | None, int, int]] = []
    h2d_bytes, h2d_seen = 0.0, False
    for event in events:
        if event.get("ph") != "X":
            continue
        cat, name = event.get("cat"), str(event.get("name", ""))
        if cat in DEVICE_CATEGORIES:
            device.append((classify_event(name, True), _ns(event.get("dur", 0)), _ns(event.get("ts", 0))))
            if cat == "gpu_memcpy" and "HtoD" in name:
                h2d_seen = True
                h2d_bytes += float((event.get("args") or {}).get("bytes", 0))
        elif cat in CPU_CATEGORIES and name not in _FILTERED:
            start = _ns(event.get("ts", 0))
            span = _Span(start, start + _ns(event.get("dur", 0)),
                         "ProfilerStep*" if name.startswith("ProfilerStep#") else name, cat,
                         (event.get("args") or {}).get("Sequence number"))
            threads.setdefault((event.get("pid"), event.get("tid")), []).append(span)
    nested = [_nest(spans) for spans in threads.values()]
    bounds = sorted((s.start, s.end) for spans in nested for s in spans if s.name == "ProfilerStep*")
    totals = _Totals([start for start, _ in bounds])
    for kind, ns, start in device:
        totals.add(kind, ns, start)
    forward_of = _forward_modules(nested)
    for spans in nested:
        for span in spans:
            kind = classify_event(span.name, False, span.cat == "user_annotation")
            if kind is None:
                continue
            ns = span.end - span.start
            if kind[0] == "cpu_op":
                ns -= sum(child.end - child.start for child in span.children)
                module = forward_of.get(span.seq) if span.name.startswith(_BACKWARD_NODE) else None
                if module is not None and not _inside_backward_node(span):
                    totals.add(("module", module + " backward"), span.end - span.start, span.start)
            elif kind[0] == "module":
                ns -= sum(child.end - child.start for child in _inner_modules(span))
            totals.add(kind, ns, span.start)
    meta = {**(meta or {}), "step_times_s": [(end - start) * 1e-9 for start, end in bounds]}
    summary = ProfileSummary("torch", totals.rows(), rank=rank, steps=steps, window_s=window_s, meta=meta)
    h2d = summary.find(H2D, "memcpy")  # pageable and pinned copies are one row by now
    if h2d is not None:
        h2d.bytes = h2d_bytes if h2d_seen else None
    return summary


class _Totals:
    """Per row: nanoseconds and calls over the trace, and nanoseconds in
    each step (an event belongs to the step its start falls in)."""

    def __init__(self, step_starts: list[int]) -> None:
        self.step_starts = step_starts
        self.totals: dict[tuple[str, str], list[Any]] = {}

    def add(self, kind: tuple[str, str] | None, ns: int, start: int) -> None:
        if kind is None:
            return
        row = self.totals.setdefault(kind, [0, 0, [0] * len(self.step_starts)])
        row[0] += ns
        row[1] += 1
        if self.step_starts:
            row[2][max(bisect.bisect_right(self.step_starts, start) - 1, 0)] += ns

    def rows(self) -> list[ProfileRow]:
        out = []
        for (category, name), (ns, calls, per_step) in self.totals.items():
            sd = None
            if len(per_step) >= 2:
                mean = sum(per_step) / len(per_step)
                sd = math.sqrt(sum((x - mean) ** 2 for x in per_step) / (len(per_step) - 1)) * 1e-9
            out.append(ProfileRow(name, category, ns * 1e-9, int(calls), step_sd_s=sd))
        return out


def _inner_modules(span: _Span) -> Iterable[_Span]:
    """The module ranges called inside ``span`` (not those inside them)."""
    for child in span.children:
        if child.name.startswith(MODULE_PREFIX):
            yield child
        else:
            yield from _inner_modules(child)


def _forward_modules(nested: list[list[_Span]]) -> dict[Any, str]:
    """Sequence number of a forward operator -> the module whose forward ran it."""
    out: dict[Any, str] = {}
    for spans in nested:
        for span in spans:
            if span.seq is None or span.seq in out or span.cat != "cpu_op" or span.name.startswith(_BACKWARD_NODE):
                continue
            parent = span.parent
            while parent is not None and not parent.name.startswith(MODULE_PREFIX):
                parent = parent.parent
            if parent is not None:
                out[span.seq] = parent.name[len(MODULE_PREFIX):]
    return out


def _inside_backward_node(span: _Span) -> bool:
    parent = span.parent
    while parent is not None:
        if parent.name.startswith(_BACKWARD_NODE):
            return True
        parent = parent.parent
    return False


def summary_from_chrome_trace(path: str | os.PathLike, **kwargs: Any) -> ProfileSummary:
    """summary_from_trace_events of a trace file (``perfsuite profile`` of a
    torch.profiler trace, and the tests)."""
    return summary_from_trace_events(read_chrome_trace(path).get("traceEvents", []), **kwargs)


def h2d_bytes_from_chrome_trace(path: str | os.PathLike) -> float | None:
    """Bytes copied host-to-device, from the "bytes" arg of gpu_memcpy events
    (key_averages has no byte counts)."""
    total, seen = 0.0, False
    for event in read_chrome_trace(path).get("traceEvents", []):
        if event.get("cat") == "gpu_memcpy" and "HtoD" in event.get("name", ""):
            seen = True
            total += float((event.get("args") or {}).get("bytes", 0))
    return total if seen else None
