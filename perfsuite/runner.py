"""A session's cells: each measured once, judged, and kept in results.json.

Shared by the pytest plugin and ``perfsuite run`` so both take one path.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from perfsuite.cells import Cell
from perfsuite.launch import LaunchOptions


def default_out_dir(root: Path | str = ".") -> Path:
    # Time and pid: two runs on one machine never share a directory.
    return Path(root) / ".perfsuite" / f"run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


class Runner:
    def __init__(self, out_dir: Path | str, launch: LaunchOptions | None = None) -> None:
        self.out_dir = Path(out_dir)
        self.launch = launch or LaunchOptions()
        self._results: dict[str, dict[str, Any]] = {}
        self._file = None

    @property
    def file(self):
        if self._file is None:  # created on first use: runs without cells write nothing
            from perfsuite.hardware import fingerprint
            from perfsuite.results import ResultsFile

            self._file = ResultsFile(self.out_dir, env=fingerprint())
        return self._file

    def result(self, cell: Cell) -> dict[str, Any]:
        """The cell's judged result, measured on first request only."""
        if cell.id not in self._results:
            from perfsuite.judge import judge
            from perfsuite.launch import run_cell

            result = run_cell(cell, self.out_dir, self.launch)
            result["checks"] = judge(cell, result)
            self._results[cell.id] = result
            self.file.add(result)
        return self._results[cell.id]

    @property
    def results(self) -> list[dict[str, Any]]:
        return list(self._results.values())
