"""What a workload knows of the rank it runs in."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any


def default_cache_dir() -> Path:
    """Where files made once and reused by later launches go (generated data,
    the 16 GB random Llama3-8B checkpoint): ``$PERFSUITE_CACHE_DIR`` (or its
    short form ``$PERFSUITE_CACHE``), else ``$XDG_CACHE_HOME/perfsuite``, else
    ``~/.cache/perfsuite``. Never the checkout: CI's checkout cleans it, and
    every run would write the checkpoint again."""
    chosen = os.environ.get("PERFSUITE_CACHE_DIR") or os.environ.get("PERFSUITE_CACHE")
    if chosen:
        return Path(chosen).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"  # XDG: relative is unset
    return base / "perfsuite"


@dataclass
class RankContext:
    rank: int
    world_size: int
    local_rank: int
    device: str  # "cpu" or "cuda:<local_rank>"
    out_dir: Path  # the cell's directory, shared by its ranks
    data_dir: Path | None = None
    options: dict[str, str] = field(default_factory=dict)
    seed: int = 0
    progress: Any = None  # meter.Progress: call progress.update(step, phase)

    def report_progress(self, step: int, phase: str = "step", total: int = 0) -> None:
        if self.progress is not None:
            self.progress.update(step, phase, total)

    @classmethod
    def from_env(cls, device_type: str, out_dir: Path, data_dir: Path | None = None,
                 options: dict[str, str] | None = None) -> RankContext:
        """Read the rank from the variables torch.distributed.run sets."""
        rank = int(os.environ.get("RANK", 0))
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        device = f"cuda:{local_rank}" if device_type == "cuda" else "cpu"
        return cls(rank=rank, world_size=int(os.environ.get("WORLD_SIZE", 1)),
                   local_rank=local_rank, device=device, out_dir=out_dir,
                   data_dir=data_dir, options=dict(options or {}))

    @property
    def cache_dir(self) -> Path:
        """Files made once and reused by later launches: option ``cache_dir``,
        else ``default_cache_dir()``."""
        chosen = self.options.get("cache_dir")
        return Path(chosen).expanduser() if chosen else default_cache_dir()

    def backend(self) -> str:
        return "nccl" if self.device.startswith("cuda") else "gloo"

    def init_process_group(self, timeout_s: float = 300) -> None:
        """NCCL on CUDA, gloo on CPU; the rendezvous comes from torchrun's env."""
        import torch
        import torch.distributed as dist

        if dist.is_initialized():
            return
        kwargs = {}
        if self.device.startswith("cuda"):
            torch.cuda.set_device(self.local_rank)
            kwargs["device_id"] = torch.device(self.device)
        dist.init_process_group(self.backend(), rank=self.rank, world_size=self.world_size,
                                timeout=timedelta(seconds=timeout_s), **kwargs)
