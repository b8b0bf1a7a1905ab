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

from perfsuite.cli import history as cli_history
from perfsuite.cli import main as cli
from perfsuite.hardware import profile_id
from perfsuite.history import changes as history_changes
from perfsuite.history import detection as history_detection
from perfsuite.history import rows as history_rows
from perfsuite.history import schema as history_schema
from perfsuite.history import store as history
from perfsuite.history.store import History, HistoryError, record_run_in_history

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
              allreduce=2, status="ok", options=None):
    results = [cell_result(c, step, repeats=repeats, allreduce=allreduce, env=env, status=status) for c in cells]
    for r in results:
        if r["repeats"] is None:
            del r["repeats"]
        if options:  # as a launch passes workload options to its ranks
            r["argv"] = ["python", "-m", "perfsuite.rank.worker", *[a for k, v in options.items()
                                                               for a in ("--option", f"{k}={v}")]]
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
    assert history_rows.run_value(step["value"], step["launches"], statistic="floor") == pytest.approx(0.1005 * 0.97)


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
    from perfsuite import hardware
    from perfsuite.schemas import results
    from perfsuite.history.store import record_run_in_history
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
        [[point]] = store.series(cell="smoke/a", launch_statistic="floor").values()
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
    assert cli.main(["history", "show", CELLS[0], "--url", url, "--launch-statistic", "floor"]) == 0  # 0.0995, 0.3 * 1.005 * 0.97
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
    monkeypatch.delenv("PERFSUITE_HISTORY", raising=False)  # the built-in default, as a user has it
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
    run_parser = next(a for a in cli.build_parser()._actions if a.dest == "command").choices["run"]
    assert tuple(next(a for a in run_parser._actions if a.dest == "history_purpose").choices) == (
        cli_history.PURPOSES) == history_schema.PURPOSES


# ------------------------------------------------------------------- purposes

def purposes(url):
    """Each stored run's purpose and options, by the name of its folder."""
    def name(source):
        return Path(source).parent.name if Path(source).name == "results.json" else Path(source).name

    return {name(r["source"]): (r["purpose"], r["options"]) for r in rows(url, history_schema.runs)}


