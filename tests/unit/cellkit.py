"""Small image cells built for the suite's own tests (not from the matrix),
and the check that no process of a launch is left behind."""

import os

import psutil

from perfsuite.cells import Cell


def tiny_image_cell(**changes) -> Cell:
    """A 16 px MobileNetV2 cell on 2 CPU ranks: seconds, not minutes."""
    base = dict(tier="smoke", workload="image", strategy="ddp-ds", device="cpu", world_size=2,
                precision="fp32", pin_memory=False, dataset="digits", batch_size=16,
                image_size=16, max_steps=6, warmup_steps=2, timeout_s=180)
    return Cell(**{**base, **changes})


def survivors(marker: str) -> list[int]:
    """Processes whose command line mentions ``marker`` (an output directory)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.pid != os.getpid() and any(marker in part for part in proc.info["cmdline"] or []):
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found
