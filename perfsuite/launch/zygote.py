"""An interpreter that imports torch and the workloads once and forks torchrun's agents.

A rank that torchrun starts as a fresh interpreter spends its first seconds
importing (on the 2-core VM torch 2.2 s, then torchvision or DDP's
``torch._dynamo`` 1.5-2 s, torchtune ~4 s), and so does every launch again.
This process imports them once per launcher, then for each launch forks
torchrun's agent, which runs torchrun's own ``main`` on the launch's command
line. Where the ranks fork, that command line asks torchrun to fork them
(``--start-method=fork --run-path perfsuite/rank/forked.py``: elastic_launch
with a function entrypoint, ``LaunchConfig.start_method``), so each rank
starts with everything imported; where they exec, the agent alone skips the
imports. Rendezvous, rank processes, restarts and tee stay torchrun's. The
whole picture: perfsuite.launch.starting.

Why a process of its own, not the launcher: a launcher (pytest, ``perfsuite
run``) may have initialised CUDA (``torch.cuda.is_available``, the
fingerprint), after which a forked child cannot use it; it may run threads
(``perfsuite ab``'s sides), of which a fork keeps only the forking one; and a
rank forked from the launcher would carry its memory (peak RSS) and state.
This one only imports. Whether its imports touched CUDA all the same (``cudaGetDeviceCount``
marks every later fork "bad") is checked in a forked probe after every
import; the launcher forks no CUDA cell's ranks from one that did.

What a forked process shares with this one: the imported modules (pages shared
until written) and what their imports did, under the environment this one was
started with (the launcher keeps one zygote per environment and working
directory: ``perfsuite.launch.agent.zygote_key``). Each agent gets its launch's
environment (with what the imports set in theirs), working directory and log;
each rank the signal handlers and thread count of a fresh interpreter
(``perfsuite/rank/forked.py``).

Protocol, over a SOCK_SEQPACKET socket pair, one JSON object a message:
``{"op": "preload", "modules": [...]}`` -> ``{"preloaded", "failed", "cuda_clean"}`` (the
first answer, unasked, also has ``startup``: a sitecustomize it ran);
``{"op": "launch", "args", "env", "cwd", "title"}`` with the log's file
descriptor -> ``{"pid"}``, or ``{"stale": path}`` where an imported module's
source changed since (the launcher starts a new zygote); and unasked, ``{"exit": pid, "code": code}`` once
an agent ends. End of file from the launcher ends this process; so does the
launcher's death (the parent-death signal).

The launcher runs this file as a script under the launch's interpreter,
which need not be the launcher's: it imports nothing of perfsuite but,
where that interpreter's perfsuite has it, perfsuite.system.title. A script,
not ``python -c``: torchrun's rendezvous names its callers with
``inspect.stack()``, which looks through every loaded module for each frame
from no file ("<string>"): 0.35 s of every launch with torch._dynamo and
torchvision loaded.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and not sys.flags.safe_path:
    # Python put this file's folder first on the path (its modules could shadow
    # others of the same name); `python -m` puts the working directory.
    sys.path[0] = os.getcwd()

import json  # noqa: E402
import select  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import traceback  # noqa: E402

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
MESSAGE_BYTES = 1 << 20
LEFTOVER_GRACE_S = 3.0  # a process the ranks left: SIGTERM, then SIGKILL after this


def _prctl():
    try:
        import ctypes

        return getattr(ctypes.CDLL(None, use_errno=True), "prctl", None)
    except OSError:
        return None


def set_title(args: list[str]) -> bool:
    """perfsuite.system.title's, where this interpreter's perfsuite has it."""
    try:
        from perfsuite.system.title import set_title as retitle
    except ImportError:  # another interpreter's perfsuite, older than this file
        return False
    return retitle(args)


def _cuda_clean() -> bool:
    """Whether a child forked now could use CUDA: torch marks a fork "bad"
    once this process asked CUDA anything (torch.cuda.is_available included)."""
    torch = sys.modules.get("torch")
    bad_fork = getattr(getattr(torch, "_C", None), "_cuda_isInBadFork", None)
    if bad_fork is None:
        return True
    pid = os.fork()
    if pid == 0:
        os._exit(1 if bad_fork() else 0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def preload(modules: list[str]) -> dict:
    """Import ``modules``; which failed, and the first whose import touched CUDA."""
    import importlib

    loaded, failed, clean, touched_by = [], {}, _cuda_clean(), None
    for name in modules:
        try:
            importlib.import_module(name)
            loaded.append(name)
        except BaseException as err:  # noqa: BLE001 - the launcher decides; ranks import it themselves
            failed[name] = f"{type(err).__name__}: {err}"
        if clean and "torch" in sys.modules:
            clean = _cuda_clean()
            touched_by = None if clean else name
    # What the imports made stays out of every forked process's garbage
    # collections (gc.freeze, as forking servers do): a rank's gc.collect
    # (torchtune's before training) otherwise walked the ~445 000 objects of
    # torch, torchtune and datasets, 0.2-0.3 s a call on the 2-core VM, and
    # wrote their pages (the reference counts) that the fork had shared.
    import gc

    gc.collect()
    gc.freeze()
    return {"preloaded": loaded, "failed": failed, "cuda_clean": clean, "cuda_touched_by": touched_by}


class Server:
    def __init__(self, sock: socket.socket, launcher: int) -> None:
        self.sock, self.launcher = sock, launcher
        self.agents: set[int] = set()
        self.started_env = dict(os.environ)
        self.files: dict[str, tuple[int, int]] = {}
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the select below

    def note_files(self) -> None:
        """The source files of every module imported so far, as they are now."""
        for module in list(sys.modules.values()):
            path = getattr(module, "__file__", None)
            if isinstance(path, str) and os.path.isabs(path) and path not in self.files:
                try:
                    found = os.stat(path)
                except OSError:
                    continue
                self.files[path] = (found.st_mtime_ns, found.st_size)

    def stale(self) -> str | None:
        """A module's source file that changed since it was imported (a
        checkout moved to another commit, a package reinstalled): a forked
        rank would run the old code, a fresh one the new. ~15 ms for torch's
        2 300 files."""
        for path, seen in self.files.items():
            try:
                found = os.stat(path)
            except OSError:
                return path
            if (found.st_mtime_ns, found.st_size) != seen:
                return path
        return None

    def send(self, message: dict, fds: list[int] = ()) -> None:
        data = json.dumps(message).encode()
        if fds:
            socket.send_fds(self.sock, [data], fds)
        else:
            self.sock.send(data)

    def reap(self) -> None:
        if not self.agents:
            return
        for pid, status in _reaped():
            if pid in self.agents:
                self.agents.discard(pid)
                self.send({"exit": pid, "code": os.waitstatus_to_exitcode(status)})
            if not self.agents:
                return

    def serve(self) -> None:
        while True:
            try:
                ready, _, _ = select.select([self.sock, self.wake_r], [], [], 1.0)
            except InterruptedError:
                continue
            if os.getppid() != self.launcher:  # the launcher is gone (a child of it may hold the socket)
                return
            if self.wake_r in ready:
                os.read(self.wake_r, 4096)
                self.reap()
            if self.sock in ready:
                data, fds, _, _ = socket.recv_fds(self.sock, MESSAGE_BYTES, 4)
                if not data:  # the launcher closed its end, or is gone
                    return
                message = json.loads(data)
                if message["op"] == "preload":
                    answer = preload(message["modules"])
                    self.note_files()
                    self.send(answer)
                elif message["op"] == "launch":
                    changed = self.stale()
                    if changed is not None:
                        for fd in fds:
                            os.close(fd)
                        self.send({"stale": changed})
                        continue
                    pid = os.fork()
                    if pid == 0:
                        self.agent(message, fds[0])  # never returns
                    self.agents.add(pid)
                    for fd in fds:
                        os.close(fd)
                    self.send({"pid": pid})
                self.reap()

    def agent(self, message: dict, log_fd: int) -> None:
        """The forked agent: torchrun's main on the launch's arguments, in a
        session of its own, dying with this process."""
        def body() -> None:
            os.setsid()  # a timeout or Ctrl-C ends the launch's whole tree
            prctl = _prctl()
            if prctl is not None:
                prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
            # What a rank leaves (a helper that called setsid, a double-forked
            # daemon) becomes this agent's, never init's, and ends with it:
            # the launcher finds it in the tree it watches, as an exec'd
            # process's environment names the launch (a forked one's does not).
            become_subreaper()
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGPIPE):
                signal.signal(sig, signal.SIG_DFL)
            for fd in (self.sock.fileno(), self.wake_r, self.wake_w):
                os.close(fd)
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
            os.close(log_fd)
            sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
            sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
            os.chdir(message["cwd"])
            # What the preloaded modules put into the environment as they were
            # imported (os.environ.setdefault), a fresh rank's imports would too.
            imported = {k: v for k, v in os.environ.items() if self.started_env.get(k) != v}
            os.environ.clear()
            os.environ.update({**imported, **message["env"]})
            set_title(message["title"])
            from torch.distributed.run import main

            run_torchrun(main, message["args"])

        exit_after(body)


def run_torchrun(main, args: list[str]) -> None:
    """torchrun's ``main`` on ``args``, as its command line would run it."""
    sys.argv = ["torchrun", *args]
    main(args)


