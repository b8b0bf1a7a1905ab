"""Locks on folders perfsuite writes: one session per output directory, one
``baseline record`` at a time per baseline folder.

The lock itself is ``filelock``'s (``flock`` on POSIX), so the kernel drops
it when its holder dies, however it dies. Who holds it is written beside it
(pid, host, command, time) for the message a second session gets; a holder
file left by a dead process is how a stale lock is recognised and reported.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from perfsuite.system import atomic

LOCK_NAME = ".perfsuite.lock"
HOLDER_NAME = ".perfsuite.lock.json"


class LockBusy(RuntimeError):
    """The folder is held by another live process."""


def _holder_text(holder: dict[str, Any] | None) -> str:
    if not holder:
        return "another process"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("since", 0)))
    return (f"pid {holder.get('pid')} on host {holder.get('host')} since {since} "
            f"({' '.join(holder.get('argv', [])[:6])})")


def _read_holder(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class FolderNotMade(OSError):
    """The folder itself could not be made (as opposed to written into)."""


class FolderLock:
    """``with FolderLock(folder, purpose):`` or acquire()/release().

    ``wait_s`` 0 refuses at once when the folder is held (a second session
    into one output directory); a positive value waits that long (a second
    ``baseline record`` then merges with what the first wrote).
    """

    def __init__(self, folder: Path | str, purpose: str, wait_s: float = 0.0) -> None:
        self.folder, self.purpose, self.wait_s = Path(folder), purpose, wait_s
        self._lock = FileLock(str(self.folder / LOCK_NAME))
        self.took_over: dict[str, Any] | None = None  # the dead holder whose lock was taken
        self._made = False  # whether acquire made the folder

    @property
    def holder_file(self) -> Path:
        return self.folder / HOLDER_NAME

    def acquire(self) -> FolderLock:
        self._made = not self.folder.exists()
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise FolderNotMade(err.errno, err.strerror, err.filename) from None
        try:
            self._lock.acquire(timeout=self.wait_s)
        except Timeout:
            raise LockBusy(f"{self.folder} is in use ({self.purpose}) by "
                           f"{_holder_text(_read_holder(self.holder_file))}; wait for it to "
                           "finish, or choose another folder") from None
        # The kernel gave us the lock, so a holder file still here was left by a
        # process that died holding it (SIGKILL, a lost node): say whose it was.
        self.took_over = _read_holder(self.holder_file)
        me = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(),
              "argv": sys.argv, "purpose": self.purpose}
        try:  # whole or not at all; a full disk leaves no temporary file
            atomic.atomic_write_text(self.holder_file, json.dumps(me))
        except BaseException:  # not taken after all: the folder as it was
            self._tidy(holder_too=self.took_over is None)
            self._lock.release()
            raise
        return self

    def stale_message(self) -> str | None:
        if not self.took_over:
            return None
        return (f"{self.folder}: took over the lock left by {_holder_text(self.took_over)}, "
                "which is no longer running")

    def release(self) -> None:
        if self._lock.is_locked:
            self._tidy()
            self._lock.release()

    def _tidy(self, holder_too: bool = True) -> None:
        """A session that wrote nothing (refused after it took the folder)
        leaves nothing: the holder file goes (``holder_too``), then the lock
        file, and the folder if the lock made it. Done while still holding
        the lock; one that wrote keeps both."""
        try:
            if holder_too:
                self.holder_file.unlink(missing_ok=True)
            if {e.name for e in os.scandir(self.folder)} != {LOCK_NAME}:
                return
            (self.folder / LOCK_NAME).unlink()
            if self._made:
                self.folder.rmdir()
        except OSError:
            pass  # a file that came meanwhile, a read-only folder: left as it is

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
