"""The history store (SQLite, and PostgreSQL where a server can be started),
its change points (Apache Otava's E-Divisive) and the ``perfsuite history``
commands."""

import json
import math
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa

from perfsuite import cli, cli_history, history, history_changes, history_detection, history_rows, history_schema
from perfsuite.hardware import profile_id
from perfsuite.history import History, HistoryError, record_run_in_history

ENV = {"hostname": "vm", "platform": "Linux", "python": "3.11.7", "cpu_model": "Intel(R) Xeon(R) Processor",
       "cpu_isa": "avx512+bf16", "cpu_cores": 2, "torch": "2.14.0+cu130", "perfsuite": "0.1.0",
       "commit": "e" * 40, "gpu_count": 0}
CELLS = ("smoke/image/ddp-ds/c1/fp32/px32/nopin/nchw", "smoke/llm/lora/alpaca/c1/fp32/nopin")
REPO = Path(__file__).resolve().parents[2]


def counters(allreduce=2):
    return {"window_steps": 5, "ranks": 1, "unstable": ["memory/peak_allocated"],
            "per_step": {"collectives/allreduce/calls": allreduce, "collectives/allreduce/bytes": 16 * allreduce,
                         "ops/aten::mm": 40, "flops": 1.5e9, "memory/peak_allocated": 1e6}}


def cell_result(cell_id, step=0.1, *, status="ok", repeats=None, allreduce=2, env=ENV):
    samples = [step * (1 + 0.001 * i) for i in range(-5, 6)]
    step_time = {"value": float(np.median(samples)), "unit": "s", "samples": samples, "n": len(samples),
                 "median": float(np.median(samples)), "iqr": 0.004 * step, "min": min(samples), "max": max(samples)}
    if repeats:
        step_time["launch_medians"] = [step * f for f in (0.98, 1.0, 1.01, 1.03)][:repeats]
        step_time["launch_floors"] = [m * 0.97 for m in step_time["launch_medians"]]
    return {"id": cell_id, "params": {"tier": "smoke"}, "status": status, "reason": None, "env": env,
            "metrics": {"step_time": step_time, "throughput": {"value": 16 / step, "unit": "images/s"},
                        "loss": {"value": None, "unit": None}},
            "checks": [{"name": "sanity.step_time_samples", "verdict": "pass", "message": "ok", "metric": "step_time"}],
            "counters": counters(allreduce), "ranks": [], "repeats": repeats}


def write_run(root, name, *, started, step=0.1, finished=True, env=ENV, cells=CELLS, repeats=None,
              allreduce=2, status="ok"):
    results = [cell_result(c, step, repeats=repeats, allreduce=allreduce, env=env, status=status) for c in cells]
    for r in results:
        if r["repeats"] is None:
            del r["repeats"]
    data = {"schema": "perfsuite.results/1", "env": env, "cells": results,
            "run": {"started": started, "finished": started + 60 if finished else None, "argv": []}}
    out = Path(root) / name
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(data))
    return out


def sha(i, salt="a"):
    return f"{salt}{i:03d}".ljust(40, "0")


def url_of(tmp_path):
    return str(tmp_path / "history.sqlite")


def rows(url, table):
    engine = sa.create_engine(history_schema.resolve_url(url))
    with engine.connect() as conn:
        out = [dict(r) for r in conn.execute(sa.select(table)).mappings()]
    engine.dispose()
    return out


