"""Files written whole or not at all."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

_PROC_STATUS = "/proc/self/status"
_UMASK_LOCK = threading.Lock()


def _current_umask() -> int:
    """The process umask, read without changing it where the OS allows.

    Linux (4.7+) shows it in /proc/self/status. Elsewhere the only way is to
    set it and set it back, which is process-wide: the lock keeps two threads
    of ours from seeing each other's temporary value (code that calls
    ``os.umask`` itself is beyond its reach).
    """
    try:
        with open(_PROC_STATUS, encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o077)
        os.umask(mask)
    return mask


def _final_mode(path: Path) -> int:
    """The mode the written file gets: an existing file keeps its own (as an
    editor's save or ``cp`` onto it does), a new one gets what ``open()``
    would give it, 0666 less the umask (``mkstemp`` alone would leave 0600,
    which a teammate or a CI artifact uploader cannot read)."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return 0o666 & ~_current_umask()


def _naming(err: OSError, path: Path) -> OSError:
    """``err`` about ``path``, the file the caller asked for: a refusal
    otherwise names the hidden temporary file beside it (".trends.html.q4it76g3.tmp"),
    which the user never gave and cannot find. Errno and strerror stay."""
    if err.errno is None:
        return err
    if isinstance(err, FileExistsError) and not path.parent.is_dir():
        # mkdir(exist_ok=True) of a parent that is a file: what open() would say of the path
        return NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path))
    try:
        return type(err)(err.errno, err.strerror, str(path))
    except TypeError:  # a subclass of its own making: the plain kind, same errno
        return OSError(err.errno, err.strerror, str(path))


def atomic_write_chunks(path: Path | str, chunks: Iterable[Any]) -> None:
    """Write ``chunks`` (bytes-like, e.g. a numpy array's ``.data``) to a
    temporary file beside ``path``, then rename over it: whole or not at all.
    An OSError names ``path``, never the temporary file."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as err:
        raise _naming(err, path) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            if hasattr(os, "fchmod"):  # POSIX (Windows has no such modes to give)
                os.fchmod(fh.fileno(), _final_mode(path))
            for chunk in chunks:
                fh.write(chunk)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError):  # the write's own error is the one to tell
            Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise _naming(err, path) from None
        raise


def atomic_write_bytes(path: Path | str, data: bytes) -> None:
    """Write to a temporary file beside ``path``, then rename over it."""
    atomic_write_chunks(path, [data])


def atomic_write_text(path: Path | str, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path | str, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=1, sort_keys=False, allow_nan=True) + "\n")
