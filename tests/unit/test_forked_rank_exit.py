"""A forked rank ends as an exec'd one does once its record is written: the
threads and processes its workload left are no reason to hang, no process
outlives the launch, and it starts from a fresh interpreter's random state,
standard input and breakpoint (perfsuite/rank/forked.py, docs/explanation/failures.md)."""

import json
import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from perfsuite.cells import Cell
from perfsuite.judge.comparing import compare_runs
from perfsuite.launch import agent
from perfsuite.launch.launch import LaunchOptions, run_cell
from perfsuite.rank import forked, worker

LEAVER = '''
import json, multiprocessing, os, random, sys, threading, time
from pathlib import Path

from perfsuite.steps import Steps

HERE = Path(__file__).resolve().parent


def sleeper():
    time.sleep(600)


def leave(kinds):
    """Leave behind what a workload may: a thread, forked children, a daemon."""
    pids = []
    if "thread" in kinds:  # non-daemon: a fresh interpreter would join it at exit
        threading.Thread(target=sleeper, name="logger").start()
    if "fork" in kinds:
        pid = os.fork()
        if pid == 0:
            time.sleep(600)
            os._exit(0)
        pids.append(pid)
    if "setsid" in kinds:
        pid = os.fork()
        if pid == 0:
            os.setsid()
            time.sleep(600)
            os._exit(0)
        pids.append(pid)
    if "daemon" in kinds:  # double fork: the grandchild is no one's child the moment it exists
        r, w = os.pipe()
        if os.fork() == 0:
            os.setsid()
            grandchild = os.fork()
            if grandchild == 0:
                time.sleep(600)
                os._exit(0)
            os.write(w, str(grandchild).encode())
            os._exit(0)
        os.close(w)
        pids.append(int(os.read(r, 64)))
    if "mp" in kinds:  # a non-daemon multiprocessing child, forked
        child = multiprocessing.get_context("fork").Process(target=sleeper)
        child.start()
        pids.append(child.pid)
    return pids


def facts():
    import numpy
    import torch

    stdin = sys.stdin
    return {"torch": torch.rand(1).item(), "numpy": float(numpy.random.rand()), "random": random.random(),
            "stdin": [os.path.realpath("/proc/self/fd/0"), stdin.name, stdin.mode, stdin.encoding,
                      stdin.fileno(), stdin is sys.__stdin__, stdin.read(), stdin.closed]}


def run(cell, ctx):
    tag = ctx.options.get("tag", "x")
    record = {"facts": facts(), "pids": leave(ctx.options.get("leave", "").split(","))}
    (HERE / f"left-{tag}.json").write_text(json.dumps(record))
    steps = Steps(cell, ctx)
    for _ in steps(range(4), warmup=1):
        sum(range(1000))
    return steps.record()
'''


