"""``perfsuite run`` stopped (Ctrl-C, SIGTERM) and resumed: the cells kept
get their summary and report.html, the partial run is marked so in
results.json and kept out of the history until ``--resume`` finishes it,
and a run resumed and added again is stored once. Whatever a session needs
of the history store and the cache is checked before its first launch.

Launches are the fake ones of conftest.py, but for one real SIGTERM of a
real ``perfsuite run`` (a smoke cell, ~10 s)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from perfsuite import cells as cells_mod
from perfsuite.cli import main as cli
from perfsuite.history import schema as history_schema
from perfsuite.runner import Runner, SessionError
from tests.unit.conftest import no_baselines

IDS = [c.id for c in cells_mod.select(tier="smoke", workload="image")[:3]]


@pytest.fixture(autouse=True)
def sigterm_as_it_was():
    """``perfsuite run`` in this process turns SIGTERM into Ctrl-C: undone after each test."""
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


def stop_at(monkeypatch, fake, launch, how):
    """Launches by ``fake`` until launch number ``launch``, which is stopped
    as a person (Ctrl-C) or a CI job's cancel (SIGTERM) stops it."""
    def run_cell(cell, out_dir, opts=None):
        if len(fake.calls) + 1 == launch:
            if how == "SIGTERM":
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the handler raises in this thread before this ends
            raise KeyboardInterrupt
        return fake(cell, out_dir, opts)

    monkeypatch.setattr("perfsuite.launch.launch.run_cell", run_cell)


def run(tmp_path, *more):
    return cli.main(["run", *IDS, "--out", str(tmp_path / "out"), "--no-probe", "--baselines",
                     str(no_baselines(tmp_path)), "--history", str(tmp_path / "history.sqlite"),
                     "--commit", "c0ffee", *more])


def stored(tmp_path, table):
    engine = sa.create_engine(history_schema.resolve_url(tmp_path / "history.sqlite"))
    with engine.connect() as conn:
        rows = [dict(r) for r in conn.execute(sa.select(table)).mappings()]
    engine.dispose()
    return rows


def results(tmp_path):
    return json.loads((tmp_path / "out" / "results.json").read_text())


@pytest.mark.parametrize("how", ["Ctrl-C", "SIGTERM"])
def test_an_interrupted_run_writes_its_report_and_is_stored_once_when_resumed(tmp_path, fake, monkeypatch,
                                                                            capsys, how):
    stop_at(monkeypatch, fake, 2, how)
    assert run(tmp_path) == 130
    said = capsys.readouterr()
    assert "Traceback" not in said.out + said.err
    assert f"results: {tmp_path / 'out' / 'results.json'}" in said.out
    assert f"report: {tmp_path / 'out' / 'report.html'}" in said.out
    assert (tmp_path / "out" / "report.html").stat().st_size > 0
    assert "history: not stored: the session was interrupted" in said.out
    assert "1 cell(s) kept in" in said.err and "--resume" in said.err
    kept = results(tmp_path)
    assert [c["id"] for c in kept["cells"]] == IDS[:1] and kept["run"]["status"] == "interrupted"
    assert not (tmp_path / "history.sqlite").exists() or stored(tmp_path, history_schema.runs) == []

    # history add refuses the partial run, naming the way to finish it
    store = str(tmp_path / "history.sqlite")
    assert cli.main(["history", "add", str(tmp_path / "out"), "--history", store, "--commit", "c0ffee"]) == 2
    err = capsys.readouterr().err
    assert "was interrupted" in err and "--resume" in err and len(err.strip().splitlines()) == 1

    # --resume measures the rest, and the run is stored whole, once
    monkeypatch.setattr("perfsuite.launch.launch.run_cell", fake)
    assert run(tmp_path, "--resume") == 0
    assert "history: stored run" in capsys.readouterr().out
    assert results(tmp_path)["run"]["status"] == "complete"
    assert len(fake.calls) == 3  # the first cell was not launched again
    assert cli.main(["history", "add", str(tmp_path / "out"), "--history", store, "--commit", "c0ffee"]) == 0
    assert "already stored" in capsys.readouterr().out
    assert len(stored(tmp_path, history_schema.runs)) == 1
    cells = stored(tmp_path, history_schema.cells)
    assert sorted(c["cell"] for c in cells) == sorted(IDS)
    step_times = [m for m in stored(tmp_path, history_schema.metrics) if m["metric"] == "step_time"]
    assert sorted(m["cell"] for m in step_times) == sorted(IDS)  # each cell's launches counted once