def test_the_purpose_rule(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PERFSUITE_HISTORY", raising=False)
    rule = history.run_purpose
    assert rule({"fault": "slow:0:5:0.5"}, declared="run") == history.Purpose(
        "experiment", "fault=slow:0:5:0.5", declared=True)  # a fault never measures the code as it is
    assert rule({"count_steps": "0", "llm_model": "tiny"}) == history.Purpose(
        "experiment", "count_steps=0, llm_model=tiny")
    assert rule({"llm_checkpoint_dir": "/models/llama3-8b"}, declared="run").name == "run"
    # the default store keeps the runs written beside it, under .perfsuite/
    assert rule(out_dir=Path(".perfsuite") / "run-1", store_named=False).name == "run"
    assert rule(out_dir=tmp_path / ".perfsuite" / "smoke", store_named=False).name == "run"
    look = rule(out_dir=tmp_path / "one", store_named=False)
    assert look.name == "ad-hoc" and f"its output folder {tmp_path / 'one'} is outside .perfsuite/" in look.why
    assert rule(out_dir=tmp_path / "one", store_named=True).name == "run"  # a store named for it: meant
    assert rule(out_dir=tmp_path / "one", store_named=False, declared="run").name == "run"
    assert not history.store_named(None) and history.store_named("h.sqlite")
    monkeypatch.setenv("PERFSUITE_HISTORY", str(tmp_path / "team.sqlite"))
    assert history.store_named(None)
    with pytest.raises(HistoryError, match="purpose 'nightly': expected one of run, experiment, ad-hoc"):
        rule(declared="nightly")
    assert history.parse_include(["experiment,ad-hoc", "experiment"]) == ("experiment", "ad-hoc")
    assert history.parse_include("all") == ("experiment", "ad-hoc") and history.parse_include(None) == ()
    with pytest.raises(ValueError, match="--include tried: expected experiment, ad-hoc or all"):
        history.parse_include("tried")


def test_a_run_is_stored_with_its_purpose_and_its_line_says_so(tmp_path):
    url = url_of(tmp_path)
    line = record_run_in_history(write_run(tmp_path, "fault", started=1.0, options={"fault": "slow:0:5:0.5"}),
                                 url, commit="abc")
    assert line.endswith(" as an experiment (fault=slow:0:5:0.5): `perfsuite history changes` leaves it "
                         "out; --include experiment shows it")
    line = record_run_in_history(write_run(tmp_path, "option", started=2.0, options={"count_steps": "0"}),
                                 url, commit="abc")
    assert " as an experiment (count_steps=0): " in line
    line = record_run_in_history(write_run(tmp_path, "look", started=3.0), url, commit="abc",
                                 purpose=history.run_purpose(out_dir=tmp_path / "look", store_named=False,
                                                             cwd=tmp_path / "checkout"))
    assert f" as ad-hoc (its output folder {tmp_path / 'look'} is outside .perfsuite/" in line
    assert "--include ad-hoc shows it" in line
    plain = record_run_in_history(write_run(tmp_path, "plain", started=4.0), url, commit="abc")
    assert " as " not in plain and plain.endswith(f"in {history_schema.resolve_url(url)}")
    assert purposes(url) == {"fault": ("experiment", {"fault": "slow:0:5:0.5"}),
                             "option": ("experiment", {"count_steps": "0"}), "look": ("ad-hoc", {}),
                             "plain": ("run", {})}


def test_history_add_marks_a_run_and_marks_one_stored_before_anew(tmp_path, capsys):
    url = url_of(tmp_path)
    run = write_run(tmp_path, "one", started=1.0)
    assert cli.main(["history", "add", str(run), "--url", url, "--commit", "abc", "--purpose", "ad-hoc"]) == 0
    assert capsys.readouterr().out.strip().endswith(
        " as ad-hoc: `perfsuite history changes` leaves it out; --include ad-hoc shows it")
    assert cli.main(["history", "add", str(run), "--url", url]) == 0  # nothing asked: kept as it is
    assert capsys.readouterr().out.strip().endswith(" as ad-hoc; kept once")
    assert cli.main(["history", "add", str(run), "--url", url, "--purpose", "run"]) == 0  # meant after all
    assert capsys.readouterr().out.strip().endswith("; kept once, now marked run (was ad-hoc)")
    assert purposes(url) == {"one": ("run", {})}
    tried = write_run(tmp_path, "tried", started=2.0, options={"fault": "hang:1:3"})
    assert cli.main(["history", "add", str(tried), "--url", url, "--commit", "abc", "--purpose", "run"]) == 0
    assert " as an experiment (fault=hang:1:3): " in capsys.readouterr().out
    assert purposes(url)["tried"] == ("experiment", {"fault": "hang:1:3"})
    with pytest.raises(SystemExit):
        cli.main(["history", "add", str(run), "--url", url, "--purpose", "nightly"])


def test_tried_runs_leave_a_commits_value_and_its_changes_alone_unless_included(tmp_path, capsys):
    """Runs meant, then the same commits tried: a slow fault injected, a look
    at one cell from elsewhere. What the history says of the code is the
    runs' alone."""
    url = url_of(tmp_path)
    build_series(tmp_path, url, [0.1] * 12)
    with History(url) as store:
        for i in range(6, 12):
            store.add_run(write_run(tmp_path / "tried", f"slow{i}", started=1000.0 * (i + 1) + 5, step=0.2,
                                    cells=CELLS[:1], options={"fault": "slow:0:3:1.0"}), commit=sha(i))
        store.add_run(write_run(tmp_path / "tried", "look", started=12_900.0, step=0.05, cells=CELLS[:1]),
                      commit=sha(11), purpose="ad-hoc")
        [points] = store.series(cell=CELLS[0]).values()
        [tried] = store.series(cell=CELLS[0], include=("experiment", "ad-hoc")).values()
        assert store.left_out(cell=CELLS[0]) == {"ad-hoc": 1, "experiment": 6}
        assert store.left_out(cell=CELLS[0], include=("ad-hoc",)) == {"experiment": 6}
        assert store.left_out(cell=CELLS[1]) == {}
    assert [p.purposes for p in points] == [["run"]] * 12
    assert points[11].value == pytest.approx(0.1 * 0.995, rel=0.02)  # the run's floor, nothing else
    assert tried[11].purposes == ["run", "experiment", "ad-hoc"] and tried[6].value > 0.14

    assert cli.main(["history", "changes", "--url", url]) == 0
    out = capsys.readouterr().out
    assert "0 change point(s) in 1 series" in out
    assert out.strip().endswith("left out: 1 ad-hoc run(s), 6 experiment run(s) (--include ad-hoc,experiment "
                                "takes them)")
    assert cli.main(["history", "changes", "--url", url, "--include", "experiment"]) == 1  # the fault's step
    assert "REGRESSED at head" in capsys.readouterr().out
    assert cli.main(["history", "changes", "--url", url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["left_out"] == {"ad-hoc": 1, "experiment": 6}

    assert cli.main(["history", "show", CELLS[0], "--url", url]) == 0
    out = capsys.readouterr().out
    assert "[experiment" not in out and "(2 runs)" not in out and "left out: 1 ad-hoc run(s)" in out
    assert cli.main(["history", "show", CELLS[0], "--url", url, "--include", "all"]) == 0
    out = capsys.readouterr().out
    assert f"{sha(11)[:12]}" in out and "(3 runs) [ad-hoc, experiment]" in out and "left out" not in out
    assert cli.main(["history", "show", CELLS[0], "--url", url, "--include", "tried"]) == 2
    assert "--include tried: expected" in capsys.readouterr().err

    only_tried = tmp_path / "only-tried.sqlite"
    with History(only_tried) as store:
        store.add_run(write_run(tmp_path / "tried", "x", started=1.0, cells=CELLS[:1],
                                options={"fault": "slow:0:3:1.0"}), commit=sha(0))
    assert cli.main(["history", "show", CELLS[0], "--url", str(only_tried)]) == 2  # says where its runs are
    assert "left out: 1 experiment run(s) (--include experiment takes them)" in capsys.readouterr().err


def test_PERFSUITE_HISTORY_is_the_store_used_when_none_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PERFSUITE_HISTORY", str(tmp_path / "team.sqlite"))
    assert history_schema.resolve_url(None) == f"sqlite:///{tmp_path / 'team.sqlite'}"
    assert cli.main(["history", "add", str(write_run(tmp_path, "one", started=1.0))]) == 0
    assert f"in sqlite:///{tmp_path / 'team.sqlite'}" in capsys.readouterr().out
    assert cli.main(["history", "show", CELLS[0]]) == 0
    assert not (tmp_path / ".perfsuite").exists()


def test_a_session_is_stored_with_the_purpose_its_options_and_output_folder_give(tmp_path, fake, monkeypatch,
                                                                                capsys):
    """``perfsuite run`` and the pytest plugin add a session through
    ``Runner.add_to_history``; its launches here are conftest's fake ones."""
    from perfsuite.launch.launch import LaunchOptions
    from perfsuite.runner import Runner
    from tests.unit.cellkit import tiny_image_cell

    checkout = tmp_path / "checkout"
    checkout.mkdir()
    _git(checkout, "init", "-q", "-b", "main")
    _git(checkout, "commit", "-q", "--allow-empty", "-m", "one")
    monkeypatch.chdir(checkout)
    monkeypatch.delenv("PERFSUITE_HISTORY", raising=False)  # the built-in default store, as a user has it
    (tmp_path / "none").mkdir()

    def stored(out, url=None, purpose=None, **options):
        runner = Runner(out, LaunchOptions(options=options), probe=False, baselines=tmp_path / "none")
        runner.history_purpose = purpose
        runner.result(tiny_image_cell(world_size=1))
        try:
            return runner.add_to_history(url)
        finally:
            runner.end()

    default = checkout / ".perfsuite" / "history.sqlite"
    assert stored(Path(".perfsuite") / "nightly").endswith(f"in sqlite:///{default}")  # a run: said as before
    assert stored(Path(".perfsuite") / "tried", fault="slow:0:5:0.5").endswith(
        f"in sqlite:///{default} as an experiment (fault=slow:0:5:0.5): `perfsuite history changes` leaves "
        "it out; --include experiment shows it")
    assert " as an experiment (count_steps=0): " in stored(Path(".perfsuite") / "counted", count_steps="0")
    assert f" as ad-hoc (its output folder {tmp_path / 'one'} is outside .perfsuite/" in stored(tmp_path / "one")
    assert " as " not in stored(tmp_path / "meant", purpose="run")
    team = tmp_path / "team.sqlite"
    assert stored(tmp_path / "two", url=str(team)).endswith(f"in sqlite:///{team}")  # its store named: meant
    assert {name: purpose for name, (purpose, _) in purposes(default).items()} == {
        "nightly": "run", "tried": "experiment", "counted": "experiment", "one": "ad-hoc", "meant": "run"}
    assert cli.main(["history", "changes"]) == 0
    assert "left out: 1 ad-hoc run(s), 2 experiment run(s)" in capsys.readouterr().out


def test_history_off_in_the_environment_keeps_no_history(tmp_path, fake, monkeypatch, capsys):
    """$PERFSUITE_HISTORY=off means what --history off means: a session is
    kept nowhere (it once made an SQLite file named "off"), and a history
    command without a store says which to name."""
    from perfsuite.launch.launch import LaunchOptions
    from perfsuite.runner import Runner
    from tests.unit.cellkit import tiny_image_cell

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PERFSUITE_HISTORY", "off")
    (tmp_path / "none").mkdir()
    runner = Runner(tmp_path / "out", LaunchOptions(), probe=False, baselines=tmp_path / "none")
    runner.result(tiny_image_cell(world_size=1))
    try:
        assert runner.add_to_history(None) is None
    finally:
        runner.end()
    assert history.check_store_usable(None) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["none", "out"]
    with pytest.raises(HistoryError, match=r"\$PERFSUITE_HISTORY is off.*--history"):
        history_schema.resolve_url(None)
    assert cli.main(["history", "show", CELLS[0]]) == 2
    assert "$PERFSUITE_HISTORY is off" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["none", "out"]


def v1_layout(path):
    """Bring a store back to layout version 1: runs without purpose and options."""
    with sqlite3.connect(path) as conn:
        conn.execute("ALTER TABLE runs DROP COLUMN purpose")
        conn.execute("ALTER TABLE runs DROP COLUMN options")
        conn.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    conn.close()


def test_a_version_1_store_marks_its_runs_by_the_rule_when_migrated(tmp_path):
    checkout = tmp_path / "checkout"
    runs = {"nightly": write_run(checkout / ".perfsuite", "nightly", started=1.0),
            "one": write_run(tmp_path, "one", started=2.0),  # perfsuite run CELL --out elsewhere
            "tried": write_run(checkout / ".perfsuite", "tried", started=3.0, options={"fault": "slow:0:5:0.5"}),
            "gone": write_run(checkout / ".perfsuite", "gone", started=4.0, options={"fault": "slow:0:5:0.5"})}
    default, team = checkout / ".perfsuite" / "history.sqlite", tmp_path / "team.sqlite"
    for store in (default, team):
        with History(store) as history:
            for run in runs.values():
                history.add_run(run, commit="abc")
        v1_layout(store)
    shutil.rmtree(runs["gone"])  # its results.json is gone: nothing tells it was tried
    with History(default) as history:
        assert history.version == history_schema.SCHEMA_VERSION == 2
    assert purposes(default) == {"nightly": ("run", {}), "one": ("ad-hoc", {}),
                                 "tried": ("experiment", {"fault": "slow:0:5:0.5"}), "gone": ("run", {})}
    with History(team) as history:  # not perfsuite's default store: no folder tells a look from a run
        assert history.version == 2
    assert {name: purpose for name, (purpose, _) in purposes(team).items()} == {
        "nightly": "run", "one": "run", "tried": "experiment", "gone": "run"}


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

def test_detection_leaves_out_runs_tried_or_stored_for_another_purpose(tmp_path, capsys):
    rng = np.random.default_rng(9)

    def night(name, shift, **kw):
        medians = list(0.1 * np.exp(shift + rng.normal(0, 0.01, 6)))
        path = write_run(tmp_path / "runs", name, started=float(len(name)) + shift, cells=CELLS[:1], **kw)
        data = json.loads((path / "results.json").read_text())
        data["cells"][0]["metrics"]["step_time"].update(launch_medians=medians,
                                                        launch_floors=[m * 0.9 for m in medians])
        (path / "results.json").write_text(json.dumps(data))
        return path

    for k, shift in enumerate((0.0, 0.02, -0.01)):
        night(f"night{k}", shift)
    night("slow", 0.5, options={"fault": "slow:0:3:1.0"})
    look = night("look", 0.3)
    store = url_of(tmp_path)
    with History(store) as stored:
        stored.add_run(look, commit="abc", purpose="ad-hoc")
    noise = history_detection.load_noise(tmp_path / "runs", tmp_path / "none", url=store)
    assert noise.values.size == 18 and "1 ad-hoc run(s) left out; 1 experiment run(s) left out" in noise.source
    everything = history_detection.load_noise(tmp_path / "runs", tmp_path / "none", url=store,
                                              include=("experiment", "ad-hoc"))
    assert everything.values.size == 30 and "left out" not in everything.source
    assert cli.main(["history", "detection", "--series", "2", "--launches", "2", "--runs-dir", str(tmp_path / "runs"),
                     "--baselines", str(tmp_path / "none"), "--url", store, "--include", "experiment"]) == 0
    out = capsys.readouterr().out
    assert "24 launches of" in out and "1 ad-hoc run(s) left out" in out and "experiment run(s)" not in out


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


def test_a_version_1_postgresql_store_is_migrated(tmp_path, postgres_url):
    admin = sa.create_engine(history_schema.resolve_url(postgres_url), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql("CREATE DATABASE layout_v1")
    admin.dispose()
    url = postgres_url.replace("/postgres?", "/layout_v1?")
    with History(url) as store:
        store.add_run(write_run(tmp_path, "tried", started=1.0, options={"fault": "slow:0:5:0.5"}), commit="abc")
        store.add_run(write_run(tmp_path, "plain", started=2.0), commit="abc")
    engine = sa.create_engine(history_schema.resolve_url(url))
    with engine.begin() as conn:  # back to version 1: runs without purpose and options
        conn.exec_driver_sql("ALTER TABLE runs DROP COLUMN purpose")
        conn.exec_driver_sql("ALTER TABLE runs DROP COLUMN options")
        conn.exec_driver_sql("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    engine.dispose()
    with History(url, create=False) as store:
        assert store.version == history_schema.SCHEMA_VERSION
    assert purposes(url) == {"tried": ("experiment", {"fault": "slow:0:5:0.5"}), "plain": ("run", {})}


@pytest.mark.parametrize("folder", ["feature%2Fx", "what?q=1", "issue#7", "space d", "ünï"])
def test_a_store_path_is_a_path_never_an_url(tmp_path, folder):
    """A Jenkins workspace named feature%2Fx: the store lands where the path
    says, not URL-decoded elsewhere, and a '?' or '#' is part of the name."""
    path = tmp_path / folder / "history.sqlite"
    url = history_schema.resolve_url(path)
    assert history_schema.sqlite_file(url) == path.resolve()
    with History(url) as history:
        assert history.url == url
    assert path.is_file() and sorted(p.name for p in tmp_path.iterdir()) == [folder]
