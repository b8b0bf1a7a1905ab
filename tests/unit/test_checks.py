"""perfsuite.judge.checks: verdicts of single-cell and cross-cell checks on hand-made results."""

import json
import math

import numpy as np
import pytest

from perfsuite.judge import baselines as bl
from perfsuite.judge import checks as ck
from perfsuite.judge.applicable import checks_for
from perfsuite.judge.comparing import compare_runs
from perfsuite.judge.lookup import Expectation
from perfsuite.stats import launches as launchstats
from perfsuite.stats.samples import median_ratio_interval

PAPER = bl.PROJECT_BASELINES / "h100-sxm-94gb-x4-nvlink-paper"
H100 = "h100-sxm-94gb-x4-nvlink"
H100_ENV = {"gpu_name": "NVIDIA H100 SXM", "gpu_count": 4, "gpu_memory_bytes": 94 * 2**30,
            "interconnect": "nvlink"}
CPU_ENV = {"cpu_model": "AMD EPYC 9334", "cpu_cores": 2, "gpu_count": 0}


def steps(median, n=30, seed=0, sigma=0.02):
    return list(np.random.default_rng(seed).lognormal(math.log(median), sigma, n))


def result(median=0.1, *, world_size=1, precision="fp32", pin_memory=False, status="ok",
           seed=0, cell_id=None, env=None, **metrics):
    params = {"tier": "full", "workload": "image", "strategy": "ddp-ds", "device": "cuda",
              "world_size": world_size, "precision": precision, "pin_memory": pin_memory,
              "dataset": "mnist", "batch_size": 64, "epochs": 20, "max_steps": 0,
              "image_size": 500, "memory_format": "nchw"}
    cell_id = cell_id or f"full/image/ddp-ds/g{world_size}/{precision}/px500/{pin_memory}/nchw"
    samples = steps(median, seed=seed)
    return {"id": cell_id, "params": params, "status": status, "env": env or H100_ENV,
            "info": {"images_per_step": 64 * world_size},
            "metrics": {"step_time": {"value": float(np.median(samples)), "unit": "s",
                                      "samples": samples}, **metrics}}


# ------------------------------------------------------------------ Verdict

def test_verdict_to_dict_is_json_safe_and_has_the_contract_keys():
    v = ck.Verdict("x", "unknown", observed=float("nan"), ci_high=math.inf, message="m")
    d = v.to_dict()
    json.dumps(d, allow_nan=False)
    assert {"name", "verdict", "observed", "expected", "ratio", "ci_low", "ci_high",
            "confidence", "message"} <= set(d)
    assert d["observed"] is None and d["ci_high"] is None


def test_verdict_refuses_an_unknown_state():
    with pytest.raises(ValueError):
        ck.Verdict("x", "ok")


# ------------------------------------------------------- single-cell checks

def test_step_time_against_recorded_samples():
    """One launch against one recorded launch: only the between-launch spread
    recorded with the baseline can decide, and it widens the interval."""
    base = Expectation("step_time", 0.1, tolerance=0.15, samples=tuple(steps(0.1, seed=1)),
                       source="recorded run 2026-11-21", launch_spread=launchstats.LaunchSpread(0.03, 30))
    same = ck.StepTimeNotRegressed(base).evaluate(result(0.1, seed=2))
    assert same.verdict == "same" and not same.failed
    assert same.ci_high / same.ci_low > 1.15 and "widened by the between-launch spread" in same.message
    slow = ck.StepTimeNotRegressed(base).evaluate(result(0.13, seed=3))
    assert slow.verdict == "regressed" and slow.failed
    assert slow.ratio == pytest.approx(1.3, rel=0.05)
    assert "step_time regressed" in slow.message and "recorded run 2026-11-21" in slow.message
    assert slow.baseline == "recorded run 2026-11-21" and slow.cell == result()["id"]
    no_spread = Expectation("step_time", 0.1, tolerance=0.15, samples=tuple(steps(0.1, seed=1)))
    drift = ck.StepTimeNotRegressed(no_spread).evaluate(result(0.13, seed=3))
    assert drift.verdict == "unknown" and launchstats.DRIFT_UNKNOWN in drift.message