def test_a_run_is_kept_with_its_commit_profile_metrics_counters_and_verdicts(tmp_path):
    run = write_run(tmp_path, "run1", started=1000.0, repeats=4)
    with History(url_of(tmp_path)) as store:
        added = store.add_run(run, commit="abc123", branch="main")
        assert added.new and added.cells == 2 and store.version == history_schema.SCHEMA_VERSION
    [stored] = rows(url_of(tmp_path), history_schema.runs)
    assert stored["commit_sha"] == "abc123" and stored["branch"] == "main"
    assert stored["profile"] == profile_id(ENV) == "cpu-intel-xeon-avx512-bf16-2c"
    assert stored["started"] == 1000.0 and stored["fingerprint"]["hostname"] == "vm"
    assert stored["software"] == {"python": "3.11.7", "torch": "2.14.0+cu130", "perfsuite": "0.1.0",
                                  "platform": "Linux"}
    cell = next(c for c in rows(url_of(tmp_path), history_schema.cells) if c["cell"] == CELLS[0])
    assert cell["status"] == "ok" and cell["repeats"] == 4
    assert cell["counters"]["per_step"]["collectives/allreduce/calls"] == 2
    assert cell["verdicts"] == [{"name": "sanity.step_time_samples", "verdict": "pass", "metric": "step_time",
                                 "message": "ok"}]
    metric = {(m["cell"], m["metric"]): m for m in rows(url_of(tmp_path), history_schema.metrics)}
    step = metric[(CELLS[0], "step_time")]
    assert step["n"] == 11 and step["median"] == pytest.approx(0.1) and step["min"] == pytest.approx(0.0995)
    assert step["iqr"] == pytest.approx(0.0004) and step["launches"]["medians"] == pytest.approx([0.098, 0.1, 0.101, 0.103])
    assert metric[(CELLS[0], "loss")]["value"] is None  # a null metric is kept as null
    assert history_rows.run_value(step["value"], step["launches"], statistic="median") == pytest.approx(0.1005)
    assert history_rows.run_value(step["value"], step["launches"]) == pytest.approx(0.1005 * 0.97)  # floors


def test_the_same_run_added_twice_is_kept_once(tmp_path):
    run = write_run(tmp_path, "run1", started=1000.0)
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    with History(url_of(tmp_path)) as store:
        assert store.add_run(run, commit="abc").new
        again = store.add_run(copy / "results.json", commit="def")
    assert not again.new and again.stored_commit == "abc" and "kept once" in again.describe()
    assert len(rows(url_of(tmp_path), history_schema.runs)) == 1


def test_an_unfinished_run_is_refused_with_the_reason(tmp_path, capsys):
    unfinished = write_run(tmp_path, "unfinished", started=1.0, finished=False)
    with History(url_of(tmp_path)) as store:
        with pytest.raises(HistoryError, match="incomplete run: run.finished is missing"):
            store.add_run(unfinished, commit="abc")
        running = write_run(tmp_path, "running", started=2.0)
        data = json.loads((running / "results.json").read_text())
        data["cells"][1]["status"] = "running"
        (running / "results.json").write_text(json.dumps(data))
        with pytest.raises(HistoryError, match=f"cell {CELLS[1]} is still 'running'"):
            store.add_run(running, commit="abc")
        (tmp_path / "other").mkdir()
        (tmp_path / "other" / "results.json").write_text('{"schema": "something/2", "run": {"finished": 1}}')
        with pytest.raises(HistoryError, match="expected 'perfsuite.results/1'"):
            store.add_run(tmp_path / "other", commit="abc")
    assert rows(url_of(tmp_path), history_schema.runs) == []
    assert cli.main(["history", "add", str(unfinished), "--url", url_of(tmp_path), "--commit", "x"]) == 2
    assert "incomplete run" in capsys.readouterr().err


def _git(repo, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                   capture_output=True)


def test_commit_and_branch_default_to_git_then_to_the_runs_env(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "nightly")
    _git(repo, "commit", "-q", "--allow-empty", "-m", "one")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    plain = tmp_path / "plain"
    plain.mkdir()
    with History(url_of(tmp_path)) as store:
        from_git = store.add_run(write_run(tmp_path, "r1", started=1.0), cwd=repo)
        from_env = store.add_run(write_run(tmp_path, "r2", started=2.0), cwd=plain)
        with pytest.raises(HistoryError, match="no commit"):
            store.add_run(write_run(tmp_path, "r3", started=3.0, env={**ENV, "commit": None}), cwd=plain)
    assert (from_git.commit, from_git.branch) == (head, "nightly")
    assert (from_env.commit, from_env.branch) == ("e" * 40, None)


