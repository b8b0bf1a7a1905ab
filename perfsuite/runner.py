"""A session's cells: each measured once, judged, and kept in results.json.

Shared by the pytest plugin and ``perfsuite run`` so both take one path.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from perfsuite.cells import Cell
from perfsuite.launch import LaunchOptions


def default_out_dir(root: Path | str = ".") -> Path:
    # Time and pid: two runs on one machine never share a directory.
    return Path(root) / ".perfsuite" / f"run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def _interrupt_on_sigterm(signum, frame):
    # SIGTERM (a CI job cancelled, a scheduler's time limit) takes the same
    # path as Ctrl-C: the running cell's ranks are ended, results stay.
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def handle_sigterm() -> Any:
    """Make SIGTERM interrupt like SIGINT; returns the previous handler."""
    return signal.signal(signal.SIGTERM, _interrupt_on_sigterm)


# "Unknown" step-time verdicts of repeated launches: as many launches again,
# twice at most. A single launch is not measured longer: more steps of one
# launch say nothing about drift between launches, which is what a
# single-launch verdict lacks.
REMEASURE_ROUNDS = 2


class Runner:
    def __init__(self, out_dir: Path | str, launch: LaunchOptions | None = None,
                 resume: bool = False, baselines: Path | str | None = None,
                 probe: bool = True, repeats: int = 1) -> None:
        if repeats < 1:
            raise ValueError(f"repeats must be at least 1, got {repeats}")
        self.out_dir = Path(out_dir)
        self.repeats = repeats  # launches per cell; more than 1 weighs their spread
        self.launch = launch or LaunchOptions()
        self.baselines_root = baselines
        self.probe_enabled = probe
        self.probe: dict[str, Any] | None = None
        self._sets: list | None = None
        self._results: dict[str, dict[str, Any]] = {}
        self._finished: dict[str, dict[str, Any]] = self._load_finished() if resume else {}
        self._file = None

    def _load_finished(self) -> dict[str, dict[str, Any]]:
        """Cells an earlier run into the same directory measured fully."""
        from perfsuite.results import load

        if not (self.out_dir / "results.json").exists():
            return {}
        earlier = load(self.out_dir)
        self._earlier_cells = earlier["cells"]
        return {c["id"]: c for c in earlier["cells"] if c["status"] == "ok"}

    @property
    def file(self):
        if self._file is None:  # created on first use: runs without cells write nothing
            from perfsuite.hardware import fingerprint
            from perfsuite.results import ResultsFile

            self._file = ResultsFile(self.out_dir, env=fingerprint())
            for kept in getattr(self, "_earlier_cells", []):
                self._file.data["cells"].append(kept)
        return self._file

    @property
    def baseline_sets(self) -> list:
        if self._sets is None:  # read once per session; a malformed file stops here, named
            from perfsuite.baselines import load_all

            self._sets = load_all(self.baselines_root)
        return self._sets

    def preflight(self, device: str) -> dict[str, Any]:
        """The pre-flight probe, once per session, before the first measured cell."""
        if self.probe is None:
            from perfsuite.hardware import fingerprint
            from perfsuite.launch import gpus_present, run_cell
            from perfsuite.probe import assess, probe_cell

            ranks = (len(self.launch.gpus) if self.launch.gpus is not None else gpus_present()) \
                if device == "cuda" else 2
            if not self.probe_enabled or ranks == 0:
                self.probe = {"status": "skipped", "assessment": {"trusted": True},
                              "reason": "disabled" if not self.probe_enabled else "no GPU"}
            else:
                result = run_cell(probe_cell(device, ranks), self.out_dir / "preflight",
                                  self.launch)
                result["assessment"] = assess(result, result.get("env") or fingerprint())
                self.probe = result
            self.file.data["probe"] = self.probe
            self.file.write()
        return self.probe

    def _twin(self, params: dict[str, Any]) -> dict[str, Any]:
        from perfsuite.cells import matrix

        twin = Cell.from_params(params)
        twin = matrix().get(twin.id, twin)  # the matrix's own cell of that id, if any
        return self.result(twin)

    def _measure(self, cell: Cell) -> dict[str, Any]:
        from perfsuite.judge import judge, needs_more_launches
        from perfsuite.launch import run_cell
        from perfsuite.results import merge_repeats

        assessment = self.preflight(cell.device).get("assessment", {})
        launches: list[dict[str, Any]] = []
        for round_ in range(REMEASURE_ROUNDS + 1):
            if self.repeats == 1:
                result = run_cell(cell, self.out_dir, self.launch)
            else:  # launch k > 1 keeps its own directory: launch<k>/cells/<cell id>
                launches += [run_cell(cell, self.out_dir / f"launch{k}" if k else self.out_dir,
                                      self.launch)
                             for k in range(len(launches), len(launches) + self.repeats)]
                result = merge_repeats(launches)
            result["checks"] = judge(cell, result, self._twin, self.baseline_sets, assessment)
            if (round_ == REMEASURE_ROUNDS or self.repeats == 1
                    or not needs_more_launches(result["checks"])):
                break
        result["remeasured"] = round_
        return result

    def result(self, cell: Cell) -> dict[str, Any]:
        """The cell's judged result, measured on first request only."""
        if cell.id in self._results:
            return self._results[cell.id]
        done = self._finished.get(cell.id)
        if done is not None and done["params"] == cell.params():
            done["resumed"] = True  # measured by an earlier run into this directory
            self._results[cell.id] = done
            return done
        self._results[cell.id] = {"id": cell.id, "status": "running"}  # a twin cycle stops here
        result = self._measure(cell)
        self._results[cell.id] = result
        if not result.get("partner"):
            self.file.add(result)
        return result

    @property
    def results(self) -> list[dict[str, Any]]:
        return [r for r in self._results.values() if r.get("status") != "running"]


def launch_options(*, data_dir: str | Path | None = None, options: list[str] = (),
                   timeout: float | None = None, profiler: str | None = None,
                   gpus: str | None = None, nnodes: int = 1, rdzv_endpoint: str | None = None,
                   rdzv_id: str | None = None, slurm: bool = False) -> LaunchOptions:
    """LaunchOptions from command-line values (pytest's or perfsuite's)."""
    from perfsuite import multinode

    bad = [o for o in options if "=" not in o]
    if bad:
        raise ValueError(f"option {bad[0]!r}: expected KEY=VALUE")
    gpu_list = None
    if gpus:
        try:
            gpu_list = [int(g) for g in gpus.split(",")]
        except ValueError:
            raise ValueError(f"GPU list {gpus!r}: expected indices like 0,1") from None
    nodes = (multinode.Nodes.from_slurm() if slurm else
             multinode.Nodes(nnodes=nnodes, rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id))
    return LaunchOptions(data_dir=Path(data_dir) if data_dir else None,
                         options=dict(o.split("=", 1) for o in options), timeout_s=timeout,
                         profiler=profiler, gpus=gpu_list, nodes=nodes)
