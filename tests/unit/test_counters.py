"""Work counters as data: merged over ranks and launches, diffed, judged,
recorded with a baseline and compared between runs."""

import json

import pytest

from perfsuite.judge import baselines as bl
from perfsuite.judge import recording
from perfsuite.judge.checks import WorkCountersUnchanged
from perfsuite.judge.comparing import compare_runs
from perfsuite.judge.lookup import find_counters
from perfsuite.rank import counters

STACK = {"torch": "2.14.0+cu130", "torchvision": "0.29.2", "torchtune": "0.6.1",
         "torchao": "0.13.0"}
AVX2 = {"cpu_model": "AMD EPYC", "cpu_isa": "avx2", "cpu_cores": 2, "gpu_count": 0, **STACK}
AVX512 = {**AVX2, "cpu_model": "Intel(R) Xeon(R) Processor", "cpu_isa": "avx512"}
STEP = {"ops/aten::convolution": 52, "ops/aten::copy_": 314, "flops": 1.8e9,
        "collectives/allreduce/calls": 4, "collectives/allreduce/bytes": 17893456}


def cell(per_step=STEP, env=AVX2, status="ok", unstable=(), cell_id="smoke/image/ddp-ds/c2"):
    params = {"tier": "smoke", "workload": "image", "strategy": "ddp-ds", "device": "cpu",
              "world_size": 2, "precision": "fp32", "image_size": 32}
    return {"id": cell_id, "params": params, "status": status, "env": env,
            "metrics": {"step_time": {"value": 0.1, "unit": "s", "samples": [0.1] * 5}},
            "counters": {"window_steps": 2, "ranks": 2, "per_step": dict(per_step),
                         "unstable": list(unstable)}}


def run(*cells, env=AVX2):
    return {"schema": "perfsuite.results/1", "env": env, "cells": list(cells)}


def test_ranks_sum_and_launches_must_agree():
    rank = {"window_steps": 2, "per_step": {"a": 1, "b": 2}, "unstable": []}
    merged = counters.sum_ranks([rank, {**rank, "unstable": ["b"]}, None])
    assert merged["per_step"] == {"a": 2, "b": 4} and merged["unstable"] == ["b"]
    assert merged["ranks"] == 2 and counters.sum_ranks([None]) is None
    other = {**merged, "per_step": {"a": 3, "b": 4, "memory/peak_allocated": 9}}
    agreed = counters.agree_launches([merged, other])
    assert agreed["per_step"] == merged["per_step"] and agreed["unstable"] == ["a", "b"]


def test_gpu_time_travels_beside_the_counts_as_a_mean_and_is_never_judged_as_one():
    """device_time is seconds per step on each rank's GPU: a cell's is the
    mean over its ranks and launches (one rank's GPU busy share), and a time
    is no count that must not move."""
    rank = {"window_steps": 2, "per_step": {"a": 1}, "unstable": [],
            "device_time": {"per_step_s": 0.010, "kernels_s": 0.008}}
    merged = counters.sum_ranks([rank, {**rank, "device_time": {"per_step_s": 0.030, "kernels_s": 0.020}}])
    assert merged["device_time"] == pytest.approx({"per_step_s": 0.020, "kernels_s": 0.014})
    assert counters.sum_ranks([{**rank, "device_time": None}])["device_time"] is None  # the CPU
    other = {**merged, "device_time": {"per_step_s": 0.040, "kernels_s": 0.030}}
    agreed = counters.agree_launches([merged, other])
    assert agreed["device_time"] == pytest.approx({"per_step_s": 0.030, "kernels_s": 0.022})
    assert agreed["unstable"] == []
    assert not counters.exact("device_time/per_step_s") and counters.exact("cuda/memcpy_d2d_calls")
    assert counters.diff({"device_time/per_step_s": 0.02}, {"device_time/per_step_s": 0.01}) == []


def test_diffs_name_what_changed_in_the_words_of_a_step():
    more = {**STEP, "collectives/allreduce/calls": 5, "collectives/allreduce/bytes": 17893472,
            "ops/aten::copy_": 472}
    lines = counters.describe(counters.diff(more, STEP))
    assert lines == ["c10d allreduce per step 4 -> 5 (+16 B)",
                     "aten::copy_ +158 per step (314 -> 472)"]
    assert counters.diff(STEP, dict(STEP)) == []
    # an inexact counter within its tolerance, and unstable ones, are no change
    assert counters.diff({"memory/peak_allocated": 1030}, {"memory/peak_allocated": 1000}) == []
    assert counters.diff({"memory/peak_allocated": 1100}, {"memory/peak_allocated": 1000})
    assert counters.diff({"x": 2}, {"x": 1}, unstable={"x"}) == []
    assert counters.describe(counters.diff({"copies/h2d_bytes": 3e6}, {"copies/h2d_bytes": 1e6})) == [
        "copies/h2d_bytes per step +2 MB (1000000 -> 3000000)"]


def recorded(tmp_path, results):
    recording.record_run(results, root=tmp_path, date="2026-11-24T00:00:00Z")
    return bl.load_all(tmp_path)


