"""A rank's side of a workload of one's own: ``perf_dist`` and ``perf_steps``.

``Dist`` is what the ``perf_dist`` fixture hands a test running in a rank:
its initialised process group (gloo on CPU, NCCL on its one GPU), rank,
world size and device. ``Steps`` is ``perf_steps``: it wraps the training
loop's iterable and measures it as the built-in cells measure theirs
(``perfsuite.rank.meter.StepTimer``: CUDA events at step boundaries on a GPU,
``time.perf_counter`` on CPU, warm-up steps excluded), reports each step's
progress (which a hang's diagnosis names), applies injected faults
(``--perf-option fault=...``), profiles the launcher's profiler window,
and counts the work counters over a few steps after the timed ones
(``perfsuite.rank.counting``). A workload function (``module:function``, an
entry point) uses the same two::

    def run(cell, ctx):
        dist = Dist.start(cell, ctx)
        steps = Steps(cell, ctx)
        model = DDP(build().to(dist.device), device_ids=dist.device_ids)
        for batch in steps(batches(), warmup=cell.warmup_steps, items=cell.batch_size):
            train_step(model, batch)
        return steps.record()

torch is imported when used, and so are perfsuite's modules that import it
(rank.meter, rank.counting, profiling.torch_profile), not here: a test file
may import this module and still collect without torch.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable, Iterator
from typing import Any

from perfsuite.rank import faults

PROFILED_STEPS = 10  # as the built-in workloads: a window, not the whole run


def measuring_modules() -> None:
    """Import what measuring imports (torch among it), ahead of the loop."""
    import perfsuite.profiling.torch_profile  # noqa: F401
    import perfsuite.rank.counting  # noqa: F401
    import perfsuite.rank.meter  # noqa: F401


class Dist:
    """The rank a test or workload runs in (the ``perf_dist`` fixture).

    ``rank``, ``world_size``, ``local_rank``; ``device`` (a ``torch.device``:
    ``cpu``, or ``cuda:<local_rank>``, already current); ``device_ids``
    (DDP's argument: ``[local_rank]`` on a GPU, None on CPU); ``backend``;
    ``group`` (the default process group); ``cell`` and ``options`` (the
    launch's ``--perf-option`` values); ``seed``.
    """

    def __init__(self, cell: Any, ctx: Any) -> None:
        import torch

        self.cell, self.ctx = cell, ctx
        self.rank, self.world_size, self.local_rank = ctx.rank, ctx.world_size, ctx.local_rank
        self.device = torch.device(ctx.device)
        self.device_ids = [self.device.index] if self.device.type == "cuda" else None
        self.backend = ctx.backend()
        self.options, self.seed = ctx.options, ctx.seed

    @classmethod
    def start(cls, cell: Any, ctx: Any) -> Dist:
        """This rank's process group, initialised (the cell's timeout is its own)."""
        ctx.init_process_group(timeout_s=cell.timeout_s)
        return cls(cell, ctx)

    @property
    def group(self) -> Any:
        import torch.distributed as dist

        return dist.group.WORLD

    def __repr__(self) -> str:
        return (f"Dist(rank={self.rank}, world_size={self.world_size}, device={self.device}, "
                f"backend={self.backend!r})")


class Steps:
    """The ``perf_steps`` fixture: ``for batch in perf_steps(loader, warmup=3): ...``

    ``perf_steps(iterable, *, warmup=None, steps=None, items=1, count=None)``
    yields the iterable's items; each loop body is one training step.
    ``warmup``: steps timed but left out of the samples (default: the
    cell's ``warmup_steps``, 3); ``steps``: measured steps after them
    (default: until the iterable ends); ``items``: what one step of one rank
    processes (samples, tokens), for throughput: items x ranks / step time
    (without: steps per second);
    ``count``: steps after the measured ones run under the work counters,
    untimed (default 2, or the option ``count_steps``; an iterable that ended
    leaves none). Getting the next item is part of a step, as in the
    built-in cells. One measured loop per test.
    """

    def __init__(self, cell: Any, ctx: Any) -> None:
        self.cell, self.ctx = cell, ctx
        self._state: dict[str, Any] | None = None

    def __call__(self, iterable: Iterable, *, warmup: int | None = None, steps: int | None = None,
                 items: float | None = None, count: int | None = None) -> Iterator:
        from perfsuite.rank.counting import DEFAULT_WINDOW_STEPS

        if self._state is not None:
            raise RuntimeError("perf_steps measures one loop per test: put every measured step "
                               "in one `for ... in perf_steps(...)`")
        warmup = self.cell.warmup_steps if warmup is None else int(warmup)
        count = int(self.ctx.options.get("count_steps", DEFAULT_WINDOW_STEPS)) if count is None else count
        if warmup < 0 or (steps is not None and steps < 1) or count < 0 or (
                items is not None and not items > 0):
            raise ValueError("perf_steps: warmup >= 0, steps >= 1 (or None), count >= 0, "
                             "items > 0 (or None)")
        self._state = {"warmup": warmup, "steps": steps, "items": items, "count": count}
        return self._loop(iter(iterable), warmup, steps, count, _length(iterable))

    def _loop(self, batches: Iterator, warmup: int, steps: int | None, count: int,
              length: int | None) -> Iterator:
        import torch

        from perfsuite.profiling.torch_profile import StepProfiler
        from perfsuite.rank.counting import counted_step
        from perfsuite.rank.meter import StepTimer, WallClock, reset_peak_memory

        ctx, state = self.ctx, self._state
        device = torch.device(ctx.device)
        timer = state["timer"] = StepTimer(device, warmup)
        total = warmup + steps if steps is not None else (length or 0)
        fault = faults.from_options(ctx.options)
        measured = max((total or 10**9) - warmup, 1)
        profiler = state["profiler"] = StepProfiler.from_env(
            rank=ctx.rank, wait=warmup - min(warmup, 1), warmup=min(warmup, 1),
            active=min(PROFILED_STEPS, measured), cuda=device.type == "cuda")
        clock = state["clock"] = WallClock(device)
        reset_peak_memory(device)
        index, ended = 0, False
        with profiler, clock:
            while steps is None or index < warmup + steps:
                ctx.report_progress(index, "train", total)
                faults.at_step(fault, ctx.rank, index)
                timer.mark()
                try:
                    item = next(batches)
                except StopIteration:  # that mark ended the last step
                    ended = True
                    break
                began = time.perf_counter()
                yield item
                if fault is not None and fault.kind == "slow":  # injected: the step's own time, scaled
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    faults.slow_down(fault, ctx.rank, index, time.perf_counter() - began)
                index += 1
                state["done"] = index
                profiler.step()
            if not ended:
                timer.mark()
        state["window_started"] = time.perf_counter()
        window: list[dict[str, int]] = state.setdefault("window", [])
        if ended or count == 0:
            state["no_window"] = ("the iterable ended before the counting window" if ended
                                  else "count=0")
            return
        ctx.report_progress(index, "count")
        for _ in range(count):  # every rank counts alike: the same steps after the timed ones
            try:
                item = next(batches)
            except StopIteration:
                break
            with counted_step(device) as counts:
                yield item
            window.append(counts)
        state["window_s"] = time.perf_counter() - state["window_started"]

    @property
    def used(self) -> bool:
        return self._state is not None and "timer" in self._state

    def record(self) -> dict[str, Any]:
        """The rank record's part a workload returns: metrics, steps,
        counters, profile and info, as the built-in workloads return them."""
        from perfsuite.rank.counting import summarise_window
        from perfsuite.rank.meter import metric, peak_memory

        if not self.used:
            raise RuntimeError("nothing was measured: iterate the training loop over "
                               "perf_steps(iterable) (perfsuite.steps.Steps)")
        import torch

        state = self._state
        device = torch.device(self.ctx.device)
        samples = state["timer"].samples()
        step_time = statistics.median(samples) if samples else float("nan")
        items = state["items"]  # per rank and step; without: steps per second
        per_step, unit = (1.0, "steps/s") if items is None else (items * self.ctx.world_size, "items/s")
        clock = state["clock"]
        window = state.get("window") or []
        summary = state["profiler"].summary()
        return {
            "metrics": {"step_time": metric(step_time, "s", samples),
                        "throughput": metric(per_step / step_time if samples else 0.0, unit),
                        "total_time": metric(clock.seconds if clock.stopped else 0.0, "s"),
                        **peak_memory(device)},
            "steps": len(samples),
            "counters": summarise_window(window) if window else None,
            "profile": summary.to_dict() if summary else None,
            "info": {"warmup_steps": state["warmup"], "steps_run": state.get("done", 0),
                     "items_per_step": state["items"], "count_window_steps": len(window),
                     "count_window_s": state.get("window_s", 0.0),
                     "no_count_window": state.get("no_window"),
                     "torch_threads": torch.get_num_threads()}}


def _length(iterable: Iterable) -> int | None:
    try:
        return len(iterable)  # type: ignore[arg-type]
    except TypeError:
        return None