# Each job imports and warms up, says it is ready and waits for the others,
# so that their adds overlap.
ADDER = textwrap.dedent("""
    import pathlib, sys, time
    from perfsuite import hardware, results
    from perfsuite.history import record_run_in_history
    results._validator()
    url, barrier, jobs, me, paths = sys.argv[1], pathlib.Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5:]
    (barrier / me).touch()
    deadline = time.time() + 60
    while len(list(barrier.iterdir())) < jobs and time.time() < deadline:
        time.sleep(0.005)
    for path in paths:
        record_run_in_history(path, url, commit="c" + path[-3:], branch="ci")
""")


def add_concurrently(url, run_sets, barrier):
    barrier.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", ADDER, url, str(barrier), str(len(run_sets)), str(i),
                               *map(str, paths)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
             for i, paths in enumerate(run_sets)]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err


def test_two_processes_adding_at_once_both_land(tmp_path):
    runs = [write_run(tmp_path, f"run{i:03d}", started=100.0 + i) for i in range(10)]
    shared = runs[-1]  # both jobs add this one: it is kept once
    add_concurrently(url_of(tmp_path), [[*runs[0:5], shared], [*runs[5:9], shared]], tmp_path / "barrier")
    stored = rows(url_of(tmp_path), history_schema.runs)
    assert sorted(r["started"] for r in stored) == [100.0 + i for i in range(10)]
    assert len(rows(url_of(tmp_path), history_schema.metrics)) == 10 * 2 * 3


V0_LAYOUT = """
CREATE TABLE runs (id INTEGER PRIMARY KEY AUTOINCREMENT, run_key VARCHAR(64) NOT NULL UNIQUE,
    commit_sha VARCHAR(64) NOT NULL, started FLOAT, finished FLOAT, added FLOAT NOT NULL,
    profile VARCHAR(255) NOT NULL, fingerprint JSON, source TEXT);
CREATE TABLE cells (run_id INTEGER NOT NULL REFERENCES runs(id), cell VARCHAR(512) NOT NULL,
    status VARCHAR(16) NOT NULL, reason TEXT, repeats INTEGER, counters JSON, verdicts JSON,
    PRIMARY KEY (run_id, cell));
CREATE TABLE metrics (run_id INTEGER NOT NULL REFERENCES runs(id), cell VARCHAR(512) NOT NULL,
    metric VARCHAR(128) NOT NULL, unit VARCHAR(32), value FLOAT, median FLOAT, n INTEGER, iqr FLOAT,
    min FLOAT, PRIMARY KEY (run_id, cell, metric));
INSERT INTO runs VALUES (1, 'k1', 'old1', 10.0, 20.0, 30.0, 'cpu-x-2c', '{"torch": "2.1.0", "hostname": "vm"}', 'r');
INSERT INTO cells VALUES (1, 'smoke/a', 'ok', NULL, NULL, NULL, '[]');
INSERT INTO metrics VALUES (1, 'smoke/a', 'step_time', 's', 0.25, 0.25, 11, 0.01, 0.2);
"""


def test_a_version_0_store_is_migrated_and_a_newer_one_refused(tmp_path):
    path = tmp_path / "v0.sqlite"
    with sqlite3.connect(path) as conn:
        conn.executescript(V0_LAYOUT)
    assert sorted(history_schema.MIGRATIONS) == list(range(history_schema.SCHEMA_VERSION))
    with History(path) as store:
        assert store.version == history_schema.SCHEMA_VERSION
        [old] = store.all_runs()
        assert old["branch"] is None and old["software"] == {"torch": "2.1.0"}
        [[point]] = store.series(cell="smoke/a", launch_statistic="median").values()
        assert (point.commit, point.value, point.profile) == ("old1", 0.25, "cpu-x-2c")
        [[point]] = store.series(cell="smoke/a").values()
        assert point.value == 0.2  # one launch: its floor, the samples' minimum
        assert store.add_run(write_run(tmp_path, "new", started=40.0), commit="new1").new
    assert rows(path, history_schema.meta) == [{"key": "schema_version", "value": str(history_schema.SCHEMA_VERSION)}]
    with History(path) as store:  # opened again: nothing left to migrate
        assert len(store.all_runs()) == 2
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value = '99'")
    with pytest.raises(HistoryError, match="layout version 99, newer"):
        History(path)