def exit_after(body) -> None:
    """Run ``body`` (a forked agent's set-up and torchrun's main), then end
    this process with its exit code, never returning: torchrun's SystemExit
    code, 0 when it returned, 1 when it raised (its traceback in the log)."""
    code = 1
    try:
        body()
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException:  # noqa: BLE001 - the log must say why the agent failed
        traceback.print_exc()
    finally:
        try:
            end_leftovers()
        except BaseException:  # noqa: BLE001 - the launcher ends what is left
            traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def become_subreaper() -> bool:
    """This process adopts its descendants' orphans (PR_SET_CHILD_SUBREAPER)."""
    prctl = _prctl()
    return prctl is not None and prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def _reaped():
    """(pid, wait status) of each of this process's children that has ended,
    reaped as it is yielded, until none is left to reap."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, status


def _children() -> list[int]:
    """This process's live children (zombies reaped here)."""
    import psutil  # at the launch's end only: the agent's start imports nothing more

    for _ in _reaped():
        pass
    found = []
    for child in psutil.Process().children():
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                found.append(child.pid)
        except psutil.Error:  # ended meanwhile
            continue
    return found


def end_leftovers(grace_s: float = LEFTOVER_GRACE_S) -> list[int]:
    """End what the ranks left to this agent (its subreaper's orphans, once
    torchrun's main returned, all its ranks ended): SIGTERM, SIGKILL after
    ``grace_s``; their own children, orphaned in turn, with them. The pids
    found, in the order found."""
    import time

    signalled: dict[int, float] = {}
    deadline = time.monotonic() + grace_s + 5.0
    while (left := _children()) and time.monotonic() < deadline:
        now = time.monotonic()
        for pid in left:
            sig = signal.SIGTERM if pid not in signalled else signal.SIGKILL
            if pid in signalled and now - signalled[pid] < grace_s:
                continue
            signalled.setdefault(pid, now)
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    return list(signalled)


