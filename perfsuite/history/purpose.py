"""What a stored run is for: ``run``, ``experiment`` or ``ad-hoc``.

Nothing measured is dropped, but the series read ``run`` only unless asked
for more (``--include``): an injected fault, a workload option or a look at
one cell in a folder of its own never moves a series.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfsuite.history.errors import HistoryError
from perfsuite.history.schema import DEFAULT_PATH, DEFAULT_PURPOSE, HISTORY_ENV, PURPOSES


@dataclass(frozen=True)
class Purpose:
    """What a stored run is for (one of ``PURPOSES``) and why it got that mark."""

    name: str = DEFAULT_PURPOSE
    why: str | None = None
    declared: bool = False  # asked for (--purpose, --history-purpose), not derived


def run_purpose(options: Mapping[str, Any] | None = None, *, out_dir: Path | str | None = None,
                store_named: bool = True, declared: str | Purpose | None = None,
                cwd: Path | str | None = None) -> Purpose:
    """The purpose a run is stored with:

    - ``experiment``: it was launched with an injected fault (always: a fault
      never measures the code as it is), or, unless declared otherwise, with
      any workload option (``--option`` / ``--perf-option KEY=VALUE``);
    - ``declared``, when given (``--history-purpose``, ``--perf-history-purpose``,
      ``history add --purpose``);
    - ``ad-hoc``: no store was named for it (no --history / --perf-history,
      no $PERFSUITE_HISTORY), so it goes to the default store
      ``.perfsuite/history.sqlite``, and its output folder lies outside that
      store's folder ``.perfsuite/`` (``perfsuite run CELL --out /tmp/one``):
      the default store keeps the runs written beside it;
    - else ``run``.
    """
    options = dict(options or {})
    if isinstance(declared, str):
        declared = Purpose(declared, None, declared=True)
    if declared is not None and declared.name not in PURPOSES:
        raise HistoryError(f"purpose {declared.name!r}: expected one of {', '.join(PURPOSES)}")
    if options.get("fault"):
        return Purpose("experiment", f"fault={options['fault']}", declared=declared is not None)
    if declared is not None:
        return Purpose(declared.name, declared.why, declared=True)
    if options:
        return Purpose("experiment", ", ".join(f"{k}={v}" for k, v in sorted(options.items())))
    if not store_named and out_dir is not None:
        folder = Path(cwd or Path.cwd()) / DEFAULT_PATH.parent
        if not _inside(Path(out_dir), folder):
            return Purpose("ad-hoc", f"its output folder {out_dir} is outside {DEFAULT_PATH.parent}/, "
                                     f"where the default store keeps its runs")
    return Purpose(DEFAULT_PURPOSE)


def store_named(url: str | os.PathLike | None) -> bool:
    """Whether a run's store was named (an URL or path, or $PERFSUITE_HISTORY)
    rather than left to the default ``.perfsuite/history.sqlite``."""
    return (url is not None and str(url) != "") or bool(os.environ.get(HISTORY_ENV))


def parse_include(values: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    """The purposes a reader takes besides ``run``, from ``--include
    experiment,ad-hoc`` (repeatable; ``all`` for every one)."""
    if isinstance(values, str):
        values = [values]
    names = [n.strip() for v in values or () for n in str(v).split(",") if n.strip()]
    unknown = [n for n in names if n not in (*PURPOSES, "all")]
    if unknown:
        raise ValueError(f"--include {unknown[0]}: expected {', '.join(p for p in PURPOSES if p != DEFAULT_PURPOSE)} "
                         "or all (comma-separated)")
    if "all" in names:
        return tuple(p for p in PURPOSES if p != DEFAULT_PURPOSE)
    return tuple(dict.fromkeys(n for n in names if n != DEFAULT_PURPOSE))


def left_out_line(left_out: Mapping[str, int]) -> str | None:
    """The note a reader prints about the runs it left out; None for none."""
    if not left_out:
        return None
    parts = ", ".join(f"{n} {purpose} run(s)" for purpose, n in sorted(left_out.items()))
    return f"left out: {parts} (--include {','.join(sorted(left_out))} takes them)"


def _inside(path: Path, folder: Path) -> bool:
    try:
        return path.resolve().is_relative_to(folder.resolve())
    except OSError:
        return False
