"""The hostile probe's kit: its case type, the inputs its cases set up and
the checks every case is held to (see test_hostile_probe.py, which runs them).

Cases live in modules by the kind of trouble they bring (``CASES`` in
test_hostile_probe.py and in the ``probe_*.py`` modules beside it); each
module imports what it needs from here.
"""

import contextlib
import io
import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from perfsuite import cells
from perfsuite.cli.main import main as cli_main
from perfsuite.schemas.results import SCHEMA
from tests.unit.cellkit import survivors

GPU_CELL = "gate/image/ddp/g2/fp32/px500/nopin/nchw"  # skipped here without a launch (--allow-no-gpu)
SMOKE_CELL = "smoke/image/ddp-ds/c1/fp32/px32/nopin/nchw"
RUN_CELL = "smoke/image/ddp/c2/fp32/px32/nopin/nchw"  # the cell of the results.json files below
ENV = {"cpu_model": "Test CPU", "cpu_cores": 2, "gpu_count": 0, "torch": "2.14.0"}
TRACEBACK = "Traceback (most recent call last)"
NO_LAUNCH = ("--no-probe", "--history", "off")
# pytest-benchmark's storage folder: an empty .benchmarks/ in the working directory
# of a pytest session whose perf test handed its step times to pytest-benchmark
BENCHMARKS = ".benchmarks"


# ============================================================================ inputs

def results_file(folder: Path, change: Callable[[dict], None] | None = None) -> Path:
    """A finished run's results.json as perfsuite writes it (one measured cell),
    changed by ``change``."""
    samples = [0.1 + 0.001 * (i % 7) for i in range(30)]
    cell = {"id": RUN_CELL, "params": cells.get(RUN_CELL).params(), "status": "ok", "reason": None, "env": ENV,
            "metrics": {"step_time": {"value": sorted(samples)[15], "unit": "s", "samples": samples},
                        "throughput": {"value": 320.0, "unit": "images/s"},
                        "peak_rss": {"value": 1e9, "unit": "bytes"}},
            "checks": [], "info": {"images_per_step": 16}}
    data = {"schema": SCHEMA, "env": ENV, "cells": [cell],
            "run": {"started": 1_700_000_000.0, "finished": 1_700_000_060.0, "status": "complete", "argv": []}}
    if change is not None:
        change(data)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(data, allow_nan=True))
    return folder


def step_time(data: dict) -> dict:
    return data["cells"][0]["metrics"]["step_time"]


