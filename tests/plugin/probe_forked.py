"""The hostile probe's cases: forked ranks behave as exec'd ones (torchrun's)
do: a rank that leaves threads, forked children or daemons ends once its
record is written and leaves no process; forked ranks start from a fresh
interpreter's random state and standard input; breakpoint() says why it
cannot stop there; compare says where two runs started ranks differently."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.plugin.probekit import BENCHMARKS, Case, two_runs

# ---------------------------------------------------------------- the launched session's own checks
# (kinds 6-9 of the probe's own workload, test_hostile_probe.WORKLOAD)


def facts(t: Path, kind: int) -> dict:
    return json.loads((t / f"facts-{kind}.json").read_text())


def stdin_as_execd(t: Path, text: str) -> None:
    """A forked rank's stdin is an exec'd rank's: fd 0 on /dev/null, Python's
    own sys.stdin on it, at end of file."""
    assert facts(t, 6)["stdin"] == [os.devnull, "<stdin>", True, ""]


def random_state_fresh(t: Path, text: str) -> None:
    """Two launches forked from one zygote draw differently (torch, numpy)."""
    first, second = facts(t, 6), facts(t, 7)
    assert first["torch"] != second["torch"] and first["numpy"] != second["numpy"], (first, second)


def atexit_as_documented(t: Path, text: str) -> None:
    """A rank ends with os._exit, forked or exec'd: no atexit handler runs,
    as docs/explanation/failures.md says."""
    assert not (t / "atexit-6.txt").exists() and not (t / "atexit-7.txt").exists()
    doc = (Path(__file__).parents[2] / "docs" / "explanation" / "failures.md").read_text()
    assert "## What forked ranks promise" in doc and "atexit" in doc


# ---------------------------------------------------------------- compare across rank starts

def started(start: str | None, rss: float = 1e9):
    def change(data: dict) -> None:
        cell = data["cells"][0]
        if start is not None:
            cell["info"]["rank_start"] = start
        cell["metrics"]["peak_rss"]["value"] = rss
    return change


# ---------------------------------------------------------------- a user's perf_ranks test

USER_TEST = '''
import os
import threading
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.mark.perf_ranks(1, timeout=120)
def test_leaves_a_thread_and_children(perf_dist, perf_steps):
    threading.Thread(target=time.sleep, args=(600,)).start()  # not a daemon
    pids = []
    for new_session in (False, True):
        pid = os.fork()
        if pid == 0:
            if new_session:
                os.setsid()
            time.sleep(600)
            os._exit(0)
        pids.append(pid)
    (HERE / "helpers-userfork.txt").write_text(" ".join(map(str, pids)))
    for _ in perf_steps(range(8), warmup=2):
        sum(range(1000))
'''


def user_cell_kept(t: Path, text: str) -> None:
    from perfsuite.schemas import results
    from tests.plugin.test_hostile_probe import helpers_gone

    (cell,) = results.load(t / "out")["cells"]
    assert cell["status"] == "ok", cell["reason"]
    assert cell["info"]["rank_start"] == "fork" and cell["metrics"]["step_time"]["n"] == 6
    helpers_gone(t, "userfork")


CASES: list[Case] = [
    # -- a forked rank that leaves threads, children or daemons (the shared `perfsuite run` session)
    Case("forked-rank-leaves-a-non-daemon-thread", "launched", code=1, cell=6,
         says=("smoke/probework:run/c1/fp32/batch_size=6  OK",)),
    Case("forked-rank-leaves-an-os-fork-and-a-multiprocessing-child", "launched", code=1, cell=7,
         says=("smoke/probework:run/c1/fp32/batch_size=7  OK",)),
    Case("forked-rank-leaves-a-setsid-child-and-a-double-forked-daemon", "launched", code=1, cell=8,
         says=("smoke/probework:run/c1/fp32/batch_size=8  OK",)),
    Case("forked-rank-calls-breakpoint", "launched", code=1, cell=9,
         says=("smoke/probework:run/c1/fp32/batch_size=9", "breakpoint() in rank 0", "PYTHONBREAKPOINT")),
    Case("forked-rank-reads-stdin", "launched", code=1, cell=6, check=stdin_as_execd),
    Case("forked-ranks-of-two-launches-draw-differently", "launched", code=1, cell=7, check=random_state_fresh),
    Case("forked-rank-registers-an-atexit-handler", "launched", code=1, cell=6, check=atexit_as_documented),
    # -- a user's perf_ranks test that leaves a thread and forked children
    Case("user-test-leaves-a-thread-and-forked-children", "pytest", code=0, launches=True,
         argv=("--perf-out", "{t}/out", "--perf-no-probe", "--perf-history", "off"),
         says=("user/test_userfork.py::test_leaves_a_thread_and_children/c1",),
         files={"test_userfork.py": USER_TEST},
         writes=("out", "helpers-userfork.txt", BENCHMARKS), check=user_cell_kept),
    # -- compare across rank starts (run files as perfsuite writes them)
    Case("compare-forked-run-against-execd-run", "cli", ("compare", "{t}/a", "{t}/b"), 0,
         ("run A's ranks started by fork, run B's by exec", "peak_rss not judged", "--rank-start"),
         two_runs(started("fork"), started("exec", 1.64e9))),
    Case("compare-execd-run-against-forked-run", "cli", ("compare", "{t}/a", "{t}/b"), 0,
         ("run A's ranks started by exec, run B's by fork",),
         two_runs(started("exec", 1.64e9), started("fork"))),
    Case("compare-two-forked-runs-judges-peak-rss", "cli", ("compare", "{t}/a", "{t}/b"), 1,
         ("peak_rss", "REGRESSED"), two_runs(started("fork"), started("fork", 1.64e9))),
    Case("compare-a-run-that-does-not-say-its-rank-start", "cli", ("compare", "{t}/a", "{t}/b"), 1,
         ("peak_rss", "REGRESSED"), two_runs(started(None), started("exec", 1.64e9))),
]