def build_series(tmp_path, url, steps, *, allreduce_from=None, salt="a", env=ENV, start=0):
    rng = np.random.default_rng(7)
    with History(url) as store:
        for i, step in enumerate(steps):
            level = step * math.exp(rng.normal(0, 0.004))
            allreduce = 3 if allreduce_from is not None and i >= allreduce_from else 2
            run = write_run(tmp_path / "runs", f"{salt}{i}", started=1000.0 * (start + i + 1), step=level,
                            cells=CELLS[:1], allreduce=allreduce, env=env)
            store.add_run(run, commit=sha(start + i, salt), branch="main")


def test_changes_names_the_commits_of_a_step_its_size_and_the_counters(tmp_path, capsys):
    url = url_of(tmp_path)
    build_series(tmp_path, url, [0.1] * 12 + [0.11] * 12, allreduce_from=12)
    assert cli.main(["history", "changes", "--url", url]) == 1
    out = capsys.readouterr().out
    assert f"last good {sha(11)[:12]}" in out and f"first bad {sha(12)[:12]}" in out
    assert re.search(r"regressed x1\.(09|10)\d\d \(", out) and "Hodges-Lehmann" in out
    assert "work counters: c10d allreduce per step 2 -> 3 (+16 B)" in out
    assert f"REGRESSED at head: {CELLS[0]} step_time [{profile_id(ENV)}] since {sha(12)[:12]}" in out

    assert cli.main(["history", "changes", "--url", url, "--json", "--metric", "throughput"]) == 1
    report = json.loads(capsys.readouterr().out)
    [change] = report["series"][0]["changes"]  # throughput falls: higher is better, so regressed
    assert change["direction"] == "regressed" and change["first_bad"]["commit"] == sha(12)
    assert change["ratio"]["low"] <= change["ratio"]["estimate"] < 1 / 1.05

    # --since after the step: the runs from there on hold no change
    assert cli.main(["history", "changes", "--url", url, "--since", sha(12)[:8]]) == 0
    assert "0 change point(s) in 1 series" in capsys.readouterr().out

    build_series(tmp_path, url, [0.1] * 12, salt="b", start=24)  # fixed: back to 0.1
    assert cli.main(["history", "changes", "--url", url, "--cell", "smoke/image/*"]) == 0
    out = capsys.readouterr().out
    assert "improved" in out and f"first after {sha(24, 'b')[:12]}" in out and "REGRESSED" not in out


def test_unchanged_code_has_no_change_point(tmp_path, capsys):
    url = url_of(tmp_path)
    build_series(tmp_path, url, [0.1] * 20)
    assert cli.main(["history", "changes", "--url", url, "-v"]) == 0
    assert "20 commit(s): no change point(s)" in capsys.readouterr().out


def test_another_hardware_profile_starts_another_series(tmp_path, capsys):
    url = url_of(tmp_path)
    build_series(tmp_path, url, [0.1] * 8)
    # the same commits on a 4-core machine, twice as fast: not a change, another series
    build_series(tmp_path, url, [0.05] * 8, env={**ENV, "cpu_cores": 4}, salt="b", start=100)
    with History(url, create=False) as store:
        series = store.series(cell=CELLS[0])
    assert sorted(profile for _, _, profile in series) == [profile_id(ENV), profile_id({**ENV, "cpu_cores": 4})]
    assert all(len(points) == 8 for points in series.values())
    assert cli.main(["history", "changes", "--url", url]) == 0
    assert cli.main(["history", "show", CELLS[0], "--url", url]) == 0
    out = capsys.readouterr().out
    assert f"{CELLS[0]} step_time [cpu-intel-xeon-avx512-bf16-4c]" in out
    assert f"{sha(0)[:12]}  1970-01-01 00:16 UTC" in out and "main" in out


