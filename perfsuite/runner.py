"""A session's cells: each measured once, judged, and kept in results.json.

Shared by the pytest plugin and ``perfsuite run`` so both take one path.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from perfsuite import hardware
from perfsuite import options as options_mod
from perfsuite.cells import Cell, matrix
from perfsuite.context import default_cache_dir
from perfsuite.judge import judging
from perfsuite.launch import launch as launching
from perfsuite.launch import multinode
from perfsuite.launch.launch import LaunchOptions
from perfsuite.launch.preflight import assess, probe_cell
from perfsuite.results import ResultsFile, aggregate, merge_repeats
from perfsuite.schemas.records import CellResult
from perfsuite.schemas.results import load
from perfsuite.system import atomic, lifetime
from perfsuite.system.folders import folder_problem
from perfsuite.system.locking import HOLDER_NAME, LOCK_NAME, FolderLock, FolderNotMade, LockBusy

# Imported where they are used, not here: the baselines and recording
# (perfsuite.judge.baselines, .recording: scipy, pandas) and the history
# (perfsuite.history: SQLAlchemy). `perfsuite doctor` and the self-tests import
# this module for cache_problem and REMEASURE_ROUNDS, and a session that keeps
# no history never needs SQLAlchemy.


def default_out_dir(root: Path | str = ".") -> Path:
    # Time and pid: two runs on one machine never share a directory; a second
    # run of one process within the same second (pytest's own runs) gets -2.
    base = Path(root) / ".perfsuite" / f"run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def handle_sigterm() -> Any:
    """SIGTERM and SIGHUP interrupt as Ctrl-C does, and a second signal does
    not cut the bookkeeping short (perfsuite.system.lifetime); returns the
    function that puts the previous handlers back."""
    return lifetime.interrupt_on_signals()


# "Unknown" step-time verdicts of repeated launches: as many launches again,
# twice at most. A single launch is not measured longer: more steps of one
# launch say nothing about drift between launches, which is what a
# single-launch verdict lacks.
REMEASURE_ROUNDS = 2


CACHE_FIX = "point $PERFSUITE_CACHE_DIR (or --option cache_dir) at a folder you can write"


def cache_problem(options: dict[str, str] | None = None) -> str | None:
    """Why the cache the ranks write (generated data, resized images, the
    random LLM checkpoint) cannot be made or written, naming it and the
    setting that chose it; None when it can. Checked when a session begins
    (``Runner.begin``: else each cell needing it would fail after its
    launch) and by ``perfsuite doctor``.
    ``options``: the workload options (``cache_dir`` names another cache)."""
    chosen = (options or {}).get("cache_dir")
    cache = Path(chosen).expanduser() if chosen else default_cache_dir()
    named = ("--option cache_dir" if chosen else "$PERFSUITE_CACHE_DIR" if os.environ.get("PERFSUITE_CACHE_DIR")
             else "$PERFSUITE_CACHE" if os.environ.get("PERFSUITE_CACHE") else "the default")
    if cache.exists() and not cache.is_dir():
        problem = f"{cache} is a file"
    else:  # a file in it: the folder itself must be writable, once made
        problem = folder_problem(cache / "perfsuite.write-test", "the cache")
    if problem is None:
        return None
    return f"perfsuite's cache {cache} ({named}) cannot be used: {problem}"


class SessionError(RuntimeError):
    """Something a session needs is wrong; found before the first launch."""


# Folders of another kind of session, which a run never resumes or overwrites.
OTHER_SESSIONS = {"ab.json": "an A/B session", "bisect.json": "a bisect session"}
# What a run writes into its output directory; --overwrite removes only these.
RUN_OUTPUTS = ("results.json", "results.csv", "checks.csv", "report.html", "figures",
               "cells", "preflight")


class _SharedDirectory:
    """The no-lock of a multi-node run's shared output directory."""

    def release(self) -> None:
        pass


