"""Small image cells built for the suite's own tests (not from the matrix)."""

from perfsuite.cells import Cell


def tiny_image_cell(**changes) -> Cell:
    """A 16 px MobileNetV2 cell on 2 CPU ranks: seconds, not minutes."""
    base = dict(tier="smoke", workload="image", strategy="ddp-ds", device="cpu", world_size=2,
                precision="fp32", pin_memory=False, dataset="digits", batch_size=16,
                image_size=16, max_steps=6, warmup_steps=2, timeout_s=180)
    return Cell(**{**base, **changes})
