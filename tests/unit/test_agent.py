"""torchrun's agent forked from a zygote, the pool of zygotes, and the
launch's one choice of how its processes start (perfsuite.launch.starting)."""

import os
import subprocess
import sys
import time
from types import SimpleNamespace

import psutil
import pytest
from cellkit import tiny_image_cell

from perfsuite.launch import agent, multinode, starting
from perfsuite.launch.launch import LaunchOptions

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


class FakePool:
    """A ZygotePool's part a starter uses; ``fail``: it has no zygote."""

    def __init__(self, fail=False):
        self.fail, self.warmed, self.launched = fail, [], []

    def warm(self, python, env, preload, cuda):
        self.warmed.append((python, preload, cuda))

    def launch(self, argv, log_fd, env, python, preload, cuda):
        if self.fail:
            raise agent.ZygoteError("no zygote: refused for the test")
        self.launched.append((argv, env, preload, cuda))
        return SimpleNamespace(pid=1, zygote=SimpleNamespace(startup={"sitecustomize": "/s/sitecustomize.py"}))


def test_the_launch_options_choose_one_starter_and_whether_its_agent_forks(monkeypatch):
    plan = multinode.plan(tiny_image_cell(), multinode.Nodes())
    monkeypatch.delenv("PERFSUITE_RANK_START", raising=False)
    monkeypatch.delenv("PERFSUITE_FORK_AGENT", raising=False)
    pool = FakePool()
    fork, note = starting.choose(LaunchOptions(), "off", plan, pool)
    assert isinstance(fork, starting.ForkStarter) and fork.pool is pool and note is None
    fresh, note = starting.choose(LaunchOptions(rank_start="exec"), "off", plan, pool)
    assert isinstance(fresh, starting.ExecStarter) and fresh.pool is pool and note is None
    under_nsys, note = starting.choose(LaunchOptions(), "nsys", plan, pool)
    assert under_nsys.name == "exec" and "nsys" in note
    assert starting.choose(LaunchOptions(), "off", plan)[0].pool is agent.POOL  # the launcher's own
    assert starting.choose(LaunchOptions(fork_agent=False), "off", plan, pool)[0].pool is None
    monkeypatch.setenv("PERFSUITE_FORK_AGENT", "0")  # the user's switch, read as the options are built
    assert not LaunchOptions().fork_agent and starting.choose(LaunchOptions(), "off", plan, pool)[0].pool is None


def test_an_exec_launchs_agent_is_forked_from_the_zygote_only_for_this_interpreters_plain_torchrun(monkeypatch):
    fresh = []
    monkeypatch.setattr(starting, "fresh_agent", lambda argv, log_fd, env: fresh.append(argv) or "fresh")
    pool, cell = FakePool(), tiny_image_cell()
    starter = starting.ExecStarter(sys.executable, pool)
    starter.warm(cell, {})
    assert pool.warmed == [(sys.executable, starting.AGENT_PRELOAD, False)]  # its ranks exec: CUDA is theirs
    assert starter.start([*TORCHRUN, "--standalone"], 1, {"A": "1"}, cell).pid == 1
    assert pool.launched[0][1] == {"A": "1"} and starter.ran_once == {}  # each rank runs its own start-up
    assert starter.start(["srun", "--nodes=2", *TORCHRUN], 1, {}, cell) == "fresh"
    assert starting.ExecStarter("/other/python", pool).start(TORCHRUN, 1, {}, cell) == "fresh"
    assert starting.ExecStarter(sys.executable, FakePool(fail=True)).start(TORCHRUN, 1, {}, cell) == "fresh"
    assert starting.ExecStarter(sys.executable).start(TORCHRUN, 1, {}, cell) == "fresh"
    assert len(pool.launched) == 1 and len(fresh) == 4