def quietly(argv: list[str]) -> int:
    """perfsuite ARGV in this process, its output kept out of the case's."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return cli_main(argv)


EXPERIMENT = '[[experiment]]\nname = "mine"\ntier = "smoke"\nworkload = "mymodel.train:run"\n'
FINDING = '[[finding]]\nname = "x"\nsource = "s"\ntwin = {precision = "fp64"}\n'


def experiment_file(text: str | bytes) -> Callable[[Path], None]:
    def setup(t: Path) -> None:
        (t / "exp.toml").write_bytes(text if isinstance(text, bytes) else text.encode())
    return setup


def run_folder(change: Callable[[dict], None] | None = None, name: str = "run") -> Callable[[Path], None]:
    return lambda t: results_file(t / name, change)


def two_runs(change_a, change_b) -> Callable[[Path], None]:
    def setup(t: Path) -> None:
        results_file(t / "a", change_a)
        results_file(t / "b", change_b)
    return setup


def foreign_store(t: Path) -> None:
    """An SQLite file of another program, where the history should be."""
    with sqlite3.connect(t / "app.db") as conn:
        conn.execute("CREATE TABLE users (id INTEGER, name TEXT)")
        conn.execute("INSERT INTO users VALUES (1, 'ada')")
    results_file(t / "run")


def users_left_alone(t: Path, text: str) -> None:
    with sqlite3.connect(t / "app.db") as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        assert tables == ["users"] and conn.execute("SELECT * FROM users").fetchall() == [(1, "ada")]


def stored_store(t: Path) -> None:
    """A perfsuite store holding one run."""
    results_file(t / "run")
    assert quietly(["history", "add", str(t / "run"), "--commit", "a" * 40, "--history", str(t / "h.sqlite")]) == 0


def store_without_runs_table(t: Path) -> None:
    stored_store(t)
    with sqlite3.connect(t / "h.sqlite") as conn:
        conn.execute("DROP TABLE runs")


def stored_exactly_at(name: str, show: str | None = RUN_CELL) -> Callable[[Path, str], None]:
    """The store is the file of that very name, holding the run, and reads back by that path."""
    def check(t: Path, text: str) -> None:
        assert sorted(p.name for p in t.iterdir() if p.is_file()) == [name]
        with sqlite3.connect(t / name) as conn:  # a plain file name: no URL parsing here
            assert conn.execute("SELECT count(*) FROM runs").fetchone() == (1,)
        if show:
            with contextlib.redirect_stdout(io.StringIO()) as out:
                assert cli_main(["history", "show", show, "--history", str(t / name)]) == 0
            assert "a" * 12 in out.getvalue()
    return check


def interrupted_run(t: Path) -> None:
    """A real `perfsuite run` of two cells, interrupted (Ctrl-C) at its second."""
    from perfsuite.runner import Runner

    original, calls = Runner.result, []

    def result(self, cell):
        calls.append(cell.id)
        if len(calls) == 2:
            raise KeyboardInterrupt()
        return original(self, cell)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Runner, "result", result)
        code = quietly(["run", GPU_CELL, "gate/image/ddp/g1/fp32/px500/nopin/nchw", "--out", str(t / "cut"),
                        "--allow-no-gpu", *NO_LAUNCH])
    assert code == 130
    saved = json.loads((t / "cut" / "results.json").read_text())
    assert saved["run"]["status"] == "interrupted" and len(saved["cells"]) == 1


def interrupted_run_kept(t: Path, text: str) -> None:
    saved = json.loads((t / "cut" / "results.json").read_text())
    assert saved["run"]["status"] == "interrupted" and [c["id"] for c in saved["cells"]] == [GPU_CELL]


def baselines_with(change: Callable[[dict], None]) -> Callable[[Path], None]:
    """A baselines root of one folder recorded by `perfsuite baseline record`,
    its samples.json then edited."""
    def setup(t: Path) -> None:
        results_file(t / "run")
        assert quietly(["baseline", "record", str(t / "run"), "--baselines", str(t / "bl")]) == 0
        (folder,) = [p for p in (t / "bl").iterdir() if p.is_dir()]
        samples = json.loads((folder / "samples.json").read_text())
        change(samples)
        (folder / "samples.json").write_text(json.dumps(samples, allow_nan=True))
    return setup


def zero_sample(samples: dict) -> None:
    samples[f"{RUN_CELL}:step_time"][3] = 0.0


def nan_sample(samples: dict) -> None:
    samples[f"{RUN_CELL}:step_time"][0] = float("nan")


def nothing_recorded(t: Path, text: str) -> None:
    """The baselines root holds no recorded folder (its lock aside)."""
    assert [p for p in (t / "bl").glob("*/*")] == []


def unicode_report_written(t: Path, text: str) -> None:
    assert RUN_CELL in (t / "tendances-\u00e9t\u00e9.html").read_text()


def nothing_under(*names: str) -> Callable[[Path, str], None]:
    def check(t: Path, text: str) -> None:
        for name in names:
            assert not (t / name).exists(), f"{name} was written"
    return check


def git_repo(t: Path) -> None:
    """A git repository of two commits, for ab's refs."""
    repo = t / "repo"
    (repo / "abprobe").mkdir(parents=True)
    (repo / "pyproject.toml").write_text('[project]\nname = "abprobe"\nversion = "0.1"\n')
    for version in ("one", "two"):
        (repo / "abprobe" / "__init__.py").write_text(f"VERSION = {version!r}\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", version)


def git(repo: Path, *argv: str) -> str:
    if not (repo / ".git").exists():
        subprocess.run(["git", "-C", str(repo), "init", "-q"], check=True, capture_output=True)
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *argv],
                          check=True, capture_output=True, text=True).stdout


