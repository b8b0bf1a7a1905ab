"""torchrun's own agent, started as a fork of the launching process.

A launch is ``python -m torch.distributed.run ... -m perfsuite.rank.worker``. Its
agent's first 2.2 s on the 2-core VM are spent importing torch in a fresh
interpreter; a launcher that already imported ``torch.distributed.run``
forks instead and calls the same ``main`` with the same arguments. It is the
same agent (rendezvous, worker processes, their restarts and tee), the ranks
are started by it exactly as before (a fresh interpreter each), and the
process tree lives in a session of its own as with ``start_new_session``.

Only where it is the same agent: the launcher's own interpreter, one node
without a wrapper (``srun``), Linux, and not turned off with
``PERFSUITE_FORK_AGENT=0``.

Forked or not, the agent dies with its launcher (perfsuite.system.lifetime): its
own session keeps it from a terminal's Ctrl-C, and a launcher killed with
SIGKILL cannot end it, so Linux's parent-death signal does.

The ranks themselves still start as fresh interpreters on that path. Where
they fork instead (perfsuite.launch.starting), the agent is forked from a
``Zygote``: an interpreter that imported torch and the workloads once
(perfsuite.launch.zygote).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from perfsuite.launch.zygote import exit_after, run_torchrun
from perfsuite.system.lifetime import die_with_parent, libc_prctl

TORCHRUN = ["-m", "torch.distributed.run"]


def may_fork_agent() -> bool:
    """Linux, and not turned off with PERFSUITE_FORK_AGENT=0."""
    return sys.platform == "linux" and os.environ.get("PERFSUITE_FORK_AGENT", "1") != "0"


def can_fork(argv: list[str]) -> bool:
    """True for a plain torchrun command line of this very interpreter, on
    Linux (whether the launch allows it: LaunchOptions.fork_agent)."""
    return sys.platform == "linux" and argv[:3] == [sys.executable, *TORCHRUN]


class ForkedAgent:
    """``subprocess.Popen``'s part that a launch uses (pid, wait, returncode)
    for torchrun's ``main`` running in a forked child."""

    def __init__(self, argv: list[str], log_fd: int, env: dict[str, str]) -> None:
        from torch.distributed import run  # imported once, in the launcher

        self.args, self.returncode = argv[3:], None
        launcher, prctl = os.getpid(), libc_prctl()
        self.pid = os.fork()
        if self.pid == 0:  # the agent; never returns
            self._child(run.main, log_fd, env, launcher, prctl)

    def _child(self, main, log_fd: int, env: dict[str, str], launcher: int, prctl) -> None:
        def body() -> None:
            os.setsid()  # its own session: a timeout or Ctrl-C ends the whole tree
            die_with_parent(launcher, prctl)  # and so does the launcher's SIGKILL
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGPIPE):
                signal.signal(sig, signal.SIG_DFL)
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
            # the launcher's streams may be a test runner's captures: write to the log
            sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
            sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
            import logging

            for handler in logging.getLogger().handlers[:]:
                logging.getLogger().removeHandler(handler)
            os.environ.clear()
            os.environ.update(env)
            run_torchrun(main, self.args)

        exit_after(body)

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(["torchrun", *self.args], timeout)
            time.sleep(0.02)
        return self.returncode


# --- ranks forked from a preloaded interpreter --------------------------------------

FORKED_RANK = Path(__file__).parent.parent / "rank" / "forked.py"  # torchrun --run-path runs it in each rank
ZYGOTE_SOURCE = Path(__file__).with_name("zygote.py")
RANK_START_ENV = "PERFSUITE_RANK_START"  # "exec": every rank a fresh interpreter
ZYGOTE_START_S = 300.0  # imports of torch, torchvision, torchtune on a loaded 2-core machine
TITLE_ROOM = 8192  # bytes of command line a forked agent or rank may show in ps
MAX_ZYGOTES = 2  # an A/B session's two sides; an older one is ended for a third
EXIT_POLL_S = 0.1  # how often a wait for one agent looks at the zygote's socket
# Per launch, read by the ranks when they run, never while they import: a
# zygote serves launches that differ in them (pytest names the running test
# in PYTEST_CURRENT_TEST). Everything else in the environment (LD_PRELOAD,
# PYTHONPATH, TORCH_*, ...) may act at import: a launch that differs there
# gets a zygote of its own.
PER_LAUNCH_ENV = ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "PYTHONUNBUFFERED", "PYTEST_CURRENT_TEST")


class ZygoteError(RuntimeError):
    """The zygote could not start, or ended: the launch starts its ranks as fresh interpreters."""


class ZygoteStale(ZygoteError):
    """A module the zygote imported changed on disk since: a new zygote imports it again."""


