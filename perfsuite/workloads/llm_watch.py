"""What the suite hands torchtune's recipes to watch them run.

- ``StepLogger``: a torchtune metric logger (``metric_logger._component_``).
  The recipe calls ``log_dict`` once per optimiser step (with
  ``log_every_n_steps: 1``) right after ``loss.item()``, which waits for the
  GPU, so the time between two calls is one whole iteration (data loading,
  forward, backward, optimiser step), as the paper's s/it counts it. Each
  record keeps the step, the recipe's values (loss, lr,
  tokens_per_second_per_gpu, ...) and ``time.perf_counter()`` on entry;
  records go to a per-rank JSONL file as they come. Distributed recipes log
  on rank 0 only.
- Collate functions that call torchtune's own (``padded_collate_sft`` via the
  config's ``collate_fn``; ``padded_collate_dpo``, which DPO recipes import
  by name, via the recipe module) and note each batch's shape, non-padding
  tokens and bytes: the bytes the recipe then moves host-to-device, and the
  padded sequence length that sets a step's FLOPs. With ``pin_memory`` they
  pin the batch, as ``DataLoader(pin_memory=True)`` does right after
  collation in a single-process loader (torchtune's loaders have no such
  flag); without CUDA there is nothing to pin, as in ``DataLoader``.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from perfsuite.rank.meter import Progress

LOGGERS: dict[str, StepLogger] = {}
BATCHES: list[dict[str, Any]] = []
_SETTINGS = {"pin": False}


def _number(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    return value


STEP_HOOKS: list[Any] = []  # called after every logged step (the step profiler)


@contextlib.contextmanager
def stepping(hook: Any) -> Iterator[None]:
    """Call ``hook()`` after each step the recipe logs, while inside."""
    STEP_HOOKS.append(hook)
    try:
        yield
    finally:
        STEP_HOOKS.remove(hook)


class StepLogger:
    """torchtune ``MetricLoggerInterface``: one record per ``log_dict`` call."""

    def __init__(self, path: str, total_steps: int = 0, **_ignored: Any) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "w")  # noqa: SIM115 - open across log calls
        self.records: list[dict[str, Any]] = []
        LOGGERS[str(self.path)] = self
        # The suite's progress record for this rank (hang diagnosis, time left).
        self._progress = Progress(self.path.parent / f"progress-rank{os.environ.get('RANK', 0)}")
        self.total_steps = int(total_steps)

    def log_config(self, config: Any) -> None:
        pass  # the suite writes the config itself, beside this file

    def log(self, name: str, data: Any, step: int) -> None:
        self.log_dict({name: data}, step)

    def log_dict(self, payload: dict[str, Any], step: int) -> None:
        now = time.perf_counter()
        record = {"step": int(step), "t": now, "wall": time.time(),
                  **{k: _number(v) for k, v in payload.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        record["t_done"] = time.perf_counter()  # the recipe's next step clock starts after this
        self.records.append(record)
        self._progress.update(int(step), "train", self.total_steps)
        for hook in STEP_HOOKS:
            hook()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
        self._progress.close()

    def __del__(self) -> None:
        self.close()


def read_step_log(path: Path) -> list[dict[str, Any]]:
    """Records of a logger in this process, else as written to its file."""
    live = LOGGERS.get(str(path))
    if live is not None:
        return list(live.records)
    if not Path(path).exists():
        return []
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def _nbytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.nbytes
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(v) for v in obj)
    return 0


def _pin(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.pin_memory()
    if isinstance(obj, dict):
        return {k: _pin(v) for k, v in obj.items()}
    if isinstance(obj, tuple):
        return tuple(_pin(v) for v in obj)
    return obj


def _finish(batch: Any, samples: int, rows: int, seq_len: int, tokens: int) -> Any:
    if _SETTINGS["pin"]:
        batch = _pin(batch)
    BATCHES.append({"t": time.perf_counter(), "samples": samples, "rows": rows,
                    "seq_len": seq_len, "tokens": tokens, "padded": rows * seq_len,
                    "bytes": _nbytes(batch)})
    return batch


def padded_collate_sft(batch: list[dict[str, Any]], **kwargs: Any) -> dict[str, torch.Tensor]:
    """torchtune's ``padded_collate_sft``, observed (config ``collate_fn``)."""
    from torchtune.data import padded_collate_sft as collate

    out = collate(batch, **kwargs)
    rows, seq_len = out["tokens"].shape
    return _finish(out, len(batch), rows, seq_len, sum(len(s["tokens"]) for s in batch))


def _observed_dpo(collate: Any) -> Any:
    def padded_collate_dpo(batch: list[dict[str, Any]], **kwargs: Any) -> Any:
        out = collate(batch, **kwargs)
        rows, seq_len = out[0].shape  # chosen and rejected stacked: 2 x batch rows
        tokens = sum(len(s["chosen_input_ids"]) + len(s["rejected_input_ids"]) for s in batch)
        return _finish(out, len(batch), rows, seq_len, tokens)
    return padded_collate_dpo


@contextlib.contextmanager
def observe(recipe: ModuleType, pin_memory: bool) -> Iterator[dict[str, Any]]:
    """Reset the batch records, set pinning, wrap the DPO collate of ``recipe``."""
    BATCHES.clear()
    pin = bool(pin_memory and torch.cuda.is_available())
    _SETTINGS["pin"] = pin
    original = getattr(recipe, "padded_collate_dpo", None)
    if original is not None:
        recipe.padded_collate_dpo = _observed_dpo(original)
    try:
        yield {"pin_memory_effective": pin}
    finally:
        _SETTINGS["pin"] = False
        if original is not None:
            recipe.padded_collate_dpo = original


def trained_batches(batches: list[dict[str, Any]], epochs: int,
                    max_steps: int) -> list[dict[str, Any]]:
    """The collated batches that were trained on, in order.

    Some recipes test the step cap at the top of their loop, so they collate
    one batch per epoch they never train on: then there are exactly
    ``epochs * (max_steps + 1)`` records and every ``(max_steps + 1)``-th is
    dropped. Recipes that test it at the bottom collate ``epochs * min(cap,
    batches)``, which can never equal that count.
    """
    if max_steps > 0 and len(batches) == epochs * (max_steps + 1):
        return [b for i, b in enumerate(batches) if (i + 1) % (max_steps + 1)]
    return list(batches)
