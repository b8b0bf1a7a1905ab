"""MobileNetV2 image classification under the paper's data-parallel strategies.

- ``dp``: one process, ``nn.DataParallel`` over ``world_size`` GPUs; its global
  batch is ``batch_size * world_size`` so each GPU sees the same per-device
  batch as under DDP.
- ``ddp``: every rank iterates the whole dataset in the same order (the
  paper's "no workload distribution": N GPUs do N times the work).
- ``ddp-rr``: every rank loads and moves every batch to its device (as the
  paper did) but trains only on batches ``i % world == rank``; the batch count
  is capped at a multiple of the world size, otherwise one rank would wait in
  an all-reduce the others never join.
- ``ddp-ds``: ``DistributedSampler`` gives each rank its own shard.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler
from torchvision.models import mobilenet_v2

from perfsuite.cells import Cell
from perfsuite.context import RankContext
from perfsuite.profiling.torch_profile import StepProfiler
from perfsuite.rank import counting, faults
from perfsuite.rank.meter import (
    DataWaits,
    MeasuredSteps,
    StepTimer,
    WallClock,
    metric,
    peak_memory,
    reset_peak_memory,
)
from perfsuite.rank.windows import Windows
from perfsuite.workloads import image_data

NUM_CLASSES = 10


def steps_per_epoch(strategy: str, batches: int, world_size: int, max_steps: int) -> int:
    """Training steps every rank takes in one epoch (the same on all ranks)."""
    steps = batches // world_size if strategy == "ddp-rr" else batches
    return min(steps, max_steps) if max_steps > 0 else steps


def images_per_step(cell: Cell) -> int:
    """Distinct dataset images one step advances, summed over ranks."""
    if cell.strategy == "ddp":
        return cell.batch_size  # every rank trains on the same batch
    return cell.batch_size * cell.world_size


# Cell.tf32 -> (cuDNN convolutions, matmuls): torch's fp32_precision values.
# Set explicitly: "fp32" would otherwise mean whatever the installed torch
# defaults to (torch 2.14: convolutions TF32, matmuls strict), and a GPU's
# FP32 / FP64 ratio would silently be a TF32 one or not.
_FP32_MATH = {"off": ("ieee", "ieee"), "conv": ("tf32", "ieee"), "all": ("tf32", "tf32")}


def set_fp32_math(cell: Cell) -> None:
    """This process's TF32 switches, as the cell says (``Cell.tf32``)."""
    conv, matmul = _FP32_MATH[cell.tf32]
    backends = torch.backends
    if hasattr(backends.cudnn, "conv"):  # the fp32_precision API; never mixed with allow_tf32
        backends.cudnn.conv.fp32_precision = conv
        backends.cudnn.rnn.fp32_precision = conv  # as conv: cudnn.allow_tf32 reads refuse the two differing
        backends.cuda.matmul.fp32_precision = matmul
    else:
        backends.cudnn.allow_tf32 = conv == "tf32"
        backends.cuda.matmul.allow_tf32 = matmul == "tf32"


