"""Folder locks: one session per output directory, one baseline record at a time."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from perfsuite.hardware import profile_id
from perfsuite.judge import recording
from perfsuite.judge.baselines import BaselineError
from perfsuite.system.locking import HOLDER_NAME, FolderLock, LockBusy

ENV = {"cpu_model": "AMD EPYC 9334 32-Core Processor", "cpu_cores": 2, "gpu_count": 0,
       "torch": "2.14.0", "python": "3.12.1", "commit": "abc123"}


def one_cell_run(cell_id: str) -> dict:
    params = {"tier": "smoke", "workload": "image", "strategy": "ddp-ds", "device": "cpu",
              "world_size": 1, "precision": "fp32", "pin_memory": False, "dataset": "digits",
              "batch_size": 16, "image_size": 32, "max_steps": 14}
    return {"schema": "perfsuite.results/1", "env": ENV, "cells": [
        {"id": cell_id, "params": params, "status": "ok", "env": ENV, "checks": [],
         "metrics": {"step_time": {"value": 0.1, "unit": "s", "samples": [0.1] * 5}}}]}


def test_a_held_folder_is_refused_naming_its_holder(tmp_path):
    with FolderLock(tmp_path, "perfsuite run"):
        with pytest.raises(LockBusy) as err:
            FolderLock(tmp_path, "perfsuite run").acquire()
    assert f"pid {os.getpid()}" in str(err.value) and "choose another folder" in str(err.value)
    # released: a new session takes it, with nothing stale to report
    lock = FolderLock(tmp_path, "perfsuite run").acquire()
    assert lock.stale_message() is None
    lock.release()
    assert not (tmp_path / HOLDER_NAME).exists()


def test_the_lock_of_a_killed_holder_is_taken_over_with_a_message(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from perfsuite.system.locking import FolderLock; "
        f"lock = FolderLock({str(tmp_path)!r}, 'perfsuite run').acquire(); print('held', flush=True); "
        "time.sleep(60)")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LockBusy, match=f"pid {holder.pid}"):
            FolderLock(tmp_path, "perfsuite run").acquire()
        holder.kill()
        holder.wait()
        lock = FolderLock(tmp_path, "perfsuite run").acquire()
        assert f"pid {holder.pid}" in lock.stale_message()
        assert "no longer running" in lock.stale_message()
        lock.release()
    finally:
        holder.kill()
        holder.wait()


RECORDER = """
import json, sys
from perfsuite.judge import recording
results = json.loads(open(sys.argv[1]).read())
for i in range(int(sys.argv[3])):
    recording.record_run(results, root=sys.argv[2])
"""


@pytest.mark.slow
def test_concurrent_records_both_land(tmp_path):
    # Two recorders, each re-recording its own cell many times at once: with
    # an unlocked read-merge-write one's rows vanish in some rounds.
    files = []
    for name in ("smoke/a", "smoke/b"):
        path = tmp_path / f"{name.replace('/', '-')}.json"
        path.write_text(json.dumps(one_cell_run(name)))
        files.append(path)
    root = tmp_path / "baselines"
    procs = [subprocess.Popen([sys.executable, "-c", RECORDER, str(f), str(root), "40"],
                              stderr=subprocess.PIPE, text=True) for f in files]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    table = pd.read_csv(root / profile_id(ENV) / "metrics.csv")
    assert set(table["id"]) == {"smoke/a:step_time", "smoke/b:step_time"}


def test_a_record_into_an_unwritable_place_is_a_sentence(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(BaselineError, match="cannot write the baseline.*--baselines"):
        recording.record_run(one_cell_run("smoke/a"), root=blocker / "baselines")


def test_a_dry_run_takes_no_lock_and_writes_nothing(tmp_path):
    recording.record_run(one_cell_run("smoke/a"), root=tmp_path / "b", write=False)
    assert not Path(tmp_path / "b").exists()


def test_a_session_that_wrote_nothing_leaves_nothing(tmp_path):
    """A command refused after it took its folder (an ab whose ref is missing)
    leaves no lock file behind, nor the folder it made; one that wrote keeps both."""
    made = tmp_path / "new" / "out"
    with FolderLock(made, "test"):
        assert made.is_dir()
    assert not made.exists() and (tmp_path / "new").is_dir()  # only what the lock made
    given = tmp_path / "given"
    given.mkdir()
    with FolderLock(given, "test"):
        pass
    assert given.is_dir() and not any(given.iterdir())
    with FolderLock(given, "test"):
        (given / "results.json").write_text("{}")
    assert sorted(p.name for p in given.iterdir()) == [".perfsuite.lock", "results.json"]
