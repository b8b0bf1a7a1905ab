"""The launcher's end of its zygotes: the client of one (``Zygote``), the
agent it forked (``ZygoteAgent``) and the one pool of them (``ZygotePool``,
``POOL``) that a launcher's launches share.

How a launch starts its processes, and which forks or execs which, is
perfsuite.launch.starting's docstring; the zygote's own side is
perfsuite/launch/zygote.py.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

TORCHRUN = ["-m", "torch.distributed.run"]
FORKED_RANK = Path(__file__).parent.parent / "rank" / "forked.py"  # torchrun --run-path runs it in each rank
ZYGOTE_SOURCE = Path(__file__).with_name("zygote.py")
RANK_START_ENV = "PERFSUITE_RANK_START"  # "exec": every rank a fresh interpreter
FORK_AGENT_ENV = "PERFSUITE_FORK_AGENT"  # "0": no agent forked from a zygote (read as LaunchOptions are built)
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
# torchrun's agent asks torch.accelerator.is_available() as it reads its
# options (LaunchConfig, torch 2.9+), and on a GPU host that poisons every
# fork after it: a forked rank then cannot start CUDA. Set for the agent, the
# check reads NVML instead, which poisons nothing; perfsuite/rank/forked.py
# takes it out of the rank's environment again where perfsuite put it there.
NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"
NVML_CHECK_SET = "PERFSUITE_NVML_CHECK_SET"


def with_nvml_check(env: dict[str, str]) -> dict[str, str]:
    return env if NVML_CHECK in env else {**env, NVML_CHECK: "1", NVML_CHECK_SET: "1"}


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
        self.running: set[int] = set()  # its agents not yet ended: it must outlive them
        self._replies: list[dict] = []  # answers read by a thread waiting for an exit
        self.preloaded: set[str] = set()
        self.failed: dict[str, str] = {}
        self.cuda_clean, self.cuda_touched_by = True, None
        self.startup: dict[str, str] = {}  # start-up modules (sitecustomize) it ran once, for every rank
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
        self.startup.update(answer.get("startup", {}))

    def _receive(self, timeout: float | None) -> dict | None:
        """One message, or None when none came within ``timeout``; exits are
        filed as they come. Raises ZygoteError once the zygote is gone. Called
        with the lock held."""
        if self._sock.fileno() < 0:
            raise ZygoteError("the zygote was ended")
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
            self.running.discard(message["exit"])
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
            self.running.add(answer["pid"])
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
                    self._drain()
                except ZygoteError:  # its agents died with it (the parent-death signal)
                    self._exits.setdefault(pid, -signal.SIGKILL)
                if pid in self._exits:
                    return self._exits.pop(pid)
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            if self._sock.fileno() >= 0:  # else the next round files the agent as ended with it
                select.select([self._sock], [], [], EXIT_POLL_S if left is None else min(left, EXIT_POLL_S))

    def _drain(self) -> None:
        """File the messages already sent: exits, and answers another thread is
        about to ask for. Called with the lock held; raises ZygoteError once the
        zygote is gone."""
        while (message := self._receive(0.0)) is not None:
            if "exit" not in message:
                self._replies.append(message)

    def busy(self) -> bool:
        """Whether an agent of its still runs (the exits already sent filed first)."""
        with self._lock:
            try:
                self._drain()
            except ZygoteError:  # its agents died with it
                self.running.clear()
        return bool(self.running)

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


class ZygotePool:
    """The zygotes of one launcher, one per interpreter, working directory and
    environment (``zygote_key``), at most ``limit`` (the least recently used
    is ended for another); each started on first use, or beforehand on a
    thread (``warm``). A zygote that could not start is not tried again for
    its key. Every zygote's environment asks CUDA through NVML
    (``with_nvml_check``), so a launch whose ranks fork and one whose ranks
    exec share one. ``make``: the zygote's constructor (tests pass a stand-in)."""

    def __init__(self, make: Callable[..., Zygote] | None = None, limit: int = MAX_ZYGOTES) -> None:
        self.make, self.limit = make or Zygote, limit
        self.zygotes: dict[tuple, Zygote] = {}  # the most recently used last
        # Replaced (a module changed, or the least recently used) while an agent of theirs
        # ran: ended once idle, as closing one ends its agents' launches.
        self.retired: list[Zygote] = []
        self._retired_lock = threading.Lock()
        self.failed: dict[tuple, str] = {}  # keys whose zygote could not start: why
        self.touch_cuda: set[str] = set()  # modules whose import initialised CUDA: ranks import them after the fork
        self.warming: dict[tuple, threading.Thread] = {}  # zygotes starting in the background
        self._warming_lock = threading.Lock()

    @staticmethod
    def key(python: str, env: dict[str, str]) -> tuple:
        return zygote_key(python, with_nvml_check(env), os.getcwd())

    def warm(self, python: str, env: dict[str, str], preload: list[str], cuda: bool) -> None:
        """Start the zygote a launch in ``env`` will use on a thread and return:
        its imports (seconds of torch's) then run beside the launcher's own, on
        another core. The launch's ``zygote_for`` waits for it; a warm start that
        failed is that call's ZygoteError. Nothing where one is there or starting."""
        key = self.key(python, env)
        with self._warming_lock:
            if (key in self.warming or key in self.failed
                    or (key in self.zygotes and self.zygotes[key].alive())):
                return
            thread = threading.Thread(target=self._warm_start, args=(python, env, preload, cuda),
                                      name="perfsuite-zygote-warm", daemon=True)
            self.warming[key] = thread
        thread.start()

    def _warm_start(self, python: str, env: dict[str, str], preload: list[str], cuda: bool) -> None:
        try:
            self.zygote_for(python, env, preload, cuda)
        except ZygoteError:  # filed in self.failed: the launch says it
            pass

    def _wait_for_warm_start(self, key: tuple) -> None:
        with self._warming_lock:
            thread = self.warming.get(key)
        if thread is None or thread is threading.current_thread():
            return
        thread.join()
        with self._warming_lock:
            self.warming.pop(key, None)

    def zygote_for(self, python: str, env: dict[str, str], preload: list[str], cuda: bool) -> Zygote:
        """The zygote of this launch's interpreter, directory and environment,
        started on first use, with ``preload`` imported but for modules whose
        import initialised CUDA. ``cuda``: the ranks use CUDA, so the zygote must
        have left it alone; one that did not is replaced by one without the module
        that touched it. Raises ZygoteError saying why there is none."""
        cwd, env = os.getcwd(), with_nvml_check(env)
        key = zygote_key(python, env, cwd)
        self._wait_for_warm_start(key)
        if key in self.failed:
            raise ZygoteError(self.failed[key])
        zygote = self.zygotes.pop(key, None)
        self._retire()
        for _ in range(3):
            modules = [m for m in preload if m not in self.touch_cuda]
            try:
                if zygote is None or not zygote.alive():
                    while len(self.zygotes) >= self.limit:
                        self._retire(self.zygotes.pop(next(iter(self.zygotes))))
                    zygote = self.make(python, {k: v for k, v in env.items() if k not in PER_LAUNCH_ENV},
                                       cwd, modules)
                else:
                    zygote.preload(modules)
            except (ZygoteError, OSError) as err:
                self.failed[key] = f"no zygote: {err}"
                raise ZygoteError(self.failed[key]) from None
            if zygote.cuda_clean or not cuda:
                self.zygotes[key] = zygote
                return zygote
            if zygote.cuda_touched_by is None:
                break
            self.touch_cuda.add(zygote.cuda_touched_by)  # on a machine with GPUs its import asks CUDA
            zygote.close()
            zygote = None
        if zygote is not None:
            zygote.close()
        raise ZygoteError("the zygote's imports initialised CUDA, which a forked rank could then not use")

    def launch(self, argv: list[str], log_fd: int, env: dict[str, str], python: str, preload: list[str],
               cuda: bool) -> ZygoteAgent:
        """torchrun's agent for ``argv`` (``python -m torch.distributed.run
        ...``), forked from the zygote of this launch (a new one where a module
        it imported changed since), in ``env`` as given. Raises ZygoteError
        where there is none."""
        for attempt in range(2):
            zygote = self.zygote_for(python, env, preload, cuda)
            try:
                return zygote.launch(argv, log_fd, env, os.getcwd())
            except ZygoteStale:
                if attempt:
                    raise
                self.zygotes.pop(self.key(python, env), None)
                self._retire(zygote)
        raise AssertionError("unreachable")

    def _retire(self, zygote: Zygote | None = None) -> None:
        """End ``zygote`` once no agent of its runs, and the retired that are idle now."""
        with self._retired_lock:  # the sides of an A/B session launch from two threads
            for old in [*self.retired, *([zygote] if zygote is not None else [])]:
                if old in self.retired:
                    self.retired.remove(old)
                if old.busy():
                    self.retired.append(old)
                else:
                    old.close()

    def close(self) -> None:
        for key in list(self.warming):  # a warm start under way ends first, then with the rest
            self._wait_for_warm_start(key)
        while self.zygotes:
            self.zygotes.popitem()[1].close()
        while self.retired:  # the session's end: its launches have ended
            self.retired.pop().close()


POOL = ZygotePool()  # this launcher's


def close_zygotes() -> None:
    """End this launcher's zygotes (at the end of a session)."""
    POOL.close()