def test_a_fork_launch_says_what_its_zygote_ran_once_and_raises_where_there_is_none(monkeypatch):
    pool, cell = FakePool(), tiny_image_cell()
    starter = starting.ForkStarter(sys.executable, pool)
    starter.start(TORCHRUN, 1, {}, cell)
    assert pool.launched[0][2] == starting.preload_modules(cell)
    info = starting.info(starter, None)
    assert info["rank_start"] == "fork" and info["ran_once"] == {"sitecustomize": "/s/sitecustomize.py"}
    assert "without RANK" in info["rank_start_means"] and "--rank-start exec" in info["rank_start_means"]
    with pytest.raises(agent.ZygoteError):
        starting.ForkStarter(sys.executable, FakePool(fail=True)).start(TORCHRUN, 1, {}, cell)
    after, note = starting.fallback(starter, agent.ZygoteError("no zygote: x"))
    assert isinstance(after, starting.ExecStarter) and after.pool is None and note == "no zygote: x"
    assert starting.info(after, note) == {"rank_start": "exec", "rank_start_means": starting.MEANS["exec"],
                                          "rank_start_note": "no zygote: x"}


@pytest.fixture
def zygote(tmp_path):
    z = agent.Zygote(sys.executable, dict(os.environ), str(tmp_path), ["torch"])
    yield z
    z.close()


def test_a_zygote_agent_runs_torchrun_with_its_own_session_log_and_environment(zygote, tmp_path):
    """The exec path's agent: forked from the zygote, its ranks fresh interpreters."""
    log = tmp_path / "output.log"
    script = ("import os, sys; print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], 'sees', "
              "os.environ['PERFSUITE_TEST_VALUE'], 'in session', os.getsid(0), 'preloaded', "
              "'torch' in sys.modules, flush=True)")
    argv = [*TORCHRUN, "--standalone", "--nproc-per-node=1", "--max-restarts=0", "--no-python",
            sys.executable, "-c", script]
    with open(log, "wb") as out:
        proc = zygote.launch(argv, out.fileno(), {**os.environ, "PERFSUITE_TEST_VALUE": "42"}, str(tmp_path))
        assert proc.wait(timeout=120) == 0 and proc.returncode == 0
        bad = zygote.launch([*TORCHRUN, "--no-such-flag"], out.fileno(), dict(os.environ), str(tmp_path))
        assert bad.wait(timeout=120) == 2  # argparse's usage error
    text = log.read_text()
    assert "rank 0 of 1 sees 42 in session" in text and "preloaded False" in text  # a fresh rank
    assert f"in session {os.getsid(0)} " not in text  # not the launcher's session
    assert "PERFSUITE_TEST_VALUE" not in os.environ  # the launcher's own environment is untouched
    assert "torchrun: error:" in text


# --- ranks forked from a zygote -------------------------------------------------------

RANK_SCRIPT = """
import gc, os, signal, sys
print("rank", os.environ["RANK"], "ppid", os.getppid(), "preloaded", "torch" in sys.modules,
      "sees", os.environ["PERFSUITE_TEST_VALUE"], "in", os.getcwd(), "args", sys.argv[1:],
      "frozen", gc.get_freeze_count() > 10000, flush=True)
"""


def launch_in(z, tmp_path, *args, env=None, script=RANK_SCRIPT):
    (tmp_path / "rank.py").write_text(script)
    argv = [*TORCHRUN, "--standalone", "--nproc-per-node=2", "--max-restarts=0", "--tee=3",
            "--start-method=fork", "--run-path", str(tmp_path / "rank.py"), *args]
    with open(tmp_path / "output.log", "wb") as out:
        return agent.Zygote.launch(z, argv, out.fileno(), {**os.environ, **(env or {})}, str(tmp_path)), argv


def test_a_zygote_forks_torchruns_agent_which_forks_ranks_with_everything_imported(zygote, tmp_path):
    assert zygote.preloaded == {"torch"} and zygote.cuda_clean
    proc, argv = launch_in(zygote, tmp_path, "--flag", "x", env={"PERFSUITE_TEST_VALUE": "42"})
    shown = []
    for _ in range(100):  # ps shows what it runs, once it retitled itself
        shown = psutil.Process(proc.pid).cmdline()[:len(argv)]
        if shown == argv:
            break
        time.sleep(0.05)
    assert shown == argv
    assert proc.wait(timeout=120) == 0 and proc.poll() == 0
    text = (tmp_path / "output.log").read_text()
    for rank in (0, 1):  # forked by the agent, torch already there, the launch's env and folder
        assert (f"rank {rank} ppid {proc.pid} preloaded True sees 42 in {tmp_path} args ['--flag', 'x'] "
                "frozen True") in text  # torch's objects out of the rank's garbage collections
    assert "PERFSUITE_TEST_VALUE" not in os.environ


