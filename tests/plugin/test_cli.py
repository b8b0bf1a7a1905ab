"""perfsuite compare / baseline record / report / profile on stored runs."""

import json
import math
import random

import pytest

from perfsuite import cells
from perfsuite.cli.main import main
from perfsuite.schemas.results import SCHEMA

ENV = {"cpu_model": "Test CPU", "cpu_cores": 2, "gpu_count": 0, "torch": "2.14.0"}
CELL = cells.get("smoke/image/ddp/c2/fp32/px32/nopin/nchw")

pytest_plugins = ["pytester"]


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
    assert main(["baseline", "record", str(run), "--baselines", str(root)]) == 0
    (folder,) = [p for p in root.iterdir() if p.is_dir()]
    assert folder.name == "cpu-test-2c" and (folder / "metrics.csv").exists()
    assert main(["baseline", "record", str(run), "--baselines", str(root),
                 "--hardware-profile", "h100-sxm-94gb-x4-nvlink"]) == 2
    assert "force" in capsys.readouterr().err.lower()


def test_report_writes_html_and_csv(tmp_path, capsys):
    run = write_run(tmp_path / "run", 1.0)
    assert main(["report", str(run)]) == 0
    assert CELL.id in (run / "report.html").read_text()
    assert (run / "results.csv").exists() and (run / "checks.csv").exists()


def test_missing_or_malformed_runs_are_named_and_exit_2(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nowhere")]) == 2
    assert "nowhere" in capsys.readouterr().err
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "results.json").write_text("[1,")
    assert main(["compare", str(tmp_path / "bad"), str(tmp_path / "bad")]) == 2
    assert "not valid JSON" in capsys.readouterr().err


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
    run = write_run(tmp_path / "run", 1.0)
    root = tmp_path / "baselines"
    assert main(["baseline", "record", str(run), "--baselines", str(root),
                 "--launch-statistic", "floor"]) == 0
    profile = json.loads((root / "cpu-test-2c" / "profile.json").read_text())
    assert profile["launch_statistic"] == "floor"


def test_detection_will_not_mix_new_trials_into_an_earlier_run(tmp_path, capsys):
    (tmp_path / "detection.json").write_text(json.dumps({"per_trial": [{"trial": 0}]}))
    assert main(["selftest", "verdict-detection", "--out", str(tmp_path)]) == 2
    assert "already holds 1 trial(s); pass --resume" in capsys.readouterr().err
    assert main(["selftest", "verdict-detection", "--out", str(tmp_path), "--resume", "--steps", "30"]) == 2
    assert "steps: None there, 30 now" in capsys.readouterr().err


def _perfsuite(*args):
    import os
    import sys
    from pathlib import Path

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # a write per line: the reader goes early
    return [sys.executable, "-m", "perfsuite.cli.main", *args], env, Path(__file__).parents[2]


def test_list_into_head_ends_without_a_traceback():
    """`perfsuite list | head -1`: the reader leaves after one line; the writer
    ends as other tools do (of SIGPIPE, quietly), not in a BrokenPipeError."""
    import shutil
    import signal
    import subprocess
    import sys

    import pytest

    if not hasattr(signal, "SIGPIPE"):
        pytest.skip("no SIGPIPE on this platform")
    argv, env, root = _perfsuite("list")
    head = ["head", "-1"] if shutil.which("head") else [
        sys.executable, "-c", "import sys; sys.stdout.write(sys.stdin.readline())"]
    for _ in range(3):  # the race between the two is the point: run it a few times
        writer = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=root)
        reader = subprocess.Popen(head, stdin=writer.stdout, stdout=subprocess.PIPE)
        writer.stdout.close()  # the reader holds the only read end now
        first, _ = reader.communicate(timeout=60)
        err = writer.stderr.read().decode(errors="replace")
        writer.stderr.close()
        code = writer.wait(timeout=60)
        assert first.decode().strip() == cells.select()[0].id
        assert "Traceback" not in err and "BrokenPipeError" not in err, err
        assert code in (0, -signal.SIGPIPE), (code, err)


