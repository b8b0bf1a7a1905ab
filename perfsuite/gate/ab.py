"""A/B: two versions of the training stack, interleaved on one machine in one session.

One launch of each version cannot tell a change from drift: identical
launches on the shared 2-core VM had medians 82-131 ms minutes apart, so
"before" measured on Monday and "after" on Tuesday mostly compares Mondays
with Tuesdays. Here both sides launch in turns, A B B A, A B B A, ..., so a
machine that drifts drifts under both alike and neither side always goes
first; after every round of ABBA the launches are judged (each launch one
observation, ``launchstats.compare_launches``) and a cell stops as soon as the
verdict is decided, or at a cap on launches with "unknown".

A side is a Python interpreter (its torch, torchrun and perfsuite run the
cell) and extra environment variables for its launches only; a git ref
becomes a side through a worktree and a venv that reuses the current
interpreter's packages (``checkout_side``). Every other check of a cell
(peak memory, accuracy, work counters: ``comparing.compare_runs``) also
compares A with B, over the launches measured.
"""

from __future__ import annotations

import math
import os
import shutil
import site
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from perfsuite import stats
from perfsuite.cells import Cell
from perfsuite.judge import launchstats
from perfsuite.judge.checks import FAILING
from perfsuite.judge.comparing import compare_runs
from perfsuite.launch.launch import LaunchOptions, run_cell
from perfsuite.options import DEFAULT_LAUNCH_STATISTIC
from perfsuite.results import SCHEMA as RESULTS_SCHEMA
from perfsuite.results import merge_repeats
from perfsuite.system.atomic import atomic_write_json

SCHEMA = "perfsuite.ab/1"
ORDER = "ABBA"  # one round; every round the same, so each side leads half the rounds
# A side. Resampled launch floors of the 2-core VM: 10 a side caught a 10 %
# slowdown 95 % of the time (stats module docstring).
DEFAULT_MAX_LAUNCHES = 12
DECIDED = ("same", "regressed", "improved")
EXIT_OK, EXIT_REGRESSED, EXIT_USAGE, EXIT_UNDECIDED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
# The side venv's own site-packages sorts '__editable__...' before this
# name, so the side's editable install is found before the current one's.
BASE_SITE_PTH = "perfsuite_ab_base_site.pth"
IMPORT_CHECK = "import torch, perfsuite; print(torch.__version__); print(perfsuite.__path__[0])"


def look_confidence(max_launches: int, confidence: float = stats.DEFAULT_CONFIDENCE) -> float:
    """The confidence each round's verdict is held to, so that the whole
    session holds ``confidence``: the verdict is looked at after every round
    from MIN_LAUNCHES a side on, and each look is another chance of a false
    call (Bonferroni over the planned looks). On the 2-core VM, judging every
    look at 95 % called identical sides regressed in the first trial tried."""
    looks = (max_launches - launchstats.MIN_LAUNCHES) // 2 + 1
    return 1.0 - (1.0 - confidence) / looks


class ABError(ValueError):
    """A usage or environment problem, said in a sentence (exit code 2)."""


@dataclass
class Side:
    """One version under test: what runs its launches, and where it came from."""

    name: str  # "A" or "B"
    python: str
    env: dict[str, str] = field(default_factory=dict)
    ref: str | None = None
    commit: str | None = None
    setup_s: float | None = None  # git worktree + venv + editable install
    torch: str | None = None
    perfsuite: str | None = None  # the package directory this side imports
    workload_options: dict[str, str] = field(default_factory=dict)  # e.g. an injected fault

    @property
    def label(self) -> str:
        return self.name.lower()

    def options(self, launch: LaunchOptions | None = None) -> LaunchOptions:
        """``launch`` (what the session launches with: data dir, workload
        options, timeout, GPUs, nodes, profiler) run by this side's
        interpreter, with its environment and workload options on top."""
        launch = launch or LaunchOptions()
        return replace(launch, python=self.python, env={**launch.env, **self.env},
                       options={**launch.options, **self.workload_options})


def launch_settings(launch: LaunchOptions | None) -> dict[str, Any]:
    """What a session's launches were given, for its JSON file."""
    launch = launch or LaunchOptions()
    return {"data_dir": str(launch.data_dir) if launch.data_dir else None, "options": dict(launch.options),
            "timeout_s": launch.timeout_s, "profiler": launch.profiler, "gpus": launch.gpus,
            "nnodes": launch.nodes.nnodes, "slurm": launch.nodes.slurm}


