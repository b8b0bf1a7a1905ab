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
        with pytest.raises(PermissionError):
            atomic_write_json(target, {"n": 2})
        assert target.read_text() == '{\n "n": 1\n}\n' and leftovers(folder) == []
    finally:
        os.chmod(folder, 0o755)
