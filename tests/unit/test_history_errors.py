"""The history store when something is wrong: every reader and writer
(``perfsuite history add``, ``show``, ``changes``, ``report``) answers a
damaged or foreign store, a results.json it must not store, an impossible
``--since`` or an unknown metric with one sentence and exit 2, never a
traceback; and ``check_store_usable`` finds an unusable store before a
session measures anything."""

import json
import os
import sqlite3
import sys

import pytest

from perfsuite.cli import main as cli
from perfsuite.history import store as history
from perfsuite.history.store import History, HistoryError
from tests.unit.test_history import CELLS, write_run

ADD, SHOW, CHANGES, REPORT = "add", "show", "changes", "report"
COMMANDS = (ADD, SHOW, CHANGES, REPORT)


def command(which, run, store, tmp_path, *more):
    """The argv of one history command on ``store``."""
    return {ADD: ["history", "add", str(run), "--commit", "abc"],
            SHOW: ["history", "show", CELLS[0]],
            CHANGES: ["history", "changes"],
            REPORT: ["history", "report", "--out", str(tmp_path / "trends.html")]}[which] + [
        "--history", str(store), *more]


def said(capsys, argv):
    """(exit code, what it printed on stderr) of ``perfsuite ARGV``; a
    refusal is one line, without a traceback."""
    code = cli.main(argv)
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    return code, out.err


def one_sentence(err):
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def stored(tmp_path):
    """A perfsuite store holding two runs; (its path, a third run not yet added)."""
    store = tmp_path / "history.sqlite"
    with History(store) as h:
        h.add_run(write_run(tmp_path, "r1", started=1000.0), commit="a" * 40)
        h.add_run(write_run(tmp_path, "r2", started=2000.0, step=0.2), commit="b" * 40)
    return store, write_run(tmp_path, "r3", started=3000.0)


def tables(path):
    with sqlite3.connect(path) as conn:
        return sorted(r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))


# -- a store that is not (or no longer) perfsuite's --------------------------------------

@pytest.mark.parametrize("which", COMMANDS)
def test_an_sqlite_file_of_another_program_is_refused_and_left_alone(tmp_path, capsys, which):
    foreign = tmp_path / "app.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE users (id INTEGER, name TEXT)")
    run = write_run(tmp_path, "r", started=1.0)
    code, err = said(capsys, command(which, run, foreign, tmp_path))
    assert code == 2
    line = one_sentence(err)
    assert str(foreign) in line and "not a perfsuite history" in line and "users" in line
    assert tables(foreign) == ["users"]  # nothing of perfsuite's written into it


@pytest.mark.parametrize("which", COMMANDS)
def test_a_store_whose_runs_table_was_dropped_names_the_table(stored, tmp_path, capsys, which):
    store, run = stored
    with sqlite3.connect(store) as conn:
        conn.execute("DROP TABLE runs")
    code, err = said(capsys, command(which, run, store, tmp_path))
    assert code == 2
    line = one_sentence(err)
    assert str(store) in line and "lacks its table runs" in line


@pytest.mark.parametrize("which", COMMANDS)
def test_a_layout_version_that_is_not_a_number_is_named(stored, tmp_path, capsys, which):
    store, run = stored
    with sqlite3.connect(store) as conn:
        conn.execute("UPDATE meta SET value = 'two' WHERE key = 'schema_version'")
    code, err = said(capsys, command(which, run, store, tmp_path))
    assert code == 2
    line = one_sentence(err)
    assert str(store) in line and "schema_version 'two'" in line and "not a number" in line


@pytest.mark.parametrize("which", COMMANDS)
def test_a_file_that_is_not_a_database_is_one_sentence(tmp_path, capsys, which):
    store = tmp_path / "notes.sqlite"
    store.write_text("these are my notes, not a database\n" * 200)
    code, err = said(capsys, command(which, write_run(tmp_path, "r", started=1.0), store, tmp_path))
    assert code == 2 and str(store) in one_sentence(err)
    assert store.read_text().startswith("these are my notes")


