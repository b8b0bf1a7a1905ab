"""Hostile inputs and situations through the pytest plugin and the command line:
each gets a clear answer, and nothing measured is lost.

The gate cells need GPUs, so on this machine (told to skip GPU cells where
torch sees none: --perf-allow-no-gpu, --allow-no-gpu) they are skipped without
a launch: sessions about the session itself cost no measurement."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from perfsuite.cli.main import main as cli_main
from perfsuite.schemas.results import SCHEMA
from tests.plugin.test_plugin import CELL_TEST
from tests.unit.cellkit import survivors

pytest_plugins = ["pytester"]

GPU_CELL = "gate/image/ddp/g2/fp32/px500/nopin/nchw"
NO_GPU = "--perf-allow-no-gpu"  # skip GPU cells where torch sees no GPU, as here


def test_a_non_empty_out_is_refused_before_anything_runs(pytester):
    pytester.makepyfile(CELL_TEST)
    out = pytester.path / "out"
    out.mkdir()
    (out / "results.json").write_text("{}")
    result = pytester.runpytest("--perf-cell", GPU_CELL, "--perf-out", str(out), NO_GPU)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*out is not empty (results.json)*--resume*--overwrite*"])
    assert (out / "results.json").read_text() == "{}"
    result = pytester.runpytest("--perf-cell", GPU_CELL, "--perf-out", str(out), "--perf-overwrite",
                                NO_GPU)
    result.assert_outcomes(skipped=1)
    assert json.loads((out / "results.json").read_text())["cells"][0]["id"] == GPU_CELL


def test_collect_only_touches_no_output_directory(pytester):
    pytester.makepyfile(CELL_TEST)
    out = pytester.path / "out"
    pytester.runpytest("--perf-cell", GPU_CELL, "--perf-out", str(out), "--collect-only")
    assert not out.exists()


def test_a_malformed_baseline_is_refused_before_the_first_launch(pytester):
    pytester.makepyfile(CELL_TEST)
    folder = pytester.path / "baselines" / "cpu-x"
    folder.mkdir(parents=True)
    (folder / "profile.json").write_text("{not json")
    result = pytester.runpytest("--perf-cell", GPU_CELL, "--perf-out", str(pytester.path / "out"),
                                "--perf-baselines", str(pytester.path / "baselines"), NO_GPU)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*cpu-x/profile.json: not valid JSON*"])
    assert not (pytester.path / "out" / "results.json").exists()


@pytest.mark.parametrize("value", ["0", "-5"])
def test_a_timeout_that_is_not_positive_is_a_usage_error(pytester, value):
    pytester.makepyfile(CELL_TEST)
    result = pytester.runpytest("--perf-cell", GPU_CELL, f"--perf-timeout={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*timeout*give a positive number of seconds*"])


def test_gpus_that_are_not_here_skip_with_the_reason(pytester):
    pytester.makepyfile(CELL_TEST)
    result = pytester.runpytest("--perf-cell", GPU_CELL, "--perf-gpus", "0,1", "-rs", NO_GPU,
                                "--perf-out", str(pytester.path / "out"))
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*GPU(s) 0,1 given with --gpus are not present (0 GPU(s) here)*"])


def test_fail_on_skipped_turns_a_run_that_judged_nothing_red(pytester):
    pytester.makepyfile(CELL_TEST)
    args = ["--perf-cell", GPU_CELL, "-rs", NO_GPU]
    green = pytester.runpytest(*args, "--perf-out", str(pytester.path / "a"))
    green.assert_outcomes(skipped=1)
    green.stdout.fnmatch_lines(["*1 cell(s) not run: they need 2 GPUs, 0 present*"])
    red = pytester.runpytest(*args, "--perf-out", str(pytester.path / "b"), "--perf-fail-on-skipped")
    red.assert_outcomes(skipped=1)  # a cell this machine cannot run is no failure of its own...
    assert red.ret == pytest.ExitCode.TESTS_FAILED  # ...but a run where none could run judged nothing
    red.stdout.fnmatch_lines(["*no cell could run here (--perf-fail-on-skipped): all 1 need more GPUs "
                              "than the 0 present*"])


def test_under_xdist_cells_refuse_to_measure(pytester):
    pytest.importorskip("xdist")
    pytester.makepyfile(CELL_TEST)
    out = pytester.path / "out"
    result = pytester.runpytest_subprocess("--perf-cell", GPU_CELL, "-n", "2", "--perf-out", str(out))
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*do not run under pytest-xdist*-n 0*"])
    assert not (out / "results.json").exists()


def test_the_report_is_written_whatever_another_plugin_raises(pytester):
    pytester.makeconftest("""
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_terminal_summary(terminalreporter):
    raise RuntimeError("another plugin's summary failed")