def test_a_zygote_agent_reports_exit_codes_times_out_and_leads_its_own_session(zygote, tmp_path):
    bad, _ = launch_in(zygote, tmp_path, script="raise SystemExit(3)")
    assert bad.wait(timeout=120) != 0
    assert "exitcode" in (tmp_path / "output.log").read_text()  # torchrun's own failure report
    slow, _ = launch_in(zygote, tmp_path, script="import time; time.sleep(60)")
    with pytest.raises(subprocess.TimeoutExpired):
        slow.wait(timeout=0.5)
    assert slow.poll() is None and os.getsid(slow.pid) == slow.pid
    os.killpg(slow.pid, 9)
    assert slow.wait(timeout=30) == -9


def test_a_zygote_ends_with_its_launchers_end_of_the_socket(tmp_path):
    z = agent.Zygote(sys.executable, dict(os.environ), str(tmp_path), [])
    assert z.alive()
    z._sock.close()
    assert z.proc.wait(timeout=30) == 0


def test_an_import_that_asks_cuda_is_kept_out_of_the_zygote_of_cuda_cells(tmp_path, monkeypatch):
    # torch marks later forks "bad" once CUDA was asked anything, with or
    # without a GPU (torch.cuda.is_available): a forked rank could not use it.
    (tmp_path / "asks_cuda.py").write_text("import torch\ntorch.cuda.is_available()\n")
    monkeypatch.chdir(tmp_path)
    pool = agent.ZygotePool()
    env = dict(os.environ)
    try:
        cpu = pool.zygote_for(sys.executable, env, ["torch", "asks_cuda"], cuda=False)
        assert not cpu.cuda_clean and cpu.cuda_touched_by == "asks_cuda"  # harmless for CPU ranks
        gpu = pool.zygote_for(sys.executable, env, ["torch", "asks_cuda"], cuda=True)
        assert gpu is not cpu and not cpu.alive()
        assert gpu.cuda_clean and gpu.preloaded == {"torch"} and pool.touch_cuda == {"asks_cuda"}
    finally:
        pool.close()


def test_one_zygote_serves_launches_that_differ_only_in_what_ranks_read_at_run_time():
    env = {"PATH": "/bin", "LD_PRELOAD": ""}
    key = agent.zygote_key("py", env, "/w")
    assert key == agent.zygote_key("py", {**env, "OMP_NUM_THREADS": "3", "PERFSUITE_RUN_TOKEN": "t",
                                         "CUDA_VISIBLE_DEVICES": "1", "PYTEST_CURRENT_TEST": "t.py::x"}, "/w")
    assert key != agent.zygote_key("py", {**env, "LD_PRELOAD": "libjemalloc.so"}, "/w")
    assert key != agent.zygote_key("py", env, "/elsewhere") != agent.zygote_key("other", env, "/w")
    # launches whose ranks fork (the agent asks CUDA through NVML) and exec share one
    assert agent.ZygotePool.key("py", env) == agent.ZygotePool.key("py", agent.with_nvml_check(env))


def test_a_zygote_that_cannot_start_says_why_and_is_not_tried_again(tmp_path, monkeypatch):
    pool = agent.ZygotePool()
    with pytest.raises(agent.ZygoteError, match="no zygote"):
        pool.zygote_for(str(tmp_path / "no-python"), dict(os.environ), [], cuda=False)
    with pytest.raises(agent.ZygoteError, match="no zygote"):
        pool.zygote_for(str(tmp_path / "no-python"), dict(os.environ), [], cuda=False)
    assert len(pool.failed) == 1 and pool.zygotes == {}


def test_a_zygote_whose_imported_code_changed_is_replaced_before_it_forks_old_code(tmp_path, monkeypatch):
    (tmp_path / "trained.py").write_text("VALUE = 1\n")  # a module the ranks would import
    monkeypatch.chdir(tmp_path)
    pool = agent.ZygotePool()
    script = tmp_path / "rank.py"
    script.write_text("import sys, trained\nprint('loaded', 'trained' in sys.modules, 'value', trained.VALUE)\n")
    argv = [*TORCHRUN, "--standalone", "--nproc-per-node=1", "--start-method=fork", "--run-path", str(script)]
    env = dict(os.environ)

    def run(log):
        with open(log, "wb") as out:
            proc = pool.launch(argv, out.fileno(), env, sys.executable, ["trained"], cuda=False)
            assert proc.wait(timeout=120) == 0
        return log.read_text()

    try:
        assert "value 1" in run(tmp_path / "first.log")
        first = next(iter(pool.zygotes.values()))
        (tmp_path / "trained.py").write_text("VALUE = 22\n")  # a checkout moved on: git bisect
        assert "value 22" in run(tmp_path / "second.log")
        assert not first.alive() and next(iter(pool.zygotes.values())) is not first
    finally:
        pool.close()


