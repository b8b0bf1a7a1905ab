"""Metrics from a recipe's step log and batches; what watches the recipe (llm_watch); the compat patches."""

from __future__ import annotations

import math
import types

import pytest
import torch

from perfsuite.workloads import llm_compat, llm_metrics, llm_watch

FACTS = {"matmul_params": 1000, "adapter_params": 10, "layers": 2, "width": 8}


def step_log(durations, tps=100.0, losses=None, overhead=0.001):
    """Records as StepLogger writes them: step k logged ``durations[k]`` after step k-1
    (``tps``: the recipe's tokens/s per GPU, one for every step or a list)."""
    records, t = [], 10.0
    rates = tps if isinstance(tps, list) else [tps] * len(durations)
    for k, d in enumerate(durations):
        t += d
        records.append({"step": k + 1, "t": t, "t_done": t + overhead,
                        "loss": (losses or [2.0] * len(durations))[k], "lr": 1e-4,
                        "tokens_per_second_per_gpu": rates[k]})
    return records


def batches(n, seq_len=16, rows=2):
    return [{"t": 0.0, "samples": rows, "rows": rows, "seq_len": seq_len, "tokens": 20,
             "padded": rows * seq_len, "bytes": 2 * 8 * rows * seq_len} for _ in range(n)]


def summarise(log, *, world=1, warmup=2, epochs=1, recipe="lora_finetune_single_device",
              technique="lora", n_batches=None):
    return llm_metrics.summarise(
        technique=technique, recipe=recipe, device=torch.device("cpu"), world_size=world,
        warmup=warmup, epochs=epochs, step_log=log,
        batches=batches(len(log) if n_batches is None else n_batches),
        model_facts=FACTS, precision="fp32")


def test_step_times_skip_warmup_and_use_log_intervals():
    durations = [5.0, 0.9, 0.5, 0.2, 0.3, 0.4]
    metrics, steps, info = summarise(step_log(durations), warmup=2)
    assert steps == 4 and info["measured_steps"] == [3, 4, 5, 6]
    assert metrics["step_time"]["samples"] == pytest.approx([0.5, 0.2, 0.3, 0.4])
    assert metrics["step_time"]["value"] == pytest.approx(0.35)
    assert metrics["step_time"]["unit"] == "s"


def test_first_step_of_each_epoch_is_not_a_sample():
    _metrics, _steps, info = summarise(step_log([1.0] + [0.1] * 7), warmup=1, epochs=2)
    assert info["measured_steps"] == [2, 3, 4, 6, 7, 8]  # step 5 starts epoch 2


def test_tokens_and_throughput_from_the_recipe_rate():
    metrics, _, _ = summarise(step_log([1.0, 0.5, 0.5, 0.5], tps=200.0, overhead=0.0),
                              world=2, warmup=1, recipe="lora_finetune_distributed")
    assert metrics["tokens"]["value"] == pytest.approx(3 * 0.5 * 200 * 2)
    assert metrics["throughput"]["value"] == pytest.approx(400.0)
    assert metrics["throughput"]["unit"] == "tokens/s"


def test_each_step_keeps_its_tokens_and_its_time_per_token():
    # steps of 400, 200 and 300 tokens (padding differs from batch to batch):
    # per token they took 1, 4 and 2 ms, whatever their raw step times
    log = step_log([1.0, 0.4, 0.8, 0.6], tps=[0.0, 1000.0, 250.0, 500.0], overhead=0.0)
    metrics, _, _ = summarise(log, warmup=1)
    assert metrics["tokens"]["samples"] == [400, 200, 300] and metrics["tokens"]["value"] == 900
    per_token = metrics["time_per_token"]
    assert per_token["samples"] == pytest.approx([0.001, 0.004, 0.002])
    assert per_token["value"] == pytest.approx(0.002) and per_token["unit"] == "s/token"
    assert metrics["throughput"]["value"] == pytest.approx(900 / 1.8)


def test_a_step_without_tokens_has_no_time_per_token():
    log = step_log([1.0, 0.5, 0.5, 0.5], tps=[0.0, 100.0, 0.0, 100.0], overhead=0.0)
    metrics, _, _ = summarise(log, warmup=1)
    assert metrics["tokens"]["samples"] == [50, 0, 50]
    assert metrics["time_per_token"]["samples"] == pytest.approx([0.01, 0.01])


def test_loss_curve_and_dpo_distributed_scaling():
    losses = [1.386, 1.380, 1.370, 1.360]
    metrics, _, info = summarise(step_log([1, 1, 1, 1], losses=losses), world=2, warmup=1,
                                 recipe="lora_dpo_distributed", technique="dpo")
    assert metrics["loss"]["value"] == pytest.approx(0.68)
    assert metrics["loss"]["samples"][0] == pytest.approx(0.693)
    assert info["loss_finite"] is True
    metrics, _, info = summarise(step_log([1, 1, 1], losses=[2.0, math.nan, math.nan]),
                                 warmup=1)
    assert info["loss_finite"] is False


def test_cpu_has_no_device_metrics():
    metrics, _, _ = summarise(step_log([1, 1, 1, 1]))
    assert metrics["h2d_bytes"]["value"] == 0
    assert "peak_mem_allocated" not in metrics and "mfu" not in metrics
    assert metrics["peak_rss"]["value"] > 0 and metrics["peak_rss"]["unit"] == "bytes"


