"""How much the suite's instrumentation adds to a training step.

The same MobileNetV2 training steps run bare (a plain loop, one clock around
the block) and under the suite's per-step instrumentation (step-boundary
marks, host-to-device accounting, loss kept on device), in alternating blocks
within one process so drift and warm-up hit both alike.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from perfsuite.cells import Cell
from perfsuite.context import RankContext
from perfsuite.rank.meter import StepTimer, WallClock
from perfsuite.workloads import image


def _batches(cell: Cell, device: torch.device, count: int):
    generator = torch.Generator().manual_seed(0)
    shape = (cell.batch_size, 3, cell.image_size, cell.image_size)
    dtype = {"fp64": torch.float64}.get(cell.precision, torch.float32)
    return [(torch.randn(shape, generator=generator, dtype=dtype).to(device),
             torch.randint(0, 10, (cell.batch_size,), generator=generator).to(device))
            for _ in range(count)]


def measure_overhead(device: str = "cpu", image_size: int = 32, batch_size: int = 16,
                     steps: int = 20, blocks: int = 10) -> dict[str, Any]:
    cell = Cell(tier="smoke", workload="image", strategy="dp", device=device.split(":")[0],
                world_size=1, precision="fp32", pin_memory=False, dataset="digits",
                batch_size=batch_size, image_size=image_size, warmup_steps=0)
    ctx = RankContext(rank=0, world_size=1, local_rank=0, device=device, out_dir=None)
    dev = torch.device(device)
    model, _ = image.build_model(cell, ctx)
    train_step = image.make_train_step(cell, model, dev)
    batches = _batches(cell, dev, steps)

    def bare() -> float:
        with WallClock(dev) as clock:
            for images, labels in batches:
                train_step(images, labels)
        return clock.seconds / steps

    def instrumented() -> float:
        timer, losses, moved = StepTimer(dev, 0), [], 0
        with WallClock(dev) as clock:
            for images, labels in batches:
                timer.mark()
                moved += images.nbytes + labels.nbytes
                losses.append(train_step(images, labels))
            timer.mark()
            timer.samples()  # reading the samples is part of the suite's cost
        return clock.seconds / steps

    for _ in range(2):  # warm-up, excluded
        bare(), instrumented()
    bare_times, suite_times = [], []
    for block in range(blocks):
        order = (bare, instrumented) if block % 2 == 0 else (instrumented, bare)
        for fn in order:
            (bare_times if fn is bare else suite_times).append(fn())
    ratio = statistics.median(suite_times) / statistics.median(bare_times)
    return {"device": device, "image_size": image_size, "batch_size": batch_size,
            "steps_per_block": steps, "blocks": blocks,
            "bare_median_s": statistics.median(bare_times),
            "suite_median_s": statistics.median(suite_times),
            "bare_spread_s": statistics.pstdev(bare_times),
            "suite_spread_s": statistics.pstdev(suite_times),
            "ratio": ratio, "overhead_percent": (ratio - 1) * 100,
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