def test_a_zygote_replaced_while_an_agent_of_its_runs_lets_that_launch_finish(tmp_path, monkeypatch):
    """An A/B session's side B launched while side A's launch runs, after a
    module the zygote imported changed (a checkout moved on, an edit): B gets
    a new zygote, and A's, retired, serves A to its end (closing it ended A's
    launch with "file descriptor cannot be a negative integer (-1)"); it is
    ended once idle."""
    (tmp_path / "trained.py").write_text("VALUE = 1\n")
    monkeypatch.chdir(tmp_path)
    pool = agent.ZygotePool()
    (tmp_path / "rank.py").write_text("import sys, time, trained; time.sleep(float(sys.argv[1])); "
                                      "print('value', trained.VALUE)\n")
    env = dict(os.environ)

    def launch(seconds, log):
        argv = [*TORCHRUN, "--standalone", "--nproc-per-node=1", "--start-method=fork",
                "--run-path", str(tmp_path / "rank.py"), str(seconds)]
        with open(log, "wb") as out:
            return pool.launch(argv, out.fileno(), env, sys.executable, ["trained"], cuda=False)

    try:
        slow = launch(8, tmp_path / "a.log")
        first = next(iter(pool.zygotes.values()))
        (tmp_path / "trained.py").write_text("VALUE = 22\n")
        quick = launch(0, tmp_path / "b.log")
        assert quick.wait(timeout=120) == 0 and "value 22" in (tmp_path / "b.log").read_text()
        assert first.alive() and first in pool.retired  # side A's agent still runs under it
        assert slow.wait(timeout=120) == 0 and "value 1" in (tmp_path / "a.log").read_text()
        launch(0, tmp_path / "c.log").wait(timeout=120)  # the next launch ends the idle one
        assert pool.retired == [] and not first.alive()
    finally:
        pool.close()


@pytest.mark.slow
def test_a_zygote_started_from_a_thread_outlives_it_and_serves_two_threads_at_once(tmp_path, monkeypatch):
    """An A/B session starts its sides' launches from threads. The zygote
    started by side A's first launch must outlive that thread (a parent-death
    signal fires when the thread that started a process ends: seen on an H200,
    side A's second launch found the zygote gone), and a launch from one
    thread must not wait for the other thread's whole launch to end."""
    import threading

    monkeypatch.chdir(tmp_path)
    pool = agent.ZygotePool()
    env = dict(os.environ)
    (tmp_path / "rank.py").write_text("import sys, time; time.sleep(float(sys.argv[1]))\n")

    def argv(seconds):
        return [*TORCHRUN, "--standalone", "--nproc-per-node=1", "--start-method=fork",
                "--run-path", str(tmp_path / "rank.py"), str(seconds)]

    started = {}
    try:
        thread = threading.Thread(target=lambda: started.update(
            z=pool.zygote_for(sys.executable, env, ["torch"], cuda=False)))
        thread.start()
        thread.join()
        time.sleep(1.5)  # a parent-death signal would have ended it by now
        assert started["z"].alive()
        with open(tmp_path / "slow.log", "wb") as log:
            slow = pool.launch(argv(20), log.fileno(), env, sys.executable, ["torch"], cuda=False)
        waiting = threading.Thread(target=slow.wait, daemon=True)
        waiting.start()  # waits on the zygote's socket for ~20 s (one waiter an agent, as in a launch)
        began = time.monotonic()
        with open(tmp_path / "quick.log", "wb") as log:
            quick = pool.launch(argv(0), log.fileno(), env, sys.executable, ["torch"], cuda=False)
        assert quick.wait(timeout=60) == 0
        assert time.monotonic() - began < 15 and waiting.is_alive()  # not after the slow one
        waiting.join(90)
        assert slow.returncode == 0
    finally:
        pool.close()


