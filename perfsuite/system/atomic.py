"""Files written whole or not at all."""

from __future__ import annotations

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


def atomic_write_chunks(path: Path | str, chunks: Iterable[Any]) -> None:
    """Write ``chunks`` (bytes-like, e.g. a numpy array's ``.data``) to a
    temporary file beside ``path``, then rename over it: whole or not at all."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            if hasattr(os, "fchmod"):  # POSIX (Windows has no such modes to give)
                os.fchmod(fh.fileno(), _final_mode(path))
            for chunk in chunks:
                fh.write(chunk)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: Path | str, data: bytes) -> None:
    """Write to a temporary file beside ``path``, then rename over it."""
    atomic_write_chunks(path, [data])


def atomic_write_text(path: Path | str, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path | str, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=1, sort_keys=False, allow_nan=True) + "\n")