def test_show_merges_runs_of_one_commit_and_usage_errors_exit_2(tmp_path, capsys):
    url = url_of(tmp_path)
    with History(url) as store:
        store.add_run(write_run(tmp_path, "r1", started=1.0, step=0.1), commit="samecommit1", branch="-")
        store.add_run(write_run(tmp_path, "r2", started=2.0, step=0.3, repeats=4), commit="samecommit1")
    assert cli.main(["history", "show", CELLS[0], "--url", url, "--launch-statistic", "median"]) == 0
    out = capsys.readouterr().out  # the median of (0.1: one launch's median, 0.3015: of four launches)
    assert "samecommit1" in out and "0.20075 s" in out and "(2 runs)" in out and "      5  -" in out
    assert cli.main(["history", "show", CELLS[0], "--url", url]) == 0  # floors: 0.0995, 0.3 * 1.005 * 0.97
    assert "0.195978 s" in capsys.readouterr().out  # (0.0995 + 0.3 * 1.005 * 0.97) / 2 = 0.1959775
    with History(url) as store:  # a throughput keeps its value whatever a step time takes
        (points,) = store.series(cell=CELLS[0], metric="throughput").values()
    assert points[0].values == pytest.approx([16 / 0.1, 16 / 0.3])
    assert cli.main(["history", "show", CELLS[0][:-1], "--url", url]) == 2
    assert f"did you mean {CELLS[0]}" in capsys.readouterr().err
    assert cli.main(["history", "changes", "--url", str(tmp_path / "missing.sqlite")]) == 2
    assert "no history at" in capsys.readouterr().err
    assert not (tmp_path / "missing.sqlite").exists()
    assert cli.main(["history", "changes", "--url", url, "--since", "nosuchref"]) == 2
    assert "--since nosuchref: no stored run" in capsys.readouterr().err
    assert cli.main(["history", "changes", "--url", url, "--since", "1970-01-01"]) == 0
    assert cli.main(["history", "changes", "--url", url, "--cell", "smoke/nothing*"]) == 2
    assert "no step_time history of smoke/nothing*" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:
        cli.main(["history", "changes", "--no-such-option"])
    assert usage.value.code == 2