def test_a_store_that_breaks_while_read_says_so_in_a_sentence(stored, monkeypatch):
    """Past the layout's check (a table dropped by another program meanwhile):
    the readers' queries are HistoryError too, not SQLAlchemy's traceback."""
    store, _ = stored
    with History(store, create=False) as h:
        with sqlite3.connect(store) as conn:
            conn.execute("DROP TABLE metrics")
        for read in (h.cell_ids, h.metric_names, lambda: h.series(cell=CELLS[0]),
                     lambda: h.left_out(cell=CELLS[0])):
            with pytest.raises(HistoryError, match="no such table: metrics"):
                read()


# -- what history add must not store ---------------------------------------------------------

def test_a_duplicated_cell_id_is_refused_naming_it(tmp_path, capsys):
    run = write_run(tmp_path, "dup", started=5.0)
    data = json.loads((run / "results.json").read_text())
    data["cells"].append(dict(data["cells"][0]))
    (run / "results.json").write_text(json.dumps(data))
    store = tmp_path / "history.sqlite"
    code, err = said(capsys, ["history", "add", str(run), "--commit", "abc", "--history", str(store)])
    assert code == 2 and CELLS[0] in err and ("repeats" in err or "twice" in err)
    with History(store) as h:
        assert h.all_runs() == []


def test_rows_the_store_refuses_are_a_history_error(tmp_path, monkeypatch):
    """Whatever read_finished lets through, a row the store refuses (a
    duplicated key) is HistoryError naming the file, and nothing is stored."""
    run = write_run(tmp_path, "dup", started=5.0)
    data = json.loads((run / "results.json").read_text())
    data["cells"].append(dict(data["cells"][0]))
    monkeypatch.setattr(history, "read_finished", lambda path: (data, b"raw"))
    with History(tmp_path / "history.sqlite") as h:
        with pytest.raises(HistoryError, match="cannot store"):
            h.add_run(run, commit="abc")
        assert h.all_runs() == []


@pytest.mark.parametrize("status, said_", [("interrupted", "was interrupted"), ("running", "still running")])
def test_an_interrupted_or_unfinished_session_is_refused_until_resumed(tmp_path, capsys, status, said_):
    """A run stopped by Ctrl-C is finished by --resume, as a new session (its
    own run.started): storing the partial one too would count its launches twice."""
    run = write_run(tmp_path, "cut", started=5.0)
    data = json.loads((run / "results.json").read_text())
    data["run"]["status"] = status
    (run / "results.json").write_text(json.dumps(data))
    store = tmp_path / "history.sqlite"
    code, err = said(capsys, ["history", "add", str(run), "--commit", "abc", "--history", str(store)])
    assert code == 2
    line = one_sentence(err)
    assert said_ in line and "--resume" in line and str(run / "results.json") in line
    data["run"]["status"] = "complete"
    (run / "results.json").write_text(json.dumps(data))
    code, _ = said(capsys, ["history", "add", str(run), "--commit", "abc", "--history", str(store)])
    assert code == 0


# -- what a reader is asked ------------------------------------------------------------------

@pytest.mark.parametrize("which", [SHOW, CHANGES, REPORT])
@pytest.mark.parametrize("since", ["2026-13-45", "2026-02-30", "2026-01-01T25:00"])
def test_an_impossible_since_date_is_named(stored, tmp_path, capsys, which, since):
    store, run = stored
    code, err = said(capsys, command(which, run, store, tmp_path, "--since", since))
    assert code == 2
    line = one_sentence(err)
    assert f"--since {since}" in line and "YYYY-MM-DD" in line


