"""Repeated launches of a cell: the Runner's repeats, baselines that keep
launches apart, and the detection benchmark's interleaved trials (launches
are the fake ones of conftest.py)."""

import json
import math

import pytest

from perfsuite.judge import recording
from perfsuite.judge.lookup import find_expectation
from perfsuite.runner import Runner
from perfsuite.selftest import detection
from tests.unit.cellkit import tiny_image_cell
from tests.unit.conftest import CPU_ENV, FakeLaunches, no_baselines


def measured_here(runner):
    """The runner's results as a run of the fake launches' machine."""
    return {"schema": "perfsuite.results/1", "env": CPU_ENV, "cells": runner.results}


def step_check(result):
    return next(c for c in result["checks"] if c["name"] == "step_time")


def test_runner_launches_each_cell_repeatedly_into_its_own_directories(tmp_path, fake):
    cell = tiny_image_cell(world_size=1)
    out = tmp_path / "out"
    result = Runner(out, probe=False, baselines=no_baselines(tmp_path), repeats=4).result(cell)
    assert [d for _, d, _ in fake.calls] == [out, out / "launch1", out / "launch2", out / "launch3"]
    assert result["repeats"] == 4 and len(result["metrics"]["step_time"]["launches"]) == 4
    saved = json.loads((out / "results.json").read_text())["cells"][0]
    assert saved["metrics"]["step_time"]["launch_medians"] == \
        result["metrics"]["step_time"]["launch_medians"]


def test_repeats_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="repeats must be at least 1"):
        Runner(tmp_path, repeats=0)


def test_a_baseline_recorded_from_launches_judges_launch_by_launch(tmp_path, fake):
    cell = tiny_image_cell(world_size=1)
    reference = Runner(tmp_path / "ref", probe=False, baselines=no_baselines(tmp_path), repeats=4)
    reference.result(cell)
    plan = recording.record_run(measured_here(reference), root=tmp_path / "baselines")
    stored = json.loads((plan.folder / "samples.json").read_text())
    key = f"{cell.id}:step_time"
    assert len(stored[key]) == 4 and all(len(launch) == 20 for launch in stored[key])
    exp = find_expectation(cell.params(), "step_time", plan.folder.name,
                              root=tmp_path / "baselines")
    assert len(exp.launches) == 4 and len(exp.samples) == 80

    again = Runner(tmp_path / "new", probe=False, baselines=tmp_path / "baselines", repeats=4)
    check = step_check(again.result(cell))
    assert check["verdict"] == "same", check["message"]
    assert "launch medians" in check["message"]


def test_unknown_between_launches_is_measured_with_more_launches(tmp_path, monkeypatch):
    noisy = FakeLaunches(seed=3, launch_sigma=0.08)
    monkeypatch.setattr("perfsuite.launch.launch.run_cell", noisy)
    cell = tiny_image_cell(world_size=1)
    reference = Runner(tmp_path / "ref", probe=False, baselines=no_baselines(tmp_path), repeats=4)
    reference.result(cell)
    recording.record_run(measured_here(reference), root=tmp_path / "baselines")
    before = len(noisy.calls)
    result = Runner(tmp_path / "new", probe=False, baselines=tmp_path / "baselines",
                    repeats=4).result(cell)
    launched = len(noisy.calls) - before
    assert launched == 4 * (result["remeasured"] + 1)
    assert len(result["metrics"]["step_time"]["launches"]) == launched
    if result["remeasured"]:  # every launch kept, none overwritten
        assert len({d for _, d, _ in noisy.calls[before:]}) == launched


def test_detection_trial_interleaves_groups_and_judges_against_the_recorded_reference(
        tmp_path, fake):
    cell = tiny_image_cell(world_size=1)
    out = detection.run_trial(cell, tmp_path, launches=4, environment=CPU_ENV)
    faults = {d.parent.name: opts.get("fault") for _, d, opts in fake.calls}
    assert faults == {"reference": None, "unchanged": None, "slow10": "slow:*:0:0.1",
                      "slow5": "slow:*:0:0.05"}
    # every group launched 4 times first, and each round starts with another group
    firsts = [fake.calls[4 * r][1].parent.name for r in range(4)]
    assert firsts == ["reference", "unchanged", "slow10", "slow5"]
    assert sorted(d.parent.name for _, d, _ in fake.calls[:16]) == sorted(
        [g for g in ("reference", "unchanged", "slow10", "slow5") for _ in range(4)])
    assert (tmp_path / "baselines").is_dir()
    verdicts = {name: check["verdict"] for name, check in out["checks"].items()}
    # launches scatter 1 %: a 10 % slowdown is called, unchanged code is the same
    assert verdicts["unchanged"] == "same" and verdicts["slow 10%"] == "regressed"
    assert out["checks"]["slow 10%"]["remeasured"] == 0
    assert "launch floors" in out["checks"]["slow 10%"]["message"]
    # only an undecided group was launched again, 4 at a time, the reference never
    again = [d.parent.name for _, d, _ in fake.calls[16:]]
    assert "reference" not in again and len(again) % 4 == 0
    for name, check in out["checks"].items():
        assert out["launches"][name] == 4 * (check["remeasured"] + 1)
        assert (check["remeasured"] > 0) == (detection._label(name) in again)
    assert all(len(vs) == out["launches"][g] for g, vs in out["launch_values"].items())