def one_worktree(t: Path, text: str) -> None:
    assert len(git(t / "repo", "worktree", "list").splitlines()) == 1  # no side was set up


def ab_session_held(t: Path) -> None:
    """Another `perfsuite ab` holds OUT: its lock, taken as ab takes it, by a live process."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys\nfrom perfsuite.system.locking import FolderLock\n"
         "held = FolderLock(sys.argv[1], 'perfsuite ab session').acquire()\nprint('held', flush=True)\n"
         "sys.stdin.read()\n", str(t / "out")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    HOLDERS.append(holder)


HOLDERS: list[subprocess.Popen] = []


def end_holders() -> None:
    while HOLDERS:
        holder = HOLDERS.pop()
        holder.stdin.close()
        holder.wait(timeout=30)
        holder.stdout.close()


def holders_lock_kept(t: Path, text: str) -> None:
    holder = json.loads((t / "out" / ".perfsuite.lock.json").read_text())
    assert holder["pid"] == HOLDERS[-1].pid  # the first session's lock, not taken over
    assert not (t / "out" / "ab.json").exists()


def results_json_kept(t: Path, text: str) -> None:
    assert json.loads((t / "out" / "results.json").read_text())["cells"][0]["id"] == RUN_CELL


def ab_folder(t: Path) -> None:
    """What a finished `perfsuite ab` leaves in its --out."""
    (t / "out" / "launches" / "A" / "launch0").mkdir(parents=True)
    (t / "out" / "launches" / "A" / "launch0" / "rank0.json").write_text('{"status": "ok"}')
    (t / "out" / "ab.json").write_text('{"cells": [], "exit_code": 0}')


def ab_folder_intact(t: Path, text: str) -> None:
    assert (t / "out" / "ab.json").read_text() == '{"cells": [], "exit_code": 0}'
    assert (t / "out" / "launches" / "A" / "launch0" / "rank0.json").is_file(), "the A/B launches were deleted"


def bisect_json(t: Path) -> None:
    (t / "out").mkdir()
    (t / "out" / "bisect.json").write_text('{"cell": "x"}')


# ---------------------------------------------------------------- the probe's own workload and test

# ============================================================================ a case

@dataclass(frozen=True)
class Case:
    id: str
    via: str  # cli: main(argv) here; pytest: pytester; sub: a process of its own; launched: the shared run
    argv: tuple[str, ...] = ()  # "{t}": the case's folder
    code: int = 2
    says: tuple[str, ...] = ()  # each in stdout + stderr ("{t}" formatted)
    setup: Callable[[Path], None] | None = None
    writes: tuple[str, ...] = ()  # what the case may create or change, relative to its folder
    env: dict[str, str] = field(default_factory=dict)
    check: Callable[[Path, str], None] | None = None  # what must still hold: results kept, inputs untouched
    launches: bool = False
    # defects known to remain, by the check that shows them: the case xfails on those checks alone
    known: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)  # pytest: files of the session's folder
    cell: int = 0  # launched: the cell of the shared session


def run_exp(*more: str) -> tuple[str, ...]:
    return ("run", "--tier", "smoke", "--out", "{t}/out", *NO_LAUNCH, *more)


EXP_ENV = {"PERFSUITE_EXPERIMENTS": "{t}/exp.toml"}


def exp_case(id_, text, says, argv=None) -> Case:
    return Case(id_, "cli", argv or run_exp(), 2, ("{t}/exp.toml", *says), experiment_file(text), env=EXP_ENV,
                check=nothing_under("out"))


# ============================================================================ the checks

def tree(root: Path) -> dict[str, tuple[int, int] | None]:
    """Every entry under ``root``: files by (size, mtime), folders by None."""
    found: dict[str, tuple[int, int] | None] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            try:
                stat = path.lstat()
            except FileNotFoundError:
                continue
            found[str(path.relative_to(root))] = None if name in dirs else (stat.st_size, stat.st_mtime_ns)
    return found


def changed(before: dict, after: dict) -> list[str]:
    return sorted({p for p in before.keys() | after.keys() if before.get(p, -1) != after.get(p, -1)})


def inside(path: str, allowed: tuple[str, ...]) -> bool:
    return any(path == a or path.startswith(a + os.sep) for a in allowed)


@dataclass
class Watch:
    """What a case may not touch, looked at before and after it: its folder
    (its working directory is inside), the folders beside it, the suite's
    isolated perfsuite home (its cache aside)."""
    t: Path
    home: Path
    before: dict = field(default_factory=dict)

    def look(self) -> dict:
        return {"t": tree(self.t), "siblings": {p.name: None for p in self.t.parent.iterdir()},
                "home": {k: v for k, v in tree(self.home).items() if not k.startswith("cache")}}

    def start(self) -> None:
        self.before = self.look()

    def strays(self, writes: tuple[str, ...]) -> list[str]:
        after = self.look()
        found = [f"{where}: {p}" for where in ("siblings", "home") for p in changed(self.before[where], after[where])]
        return found + [p for p in changed(self.before["t"], after["t"]) if not inside(p, writes)]


def left_processes(marker: Path) -> list[str]:
    deadline = time.monotonic() + 5
    while (pids := survivors(str(marker))) and time.monotonic() < deadline:
        time.sleep(0.2)
    out = []
    for pid in pids:
        try:
            out.append(" ".join(psutil.Process(pid).cmdline()))
        except psutil.Error:
            continue
    return out


def children() -> dict[int, str]:
    """This process's live descendants: pid -> command line."""
    found = {}
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if proc.status() != psutil.STATUS_ZOMBIE:
                found[proc.pid] = " ".join(" ".join(proc.cmdline()).split())
    return found