def test_list_into_a_pipe_already_closed_dies_of_sigpipe_quietly():
    import os
    import signal
    import subprocess

    import pytest

    if not hasattr(signal, "SIGPIPE"):
        pytest.skip("no SIGPIPE on this platform")
    argv, env, root = _perfsuite("list")
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line
    try:
        done = subprocess.run(argv, stdout=write_end, stderr=subprocess.PIPE, env=env, cwd=root,
                              timeout=60)
    finally:
        os.close(write_end)
    err = done.stderr.decode(errors="replace")
    assert done.returncode == -signal.SIGPIPE and "Traceback" not in err, (done.returncode, err)


def test_sigpipe_default_only_for_the_console_entry_and_commands_that_launch_nothing():
    """In-process callers (these tests) keep Python's SIGPIPE handling; so do
    `run`, `ab` and `selftest verdict-detection` (also by its old name), whose
    ranks run in sessions of their own and are ended on the way out of a
    BrokenPipeError (SIGPIPE would kill the parent alone and leave them running)."""
    import signal
    import subprocess
    import sys

    import pytest

    if not hasattr(signal, "SIGPIPE"):
        pytest.skip("no SIGPIPE on this platform")
    before = signal.getsignal(signal.SIGPIPE)
    assert main(["list", "--tier", "smoke"]) == 0
    assert signal.getsignal(signal.SIGPIPE) == before

    probe = ("import signal, sys\n"
             "from perfsuite.cli import ab as cli_ab, main as cli, results as cli_results, run as cli_run, selftest as cli_selftest\n"
             "def seen(args):\n"
             "    print('-'.join(sys.argv[1:]), signal.getsignal(signal.SIGPIPE) == signal.SIG_DFL)\n"
             "    return 0\n"
             "for module, name in ((cli, '_cmd_list'), (cli_results, 'cmd_compare'), (cli_run, 'cmd_run'),\n"
             "                     (cli_ab, 'cmd_ab'), (cli_selftest, 'cmd_verdict_detection'),\n"
             "                     (cli_selftest, 'cmd_history_detection')):\n"
             "    setattr(module, name, seen)\n"
             "sys.exit(cli.main())\n")
    _, env, root = _perfsuite()
    said = {}
    for command in (["list"], ["compare", "a", "b"], ["run", "x"], ["selftest", "verdict-detection"],
                    ["detection"], ["selftest", "history-detection"]):
        done = subprocess.run([sys.executable, "-c", probe, *command], capture_output=True, text=True,
                              env=env, cwd=root, timeout=60)
        assert done.returncode == 0, done.stderr
        name, default = done.stdout.split()
        said[name] = default == "True"
    assert said == {"list": True, "compare-a-b": True, "run-x": False, "selftest-verdict-detection": False,
                    "detection": False, "selftest-history-detection": True}


def test_version_from_the_installed_metadata(capsys):
    from importlib.metadata import version

    import pytest

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"perfsuite {version('perfsuite')}"


