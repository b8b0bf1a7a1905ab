"""How perfsuite's processes end: children with the one that started them
(Linux's parent-death signal), and a session on a signal.

Parent death is used on both sides: the launcher's torchrun agent dies with the
launcher, and each rank with its agent (perfsuite.launch.agent,
perfsuite.rank.worker). A session (``perfsuite run``, ``ab``, ``bisect``,
pytest's) takes SIGTERM and SIGHUP as it takes Ctrl-C, once
(``interrupt_on_signals``): the first ends the running cell, and any signal
after it waits for the bookkeeping (results.json, the report) to finish.
"""

from __future__ import annotations

import errno
import functools
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def libc_prctl():
    """libc's ``prctl`` through ctypes; None off Linux or where libc has none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return getattr(ctypes.CDLL(None, use_errno=True), "prctl", None)
    except OSError:
        return None


def die_with_parent(expected_ppid: int, prctl=None) -> bool:
    """Linux: this process gets SIGKILL when its parent ends (PR_SET_PDEATHSIG).

    ``expected_ppid`` is the parent it was started by: one that ended before
    this call left the process to init or a subreaper and no signal will come,
    so it exits at once. Only the thread that started this process counts as
    its parent: start it from one that lives as long as it should. ``prctl``:
    one resolved before a fork (no dynamic loading in a forked child). False,
    and nothing done, without prctl.
    """
    prctl = prctl or libc_prctl()
    if prctl is None or prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        return False
    if os.getppid() != expected_ppid:
        os._exit(1)
    return True


def die_with_me():
    """``preexec_fn`` for a child that is to end with this process; None without prctl."""
    prctl = libc_prctl()
    return None if prctl is None else functools.partial(die_with_parent, os.getpid(), prctl=prctl)


# The signals a session ends on as on Ctrl-C: a CI job cancelled or a
# scheduler's time limit (SIGTERM), a dropped ssh session (SIGHUP).
INTERRUPTING = ("SIGINT", "SIGTERM", "SIGHUP")
_state = {"first": None, "noted": False}
_FINISHING = (b"perfsuite: still keeping what was measured and writing the report; "
              b"this signal waits for that (SIGKILL stops at once, losing the report)\n")


def _detach_hung_up_terminal() -> None:
    """After SIGHUP the terminal is gone and every write to it fails (EIO):
    the end of the session then writes into /dev/null instead of failing."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    for fd in (1, 2):
        try:
            if _terminal(fd):
                os.dup2(null, fd)
        except OSError:
            continue
    os.close(null)


def _terminal(fd: int) -> bool:
    """A terminal, also one that hung up (isatty says no to that one: EIO)."""
    try:
        import termios
    except ImportError:
        return os.isatty(fd)
    try:
        termios.tcgetattr(fd)
        return True
    except termios.error as err:
        return err.args[0] == errno.EIO


def _on_signal(signum, frame):
    name = signal.Signals(signum).name
    if signum == getattr(signal, "SIGHUP", None):
        _detach_hung_up_terminal()
    if _state["first"] is not None:  # the session is already ending: let it finish
        if not _state["noted"]:
            _state["noted"] = True
            try:
                os.write(2, _FINISHING)
            except OSError:
                pass
        return
    _state["first"] = name
    raise KeyboardInterrupt("" if name == "SIGINT" else f"signal {name}")


def interrupt_on_signals():
    """SIGINT, SIGTERM and SIGHUP raise KeyboardInterrupt in the main thread,
    once; later ones are noted and ignored (``finishing``); one already
    ignored (nohup) is left so. Returns the function that puts the previous
    handlers back. Main thread only."""
    _state.update(first=None, noted=False)
    previous = {}
    for name in INTERRUPTING:
        sig = getattr(signal, name, None)
        # one ignored stays so: `nohup perfsuite run` is to outlive its terminal
        if sig is not None and signal.getsignal(sig) != signal.SIG_IGN:
            previous[sig] = signal.signal(sig, _on_signal)

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        _state.update(first=None, noted=False)

    return restore


def finishing() -> None:
    """The session is ending (an interruption is being kept): further signals
    from ``interrupt_on_signals`` no longer interrupt it."""
    if _state["first"] is None:
        _state["first"] = "finishing"


def working_directory_problem() -> str | None:
    """Why this process's working directory cannot be used (removed under
    it); None when it can. Ranks start there, and torch's own libraries fail
    to load from a removed one."""
    try:
        os.getcwd()
    except OSError as err:
        try:  # Linux names it still, as "<path> (deleted)"
            where = os.readlink("/proc/self/cwd").removesuffix(" (deleted)")
        except OSError:
            where = os.environ.get("PWD") or "(its path unknown)"
        return (f"the working directory {where} is gone ({err.strerror or err}): it was "
                "removed under this process; cd to an existing folder and run again")
    return None
