"""The history never lets a run stay green or answer wrongly: a run whose
history write failed (a full disk) exits 2 with its results and report kept
and says how to add it later; a read-only older store is read without being
written; a --branch with no run names the branches there are; a cell that
is stored but has no such history is said so, never "did you mean" itself."""

import json
import os
import shutil
import sqlite3
import subprocess

import pytest

from perfsuite.cli import main as cli
from perfsuite.history import schema as history_schema
from perfsuite.history.store import History
from tests.unit.test_history import CELLS, v1_layout, write_run

CELL = "smoke/image/ddp-ds/c1/fp32/px32/nopin/nchw"
pytest_plugins = ["pytester"]


def disk_full_engine(url):
    """open_engine's engine, on whose disk SQLite finds no room to write:
    every statement that writes fails as SQLite fails on a full disk."""
    from perfsuite.history.schema import open_engine

    engine = open_engine(url)
    dialect = engine.dialect
    for name in ("do_execute", "do_executemany", "do_execute_no_params"):
        real = getattr(dialect, name)

        def full(cursor, statement, *rest, _real=real, **kw):
            if statement.lstrip().split(None, 1)[0].upper() in ("INSERT", "UPDATE", "CREATE", "ALTER", "DELETE"):
                raise sqlite3.OperationalError("database or disk is full")
            return _real(cursor, statement, *rest, **kw)

        setattr(dialect, name, full)
    return engine


