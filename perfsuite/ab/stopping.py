"""How a resident A/B pair stops: once, in order, whatever stops it.

A Ctrl-C, SIGTERM or SIGHUP, a window past its timeout, a side whose launch failed
and a full disk end a pair alike (perfsuite.ab.resident.run_pair): the
coordinator ends the windows, each side's launch ends (its ranks ended
where they do not), its thread is joined, and only then do the socket and
the launcher's zygotes close. Signals are taken in the main thread; while
the sides stop, a further one of those signals is said and put off
(``deferred_interrupts``), so the cleanup is never broken off half-way.

The coordinator's socket lives in a short temporary folder named for the
process that made it (a Unix socket's path has 108 bytes, too few for
many an --out); one whose owner is gone (a session killed with SIGKILL)
is removed by the next session (``sweep_stale``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from perfsuite.system.lifetime import INTERRUPTING

SOCKET_PREFIX = "perfsuite-ab-"
FULL = (errno.ENOSPC, errno.EDQUOT)
FULL_WORDS = tuple(os.strerror(code) for code in FULL)
STOPPING = ("perfsuite ab: stopping: both sides' launches are ending and every window measured is kept; "
            "a few seconds more")
# A traceback's last line, a rank's prefix aside; torch's own wrapper of a rank's failure is not the cause.
_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]: ?")
_ERROR = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Interrupt)\b:?.*|^(?:error|fatal|ERROR|FATAL)\b:.*")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's: alive
        return True
    return True


def sweep_stale(root: Path | str | None = None) -> list[Path]:
    """Remove the socket folders of sessions whose process is gone; the folders removed."""
    removed = []
    for folder in Path(root or tempfile.gettempdir()).glob(f"{SOCKET_PREFIX}*"):
        owner = folder.name[len(SOCKET_PREFIX):].split("-", 1)[0]
        try:
            mine = folder.is_dir() and folder.stat().st_uid == os.getuid()
        except OSError:
            continue
        if mine and owner.isdigit() and not _alive(int(owner)):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def socket_folder() -> str:
    """A new folder for this session's socket, stale ones swept first."""
    sweep_stale()
    return tempfile.mkdtemp(prefix=f"{SOCKET_PREFIX}{os.getpid()}-")


@contextlib.contextmanager
def deferred_interrupts(say: Callable[[str], None] | None = None) -> Iterator[list[int]]:
    """Ctrl-C, SIGTERM and SIGHUP (the signals a session ends on,
    ``lifetime.INTERRUPTING``) said once and put off while the body runs (in
    the main thread; elsewhere signals never arrive); yields those that came."""
    came: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield came
        return
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))

    def later(signum: int, frame: Any) -> None:
        if not came:
            say(STOPPING)
        came.append(signum)

    signals = [getattr(signal, name) for name in INTERRUPTING if hasattr(signal, name)]
    # one already ignored stays so (`nohup perfsuite ab`)
    previous = {sig: signal.signal(sig, later) for sig in signals if signal.getsignal(sig) != signal.SIG_IGN}
    try:
        yield came
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


def end_processes(pids: Iterable[int], grace_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL where one is still there after ``grace_s``."""
    import psutil

    processes = []
    for pid in set(pids):
        with contextlib.suppress(psutil.Error, ValueError):
            if pid > 0 and pid != os.getpid():
                processes.append(psutil.Process(pid))
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, grace_s)):
        for process in processes:
            with contextlib.suppress(psutil.Error):
                process.send_signal(sig)
        _, processes = psutil.wait_procs(processes, timeout=wait)
        if not processes:
            return


def join_all(threads: Iterable[threading.Thread], timeout_s: float) -> list[threading.Thread]:
    """Join every thread within ``timeout_s`` in all; those still running."""
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(max(deadline - time.monotonic(), 0.0))
    return [t for t in threads if t.is_alive()]


def is_full(err: BaseException | str | None) -> bool:
    """Whether an error (or a launch's reason) is a full disk or quota."""
    if isinstance(err, OSError):
        return err.errno in FULL
    return isinstance(err, str) and any(words in err for words in FULL_WORDS)


def first_error(result: dict[str, Any]) -> str | None:
    """The first error line in a failed launch's output (its log's tail), if any."""
    text = result.get("output_tail")
    if text is None and result.get("dir"):
        with contextlib.suppress(OSError):
            text = (Path(result["dir"]) / "output.log").read_text(errors="replace")[-8000:]
    for line in (text or "").splitlines():
        line = _PREFIX.sub("", line).strip()
        if _ERROR.match(line) and "ChildFailedError" not in line:
            return line
    return None


def side_failed(name: str, result: dict[str, Any], what: str | None = None, launch: str = "'s launch") -> str:
    """A side's failure in a sentence: what ended it, its reason, the first error in its log."""
    reason = str(result.get("reason") or what or "no result")
    said = f"side {name}{launch} ended {result.get('status', 'error')}: {reason}"
    if what and what not in reason:
        said = f"{what}; {said}"
    error = first_error(result)
    if error and error not in said:
        said += f"; first error in its log: {error}"
    log = Path(result["dir"]) / "output.log" if result.get("dir") else None
    return said + (f" ({log})" if log is not None and log.exists() else "")
