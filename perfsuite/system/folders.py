"""Whether a file can be written where it is to go: the history's SQLite
store, the ranks' cache; said before anything is written, so that a session
refuses at its start instead of failing after a launch."""

from __future__ import annotations

import os
from pathlib import Path


def folder_problem(path: Path, what: str = "the store") -> str | None:
    """Why a file at ``path`` (its folder made where missing) cannot be
    written, or None; checked without writing anything (``os.access``: a
    read-only mount says so to root too)."""
    if path.is_dir():
        return f"{path} is a folder, not a file"
    if path.exists():
        return None if os.access(path, os.R_OK | os.W_OK) else f"cannot write {what} {path}"
    folder = path.parent
    while not folder.exists() and folder != folder.parent:  # the folders made for it start here
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder} is a file, so {what} cannot be made under it"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"cannot write in {folder}" + (f", where {what} would be made" if folder != path.parent else "")
    return None
