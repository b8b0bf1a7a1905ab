"""`perfsuite selftest launch-cost`: where a launch's wall time goes, per rank start."""

import json

import pytest

from perfsuite.cli.main import main
from perfsuite.selftest import launchcost


def fake_run_cell(monkeypatch, seen):
    def run_cell(cell, directory, opts):
        seen.append(opts.rank_start)
        first = seen.count("fork") == 1 and opts.rank_start == "fork"
        before = {"fork": 7.0 if first else 0.2, "exec": 5.0}[opts.rank_start]
        timeline = {"wall": before + 3.0, "start_and_imports": before - 0.4, "workload_import": 0.1,
                    "workload_setup": 0.3, "training": 2.0, "counting": 0.5, "workload_other": 0.3,
                    "exit": 0.2}
        return {"status": "ok", "info": {"rank_start": opts.rank_start}, "timeline": timeline}

    monkeypatch.setattr(launchcost, "run_cell", run_cell)


def test_the_zygotes_start_is_reported_apart_from_the_forked_launches(tmp_path, monkeypatch):
    seen = []
    fake_run_cell(monkeypatch, seen)
    out = launchcost.measure_launch_cost("smoke/image/ddp-ds/c1/fp32/px32/nopin/nchw", launches=2,
                                         work_dir=tmp_path, log=lambda line: None)
    assert seen == ["fork", "fork", "fork", "exec", "exec"]  # one more: the zygote's start
    assert out["first_fork"]["before_training"] == 7.0
    assert out["medians"]["fork"]["before_training"] == 0.2 and out["medians"]["exec"]["before_training"] == 5.0
    assert len(out["runs"]["fork"]) == len(out["runs"]["exec"]) == 2
    assert json.loads((tmp_path / "launch-cost.json").read_text())["medians"] == out["medians"]


def test_launch_cost_refuses_what_it_cannot_measure(capsys):
    assert main(["selftest", "launch-cost", "--rank-start", "spawn"]) == 2
    assert "rank starts among fork, exec" in capsys.readouterr().err
    assert main(["selftest", "launch-cost", "--cell", "smoke/nope"]) == 2
    assert "smoke/nope" in capsys.readouterr().err


def test_a_failed_launch_stops_the_measurement_naming_its_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(launchcost, "run_cell", lambda cell, d, o: {"status": "error", "reason": "boom"})
    with pytest.raises(RuntimeError, match="boom"):
        launchcost.measure_launch_cost("smoke/image/ddp-ds/c1/fp32/px32/nopin/nchw", launches=1,
                                       work_dir=tmp_path, log=lambda line: None)


def test_a_launchs_timeline_splits_the_workloads_set_up_from_what_follows_training():
    from perfsuite.launch.launch import timeline

    record = {"started": 101.0, "workload_imported": 101.5, "training_started": 102.25,
              "finished": 106.0}
    result = {"metrics": {"total_time": {"value": 2.5}}, "info": {"count_window_s": 0.5}}
    parts = timeline(100.0, 106.5, record, result)
    assert parts == pytest.approx({"wall": 6.5, "start_and_imports": 1.0, "workload_import": 0.5,
                                   "workload_setup": 0.75, "training": 2.5, "counting": 0.5,
                                   "workload_other": 0.75, "exit": 0.5})
    assert launchcost.before_training(parts) == pytest.approx(2.25)
    # a record that does not say when training began: its set-up stays in the rest
    del record["training_started"]
    parts = timeline(100.0, 106.5, record, result)
    assert parts["workload_setup"] == 0.0 and parts["workload_other"] == pytest.approx(1.5)
