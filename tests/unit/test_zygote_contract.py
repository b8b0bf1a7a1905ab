"""What runs once in the zygote and what in every rank
(docs/explanation/launching.md), and where a launch says which it ran."""

import json
import os
import sys
from pathlib import Path

import pytest
from cellkit import tiny_image_cell

from perfsuite.doctor import checks
from perfsuite.doctor import facts as doctor_facts
from perfsuite.launch import agent, starting
from perfsuite.launch.launch import LaunchOptions, run_cell

# Start-up code that reads the rank at import, as a per-rank hook keyed on RANK would.
SITECUSTOMIZE = """
import os
with open(os.environ["PERFSUITE_TEST_SITE_LOG"], "a") as log:
    log.write(f"{os.getpid()} {os.environ.get('RANK', '-')}\\n")
"""


@pytest.fixture
def own_pool(monkeypatch):
    """This test's zygotes, ended after it, the launcher's own left alone."""
    pool = agent.ZygotePool()
    monkeypatch.setattr(agent, "POOL", pool)
    yield pool
    pool.close()


def imports_seen(log: Path) -> dict[int, str]:
    """pid -> the RANK the sitecustomize saw as that process imported it."""
    return {int(pid): rank for pid, rank in (line.split() for line in log.read_text().splitlines())}


@pytest.mark.slow
def test_start_up_code_reading_the_rank_runs_once_in_the_zygote_when_ranks_fork_in_each_rank_when_they_exec(
        tmp_path, own_pool):
    site, log = tmp_path / "site", tmp_path / "imports.log"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {"PYTHONPATH": os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])]),
           "PERFSUITE_TEST_SITE_LOG": str(log)}
    cell = tiny_image_cell(world_size=1)
    results = {start: run_cell(cell, tmp_path / start, LaunchOptions(rank_start=start, env=env))
               for start in ("fork", "exec")}
    for start, result in results.items():
        assert result["status"] == "ok", result.get("output_tail")
        assert result["info"]["rank_start"] == start and result["info"]["rank_start_means"] == starting.MEANS[start]
    rank_pid = {start: json.loads((Path(r["dir"]) / "rank0.json").read_text())["pid"] for start, r in results.items()}
    seen = imports_seen(log)
    # fork: the zygote ran it once, before any rank existed; the forked rank never did
    (zygote,) = own_pool.zygotes.values()  # the exec launch's agent was its fork too
    assert seen[zygote.pid] == "-" and rank_pid["fork"] not in seen
    assert list(seen.values()).count("0") == 1  # exec's rank only
    assert results["fork"]["info"]["ran_once"] == {"sitecustomize": str(site / "sitecustomize.py")}
    # exec: a fresh interpreter ran it with its own RANK
    assert seen[rank_pid["exec"]] == "0" and "ran_once" not in results["exec"]["info"]


def test_doctor_says_which_rank_start_its_launch_ran_and_what_it_means(monkeypatch):
    monkeypatch.setattr(doctor_facts, "tiny_launch", lambda device: {"status": "ok", "wall_s": 3.0, "device": device})
    monkeypatch.delenv("PERFSUITE_RANK_START", raising=False)
    forked = checks.check_launch({"count": 0}, "smoke")
    assert forked.status == checks.OK and "worked (3.0 s)" in forked.message
    assert "ranks start by fork" in forked.message and "without RANK" in forked.message
    assert "--rank-start exec" in forked.message
    # the zygote failed: the launch fell back to fresh interpreters and says why
    monkeypatch.setitem(agent.POOL.failed, agent.ZygotePool.key(sys.executable, dict(os.environ)), "no zygote: x")
    assert "ranks start by exec" in checks.check_launch({"count": 0}, "smoke").message
    assert "(no zygote: x)" in checks.check_launch({"count": 0}, "smoke").message
    monkeypatch.setenv("PERFSUITE_RANK_START", "exec")
    fresh = checks.check_launch({"count": 0}, "smoke")
    assert "ranks start by exec" in fresh.message and "with its RANK" in fresh.message
