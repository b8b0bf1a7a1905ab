"""Every PERFSUITE_* variable is checked before anything is launched: a value
it does not take stops the command (exit 2) naming the variable, its value
and what it takes; a variable set that perfsuite does not know is said, with
the name it most likely meant."""

from __future__ import annotations

import os
import stat

import pytest

from perfsuite.cli import main as cli
from perfsuite.system import envvars

GPU_CELL = "gate/image/ddp/g2/fp32/px500/nopin/nchw"  # skipped without a launch (--allow-no-gpu)

BAD = {  # variable: (a value it does not take, what the refusal names besides the two)
    "PERFSUITE_RANK_START": ("spawn", "fork, exec"),
    "PERFSUITE_FORK_AGENT": ("no", "0, 1"),
    "PERFSUITE_RDZV_PORT": ("99999", "1 to 65535"),
    "PERFSUITE_HISTORY": ("OFF", "off"),
    "PERFSUITE_NSYS_BIN": ("{t}/nowhere/nsys", "executable"),
    "PERFSUITE_NSYS_SEARCH_ROOT": ("{t}", "a folder"),  # {t}: a file here
    "PERFSUITE_EXPERIMENTS": ("{t}/nowhere.toml", "does not exist"),
    "PERFSUITE_TORCH_INDEX": ("cu999", "cu128"),
    "PERFSUITE_INSTALLER": ("conda", "uv, pip"),
    "PERFSUITE_ACCEPTANCE_BUDGET_S": ("-1", "above 0"),
    "PERFSUITE_PROFILER": ("perf", "nsys, torch, off"),
    "PERFSUITE_WINDOWS_SIDE": ("C", "A, B"),
    "PERFSUITE_LAUNCHER_PID": ("me", "whole number"),
}


def test_every_variable_says_what_it_takes():
    for variable in envvars.VARIABLES:
        assert variable.accepts.text, variable.name


def test_every_variable_takes_the_values_perfsuite_and_its_scripts_give_it(tmp_path):
    good = {"PERFSUITE_RANK_START": "exec", "PERFSUITE_FORK_AGENT": "0", "PERFSUITE_RDZV_PORT": "29500",
            "PERFSUITE_HISTORY": "off", "PERFSUITE_NSYS_SEARCH_ROOT": str(tmp_path),
            "PERFSUITE_TORCH_INDEX": "runner", "PERFSUITE_INSTALLER": "pip", "PERFSUITE_ACCEPTANCE_BUDGET_S": "31",
            "PERFSUITE_PROFILER": "torch", "PERFSUITE_WINDOWS_SIDE": "B", "PERFSUITE_LAUNCHER_PID": "12",
            "PERFSUITE_LAUNCHER_START": "1700000000.25", "PERFSUITE_WINDOWS_RELEASE": "1",
            "PERFSUITE_NVML_CHECK_SET": "1", "PERFSUITE_CACHE_DIR": str(tmp_path / "new"),
            "PERFSUITE_PYTHON": "python3", "PERFSUITE_RUN_TOKEN": "abc123"}
    assert envvars.problems(good) == []
    assert envvars.problems({name: "" for name in envvars.by_name()}) == []  # empty: unset


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_value_is_named_with_what_the_variable_takes(name, tmp_path):
    value, takes = (v.replace("{t}", str(tmp_path / "a-file")) for v in BAD[name])
    (tmp_path / "a-file").write_text("not a folder")
    (said,) = envvars.problems({name: value})
    assert f"${name}" in said and repr(value) in said and takes in said, said


@pytest.mark.parametrize("name, value", [("PERFSUITE_RANK_START", "spawn"), ("PERFSUITE_RANK_START", "Fork"),
                                         ("PERFSUITE_FORK_AGENT", "false"), ("PERFSUITE_RDZV_PORT", "http"),
                                         ("PERFSUITE_HISTORY", "Off")])
def test_perfsuite_run_stops_before_anything_on_a_bad_value(name, value, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(name, value)
    code = cli.main(["run", GPU_CELL, "--out", str(tmp_path / "out"), "--allow-no-gpu", "--no-probe"])
    said = capsys.readouterr()
    assert code == 2, said.out + said.err
    assert f"${name}" in said.err and repr(value) in said.err and "Traceback" not in said.err
    assert not (tmp_path / "out").exists() and list(tmp_path.iterdir()) == []


def test_a_nsys_that_is_not_executable_is_refused(tmp_path, capsys, monkeypatch):
    nsys = tmp_path / "nsys"
    nsys.write_text("#!/bin/sh\n")
    nsys.chmod(stat.S_IRUSR | stat.S_IWUSR)
    monkeypatch.setenv("PERFSUITE_NSYS_BIN", str(nsys))
    if os.access(nsys, os.X_OK):  # root executes anything
        pytest.skip("this user may execute any file")
    code = cli.main(["run", GPU_CELL, "--out", str(tmp_path / "out"), "--allow-no-gpu", "--no-probe"])
    assert code == 2 and str(nsys) in capsys.readouterr().err


def test_an_unknown_variable_is_said_with_the_name_meant_and_the_run_goes_on(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PERFSUITE_RANK_STRAT", "exec")
    code = cli.main(["run", GPU_CELL, "--out", str(tmp_path / "out"), "--allow-no-gpu", "--no-probe",
                     "--history", "off"])
    said = capsys.readouterr()
    assert code == 0, said.err
    assert "$PERFSUITE_RANK_STRAT" in said.err and "did you mean PERFSUITE_RANK_START" in said.err


def test_an_unknown_variable_without_a_near_name_is_said_too():
    (said,) = envvars.strangers({"PERFSUITE_ZZZ": "1", "HOME": "/root"})
    assert "$PERFSUITE_ZZZ" in said and "docs/reference/environment.md" in said and "did you mean" not in said