def test_step_time_against_one_paper_number():
    """A paper's number is one launch of the baseline: one launch against it
    decides only with a known between-launch spread."""
    check = ck.StepTimeNotRegressed(Expectation("step_time", 0.77, tolerance=0.10, source="paper",
                                                launch_spread=launchstats.LaunchSpread(0.02, 30)))
    assert check.evaluate(result(0.77)).verdict == "same"
    assert check.evaluate(result(0.95)).verdict == "regressed"
    unknown = ck.StepTimeNotRegressed(value=0.77, tolerance=0.10).evaluate(result(0.95))
    assert unknown.verdict == "unknown" and "perfsuite ab" in unknown.message
    four = result(0.95)
    four["metrics"]["step_time"]["launches"] = [steps(0.95 * f, seed=i)
                                                for i, f in enumerate((1, 1.01, 0.99, 1.02))]
    assert ck.StepTimeNotRegressed(value=0.77, tolerance=0.10).evaluate(four).verdict == "regressed"


def test_step_time_without_a_baseline_is_skipped_with_the_reason():
    exp = Expectation("step_time", reason="no comparable baseline for step_time on profile X")
    v = ck.StepTimeNotRegressed(exp).evaluate(result())
    assert v.verdict == "skipped" and "no comparable baseline" in v.message


def test_failed_cells_are_skipped_and_missing_samples_unknown():
    check = ck.StepTimeNotRegressed(value=0.1)
    assert check.evaluate(result(status="timeout")).verdict == "skipped"
    bare = result()
    bare["metrics"]["step_time"]["samples"] = []
    assert check.evaluate(bare).verdict == "unknown"


def test_peak_memory():
    check = ck.PeakMemoryNotRegressed(value=10e9, tolerance=0.05)
    grown = result(peak_mem_allocated={"value": 11e9, "unit": "bytes"})
    assert check.evaluate(grown).verdict == "regressed"
    same = result(peak_mem_allocated={"value": 10.2e9, "unit": "bytes"})
    assert check.evaluate(same).verdict == "same"
    assert check.evaluate(result()).verdict == "unknown"  # not reported
    assert ck.PeakMemoryNotRegressed().evaluate(same).verdict == "skipped"


def test_accuracy_at_least():
    check = ck.AccuracyAtLeast(0.97, source="paper")
    assert check.evaluate(result(accuracy={"value": 0.985})).verdict == "pass"
    low = check.evaluate(result(accuracy={"value": 0.95}))
    assert low.verdict == "fail" and low.failed and "0.9500" in low.message
    assert check.evaluate(result()).verdict == "fail"
    from_paper = ck.AccuracyAtLeast.from_expectation(Expectation("accuracy", 0.99, tolerance=0.02))
    assert from_paper.threshold == pytest.approx(0.9702)
    with pytest.raises(ValueError):
        ck.AccuracyAtLeast(97.0)


# -------------------------------------------------------- cross-cell checks

def test_scaling_efficiency_from_two_cells():
    one, four = result(0.100, seed=1), result(0.125, world_size=4, seed=2)
    # Throughput grows 4 x 0.100 / 0.125 = 3.2 times: efficiency 0.8.
    paper = Expectation("speedup", 3.2348, tolerance=0.10, source="2503.15252 Table 2")
    v = ck.ScalingEfficiency(paper).evaluate(four, one)
    assert v.verdict == "same" and v.observed == pytest.approx(0.8, rel=0.02)
    assert v.expected == pytest.approx(3.2348 / 4)
    assert v.ci_low <= v.ratio <= v.ci_high and v.ratio == pytest.approx(v.observed / v.expected)
    poor = ck.ScalingEfficiency(paper).evaluate(result(0.2, world_size=4, seed=3), one)
    assert poor.verdict == "regressed"


def test_scaling_efficiency_with_a_given_minimum_is_in_efficiency_units():
    one, four = result(0.100, seed=1), result(0.125, world_size=4, seed=2)
    assert ck.ScalingEfficiency(minimum=0.7).evaluate(four, one).verdict == "pass"
    assert ck.ScalingEfficiency(minimum=0.9).evaluate(four, one).verdict == "fail"


def test_scaling_efficiency_uses_images_per_step_for_plain_ddp():
    one = result(0.1, seed=1)
    ddp = result(0.1, world_size=4, seed=2)
    ddp["params"]["strategy"] = "ddp"
    ddp.pop("info")  # falls back to the parameters: every rank trains on the same batch
    v = ck.ScalingEfficiency(minimum=0.0).evaluate(ddp, one)
    assert v.observed == pytest.approx(0.25, rel=0.03)