class Runner:
    def __init__(self, out_dir: Path | str, launch: LaunchOptions | None = None,
                 resume: bool = False, baselines: Path | str | None = None,
                 probe: bool = True, repeats: int = 1, overwrite: bool = False,
                 on_notice=None, runner_baselines: Path | str | None = None,
                 record_new: bool = False) -> None:
        if repeats < 1:
            raise ValueError(f"repeats must be at least 1, got {repeats}")
        self.out_dir = Path(out_dir)
        self.repeats = repeats  # launches per cell; more than 1 weighs their spread
        self.launch = launch or LaunchOptions()
        self.baselines_root = baselines
        # The runner's own baselines, searched after the project's; with
        # record_new, what a cell had no baseline for is recorded there.
        self.runner_baselines = Path(runner_baselines) if runner_baselines is not None else None
        if record_new and self.runner_baselines is None:
            raise ValueError("recording a runner's new baselines needs the folder they go to "
                             "(--runner-baselines DIR; pytest: --perf-runner-baselines DIR)")
        self.record_new = record_new
        self.probe_enabled = probe
        self.probe: dict[str, Any] | None = None
        self.resume, self.overwrite = resume, overwrite
        self.on_notice = on_notice or (lambda line: None)
        self._sets: list | None = None
        self._spread_wanted: set[str] = set()  # cells launched again for their launch kind's spread
        self._results: dict[str, dict[str, Any]] = {}
        self._finished: dict[str, dict[str, Any]] = {}
        self._earlier_cells: list[dict[str, Any]] = []
        self._earlier_probe: dict[str, Any] | None = None
        self._earlier_started: float | None = None
        self._file = None
        self._lock = None

    def begin(self) -> None:
        """Everything the session needs, checked before its first launch: the
        output directory (free, writable, not another run's unless resumed or
        overwritten; then held for the session) and the baselines. Raises
        SessionError (or BaselineError) with the path and the fix."""
        if self._lock is not None:
            return
        gone = lifetime.working_directory_problem()  # torch's own libraries fail there
        if gone:
            raise SessionError(gone)
        out = self.out_dir
        if out.exists() and not out.is_dir():
            raise SessionError(f"output directory {out} is a file; give a directory to --out")
        self._check_cache()
        for name, what in OTHER_SESSIONS.items():  # neither resumed nor overwritten, nor locked
            if (out / name).exists():
                raise SessionError(f"output directory {out} holds {what} ({name}), not a run; "
                                   "choose another --out")
        if self.launch.nodes.nnodes > 1:
            # The nodes of one multi-node run share the directory on purpose
            # (one of them writes each cell's result): no lock, no emptiness.
            out.mkdir(parents=True, exist_ok=True)
            self._lock = _SharedDirectory()
            self.baseline_sets  # noqa: B018
            if self.resume:
                self._finished = self._load_finished()
            return
        try:
            lock = FolderLock(out, "perfsuite session").acquire()
        except LockBusy as err:
            raise SessionError(str(err)) from None
        except OSError as err:  # the folder, or the lock: the first file written (a full disk)
            what = "create it" if isinstance(err, FolderNotMade) else "write there"
            raise SessionError(f"output directory {out}: cannot {what} "
                               f"({err.strerror or err}); choose another --out") from None
        try:
            self._claim(out)
            self.baseline_sets  # noqa: B018 - a malformed baseline stops the session here
        except BaseException:
            lock.release()
            raise
        self._lock = lock
        if lock.stale_message():
            self.on_notice(lock.stale_message())

    def _check_cache(self) -> None:
        problem = cache_problem(self.launch.options)
        if problem:
            raise SessionError(f"{problem}; {CACHE_FIX}")

    def _claim(self, out: Path) -> None:
        earlier = sorted(p.name for p in out.iterdir() if p.name not in (LOCK_NAME, HOLDER_NAME))
        if earlier and not (self.resume or self.overwrite):
            raise SessionError(
                f"output directory {out} is not empty ({', '.join(earlier[:4])}"
                f"{', ...' if len(earlier) > 4 else ''}); resume the run there (--resume), "
                "replace it (--overwrite) or choose another --out")
        if self.overwrite and not self.resume:
            import shutil

            for name in earlier:
                if name in RUN_OUTPUTS or name.startswith("launch"):
                    path = out / name
                    shutil.rmtree(path) if path.is_dir() else path.unlink()
        probe = out / ".perfsuite.write-test"
        try:  # a read-only mount or a full disk says so now, not after the first cell
            atomic.atomic_write_text(probe, "perfsuite can write here\n")
            probe.unlink()
        except OSError as err:
            raise SessionError(f"output directory {out}: cannot write there "
                               f"({err.strerror or err}); choose another --out") from None
        if self.resume:
            self._finished = self._load_finished()

    def end(self) -> None:
        """Release the output directory."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _load_finished(self) -> dict[str, dict[str, Any]]:
        """Cells an earlier run into the same directory measured fully."""
        if not (self.out_dir / "results.json").exists():
            return {}
        try:
            earlier = load(self.out_dir)
        except ValueError as err:
            raise SessionError(f"cannot resume: {err}. Remove that results.json, or run "
                               "without --resume into another --out") from None
        self._earlier_cells = earlier["cells"]
        self._earlier_probe = earlier.get("probe")
        self._earlier_started = (earlier.get("run") or {}).get("started")
        return {c["id"]: c for c in earlier["cells"] if c["status"] == "ok"}

    @property
    def file(self):
        if self._file is None:  # created on first use: runs without cells write nothing
            self._file = ResultsFile(self.out_dir, env=hardware.fingerprint(),
                                     shared=self.launch.nodes.nnodes > 1)
            # "complete" or "interrupted" at the session's end (finish); a file
            # still "running" was cut off by a kill: the history refuses both
            self._file.data["run"]["status"] = "running"
            if self._earlier_started is not None:  # a resumed run is the run it resumes: its
                # start, and so its history key (with the same cells), stays: stored once
                self._file.data["run"]["started"] = self._earlier_started
            if not self._file.shared:  # a shared file keeps them itself: another node may rewrite one
                self._file.data["cells"].extend(self._earlier_cells)
        return self._file

    @property
    def baseline_sets(self) -> list:
        if self._sets is None:  # read once per session; a malformed file stops here, named
            from perfsuite.judge.baselines import load_all

            # the project's first: at the same rank, a lookup keeps this order
            own = self.runner_baselines
            self._sets = load_all(self.baselines_root) + (
                load_all(own) if own is not None and own.is_dir() else [])
        return self._sets

    def preflight(self, device: str) -> dict[str, Any]:
        """The pre-flight probe, once per session, before the first measured cell.

        On GPUs where torch sees none (``perfsuite.hardware.why_no_gpu``) it
        raises SessionError saying why, unless the session was told to skip
        GPU cells instead (``allow_no_gpu``: --perf-allow-no-gpu, --allow-no-gpu):
        a GPU session that measured nothing must not pass as a healthy node."""
        if self.probe is None:
            ranks, reason = 2, "disabled"
            if device == "cuda" and self.probe_enabled:
                no_gpu = hardware.why_no_gpu()
                if no_gpu is not None and not getattr(self, "allow_no_gpu", False):
                    raise SessionError(f"the pre-flight probe of the GPUs cannot run: torch sees "
                                       f"no GPU: {no_gpu}. To skip the GPU cells instead, pass "
                                       "--perf-allow-no-gpu (pytest) or --allow-no-gpu "
                                       "(perfsuite run)")
                present = 0 if no_gpu is not None else launching.gpus_present()
                given = self.launch.gpus if self.launch.gpus is not None else range(present)
                ranks = sum(g < present for g in given)  # the session's GPUs really here
                reason = (f"no usable GPU: {no_gpu}" if no_gpu is not None else
                          f"none of the session's GPUs {list(given)} is here ({present} present)")
            if not self.probe_enabled or ranks == 0:
                self.probe = {"status": "skipped", "assessment": {"trusted": True},
                              "reason": reason}
            else:
                result = launching.run_cell(probe_cell(device, ranks), self.out_dir / "preflight",
                                            self.launch)
                result["assessment"] = assess(result, result.get("env") or hardware.fingerprint())
                self.probe = result
            self.file.data["probe"] = self.probe
            self.file.write()
        return self.probe

    def _twin(self, params: dict[str, Any]) -> dict[str, Any]:
        twin = Cell.from_params(params)
        twin = matrix().get(twin.id, twin)  # the matrix's own cell of that id, if any
        return self.result(twin)

    def _judge(self, cell: Cell, result: dict[str, Any], assessment: dict[str, Any]) -> list[dict]:
        """The cell's checks; a failure while judging becomes a failed check,
        never the loss of the measured result."""
        try:
            return judging.judge(cell, result, self._twin, self.baseline_sets, assessment)
        except Exception as err:  # noqa: BLE001 - the measurement stands, the check says why
            import traceback

            return [{"name": "perfsuite.judge", "verdict": "fail", "observed": None,
                     "expected": "every check evaluated",
                     "message": f"judging failed: {type(err).__name__}: {err}",
                     "traceback": traceback.format_exc()}]

    def _measure(self, cell: Cell) -> CellResult:
        gone = lifetime.working_directory_problem()
        if gone:  # removed mid-session: the ranks cannot start in it; not launched
            result = aggregate(cell, [], status="error", reason=f"not launched: {gone} with --resume",
                               duration_s=0.0)
            return {**result, "checks": [], "remeasured": 0}
        assessment = self.preflight(cell.device).get("assessment", {})
        launches: list[dict[str, Any]] = []
        for round_ in range(REMEASURE_ROUNDS + 1):
            if self.repeats == 1:
                result = launching.run_cell(cell, self.out_dir, self.launch)
            else:  # launch k > 1 keeps its own directory: launch<k>/cells/<cell id>
                launches += [launching.run_cell(cell, self.out_dir / f"launch{k}" if k else self.out_dir,
                                                self.launch)
                             for k in range(len(launches), len(launches) + self.repeats)]
                result = merge_repeats(launches)
            result["checks"] = self._judge(cell, result, assessment)
            if (round_ == REMEASURE_ROUNDS or self.repeats == 1
                    or not judging.needs_more_launches(result["checks"])):
                break
        result["remeasured"] = round_
        from perfsuite.judge.recording import RECORD_LAUNCHES, lacks_time_baseline

        if self.record_new and self.repeats < RECORD_LAUNCHES and lacks_time_baseline(result):
            if any(c.get("missing") == "spread" for c in result["checks"]):  # judged below, then recorded
                self._spread_wanted.add(cell.id)
            launches = launches or [result]
            launches += [launching.run_cell(cell, self.out_dir / f"launch{k}", self.launch)
                         for k in range(len(launches), RECORD_LAUNCHES)]
            result = merge_repeats(launches)
            result["checks"] = self._judge(cell, result, assessment)
            result["remeasured"] = round_
        return result

    def result(self, cell: Cell) -> CellResult:
        """The cell's judged result, measured on first request only."""
        if cell.id in self._results:
            return self._results[cell.id]
        self.begin()
        done = self._finished.get(cell.id)
        if done is not None and done["params"] == cell.params():
            done["resumed"] = True  # measured by an earlier run into this directory
            # judged again: the baselines may have changed since it was measured
            assessment = (self._earlier_probe or {}).get("assessment", {})
            done["checks"] = self._judge(cell, done, assessment)
            self._record_missing(done)
            self._results[cell.id] = done
            self.file.add(done)
            return done
        self._results[cell.id] = {"id": cell.id, "status": "running"}  # a twin cycle stops here
        result = self._measure(cell)
        self._record_missing(result)
        self._results[cell.id] = result
        if not result.get("partner"):
            self.file.add(result)
        return result

    def _record_missing(self, result: dict[str, Any]) -> None:
        if self.record_new and not result.get("partner"):  # a failure is said on its checks
            from perfsuite.judge.recording import record_missing

            if record_missing(result, self.runner_baselines, spread=result.get("id") in self._spread_wanted):
                self._sets = None  # read again: a later cell of its kind is judged with the spread it gave

    def add_to_history(self, url: str | None, interrupted: bool = False, *, commit: str | None = None,
                       branch: str | None = None) -> str | None:
        """Keep this run in the history at ``url`` (None: $PERFSUITE_HISTORY, else the default
        SQLite file; "off": none), marked with its purpose (``perfsuite.history.purpose.run_purpose``:
        its workload options, output folder, and ``history_purpose`` when one was asked for); the
        line saying where and how, or why it was not kept. ``commit``, ``branch``: what it is
        stored under (default: git's here, the commit then the run's env)."""
        from perfsuite.history.schema import history_off

        marked = self.finish(interrupted)
        if history_off(url) or not any(not r.get("partner") for r in self.results):
            return None
        if interrupted:
            return ("history: not stored: the session was interrupted (a partial run); the same command "
                    "with --resume (pytest: --perf-resume) finishes the run and stores it")
        if marked is not None:
            return f"history: not stored: {marked}"
        from perfsuite.history import store as hs

        purpose = None
        try:
            purpose = hs.run_purpose(self.launch.options, out_dir=self.out_dir, store_named=hs.store_named(url),
                                     declared=getattr(self, "history_purpose", None))
            return hs.record_run_in_history(self.file.path, url, commit, branch, purpose=purpose,
                                            options=self.launch.options)
        except hs.HistoryError as err:
            if not isinstance(err, hs.StoreNotWritten):
                return f"history: not stored: {err}"
            why = str(err)
        except Exception as err:  # noqa: BLE001 - a full disk, a database gone: the run stands
            why = f"{type(err).__name__}: {err}"
        # the run stands, its history does not: the runners exit 2 (pytest: failed), not green
        self.history_unwritten = hs.not_written_line(why, self.file.path.parent, url, commit, branch, purpose)
        return self.history_unwritten

    def finish(self, interrupted: bool = False) -> str | None:
        """Mark results.json at the session's end: run.status "complete", or "interrupted" (Ctrl-C,
        SIGTERM), which ``perfsuite history add`` refuses until --resume finishes the run. Called
        by ``add_to_history``, which both runners call at the end; None, or why it was not marked."""
        if self._file is None or not self._file.path.exists():
            return None
        self._file.data["run"]["status"] = "interrupted" if interrupted else "complete"
        try:
            self._file.write()
        except OSError as err:  # the cells stay as written after each; only the mark is missing
            return f"cannot mark {self._file.path} complete ({err.strerror or err})"
        return None

    @property
    def results(self) -> list[CellResult]:
        return [r for r in self._results.values() if r.get("status") != "running"]