""")
    pytester.makepyfile(CELL_TEST)
    out = pytester.path / "out"
    pytester.runpytest("--perf-cell", GPU_CELL, "--perf-out", str(out), NO_GPU)
    assert (out / "results.json").exists() and (out / "report.html").exists()


# ----------------------------------------------------------- command line

def write_run(path: Path, cell_id: str) -> Path:
    path.mkdir(parents=True)
    (path / "results.json").write_text(json.dumps({"schema": SCHEMA, "run": {}, "env": {}, "cells": [
        {"id": cell_id, "params": {}, "status": "skipped", "reason": "test", "env": {},
         "metrics": {}, "checks": [], "ranks": []}]}))
    return path


def test_compare_exits_2_for_an_unreadable_run_and_3_when_nothing_is_shared(tmp_path, capsys):
    a = write_run(tmp_path / "a", "smoke/x")
    assert cli_main(["compare", str(a), str(tmp_path / "missing")]) == 2
    assert "missing" in capsys.readouterr().err
    b = write_run(tmp_path / "b", "smoke/y")
    assert cli_main(["compare", str(a), str(b)]) == 3
    assert "share no cell" in capsys.readouterr().err


def test_run_into_a_file_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "out").write_text("")
    assert cli_main(["run", GPU_CELL, "--out", str(tmp_path / "out"), "--no-probe",
                     "--allow-no-gpu"]) == 2
    assert "is a file" in capsys.readouterr().err


def test_run_with_fail_on_skipped_exits_1_and_counts_what_was_skipped(tmp_path, capsys):
    assert cli_main(["run", GPU_CELL, "--out", str(tmp_path / "a"), "--no-probe",
                     "--allow-no-gpu"]) == 0
    assert cli_main(["run", GPU_CELL, "--out", str(tmp_path / "b"), "--no-probe",
                     "--allow-no-gpu", "--fail-on-skipped"]) == 1
    out = capsys.readouterr().out
    assert "1 cell(s) not run: they need 2 GPUs, 0 present" in out
    assert "no cell could run here: all 1 need more GPUs than the 0 present" in out


# ----------------------------------------------------------- signals

SLOW_THEN_HUNG = ["smoke/image/ddp-ds/c1/fp32/px32/nopin/nchw",
                  "smoke/image/ddp-ds/c2/fp32/px32/nopin/nchw"]




@pytest.mark.slow
def test_sigterm_to_pytest_keeps_finished_cells_writes_the_report_and_ends_the_ranks(tmp_path):
    # rank 1 hangs at step 3: the c1 cell (no rank 1) finishes, the c2 cell hangs
    (tmp_path / "test_cells.py").write_text(CELL_TEST)
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", str(tmp_path / "test_cells.py"),
            "--rootdir", str(tmp_path), "--perf-out", str(out), "--perf-no-probe",
            "--perf-option", "fault=hang:1:3", "--perf-timeout", "300",
            *[f"--perf-cell={c}" for c in SLOW_THEN_HUNG]]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=tmp_path, start_new_session=True)
    try:
        hung = out / "cells" / SLOW_THEN_HUNG[1]
        deadline = time.monotonic() + 240
        while not list(hung.glob("progress-rank1*")) and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(3)  # rank 1 reaches its injected hang
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, output
    assert "perfsuite" in output and "results:" in output and "report:" in output, output
    saved = json.loads((out / "results.json").read_text())["cells"]
    assert [c["id"] for c in saved] == SLOW_THEN_HUNG[:1] and saved[0]["status"] == "ok"
    assert (out / "report.html").exists()
    time.sleep(2)
    assert survivors(str(out)) == []


def test_an_interrupted_run_says_how_and_keeps_its_cells(tmp_path, capsys, monkeypatch):
    def interrupted(self, cell):
        raise KeyboardInterrupt()

    monkeypatch.setattr("perfsuite.runner.Runner.result", interrupted)
    assert cli_main(["run", GPU_CELL, "--out", str(tmp_path / "out"), "--no-probe",
                     "--allow-no-gpu"]) == 130
    err = capsys.readouterr().err
    assert "interrupted (Ctrl-C): 0 cell(s) kept in" in err and "()" not in err


def test_run_piped_into_a_reader_that_leaves_ends_quietly(tmp_path):
    run = subprocess.Popen([sys.executable, "-m", "perfsuite.cli.main", "run", GPU_CELL, "--no-probe",
                            "--allow-no-gpu", "--out", str(tmp_path / "out")], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
    run.stdout.close()  # the reader is gone before the first line
    _, err = run.communicate(timeout=120)
    assert b"Traceback" not in err and run.returncode == 128 + signal.SIGPIPE


def test_a_pytest_run_without_cells_keeps_its_sigterm_and_output(pytester):
    # ... and pays nothing for the plugin: no measuring code imported
    pytester.makepyfile("""
