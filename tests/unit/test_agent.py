"""torchrun's agent forked from the launcher: when it is, and that it is torchrun."""

import os
import subprocess
import sys

import pytest

from perfsuite.launch import agent

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def test_only_this_interpreters_plain_torchrun_is_forked(monkeypatch):
    assert agent.can_fork([*TORCHRUN, "--standalone", "-m", "perfsuite.rank.worker"])
    assert not agent.can_fork(["/other/venv/bin/python", "-m", "torch.distributed.run"])
    assert not agent.can_fork(["srun", "--ntasks-per-node=1", *TORCHRUN])
    monkeypatch.setenv("PERFSUITE_FORK_AGENT", "0")
    assert not agent.can_fork([*TORCHRUN, "--standalone"])


def test_a_forked_agent_runs_torchrun_with_its_own_session_log_and_environment(tmp_path):
    log = tmp_path / "output.log"
    script = ("import os; print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], 'sees', "
              "os.environ['PERFSUITE_TEST_VALUE'], 'in session', os.getsid(0), flush=True)")
    argv = [*TORCHRUN, "--standalone", "--nproc-per-node=1", "--max-restarts=0", "--no-python",
            sys.executable, "-c", script]
    with open(log, "wb") as out:
        proc = agent.ForkedAgent(argv, out.fileno(), {**os.environ, "PERFSUITE_TEST_VALUE": "42"})
        assert proc.wait(timeout=120) == 0 and proc.returncode == 0
    text = log.read_text()
    assert "rank 0 of 1 sees 42 in session" in text
    assert f"in session {os.getsid(0)}\n" not in text  # not the launcher's session
    assert "PERFSUITE_TEST_VALUE" not in os.environ  # the launcher's own environment is untouched


def test_a_failing_agent_reports_its_exit_code_and_wait_times_out(tmp_path):
    with open(tmp_path / "log", "wb") as out:
        bad = agent.ForkedAgent([*TORCHRUN, "--no-such-flag"], out.fileno(), dict(os.environ))
        assert bad.wait(timeout=120) == 2  # argparse's usage error
        slow = agent.ForkedAgent([*TORCHRUN, "--standalone", "--nproc-per-node=1", "--no-python",
                                  "sleep", "30"], out.fileno(), dict(os.environ))
        with pytest.raises(subprocess.TimeoutExpired):
            slow.wait(timeout=0.5)
        assert os.getsid(slow.pid) == slow.pid  # the agent leads a session of its own
        os.killpg(slow.pid, 9)
        assert slow.wait(timeout=30) == -9
    assert "torchrun: error:" in (tmp_path / "log").read_text()