def parse_env(entries: list[str], flag: str) -> dict[str, str]:
    """KEY=VALUE entries as a dict."""
    env = {}
    for entry in entries:
        key, sep, value = entry.partition("=")
        if not sep or not key:
            raise ABError(f"{flag} {entry!r}: give KEY=VALUE, e.g. {flag} OMP_NUM_THREADS=2")
        env[key] = value
    return env


def python_side(name: str, python: str, env: dict[str, str] | None = None) -> Side:
    """A side run by an existing interpreter.

    Launches run with PYTHONSAFEPATH=1 so that ``python -m`` does not put the
    working directory first on sys.path: started from a checkout, its
    packages would shadow the side's own installation.
    """
    found = shutil.which(python) if os.sep not in python else python
    if not found or not Path(found).is_file():
        raise ABError(f"side {name}: no Python interpreter at {python}")
    if not os.access(found, os.X_OK):
        raise ABError(f"side {name}: {python} is not executable")
    return Side(name, os.path.abspath(found), {"PYTHONSAFEPATH": "1", **(env or {})})


def check_interpreter(side: Side) -> None:
    """Run the side's interpreter once: it must import torch and perfsuite."""
    try:
        proc = subprocess.run([side.python, "-c", IMPORT_CHECK], capture_output=True, text=True,
                              env={**os.environ, **side.env}, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ABError(f"side {side.name}: {side.python} could not be run ({err})") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ABError(f"side {side.name}: {side.python} cannot import torch and perfsuite "
                      f"({last}); install both into that environment")
    side.torch, side.perfsuite = proc.stdout.splitlines()[-2:]


def _run(argv: list[Any], what: str, cwd: Path | None = None) -> str:
    """stdout of a setup command; its failure as an ABError naming ``what``."""
    try:
        proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, cwd=cwd)
    except OSError as err:
        raise ABError(f"{what}: {err}") from None
    if proc.returncode != 0:
        tail = " ".join(proc.stderr.strip().splitlines()[-3:]) or f"exit status {proc.returncode}"
        raise ABError(f"{what} failed: {tail}")
    return proc.stdout.strip()


def checkout_side(name: str, ref: str, repo: Path, side_dir: Path,
                  env: dict[str, str] | None = None, flag: str | None = None) -> Side:
    """A side from a git ref of ``repo``: a worktree of the ref, a venv that
    sees the current interpreter's packages (torch is reused, not
    reinstalled), and the worktree installed into it in editable mode.
    ``flag`` names the option the ref came from in messages (default --a-ref/--b-ref)."""
    started = time.monotonic()
    flag = f"{flag or f'--{name.lower()}-ref'} {ref}"
    commit = _run(["git", "-C", repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
                  f"{flag}: finding the commit in {repo}")
    src, venv = side_dir / "src", side_dir / "venv"
    if src.exists() or venv.exists():
        raise ABError(f"{flag}: {side_dir} already holds a side; choose another --out")
    _run(["git", "-C", repo, "worktree", "add", "--detach", src, commit], f"{flag}: git worktree add")
    # No pip of its own: through the .pth below the venv runs the current one.
    _run([sys.executable, "-m", "venv", "--without-pip", venv], f"{flag}: python -m venv")
    python = venv / "bin" / "python"
    purelib = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        f"{flag}: the venv's site-packages"))
    # addsitedir, not a bare path: the current site-packages' own .pth files
    # (editable installs, such as perfsuite's) must be processed too.
    adds = "; ".join(f"site.addsitedir({p!r})" for p in site.getsitepackages())
    (purelib / BASE_SITE_PTH).write_text(f"import site; {adds}\n")
    _run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "-e", src],
         f"{flag}: pip install -e {src}", cwd=side_dir)
    return Side(name, str(python), {"PYTHONSAFEPATH": "1", **(env or {})}, ref=ref, commit=commit,
                setup_s=round(time.monotonic() - started, 2))


def check_settings(tolerance: float, statistic: str, max_launches: int) -> None:
    """Refuse settings a session could not keep (before anything is set up)."""
    if max_launches < launchstats.MIN_LAUNCHES or max_launches % 2:
        raise ABError(f"--max-launches {max_launches}: give an even number of at least "
                      f"{launchstats.MIN_LAUNCHES} (a round of ABBA is 2 launches a side, and a "
                      f"verdict weighs {launchstats.MIN_LAUNCHES} a side)")
    if not 0 < tolerance < 1:
        raise ABError(f"--tolerance {tolerance}: give a fraction such as 0.05")
    if statistic not in launchstats.LAUNCH_STATISTICS:
        raise ABError(f"--launch-statistic {statistic}: use one of {sorted(launchstats.LAUNCH_STATISTICS)}")