def test_python_dash_m_perfsuite_is_the_command():
    import subprocess

    argv, env, root = _perfsuite()
    argv = [argv[0], "-m", "perfsuite"]
    done = subprocess.run([*argv, "list", "--tier", "smoke", "--json"], capture_output=True, text=True,
                          env=env, cwd=root, timeout=60)
    assert done.returncode == 0, done.stderr
    assert [c["id"] for c in json.loads(done.stdout)] == [c.id for c in cells.select(tier="smoke")]
    done = subprocess.run([*argv, "--version"], capture_output=True, text=True, env=env, cwd=root,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("perfsuite "), done.stderr


def test_list_json_gives_ids_and_params(capsys):
    assert main(["list", "--tier", "gate", "--workload", "image", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    chosen = cells.select(tier="gate", workload="image")
    assert [c["id"] for c in listed] == [c.id for c in chosen]
    assert listed[0]["params"] == json.loads(json.dumps(chosen[0].params()))
    assert {c["params"]["device"] for c in listed} == {"cuda"}


def test_compare_json_prints_the_verdicts_and_keeps_the_exit_codes(tmp_path, capsys):
    from perfsuite.judge.comparing import compare_runs
    from perfsuite.schemas.results import load

    a = write_run(tmp_path / "a", 1.0, launches=4)
    c = write_run(tmp_path / "c", 1.25, seed=2, launches=4)
    assert main(["compare", str(a), str(c), "--json"]) == 1
    verdicts = json.loads(capsys.readouterr().out)
    assert verdicts == json.loads(json.dumps(compare_runs(load(a), load(c))))
    assert any(v["cell"] == CELL.id and v["verdict"] == "regressed" for v in verdicts)
    other = write_run(tmp_path / "other", 1.0)
    data = json.loads((other / "results.json").read_text())
    data["cells"][0]["id"] = "smoke/image/dp/c1/fp32/px32/nopin/nchw"
    (other / "results.json").write_text(json.dumps(data))
    assert main(["compare", str(a), str(other), "--json"]) == 3  # nothing shared: undecided
    captured = capsys.readouterr()
    assert all(v["verdict"] == "skipped" for v in json.loads(captured.out))
    assert "share no cell" in captured.err


def test_run_json_sends_progress_to_stderr_and_a_summary_to_stdout(tmp_path, capsys, monkeypatch):
    """perfsuite run --json, with the runner stood in for (no launch): stdout is
    one JSON document, everything said on the way is on stderr."""
    import perfsuite.report.html
    import perfsuite.runner

    failed = {"name": "step_time", "verdict": "regressed", "metric": "step_time", "message": "slower"}
    skipped = {"name": "accuracy", "verdict": "skipped", "metric": "accuracy", "message": "no baseline"}

    class FakeRunner:
        def __init__(self, out_dir, launch, **kwargs):
            self.out_dir, self.launch, self.on_notice = tmp_path / "out", launch, kwargs["on_notice"]
            self.file = type("File", (), {"path": self.out_dir / "results.json"})()
            self.results, self.probe = [], None

        def begin(self):
            self.on_notice("a notice from the session")

        def result(self, cell):
            self.launch.on_progress(cell, "step 3/14")
            checks = [failed, skipped] if cell.world_size == 2 else [skipped]
            result = {"id": cell.id, "status": "ok", "reason": None, "metrics": {}, "checks": checks}
            self.results.append(result)
            return result

        def end(self):
            pass

        def add_to_history(self, url, **stored_under):
            return None  # nothing stored, no line to print

    monkeypatch.setattr(perfsuite.runner, "Runner", FakeRunner)
    monkeypatch.setattr(perfsuite.runner, "handle_sigterm", lambda: None)
    monkeypatch.setattr(perfsuite.report.html, "write_reports",
                        lambda out: {"report_html": out / "report.html"})
    ids = ["smoke/image/dp/c1/fp32/px32/nopin/nchw", "smoke/image/ddp/c2/fp32/px32/nopin/nchw"]
    assert main(["run", *ids, "--no-probe", "--json"]) == 1
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["results"] == str(tmp_path / "out" / "results.json") and summary["exit"] == 1
    assert summary["report"] == str(tmp_path / "out" / "report.html")
    assert [(c["id"], c["status"]) for c in summary["cells"]] == [(i, "ok") for i in ids]
    assert summary["cells"][0]["failed_checks"] == [] and summary["cells"][1]["failed_checks"] == [failed]
    assert summary["cells"][1]["skipped_checks"] == ["accuracy"]
    for said in ("a notice from the session", "step 3/14", "[2/2]", "results: "):
        assert said in captured.err
    assert main(["run", ids[0], "--no-probe"]) == 0  # without --json: as before, all on stdout
    captured = capsys.readouterr()
    assert "[1/1]" in captured.out and "step 3/14" in captured.out and not captured.out.startswith("{")


def finished(run, started=1.0):
    """write_run's run as the history takes it: finished."""
    data = json.loads((run / "results.json").read_text())
    data["run"] = {"started": started, "finished": started + 60, "argv": []}
    (run / "results.json").write_text(json.dumps(data))
    return run


def test_old_names_still_work_and_say_once_which_name_replaces_them(tmp_path, capsys):
    run = write_run(tmp_path / "run", 1.0)
    root = tmp_path / "baselines"
    assert main(["baseline", "record", str(run), "--root", str(tmp_path / "first"), "--root", str(root),
                 "--profile", "cpu-test-2c"]) == 0
    assert (root / "cpu-test-2c" / "metrics.csv").exists() and not (tmp_path / "first").exists()
    err = capsys.readouterr().err
    assert err.count("perfsuite: --root is now --baselines") == 1
    assert err.count("perfsuite: --profile is now --hardware-profile") == 1
    store = tmp_path / "history.sqlite"
    assert main(["history", "add", str(finished(run)), "--url", str(store), "--commit", "abc",
                 "--purpose", "experiment"]) == 0
    captured = capsys.readouterr()
    assert "as an experiment" in captured.out and store.exists()
    assert "--url is now --history" in captured.err and "--purpose is now --history-purpose" in captured.err
    (tmp_path / "detection.json").write_text(json.dumps({"per_trial": [{"trial": 0}]}))
    assert main(["detection", "--work-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "perfsuite detection is now perfsuite selftest verdict-detection" in err
    assert "--work-dir is now --out" in err and "already holds 1 trial(s)" in err


def test_the_self_tests_live_under_selftest_and_print_json_alone(capsys, monkeypatch):
    import perfsuite.selftest.overhead

    monkeypatch.setattr(perfsuite.selftest.overhead, "measure_overhead",
                        lambda **kw: {"ratio": 1.004, "overhead_percent": 0.4, **kw})
    assert main(["selftest", "overhead", "--blocks", "2", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"ratio": 1.004, "overhead_percent": 0.4, "device": "cpu",
                                        "image_size": 32, "batch_size": 16, "steps": 20, "blocks": 2}
    assert main(["overhead", "--blocks", "2"]) == 0  # the old name: the figures, then in words
    captured = capsys.readouterr()
    assert captured.out.rstrip().endswith("(+0.40 %; goal <= +1 %)") and captured.out.startswith("{")
    assert "perfsuite overhead is now perfsuite selftest overhead" in captured.err


def test_json_on_the_commands_that_print_results(tmp_path, capsys):
    run = finished(write_run(tmp_path / "run", 1.0))
    assert main(["report", str(run), "--summary-md", "-", "--json"]) == 0
    written = json.loads(capsys.readouterr().out)
    assert written["report_html"] == str(run / "report.html") and CELL.id in written["summary_markdown"]

    root = tmp_path / "baselines"
    assert main(["baseline", "record", str(run), "--baselines", str(root), "--dry-run", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["written"] is False and plan["folder"] == str(root / "cpu-test-2c")
    assert {c["id"] for c in plan["changes"]} >= {f"{CELL.id}:step_time"} and plan["unchanged"] == 0

    store = str(tmp_path / "history.sqlite")
    assert main(["history", "add", str(run), "--history", store, "--commit", "c0ffee", "--json"]) == 0
    added = json.loads(capsys.readouterr().out)
    assert added["commit"] == "c0ffee" and added["new"] and added["line"].startswith("history: stored run")
    assert main(["history", "show", CELL.id, "--history", store, "--json"]) == 0
    (series,) = json.loads(capsys.readouterr().out)["series"]
    assert series["cell"] == CELL.id and [p["commit"] for p in series["points"]] == ["c0ffee"]
    page = tmp_path / "trends.html"
    assert main(["history", "report", "--history", store, "--out", str(page), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["trends"] == str(page) and page.exists() and captured.err == ""


def test_run_stores_under_the_commit_and_branch_it_is_given_outside_git(tmp_path, capsys, monkeypatch):
    """Outside a git checkout the history asks for --commit: run has it (and --branch)."""
    from perfsuite import hardware
    from tests.unit.conftest import FakeLaunches

    installed = hardware.fingerprint()  # as from a wheel: the env names no commit of perfsuite's
    monkeypatch.setattr(hardware, "fingerprint", lambda: {**installed, "commit": None})
    monkeypatch.setattr("perfsuite.launch.launch.run_cell", FakeLaunches())
    monkeypatch.setattr("perfsuite.runner.handle_sigterm", lambda: None)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "none").mkdir()
    store = str(tmp_path / "history.sqlite")
    argv = ["run", "smoke/image/ddp-ds/c1/fp32/px32/nopin/nchw", "--no-probe", "--baselines", "none",
            "--history", store]
    assert main([*argv, "--out", "one"]) == 0
    said = capsys.readouterr().out
    assert "history: not stored: " in said and "no commit" in said and "pass --commit SHA" in said
    assert main([*argv, "--out", "two", "--commit", "c0ffee", "--branch", "nightly", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["history"].startswith("history: stored run ") and "of commit c0ffee (nightly)" in summary["history"]


def test_history_detection_prints_its_figures_as_json(tmp_path, capsys, monkeypatch):
    from perfsuite.history import detection as history_detection

    monkeypatch.setattr(history_detection, "_this_profile", lambda: None)
    folder = tmp_path / "baselines" / "cpu-x-2c"
    folder.mkdir(parents=True)
    (folder / "profile.json").write_text(json.dumps({"launch_spread": {"median": {"log_sd": 0.01, "dof": 5}}}))
    assert main(["selftest", "history-detection", "--runs-dir", str(tmp_path / "nothing"), "--baselines",
                 str(tmp_path / "baselines"), "--series", "2", "--launches", "1,2", "--json"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["statistic"] == "median" and "launch_spread of launch medians" in said["noise"]
    assert [f["launches"] for f in said["figures"]] == [1, 2] and all(f["series"] == 2 for f in said["figures"])


def test_a_run_that_selects_no_cell_is_a_usage_error(capsys):
    from perfsuite.cli.main import main

    assert main(["run", "--tier", "smoke", "--workload", "probe", "--history", "off"]) == 2
    err = capsys.readouterr().err
    assert "tier smoke, workload probe selects no cell" in err and "Traceback" not in err


def test_paths_and_ids_an_output_encoding_cannot_say_are_escaped_not_a_traceback(tmp_path):
    """PYTHONIOENCODING=ascii (a CI log, LANG=C elsewhere): a unicode id or
    path is printed escaped, the command does what it did and exits 0."""
    import os
    import subprocess
    import sys

    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "mine.toml").write_text(
        '[[experiment]]\nname = "unicode"\ntier = "smoke"\nworkload = "mod\u00e8le.train:run"\n'
        'axes = {world_size = [1]}\n', encoding="utf-8")
    run = write_run(tmp_path / "r\u00e9sum\u00e9", 1.0)
    env = {**os.environ, "PYTHONIOENCODING": "ascii", "PERFSUITE_EXPERIMENTS": str(tmp_path / "exp")}
    for args, said in ((["list", "--tier", "smoke"], "smoke/mod\\xe8le.train:run/c1"),
                       (["report", str(run)], "r\\xe9sum\\xe9")):
        done = subprocess.run([sys.executable, "-m", "perfsuite.cli.main", *args], env=env,
                              capture_output=True, timeout=120)
        out, err = done.stdout.decode("ascii"), done.stderr.decode("ascii")
        assert done.returncode == 0 and "Traceback" not in err, (args, err[-2000:])
        assert said in out, (args, out[-2000:])
    assert (run / "report.html").is_file()


def _git_repo(path):
    import subprocess

    def git(*argv):
        return subprocess.run(["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t", *argv],
                              check=True, capture_output=True, text=True).stdout.strip()

    (path / "abprobe").mkdir(parents=True)
    (path / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=68"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "abprobe"\nversion = "0.1"\n')
    git("init", "-q")
    for version in ("one", "two"):
        (path / "abprobe" / "__init__.py").write_text(f"VERSION = {version!r}\n")
        git("add", "-A")
        git("commit", "-qm", version)
    return git


@pytest.mark.slow
def test_ab_with_a_missing_ref_names_it_and_a_retry_into_the_same_out_works(tmp_path, capsys, monkeypatch):
    import shutil
    from types import SimpleNamespace

    from perfsuite.ab import session as ab
    from perfsuite.ab import sides

    git = _git_repo(tmp_path / "repo")
    out = tmp_path / "out"
    argv = ["ab", CELL.id, "--repo", str(tmp_path / "repo"), "--out", str(out), "--a-ref", "HEAD~1"]
    with __import__("pytest").raises(ab.ABError, match="--b-ref missing: finding the commit"):
        sides.check_refs(tmp_path / "repo", {"--a-ref": "HEAD~1", "--b-ref": "missing"})
    assert main([*argv, "--b-ref", "missing"]) == 2
    assert "--b-ref missing: finding the commit" in capsys.readouterr().err
    assert len(git("worktree", "list").splitlines()) == 1  # both refs looked up before any worktree
    assert main([*argv, "--b-ref", "missing"]) == 2  # retried as it was
    err = capsys.readouterr().err
    assert "--b-ref missing: finding the commit" in err and "already holds" not in err
    # with B's ref right, both sides are set up (the launches are not this test's)
    sessions = []
    monkeypatch.setattr(ab, "check_interpreter", lambda side: setattr(side, "torch", "2") or setattr(
        side, "perfsuite", str(side.python)))
    monkeypatch.setattr(ab, "ABSession", lambda cells, a, b, *rest, **kw: sessions.append((a, b)) or
                        SimpleNamespace(run=lambda: 0, data={}))
    assert main([*argv, "--b-ref", "HEAD"]) == 0, capsys.readouterr().err
    assert [s.commit for s in sessions[-1]] == [git("rev-parse", "HEAD~1"), git("rev-parse", "HEAD")]
    # a side whose folder went (its worktree still registered) and one whose set-up did not finish
    shutil.rmtree(out / "sides" / "b")
    (out / "sides" / "a" / sides.SIDE_DONE).unlink()
    assert main([*argv, "--b-ref", "HEAD"]) == 0, capsys.readouterr().err
    assert len(git("worktree", "list").splitlines()) == 3  # the repository and the two sides, once each


@pytest.mark.parametrize("given", ["inf", "nan", "0", "-5", "soon"])
def test_a_timeout_that_is_no_number_of_seconds_above_0_is_refused_before_a_launch(tmp_path, capsys, given):
    cell = "smoke/image/ddp-ds/c1/fp32/px32/nopin/nchw"
    with pytest.raises(SystemExit) as done:
        main(["run", "--cell", cell, "--timeout", given, "--out", str(tmp_path / "out")])
    assert done.value.code == 2
    assert f"--timeout: '{given}'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_plugins_timeout_takes_the_same_seconds(pytester):
    pytester.makepyfile("def test_nothing():\n    pass\n")
    run = pytester.runpytest("--perf-timeout", "inf")
    assert run.ret == pytest.ExitCode.USAGE_ERROR
    assert "--perf-timeout: 'inf': give a positive number of seconds" in run.stderr.str()


@pytest.mark.parametrize("given", [math.inf, math.nan, 0.0, -1.0])
def test_the_launch_options_of_an_api_caller_refuse_the_same_timeouts(given):
    from perfsuite.runner import launch_options

    with pytest.raises(ValueError, match="give a positive number of seconds"):
        launch_options(timeout=given)
