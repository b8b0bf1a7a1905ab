"""Processes that end with the one that started them (Linux's parent-death signal).

Used on both sides: the launcher's torchrun agent dies with the launcher, and
each rank with its agent (perfsuite.launch.agent, perfsuite.rank.worker).
"""

from __future__ import annotations

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
