"""What torchtune 0.6.1's recipes need to run here, patched for one run only.

Every patch sits outside the training math (model, loss, optimiser, data and
gradients are untouched) and is undone when the run ends:

1. CPU: distributed recipes call ``init_process_group("cuda:nccl,cpu:gloo")``;
   NCCL needs a GPU, so on CPU the backend becomes ``gloo`` (what
   ``qat_lora_finetune_distributed`` already does itself on CPU).
2. CPU: ``training.get_memory_stats`` raises for a CPU device, and
   distributed recipes call it on rank 0 after building the model; on CPU it
   returns zeros (there is no device memory to report).
3. CPU: ``training.cleanup_before_training`` calls ``torch.cpu.empty_cache``,
   which does not exist; on CPU it only collects garbage.
4. qat-lora: torchtune's ``QATLoRALinear`` asserts its fake-quantise configs
   are ``torchao...api.FakeQuantizeConfig``, but torchao 0.13's quantizer
   returns ``IntxFakeQuantizeConfig`` (the older name became a deprecated
   subclass of it). During the run the name torchtune imports points to
   ``IntxFakeQuantizeConfig``, so the assertion holds for the same objects.
5. One rank: distributed recipes refuse ``WORLD_SIZE=1`` (their guard
   ``training.is_distributed()`` asks for more than one process), although
   FSDP2 runs on one rank. torchtune 0.6.1 has no single-device QAT recipe,
   so 1-GPU qat / qat-lora cells run the distributed recipe on one rank, with
   the guard answering True for a torchrun-launched single process.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any


class _Patches:
    def __init__(self) -> None:
        self._undo: list[tuple[Any, str, Any]] = []
        self.applied: list[str] = []

    def set(self, owner: Any, name: str, value: Any, why: str) -> None:
        self._undo.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)
        self.applied.append(why)

    def undo(self) -> None:
        for owner, name, value in reversed(self._undo):
            setattr(owner, name, value)
        self._undo.clear()


def _gloo_on_cpu(original: Callable[..., Any]) -> Callable[..., Any]:
    def init_process_group(backend: str | None = None, *args: Any, **kwargs: Any) -> Any:
        return original("gloo", *args, **kwargs)
    return init_process_group


def _cpu_memory_stats(original: Callable[..., Any]) -> Callable[..., Any]:
    def get_memory_stats(device: Any, reset_stats: bool = True) -> dict[str, float]:
        if getattr(device, "type", str(device)) == "cpu":
            return {"peak_memory_active": 0.0, "peak_memory_alloc": 0.0,
                    "peak_memory_reserved": 0.0}
        return original(device, reset_stats=reset_stats)
    return get_memory_stats


def _cpu_cleanup() -> None:
    gc.collect()


def _launched_by_torchrun() -> bool:
    return all(k in os.environ for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"))


@contextlib.contextmanager
def recipe_compat(recipe: ModuleType, device_type: str, technique: str,
                  distributed: bool) -> Iterator[list[str]]:
    """Apply the patches this run needs; yields the list of what was patched."""
    from torchtune import training

    patches = _Patches()
    try:
        if device_type == "cpu":
            if distributed and hasattr(recipe, "init_process_group"):
                patches.set(recipe, "init_process_group",
                            _gloo_on_cpu(recipe.init_process_group),
                            "init_process_group: nccl -> gloo on CPU")
            patches.set(training, "get_memory_stats",
                        _cpu_memory_stats(training.get_memory_stats),
                        "get_memory_stats: zeros on CPU")
            patches.set(training, "cleanup_before_training", _cpu_cleanup,
                        "cleanup_before_training: no empty_cache on CPU")
        if technique == "qat-lora":
            from torchao.quantization.qat import IntxFakeQuantizeConfig, api

            patches.set(api, "FakeQuantizeConfig", IntxFakeQuantizeConfig,
                        "QATLoRALinear accepts torchao 0.13's IntxFakeQuantizeConfig")
        if distributed and int(os.environ.get("WORLD_SIZE", "1")) == 1:
            if not _launched_by_torchrun():
                raise RuntimeError(f"{recipe.__name__} needs torch.distributed.run "
                                   "(MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE)")
            patches.set(training, "is_distributed", lambda: True,
                        "distributed recipe on one rank (no single-device recipe)")
        yield patches.applied
    finally:
        patches.undo()