@pytest.mark.parametrize("which", [SHOW, CHANGES, REPORT])
def test_a_metric_that_is_not_stored_names_the_metrics_there_are(stored, tmp_path, capsys, which):
    store, run = stored
    code, err = said(capsys, command(which, run, store, tmp_path, "--metric", "step_tim"))
    assert code == 2
    line = one_sentence(err)
    assert "step_tim" in line and "did you mean step_time" in line
    assert "step_time, throughput" in line  # the metrics the store holds
    assert "did you mean " + CELLS[0] not in line  # not a cell for a metric's typo
    assert not (tmp_path / "trends.html").exists()
    code, _ = said(capsys, command(which, run, store, tmp_path, "--metric", "throughput"))
    assert code == 0


def test_an_empty_store_still_says_there_is_no_history_yet(tmp_path, capsys):
    code = cli.main(["history", "changes", "--history", str(tmp_path / "new.sqlite"), "--metric", "anything"])
    assert code == 2  # no store there: nothing was ever added
    History(tmp_path / "new.sqlite").close()
    code = cli.main(["history", "changes", "--history", str(tmp_path / "new.sqlite"), "--metric", "anything"])
    assert code == 0 and "no anything history yet" in capsys.readouterr().out


# -- check_store_usable: before a session's first launch ------------------------------------

def test_usable_stores_pass_and_nothing_is_created(tmp_path, stored, monkeypatch):
    store, _ = stored
    assert history.check_store_usable(str(store)) == f"sqlite:///{store}"
    assert history.check_store_usable("off") is None
    new = tmp_path / "new-folder" / "h.sqlite"
    assert history.check_store_usable(new) and not new.parent.exists()
    (tmp_path / "empty.sqlite").write_bytes(b"")
    assert history.check_store_usable(tmp_path / "empty.sqlite")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PERFSUITE_HISTORY", raising=False)
    assert history.check_store_usable(None).endswith(".perfsuite/history.sqlite")
    assert not (tmp_path / ".perfsuite").exists()


def unusable(tmp_path):
    """(URL, what its sentence says) of stores a session cannot add its run to."""
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    foreign = tmp_path / "app.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE users (id INTEGER)")
    (tmp_path / "a-dir.sqlite").mkdir()
    return [("sqlit:///x.db", "no database kind 'sqlit'"),
            ("postgresq://u@h/db", "no database kind 'postgresq'"),
            (f"sqlite:///{a_file}/sub/h.db", f"{a_file} is a file"),
            (str(a_file / "h.sqlite"), f"{a_file} is a file"),
            (str(tmp_path / "a-dir.sqlite"), "is a folder"),
            (str(foreign), "not a perfsuite history")]


def test_unusable_stores_are_one_sentence_naming_them(tmp_path):
    for url, says in unusable(tmp_path):
        with pytest.raises(HistoryError) as raised:
            history.check_store_usable(url)
        text = str(raised.value)
        assert says in text and len(text.splitlines()) == 1, (url, text)
    assert tables(tmp_path / "app.db") == ["users"]


def test_a_folder_that_cannot_be_written_is_named(tmp_path, monkeypatch):
    """Root writes anywhere, so the answer of access(2) is played here."""
    locked = tmp_path / "locked"
    locked.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: False if os.fspath(path) == str(locked)
                        else real(path, mode, **kw))
    for url in (locked / "h.sqlite", locked / "sub" / "h.sqlite"):
        with pytest.raises(HistoryError, match=f"cannot write in {locked}"):
            history.check_store_usable(url)


def test_a_postgresql_url_without_its_driver_is_found_before_measuring(monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)
    monkeypatch.setitem(sys.modules, "psycopg2", None)
    with pytest.raises(HistoryError, match=r"perfsuite\[postgres\]") as raised:
        history.check_store_usable("postgresql://perf:secret@db.example/perf")
    assert "secret" not in str(raised.value)


def test_a_postgresql_server_that_does_not_answer_is_found_before_measuring():
    pytest.importorskip("psycopg")
    with pytest.raises(HistoryError, match="cannot open it") as raised:
        history.check_store_usable("postgresql://perf:secret@127.0.0.1:9/perf")  # port 9: discard, nobody listens
    assert "secret" not in str(raised.value)