def _finite(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _interval(entry: dict[str, Any]) -> str:
    confidence = entry.get("confidence") or stats.DEFAULT_CONFIDENCE
    high = entry.get("ci_high")
    return (f"ratio {entry['ratio']:.4g} ({confidence * 100:.0f} % CI {entry['ci_low']:.4g}-"
            f"{'inf' if high is None else f'{high:.4g}'})")


def summary_line(record: dict[str, Any]) -> str:
    """The last word on a cell: verdict, interval, launches a side."""
    verdict = record["verdict"]
    if verdict not in (*DECIDED, "unknown") or record.get("ratio") is None:
        return f"{record['id']}  {verdict.upper()}  {record.get('reason') or ''}".rstrip()
    return (f"{record['id']}  {verdict.upper()}  {_interval(record)}, "
            f"{record['n_b']} vs {record['n_a']} launches")


def exit_code(records: list[dict[str, Any]]) -> int:
    """1 on a regression or a failed launch, else 3 while a cell is undecided, else 0."""
    if any(r["verdict"] in ("regressed", "error")
           or any(c["verdict"] in FAILING for c in r["checks"]) for r in records):
        return EXIT_REGRESSED
    return EXIT_UNDECIDED if any(r["verdict"] == "unknown" for r in records) else EXIT_OK


class ABSession:
    """Every cell launched on both sides in ABBA rounds until decided; ab.json
    is rewritten after every launch, so a crash or Ctrl-C loses nothing measured."""

    def __init__(self, cells: list[Cell], side_a: Side, side_b: Side, out_dir: Path | str, *,
                 tolerance: float = stats.DEFAULT_TOLERANCE, statistic: str = DEFAULT_LAUNCH_STATISTIC,
                 max_launches: int = DEFAULT_MAX_LAUNCHES, argv: list[str] | None = None,
                 launch: LaunchOptions | None = None,
                 log: Callable[[str], None] = lambda line: print(line, flush=True)) -> None:
        check_settings(tolerance, statistic, max_launches)
        self.cells, self.sides = list(cells), {"A": side_a, "B": side_b}
        self.launch = launch  # both sides launch with it, each by its own interpreter and env
        self.out_dir = Path(out_dir).resolve()
        self.path = self.out_dir / "ab.json"
        self.tolerance, self.statistic, self.max_launches = tolerance, statistic, max_launches
        self.log = log
        self.data: dict[str, Any] = {
            "schema": SCHEMA, "started": time.time(), "finished": None, "argv": argv or [],
            "settings": {"tolerance": tolerance, "confidence": stats.DEFAULT_CONFIDENCE,
                         "look_confidence": look_confidence(max_launches),
                         "launch_statistic": statistic, "max_launches": max_launches,
                         "min_launches": launchstats.MIN_LAUNCHES, "order": ORDER,
                         "launch": launch_settings(launch),
                         "sides": {s.name: asdict(s) for s in (side_a, side_b)}},
            "cells": [], "interrupted": False, "exit_code": None}

    def run(self) -> int:
        """Measure every cell; the exit code (see ``exit_code``, 130 on Ctrl-C)."""
        self.log(f"ratio = B / A of launch {self.statistic}s (> 1: B slower); "
                 f"tolerance ±{self.tolerance:.0%}; up to {self.max_launches} launches a side")
        record = None
        try:
            for i, cell in enumerate(self.cells, 1):
                self.log(f"[{i}/{len(self.cells)}] {cell.id}")
                record = {"id": cell.id, "verdict": None, "reason": None, "ratio": None,
                          "ci_low": None, "ci_high": None, "n_a": 0, "n_b": 0,
                          "launches": [], "rounds": [], "checks": []}
                self.data["cells"].append(record)
                results = self._measure(cell, record)
                self._other_checks(record, results)
                self.log(summary_line(record))
                if record["verdict"] == "unknown":
                    self.log(f"    {record['reason']}")
                for check in record["checks"]:
                    if check["verdict"] not in ("same", "pass", "skipped"):
                        self.log(f"    {check['name']}  {check['verdict'].upper()}  {check.get('message', '')}")
            code = exit_code(self.data["cells"])
        except KeyboardInterrupt:
            if record is not None and record["verdict"] is None:
                record.update(verdict="interrupted", reason="Ctrl-C or SIGTERM during this cell")
            self.data["interrupted"] = True
            code = EXIT_INTERRUPTED
        self.data["exit_code"] = code
        self.write()
        from perfsuite.report.ab import write_ab_reports

        for name, path in {"ab.json": self.path, **write_ab_reports(self.data, self.out_dir)}.items():
            self.log(f"{name}: {path}")
        return code

    def write(self) -> None:
        self.data["finished"] = time.time()
        atomic_write_json(self.path, self.data)

    def _measure(self, cell: Cell, record: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
        """ABBA rounds until the verdict is decided, the cap, or a failed launch."""
        results: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
        for round_ in range(1, self.max_launches // 2 + 1):
            for name in ORDER:
                result = self._launch(cell, self.sides[name], len(results[name]) + 1, record)
                if result["status"] != "ok":
                    first = not any(results.values())
                    skipped = result["status"] == "skipped" and first
                    record.update(verdict="skipped" if skipped else "error", reason=(
                        result.get("reason") if skipped else
                        f"side {name} launch {len(results[name]) + 1} ended {result['status']}: "
                        f"{result.get('reason')}"))
                    self.write()
                    return results
                results[name].append(result)
            if self._judge(round_, results, record) in DECIDED:
                return results
        self._undecided(record, results)
        return results

    def _launch(self, cell: Cell, side: Side, index: int, record: dict[str, Any]) -> dict[str, Any]:
        started = time.time()
        result = run_cell(cell, self.out_dir / "launches" / side.label / f"launch{index}",
                          side.options(self.launch))
        samples = result.get("metrics", {}).get("step_time", {}).get("samples") or []
        value = launchstats.launch_values([samples], self.statistic)[0] if samples else None
        record["launches"].append({
            "side": side.name, "index": index, "started": started,
            "duration_s": round(time.time() - started, 3), "status": result["status"],
            "reason": result.get("reason"), "value": value, "samples": samples,
            "dir": result.get("dir")})
        record[f"n_{side.label}"] = index if result["status"] == "ok" else index - 1
        self.write()
        shown = f"{value * 1e3:.4g} ms" if value is not None else result["status"].upper()
        self.log(f"  {side.name} {index:<3} {shown}  ({record['launches'][-1]['duration_s']:.1f} s)"
                 + (f"  {result.get('reason')}" if result["status"] != "ok" else ""))
        return result

    def _judge(self, round_: int, results: dict[str, list[dict[str, Any]]],
               record: dict[str, Any]) -> str | None:
        """The round's verdict once both sides have enough launches."""
        n_a, n_b = len(results["A"]), len(results["B"])
        if min(n_a, n_b) < launchstats.MIN_LAUNCHES:
            self.log(f"  round {round_}: {n_b} vs {n_a} launches; a verdict weighs "
                     f"{launchstats.MIN_LAUNCHES} a side")
            return None
        cmp = launchstats.compare_launches(_launches(results["B"]), _launches(results["A"]),
                                           self.tolerance, look_confidence(self.max_launches),
                                           statistic=self.statistic)
        verdict = {"verdict": cmp.verdict, "ratio": _finite(cmp.ratio),
                   "ci_low": _finite(cmp.ci_low), "ci_high": _finite(cmp.ci_high),
                   "confidence": cmp.confidence, "p_value": _finite(cmp.p_value),
                   "n_a": n_a, "n_b": n_b, "method": cmp.method}
        record["rounds"].append({"round": round_, **verdict})
        record.update(verdict)
        self.write()
        self.log(f"  round {round_}: {cmp.verdict.upper()}  {_interval(verdict)}, "
                 f"{n_b} vs {n_a} launches")
        return cmp.verdict

    def _undecided(self, record: dict[str, Any], results: dict[str, list[dict[str, Any]]]) -> None:
        """Unknown at the cap, with what would decide it."""
        spread = launchstats.launch_spread([launchstats.launch_values(_launches(rs), self.statistic)
                                      for rs in results.values()])
        record["reason"] = (
            f"undecided at the cap of {self.max_launches} launches a side: the interval is neither "
            f"wholly within ±{self.tolerance:.0%} nor a change beyond it; identical launches' "
            f"{self.statistic}s scattered {spread.log_sd:.1%} here, so more launches "
            f"(--max-launches {2 * self.max_launches}) or a quieter machine would decide it")
        self.write()

    def _other_checks(self, record: dict[str, Any], results: dict[str, list[dict[str, Any]]]) -> None:
        """compare_runs over both sides' launches: every check but step time,
        whose verdict the rounds gave."""
        if record["verdict"] not in (*DECIDED, "unknown"):
            return
        runs = [{"schema": RESULTS_SCHEMA, "env": merged.get("env", {}), "cells": [merged]}
                for merged in (merge_repeats(results["A"]), merge_repeats(results["B"]))]
        record["checks"] = [entry for entry in compare_runs(
            *runs, tolerance=self.tolerance, launch_statistic=self.statistic)
            if entry["name"] != "step_time"]
        self.write()


def _launches(results: list[dict[str, Any]]) -> list[list[float]]:
    return [r["metrics"]["step_time"]["samples"] for r in results]
