"""The H200 acceptance calls of 2026-11-28 (tests/data/h200-2026-11-28/),
judged again on a machine without a GPU.

- Every stored file is what came back: the archives' SHA256SUMS hold (the
  second call's figures refused the first call's figures.txt, which that
  call's script truncated before checking it: the defect that call showed).
- baselines/h200-140gb-x1 is what recording makes of the judged run's
  results, then the first run's (four launches of five cells).
- The judged run's five cells, one launch each, judged against the first
  run's four launches made minutes earlier: by launch medians (as the
  machine's own recording judged them) step time `unknown` at the ratios the
  machine printed (medians scatter 3.8 % on the pageable cells); by launch
  floors (the folder's statistic: they scatter 1.2 %) `same` within ±3 %;
  memory `same`, work counters equal; the papers' 1-GPU findings pass.
- With that folder no one-GPU gate cell of the judged run lacks a step-time
  baseline: the next run on an H200 judges every runnable cell.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import tarfile
from pathlib import Path

import pandas as pd
import pytest

from perfsuite.cells import Cell
from perfsuite.hardware import profile_id
from perfsuite.judge import baselines as bl
from perfsuite.judge import recording
from perfsuite.judge.judging import judge
from perfsuite.schemas.results import load
from perfsuite.selftest import acceptance

DAY = Path(__file__).resolve().parents[1] / "data" / "h200-2026-11-28"
PROFILE = "h200-140gb-x1"
FOLDER = bl.PROJECT_BASELINES / PROFILE
RECORDED = ["gate/image/dp/g1/fp32/px500/nopin/nchw", "gate/image/ddp/g1/fp32/px500/nopin/nchw",
            "gate/image/ddp-rr/g1/fp32/px500/nopin/nchw", "gate/image/ddp-ds/g1/fp32/px500/nopin/nchw",
            "gate/image/ddp-ds/g1/fp64/px500/nopin/nchw"]
# step-time ratios the judged run printed on the machine (against the runner's baselines of call 1)
PRINTED = dict(zip(RECORDED, (0.9905, 1.004, 0.9421, 1.063, 1.076)))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    """The first run (call 1, recording) and the judged run (call 3), unpacked."""
    tmp = tmp_path_factory.mktemp("h200")
    for archive in (DAY / "call1-doctor-gate" / "acceptance.tgz", DAY / "call3-gate-judged" / "gate2.tgz"):
        with tarfile.open(archive) as tar:
            tar.extractall(tmp / archive.parent.name, filter="data")
    return {"first": load(tmp / "call1-doctor-gate" / "gate" / "results.json"),
            "judged": load(tmp / "call3-gate-judged" / "gate2" / "results.json")}


@pytest.fixture(scope="module")
def sets():
    return bl.load_all(bl.PROJECT_BASELINES)


def by_id(run: dict) -> dict[str, dict]:
    return {c["id"]: c for c in run["cells"]}


def judged(result: dict, twins: dict[str, dict], sets: list) -> dict[str, dict]:
    checks = judge(Cell.from_params(result["params"]), result,
                   lambda params: twins.get(Cell.from_params(params).id), sets)
    return {c["name"]: c for c in checks}


def test_what_came_back_is_stored_as_it_came(capsys):
    assert acceptance.main([str(DAY / "call1-doctor-gate" / "acceptance.tgz")]) == 0
    figures = capsys.readouterr().out.splitlines()
    assert "parts: doctor rc 0 (23 s), gate rc 124 (485 s), ab rc not-run (0 s)" in figures
    assert "  NVIDIA H200, 143771 MiB, 580.159.04, 00000000:00:06.0" in figures
    assert "gate: 5 of 14 cells run (5 ok), 9 not run (need more GPUs than present); step time: 5 recorded" in figures
    assert figures[figures.index("gate: 5 of 14 cells run (5 ok), 9 not run (need more GPUs than present); "
                                 "step time: 5 recorded") + 1].startswith(
        "  the run is interrupted: the cells after these were not reached")
    assert acceptance.main([str(DAY / "call2-gate-refused" / "acceptance.tgz")]) == 0
    assert "gate rc 4 (11 s)" in capsys.readouterr().out  # its gate refused its non-empty folder
    refused = (DAY / "call2-gate-refused" / "figures.txt").read_text()  # as that call's figures said
    assert "figures.txt: not the file measured" in refused
    digest, name = (DAY / "call3-gate-judged" / "SHA256SUMS.received").read_text().split()
    assert hashlib.sha256((DAY / "call3-gate-judged" / name).read_bytes()).hexdigest() == digest


def test_both_runs_name_the_h200_and_its_stack(runs):
    for run in runs.values():
        assert bl.run_profile(run) == profile_id(run["env"]) == PROFILE
    assert runs["first"]["run"]["status"] == "interrupted"  # cut at the gate part's 480 s


def test_the_folder_is_what_recording_makes_of_the_judged_run_then_the_first(runs, tmp_path):
    for name in ("judged", "first"):
        run = runs[name]
        started = datetime.datetime.fromtimestamp(run["run"]["started"], datetime.timezone.utc)
        plan = recording.record_run(run, PROFILE, root=tmp_path, launch_statistic="floor",
                                    date=started.strftime("%Y-%m-%dT%H:%M:%SZ"))
    made, kept = bl.load_profile(tmp_path / PROFILE), bl.load_profile(FOLDER)
    assert plan.unspread == ("image/pinned",) and "no between-launch spread of image/pinned" in plan.describe()
    pd.testing.assert_frame_equal(made.metrics, kept.metrics)
    assert made.samples == kept.samples and list(made.counters) == list(kept.counters)
    assert made.launch_spread == kept.launch_spread
    pageable = kept.launch_spread["image/pageable"]  # the only kind with repeated launches
    assert set(kept.launch_spread) == {"image/pageable"}
    assert pageable["median"].dof == 15  # 5 cells of 4 launches
    assert pageable["median"].log_sd == pytest.approx(0.0377, abs=0.0005)
    assert pageable["floor"].log_sd == pytest.approx(0.0122, abs=0.0005)


@pytest.mark.parametrize("cell_id", RECORDED)
def test_by_launch_medians_as_on_the_machine_the_judged_runs_cells_are_unknown(runs, cell_id, tmp_path):
    for name in ("judged", "first"):
        recording.record_run(runs[name], PROFILE, root=tmp_path, launch_statistic="median")
    sets = [s for s in bl.load_all(bl.PROJECT_BASELINES) if s.hardware != PROFILE] + bl.load_all(tmp_path)
    judged_run = by_id(runs["judged"])
    step = judged(judged_run[cell_id], judged_run, sets)["step_time"]
    assert step["verdict"] == "unknown" and "1 vs 4 launch(es)" in step["message"]
    assert step["ratio"] == pytest.approx(PRINTED[cell_id], abs=0.001)
    assert step["ci_high"] / step["ci_low"] > 1.15  # the pageable cells' launch medians drift: ~±8 %


@pytest.mark.parametrize("cell_id", RECORDED)
def test_by_launch_floors_the_judged_runs_cells_are_the_same_as_the_first_runs(runs, sets, cell_id):
    judged_run = by_id(runs["judged"])
    checks = judged(judged_run[cell_id], judged_run, sets)
    step = checks["step_time"]
    assert step["verdict"] == "same" and "1 vs 4 launch(es)" in step["message"]
    assert "launch floors" in step["message"]
    assert 0.95 < step["ci_low"] and step["ci_high"] < 1.05  # within the gate's 5 %: about ±3 %
    first = by_id(runs["first"])[cell_id]
    assert step["baseline"].startswith("recorded run ") and len(first["metrics"]["step_time"]["launches"]) == 4
    assert checks["peak_mem_allocated"]["verdict"] == "same"
    assert checks["work_counters"]["verdict"] == "pass", checks["work_counters"]["message"]


@pytest.mark.parametrize("name,subject,observed", [
    ("fp32-faster-than-fp64-1gpu", "fp32/px500/nopin", 1.644),
    ("fp16-faster-than-fp64-1gpu", "fp16/px500/nopin", 2.302),
    ("pin-memory-gain-1gpu", "fp32/px500/pin", 1.577)])
def test_the_papers_one_gpu_findings_hold_on_the_h200(runs, sets, name, subject, observed):
    judged_run = by_id(runs["judged"])
    found = judged(judged_run[f"gate/image/ddp-ds/g1/{subject}/nchw"], judged_run, sets)[f"finding.{name}"]
    assert found["verdict"] == "pass" and found["observed"] == pytest.approx(observed, abs=0.002)


def test_every_one_gpu_cell_of_the_judged_run_now_has_a_step_time_baseline(runs, sets):
    judged_run = by_id(runs["judged"])
    ran = [c for c in judged_run.values() if not c.get("needs_gpus")]
    assert len(ran) == 9 and all(c["status"] == "ok" for c in ran)
    for cell in ran:
        step = judged(cell, judged_run, sets)["step_time"]
        assert step["verdict"] != "skipped" and step.get("missing") != "baseline", (cell["id"], step["message"])
        # the pinned cell was recorded from one launch, and no pinned launches were repeated: its
        # kind has no spread there, which a gate run with --perf-record-new launches it again for
        pinned = cell["params"]["pin_memory"]
        assert step.get("missing") == ("spread" if pinned else None), (cell["id"], step["message"])
    assert sum(bool(c.get("needs_gpus")) for c in judged_run.values()) == 13


def test_a_runner_recording_cell_by_cell_pools_the_spread_of_every_cell_it_recorded(runs, tmp_path):
    # --perf-record-new records each cell as it finishes; on the H200 the folder's spread was then
    # the last cell's alone (3 d.o.f.), where recording the run at once pools all five (15)
    first = by_id(runs["first"])
    for cell_id in RECORDED:
        cell = {**first[cell_id], "env": runs["first"]["env"]}
        assert recording.record_missing(cell, tmp_path) == tmp_path / PROFILE
    spread = bl.load_profile(tmp_path / PROFILE).launch_spread["image/pageable"]
    kept = bl.load_profile(FOLDER).launch_spread["image/pageable"]
    for statistic in ("median", "floor"):
        assert spread[statistic].dof == 15
        assert spread[statistic].log_sd == pytest.approx(kept[statistic].log_sd, rel=1e-3)


def test_a_runners_own_folder_takes_the_steadier_launch_statistic_once_its_spread_is_known(runs, tmp_path):
    # the first run's cells, recorded one by one as --perf-record-new does: after one cell (3 d.o.f.)
    # the folder keeps the default, medians; from two cells on it judges by the steadier, floors
    first = by_id(runs["first"])
    folder = tmp_path / PROFILE
    statistics = []
    for cell_id in RECORDED:
        recording.record_missing({**first[cell_id], "env": runs["first"]["env"]}, tmp_path)
        statistics.append(bl.load_profile(folder).launch_statistic)
    assert statistics == ["median", "floor", "floor", "floor", "floor"]
    chosen = json.loads((folder / "profile.json").read_text())["launch_statistic_chosen"]
    assert chosen.startswith("floor: the steadier over 15 d.o.f. (floors 1.2 %, medians 3.8 %)")


def test_a_launch_statistic_set_by_hand_is_kept(runs, tmp_path):
    recording.record_run(runs["first"], PROFILE, root=tmp_path, launch_statistic="median")
    recording.record_run(runs["first"], PROFILE, root=tmp_path)
    profile = json.loads((tmp_path / PROFILE / "profile.json").read_text())
    assert profile["launch_statistic"] == "median" and "launch_statistic_chosen" not in profile


def test_baseline_record_says_which_statistic_it_chose_and_why(runs, tmp_path, capsys):
    from perfsuite.cli.main import main

    results = tmp_path / "results.json"
    results.write_text(json.dumps(runs["first"]))
    assert main(["baseline", "record", str(results), "--baselines", str(tmp_path / "b"), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["launch_statistic_chosen"].startswith("floor: the steadier over 15 d.o.f.")
    assert main(["baseline", "record", str(results), "--baselines", str(tmp_path / "c"),
                 "--launch-statistic", "median"]) == 0
    assert "launch statistic" not in capsys.readouterr().out  # set by hand: nothing chosen