def tf32_in_use(device: torch.device) -> tuple[bool, bool]:
    """(convolutions, matmuls) of fp32 tensors on TF32 tensor cores on ``device``:
    the switches as set, on a GPU that has TF32 (compute capability 8.0 on),
    convolutions through cuDNN."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] < 8:
        return False, False
    backends = torch.backends
    if hasattr(backends.cudnn, "conv"):
        conv = backends.cudnn.conv.fp32_precision == "tf32"
        matmul = backends.cuda.matmul.fp32_precision == "tf32"
    else:
        conv, matmul = backends.cudnn.allow_tf32, backends.cuda.matmul.allow_tf32
    return conv and backends.cudnn.enabled, matmul


def effective_precision(cell: Cell, device: torch.device | None = None) -> str:
    """What ran, for the result: fp32 says whether TF32 tensor cores did."""
    if cell.precision == "fp32":
        conv, matmul = tf32_in_use(device or torch.device("cpu"))
        tf32 = " and ".join(name for name, on in (("convolutions", conv), ("matmuls", matmul)) if on)
        return f"fp32 ({tf32} TF32)" if tf32 else "fp32 (strict)"
    return {"fp64": "fp64", "fp16": "fp16-autocast+gradscaler",
            "bf16": "bf16-autocast"}[cell.precision]


def build_model(cell: Cell, ctx: RankContext) -> tuple[nn.Module, nn.Module]:
    """The wrapped model to train and the bare module to evaluate."""
    device = torch.device(ctx.device)
    set_fp32_math(cell)
    torch.manual_seed(ctx.seed)
    model = mobilenet_v2(num_classes=NUM_CLASSES)
    if cell.precision == "fp64":
        model = model.double()
    if cell.memory_format == "nhwc":
        model = model.to(memory_format=torch.channels_last)
    model = model.to(device)
    if cell.strategy == "dp":
        ids = list(range(cell.world_size)) if device.type == "cuda" else None
        return nn.DataParallel(model, device_ids=ids), model
    ids = [device.index] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=ids), model


def loader_workers(cell: Cell) -> int:
    """DataLoader worker processes of one process: the cell's ``loader_workers``
    per GPU it feeds. A ``dp`` process drives ``world_size`` GPUs from one
    DataLoader, so it gets ``world_size`` times as many (as many as the DDP
    ranks of the same GPUs have together); every other strategy runs one
    process per GPU."""
    return cell.loader_workers * (cell.world_size if cell.strategy == "dp" else 1)


def build_loader(cell: Cell, ctx: RankContext, dataset) -> DataLoader:
    """One DataLoader for every epoch of the run (``epoch_batches`` starts
    each): its worker processes, if any, persist from one epoch to the next
    rather than start anew (the papers' loop re-iterates one loader)."""
    sampler = None
    if cell.strategy == "ddp-ds":
        sampler = DistributedSampler(dataset, num_replicas=ctx.world_size, rank=ctx.rank,
                                     shuffle=True, seed=ctx.seed)
    batch = cell.batch_size * (cell.world_size if cell.strategy == "dp" else 1)
    pin = cell.pin_memory and ctx.device.startswith("cuda")
    workers = loader_workers(cell)
    return DataLoader(dataset, batch_size=batch, sampler=sampler, shuffle=sampler is None,
                      generator=torch.Generator() if sampler is None else None, pin_memory=pin,
                      num_workers=workers, drop_last=False, persistent_workers=workers > 0)


def epoch_batches(loader: DataLoader, ctx: RankContext, epoch: int):
    """The batches of ``epoch``: the same order on every rank, seeded by the
    epoch (with in-process loading, the order of a loader built per epoch)."""
    if isinstance(loader.sampler, DistributedSampler):
        loader.sampler.set_epoch(epoch)
    else:
        loader.generator.manual_seed(ctx.seed + epoch)
    return iter(loader)


def _autocast(cell: Cell, device: torch.device):
    if cell.precision == "fp16":
        return torch.autocast(device.type, dtype=torch.float16)
    if cell.precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _no_phase(name: str):
    return contextlib.nullcontext()


def cosine_factor(step: int, total_steps: int) -> float:
    """The share of the learning rate left after ``step`` of ``total_steps``."""
    return 0.5 * (1.0 + math.cos(math.pi * min(step, total_steps) / total_steps))


def make_train_step(cell: Cell, model: nn.Module, device: torch.device, phase=_no_phase,
                    total_steps: int = 0):
    """One optimisation step on a batch already on the device; returns the loss.

    ``phase(name)`` labels forward / backward / optimizer for a profiler.
    With ``cell.lr_decay`` "cosine" the learning rate falls from ``cell.lr``
    to zero over ``total_steps`` steps.
    """
    optimizer = torch.optim.AdamW(model.parameters(), lr=cell.lr)
    decay = None
    if cell.lr_decay == "cosine" and total_steps > 0:  # zero from then on (the counting window)
        decay = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: cosine_factor(
            step, total_steps))
    scaler = torch.amp.GradScaler(device.type, enabled=cell.precision == "fp16")
    loss_fn = nn.CrossEntropyLoss()

    def train_step(images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        with phase("forward"), _autocast(cell, device):
            loss = loss_fn(model(images), labels)
        with phase("backward"):
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
        with phase("optimizer"):
            scaler.step(optimizer)
            scaler.update()
            if decay is not None:
                decay.step()
        return loss.detach()

    train_step.optimizer = optimizer  # what its steps change, for a caller that asks
    return train_step


def evaluate(cell: Cell, ctx: RankContext, module: nn.Module, dataset) -> float:
    """Top-1 accuracy over the whole test split; ranks share the work."""
    device = torch.device(ctx.device)
    sharded = cell.strategy != "dp" and dist.is_initialized()
    indices = range(ctx.rank, len(dataset), ctx.world_size) if sharded else range(len(dataset))
    loader = DataLoader(torch.utils.data.Subset(dataset, list(indices)),
                        batch_size=max(cell.batch_size, 64))
    counts = torch.zeros(2, dtype=torch.float64, device=device)
    module.eval()
    with torch.no_grad(), _autocast(cell, device):
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            if cell.memory_format == "nhwc":
                images = images.contiguous(memory_format=torch.channels_last)
            counts[0] += (module(images).argmax(1) == labels).sum()
            counts[1] += labels.numel()
    if sharded:
        dist.all_reduce(counts)
    module.train()
    return float(counts[0] / counts[1])


def other_work(partial: bool, epoch_first: bool, loader: DataLoader) -> bool:
    """Whether a step does other work than the cell's (see MeasuredSteps):
    an epoch's partial last batch, or its first where the loader's workers
    start the epoch with nothing fetched. Alike on every rank and side."""
    return partial or (epoch_first and loader.num_workers > 0)


def endless(loader: DataLoader, ctx: RankContext, steps: int):
    """An epoch's batch iterator and whether the step is the epoch's first,
    once per step, epoch after epoch: the steps of resident windows
    (perfsuite.rank.windows), which end when told."""
    epoch = 0
    while True:
        batches = epoch_batches(loader, ctx, epoch)
        for step in range(steps):
            yield batches, step == 0
        epoch += 1


PROFILED_STEPS = 10  # a window, not the whole run: traces grow with every step


def _step_profiler(cell: Cell, ctx: RankContext):
    """The launcher's profiler choice, windowed on the first measured steps."""
    measured = max(cell.epochs * (cell.max_steps or 10**9) - cell.warmup_steps, 1)
    warmup = min(cell.warmup_steps, 1)
    return StepProfiler.from_env(rank=ctx.rank, wait=cell.warmup_steps - warmup,
                                 warmup=warmup, active=min(PROFILED_STEPS, measured),
                                 cuda=ctx.device.startswith("cuda"))


def run(cell: Cell, ctx: RankContext) -> dict[str, Any]:
    device = torch.device(ctx.device)
    if cell.strategy != "dp":
        ctx.init_process_group(timeout_s=cell.timeout_s)
    train_x, train_y, test_x, test_y = image_data.load(cell.dataset, ctx.data_dir, ctx.cache_dir)
    # Resized once (a cache file mapped by every rank and worker), before the
    # loader forks; the test split only when evaluated (image_data.ResizedImages).
    train_set = image_data.ResizedImages(train_x, train_y, cell.image_size, cell.precision,
                                         ctx.cache_dir).prepare()
    test_set = image_data.ResizedImages(test_x, test_y, cell.image_size, cell.precision,
                                        ctx.cache_dir)

    model, module = build_model(cell, ctx)
    profiler = _step_profiler(cell, ctx)
    phase = profiler.phase if profiler.mode != "off" else _no_phase
    loader = build_loader(cell, ctx, train_set)
    steps = steps_per_epoch(cell.strategy, len(loader), ctx.world_size, cell.max_steps)
    plain_step = make_train_step(cell, model, device, phase, total_steps=steps * cell.epochs)
    fault = faults.from_options(ctx.options)
    sleeper = faults.GpuSleep.for_rank(fault, ctx.rank, device)  # gpu-sleep; a CPU cell refuses it
    step_index = 0

    def train_step(images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        faults.extra_work(fault, ctx.rank, step_index, model)  # injected work, if any
        return plain_step(images, labels)

    group = ctx.world_size if cell.strategy == "ddp-rr" else 1
    full_batch = cell.batch_size * (cell.world_size if cell.strategy == "dp" else 1)
    measured = MeasuredSteps(cell.warmup_steps)
    timer = StepTimer(device, cell.warmup_steps)
    waits = DataWaits(measured)
    losses: list[torch.Tensor] = []
    epoch_times: list[float] = []
    moved_bytes = 0
    reset_peak_memory(device)

    def to_device(images: torch.Tensor, labels: torch.Tensor):
        nonlocal moved_bytes
        if device.type == "cuda":
            moved_bytes += images.nbytes + labels.nbytes
        images = images.to(device, non_blocking=cell.pin_memory)
        if cell.memory_format == "nhwc":
            images = images.contiguous(memory_format=torch.channels_last)
        return images, labels.to(device, non_blocking=cell.pin_memory)

    def next_batch(batches, record: DataWaits | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        nonlocal partial
        partial = False
        for slot in range(group):  # round robin: load all, train on own
            began = time.perf_counter()
            fetched = next(batches)
            handed = time.perf_counter()
            partial |= len(fetched[1]) < full_batch  # alike on every rank: they see the same sizes
            batch = to_device(*fetched)
            if record is not None:  # the timed steps' batches, not the counting window's
                record.add(handed - began, time.perf_counter() - handed)
            if slot == ctx.rank % group:
                mine = batch
        return mine

    def step_on(images: torch.Tensor, labels: torch.Tensor) -> None:
        nonlocal step_index
        if not faults.timed(fault, ctx.rank, step_index):
            losses.append(train_step(images, labels))
        else:  # injected slowdown (or gpu-sleep's sizing): the step's own duration
            began = time.perf_counter()
            losses.append(train_step(images, labels))
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds = time.perf_counter() - began
            faults.slow_down(fault, ctx.rank, step_index, seconds)
            if sleeper is not None:
                sleeper.observe(step_index, seconds)
        if sleeper is not None:  # device time queued after the optimizer step
            sleeper.after_step(step_index)
        step_index += 1

    partial = False
    windows = Windows.from_env(ctx.rank, ctx.world_size)
    with profiler, WallClock(device) as total:
        if windows is not None:  # resident A/B: measured windows on the coordinator's word
            stream = endless(loader, ctx, steps)

            def one_step() -> bool:
                """Trains one step; False where it is other work, not a window's."""
                ctx.report_progress(step_index, "window")
                faults.at_step(fault, ctx.rank, step_index)
                batches, first = next(stream)
                step_on(*next_batch(batches))
                return not other_work(partial, first, loader)

            for _ in range(cell.warmup_steps):
                one_step()
            window_times = windows.serve(one_step, device)
            windows.close()
        for epoch in range(cell.epochs if windows is None else 0):
            batches = epoch_batches(loader, ctx, epoch)
            with WallClock(device) as epoch_clock:
                for step in range(steps):
                    ctx.report_progress(step_index, "train", steps * cell.epochs)
                    faults.at_step(fault, ctx.rank, step_index)
                    timer.mark()
                    waits.mark()
                    with phase("data"):
                        images, labels = next_batch(batches, waits)
                    if other_work(partial, step == 0, loader):
                        measured.leave_out(step_index)
                    step_on(images, labels)
                    profiler.step()
                timer.mark()
                waits.mark()
            epoch_times.append(epoch_clock.seconds)
            # The step between two epochs includes loader start-up: drop it.
            timer.close_epoch()
            waits.close_epoch()

    samples = measured.keep(timer.all_step_times()) if windows is None else window_times
    step_time = statistics.median(samples) if samples else float("nan")
    loss_curve = torch.stack(losses).float().cpu().tolist() if losses else []
    metrics = {
        "step_time": metric(step_time, "s", samples),
        "throughput": metric(images_per_step(cell) / step_time if samples else 0.0, "images/s"),
        "epoch_time": metric(statistics.median(epoch_times or [total.seconds]), "s", epoch_times),
        "total_time": metric(total.seconds, "s"),
        "loss": metric(loss_curve[-1] if loss_curve else float("nan"), "", loss_curve),
        "h2d_bytes": metric(moved_bytes, "bytes"),
        **peak_memory(device),
    }
    counters, window_started = None, time.perf_counter()
    window = int(ctx.options.get("count_steps", counting.DEFAULT_WINDOW_STEPS))
    if window > 0:  # after the timed steps, on the same ranks, so every rank counts alike
        ctx.report_progress(step_index, "count")
        # the epoch is used up (or the windows' place in it unknown): a new one,
        if windows is not None or len(loader) - steps * group < window * group:
            batches = epoch_batches(loader, ctx, cell.epochs)
            train_step(*next_batch(batches))  # and its first step (sampler set-up) uncounted
        counters = counting.count_window(lambda: train_step(*next_batch(batches)), device,
                                         window)
    window_s = time.perf_counter() - window_started
    if cell.min_accuracy > 0:  # chance-level accuracy of a brief run tells nothing
        ctx.report_progress(step_index, "evaluate")
        metrics["accuracy"] = metric(evaluate(cell, ctx, module, test_set), "fraction")
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    summary = profiler.summary()
    return {"metrics": metrics, "steps": len(samples), "counters": counters,
            "profile": summary.to_dict() if summary else None,
            "info": {"precision_effective": effective_precision(cell, device),
                     "pin_memory_effective": cell.pin_memory and device.type == "cuda",
                     "images_per_step": images_per_step(cell),
                     "train_images": len(train_set), "test_images": len(test_set),
                     "torch_threads": torch.get_num_threads(), "count_window_s": window_s,
                     # rank 0's: see DataWaits for what the two shares mean
                     "loader_workers": loader_workers(cell), **waits.shares()}}
