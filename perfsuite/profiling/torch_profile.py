"""torch.profiler wrapper (the CPU mode and the fallback when nsys is missing).

StepProfiler captures only the measured steps (schedule wait/warmup/active),
labels the training phases with record_function ("data", "forward",
"backward", "optimizer", "comm"), opens a range around every nn.Module's
forward (perfsuite.profiling.modules: the module rows) and, on CUDA, with NVTX ranges of the same
names so an nsys capture of the same run shows the same phases. In "nsys"
mode it records nothing itself: it brackets the measured steps with
cudaProfilerStart/Stop for `nsys profile --capture-range=cudaProfilerApi`.

After the loop it writes the window's chrome trace (gzipped where the path
ends in .gz, as the launcher's does) and reads its summary back from it
(perfsuite.profiling.trace_summary); summary_from_key_averages stays for
callers that hold key_averages() rows already.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from .modules import ModuleRanges
from .summary import H2D, ProfileRow, ProfileSummary
from .trace_summary import PHASES, classify_event, h2d_bytes_from_chrome_trace, summary_from_trace_events

__all__ = ["MODES", "PHASES", "PROFILE_DIR_ENV", "PROFILER_ENV", "TRACE_COMPRESSLEVEL", "StepProfiler",
           "classify_event", "h2d_bytes_from_chrome_trace", "read_summary", "summary_from_key_averages",
           "write_summary"]

MODES = ("torch", "nsys", "off")
PROFILER_ENV = "PERFSUITE_PROFILER"  # torch | nsys | off, set by the launcher per rank
PROFILE_DIR_ENV = "PERFSUITE_PROFILE_DIR"  # where per-rank traces/summaries go
# gzip's fastest level: a chrome trace shrinks about tenfold at ~150 MB/s
# (level 9, torch's own for .gz, takes several times longer for a few % less).
TRACE_COMPRESSLEVEL = 1


def _us(value: float | None) -> float:
    return float(value or 0.0) * 1e-6


def summary_from_key_averages(
    averages: Iterable[Any],
    *,
    rank: int | None = None,
    steps: int | None = None,
    window_s: float | None = None,
    h2d_bytes: float | None = None,
    meta: dict | None = None,
) -> ProfileSummary:
    """Convert profiler key_averages() into a ProfileSummary.

    CPU operators count their self time (rows add up without double
    counting); labelled ranges, collectives and CUDA API calls their
    inclusive time, as nsys reports ranges and API calls; GPU rows their
    device time.
    """
    rows: list[ProfileRow] = []
    for evt in averages:
        on_device = getattr(evt, "device_type", None) not in (None, torch.autograd.DeviceType.CPU)
        kind = classify_event(evt.key, on_device, bool(getattr(evt, "is_user_annotation", False)))
        if kind is None:
            continue
        category, name = kind
        if on_device:
            seconds = _us(getattr(evt, "self_device_time_total", 0)) or _us(getattr(evt, "device_time_total", 0))
        elif category == "cpu_op":
            seconds = _us(evt.self_cpu_time_total)
        else:
            seconds = _us(evt.cpu_time_total)
        rows.append(ProfileRow(name, category, seconds, int(evt.count)))
    summary = ProfileSummary("torch", rows, rank=rank, steps=steps, window_s=window_s, meta=dict(meta or {}))
    h2d = summary.find(H2D, "memcpy")  # pageable and pinned copies are one row by now
    if h2d is not None:
        h2d.bytes = h2d_bytes
    return summary


class StepProfiler:
    """Profile the measured steps of a training loop.

        with StepProfiler("torch", wait=1, warmup=1, active=3) as prof:
            for batch in loader:
                with prof.phase("forward"): ...
                prof.step()          # once at the end of every step
        summary = prof.summary()     # ProfileSummary, or None in nsys/off mode
    """

    def __init__(self, mode: str = "torch", *, wait: int = 1, warmup: int = 1, active: int = 3,
                 rank: int | None = None, trace_path: str | os.PathLike | None = None,
                 record_shapes: bool = False, with_stack: bool = False, cuda: bool | None = None,
                 modules: bool = True) -> None:
        if mode not in MODES:
            raise ValueError(f"profiler mode must be one of {MODES}, not {mode!r}")
        if wait < 0 or warmup < 0 or active < 1:
            raise ValueError("need wait >= 0, warmup >= 0 and active >= 1")
        self.mode = mode
        self.wait, self.warmup, self.active = wait, warmup, active
        self.rank = rank
        self.trace_path = Path(trace_path) if trace_path else None
        self.record_shapes, self.with_stack = record_shapes, with_stack
        self.cuda = torch.cuda.is_available() if cuda is None else cuda
        self._prof: profile | None = None
        self._summary: ProfileSummary | None = None
        self._steps_done = 0
        self._t_start: float | None = None
        self._t_end: float | None = None
        self._nsys_capturing = False
        self._captured: profile | None = None  # a closed window, not yet summarised
        self._modules = ModuleRanges() if modules and mode == "torch" else None

    # -- construction from the launcher's environment ------------------
    @classmethod
    def from_env(cls, rank: int | None = None, **kwargs: Any) -> StepProfiler:
        """Mode from $PERFSUITE_PROFILER (default off); the chrome trace goes
        to $PERFSUITE_PROFILE_DIR/rank<r>.trace.json.gz when that is set."""
        mode = os.environ.get(PROFILER_ENV, "off") or "off"
        mode = "torch" if mode == "auto" else mode
        out_dir = os.environ.get(PROFILE_DIR_ENV)
        if out_dir and mode == "torch" and "trace_path" not in kwargs:
            kwargs["trace_path"] = Path(out_dir) / f"rank{rank if rank is not None else 0}.trace.json.gz"
        return cls(mode, rank=rank, **kwargs)

    @property
    def capture_begins_after(self) -> int:
        """Steps run before the capture window opens."""
        return self.wait + self.warmup

    # -- context manager ---------------------------------------------
    def __enter__(self):  # returns self
        if self.mode == "torch":
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
            self._prof = profile(
                activities=activities,
                schedule=schedule(wait=self.wait, warmup=self.warmup, active=self.active, repeat=1),
                on_trace_ready=self._on_trace_ready,
                record_shapes=self.record_shapes,
                with_stack=self.with_stack,
            )
            self._prof.__enter__()
            if self._modules is not None:
                self._modules.__enter__()
        if self.capture_begins_after == 0:
            self._open_window()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._t_start is not None and self._t_end is None:
            self._close_window()
        if self._modules is not None:
            self._modules.__exit__(*exc)
        if self._prof is not None:
            self._prof.__exit__(*exc)  # fires on_trace_ready if still recording
            self._prof = None
        self._export()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Label a phase: a record_function range, plus an NVTX range on CUDA."""
        if self.mode == "off":
            yield
            return
        nvtx = self.cuda and torch.cuda.is_available()
        if nvtx:
            torch.cuda.nvtx.range_push(name)
        try:
            with record_function(name):
                yield
        finally:
            if nvtx:
                torch.cuda.nvtx.range_pop()

    def step(self) -> None:
        """Mark the end of one training step."""
        self._steps_done += 1
        if self._steps_done == self.capture_begins_after:
            self._open_window()
        elif self._steps_done == self.capture_begins_after + self.active:
            self._close_window()
        if self._prof is not None:
            self._prof.step()

    # -- window bookkeeping ------------------------------------------
    def _sync(self) -> None:
        if self.cuda and torch.cuda.is_available():
            torch.cuda.synchronize()

    def _open_window(self) -> None:
        self._sync()
        self._t_start = time.perf_counter()
        if self.mode == "nsys" and self.cuda and torch.cuda.is_available():
            torch.cuda.profiler.start()  # cudaProfilerStart: nsys starts recording
            self._nsys_capturing = True

    def _close_window(self) -> None:
        if self._t_start is None or self._t_end is not None:
            return
        self._sync()
        self._t_end = time.perf_counter()
        if self._nsys_capturing:
            torch.cuda.profiler.stop()  # cudaProfilerStop: nsys stops (capture-range-end=stop)
            self._nsys_capturing = False

    @property
    def captured_steps(self) -> int:
        return max(0, min(self.active, self._steps_done - self.capture_begins_after))

    def _on_trace_ready(self, prof: profile) -> None:
        """Called by torch inside ``step()`` at the end of the window, that is inside
        the last captured step, which the workload times: only note the capture here.
        Reading the events and writing the trace (seconds for a chrome trace) wait
        for ``__exit__``, after the training loop (``_export``)."""
        if self._t_end is None:
            self._close_window()
        self._captured = prof

    def _export(self) -> None:
        """Write the captured window's chrome trace and summarise it, once,
        outside the timed steps (``__exit__``; ``summary()`` if that never ran).

        Kineto writes the trace in C++; the summary is read back from it
        (trace_summary), not from ``key_averages()``, whose Python pass over
        every event took 6 s of the 7 s between a smoke LLM cell's last step
        and its result. A trace path ending in .gz is kept gzipped; without a
        path the trace is only read and deleted."""
        prof, self._captured = self._captured, None
        if prof is None:
            return
        began = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="perfsuite-trace-") as tmp:
            keep = self.trace_path
            raw = Path(tmp) / "trace.json"
            if keep is not None:
                keep.parent.mkdir(parents=True, exist_ok=True)
                if keep.suffix != ".gz":
                    raw = keep
            prof.export_chrome_trace(str(raw))
            written = time.perf_counter()
            data = raw.read_bytes()
            events = json.loads(data).get("traceEvents", [])
            window = None if self._t_start is None or self._t_end is None else self._t_end - self._t_start
            meta = {"device": "cuda" if self.cuda else "cpu", "torch": torch.__version__,
                    "schedule": {"wait": self.wait, "warmup": self.warmup, "active": self.active},
                    "exported": "after the timed steps", "trace_events": len(events)}
            self._summary = summary_from_trace_events(events, rank=self.rank, steps=self.captured_steps,
                                                      window_s=window, meta=meta)
            del events
            summarised = time.perf_counter()
            if keep is not None and keep != raw:
                partial = keep.with_name(keep.name + ".part")
                with open(partial, "wb") as handle:
                    handle.write(gzip.compress(data, compresslevel=TRACE_COMPRESSLEVEL, mtime=0))
                os.replace(partial, keep)
            if keep is not None:
                meta["trace"] = str(keep)
                meta["trace_bytes"] = keep.stat().st_size
        meta.update(trace_write_s=written - began, summary_s=summarised - written,
                    export_s=time.perf_counter() - began)
        self._summary.meta.update(meta)

    def summary(self) -> ProfileSummary | None:
        """The captured summary (torch mode, once the window or the with-block
        closed); None in nsys mode (read the nsys report), in off mode, and
        when the loop ended before the window opened."""
        self._export()
        return self._summary


def write_summary(summary: ProfileSummary, path: str | os.PathLike) -> Path:
    """Write a summary as JSON (strict: no NaN)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary.to_dict(), indent=1, allow_nan=False), encoding="utf-8")
    return path


def read_summary(path: str | os.PathLike) -> ProfileSummary:
    return ProfileSummary.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))