def test_a_zygote_warmed_in_the_background_is_the_one_the_launch_then_gets(monkeypatch):
    """``warm`` starts a launch's zygote on a thread while the launcher does its
    own imports; the launch's ``zygote_for`` waits for that one instead of
    starting another, and a warm start that failed is the launch's error."""
    import threading

    release, made = threading.Event(), []

    class SlowZygote:
        cuda_clean, cuda_touched_by = True, None

        def __init__(self, python, env, cwd, preload):
            assert release.wait(30)  # importing torch, in a real one
            if python == "no-python":
                raise agent.ZygoteError("cannot start")
            made.append(self)

        def alive(self):
            return True

        def preload(self, modules):
            pass

        def close(self):
            pass

    pool = agent.ZygotePool(make=SlowZygote)
    env = {"PATH": "/bin"}
    pool.warm("py", env, ["torch"], cuda=False)  # returns while the zygote is still starting
    pool.warm("py", env, ["torch"], cuda=False)  # one start a key
    assert made == [] and len(pool.warming) == 1
    got = []
    launch = threading.Thread(target=lambda: got.append(pool.zygote_for("py", env, ["torch"], cuda=False)))
    launch.start()
    launch.join(0.2)
    assert launch.is_alive() and got == []  # waiting for the warm start, not starting its own
    release.set()
    launch.join(30)
    assert got == made and len(made) == 1 and pool.warming == {}
    pool.warm("py", env, ["torch"], cuda=False)  # already there: nothing started
    assert pool.warming == {} and len(made) == 1
    pool.warm("no-python", env, ["torch"], cuda=False)
    with pytest.raises(agent.ZygoteError, match="cannot start"):
        pool.zygote_for("no-python", env, ["torch"], cuda=False)


# --- a launcher whose options forbid forking it -------------------------------------

@pytest.fixture
def fresh_agents(monkeypatch):
    """The launch's torchrun agents as they were asked for (a fresh interpreter's
    command line), each standing in as a process that exits at once; and a
    launcher that fails the test where it forks itself."""

    def no_fork():
        raise AssertionError("the launcher forked itself")

    monkeypatch.setattr(os, "fork", no_fork)
    started, real = [], subprocess.Popen

    def fresh(argv, *args, **kwargs):
        if "torch.distributed.run" not in argv:  # another program the launcher asks something
            return real(argv, *args, **kwargs)
        started.append(list(argv))
        return real([sys.executable, "-c", "raise SystemExit(1)"], *args, **kwargs)

    monkeypatch.setattr(starting.subprocess, "Popen", fresh)
    return started


@pytest.mark.parametrize("start", ["exec", "fork"])
@pytest.mark.parametrize("case", ["no-fork-option", "zygote-error"])
def test_a_launch_that_must_not_fork_its_launcher_never_forks_it(tmp_path, monkeypatch, fresh_agents, start, case):
    """The resident A/B launches both sides from threads of one launcher: a
    fork of it copies only the forking thread, and a lock the other side's
    thread held stays held in the child for good. No launch forks its
    launcher: not where its options say the agent is not to be forked
    (``fork_agent=False``, $PERFSUITE_FORK_AGENT=0), and not where the zygote
    fails (on the exec path and on the fork path's fallback): the agent is
    then a fresh interpreter."""
    from perfsuite.launch.launch import run_cell

    failing = FakePool(fail=True)  # the launcher's pool, with no zygote to give
    monkeypatch.setattr(agent.POOL, "warm", failing.warm)
    monkeypatch.setattr(agent.POOL, "launch", failing.launch)
    opts = LaunchOptions(rank_start=start, fork_agent=case != "no-fork-option")
    result = run_cell(tiny_image_cell(world_size=1), tmp_path, opts)
    assert [argv[:3] for argv in fresh_agents] == [TORCHRUN]
    forks = start == "fork" and case == "no-fork-option"  # its ranks fork from the fresh agent
    assert result["info"]["rank_start"] == ("fork" if forks else "exec")
    assert ("--start-method=fork" in fresh_agents[0]) == forks
    assert ("no zygote" in result["info"].get("rank_start_note", "")) == (start == "fork" and not forks)
