"""A working directory removed under a session, and a disk too full for a
folder's lock: said in a sentence, the lock released, no file left behind.

Sessions in processes of their own (tests/plugin/probe_interrupt.py): torch's
own libraries abort a process whose working directory is gone, and a full disk
is a file size limit (RLIMIT_FSIZE) there."""

import json
import os
import subprocess
import sys

from tests.plugin.probe_interrupt import (
    SMOKE_CELL,
    failed_with_a_sentence,
    refused_leaving_nothing,
    removed_mid_run,
    run_on_a_full_disk,
    session,
)
from tests.plugin.probekit import NO_LAUNCH, TRACEBACK, results_file

IN_A_REMOVED_FOLDER = """
import os, sys
from perfsuite.cli.main import main

os.chdir(sys.argv[1])
os.rmdir(sys.argv[1])
sys.exit(main(sys.argv[2:]))
"""


def test_a_run_started_in_a_removed_working_directory_is_refused_before_any_launch(tmp_path):
    (tmp_path / "shell").mkdir()
    done = subprocess.run([sys.executable, "-c", IN_A_REMOVED_FOLDER, str(tmp_path / "shell"), "run", SMOKE_CELL,
                           "--out", str(tmp_path / "out"), *NO_LAUNCH], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    said = done.stdout + done.stderr
    assert done.returncode == 2, said
    assert f"the working directory {tmp_path / 'shell'} is gone" in said and "cd to an existing folder" in said
    assert TRACEBACK not in said and "FATAL" not in said
    assert not (tmp_path / "out").exists()  # nothing launched, no lock left


def test_a_working_directory_removed_mid_run_fails_the_next_cell_unlaunched_and_frees_the_folder(tmp_path):
    removed_mid_run(tmp_path)
    failed_with_a_sentence(tmp_path, "")


def test_a_baseline_record_on_a_full_disk_leaves_no_lock_file_nor_folder(tmp_path):
    results_file(tmp_path / "run")
    session(tmp_path, ["baseline", "record", str(tmp_path / "run"), "--baselines", str(tmp_path / "bl")],
            full_disk=True)
    refused_leaving_nothing("bl")(tmp_path, "")
    said = json.loads((tmp_path / "session.json").read_text())["text"]
    assert "cannot write the baseline (File too large)" in said and "--baselines" in said, said


def test_a_run_on_a_full_disk_is_refused_naming_its_out_and_leaves_nothing(tmp_path):
    run_on_a_full_disk(tmp_path)
    refused_leaving_nothing("out")(tmp_path, "")
    said = json.loads((tmp_path / "session.json").read_text())["text"]
    assert f"output directory {tmp_path / 'out'}" in said and "choose another --out" in said, said


def test_a_lock_whose_holder_cannot_be_written_is_released_at_once(tmp_path, monkeypatch):
    from perfsuite.system import atomic, locking

    def full(path, chunks):  # after removing its temporary file, as atomic_write_chunks does
        raise OSError(28, "No space left on device", str(path))

    held = tmp_path / "held"
    held.mkdir()
    (held / "results.json").write_text("{}")
    monkeypatch.setattr(atomic, "atomic_write_chunks", lambda path, chunks: full(path, chunks))
    try:
        locking.FolderLock(held, "probe").acquire()
    except OSError as err:
        assert err.errno == 28
    else:
        raise AssertionError("the lock was taken without its holder")
    monkeypatch.undo()
    locking.FolderLock(held, "probe").acquire().release()  # free at once
    assert sorted(p.name for p in held.iterdir()) in (["results.json"], [".perfsuite.lock", "results.json"])