def startup_modules() -> dict[str, str]:
    """The start-up modules Python ran in this process before anything else
    (``site`` imports them: a ``sitecustomize`` or ``usercustomize`` on the
    path), by the file each came from. They ran here once: a forked rank
    inherits what they did and never runs them itself."""
    return {name: str(getattr(sys.modules[name], "__file__", None))
            for name in ("sitecustomize", "usercustomize") if name in sys.modules}


def main(argv: list[str]) -> None:
    """argv: [..., "--fd=N", "--launcher=PID", "--preload=a,b", room]."""
    opts = dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)
    launcher = int(opts["launcher"])
    # No parent-death signal here: it fires when the launcher's *thread* that
    # started this process ends (an A/B side's thread after its first launch),
    # not the launcher. End of file on the socket, or a new parent, tells.
    if os.getppid() != launcher:
        os._exit(1)
    sock = socket.socket(fileno=int(opts["fd"]))
    server = Server(sock, launcher)
    set_title([sys.executable, __file__, "(perfsuite: torch and the workloads imported; forks torchrun's agents)"])
    answer = preload([m for m in opts.get("preload", "").split(",") if m])
    server.note_files()
    server.send({"ready": True, "pid": os.getpid(), "startup": startup_modules(), **answer})
    server.serve()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv)