def test_cross_cell_check_without_its_twin_is_skipped():
    v = ck.ScalingEfficiency(minimum=0.5).evaluate(result(world_size=4), None)
    assert v.verdict == "skipped" and "twin" in v.message
    failed_twin = result(status="failed")
    assert ck.ScalingEfficiency(minimum=0.5).evaluate(result(world_size=4),
                                                      failed_twin).verdict == "skipped"


def test_precision_speedup_against_table_and_finding():
    fp64, fp16 = result(0.231, precision="fp64", seed=1), result(0.1, precision="fp16", seed=2)
    table = Expectation("speedup", 2.3107, tolerance=0.10, source="Table 2")
    assert ck.PrecisionSpeedup(table).evaluate(fp16, fp64).verdict == "same"
    finding = Expectation("speedup", None, 2.10, 2.53, 0.05, source="sec. 3.4")
    v = ck.PrecisionSpeedup(finding).evaluate(fp16, fp64)
    assert v.verdict == "pass" and "expected within [2.1, 2.53]" in v.message
    slow = ck.PrecisionSpeedup(finding).evaluate(result(0.2, precision="fp16", seed=3), fp64)
    assert slow.verdict == "fail" and slow.failed


def test_pin_memory_gain_applies_only_to_pinned_cells():
    assert ck.PinMemoryGain().applies({"pin_memory": True})
    assert not ck.PinMemoryGain().applies({"pin_memory": False})
    pinned, plain = result(0.1, pin_memory=True, seed=1), result(0.125, seed=2)
    v = ck.PinMemoryGain(minimum=1.16, maximum=1.30).evaluate(pinned, plain)
    assert v.verdict == "pass" and v.observed == pytest.approx(1.25, rel=0.03)


def test_step_time_ratio():
    one, two = result(0.77, seed=1), result(0.93, world_size=2, seed=2)
    v = ck.StepTimeRatio(minimum=1.0, maximum=1.3).evaluate(two, one)
    assert v.verdict == "pass" and v.observed == pytest.approx(0.93 / 0.77, rel=0.02)


def test_needed_cells_names_each_twin():
    params = result(world_size=4, precision="fp16", pin_memory=True)["params"]
    twins = ck.needed_cells(params)
    assert twins["scaling_efficiency"]["world_size"] == 1
    assert twins["precision_speedup"]["precision"] == "fp64"
    assert twins["pin_memory_gain"]["pin_memory"] is False
    assert twins["precision_speedup"]["world_size"] == 4  # everything else unchanged
    assert ck.needed_cells(result()["params"]) == {"precision_speedup": {
        **result()["params"], "precision": "fp64"}}
    assert ck.needed_cells(result(precision="fp64")["params"]) == {}


# ------------------------------------------------- checks from the baselines

def test_checks_for_a_table2_cell_on_the_papers_hardware():
    sets = [bl.load_profile(PAPER)]
    params = result(world_size=2, precision="fp16")["params"]
    made = checks_for(params, H100, sets=sets)
    names = [c.name for c in made]
    assert names.count("precision_speedup") == 2  # the table row and the stated range
    assert "scaling_efficiency" in names and "accuracy_at_least" in names
    assert not made[0].expectation.available  # the paper has no step-time samples: skipped


def test_checks_for_a_cell_on_other_hardware_skip_with_a_reason():
    sets = [bl.load_profile(PAPER)]
    params = result(world_size=2, precision="fp16")["params"]
    made = checks_for(params, "cpu-amd-epyc-9334-2c", sets=sets)
    assert [c.name for c in made] == ["step_time", "accuracy_at_least"]
    v = made[0].evaluate(result(world_size=2, precision="fp16"))
    assert v.verdict == "skipped" and "no comparable" in v.message


# ------------------------------------------------------------- compare_runs

def run(*cells, env=H100_ENV):
    return {"schema": "perfsuite.results/1", "env": env, "cells": list(cells)}


