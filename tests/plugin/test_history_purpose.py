"""How a run is kept in the history, said on the run's last line; and the
suite's own tests, which never touch the user's data (tests/conftest.py).

Launches are stood in for (nothing is started): what is tested is where the
run goes and with which purpose, not how it is measured."""

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from perfsuite.cli import main as cli
from tests.plugin.test_plugin import CELL_TEST

pytest_plugins = ["pytester"]

CELL = "smoke/image/ddp-ds/c1/fp32/px32/nopin/nchw"
SUITE_CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"


@pytest.fixture
def launched(monkeypatch):
    """Every launch ends ok at once, with plausible step times."""
    def run_cell(cell, out_dir, opts=None):
        from perfsuite.hardware import fingerprint

        samples = [0.1, 0.11, 0.1, 0.12, 0.1]
        return {"id": cell.id, "params": cell.params(), "status": "ok", "reason": None,
                "env": fingerprint(), "duration_s": 1.0, "checks": [],
                "ranks": [{"rank": r, "status": "ok", "steps": 5, "device": "cpu", "host": "h", "error": None}
                          for r in range(cell.world_size)],
                "metrics": {"step_time": {"value": 0.1, "unit": "s", "samples": samples},
                            "throughput": {"value": 160.0, "unit": "images/s"}}}

    monkeypatch.setattr("perfsuite.launch.launch.run_cell", run_cell)


def last_line(outlines):
    """The last line before pytest's closing ``=== 1 passed in ... ===``."""
    return [line for line in outlines if line.strip() and not line.startswith("=")][-1]


def test_a_pytest_run_says_last_how_it_was_stored(pytester, launched, monkeypatch, capsys):
    monkeypatch.delenv("PERFSUITE_HISTORY", raising=False)  # the built-in default store, as a user has it
    pytester.makepyfile(CELL_TEST)
    (pytester.path / "none").mkdir()
    args = ["--perf-cell", CELL, "--perf-no-probe", "--perf-baselines", str(pytester.path / "none")]
    store = pytester.path / ".perfsuite" / "history.sqlite"

    tried = pytester.runpytest(*args, "--perf-out", ".perfsuite/tried", "--perf-option", "fault=slow:0:3:1.0")
    tried.assert_outcomes(passed=1)
    assert last_line(tried.outlines).endswith(
        f"in sqlite:///{store} as an experiment (fault=slow:0:3:1.0): `perfsuite history changes` leaves it "
        "out; --include experiment shows it")
    look = pytester.runpytest(*args, "--perf-out", "look")
    assert "as ad-hoc (its output folder look is outside .perfsuite/" in last_line(look.outlines)
    meant = pytester.runpytest(*args, "--perf-out", ".perfsuite/nightly")
    assert last_line(meant.outlines).startswith("history: stored run ")
    assert last_line(meant.outlines).endswith(f"in sqlite:///{store}")
    declared = pytester.runpytest(*args, "--perf-out", "elsewhere", "--perf-history-purpose", "run")
    assert last_line(declared.outlines).endswith(f"in sqlite:///{store}")

    capsys.readouterr()
    assert cli.main(["history", "changes"]) == 0  # the store under pytester's folder, where it runs
    assert "left out: 1 ad-hoc run(s), 1 experiment run(s)" in capsys.readouterr().out


