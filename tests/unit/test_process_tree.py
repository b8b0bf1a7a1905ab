"""A launch ends every process it started, not only its ranks: real processes.

A rank's helper outlives the rank unless someone ends it: a plain child, one
that ignores SIGTERM, a grandchild, one that left the rank's session
(setsid), one whose parent exited (re-parented to init). The launcher's
stand-in agent here starts them all the way a rank would, then exits
normally, as a passing launch does.
"""

import os
import subprocess
import sys
import time
import uuid

import psutil
import pytest
from cellkit import survivors

from perfsuite.launch import launch

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="/proc and sessions are Linux's")

SLEEPER = "import signal, sys, time\n{ignore}time.sleep(600)  # {marker}\n"

AGENT = """
import subprocess, sys, time
py, marker = sys.executable, sys.argv[1]
sleep = "import time; time.sleep(600)  # " + marker
stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)  # " + marker
subprocess.Popen([py, "-c", sleep, marker])                                   # a plain child
subprocess.Popen([py, "-c", stubborn, marker])                                # ignores SIGTERM
subprocess.Popen([py, "-c", "import subprocess, sys, time; "                  # a grandchild
                  "subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]]); time.sleep(600)",
                  sleep, marker])
subprocess.Popen([py, "-c", sleep, marker], start_new_session=True)           # its own session
subprocess.Popen([py, "-c", "import subprocess, sys; "                        # an orphan at once
                  "subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]])",
                  sleep, marker]).wait()
time.sleep(float(sys.argv[2]))
"""


def _agent(tmp_path, marker, seconds, env):
    return subprocess.Popen([sys.executable, "-c", AGENT, marker, str(seconds)], env=env,
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _until(predicate, timeout):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def _cleanup(marker):
    for pid in survivors(marker):
        try:
            os.kill(pid, 9)
        except OSError:
            pass


def _launch_env(token):
    return {**os.environ, "PERFSUITE_RUN_TOKEN": token, "PERFSUITE_LAUNCHER_PID": str(os.getpid())}


def test_every_process_a_launch_started_ends_with_it_after_a_normal_exit(tmp_path):
    marker, token = f"leftover-{uuid.uuid4().hex}", uuid.uuid4().hex
    proc = _agent(tmp_path, marker, 3, _launch_env(token))
    try:
        seen = {}
        # what the launcher sees while it waits: some of them only then (the orphan's parent is gone)
        assert launch._wait(proc, 60, None, tmp_path, None, seen=seen) == 0
        assert len(survivors(marker)) == 6
        began = time.monotonic()
        launch._end_process_tree(proc, dump_stacks=False, marks=launch.launch_marks(token), seen=seen)
        assert survivors(marker) == [], "left behind"
        assert time.monotonic() - began < launch.LEFTOVER_GRACE_S + 3  # the stubborn one: SIGKILL
    finally:
        _cleanup(marker)
        proc.wait()


def test_a_process_that_left_the_tree_and_hid_its_environment_is_ended_if_it_was_seen(tmp_path):
    marker, token = f"hidden-{uuid.uuid4().hex}", uuid.uuid4().hex
    hider = ("import os, subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
             "'import time; time.sleep(600)', sys.argv[1]], env={}, start_new_session=True); "
             "time.sleep(2)")
    proc = subprocess.Popen([sys.executable, "-c", hider, marker], env=_launch_env(token),
                            start_new_session=True)
    try:
        seen = {}
        assert launch._wait(proc, 60, None, tmp_path, None, seen=seen) == 0
        assert len(survivors(marker)) == 1  # re-parented, its own session, no token: only seen
        launch._end_process_tree(proc, dump_stacks=False, marks=launch.launch_marks(token), seen=seen)
        assert survivors(marker) == []
    finally:
        _cleanup(marker)


def test_the_end_of_a_launch_leaves_other_launches_and_reused_pids_alone(tmp_path):
    marker, token = f"other-{uuid.uuid4().hex}", uuid.uuid4().hex
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", marker],
                             env=_launch_env(uuid.uuid4().hex))  # another launch of this launcher
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", marker],
                                env={**os.environ, "PERFSUITE_RUN_TOKEN": token,
                                     "PERFSUITE_LAUNCHER_PID": "1"})  # the same token, another launcher's
    proc = subprocess.Popen(["true"], env=_launch_env(token), start_new_session=True)
    proc.wait()
    try:
        seen = {os.getpid(): psutil.Process()}  # never the launcher itself
        launch._end_process_tree(proc, dump_stacks=False, marks=launch.launch_marks(token), seen=seen)
        assert other.poll() is None and stranger.poll() is None
    finally:
        other.kill()
        stranger.kill()
        other.wait()
        stranger.wait()


LEAVER = """
import os, signal, subprocess, sys
import psutil

def agent():
    # torchrun's agent: the ancestor that runs it (fresh, or retitled by a zygote), else the
    # launcher's child on the way up
    chain = psutil.Process().parents()
    launcher = int(os.environ["PERFSUITE_LAUNCHER_PID"])
    named = [p for p in chain if "torch.distributed.run" in " ".join(p.cmdline())]
    return named[-1] if named else next(p for p in chain if p.ppid() == launcher)

def run(cell, ctx):
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", {marker!r}])
    agent().kill()  # no failure table, ever
    signal.pause()
"""


@pytest.mark.slow
def test_a_workload_that_kills_its_agent_is_told_so_and_leaves_nothing(tmp_path):
    from cellkit import tiny_image_cell

    from perfsuite.launch.launch import LaunchOptions, run_cell

    marker = f"leaver-{uuid.uuid4().hex}"
    (tmp_path / "leaver.py").write_text(LEAVER.format(marker=marker))
    try:
        result = run_cell(tiny_image_cell(workload="leaver:run", world_size=1, timeout_s=120),
                          tmp_path / "out", LaunchOptions(env={"PYTHONPATH": str(tmp_path)}))
        assert result["status"] == "error"
        assert result["reason"] == "rank 0 died without a result (torch.distributed.run was killed by SIGKILL)"
        assert survivors(marker) == []
    finally:
        _cleanup(marker)
