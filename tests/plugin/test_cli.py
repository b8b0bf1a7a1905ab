"""perfsuite compare / baseline record / report / profile on stored runs."""

import json
import random

from perfsuite import cells
from perfsuite.cli import main
from perfsuite.results import SCHEMA

ENV = {"cpu_model": "Test CPU", "cpu_cores": 2, "gpu_count": 0, "torch": "2.14.0"}
CELL = cells.get("smoke/image/ddp/c2/fp32/px32/nopin/nchw")


def write_run(path, factor, seed=0, launches=1):
    rng = random.Random(seed)
    per_launch = [[factor * (0.1 + rng.gauss(0, 0.002)) for _ in range(30)] for _ in range(launches)]
    samples = [x for launch in per_launch for x in launch]
    step_time = {"value": sorted(samples)[15], "unit": "s", "samples": samples,
                 **({"launches": per_launch} if launches > 1 else {})}
    cell = {"id": CELL.id, "params": CELL.params(), "status": "ok", "reason": None, "env": ENV,
            "metrics": {"step_time": step_time,
                        "throughput": {"value": 320.0, "unit": "images/s"},
                        "peak_rss": {"value": 1e9, "unit": "bytes"},
                        "accuracy": {"value": 0.5, "unit": "fraction"}},
            "checks": [], "info": {"images_per_step": 16}}
    path.mkdir(parents=True)
    (path / "results.json").write_text(json.dumps({"schema": SCHEMA, "run": {}, "env": ENV,
                                                   "cells": [cell]}))
    return path


def test_compare_flags_a_slower_run(tmp_path, capsys):
    a = write_run(tmp_path / "a", 1.0, launches=4)
    assert main(["compare", str(a), str(write_run(tmp_path / "b", 1.0, seed=1, launches=4))]) == 0
    assert main(["compare", str(a), str(write_run(tmp_path / "c", 1.25, seed=2, launches=4))]) == 1
    out = capsys.readouterr().out
    assert "REGRESSED" in out and CELL.id in out


def test_compare_of_one_launch_a_side_says_it_cannot_tell(tmp_path, capsys):
    a = write_run(tmp_path / "a", 1.6)  # the baseline launch ran in a busy minute
    assert main(["compare", str(a), str(write_run(tmp_path / "c", 1.15, seed=2))]) == 0
    out = capsys.readouterr().out
    assert "IMPROVED" not in out and "UNKNOWN" in out and "perfsuite ab" in out


def test_baseline_record_writes_then_refuses_another_profile(tmp_path, capsys):
    run = write_run(tmp_path / "run", 1.0)
    root = tmp_path / "baselines"
    assert main(["baseline", "record", str(run), "--root", str(root)]) == 0
    (folder,) = [p for p in root.iterdir() if p.is_dir()]
    assert folder.name == "cpu-test-2c" and (folder / "metrics.csv").exists()
    assert main(["baseline", "record", str(run), "--root", str(root),
                 "--profile", "h100-sxm-94gb-x4-nvlink"]) == 2
    assert "force" in capsys.readouterr().err.lower()


def test_report_writes_html_and_csv(tmp_path, capsys):
    run = write_run(tmp_path / "run", 1.0)
    assert main(["report", str(run)]) == 0
    assert CELL.id in (run / "report.html").read_text()
    assert (run / "results.csv").exists() and (run / "checks.csv").exists()


def test_missing_or_malformed_runs_are_named(tmp_path, capsys):
    import pytest

    with pytest.raises(SystemExit, match="nowhere"):
        main(["report", str(tmp_path / "nowhere")])
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "results.json").write_text("[1,")
    with pytest.raises(SystemExit, match="not valid JSON"):
        main(["compare", str(tmp_path / "bad"), str(tmp_path / "bad")])


def test_profile_reads_nsys_csv_exports(capsys):
    from pathlib import Path

    fixtures = Path(__file__).parents[1] / "fixtures" / "nsys" / "v2023"
    assert main(["profile", str(fixtures)]) == 0
    assert "CUDA memcpy Host-to-Device" in capsys.readouterr().out
    assert main(["profile", "/nonexistent/report.nsys-rep"]) == 2


def write_launches(path, factor, seed, busy_share):
    """A run of 6 launches whose steps a neighbour slows 1.5x, each launch for
    its own share of them: the medians follow the neighbour, the floors do not."""
    rng = random.Random(seed)
    launches = [[factor * 0.1 * rng.gauss(1, 0.005) * (1.5 if rng.random() < busy else 1.0)
                 for _ in range(30)] for busy in busy_share]
    run = write_run(path, factor, seed)
    data = json.loads((run / "results.json").read_text())
    step = data["cells"][0]["metrics"]["step_time"]
    step["samples"] = [x for launch in launches for x in launch]
    step["launches"] = launches
    (run / "results.json").write_text(json.dumps(data))
    return run


def test_compare_by_launch_floors(tmp_path, capsys):
    a = write_launches(tmp_path / "a", 1.0, 1, [0.7, 0.6, 0.8, 0.7, 0.6, 0.8])
    b = write_launches(tmp_path / "b", 1.1, 2, [0.1, 0.2, 0.0, 0.1, 0.2, 0.1])
    # a neighbour busy through the reference run hides the slowdown from the medians...
    assert main(["compare", str(a), str(b)]) == 0
    # ...not from the floors
    assert main(["compare", str(a), str(b), "--launch-statistic", "floor"]) == 1
    out = capsys.readouterr().out
    assert "IMPROVED" in out.splitlines()[0] and "launch floors" in out


def test_baseline_record_sets_the_launch_statistic(tmp_path):
    from perfsuite import cli, launchstats

    run = write_run(tmp_path / "run", 1.0)
    root = tmp_path / "baselines"
    assert main(["baseline", "record", str(run), "--root", str(root),
                 "--launch-statistic", "floor"]) == 0
    profile = json.loads((root / "cpu-test-2c" / "profile.json").read_text())
    assert profile["launch_statistic"] == "floor"
    assert cli.LAUNCH_STATISTICS == tuple(launchstats.LAUNCH_STATISTICS)


def test_detection_will_not_mix_new_trials_into_an_earlier_run(tmp_path, capsys):
    (tmp_path / "detection.json").write_text(json.dumps({"per_trial": [{"trial": 0}]}))
    assert main(["detection", "--work-dir", str(tmp_path)]) == 2
    assert "already holds 1 trial(s); pass --resume" in capsys.readouterr().err
    assert main(["detection", "--work-dir", str(tmp_path), "--resume", "--steps", "30"]) == 2
    assert "steps: None there, 30 now" in capsys.readouterr().err