def test_compare_runs_cell_by_cell():
    a = run({**repeated([0.1, 0.101, 0.099, 0.1], seed=1, cell_id="c1"),
             "metrics": {**repeated([0.1] * 4, seed=1)["metrics"], "accuracy": {"value": 0.99},
                         "peak_mem_allocated": {"value": 1e9}}},
            repeated([0.1, 0.101, 0.099, 0.1], seed=2, cell_id="c2"),
            result(0.1, seed=3, cell_id="only-a"))
    b = run({**repeated([0.13, 0.131, 0.129, 0.13], seed=4, cell_id="c1"),
             "metrics": {**repeated([0.13, 0.131, 0.129, 0.13], seed=4)["metrics"],
                         "accuracy": {"value": 0.99}, "peak_mem_allocated": {"value": 1e9}}},
            repeated([0.1, 0.1, 0.101, 0.099], seed=5, cell_id="c2"))
    out = compare_runs(a, b, tolerance=0.05)
    by = {(v["cell"], v["name"]): v for v in out}
    assert by[("c1", "step_time")]["verdict"] == "regressed"
    assert by[("c1", "peak_mem_allocated")]["verdict"] == "same"
    assert by[("c1", "accuracy_at_least")]["verdict"] == "pass"
    assert by[("c2", "step_time")]["verdict"] == "same"
    assert by[("only-a", "compare")]["verdict"] == "skipped"
    json.dumps(out, allow_nan=False)


def repeated(levels, seed, cell_id="c1"):
    """A cell launched once per level, its launches kept apart."""
    out = result(levels[0], seed=seed, cell_id=cell_id)
    launches = [steps(level, seed=seed + i) for i, level in enumerate(levels)]
    out["metrics"]["step_time"].update(
        samples=[x for launch in launches for x in launch], launches=launches)
    return out


def test_compare_runs_judges_repeated_launches_by_their_spread():
    # Launch levels scatter 0.09-0.12: pooled 120 tight steps a side would call
    # the 15 % higher run B regressed; its launches overlap run A's.
    a = run(repeated([0.09, 0.12, 0.10, 0.11], seed=10))
    b = run(repeated([0.1035, 0.138, 0.115, 0.1265], seed=20))
    pooled = median_ratio_interval(b["cells"][0]["metrics"]["step_time"]["samples"],
                                   a["cells"][0]["metrics"]["step_time"]["samples"])
    check = {v["name"]: v for v in compare_runs(a, b)}["step_time"]
    assert pooled.low > 1.05  # the pooled steps' own interval: a "regression"
    assert check["verdict"] == "unknown"
    assert "launch medians, Mann-Whitney interval over 4 vs 4 launches" in check["message"]


def test_compare_runs_on_different_hardware_skips_absolute_metrics():
    a = run(result(0.1, seed=1, cell_id="c1", accuracy={"value": 0.99}))
    b = run(result(0.5, seed=2, cell_id="c1", env=CPU_ENV, accuracy={"value": 0.99}),
            env=CPU_ENV)
    out = compare_runs(a, b)
    step = next(v for v in out if v["name"] == "step_time")
    assert step["verdict"] == "skipped" and "no comparable baseline" in step["message"]
    assert [v["verdict"] for v in out if v["name"] == "accuracy_at_least"] == ["pass"]
    forced = compare_runs(run(repeated([0.1, 0.1, 0.101, 0.099], seed=1)),
                             run(repeated([0.5, 0.5, 0.51, 0.49], seed=2), env=CPU_ENV),
                             allow_other_hardware=True)
    assert [v["verdict"] for v in forced if v["name"] == "step_time"] == ["regressed"]


def test_compare_of_one_launch_a_side_never_claims_a_direction():
    """Record, re-run with a slowed stack, compare: the baseline's one launch
    ran in a busy minute. Within-launch statistics called this "improved"."""
    busy, slowed = run(result(0.16, seed=1, cell_id="c1")), run(result(0.115, seed=2, cell_id="c1"))
    check = {v["name"]: v for v in compare_runs(busy, slowed)}["step_time"]
    assert check["verdict"] == "unknown" and launchstats.DRIFT_UNKNOWN in check["message"]


def test_a_finding_of_the_experiment_data_is_judged_across_two_cells():
    from perfsuite.cells import Finding

    finding = Finding("fp32-faster", "paper", {"precision": "fp32"}, {"precision": "fp64"}, low=1.3)
    check = ck.FindingRatio(finding)
    fp32 = result(0.10, world_size=2, seed=1)
    assert check.applies(fp32["params"]) and check.twin_params(fp32["params"])["precision"] == "fp64"
    passed = check.evaluate(fp32, result(0.20, world_size=2, precision="fp64", seed=2))
    assert passed.verdict == "pass" and passed.name == "finding.fp32-faster"
    assert passed.observed == pytest.approx(2.0, rel=0.05)
    failed = check.evaluate(fp32, result(0.11, world_size=2, precision="fp64", seed=3))
    assert failed.verdict == "fail" and "expected within [1.3" in failed.message
