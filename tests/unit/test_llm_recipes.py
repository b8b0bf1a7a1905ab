"""torchtune's real recipes on the tiny Llama3, on CPU, one rank in-process.

Two ranks over gloo through the real worker are the smoke tier's own cells
(tests/perf/test_llm.py).
"""

from __future__ import annotations

import json
import math
import time

from perfsuite.cells import Cell
from perfsuite.context import RankContext


def tiny_cell(technique: str, world_size: int, **changes) -> Cell:
    dataset = "stack_exchange_paired" if technique == "dpo" else "alpaca"
    params = {"tier": "smoke", "workload": "llm", "strategy": technique, "device": "cpu",
              "world_size": world_size, "precision": "fp32", "pin_memory": False,
              "dataset": dataset, "batch_size": 2, "max_steps": 5, "warmup_steps": 2, "lr": 3e-4,
              "lr_warmup_steps": 100, "max_seq_len": 128}
    params.update(changes)
    return Cell(**params)


def check_rank0_result(result: dict, steps_run: int, warmup: int) -> None:
    metrics, info = result["metrics"], result["info"]
    assert result["steps"] == steps_run - warmup == len(metrics["step_time"]["samples"])
    assert all(s > 0 for s in metrics["step_time"]["samples"])
    losses = metrics["loss"]["samples"]
    assert len(losses) == steps_run and all(math.isfinite(x) for x in losses)
    assert info["loss_finite"] and info["steps_total"] == steps_run
    assert metrics["tokens"]["value"] > 0 and metrics["throughput"]["value"] > 0
    assert metrics["h2d_bytes"]["value"] == 0 and "peak_mem_allocated" not in metrics
    assert info["trained_batches"] == steps_run
    json.dumps(result)  # JSON-safe, as the worker writes it


def test_lora_single_device_recipe_runs_in_process(tmp_path):
    from perfsuite.workloads import llm

    cell = tiny_cell("lora", 1)
    ctx = RankContext(rank=0, world_size=1, local_rank=0, device="cpu", out_dir=tmp_path,
                      options={"cache_dir": str(tmp_path / "cache")})
    began = time.time()
    result = llm.run(cell, ctx)
    check_rank0_result(result, steps_run=5, warmup=2)
    info = result["info"]
    assert info["recipe"] == "lora_finetune_single_device"
    # the recipe's set-up ended with its first batch, before its first step was logged
    first_logged = json.loads((tmp_path / "llm-steps-rank0.jsonl").read_text().splitlines()[0])["wall"]
    assert began < info["training_started"] < first_logged
    assert info["trainable_params"] < info["model_params"] / 10
    assert info["saves_checkpoint"] is False
    # The recipe's config stays beside the results, runnable with `tune run`.
    assert (tmp_path / "llm-recipe-rank0.yaml").is_file()
    lines = (tmp_path / "llm-steps-rank0.jsonl").read_text().splitlines()
    # the cell's 5 steps, one between, then the 2 steps of the counting window (not timed)
    assert [json.loads(x)["step"] for x in lines] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert info["count_window_steps"] == 2 and result["counters"]["window_steps"] == 2
    assert result["counters"]["per_step"]["flops"] > 0 and info["count_window_s"] > 0
    # A loss near ln(vocab) for random weights: the model trains from scratch.
    assert abs(result["metrics"]["loss"]["samples"][0] - math.log(2048)) < 0.5