def launch_options(*, data_dir: str | Path | None = None, options: list[str] = (),
                   timeout: float | None = None, profiler: str | None = None,
                   gpus: str | None = None, nnodes: int = 1, rdzv_endpoint: str | None = None,
                   rdzv_id: str | None = None, slurm: bool = False,
                   rank_start: str | None = None) -> LaunchOptions:
    """LaunchOptions from command-line values (pytest's or perfsuite's)."""
    bad = [o for o in options if "=" not in o]
    if bad:
        raise ValueError(f"option {bad[0]!r}: expected KEY=VALUE")
    if data_dir is not None and not Path(data_dir).is_dir():
        raise ValueError(f"data directory {data_dir}: not a directory; give the folder holding "
                         "the datasets (MNIST IDX files, ...)")
    problem = None if timeout is None else options_mod.timeout_problem(timeout)
    if problem:
        raise ValueError(f"timeout {timeout:g}: {problem}")
    gpu_list = None
    if gpus:
        try:
            gpu_list = [int(g) for g in gpus.split(",")]
            if any(g < 0 for g in gpu_list) or len(set(gpu_list)) != len(gpu_list):
                raise ValueError
        except ValueError:
            raise ValueError(f"GPU list {gpus!r}: expected distinct indices like 0,1") from None
    nodes = (multinode.Nodes.from_slurm() if slurm else
             multinode.Nodes(nnodes=nnodes, rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id))
    return LaunchOptions(data_dir=Path(data_dir) if data_dir else None,
                         options=dict(o.split("=", 1) for o in options), timeout_s=timeout,
                         profiler=profiler, gpus=gpu_list, nodes=nodes, rank_start=rank_start)
