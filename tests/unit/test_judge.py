"""Judging one measured cell: sanity, targets, baselines, distrust, re-measure."""

import random

from perfsuite import cells
from perfsuite.judge import distrust, failures, judge, needs_more_launches


def measured(cell, samples, accuracy=0.95, env=None):
    return {"id": cell.id, "status": "ok", "params": cell.params(), "env": env or {},
            "metrics": {"step_time": {"value": sorted(samples)[len(samples) // 2], "unit": "s",
                                      "samples": samples},
                        "throughput": {"value": 10.0, "unit": "images/s"},
                        "accuracy": {"value": accuracy, "unit": "fraction"},
                        "loss": {"value": 0.5, "unit": "", "samples": [1.0, 0.5]},
                        "peak_rss": {"value": 1e9, "unit": "bytes"}},
            "info": {"images_per_step": 32}}


def test_accuracy_target_from_the_experiment_data():
    cell = cells.get("smoke/image/ddp-ds/c2/fp32/px32/nopin/nchw")
    assert cell.min_accuracy == 0.90
    ok = judge(cell, measured(cell, [0.1] * 5, accuracy=0.93))
    assert not failures({"checks": ok})
    low = judge(cell, measured(cell, [0.1] * 5, accuracy=0.85))
    (bad,) = failures({"checks": low})
    assert bad["name"] == "accuracy.at_least" and bad["observed"] == 0.85


def test_insane_measurements_fail():
    cell = cells.get("smoke/image/ddp/c2/fp32/px32/nopin/nchw")
    result = measured(cell, [0.1, float("nan"), 0.1])
    assert "sanity.step_time_samples" in [c["name"] for c in failures({"checks": judge(cell, result)})]


def test_step_time_regression_against_a_recorded_baseline(tmp_path):
    """A baseline recorded from 6 launches keeps their spread; one new launch
    is judged with an interval that spread widens."""
    from perfsuite.baselines import load_all
    from perfsuite.recording import record_run
    from perfsuite.results import merge_repeats

    cell = cells.get("smoke/image/ddp/c2/fp32/px32/nopin/nchw")
    env = {"cpu_model": "Test CPU", "cpu_cores": 2, "gpu_count": 0}
    rng = random.Random(1)
    launch = [[0.100 * level + rng.gauss(0, 0.001) for _ in range(30)]
              for level in (1.0, 1.02, 0.98, 1.01, 0.99, 1.0)]
    reference = merge_repeats([measured(cell, samples, env=env) for samples in launch])
    plan = record_run({"schema": "perfsuite.results/1", "env": env, "cells": [reference]},
                      root=tmp_path, launch_statistic="median")
    assert plan.launch_spreads["median"].dof == 5
    sets = load_all(tmp_path)
    assert sets[0].launch_spread["median"].log_sd == round(plan.launch_spreads["median"].log_sd, 5)
    base = launch[0]
    same = judge(cell, measured(cell, base[::-1], env=env), sets=sets)
    slower = judge(cell, measured(cell, [s * 1.5 for s in base], env=env), sets=sets)
    step = {c["name"]: c for c in same}["step_time"]
    assert step["verdict"] == "same" and "between-launch spread" in step["message"]
    step = {c["name"]: c for c in slower}["step_time"]
    assert step["verdict"] == "regressed" and step["ratio"] > 1.4
    assert "step_time" in step["message"] and failures({"checks": slower})


def test_flagged_node_turns_regressions_untrustworthy():
    checks = [{"name": "step_time", "verdict": "regressed", "message": "slower"},
              {"name": "sanity.throughput", "verdict": "fail", "message": ""},
              {"name": "accuracy_at_least", "verdict": "pass", "message": ""}]
    out = distrust(checks, {"trusted": False, "flags": ["matmul at 20% of datasheet"]})
    assert [c["verdict"] for c in out] == ["untrustworthy", "fail", "pass"]
    assert "matmul at 20%" in out[0]["message"] and out[0]["measured_verdict"] == "regressed"


def test_unknown_step_time_asks_for_more_steps():
    assert needs_more_launches([{"name": "step_time", "metric": "step_time", "verdict": "unknown"}])
    assert not needs_more_launches([{"name": "step_time", "metric": "step_time", "verdict": "same"}])


def test_llm_smoke_loss_must_fall():
    cell = cells.get("smoke/llm/lora/alpaca/c1/fp32/nopin")
    falling = measured(cell, [0.1] * 5)
    falling["metrics"]["loss"]["samples"] = [7.6, 7.5, 7.4, 7.3, 7.2, 7.1]
    flat = measured(cell, [0.1] * 5)
    flat["metrics"]["loss"]["samples"] = [7.6, 7.6, 7.7, 7.6, 7.7, 7.7]
    assert not failures({"checks": judge(cell, falling)})
    (bad,) = failures({"checks": judge(cell, flat)})
    assert bad["name"] == "loss.decreases" and "first 2 steps" in bad["message"]