def test_rank_without_step_log_reports_memory_only():
    metrics, steps, info = summarise([], n_batches=3)
    assert steps == 0 and set(metrics) == {"peak_rss", "h2d_bytes"}
    assert info["trained_batches"] == 3


def test_too_few_steps_for_the_warmup_is_an_error():
    with pytest.raises(ValueError, match="warmup_steps=5"):
        summarise(step_log([1, 1, 1]), warmup=5)


def test_trained_batches_drops_the_batch_fetched_after_the_cap():
    recs = [{"i": i} for i in range(2 * 5)]  # 2 epochs x (4 + 1) collated
    assert [r["i"] for r in llm_watch.trained_batches(recs, 2, 4)] == [0, 1, 2, 3, 5, 6, 7, 8]
    assert len(llm_watch.trained_batches(recs[:8], 2, 4)) == 8  # bottom-checked cap
    assert len(llm_watch.trained_batches(recs[:7], 1, 0)) == 7  # no cap


def test_flops_per_token_formulas():
    lora = llm_metrics.flops_per_token("lora", 1000, 10, 2, 8, 16)
    attention = 4 * 2 * 8 * 16
    assert lora == 4 * 1000 + 6 * 10 + 3 * attention
    assert llm_metrics.flops_per_token("qat", 1000, 0, 2, 8, 16) == 6000 + 3 * attention
    assert llm_metrics.flops_per_token("dpo", 1000, 10, 2, 8, 16) == \
        lora + 2 * 1000 + attention


@pytest.mark.parametrize("name, known", [
    ("NVIDIA H100 80GB HBM3", True), ("NVIDIA H200", True), ("NVIDIA A100-SXM4-80GB", True),
    ("NVIDIA GeForce GTX 580", False),
])
def test_peak_follows_the_matmul_precision(name, known):
    bf16 = llm_metrics.peak_flops(name, "bf16", tf32=False)
    assert (bf16 is None) is not known
    if known:
        fp32 = llm_metrics.peak_flops(name, "fp32", tf32=False)
        assert fp32 < llm_metrics.peak_flops(name, "fp32", tf32=True) < bf16


def test_step_logger_records_and_writes(tmp_path):
    logger = llm_watch.StepLogger(path=str(tmp_path / "steps.jsonl"))
    logger.log_dict({"loss": torch.tensor(1.5), "lr": 0.1}, step=1)
    logger.log("loss", 1.25, step=2)
    logger.close()
    records = llm_watch.read_step_log(tmp_path / "steps.jsonl")
    assert [r["step"] for r in records] == [1, 2] and records[0]["loss"] == 1.5
    assert records[0]["t"] <= records[0]["t_done"] <= records[1]["t"]
    llm_watch.LOGGERS.clear()
    assert [r["loss"] for r in llm_watch.read_step_log(tmp_path / "steps.jsonl")] == [1.5, 1.25]


def test_observed_collates_count_batches():
    from torchtune.data import padded_collate_dpo

    recipe = types.SimpleNamespace(padded_collate_dpo=padded_collate_dpo)
    with llm_watch.observe(recipe, pin_memory=True) as watched:
        assert watched["pin_memory_effective"] is torch.cuda.is_available()
        llm_watch.padded_collate_sft([{"tokens": [1, 2, 3], "labels": [1, 2, 3]},
                                      {"tokens": [4], "labels": [4]}], padding_idx=0)
        recipe.padded_collate_dpo([{"chosen_input_ids": [1, 2], "chosen_labels": [1, 2],
                                    "rejected_input_ids": [3], "rejected_labels": [3]}],
                                  padding_idx=0)
    assert recipe.padded_collate_dpo is padded_collate_dpo
    sft, dpo = llm_watch.BATCHES
    assert (sft["rows"], sft["seq_len"], sft["tokens"], sft["bytes"]) == (2, 3, 4, 2 * 6 * 8)
    assert (dpo["rows"], dpo["seq_len"], dpo["tokens"]) == (2, 2, 3)


def test_compat_patches_apply_on_cpu_and_are_undone(monkeypatch):
    from torchao.quantization.qat import api
    from torchtune import training

    calls = []
    recipe = types.SimpleNamespace(__name__="fake_recipe",
                                   init_process_group=lambda backend, **kw: calls.append(backend))
    before = (training.get_memory_stats, training.cleanup_before_training,
              training.is_distributed, api.FakeQuantizeConfig, recipe.init_process_group)
    for key, value in {"MASTER_ADDR": "x", "MASTER_PORT": "1", "RANK": "0",
                       "WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(key, value)
    with llm_compat.recipe_compat(recipe, "cpu", "qat-lora", distributed=True) as applied:
        assert len(applied) == 5
        recipe.init_process_group("cuda:nccl,cpu:gloo")
        assert training.get_memory_stats(torch.device("cpu"))["peak_memory_alloc"] == 0.0
        training.cleanup_before_training()
        assert training.is_distributed() is True
        assert api.FakeQuantizeConfig.__name__ == "IntxFakeQuantizeConfig"
    assert calls == ["gloo"]
    assert before == (training.get_memory_stats, training.cleanup_before_training,
                      training.is_distributed, api.FakeQuantizeConfig, recipe.init_process_group)


def test_compat_leaves_single_device_cuda_runs_alone():
    recipe = types.SimpleNamespace(__name__="fake")
    with llm_compat.recipe_compat(recipe, "cuda", "lora", distributed=False) as applied:
        assert applied == []
