"""Whole-or-nothing writes: the file's mode, and nothing left behind on failure."""

import os
import stat
import sys
import threading

import pytest

from perfsuite.system import atomic as fsutil
from perfsuite.system.atomic import atomic_write_bytes, atomic_write_json, atomic_write_text

posix_only = pytest.mark.skipif(sys.platform == "win32", reason="POSIX file modes")


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def umask():
    """Set the process umask for one test; the old one comes back after it."""
    old = os.umask(0o022)
    os.umask(old)
    yield lambda value: os.umask(value)
    os.umask(old)


def leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


@posix_only
@pytest.mark.parametrize("mask, expected", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_a_new_file_gets_the_mode_open_would_give(tmp_path, umask, mask, expected):
    umask(mask)
    for write, name, data in [(atomic_write_bytes, "a.bin", b"x"),
                              (atomic_write_text, "report.html", "<p>"),
                              (atomic_write_json, "results.json", {"a": 1})]:
        write(tmp_path / name, data)
        assert mode(tmp_path / name) == expected, (name, oct(mode(tmp_path / name)))
        with open(tmp_path / f"plain-{name}", "w"):  # what open() gives, for comparison
            pass
        assert mode(tmp_path / f"plain-{name}") == expected


@posix_only
def test_an_existing_file_keeps_its_mode(tmp_path, umask):
    umask(0o022)
    target = tmp_path / "results.csv"
    target.write_text("old\n")
    os.chmod(target, 0o640)
    atomic_write_text(target, "new\n")
    assert target.read_text() == "new\n" and mode(target) == 0o640
    os.chmod(target, 0o664)  # wider than the umask allows: kept all the same
    atomic_write_text(target, "newer\n")
    assert mode(target) == 0o664


@posix_only
def test_the_umask_is_read_without_changing_it(umask):
    umask(0o027)
    assert fsutil._current_umask() == 0o027
    assert os.umask(0o027) == 0o027  # still what it was


@posix_only
def test_the_umask_fallback_swaps_it_back(monkeypatch, umask):
    umask(0o007)
    monkeypatch.setattr(fsutil, "_PROC_STATUS", "/nonexistent/status")
    seen = []

    def read():
        for _ in range(200):
            seen.append(fsutil._current_umask())

    threads = [threading.Thread(target=read) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(seen) == {0o007}  # the lock keeps one thread from reading another's swap
    assert os.umask(0o007) == 0o007


def test_a_failed_write_leaves_nothing_behind_and_raises(tmp_path, monkeypatch):
    target = tmp_path / "results.json"
    target.write_text("before\n")

    def no_space(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(OSError, match="No space left"):
        atomic_write_text(target, "after\n")
    assert target.read_text() == "before\n" and leftovers(tmp_path) == []


def test_a_failed_chmod_leaves_nothing_behind_and_raises(tmp_path, monkeypatch):
    def refused(fd, mode):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "fchmod", refused, raising=False)
    with pytest.raises(PermissionError):
        atomic_write_bytes(tmp_path / "new.bin", b"data")
    assert list(tmp_path.iterdir()) == []


def test_a_rename_refused_leaves_nothing_behind_and_raises(tmp_path):
    (tmp_path / "results.json").mkdir()  # a folder where the file should go: even root cannot
    (tmp_path / "results.json" / "keep").write_text("")
    with pytest.raises(OSError):
        atomic_write_json(tmp_path / "results.json", {"n": 1})
    assert leftovers(tmp_path) == [] and (tmp_path / "results.json" / "keep").exists()


@posix_only
@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root writes into read-only directories")
def test_a_read_only_directory_refuses_the_write_and_keeps_the_file(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    target = folder / "results.json"
    atomic_write_json(target, {"n": 1})
    os.chmod(folder, 0o555)
    try:
        with pytest.raises(PermissionError) as err:
            atomic_write_json(target, {"n": 2})
        assert target.read_text() == '{\n "n": 1\n}\n' and leftovers(folder) == []
        names_the_destination(err.value, target)
    finally:
        os.chmod(folder, 0o755)


# A refusal names the path the caller gave, never the hidden temporary file
# beside it (".trends.html.q4it76g3.tmp" means nothing to whoever reads it).

def names_the_destination(err, target):
    assert err.filename == str(target) and err.filename2 is None, (err.filename, err.filename2)
    assert ".tmp" not in str(err) and str(target) in str(err)


def test_a_parent_that_is_a_file_names_the_destination(tmp_path):
    (tmp_path / "out").write_text("a file, not a folder\n")
    target = tmp_path / "out" / "trends.html"
    with pytest.raises(NotADirectoryError) as err:
        atomic_write_text(target, "<html>")
    names_the_destination(err.value, target)
    deeper = tmp_path / "out" / "run" / "results.json"  # a file further up
    with pytest.raises(NotADirectoryError) as err:
        atomic_write_json(deeper, {"n": 1})
    names_the_destination(err.value, deeper)
    assert (tmp_path / "out").read_text() == "a file, not a folder\n"


def test_a_refused_rename_names_the_destination_not_the_temporary_file(tmp_path):
    target = tmp_path / "trends.html"
    target.mkdir()  # a folder where the file should go
    with pytest.raises(IsADirectoryError) as err:
        atomic_write_text(target, "<html>")
    names_the_destination(err.value, target)
    assert err.value.errno == 21 and err.value.strerror == "Is a directory" and leftovers(tmp_path) == []


def test_a_refused_temporary_file_names_the_destination(tmp_path, monkeypatch):
    """What a read-only directory does (root writes there anyway, so it is stood in for)."""
    import tempfile

    def refused(prefix, suffix, dir):
        raise PermissionError(13, "Permission denied", os.path.join(dir, f"{prefix}q4it76g3{suffix}"))

    monkeypatch.setattr(tempfile, "mkstemp", refused)
    target = tmp_path / "trends.html"
    with pytest.raises(PermissionError) as err:
        atomic_write_text(target, "<html>")
    names_the_destination(err.value, target)
    assert err.value.errno == 13 and err.value.strerror == "Permission denied"


def test_a_full_disk_names_the_destination(tmp_path, monkeypatch):
    def no_space(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    target = tmp_path / "results.json"
    with pytest.raises(OSError) as err:
        atomic_write_text(target, "after\n")
    names_the_destination(err.value, target)
    assert err.value.errno == 28 and leftovers(tmp_path) == []


def test_the_command_line_names_the_destination(tmp_path, capsys):
    """perfsuite's commands print an OSError's filename: the one the user gave."""
    import json

    from perfsuite.cli.main import main

    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps({"schema": "perfsuite.results/1", "cells": []}))
    (run / "results.csv").mkdir()  # a folder where the report's table goes
    code = main(["report", str(run)])
    said = capsys.readouterr().err
    assert code == 2 and f"{run / 'results.csv'}: Is a directory" in said, said
    assert ".tmp" not in said and "Traceback" not in said
