"""An LLM cell's step-time verdict is per token: a step's time follows its
batch's padded length, so raw step times mostly compare padding.

- against recorded per-step samples (time_per_token rows), as step times are;
- against a folder recorded before per-step token counts (its tokens/s row),
  each launch's total step time over its total tokens, on both sides;
- repeated launches keep their per-step token counts apart, as step times.
"""

import math

import numpy as np
import pytest

from perfsuite.hardware import profile_id
from perfsuite.judge import baselines as bl
from perfsuite.judge import checks as ck
from perfsuite.judge import checks_llm, recording
from perfsuite.judge.applicable import checks_for
from perfsuite.judge.lookup import Expectation, find_time_per_token
from perfsuite.results import merge_repeats
from perfsuite.stats import launches as launchstats

ENV = {"gpu_name": "NVIDIA H100 80GB HBM3", "gpu_count": 1, "gpu_memory_bytes": 80 * 2**30,
       "torch": "2.11.0+cu130", "cuda": "13.0", "cudnn": 91900, "nccl": "2.28.9"}
PROFILE = profile_id(ENV)
PARAMS = {"tier": "gate", "workload": "llm", "strategy": "dpo", "device": "cuda", "world_size": 1,
          "precision": "bf16", "pin_memory": False, "dataset": "stack_exchange_paired",
          "batch_size": 2, "epochs": 1, "max_steps": 60, "max_seq_len": 1024, "lr": 3e-4,
          "lr_warmup_steps": 100}
CELL = "gate/llm/dpo/stack_exchange_paired/g1/bf16/nopin"


def llm_result(per_token=2e-4, *, pad=1.0, seed=0, n=50, per_step_tokens=True):
    """A measured LLM launch: steps of 400-4000 tokens (``pad`` stretches every
    batch) at ``per_token`` seconds a token, 2 % noise."""
    rng = np.random.default_rng(seed)
    tokens = [float(round(t * pad)) for t in rng.integers(400, 4000, n)]
    per = list(rng.lognormal(math.log(per_token), 0.02, n))
    durations = [p * t for p, t in zip(per, tokens)]
    metrics = {"step_time": {"value": float(np.median(durations)), "unit": "s", "samples": durations},
               "tokens": {"value": sum(tokens), "unit": "tokens"},
               "throughput": {"value": sum(tokens) / sum(durations), "unit": "tokens/s"}}
    if per_step_tokens:
        metrics["tokens"]["samples"] = tokens
        metrics["time_per_token"] = {"value": float(np.median(per)), "unit": "s/token", "samples": per}
    return {"id": CELL, "params": PARAMS, "status": "ok", "env": ENV, "metrics": metrics, "checks": []}


def run(*cells):
    return {"schema": "perfsuite.results/1", "env": ENV, "cells": list(cells)}


def spread(log_sd=0.02):
    return launchstats.LaunchSpread(log_sd, 10)


def test_longer_batches_at_the_same_cost_per_token_are_the_same_not_a_regression():
    base = llm_result(seed=1)
    samples = tuple(base["metrics"]["time_per_token"]["samples"])
    padded = llm_result(seed=2, pad=1.3)  # every batch 30 % longer: each step 30 % slower
    per_token = checks_llm.TimePerTokenNotRegressed(Expectation(
        "time_per_token", float(np.median(samples)), tolerance=0.10, samples=samples,
        source="recorded", launch_spread=spread()))
    verdict = per_token.evaluate(padded)
    assert (verdict.name, verdict.metric, verdict.verdict) == ("step_time", "time_per_token", "same")
    assert verdict.unit == "s/token"
    raw = ck.StepTimeNotRegressed(Expectation(
        "step_time", 0.0, tolerance=0.10, samples=tuple(base["metrics"]["step_time"]["samples"]),
        launch_spread=spread())).evaluate(padded)
    assert raw.verdict == "regressed"  # what the raw step time said of the same work
    slower = per_token.evaluate(llm_result(2.6e-4, seed=3))
    assert slower.verdict == "regressed" and slower.ratio == pytest.approx(1.3, rel=0.03)


def test_a_folder_without_per_step_tokens_judges_whole_launches(tmp_path):
    """Recorded before per-step token counts: its tokens/s row is the launch's
    total tokens over its measured time, so each launch's total step time over
    its total tokens is compared, never a median of steps with that total."""
    old = llm_result(seed=1, per_step_tokens=False)
    recording.record_run(run(old), root=tmp_path, date="2026-11-25T00:00:00Z")
    exp = find_time_per_token(PARAMS, PROFILE, sets=bl.load_all(tmp_path))
    assert exp.available and not exp.samples and exp.unit == "s/token"
    assert exp.value == pytest.approx(1 / old["metrics"]["throughput"]["value"])
    assert "tokens/s" in exp.source
    new = llm_result(seed=2)
    tokens = new["metrics"]["tokens"]["samples"]
    verdict = checks_llm.TimePerTokenNotRegressed(exp).evaluate(new)
    whole = sum(new["metrics"]["step_time"]["samples"]) / sum(tokens)
    assert verdict.observed == pytest.approx(whole) and verdict.expected == pytest.approx(exp.value)
    assert "total step time over its total tokens" in verdict.message
    # an old result (no per-step tokens) is judged by its own tokens/s
    assert checks_llm.TimePerTokenNotRegressed(exp).evaluate(old).ratio == pytest.approx(1.0)


def test_recorded_per_step_samples_are_preferred_and_a_raw_step_time_never_judges(tmp_path):
    recording.record_run(run(llm_result(seed=1)), root=tmp_path, date="2026-11-25T00:00:00Z")
    sets = bl.load_all(tmp_path)
    assert "time_per_token" in set(sets[0].metrics["metric"])
    made = checks_for(PARAMS, PROFILE, sets=sets)
    assert isinstance(made[0], checks_llm.TimePerTokenNotRegressed) and made[0].expectation.samples
    # a folder holding only the raw step time of the cell: skipped, saying why
    rows = sets[0].metrics
    sets[0].metrics = rows[rows["metric"] == "step_time"]
    skipped = checks_for(PARAMS, PROFILE, sets=sets)[0].evaluate(llm_result(seed=2))
    assert skipped.verdict == "skipped" and "per token" in skipped.message


def test_repeated_launches_keep_their_tokens_apart():
    launches = [llm_result(seed=s) for s in range(4)]
    merged = merge_repeats(launches)["metrics"]
    for name in ("time_per_token", "tokens"):
        assert merged[name]["launches"] == [r["metrics"][name]["samples"] for r in launches]
    values = checks_llm.launch_time_per_token(merge_repeats(launches))
    assert values == pytest.approx([1 / r["metrics"]["throughput"]["value"] for r in launches])
