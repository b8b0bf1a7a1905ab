"""No rank outlives its launcher: real processes, real SIGKILL.

A launcher killed with SIGKILL (a CI runner ending the job, the OOM killer)
cleans up nothing itself. Its torchrun agent dies with it (the parent-death
signal), the ranks die with the agent (the same, once more), and a rank whose
parent is not the agent (``nsys profile``) ends by its launcher watchdog.
"""

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from cellkit import tiny_image_cell

from perfsuite.launch import diagnose
from perfsuite.launch.launch import cell_dir
from perfsuite.system import lifetime

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")

UNIT = Path(__file__).resolve().parent
ROOT = UNIT.parents[1]
PR_GET_PDEATHSIG = 2


def mentioning(marker):
    """Live processes whose command line mentions ``marker``: (pid, command line)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if (proc.pid != os.getpid() and proc.info["status"] != psutil.STATUS_ZOMBIE
                    and any(marker in part for part in proc.info["cmdline"] or [])):
                found.append((proc.pid, " ".join(proc.info["cmdline"])))
        except psutil.Error:
            continue
    return found


def gone(pid):
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_until(predicate, timeout, step=0.1):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(step)
    return True


def kill(*pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def launcher_identity(pid):
    """The variables a launch gives its ranks, for the launcher ``pid``."""
    return {"PERFSUITE_LAUNCHER_PID": str(pid),
            "PERFSUITE_LAUNCHER_START": repr(psutil.Process(pid).create_time()),
            "PERFSUITE_LAUNCHER_HOST": socket.gethostname()}


def without_launcher(environ):
    return {k: v for k, v in environ.items() if not k.startswith("PERFSUITE_LAUNCHER_")}


# --- the whole launch: launcher, torchrun agent, ranks, one of them hung ------------------

LAUNCHER = """
import sys
from pathlib import Path
sys.path.insert(0, {unit!r})
from cellkit import tiny_image_cell
from perfsuite.launch.launch import LaunchOptions, run_cell
run_cell(tiny_image_cell(timeout_s=300), Path({out!r}), LaunchOptions(options={{"fault": "hang:1:3"}}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("fork_agent", ["1", "0"], ids=["forked-agent", "subprocess-agent"])
def test_sigkilled_launcher_leaves_no_process_of_its_hung_cell(tmp_path, fork_agent):
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER.format(unit=str(UNIT), out=str(tmp_path)))
    directory = cell_dir(tmp_path, tiny_image_cell(timeout_s=300))
    marker = f"{tmp_path}{os.sep}"  # the launcher's script, the agent's and the ranks' arguments
    env = {**without_launcher(os.environ), "PERFSUITE_FORK_AGENT": fork_agent}
    with open(tmp_path / "launcher.log", "wb") as log:
        launcher = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, env=env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
    try:
        hung = wait_until(lambda: launcher.poll() is not None
                          or diagnose.read_progress(directory).get(1, {}).get("step") == 3, 240, 0.2)
        assert hung and launcher.poll() is None, (tmp_path / "launcher.log").read_text()[-3000:]
        before = mentioning(marker)
        assert len(before) >= 4, before  # launcher, agent, 2 ranks (all in sessions of their own)
        kill(launcher.pid)
        launcher.wait()  # reaped at once, as a CI runner does
        killed = time.monotonic()
        all_gone = wait_until(lambda: not mentioning(marker), 10)
        print(f"fork_agent={fork_agent}: {len(before)} processes, all gone "
              f"{time.monotonic() - killed:.2f} s after the launcher's SIGKILL")
        assert all_gone, f"left behind: {mentioning(marker)}"
    finally:
        kill(launcher.pid)
        launcher.wait()
        for _ in range(3):  # the agent may start nothing new once killed; be thorough anyway
            kill(*(pid for pid, _ in mentioning(marker)))
            time.sleep(0.2)


# --- the ranks' launcher watchdog: a rank whose own parent lives on (nsys) ----------------

WATCHED_RANK = """
import time
from perfsuite.rank.worker import watch_launcher
print("watching" if watch_launcher() is not None else "not watching", flush=True)
time.sleep(120)
"""


def _watched_rank(environ):
    return subprocess.Popen([sys.executable, "-c", WATCHED_RANK], cwd=ROOT, env=environ,
                            stdout=subprocess.PIPE, text=True)


def test_watchdog_ends_a_rank_whose_launcher_is_gone_though_its_parent_lives_on():
    launcher = subprocess.Popen(["sleep", "120"])  # the launcher; this test is the rank's parent
    rank = _watched_rank({**without_launcher(os.environ), **launcher_identity(launcher.pid)})
    try:
        assert rank.stdout.readline() == "watching\n"
        time.sleep(1.5)
        assert rank.poll() is None  # the launcher lives: so does the rank
        launcher.kill()  # not reaped yet: a zombie, the launcher of a parent that has not waited
        killed = time.monotonic()
        assert rank.wait(timeout=5) == -signal.SIGKILL
        assert time.monotonic() - killed < 2.0  # polled every 0.5 s
    finally:
        kill(rank.pid, launcher.pid)
        rank.wait()
        launcher.wait()


def test_watchdog_takes_a_reused_pid_for_a_gone_launcher():
    other = subprocess.Popen(["sleep", "120"])  # holds the launcher's pid, started later
    identity = launcher_identity(other.pid)
    identity["PERFSUITE_LAUNCHER_START"] = repr(float(identity["PERFSUITE_LAUNCHER_START"]) - 600)
    rank = _watched_rank({**without_launcher(os.environ), **identity})
    try:
        assert rank.wait(timeout=60) == -signal.SIGKILL
    finally:
        kill(rank.pid, other.pid)
        rank.wait()
        other.wait()


def test_no_watchdog_for_a_rank_started_by_hand_or_on_another_host():
    from perfsuite.rank.worker import watch_launcher

    me = launcher_identity(os.getpid())
    assert watch_launcher({}) is None
    assert watch_launcher({k: v for k, v in me.items() if k != "PERFSUITE_LAUNCHER_START"}) is None
    assert watch_launcher({**me, "PERFSUITE_LAUNCHER_HOST": "some-other-node"}) is None
    assert watch_launcher({**me, "PERFSUITE_LAUNCHER_PID": "not-a-pid"}) is None


# --- the parent-death helper ----------------------------------------------------------------

DIES_WITH = """
import ctypes, sys
from perfsuite.system import lifetime
print("set" if lifetime.die_with_parent(int(sys.argv[1])) else "not set", flush=True)
sig = ctypes.c_int()
ctypes.CDLL(None).prctl(2, ctypes.byref(sig), 0, 0, 0)  # PR_GET_PDEATHSIG
print("pdeathsig", sig.value, flush=True)
"""


def test_die_with_parent_sets_sigkill_for_the_expected_parent():
    done = subprocess.run([sys.executable, "-c", DIES_WITH, str(os.getpid())], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["set", f"pdeathsig {int(signal.SIGKILL)}"]


def test_die_with_parent_exits_when_the_parent_is_not_the_expected_one():
    # The parent ended before the call: the process now has another (init or a
    # subreaper), and no signal will ever come; it must end there and then.
    done = subprocess.run([sys.executable, "-c", DIES_WITH, str(os.getpid() + 1)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stdout == "", (done.stdout, done.stderr)


def test_die_with_parent_is_a_no_op_without_prctl(monkeypatch):
    monkeypatch.setattr(lifetime, "libc_prctl", lambda: None)
    assert lifetime.die_with_parent(os.getpid() + 12345) is False  # and this process goes on
    assert lifetime.die_with_me() is None  # launch.py's preexec_fn: none at all
    monkeypatch.undo()
    monkeypatch.setattr(ctypes, "CDLL", lambda *a, **kw: object())  # a libc without prctl
    assert lifetime.libc_prctl() is None
    monkeypatch.undo()
    monkeypatch.setattr(sys, "platform", "darwin")
    assert lifetime.libc_prctl() is None


def test_a_child_started_with_die_with_me_dies_with_its_parent():
    parent = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, time; from perfsuite.system import lifetime; "
         "child = subprocess.Popen(['sleep', '120'], preexec_fn=lifetime.die_with_me()); "
         "print(child.pid, flush=True); time.sleep(120)"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    child = None
    try:
        child = int(parent.stdout.readline())
        assert not gone(child)
        kill(parent.pid)
        parent.wait()
        assert wait_until(lambda: gone(child), 5)
    finally:
        kill(parent.pid, *([child] if child else []))
        parent.wait()