def leaver_cell() -> Cell:
    return Cell(tier="smoke", workload="leaver:run", strategy="ddp", device="cpu", world_size=1, precision="fp32",
                pin_memory=False, dataset="none", batch_size=1,
                timeout_s=60)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def gone_within(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:  # what the test found left, ended so that it does not outlive the test
        os.kill(pid, signal.SIGKILL)
    return left


@pytest.fixture
def leaver(tmp_path, monkeypatch):
    (tmp_path / "leaver.py").write_text(LEAVER)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    agent.close_zygotes()  # the zygote of this folder


def launch(folder: Path, start: str, tag: str, leave: str = "") -> tuple[dict, dict]:
    result = run_cell(leaver_cell(), folder / f"out-{tag}",
                      LaunchOptions(rank_start=start, options={"tag": tag, "leave": leave}))
    return result, json.loads((folder / f"left-{tag}.json").read_text())


@pytest.mark.slow
def test_a_forked_rank_leaving_threads_children_and_daemons_keeps_its_record_and_leaves_no_process(leaver):
    result, left = launch(leaver, "fork", "all", "thread,fork,setsid,daemon,mp")
    assert result["status"] == "ok", (result["reason"], result.get("output_tail"))
    assert result["info"]["rank_start"] == "fork" and result["metrics"]["step_time"]["n"] == 3
    assert len(left["pids"]) == 4
    assert gone_within(left["pids"], 5) == []


@pytest.mark.slow
def test_forked_ranks_start_from_fresh_random_state_and_the_stdin_of_an_execd_rank(leaver):
    _, first = launch(leaver, "fork", "one")
    _, second = launch(leaver, "fork", "two")  # the same zygote
    _, fresh = launch(leaver, "exec", "fresh")
    for name in ("torch", "numpy", "random"):
        assert first["facts"][name] != second["facts"][name], name
    assert first["facts"]["stdin"] == fresh["facts"]["stdin"]
    assert fresh["facts"]["stdin"][0] == os.devnull


def test_a_process_forked_from_a_rank_holds_none_of_the_pipes_the_rank_was_started_with():
    r, w = os.pipe()
    try:
        close = forked.inherited_pipes()
        pid = os.fork()
        if pid == 0:
            close()
            code = 0 if os.path.realpath(f"/proc/self/fd/{w}") == os.devnull else 1
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert os.readlink(f"/proc/self/fd/{w}").startswith("pipe:")  # the rank's own stays
    finally:
        os.close(r)
        os.close(w)


def test_forked_ranks_are_reseeded_as_a_fresh_interpreter_is():
    import numpy
    import torch

    before = (torch.random.get_rng_state().clone(), numpy.random.get_state()[1].copy())
    forked.reseed()
    assert not torch.equal(before[0], torch.random.get_rng_state())
    assert not (before[1] == numpy.random.get_state()[1]).all()


def test_breakpoint_in_a_rank_fails_with_a_sentence_unless_a_debugger_is_chosen(monkeypatch):
    monkeypatch.delenv("PYTHONBREAKPOINT", raising=False)
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(worker.RankBreakpoint, match=r"breakpoint\(\) in rank 1.*PYTHONBREAKPOINT"):
        worker.rank_breakpoint()
    monkeypatch.setenv("PYTHONBREAKPOINT", "0")  # breakpoints off, as Python's own hook reads it
    assert worker.rank_breakpoint() is None


AGENT = """
import os, sys, time
from perfsuite.launch import zygote

assert zygote.become_subreaper()
pid = os.fork()
if pid == 0:  # the rank: it starts a helper in a session of its own, then ends
    if os.fork() == 0:
        os.setsid()
        time.sleep(600)
        os._exit(0)
    os._exit(0)
os.waitpid(pid, 0)
time.sleep(0.2)
(helper,) = zygote._children()  # left to this process, the subreaper
print(helper, zygote.end_leftovers(grace_s=1.0) == [helper], flush=True)
"""


def test_the_agent_adopts_what_its_ranks_leave_and_ends_it():
    import subprocess

    done = subprocess.run([sys.executable, "-c", AGENT], capture_output=True, text=True, timeout=60)
    helper, ended = done.stdout.split()
    assert ended == "True", done.stderr
    assert not alive(int(helper))


def rank_started(start: str, rss: float) -> dict:
    cell = {"id": "smoke/x", "status": "ok", "info": {"rank_start": start},
            "metrics": {"step_time": {"value": 0.1, "unit": "s", "samples": [0.1] * 10},
                        "peak_rss": {"value": rss, "unit": "bytes"}}}
    return {"schema": "x", "env": {}, "cells": [cell]}


def test_compare_says_the_runs_started_ranks_differently_and_judges_no_peak_rss_across_them():
    verdicts = compare_runs(rank_started("fork", 1e9), rank_started("exec", 1.64e9), allow_other_hardware=True)
    rss = [v for v in verdicts if v["name"].startswith("peak") or v.get("metric") == "peak_rss"]
    assert rss and all(v["verdict"] == "skipped" for v in rss), rss
    assert "forked" in rss[0]["message"] and "--rank-start" in rss[0]["message"]
    notes = [v for v in verdicts if v["name"] == "rank_start"]
    assert notes and "run A" in notes[0]["message"] and "exec" in notes[0]["message"]
    same = compare_runs(rank_started("fork", 1e9), rank_started("fork", 1.64e9), allow_other_hardware=True)
    assert not [v for v in same if v["name"] == "rank_start"]
    assert [v["verdict"] for v in same if v.get("metric") == "peak_rss"] == ["regressed"]