import signal
import sys

def test_plain():
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    heavy = [m for m in ("perfsuite.runner", "perfsuite.launch.launch", "scipy", "pandas", "torch")
             if m in sys.modules]
    assert heavy == []
""")
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=1)
    assert not (pytester.path / ".perfsuite").exists()


def test_a_missing_data_directory_is_refused_before_the_first_launch(tmp_path, capsys):
    assert cli_main(["run", GPU_CELL, "--out", str(tmp_path / "out"), "--no-probe",
                     "--data-dir", str(tmp_path / "no-mnist")]) == 2
    assert "no-mnist: not a directory" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_report_that_cannot_be_written_is_a_sentence(tmp_path, capsys, monkeypatch):
    run = write_run(tmp_path / "run", "smoke/x")

    def refuse(path, text):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr("perfsuite.system.atomic.atomic_write_text", refuse)
    monkeypatch.setattr("perfsuite.report.tables.atomic_write_text", refuse)
    assert cli_main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert "Permission denied" in err and "Traceback" not in err


def test_a_disk_that_fills_mid_session_fails_the_cell_with_a_sentence_and_stops(pytester):
    # pytester runs in this process: the patch must end with its session.
    pytester.makeconftest("""
import pytest

import perfsuite.results


@pytest.fixture(scope="session", autouse=True)
def disk_full_after_the_first_cell():
    original, written = perfsuite.results.ResultsFile.write, []

    def write(self):  # the session's start and its first cell land; then the disk is full
        if len(written) == 2:
            raise OSError(28, "No space left on device")
        written.append(self.path)
        original(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(perfsuite.results.ResultsFile, "write", write)
        yield
""")
    pytester.makepyfile(CELL_TEST)
    out = pytester.path / "out"
    run = pytester.runpytest("--perf-tier", "gate", "--perf-out", str(out), NO_GPU, "-k", "g1 or g2",
                             "--perf-history", "off")
    run.assert_outcomes(skipped=1, errors=1)  # in perf_result's setup; then pytest stops there
    text = run.stdout.str()
    assert "its result could not be written (No space left on device)" in text
    assert "run again with --perf-resume" in text and "Traceback" not in text
    assert "Interrupted: perfsuite: cannot write under" in text
    saved = json.loads((out / "results.json").read_text())
    # The first is kept; the session is marked interrupted at its end, when (the
    # patch lifted with the session's fixtures) the disk has room again, and
    # that last write keeps the cell measured meanwhile too.
    assert [c["id"] for c in saved["cells"]][:1] == ["gate/image/dp/g1/fp32/px500/nopin/nchw"]
    assert saved["run"]["status"] == "interrupted"
    from perfsuite.results import ResultsFile

    assert ResultsFile.write.__module__ == "perfsuite.results"  # nothing left patched here