def test_the_runners_hook_defaults_to_the_sqlite_file_under_perfsuite(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not a git checkout: the commit comes from the run's env
    run = write_run(tmp_path, "run", started=5.0)
    line = record_run_in_history(run / "results.json", None, branch="ci")
    assert line.startswith("history: stored run ") and f"commit {'e' * 12} (ci)" in line
    assert (tmp_path / ".perfsuite" / "history.sqlite").exists()
    assert "already stored" in record_run_in_history(run, None)
    assert history_schema.resolve_url("postgresql://u@h/db").startswith("postgresql+")
    assert history_schema.resolve_url("sqlite:///x.db") == "sqlite:///x.db"
    assert (cli_history.DEFAULT_METRIC, cli_history.DEFAULT_MAX_PVALUE, cli_history.DEFAULT_WINDOW) == (
        history.DEFAULT_METRIC, history_changes.DEFAULT_MAX_PVALUE, history_changes.DEFAULT_WINDOW)
    assert (cli_history.LAUNCH_STATISTICS, cli_history.DEFAULT_LAUNCH_STATISTIC) == (
        history_rows.LAUNCH_STATISTICS, history_rows.DEFAULT_LAUNCH_STATISTIC)


def ab_json(path, sessions=2, launches=12, seed=3):
    rng = np.random.default_rng(seed)
    sides = {s: {"name": s, "python": "py", "env": {}, "ref": None, "workload_options": {}} for s in "AB"}
    for k in range(sessions):
        cell_launches = [{"side": "AB"[i % 2], "status": "ok",
                          "samples": list(rng.lognormal(math.log(0.1) + rng.normal(0, 0.02), 0.01, 9))}
                         for i in range(launches)]
        out = path / f"session{k}" / "unchanged"
        out.mkdir(parents=True)
        (out / "ab.json").write_text(json.dumps({"schema": "perfsuite.ab/1", "settings": {"sides": sides},
                                                 "cells": [{"id": "smoke/x", "launches": cell_launches}]}))


def test_detection_benchmark_on_two_tiny_series(tmp_path, capsys, monkeypatch):
    ab_json(tmp_path / "runs", sessions=3)
    assert cli.main(["history", "detection", "--series", "2", "--launches", "4", "--runs-dir",
                     str(tmp_path / "runs"), "--baselines", str(tmp_path / "none")]) == 0
    out = capsys.readouterr().out
    assert "36 launches of smoke/x" in out and "3 A/B sessions' ab.json" in out and "session-to-session" in out
    line = next(row for row in out.splitlines() if row.strip().startswith("4 "))
    assert line.count("/2") == 4
    assert "targets: step found at its commit >= 2/2, unchanged code a change <= 0/2" in out
    assert cli.main(["history", "detection", "--series", "2", "--launches", "2", "--by-session", "--runs-dir",
                     str(tmp_path / "runs"), "--baselines", str(tmp_path / "none")]) == 0
    assert "a session's shift plus R launches" in capsys.readouterr().out

    # no launches measured: the recorded launch_spread of a baseline, said so
    monkeypatch.setattr(history_detection, "_this_profile", lambda: None)
    (tmp_path / "baselines" / "cpu-x-2c").mkdir(parents=True)
    (tmp_path / "baselines" / "cpu-x-2c" / "profile.json").write_text(
        json.dumps({"launch_spread": {"median": {"log_sd": 0.01, "dof": 5}}}))
    noise = history_detection.load_noise(tmp_path / "nothing", tmp_path / "baselines", "median")
    assert "launch_spread of launch medians recorded in baselines/cpu-x-2c" in noise.describe()
    with pytest.raises(history_detection.NoNoise):  # no spread of floors recorded
        history_detection.load_noise(tmp_path / "nothing", tmp_path / "baselines")
    counts = history_detection.figures(noise, series=2, launches=2)
    assert counts["step"] == 2 and counts["unchanged"] == 0 and counts["drift"] == 2
    assert cli.main(["history", "detection", "--runs-dir", str(tmp_path / "nothing"),
                     "--baselines", str(tmp_path / "nothing")]) == 2
    assert "no measured launches" in capsys.readouterr().err



def test_detection_takes_repeated_launches_of_runs_before_ab_sessions(tmp_path):
    """A nightly run's own form (``run --repeats``): each results.json one
    session, each repeated cell's launch medians its launches."""
    rng = np.random.default_rng(5)
    ab_json(tmp_path / "runs", sessions=2)  # present, but the runs come first
    for session, shift in enumerate((0.0, 0.03, -0.02)):
        medians = list(0.1 * np.exp(shift + rng.normal(0, 0.01, 6)))
        floors = [m * 0.8 for m in medians]
        cells = [{"id": "smoke/y", "status": "ok",
                  "metrics": {"step_time": {"launch_medians": medians, "launch_floors": floors}}},
                 {"id": "smoke/once", "status": "ok", "metrics": {"step_time": {"value": 0.1}}},
                 {"id": "smoke/bad", "status": "error", "metrics": {"step_time": {"launch_medians": [1, 2]}}}]
        out = tmp_path / "runs" / f"night{session}"
        out.mkdir(parents=True)
        (out / "results.json").write_text(json.dumps({"schema": "perfsuite.results/1", "cells": cells}))
    (tmp_path / "runs" / "torn").mkdir()
    (tmp_path / "runs" / "torn" / "results.json").write_text("{not json")
    noise = history_detection.load_noise(tmp_path / "runs", tmp_path / "none")
    assert noise.cells == ["smoke/y"] and noise.values.size == 18 and len(noise.sessions) == 3
    assert noise.describe().startswith("3 runs' results.json under ") and "launch floors" in noise.describe()
    medians = history_detection.load_noise(tmp_path / "runs", tmp_path / "none", "median")
    assert np.allclose(medians.values, noise.values) and "launch medians" in medians.describe()
    assert 0.015 < noise.session_sd() < 0.05  # the shifts given, seen through 6 launches each
    assert abs(float(np.std(noise.within(), ddof=1)) - 0.01) < 0.005

# ------------------------------------------------------------------- PostgreSQL

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def postgres_url():
    """A PostgreSQL server for this module only, on a Unix socket in a temp dir."""
    # On PATH, else where Debian's postgresql packages put them (not on PATH).
    debian = os.pathsep.join(sorted(map(str, Path("/usr/lib/postgresql").glob("*/bin")), reverse=True))
    tools = {name: shutil.which(name) or shutil.which(name, path=debian) for name in ("initdb", "pg_ctl")}
    if not all(tools.values()):
        pytest.skip("no PostgreSQL server here (initdb, pg_ctl neither on PATH nor under /usr/lib/postgresql; "
                    "apt-get install postgresql): the PostgreSQL store is untested")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg is not installed: the PostgreSQL store is untested")
    root = Path(tempfile.mkdtemp(prefix="perfsuite-pg-"))  # not under pytest's root-only temp dir
    prefix = []
    if os.geteuid() == 0:  # initdb refuses root: run the server as the postgres user
        if not shutil.which("runuser"):
            pytest.skip("running as root without runuser: cannot start PostgreSQL as another user")
        prefix = ["runuser", "-u", "postgres", "--"]
        shutil.chown(root, "postgres")
    data, port = root / "data", _free_port()
    run = lambda *args: subprocess.run([*prefix, *args], capture_output=True, text=True, timeout=60)
    try:
        made = run(tools["initdb"], "-A", "trust", "-U", "perfsuite", "--no-sync", "-D", str(data))
        if made.returncode != 0:
            pytest.skip(f"initdb failed: {made.stderr.strip()[-300:]}")
        started = run(tools["pg_ctl"], "-D", str(data), "-l", str(root / "log"), "-w", "-o",
                      f"-F -p {port} -k {root} -c listen_addresses=''", "start")
        if started.returncode != 0:
            pytest.skip(f"PostgreSQL did not start: {started.stderr.strip()[-300:]}")
        yield f"postgresql://perfsuite@/postgres?host={root}&port={port}"
        run(tools["pg_ctl"], "-D", str(data), "-m", "immediate", "-w", "stop")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_postgresql_store(tmp_path, postgres_url, capsys):
    runs = [write_run(tmp_path, f"run{i:03d}", started=100.0 + i, step=0.1 if i < 10 else 0.12,
                      cells=CELLS[:1]) for i in range(16)]
    add_concurrently(postgres_url, [[*runs[:8], runs[15]], [*runs[8:15], runs[15]]], tmp_path / "barrier")
    with History(postgres_url, create=False) as store:
        assert store.version == history_schema.SCHEMA_VERSION and len(store.all_runs()) == 16
        assert not store.add_run(runs[3]).new
        [points] = store.series(cell=CELLS[0]).values()
    assert [p.commit for p in points] == [f"c{i:03d}" for i in range(16)]
    assert cli.main(["history", "changes", "--url", postgres_url]) == 1
    assert "first bad c010" in capsys.readouterr().out
