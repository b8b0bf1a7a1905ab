"""A session's guarantees: what it needs is checked before the first launch,
and nothing measured is lost whatever fails after it.

Launches are the fake ones of conftest.py (no process is started)."""

import errno
import json
import os

import pytest

from perfsuite.judge import judging as judge_mod
from perfsuite.judge.baselines import BaselineError
from perfsuite.runner import Runner, SessionError
from tests.unit.cellkit import tiny_image_cell

CELL = tiny_image_cell(world_size=1)


def session(out, **kwargs):
    kwargs.setdefault("baselines", out.parent / "no-baselines")
    os.makedirs(kwargs["baselines"], exist_ok=True)
    return Runner(out, probe=False, **kwargs)


def broken_baselines(root):
    folder = root / "cpu-test"
    folder.mkdir(parents=True)
    (folder / "profile.json").write_text('{"format": "perfsuite.baselines/1", "hardware": ')
    return root


def test_a_malformed_baseline_stops_the_session_before_any_launch(tmp_path, fake):
    runner = session(tmp_path / "out", baselines=broken_baselines(tmp_path / "b"))
    with pytest.raises(BaselineError, match="profile.json: not valid JSON"):
        runner.result(CELL)
    assert fake.calls == []
    assert not (tmp_path / "out" / "results.json").exists()


def test_a_check_that_crashes_keeps_the_measured_cell(tmp_path, fake, monkeypatch):
    def crash(*args, **kwargs):
        raise KeyError("a baseline row without its metric")

    monkeypatch.setattr(judge_mod, "judge", crash)
    result = session(tmp_path / "out").result(CELL)
    saved = json.loads((tmp_path / "out" / "results.json").read_text())["cells"]
    assert [c["id"] for c in saved] == [CELL.id] and saved[0]["status"] == "ok"
    assert saved[0]["metrics"]["step_time"]["samples"] == result["metrics"]["step_time"]["samples"]
    check = saved[0]["checks"][0]
    assert check["name"] == "perfsuite.judge" and check["verdict"] == "fail"
    assert "judging failed: KeyError" in check["message"]


def test_a_directory_holding_a_run_is_refused_without_resume_or_overwrite(tmp_path, fake):
    out = tmp_path / "out"
    first = session(out)
    first.result(CELL)
    first.end()
    with pytest.raises(SessionError, match=r"not empty \(results.json\).*--resume.*--overwrite"):
        session(out).result(CELL)
    assert len(fake.calls) == 1
    (out / "notes.txt").write_text("mine")
    session(out, overwrite=True).result(tiny_image_cell(world_size=1, max_steps=7))
    saved = json.loads((out / "results.json").read_text())["cells"]
    assert [c["params"]["max_steps"] for c in saved] == [7]  # the old run's cell is gone
    assert (out / "notes.txt").read_text() == "mine"  # never a file perfsuite did not write


def test_two_sessions_cannot_share_an_output_directory(tmp_path, fake):
    first = session(tmp_path / "out")
    first.begin()
    with pytest.raises(SessionError, match=f"in use.*pid {os.getpid()}"):
        session(tmp_path / "out").begin()
    first.end()
    session(tmp_path / "out", resume=True).begin()


def test_an_output_path_that_is_a_file_is_named(tmp_path, fake):
    (tmp_path / "out").write_text("")
    with pytest.raises(SessionError, match="out is a file"):
        session(tmp_path / "out").begin()


def test_a_full_disk_is_found_before_the_first_launch(tmp_path, fake, monkeypatch):
    def full(path, text):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("perfsuite.system.atomic.atomic_write_text", full)
    with pytest.raises(SessionError, match="cannot write there .No space left on device"):
        session(tmp_path / "out").result(CELL)
    assert fake.calls == []


def test_an_output_directory_that_cannot_be_made_is_said_so_before_the_first_launch(tmp_path, fake):
    (tmp_path / "file").write_text("")  # its parent is a file: mkdir fails
    with pytest.raises(SessionError, match="out: cannot create it .Not a directory"):
        session(tmp_path / "file" / "out", baselines=tmp_path / "bl").result(CELL)
    assert fake.calls == []


def test_resuming_a_corrupt_run_is_a_sentence(tmp_path, fake):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "results.json").write_text('{"schema": "perfsuite.results/1", "cells": [')
    with pytest.raises(SessionError, match="cannot resume: .*not valid JSON.*Remove that results.json"):
        session(tmp_path / "out", resume=True).begin()


def test_resumed_cells_are_judged_against_todays_baselines(tmp_path, fake, monkeypatch):
    out = tmp_path / "out"
    first = session(out)
    first.result(CELL)
    first.end()
    marker = [{"name": "judged-again", "verdict": "pass", "observed": 1, "expected": "1",
               "message": ""}]
    monkeypatch.setattr(judge_mod, "judge", lambda *a, **k: marker)
    again = session(out, resume=True).result(CELL)
    assert again["resumed"] and again["checks"] == marker
    assert len(fake.calls) == 1  # resumed, not measured again
    saved = json.loads((out / "results.json").read_text())["cells"]
    assert saved[0]["checks"] == marker
