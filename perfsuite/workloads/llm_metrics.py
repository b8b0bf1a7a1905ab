"""An LLM cell's metrics from what its recipe logged and collated.

- step_time: the time between consecutive ``log_dict`` calls of the recipe's
  metric logger (one call per optimiser step, each after the recipe's
  ``loss.item()`` which waits for the GPU). Step 1 has no predecessor, the
  first ``warmup_steps`` steps and the first step of every later epoch
  (checkpoint and sampler reset in between) are left out. value = median.
- throughput / tokens: the recipe's own count, recovered from its logged
  ``tokens_per_second_per_gpu`` x world size x the recipe's step time (from
  the end of the previous log call to this one). SFT recipes count label
  tokens that are not masked, summed over ranks; DPO recipes count the padded
  chosen+rejected inputs. Totals over the measured steps; ``tokens`` keeps
  each measured step's count as its samples.
- time_per_token: each measured step's time over its tokens (steps without
  tokens left out), value = median. A step's time follows its batch's
  padded length, so the step-time verdict of an LLM cell compares this
  (perfsuite.judge.checks), not raw step times.
- loss: the recipe's logged loss per step; ``lora_dpo_distributed`` sums it
  over ranks (torchtune 0.6.1), so it is divided by the world size here.
- mfu: model FLOPs of the measured steps on this rank / their time / the
  GPU's dense peak, with the usual approximation per processed
  token (padding included, since the model computes on it), N = parameters
  in matmuls (all but the input embedding), N_a = trainable adapter
  parameters, L layers, d model width, T the batch's padded length:
  full fine-tune (qat) 6N + 12LdT; LoRA-style (frozen base: activation
  gradients but no weight gradients) 4N + 6N_a + 12LdT; DPO adds the
  reference forward, 2N + 4LdT. Peaks: ``perfsuite.rank.peaks`` (datasheet
  table). Omitted on CPU and on GPUs the table does not hold.
- h2d_bytes: bytes of the trained batches the recipe moves to the GPU; 0 on
  CPU. peak_mem_*: ``torch.cuda.max_memory_*`` after the run (the recipes
  reset the peak when training starts); peak_rss: the process's high-water
  mark.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from perfsuite.rank import peaks
from perfsuite.rank.meter import metric, peak_memory


def peak_flops(device_name: str, precision: str, tf32: bool) -> float | None:
    """Dense peak of the precision the matmuls run in (``perfsuite.rank.peaks``'s
    datasheet table): bf16 tensor cores, or for fp32 the TF32 tensor-core rate
    when TF32 matmuls are on, else the non-tensor fp32 rate."""
    wanted = "bf16" if precision == "bf16" else ("tf32" if tf32 else "fp32")
    return peaks.peak_flops(device_name, wanted)


def flops_per_token(technique: str, matmul_params: int, adapter_params: int, layers: int,
                    width: int, seq_len: int) -> float:
    attention = 4.0 * layers * width * seq_len  # QK^T and AV, forward, per token
    n, n_a = float(matmul_params), float(adapter_params)
    if technique == "qat":
        return 6 * n + 3 * attention
    tuned = 4 * n + 6 * n_a + 3 * attention
    if technique == "dpo":
        return tuned + 2 * n + attention  # the reference model's forward
    return tuned


def _measured_indices(steps: int, warmup: int, epochs: int) -> list[int]:
    """0-based indices of steps whose duration is measured (see module doc)."""
    per_epoch = steps // epochs if epochs > 0 and steps % epochs == 0 else steps
    first_of_epoch = {e * per_epoch for e in range(1, epochs)} if per_epoch else set()
    return [k for k in range(max(1, warmup), steps) if k not in first_of_epoch]


def summarise(*, technique: str, recipe: str, device: Any, world_size: int, warmup: int,
              epochs: int, step_log: list[dict[str, Any]], batches: list[dict[str, Any]],
              model_facts: dict[str, Any], precision: str) -> tuple[dict[str, Any], int,
                                                                    dict[str, Any]]:
    """(metrics, measured steps, info) of one rank; see the module doc."""
    metrics: dict[str, Any] = dict(peak_memory(device))
    cuda = device.type == "cuda"
    metrics["h2d_bytes"] = metric(sum(b["bytes"] for b in batches) if cuda else 0, "bytes")
    info: dict[str, Any] = {
        "trained_batches": len(batches),
        "input_tokens": sum(b["tokens"] for b in batches),
        "padded_tokens": sum(b["padded"] for b in batches),
        "mean_padded_seq_len": (statistics.mean(b["seq_len"] for b in batches)
                                if batches else None),
    }
    if not step_log:
        info["measured_on"] = "rank 0 (the recipe logs its steps on rank 0 only)"
        return metrics, 0, info
    steps = len(step_log)
    loss_scale = world_size if recipe == "lora_dpo_distributed" else 1
    losses = [float(r["loss"]) / loss_scale for r in step_log]
    metrics["loss"] = metric(losses[-1], "nats", losses)
    # 0/0 when a batch has no unmasked label (prompt filled the window): NaN from then on.
    info["loss_finite"] = all(math.isfinite(x) for x in losses)
    measured = _measured_indices(steps, warmup, epochs)
    info.update(steps_total=steps, measured_steps=[step_log[k]["step"] for k in measured])
    if not measured:
        raise ValueError(f"the recipe ran {steps} steps, none left to measure after "
                         f"warmup_steps={warmup}; raise max_steps or lower warmup_steps")
    durations = [step_log[k]["t"] - step_log[k - 1]["t"] for k in measured]
    metrics["step_time"] = metric(statistics.median(durations), "s", durations)
    tokens = [float(step_log[k]["tokens_per_second_per_gpu"]) * world_size
              * (step_log[k]["t"] - step_log[k - 1].get("t_done", step_log[k - 1]["t"]))
              for k in measured]
    counts = [round(t) for t in tokens]  # the recipe counts whole tokens
    metrics["tokens"] = metric(round(sum(tokens)), "tokens", counts)
    metrics["throughput"] = metric(sum(tokens) / sum(durations), "tokens/s")
    # A step's time grows with its batch's length: per token, steps compare.
    per_token = [d / n for d, n in zip(durations, counts) if n > 0]
    if per_token:
        metrics["time_per_token"] = metric(statistics.median(per_token), "s/token", per_token)
    if cuda and len(batches) >= steps:
        import torch

        peak = peak_flops(torch.cuda.get_device_name(device), precision,
                          torch.backends.cuda.matmul.allow_tf32)
        if peak:
            flops = sum(batches[k]["padded"] * flops_per_token(
                technique, model_facts["matmul_params"], model_facts["adapter_params"],
                model_facts["layers"], model_facts["width"], batches[k]["seq_len"])
                for k in measured)
            metrics["mfu"] = metric(flops / sum(durations) / peak, "fraction")
            info["peak_flops"] = peak
    info["tokens_counted"] = ("padded chosen+rejected inputs" if technique == "dpo"
                              else "label tokens not masked, summed over ranks")
    return metrics, len(measured), info