def test_a_finished_run_resumed_again_is_stored_once(tmp_path, fake, capsys):
    """--resume of a run already finished and stored measures nothing new:
    the run it resumes, kept once in the history."""
    assert run(tmp_path) == 0
    started = results(tmp_path)["run"]["started"]
    assert run(tmp_path, "--resume") == 0
    assert "already stored" in capsys.readouterr().out
    assert len(fake.calls) == 3 and results(tmp_path)["run"]["started"] == started
    assert len(stored(tmp_path, history_schema.runs)) == 1
    assert len(stored(tmp_path, history_schema.cells)) == 3


def test_an_interrupted_run_with_json_says_so_in_its_document(tmp_path, fake, monkeypatch, capsys):
    stop_at(monkeypatch, fake, 3, "Ctrl-C")
    assert run(tmp_path, "--json") == 130
    document = json.loads(capsys.readouterr().out)
    assert document["exit"] == 130 and document["interrupted"] is True
    assert document["report"] == str(tmp_path / "out" / "report.html")
    assert [c["id"] for c in document["cells"]] == IDS[:2]


def test_a_session_killed_before_its_end_is_not_stored(tmp_path, fake, capsys):
    """SIGKILL leaves results.json as it was after its last cell: 'running'."""
    runner = Runner(tmp_path / "out", probe=False, baselines=no_baselines(tmp_path))
    runner.result(cells_mod.get(IDS[0]))
    runner.end()  # released as a killed session's lock is taken over; no end of session written
    assert results(tmp_path)["run"]["status"] == "running"
    store = str(tmp_path / "history.sqlite")
    assert cli.main(["history", "add", str(tmp_path / "out"), "--history", store, "--commit", "abc"]) == 2
    assert "still running, or its session was killed" in capsys.readouterr().err


# -- before the first launch -------------------------------------------------------------------

def bad_stores(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    return ["sqlit:///x.db", f"sqlite:///{a_file}/dir/h.db", str(a_file / "h.sqlite")]


@pytest.mark.parametrize("which", range(3))
def test_a_history_store_that_cannot_be_used_stops_the_run_before_any_launch(tmp_path, fake, capsys, which):
    url = bad_stores(tmp_path)[which]
    code = cli.main(["run", *IDS, "--out", str(tmp_path / "out"), "--no-probe", "--history", url])
    said = capsys.readouterr()
    assert code == 2 and fake.calls == []
    assert not (tmp_path / "out" / "results.json").exists()
    (line,) = said.err.strip().splitlines()
    assert line.startswith("perfsuite run: history ") and "--history" in line
    assert "Traceback" not in said.out + said.err


@pytest.mark.parametrize("where", ["env", "option"])
def test_a_cache_that_cannot_be_used_stops_the_run_before_any_launch(tmp_path, fake, capsys, monkeypatch, where):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    more = []
    if where == "env":
        monkeypatch.setenv("PERFSUITE_CACHE_DIR", str(a_file))
    else:
        more = ["--option", f"cache_dir={a_file / 'sub'}"]
    code = cli.main(["run", *IDS, "--out", str(tmp_path / "out"), "--no-probe", "--history", "off", *more])
    said = capsys.readouterr()
    assert code == 2 and fake.calls == []
    (line,) = said.err.strip().splitlines()
    assert str(a_file) in line and "is a file" in line
    assert ("$PERFSUITE_CACHE_DIR" if where == "env" else "cache_dir") in line


def test_the_cache_is_checked_when_a_session_begins_for_pytest_too(tmp_path, fake, monkeypatch):
    (tmp_path / "cache").mkdir()
    monkeypatch.setenv("PERFSUITE_CACHE_DIR", str(tmp_path / "cache"))
    Runner(tmp_path / "ok", probe=False, baselines=no_baselines(tmp_path)).begin()
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: False if os.fspath(path) == str(tmp_path / "cache")
                        else real(path, mode, **kw))  # root writes anywhere: access(2) played
    with pytest.raises(SessionError, match=f"cannot write in {tmp_path / 'cache'}"):
        Runner(tmp_path / "out", probe=False, baselines=no_baselines(tmp_path)).begin()


# -- one real launch -----------------------------------------------------------------------------

@pytest.mark.slow
def test_sigterm_of_a_real_run_keeps_the_cell_and_writes_the_report(tmp_path):
    out = tmp_path / "out"
    script = Path(sys.executable).with_name("perfsuite")
    proc = subprocess.Popen([str(script), "run", *IDS[:2], "--out", str(out), "--no-probe", "--history",
                             str(tmp_path / "history.sqlite"), "--commit", "c0ffee"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not (out / "cells" / IDS[1]).exists():
            time.sleep(0.2)  # the second cell has begun: the first is in results.json
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, output
    assert "report: " in output and "interrupted (signal SIGTERM): 1 cell(s) kept" in output, output
    assert (out / "report.html").exists()
    data = json.loads((out / "results.json").read_text())
    assert [c["id"] for c in data["cells"]] == IDS[:1] and data["run"]["status"] == "interrupted"