def test_perfsuite_run_says_last_how_it_was_stored(tmp_path, launched, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PERFSUITE_HISTORY", raising=False)
    (tmp_path / "none").mkdir()
    args = ["run", CELL, "--no-probe", "--baselines", str(tmp_path / "none")]
    assert cli.main([*args, "--out", "one", "--option", "fault=slow:0:3:1.0"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.endswith(" as an experiment (fault=slow:0:3:1.0): `perfsuite history changes` leaves it out; "
                         "--include experiment shows it")
    assert cli.main([*args, "--out", "two"]) == 0
    assert " as ad-hoc (its output folder two is outside .perfsuite/" in capsys.readouterr().out
    assert cli.main([*args, "--out", "three", "--history-purpose", "run"]) == 0
    assert " as " not in capsys.readouterr().out.strip().splitlines()[-1]
    assert cli.main([*args, "--out", "four", "--history", str(tmp_path / "team.sqlite")]) == 0
    assert capsys.readouterr().out.strip().endswith(f"in sqlite:///{tmp_path / 'team.sqlite'}")


# ----------------------------------------------------------------------------- the suite's own tests

def suite(pytester, **tests):
    """A project laid out as this one, with the suite's tests/conftest.py."""
    pytester.makeini("[pytest]\n")  # its root: pytester's folder
    (pytester.path / "tests").mkdir()
    shutil.copy(SUITE_CONFTEST, pytester.path / "tests" / "conftest.py")
    for name, text in tests.items():
        path = pytester.path / "tests" / f"{name}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


ISOLATED = """
import json, os, subprocess, sys
from pathlib import Path

from perfsuite.history.store import record_run_in_history


def test_stores_and_cache_are_this_sessions(tmp_path_factory):
    home = Path(os.environ["PERFSUITE_HISTORY"]).parent
    assert home.is_relative_to(tmp_path_factory.getbasetemp())
    assert Path(os.environ["PERFSUITE_CACHE_DIR"]).is_relative_to(home)
    assert os.listdir(os.environ["PERFSUITE_NSYS_SEARCH_ROOT"]) == []  # no nsys installs to find
    assert "PERFSUITE_BASELINES" not in os.environ and "PERFSUITE_NSYS_BIN" not in os.environ
    said = subprocess.run([sys.executable, "-c", "import os; print(os.environ['PERFSUITE_HISTORY'])"],
                          capture_output=True, text=True).stdout.strip()
    assert said == os.environ["PERFSUITE_HISTORY"]  # a process a test starts has them too


def test_makes_a_run_folder_in_the_checkout():
    Path(".perfsuite", "run-1").mkdir(parents=True)


def test_stores_a_run_in_the_checkouts_history(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps({
        "schema": "perfsuite.results/1", "run": {"started": 1.0, "finished": 2.0, "argv": []},
        "env": {"commit": "abc"}, "cells": []}))
    record_run_in_history(tmp_path, ".perfsuite/history.sqlite", commit="abc")


def test_keeps_to_its_tmp_path(tmp_path):
    (tmp_path / "x").write_text("x")
"""

PERF_TIER = """
from pathlib import Path


def test_the_cpu_tier_writes_where_it_is_told():
    Path(".perfsuite", "smoke").mkdir(parents=True, exist_ok=True)
"""


def test_a_test_that_writes_into_the_checkouts_perfsuite_folder_fails_naming_it(pytester):
    suite(pytester, **{"unit/test_isolation": ISOLATED, "perf/test_tier": PERF_TIER})
    result = pytester.runpytest("tests")
    result.assert_outcomes(passed=5, errors=2)  # each leak an error at its test's teardown
    folder = pytester.path / ".perfsuite"
    result.stdout.fnmatch_lines([
        f"*test_makes_a_run_folder_in_the_checkout wrote into the user's data: made {folder / 'run-1'}/.*"])
    result.stdout.fnmatch_lines([f"*test_stores_a_run_in_the_checkouts_history wrote into the user's data: "
                                 f"made {folder / 'history.sqlite'}; stored run 1 (*) in "
                                 f"{folder / 'history.sqlite'}.*"])
    assert "test_the_cpu_tier_writes_where_it_is_told wrote" not in result.stdout.str()
    assert (folder / "smoke").is_dir()  # tests/perf writes there, as README's first command does


MEANWHILE = """
import subprocess, sys, time
from pathlib import Path

# A process that is not this one's child (its parent exits at once) starts a
# run in the checkout while a test runs: it is not the test's doing.
HOLD = (
    "import sys, time\\n"
    "from perfsuite.system.locking import FolderLock\\n"
    "FolderLock(sys.argv[1], 'perfsuite session').acquire()\\n"
    "open(sys.argv[2], 'w').close()\\n"
    "time.sleep(120)\\n")


def test_while_someone_measures_in_the_checkout(tmp_path):
    ready = Path({ready!r})
    subprocess.run([sys.executable, "-c",
                    "import subprocess, sys; subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2], "
                    "sys.argv[3]], start_new_session=True)", HOLD, str(Path(".perfsuite", "smoke").resolve()),
                    str(ready)], check=True)
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.exists()
"""


def test_a_measurement_running_meanwhile_in_the_checkout_is_not_a_tests_doing(pytester, tmp_path):
    ready = tmp_path / "ready"
    suite(pytester, **{"unit/test_meanwhile": MEANWHILE.replace("{ready!r}", repr(str(ready)))})
    try:
        result = pytester.runpytest("tests")
        result.assert_outcomes(passed=1)
    finally:
        holder = pytester.path / ".perfsuite" / "smoke" / ".perfsuite.lock.json"
        if holder.exists():
            os.kill(json.loads(holder.read_text())["pid"], signal.SIGKILL)


def test_the_suites_full_run_keeps_its_cpu_tier_as_ad_hoc(pytester, launched, tmp_path):
    (tmp_path / "none").mkdir()
    args = ["--perf-cell", CELL, "--perf-no-probe", "--perf-baselines", str(tmp_path / "none"),
            "--perf-history", str(tmp_path / "history.sqlite")]
    # names no module of this suite has: pytester runs in this process, where tests/unit/test_cells.py is imported
    suite(pytester, **{"perf/test_purpose_cell": CELL_TEST, "unit/test_purpose_plain": "def test_plain():\n    pass\n"})
    alone = pytester.runpytest("tests/perf", *args)  # README's first command: the run meant
    alone.assert_outcomes(passed=1)
    assert last_line(alone.outlines).endswith(f"in sqlite:///{tmp_path / 'history.sqlite'}")
    full = pytester.runpytest("tests", *args)  # README's second: the suite's own tests
    full.assert_outcomes(passed=2)
    assert last_line(full.outlines).endswith(
        " as ad-hoc (measured within the suite's own tests, on the working tree as it stands): "
        "`perfsuite history changes` leaves it out; --include ad-hoc shows it")
    runs = sorted((pytester.path / ".perfsuite").glob("run-*/results.json"))
    assert len(runs) == 2  # both kept, each with its report
    asked = pytester.runpytest("tests", *args, "--perf-history-purpose", "run")
    assert " as " not in last_line(asked.outlines)