def new_children(before: dict[int, str]) -> list[str]:
    deadline = time.monotonic() + 3
    while (left := {p: c for p, c in children().items() if p not in before}) and time.monotonic() < deadline:
        time.sleep(0.2)
    return sorted(left.values())


def fmt(text: str, t: Path) -> str:
    return text.replace("{t}", str(t))


def kill_survivors(folder: Path) -> None:
    """What a failed case left behind, ended so that it does not outlive the test."""
    for pid in survivors(str(folder)):
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()



class Verdicts:
    """The checks of one case by name; each failure kept, none stopping the others."""

    NAMES = ("traceback", "code", "says", "kept", "no launch", "processes", "files", "children")

    def __init__(self) -> None:
        self.failed: dict[str, str] = {}

    def expect(self, name: str, ok: bool, why: str = "") -> None:
        assert name in self.NAMES
        if not ok:
            self.failed[name] = why

    def run(self, name: str, check: Callable[[], None]) -> None:
        try:
            check()
        except Exception as err:  # noqa: BLE001 - a failed check, said with the others
            self.failed[name] = f"{type(err).__name__}: {err}"

    def judge(self, case: Case) -> None:
        """Every check passed; or those that failed are the case's known defects
        (xfail), each of which must still show (strict: a fixed one is said)."""
        unknown = {k: v for k, v in self.failed.items() if k not in case.known}
        if unknown:
            pytest.fail("\n".join(f"[{name}] {why}" for name, why in unknown.items()), pytrace=False)
        fixed = sorted(set(case.known) - set(self.failed))
        if fixed:
            pytest.fail(f"known defect no longer shows in check(s) {fixed}: drop them from the case's `known`: "
                        + "; ".join(case.known[k] for k in fixed), pytrace=False)
        if self.failed:
            pytest.xfail("known defect: " + "; ".join(f"[{k}] {case.known[k]} ({v[:300]})"
                                                      for k, v in self.failed.items()))


def said_checks(verdicts: Verdicts, case: Case, code: int, text: str, t: Path) -> None:
    verdicts.expect("traceback", TRACEBACK not in text and "INTERNALERROR" not in text, text[-3000:])
    verdicts.expect("code", code == case.code, f"exit {code}, the README's is {case.code}: {text[-3000:]}")
    missing = [fmt(s, t) for s in case.says if fmt(s, t) not in text]
    verdicts.expect("says", not missing, f"{missing} not said in: {text[-3000:]}")