def test_a_run_whose_history_write_fails_exits_2_and_says_how_to_add_it(tmp_path, fake, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("perfsuite.runner.handle_sigterm", lambda: None)
    monkeypatch.setattr("perfsuite.history.store.open_engine", disk_full_engine)
    (tmp_path / "none").mkdir()
    store = tmp_path / "h.sqlite"
    argv = ["run", CELL, "--no-probe", "--baselines", str(tmp_path / "none"), "--history", str(store),
            "--commit", "c0ffee", "--out", str(tmp_path / "out")]
    assert cli.main(argv) == 2
    said = capsys.readouterr()
    text = said.out + said.err
    assert "Traceback" not in text and "database or disk is full" in text
    assert "history: not written" in text
    assert f"perfsuite history add {tmp_path / 'out'} --commit c0ffee --history {store}" in text
    assert json.loads((tmp_path / "out" / "results.json").read_text())["cells"][0]["status"] == "ok"
    assert (tmp_path / "out" / "report.html").is_file()

    monkeypatch.undo()  # room again: the command it named stores the run
    monkeypatch.chdir(tmp_path)
    assert cli.main(["history", "add", str(tmp_path / "out"), "--commit", "c0ffee", "--history", str(store)]) == 0
    assert "stored run" in capsys.readouterr().out


def test_run_json_says_the_exit_of_a_run_whose_history_was_not_written(tmp_path, fake, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("perfsuite.runner.handle_sigterm", lambda: None)
    monkeypatch.setattr("perfsuite.history.store.open_engine", disk_full_engine)
    (tmp_path / "none").mkdir()
    assert cli.main(["run", CELL, "--no-probe", "--baselines", str(tmp_path / "none"), "--history",
                     str(tmp_path / "h.sqlite"), "--commit", "c0ffee", "--out", str(tmp_path / "out"),
                     "--json"]) == 2
    summary = json.loads(capsys.readouterr().out)
    assert summary["exit"] == 2 and summary["history"].startswith("history: not written")


def test_a_pytest_session_whose_history_write_fails_is_not_green(pytester, fake, monkeypatch):
    from tests.plugin.test_plugin import CELL_TEST

    monkeypatch.setattr("perfsuite.history.store.open_engine", disk_full_engine)
    pytester.makepyfile(CELL_TEST)
    (pytester.path / "none").mkdir()
    result = pytester.runpytest("--perf-cell", CELL, "--perf-no-probe", "--perf-baselines", str(pytester.path / "none"),
                                "--perf-history", str(pytester.path / "h.sqlite"), "--perf-commit", "c0ffee",
                                "--perf-out", "out", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    line = next(line for line in result.outlines if line.startswith("history: "))
    assert line.startswith("history: not written") and "perfsuite history add" in line
    assert (pytester.path / "out" / "results.json").is_file()


def read_only(path):
    """Make ``path`` read-only to this process (root writes past a mode:
    it gets the immutable flag); the function that undoes it."""
    path.chmod(0o444)
    if os.geteuid() != 0:
        return lambda: path.chmod(0o644)
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(path)]).returncode != 0:
        path.chmod(0o644)
        pytest.skip("root, and no immutable flag here: nothing is read-only to this process")
    return lambda: (subprocess.run(["chattr", "-i", str(path)], check=True), path.chmod(0o644))


@pytest.mark.parametrize("argv", [["show", CELLS[0]], ["changes"], ["report", "--out", "{tmp}/trends.html"]])
def test_a_read_only_older_store_is_read_without_being_written(tmp_path, capsys, argv):
    store = tmp_path / "h.sqlite"
    with History(store) as history:
        history.add_run(write_run(tmp_path, "r1", started=1.0), commit="a" * 40)
    v1_layout(store)
    before = store.read_bytes()
    undo = read_only(store)
    try:
        code = cli.main(["history", *[a.replace("{tmp}", str(tmp_path)) for a in argv], "--history", str(store)])
        said = capsys.readouterr()
    finally:
        undo()
    assert code == 0, said.err
    assert "readonly" not in said.out + said.err and store.read_bytes() == before
    with History(store, create=False, read_only=True) as history:  # writable again: a reader migrates it
        assert history.version == history_schema.SCHEMA_VERSION


def test_a_read_only_older_store_refuses_a_write_saying_why(tmp_path, capsys):
    store = tmp_path / "h.sqlite"
    with History(store) as history:
        history.add_run(write_run(tmp_path, "r1", started=1.0), commit="a" * 40)
    v1_layout(store)
    undo = read_only(store)
    try:
        code = cli.main(["history", "mark", "a" * 8, "--history-purpose", "run", "--history", str(store)])
        err = capsys.readouterr().err
    finally:
        undo()
    assert code == 2 and str(store) in err and "layout version 1" in err and "make it writable" in err


@pytest.mark.parametrize("command", [["changes"], ["show", CELLS[0]], ["report", "--out", "{tmp}/t.html"]])
def test_a_branch_with_no_run_names_the_branches_there_are(tmp_path, capsys, command):
    store = tmp_path / "h.sqlite"
    with History(store) as history:
        history.add_run(write_run(tmp_path, "r1", started=1.0), commit="a" * 40, branch="main")
        history.add_run(write_run(tmp_path, "r2", started=2.0), commit="b" * 40, branch="release")
    argv = ["history", *[a.replace("{tmp}", str(tmp_path)) for a in command], "--history", str(store),
            "--branch", "nosuch"]
    assert cli.main(argv) == 2
    said = capsys.readouterr()
    assert "no history yet" not in said.out
    assert "no run on branch nosuch" in said.err and "main (1 run(s)), release (1 run(s))" in said.err
    assert not (tmp_path / "t.html").exists()


def test_a_stored_cell_without_that_history_is_said_so_never_suggested_to_itself(tmp_path, capsys):
    store = tmp_path / "h.sqlite"
    with History(store) as history:
        history.add_run(write_run(tmp_path, "r1", started=1.0, status="error"), commit="a" * 40)
    assert cli.main(["history", "show", CELLS[0], "--history", str(store)]) == 2
    err = capsys.readouterr().err
    assert f"did you mean {CELLS[0]}" not in err
    assert f"no step_time history of {CELLS[0]}: it is stored, but no run of it finished ok" in err


def test_a_known_cell_never_stored_is_said_so(tmp_path, capsys):
    store = tmp_path / "h.sqlite"
    with History(store) as history:
        history.add_run(write_run(tmp_path, "r1", started=1.0, cells=CELLS[1:]), commit="a" * 40)
    assert cli.main(["history", "show", CELL, "--history", str(store)]) == 2
    err = capsys.readouterr().err
    assert "a cell perfsuite knows, not stored in this history yet" in err and "did you mean" not in err


def test_a_store_in_a_folder_that_cannot_be_written_is_found_before_measuring(tmp_path):
    from perfsuite.history.store import HistoryError, check_store_usable

    store = tmp_path / "ro" / "h.sqlite"
    store.parent.mkdir()
    History(store).close()
    store.parent.chmod(0o555)
    try:
        if os.access(store.parent, os.W_OK):
            pytest.skip("root writes into read-only folders")
        with pytest.raises(HistoryError, match="journal"):
            check_store_usable(str(store))
    finally:
        store.parent.chmod(0o755)