def zygote_key(python: str, env: dict[str, str], cwd: str) -> tuple:
    """What a zygote must share with a launch it serves: the interpreter, the
    working directory (modules of the project found there) and the
    environment but for what is read at run time (PER_LAUNCH_ENV and
    perfsuite's own PERFSUITE_* variables)."""
    kept = tuple(sorted((k, v) for k, v in env.items()
                        if k not in PER_LAUNCH_ENV and not k.startswith("PERFSUITE_")))
    return python, cwd, kept


class Zygote:
    """The launcher's end of a perfsuite.zygote process: started with ``python``
    in ``env``, asked to import modules and to fork agents."""

    def __init__(self, python: str, env: dict[str, str], cwd: str, preload: list[str],
                 start_timeout_s: float = ZYGOTE_START_S) -> None:
        self.python, self.cwd = python, cwd
        self._lock = threading.Lock()
        self._exits: dict[int, int] = {}
        self._replies: list[dict] = []  # answers read by a thread waiting for an exit
        self.preloaded: set[str] = set()
        self.failed: dict[str, str] = {}
        self.cuda_clean, self.cuda_touched_by = True, None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock = ours
        argv = [python, str(ZYGOTE_SOURCE), f"--fd={theirs.fileno()}",
                f"--launcher={os.getpid()}", f"--preload={','.join(preload)}", " " * TITLE_ROOM]
        try:
            self.proc = subprocess.Popen(argv, env={**env, "PYTHONUNBUFFERED": "1"}, cwd=cwd,
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, pass_fds=[theirs.fileno()],
                                         start_new_session=True)
        finally:
            theirs.close()
        try:
            ready = self._reply(start_timeout_s)
        except ZygoteError:
            self.close()
            raise
        self.pid = ready["pid"]
        self._update(ready)

    def _update(self, answer: dict) -> None:
        self.preloaded.update(answer.get("preloaded", []))
        self.failed.update(answer.get("failed", {}))
        self.cuda_clean = self.cuda_clean and answer.get("cuda_clean", True)
        self.cuda_touched_by = self.cuda_touched_by or answer.get("cuda_touched_by")

    def _receive(self, timeout: float | None) -> dict | None:
        """One message, or None when none came within ``timeout``; exits are
        filed as they come. Raises ZygoteError once the zygote is gone. Called
        with the lock held."""
        readable, _, _ = select.select([self._sock], [], [], timeout)
        if not readable:
            return None
        try:
            data = self._sock.recv(1 << 20)
        except OSError as err:
            raise ZygoteError(f"the zygote ended ({err})") from None
        if not data:
            raise ZygoteError("the zygote ended")
        message = json.loads(data)
        if "exit" in message:
            self._exits[message["exit"]] = message["code"]
        return message

    def _reply(self, timeout: float) -> dict:
        """The answer to what was just asked (the lock held meanwhile)."""
        if self._replies:
            return self._replies.pop(0)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ZygoteError(f"the zygote did not answer within {timeout:.0f} s")
            message = self._receive(left)
            if message is not None and "exit" not in message:
                return message

    def alive(self) -> bool:
        return self.proc.poll() is None

    def preload(self, modules: list[str], timeout_s: float = ZYGOTE_START_S) -> None:
        missing = [m for m in modules if m not in self.preloaded and m not in self.failed]
        if missing:
            with self._lock:
                self._sock.send(json.dumps({"op": "preload", "modules": missing}).encode())
                self._update(self._reply(timeout_s))

    def launch(self, argv: list[str], log_fd: int, env: dict[str, str], cwd: str) -> ZygoteAgent:
        """torchrun's main on ``argv`` (a ``python -m torch.distributed.run``
        command line) in an agent forked from the zygote."""
        message = {"op": "launch", "args": argv[3:], "env": env, "cwd": cwd, "title": argv}
        with self._lock:
            try:
                socket.send_fds(self._sock, [json.dumps(message).encode()], [log_fd])
            except OSError as err:
                raise ZygoteError(f"the zygote is gone ({err})") from None
            answer = self._reply(60.0)
        if "stale" in answer:
            raise ZygoteStale(f"{answer['stale']} changed since the zygote imported it")
        return ZygoteAgent(self, answer["pid"], argv[3:])

    def exit_code(self, pid: int, timeout: float | None) -> int | None:
        """The agent's exit code once it ended, waiting up to ``timeout`` (None:
        for as long as it takes). The wait itself holds no lock: an A/B
        session's other side, waiting on or launching from the same zygote in
        another thread, goes on meanwhile (a lock held across the wait was
        seen to keep a side's launch waiting for 2 minutes)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                try:
                    while (message := self._receive(0.0)) is not None:
                        if "exit" not in message:  # an answer another thread is about to ask for
                            self._replies.append(message)
                except ZygoteError:  # its agents died with it (the parent-death signal)
                    self._exits.setdefault(pid, -signal.SIGKILL)
                if pid in self._exits:
                    return self._exits.pop(pid)
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            select.select([self._sock], [], [], EXIT_POLL_S if left is None else min(left, EXIT_POLL_S))

    def close(self) -> None:
        self._sock.close()  # the zygote ends at end of file
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class ZygoteAgent:
    """``subprocess.Popen``'s part a launch uses (pid, poll, wait, returncode)
    for an agent forked by a Zygote."""

    def __init__(self, zygote: Zygote, pid: int, args: list[str]) -> None:
        self.zygote, self.pid, self.args, self.returncode = zygote, pid, args, None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.zygote.exit_code(self.pid, 0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            code = self.zygote.exit_code(self.pid, timeout)
            if code is None:
                raise subprocess.TimeoutExpired(["torchrun", *self.args], timeout)
            self.returncode = code
        return self.returncode


_ZYGOTES: dict[tuple, Zygote] = {}
_FAILED: dict[tuple, str] = {}  # keys whose zygote could not start: why
_TOUCH_CUDA: set[str] = set()  # modules whose import initialised CUDA: ranks import them after the fork
_WARMING: dict[tuple, threading.Thread] = {}  # zygotes starting in the background (warm)
_WARMING_LOCK = threading.Lock()


def warm(python: str, env: dict[str, str], preload: list[str], cuda: bool) -> None:
    """Start the zygote a launch in ``env`` will use on a thread and return:
    its imports (seconds of torch's) then run beside the launcher's own, on
    another core. The launch's ``zygote_for`` waits for it; a warm start that
    failed is that call's ZygoteError. Nothing where one is there or starting."""
    key = zygote_key(python, env, os.getcwd())
    with _WARMING_LOCK:
        if key in _WARMING or key in _FAILED or (key in _ZYGOTES and _ZYGOTES[key].alive()):
            return
        thread = threading.Thread(target=_warm_start, args=(python, env, preload, cuda),
                                  name="perfsuite-zygote-warm", daemon=True)
        _WARMING[key] = thread
    thread.start()


def _warm_start(python: str, env: dict[str, str], preload: list[str], cuda: bool) -> None:
    try:
        zygote_for(python, env, preload, cuda)
    except ZygoteError:  # filed in _FAILED: the launch says it
        pass


def _wait_for_warm_start(key: tuple) -> None:
    with _WARMING_LOCK:
        thread = _WARMING.get(key)
    if thread is None or thread is threading.current_thread():
        return
    thread.join()
    with _WARMING_LOCK:
        _WARMING.pop(key, None)


def zygote_for(python: str, env: dict[str, str], preload: list[str], cuda: bool) -> Zygote:
    """The zygote of this launch's interpreter, directory and environment,
    started on first use, with ``preload`` imported but for modules whose
    import initialised CUDA. ``cuda``: the ranks use CUDA, so the zygote must
    have left it alone; one that did not is replaced by one without the module
    that touched it. Raises ZygoteError saying why there is none."""
    cwd = os.getcwd()
    key = zygote_key(python, env, cwd)
    _wait_for_warm_start(key)
    if key in _FAILED:
        raise ZygoteError(_FAILED[key])
    zygote = _ZYGOTES.pop(key, None)
    for _ in range(3):
        modules = [m for m in preload if m not in _TOUCH_CUDA]
        try:
            if zygote is None or not zygote.alive():
                while len(_ZYGOTES) >= MAX_ZYGOTES:
                    _ZYGOTES.pop(next(iter(_ZYGOTES))).close()
                zygote = Zygote(python, {k: v for k, v in env.items() if k not in PER_LAUNCH_ENV}, cwd, modules)
            else:
                zygote.preload(modules)
        except (ZygoteError, OSError) as err:
            _FAILED[key] = f"no zygote: {err}"
            raise ZygoteError(_FAILED[key]) from None
        if zygote.cuda_clean or not cuda:
            _ZYGOTES[key] = zygote  # the most recently used last
            return zygote
        if zygote.cuda_touched_by is None:
            break
        _TOUCH_CUDA.add(zygote.cuda_touched_by)  # on a machine with GPUs its import asks CUDA
        zygote.close()
        zygote = None
    if zygote is not None:
        zygote.close()
    raise ZygoteError("the zygote's imports initialised CUDA, which a forked rank could then not use")


def start_forked(argv: list[str], log_fd: int, env: dict[str, str], python: str, preload: list[str],
                 cuda: bool) -> ZygoteAgent:
    """torchrun's agent for ``argv``, forked from the zygote of this launch
    (a new one where a module it imported changed since). Raises ZygoteError
    where there is none."""
    for attempt in range(2):
        zygote = zygote_for(python, env, preload, cuda)
        try:
            return zygote.launch(argv, log_fd, env, os.getcwd())
        except ZygoteStale:
            if attempt:
                raise
            _ZYGOTES.pop(zygote_key(python, env, os.getcwd()), None)
            zygote.close()
    raise AssertionError("unreachable")


def close_zygotes() -> None:
    for key in list(_WARMING):  # a warm start under way ends first, then with the rest
        _wait_for_warm_start(key)
    while _ZYGOTES:
        _ZYGOTES.popitem()[1].close()
