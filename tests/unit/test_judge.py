"""Judging one measured cell: sanity, targets, baselines, distrust, re-measure."""

import random

import pytest

from perfsuite import cells
from perfsuite.judge.judging import distrust, failures, judge, needs_more_launches


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
    from perfsuite.judge.baselines import load_all
    from perfsuite.judge.recording import record_run
    from perfsuite.results import merge_repeats

    cell = cells.get("smoke/image/ddp/c2/fp32/px32/nopin/nchw")
    env = {"cpu_model": "Test CPU", "cpu_cores": 2, "gpu_count": 0}
    rng = random.Random(1)
    launch = [[0.100 * level + rng.gauss(0, 0.001) for _ in range(30)]
              for level in (1.0, 1.02, 0.98, 1.01, 0.99, 1.0)]
    reference = merge_repeats([measured(cell, samples, env=env) for samples in launch])
    plan = record_run({"schema": "perfsuite.results/1", "env": env, "cells": [reference]},
                      root=tmp_path, launch_statistic="median")
    assert plan.launch_spreads["image"]["median"].dof == 5  # a CPU cell's kind: its workload
    sets = load_all(tmp_path)
    assert sets[0].launch_spread["image"]["median"].log_sd == round(
        plan.launch_spreads["image"]["median"].log_sd, 5)
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


# -- how busy a GPU cell kept its GPU ---------------------------------------

def limits():
    import tomllib

    return tomllib.loads((cells.EXPERIMENTS_DIR / "image.toml").read_text())["limits"]


def on_gpu(cell, busy, loader=0.01, h2d=0.05):
    """A measured GPU cell whose least busy rank (rank 1) kept its GPU busy
    ``busy`` of a median step, ``h2d`` of it copying host-to-device."""
    result = measured(cell, [0.2] * 20)
    result["metrics"]["h2d_bytes"] = {"value": 1e9, "unit": "bytes"}
    result["info"]["loader_wait_share"] = loader
    result["ranks"] = [{"rank": 0, "gpu_busy_share": None if busy is None else min(busy + 0.1, 1.0),
                        "h2d_copy_share": h2d},
                       {"rank": 1, "gpu_busy_share": busy, "h2d_copy_share": h2d}]
    result["gpu_busy_share"] = busy
    return result


def busy_check(cell, result):
    found = [c for c in judge(cell, result) if c["name"] == "sanity.gpu_busy_share"]
    return found[0] if found else None


GATE = "gate/image/ddp-ds/g1/fp32/px500/nopin/nchw"


def test_a_busy_gpu_passes_and_the_threshold_is_experiment_data():
    cell, limit = cells.get(GATE), limits()["min_gpu_busy_share"]
    check = busy_check(cell, on_gpu(cell, busy=min(limit + 0.05, 1.0)))
    assert check["verdict"] == "pass" and str(limit) in check["expected"]
    assert "image.toml" in check["expected"]


@pytest.mark.parametrize("busy,loader,h2d,bound", [
    # of a step: the GPU busy (copying h2d of it), idle while rank 0 waited
    # for its loader, idle otherwise (the host): the largest of the last three
    (0.3, 0.5, 0.05, "the loader"), (0.55, 0.02, 0.5, "host-to-device copies"),
    (0.3, 0.02, 0.05, "the host")])
def test_an_idle_gpu_fails_naming_what_bound_it(busy, loader, h2d, bound):
    cell = cells.get(GATE)
    assert busy < limits()["min_gpu_busy_share"]
    check = busy_check(cell, on_gpu(cell, busy=busy, loader=loader, h2d=h2d))
    assert check["verdict"] == "fail" and check["observed"] == busy
    assert f"bound by {bound}" in check["message"], check["message"]
    assert f"busy {busy:.0%}" in check["message"] and "rank 1" in check["message"]
    assert f"loader {loader:.0%}" in check["message"] and f"copies {h2d:.0%}" in check["message"]
    assert failures({"checks": [check]})


def test_without_a_counting_window_busy_is_unknown_not_a_failure():
    cell = cells.get(GATE)
    check = busy_check(cell, on_gpu(cell, busy=None))
    assert check["verdict"] == "skipped" and "count_steps=0" in check["message"]
    assert not failures({"checks": [check]})
    older = {**on_gpu(cell, busy=None), "counters": {"window_steps": 2, "per_step": {"flops": 1.0}}}
    check = busy_check(cell, older)  # counted, by a perfsuite that measured no GPU time
    assert check["verdict"] == "skipped" and "before device_time" in check["message"]


def test_cpu_cells_and_round_robin_cells_have_no_busy_check():
    cpu = cells.get("smoke/image/ddp-ds/c2/fp32/px32/nopin/nchw")
    assert busy_check(cpu, on_gpu(cpu, busy=0.1)) is None
    rr = cells.get("gate/image/ddp-rr/g2/fp32/px500/nopin/nchw")
    assert rr.strategy in limits()["gpu_busy_exempt_strategies"]
    assert busy_check(rr, on_gpu(rr, busy=0.1)) is None  # loads every batch on every rank by design


def test_a_gpu_cell_aggregated_from_its_ranks_is_judged_on_its_least_busy_gpu():
    from perfsuite.results import aggregate

    cell = cells.get("gate/image/ddp-ds/g2/fp32/px500/nopin/nchw")

    def rank(i, busy_s):  # a rank record as the image workload writes it on a GPU (simulated)
        return {"rank": i, "status": "ok", "steps": 4, "device": f"cuda:{i}",
                "metrics": {"step_time": {"value": 0.2, "unit": "s", "samples": [0.2] * 4},
                            "throughput": {"value": 640.0, "unit": "images/s"},
                            "h2d_bytes": {"value": 1e9, "unit": "bytes"},
                            "peak_mem_allocated": {"value": 1e9, "unit": "bytes"}},
                "counters": {"window_steps": 2, "per_step": {"flops": 1.0}, "unstable": [],
                             "device_time": {"per_step_s": busy_s, "kernels_s": busy_s - 0.01,
                                             "memcpy_h2d_s": 0.01, "memcpy_d2h_s": 0.0,
                                             "memcpy_d2d_s": 0.0, "memset_s": 0.0}},
                "info": {"loader_wait_share": 0.02, "images_per_step": 128}}

    result = aggregate(cell, [rank(0, 0.19), rank(1, 0.06)], status="ok", reason=None, duration_s=1.0)
    check = busy_check(cell, result)
    assert result["gpu_busy_share"] == 0.3 and check["verdict"] == "fail"
    assert "rank 1's GPU was busy 30%" in check["message"] and "bound by the host" in check["message"]
    assert "copies 5%" in check["message"]