def test_detection_records_a_longer_reference_spread_among_the_groups(tmp_path, fake):
    cell = tiny_image_cell(world_size=1)
    out = detection.run_trial(cell, tmp_path, launches=4, reference_launches=12,
                              environment=CPU_ENV, remeasure_rounds=0)
    order = [d.parent.name for _, d, _ in fake.calls]
    assert len(order) == 24 and out["launches"]["reference"] == 12
    # a reference launch before each judged one, so the reference spans the trial
    assert order[:6] == ["reference", "unchanged", "reference", "slow10", "reference", "slow5"]
    assert order[-6:].count("reference") == 3
    saved = json.loads((tmp_path / "baselines" / "cpu-amd-epyc-9334-2c" / "samples.json")
                       .read_text())
    assert [len(v) for v in saved.values()] == [12]
    profile = json.loads((tmp_path / "baselines" / "cpu-amd-epyc-9334-2c" / "profile.json")
                         .read_text())
    assert profile["launch_statistic"] == "floor"


def test_detection_summary_is_written_after_every_trial(tmp_path, fake):
    lines = []
    out = detection.measure_detection(trials=2, cell_id="smoke/image/ddp-ds/c1/fp32/px32/nopin/nchw",
                                      steps=10, launches=4, reference_launches=4,
                                      work_dir=tmp_path, log=lines.append)
    saved = json.loads((tmp_path / "detection.json").read_text())
    assert saved["trials"] == 2 == out["trials"] and saved["caught_10"] == out["caught_10"]
    assert sum(saved["verdicts"]["unchanged"].values()) == 2
    assert len(lines) == 6 and all("launches vs 4" in line for line in lines)


SMOKE_CELL = "smoke/image/ddp-ds/c1/fp32/px32/nopin/nchw"


def test_a_stopped_detection_run_goes_on_where_it_stopped(tmp_path, fake):
    settings = dict(cell_id=SMOKE_CELL, steps=10, launches=4, reference_launches=4,
                    work_dir=tmp_path, log=lambda line: None)
    first = detection.measure_detection(trials=1, **settings)
    launched = len(fake.calls)
    with pytest.raises(ValueError, match="already holds 1 trial.*--resume"):
        detection.measure_detection(trials=2, **settings)
    assert len(fake.calls) == launched  # refused before launching anything
    both = detection.measure_detection(trials=2, resume=True, **settings)
    assert both["trials"] == 2 and [r["trial"] for r in both["per_trial"]] == [0, 1]
    assert both["per_trial"][0] == first["per_trial"][0]  # the first trial kept as it was
    assert len({call[1].parents[1] for call in fake.calls}) == 2  # trial0, trial1
    assert sum(both["verdicts"]["slow 10%"].values()) == 2
    assert both["seconds"] == pytest.approx(sum(r["seconds"] for r in both["per_trial"]))


def test_resuming_with_other_settings_is_refused(tmp_path, fake):
    detection.measure_detection(trials=1, cell_id=SMOKE_CELL, steps=10, launches=4,
                                reference_launches=4, work_dir=tmp_path, log=lambda line: None)
    with pytest.raises(ValueError, match="steps: 10 there, 20 now"):
        detection.measure_detection(trials=2, cell_id=SMOKE_CELL, steps=20, launches=4,
                                    reference_launches=4, work_dir=tmp_path, resume=True)
    (tmp_path / "detection.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a detection summary"):
        detection.measure_detection(trials=2, cell_id=SMOKE_CELL, steps=10, launches=4,
                                    reference_launches=4, work_dir=tmp_path, resume=True)


def test_launch_order_rotates_through_every_group():
    orders = [detection.launch_order(r) for r in range(4)]
    assert [o[0] for o in orders] == list(detection.GROUPS)
    assert all(sorted(o) == sorted(detection.GROUPS) for o in orders)


def test_launch_spread_removes_each_groups_level():
    spread = detection.launch_spread({"a": [1.0, 1.0], "b": [2.0, 2.0 * math.e ** 0.2]})
    assert spread == pytest.approx(math.sqrt(2 * 0.1 ** 2 / 2))


def test_a_trial_stopped_halfway_is_measured_again_from_its_start(tmp_path, fake):
    stale = tmp_path / "trial0" / "reference" / "launch7"
    stale.mkdir(parents=True)
    out = detection.measure_detection(trials=1, cell_id=SMOKE_CELL, steps=10, launches=4,
                                      reference_launches=4, work_dir=tmp_path,
                                      log=lambda line: None)
    assert out["per_trial"][0]["launches"]["reference"] == 4 and not stale.exists()
