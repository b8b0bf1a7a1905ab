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
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import traceback

from perfsuite.system.lifetime import die_with_parent, libc_prctl

TORCHRUN = ["-m", "torch.distributed.run"]


def can_fork(argv: list[str]) -> bool:
    """True for a plain torchrun command line of this very interpreter."""
    return (sys.platform == "linux" and os.environ.get("PERFSUITE_FORK_AGENT", "1") != "0"
            and argv[:3] == [sys.executable, *TORCHRUN])


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
        code = 1
        try:
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
            sys.argv = ["torchrun", *self.args]
            main(self.args)
            code = 0
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        except BaseException:  # noqa: BLE001 - the log must say why the agent failed
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

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