def test_recorded_counters_judge_other_hosts_of_the_same_stack(tmp_path):
    sets = recorded(tmp_path, run(cell()))
    assert (tmp_path / "cpu-amd-epyc-avx2-2c" / "counters.json").exists()
    subject = cell(env=AVX512)  # another CPU: counts are not a property of the machine
    found, why = find_counters(subject["params"], AVX512, sets)
    assert found is not None and found.per_step == {k: float(v) for k, v in STEP.items()}
    same = WorkCountersUnchanged(found).evaluate(subject)
    assert same.verdict == "pass" and "5 counters per step equal" in same.message
    extra = cell({**STEP, "collectives/allreduce/calls": 6, "collectives/allreduce/bytes": 17893488})
    failed = WorkCountersUnchanged(found).evaluate(extra)
    assert failed.verdict == "fail" and failed.failed and failed.observed == 2
    assert "c10d allreduce per step 4 -> 6 (+32 B)" in failed.message


def test_counters_of_another_stack_are_not_compared_and_say_what_to_do(tmp_path):
    sets = recorded(tmp_path, run(cell()))
    newer = {**AVX2, "torch": "2.15.0"}
    found, why = find_counters(cell()["params"], newer, sets)
    assert found is None and "torch=2.14.0+cu130" in why and "torch=2.15.0" in why
    assert "perfsuite ab" in why
    verdict = WorkCountersUnchanged(found, why).evaluate(cell(env=newer))
    assert verdict.verdict == "skipped" and "perfsuite ab" in verdict.message
    nothing = WorkCountersUnchanged(*find_counters({"strategy": "dp"}, AVX2, sets))
    assert "no work counters recorded" in nothing.evaluate(cell()).message


def test_re_recording_replaces_a_cells_entry_and_keeps_a_hand_set_tolerance(tmp_path):
    recorded(tmp_path, run(cell()))
    file = tmp_path / "cpu-amd-epyc-avx2-2c" / "counters.json"
    data = json.loads(file.read_text())
    data["entries"][0]["tolerance"] = {"ops/aten::copy_": 0.5}
    file.write_text(json.dumps(data))
    sets = recorded(tmp_path, run(cell({**STEP, "ops/aten::copy_": 400})))
    (entry,) = sets[0].counters
    assert entry.per_step["ops/aten::copy_"] == 400 and entry.tolerance == {"ops/aten::copy_": 0.5}
    assert len(file.read_text().splitlines()) == 3  # an entry a line


@pytest.mark.parametrize("text", ['{"entries": []}', '{"format": "perfsuite.counters/1", "entries": [{"cell": "x"}]}',
                                  '{"format": "perfsuite.counters/1", "entries": [{"cell": "x", "params": {}, '
                                  '"versions": {}, "per_step": {"a": "many"}}]}'])
def test_a_malformed_counters_file_is_named(tmp_path, text):
    recorded(tmp_path, run(cell()))
    (tmp_path / "cpu-amd-epyc-avx2-2c" / "counters.json").write_text(text)
    with pytest.raises(bl.BaselineError, match="counters.json"):
        bl.load_all(tmp_path)


def test_compare_runs_diffs_counters_across_hardware():
    a, b = run(cell()), run(cell({**STEP, "ops/aten::copy_": 472}, env=AVX512), env=AVX512)
    by_name = {v["name"]: v for v in compare_runs(a, b)}
    assert by_name["step_time"]["verdict"] == "skipped"  # other hardware: no absolute times
    assert by_name["work_counters"]["verdict"] == "fail"
    assert "aten::copy_ +158 per step" in by_name["work_counters"]["message"]
    unstable = run(cell({**STEP, "ops/aten::copy_": 472}, unstable=["ops/aten::copy_"]))
    check = {v["name"]: v for v in compare_runs(a, unstable)}["work_counters"]
    assert check["verdict"] == "pass" and "unstable" in check["message"]


def test_the_counter_detection_benchmark_judges_single_launches(tmp_path, monkeypatch):
    """Launches stood in for: the faults change the counts as the real ones do."""
    from perfsuite.selftest import detection

    launched = []

    def fake_run_cell(cell, out_dir, opts):
        fault, window = opts.options.get("fault", ""), opts.options.get("count_steps")
        launched.append((fault, window))
        step = dict(STEP)
        if fault.startswith("allreduce"):
            step["collectives/allreduce/calls"] += 1
            step["collectives/allreduce/bytes"] += 16
        if fault.startswith("copy"):
            step["ops/aten::clone"] = 158
        result = cell_result_of(cell, step)
        result["timeline"] = {"wall": 10.0 if window == "0" else 10.5}
        return result

    def cell_result_of(c, step):
        return {**cell(step), "id": c.id, "params": c.params()}

    monkeypatch.setattr(detection, "run_cell", fake_run_cell)
    out = detection.measure_counter_detection(trials=3, work_dir=tmp_path, log=lambda line: None)
    assert out["unchanged_passed"] == out["allreduce_failed"] == out["copy_failed"] == 3
    assert out["window_overhead"] == pytest.approx(0.05)
    assert len(launched) == 1 + 3 * 4 and ("", "0") in launched
