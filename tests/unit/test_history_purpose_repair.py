"""A stored run's purpose is only ever inferred from that run's own file,
can be re-marked by the user (``perfsuite history mark``), and a store whose
runs were all left out for their purpose says so instead of "no history yet"."""

import json

import pytest

from perfsuite.cli import main as cli
from perfsuite.history import schema as history_schema
from perfsuite.history.store import History, HistoryError
from tests.unit.test_history import CELLS, purposes, rows, v1_layout, write_run


def reused_folder_store(tmp_path):
    """Three nightly runs stored from one output folder, then tonight's run
    with a workload option written into that same folder (not stored yet);
    the store brought back to layout version 1."""
    store = tmp_path / "team.sqlite"
    with History(store) as history:
        for night in range(3):
            history.add_run(write_run(tmp_path, "nightly", started=1000.0 * (night + 1)),
                            commit=f"{night}abc".ljust(40, "0"))
    write_run(tmp_path, "nightly", started=9000.0, options={"max_steps": "5"})
    v1_layout(store)
    return store


def test_migration_never_takes_a_purpose_from_a_file_that_is_now_another_runs(tmp_path):
    store = reused_folder_store(tmp_path)
    with History(store) as history:
        assert history.version == history_schema.SCHEMA_VERSION
    assert [(r["purpose"], r["options"]) for r in rows(store, history_schema.runs)] == [("run", {})] * 3


def test_migration_still_marks_a_run_whose_own_file_names_its_options(tmp_path):
    store = tmp_path / "team.sqlite"
    with History(store) as history:
        history.add_run(write_run(tmp_path, "tried", started=5.0, options={"fault": "slow:0:5:0.5"}), commit="abc")
    v1_layout(store)
    History(store).close()
    assert purposes(store) == {"tried": ("experiment", {"fault": "slow:0:5:0.5"})}


def wrongly_marked(tmp_path):
    """A store whose three nightly runs were marked experiments (as an older
    migration marked them)."""
    store = tmp_path / "h.sqlite"
    with History(store) as history:
        for night in range(3):
            history.add_run(write_run(tmp_path, f"n{night}", started=1000.0 * (night + 1), cells=CELLS[:1]),
                            commit=f"{night}abc".ljust(40, "0"), purpose="experiment")
    return store


def test_changes_says_which_runs_it_left_out_instead_of_no_history_yet(tmp_path, capsys):
    store = wrongly_marked(tmp_path)
    assert cli.main(["history", "changes", "--history", str(store)]) == 2
    said = capsys.readouterr()
    text = said.out + said.err
    assert "no step_time history yet" not in text
    assert "3 experiment run(s)" in text and "--include experiment" in text and "history mark" in text
    assert str(store) in text
    assert cli.main(["history", "changes", "--history", str(store), "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["left_out"] == {"experiment": 3}


def test_history_mark_re_marks_stored_runs_by_commit_key_or_folder(tmp_path, capsys):
    store = wrongly_marked(tmp_path)
    [first, second, third] = rows(store, history_schema.runs)
    assert cli.main(["history", "mark", first["commit_sha"][:8], "--history-purpose", "run",
                     "--history", str(store)]) == 0
    out = capsys.readouterr().out
    assert first["run_key"][:12] in out and "now marked run (was experiment)" in out
    assert cli.main(["history", "mark", second["run_key"][:12], str(tmp_path / "n2"), "--history-purpose", "run",
                     "--history", str(store)]) == 0
    assert [r["purpose"] for r in rows(store, history_schema.runs)] == ["run"] * 3
    assert cli.main(["history", "changes", "--history", str(store)]) == 0
    assert cli.main(["history", "mark", third["commit_sha"][:8], "--history-purpose", "run",
                     "--history", str(store)]) == 0
    assert "already marked run" in capsys.readouterr().out


def test_history_mark_names_what_it_could_not_find_and_writes_nothing(tmp_path, capsys):
    store = wrongly_marked(tmp_path)
    before = store.read_bytes()
    assert cli.main(["history", "mark", "ffff0000", "--history-purpose", "run", "--history", str(store)]) == 2
    err = capsys.readouterr().err
    assert "ffff0000" in err and "no stored run" in err and "0abc" in err  # the runs there are, listed
    assert cli.main(["history", "mark", "ab", "--history-purpose", "run", "--history", str(store)]) == 2
    assert "at least 4" in capsys.readouterr().err
    assert cli.main(["history", "mark", "0abc", "--history-purpose", "run",
                     "--history", str(tmp_path / "none.sqlite")]) == 2
    assert not (tmp_path / "none.sqlite").exists() and store.read_bytes() == before


def test_mark_is_a_store_method_that_refuses_an_unknown_purpose(tmp_path):
    store = wrongly_marked(tmp_path)
    with History(store) as history, pytest.raises(HistoryError, match="purpose 'meant'"):
        history.mark("0abc", "meant")
