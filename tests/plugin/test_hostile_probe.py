"""A scripted probe of hostile-but-realistic input, kept as a test CI runs.

One table of cases (``CASES``) drives one set of checks. Each case is a real
command (``perfsuite.cli.main.main`` in this process, or a subprocess where
the case needs one of its own: the output encoding) or a real pytest session
(pytester), and every case is held to all of what perfsuite promises when
things go wrong (README, docs/explanation/failures.md):

- no Python traceback on stdout or stderr (nor pytest's INTERNALERROR);
- the exit code is the README's for that situation (perfsuite: 0 fine, 1 a
  failed cell, 2 usage or environment error; pytest's own under pytest: 1
  failed, 2 interrupted by a collection error, 4 usage error);
- the message names the thing: the file, field, cell, URL or option;
- no result lost: where a case measured something, results.json holds it;
- no process left: none whose command line mentions the case's folder, and
  the helpers a workload or test started are gone;
- no file written outside the paths the case gave: the case's folder, the
  working directory (a folder of its own), the folders beside it in pytest's
  temporary directory and the suite's isolated perfsuite home are compared
  before and after; inputs are left as they were.

Each check has a name (``Verdicts.NAMES``). A defect found and not yet fixed
is written into its case as ``known={check: why}``: the case then xfails on
exactly those checks, after all of them ran, and fails on any other; a known
check that passes again fails the case too ("drop it from known"), so a fix
is seen.

Cost (about 50 s on 2 cores): the cases that launch ranks are one ``perfsuite
run`` process (five cells of a workload of the probe's own, one launch each),
one pytest session (one user test) and one ``perfsuite run`` of one cell
(``--rank-start exec``); every other case must be refused before any launch,
which ``no_launch`` makes a failure of its own.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil
import sqlite3
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from perfsuite import cells
from perfsuite.cli.main import main as cli_main
from perfsuite.schemas.results import SCHEMA
from tests.unit.cellkit import survivors

pytest_plugins = ["pytester"]

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

WORKLOAD = '''
import subprocess
import sys
from pathlib import Path

from perfsuite.steps import Dist, Steps

HERE = Path(__file__).resolve().parent
DEAF = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"


def helpers(kind, which):
    """Start helpers that would outlive the launch; their pids go to a file."""
    started = []
    if "sleep" in which:  # the system's sleep, by a name in this folder
        started.append(subprocess.Popen([str(HERE / "bin" / "sleep"), "600"]))
    if "deaf" in which:  # a helper that ignores SIGTERM
        started.append(subprocess.Popen([sys.executable, "-c", DEAF, str(HERE)]))
    (HERE / f"helpers-{kind}.txt").write_text(" ".join(str(p.pid) for p in started))


def run(cell, ctx):
    kind = cell.batch_size
    if kind == 1:
        return {"metrics": [0.1, 0.2], "steps": 2}
    if kind == 2:
        return {"metrics": {"step_time": {"value": "0.1 s", "unit": "s", "samples": [0.1]}}, "steps": 1}
    if kind == 3:
        return [0.1, 0.1, 0.1]
    if kind == 4:
        helpers(kind, ["sleep"])
    if kind == 5:
        helpers(kind, ["deaf"])
        raise RuntimeError("the loader of this cell broke after starting a helper")
    Dist.start(cell, ctx)
    steps = Steps(cell, ctx)
    for _ in steps(range(8), warmup=2):
        sum(range(1000))
    return steps.record()
'''

OWN_EXPERIMENT = '''
[[experiment]]
name = "probe records"
tier = "smoke"
workload = "probework:run"
fixed = {device = "cpu", timeout_s = 120}
axes = {batch_size = [1, 2, 3, 4, 5]}
'''


def own_cell(kind: int) -> str:
    return f"smoke/probework:run/c1/fp32/batch_size={kind}"


USER_TEST = '''
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
DEAF = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"


@pytest.mark.perf_ranks(1, timeout=120)
def test_leaves_helpers(perf_dist, perf_steps):
    sleep = subprocess.Popen([str(HERE / "bin" / "sleep"), "600"])
    deaf = subprocess.Popen([sys.executable, "-c", DEAF, str(HERE)])
    (HERE / "helpers-user.txt").write_text(f"{sleep.pid} {deaf.pid}")
    for _ in perf_steps(range(8), warmup=2):
        sum(range(1000))
'''


ZERO_CELL = "smoke/probezero:run/c1/fp32"
ZERO_WORKLOAD = '''
def run(cell, ctx):  # a clock too coarse for the step: every step took "0 s"
    return {"metrics": {"step_time": {"value": 0.0, "unit": "s", "samples": [0.0, 0.0, 0.0]}}, "steps": 3}
'''


def zero_workload(t: Path) -> None:
    (t / "cwd" / "probezero.py").write_text(ZERO_WORKLOAD)
    (t / "exp.toml").write_text('[[experiment]]\nname = "zero"\ntier = "smoke"\nworkload = "probezero:run"\n'
                                'fixed = {device = "cpu", timeout_s = 120}\n')


def zero_cell_kept(t: Path, text: str) -> None:
    """The cell is kept, failed, naming its step time; the run's results.json
    stays readable (the schema) and its report is written."""
    from perfsuite.schemas import results

    (cell,) = results.load(t / "out")["cells"]
    failed = [c["name"] for c in cell["checks"] if c["verdict"] == "fail"]
    assert (cell["status"] == "error" and "step_time" in cell["reason"]) or any("step_time" in n for n in failed)
    assert (t / "out" / "report.html").is_file()


def sleep_link(folder: Path) -> None:
    (folder / "bin").mkdir()
    (folder / "bin" / "sleep").symlink_to(shutil.which("sleep"))


def helpers_gone(folder: Path, kind: str) -> None:
    pids = [int(p) for p in (folder / f"helpers-{kind}.txt").read_text().split()]
    assert pids, "the workload started no helper"
    deadline = time.monotonic() + 10
    while (alive := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert alive == [], f"helpers {alive} outlived the launch"


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def user_cell_kept(t: Path, text: str) -> None:
    from perfsuite.schemas import results

    (cell,) = results.load(t / "out")["cells"]
    assert cell["id"] == "user/test_user.py::test_leaves_helpers/c1" and cell["status"] == "ok", cell["reason"]
    assert cell["metrics"]["step_time"]["n"] == 6
    helpers_gone(t, "user")


# ============================================================================ the cases

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


CASES = [
    # -- 1. a workload of one's own returns a record of the wrong shape (launched, one session)
    Case("own-workload-metrics-a-list", "launched", code=1, cell=1,
         says=(own_cell(1), "probework:run", "metrics is a list, not a mapping")),
    Case("own-workload-step-time-a-string", "launched", code=1, cell=2,
         says=(own_cell(2), "metrics.step_time.value is '0.1 s', not a number")),
    Case("own-workload-returns-a-list", "launched", code=1, cell=3,
         says=(own_cell(3), "returned list, not its record")),
    # -- 3. processes a workload or a user's test starts that would outlive the launch
    Case("own-workload-leaves-a-sleep-helper", "launched", code=1, cell=4, says=(own_cell(4),)),
    Case("own-workload-fails-leaving-a-sigterm-deaf-helper", "launched", code=1, cell=5,
         says=(own_cell(5), "RuntimeError: the loader of this cell broke")),
    Case("user-test-leaves-sleep-and-sigterm-deaf-helpers", "pytest", code=0, launches=True,
         argv=("--perf-out", "{t}/out", "--perf-no-probe", "--perf-history", "off"),
         says=("user/test_user.py::test_leaves_helpers/c1",), files={"test_user.py": USER_TEST},
         writes=("out", "helpers-user.txt", BENCHMARKS), check=user_cell_kept),
    Case("own-workload-zero-step-time", "cli", ("run", ZERO_CELL, "--out", "{t}/out", "--rank-start", "exec",
                                                *NO_LAUNCH), 1,
         (ZERO_CELL, "step_time"), zero_workload, writes=("out", "cwd/__pycache__"), env=EXP_ENV, launches=True,
         check=zero_cell_kept),

    # -- 2. experiment files of the wrong structure ($PERFSUITE_EXPERIMENTS; pytest's perf_experiments)
    exp_case("exp-table-not-array", '[experiment]\nname = "mine"\ntier = "smoke"\nworkload = "m.t:run"\n',
             ("experiment:", "expected array", "[[experiment]]")),
    exp_case("exp-axes-a-list", EXPERIMENT + 'axes = ["world_size", [1, 2]]\n',
             ("experiment 'mine'.axes", "expected object")),
    exp_case("exp-fixed-a-string", EXPERIMENT + 'fixed = "device=cpu"\n',
             ("experiment 'mine'.fixed", "expected object")),
    exp_case("exp-not-utf8", (EXPERIMENT.replace("mine", "caf\xe9")).encode("latin-1"), ("not UTF-8",),
             argv=("list", "--tier", "smoke")),
    exp_case("exp-world-size-2.5", EXPERIMENT + 'axes = {world_size = [1, 2.5]}\n',
             ("experiment 'mine'.axes.world_size", "2.5", "expected integer")),
    exp_case("exp-world-size-true", EXPERIMENT + 'fixed = {world_size = true}\n',
             ("experiment 'mine'.fixed.world_size", "True", "expected integer")),
    exp_case("exp-unknown-key-fixd", EXPERIMENT + 'fixd = {device = "cpu"}\n',
             ("experiment 'mine'", "unknown key(s) ['fixd']", "'fixed'")),
    exp_case("exp-unknown-key-axis", EXPERIMENT + 'axis = {world_size = [1, 2]}\n',
             ("experiment 'mine'", "unknown key(s) ['axis']", "'axes'")),
    exp_case("exp-misspelt-parameter", EXPERIMENT + 'fixed = {batch_sise = 16}\n',
             ("experiment 'mine'.fixed", "['batch_sise']", "'batch_size'")),
    exp_case("exp-fixed-and-on-an-axis", EXPERIMENT + 'fixed = {world_size = 1}\naxes = {world_size = [1, 2]}\n',
             ("experiment 'mine'", "world_size is both fixed and on an axis"),
             argv=("ab", "smoke", "--out", "{t}/out")),
    exp_case("exp-empty-axis", EXPERIMENT + 'axes = {batch_size = []}\n',
             ("experiment 'mine'.axes.batch_size", "non-empty")),
    exp_case("exp-axis-a-number", EXPERIMENT + 'axes = {world_size = 2}\n',
             ("experiment 'mine'.axes.world_size", "expected array")),
    exp_case("finding-low-a-string", FINDING + 'subject = {world_size = 2}\nlow = "1.3"\n',
             ("finding 'x'.low", "expected number")),
    exp_case("finding-subject-a-string", FINDING + 'subject = "ddp-ds"\n',
             ("finding 'x'.subject", "expected object")),
    exp_case("finding-devices-a-string", FINDING + 'subject = {world_size = 2}\ndevices = "cuda"\n',
             ("finding 'x'.devices", "expected array"), argv=("list",)),
    Case("exp-file-missing", "cli", ("list",), 2, ("{t}/nowhere.toml", "does not exist"),
         env={"PERFSUITE_EXPERIMENTS": "{t}/nowhere.toml"}),
    Case("pytest-perf-experiments-unknown-key", "pytest", ("--perf-out", "{t}/out"), 4,
         ("mine.toml", "unknown key(s) ['fixd']"),
         files={"pyproject.toml": '[tool.pytest.ini_options]\nperf_experiments = ["mine.toml"]\n',
                "mine.toml": EXPERIMENT + 'fixd = {device = "cpu"}\n',
                "test_probed_cells.py": 'import pytest\n\n@pytest.mark.perf(workload="image")\n'
                                 'def test_cell(perf_cell, perf_result):\n    pass\n'},
         check=nothing_under("out")),

    # -- 4. ab into a folder that is not its own
    Case("ab-second-session-into-one-out", "cli", ("ab", SMOKE_CELL, "--out", "{t}/out"), 2,
         ("{t}/out is in use (perfsuite ab session) by pid", "choose another folder"), ab_session_held,
         check=holders_lock_kept),
    Case("ab-out-holds-a-runs-results", "cli", ("ab", SMOKE_CELL, "--out", "{t}/out"), 2,
         ("{t}/out already holds a perfsuite run (results.json)",), run_folder(name="out"),
         check=results_json_kept),
    Case("ab-out-holds-a-bisect", "cli", ("ab", SMOKE_CELL, "--out", "{t}/out"), 2,
         ("{t}/out already holds a bisect session (bisect.json)",), bisect_json),
    Case("ab-b-ref-missing", "cli", ("ab", SMOKE_CELL, "--repo", "{t}/repo", "--out", "{t}/out",
                                     "--a-ref", "HEAD", "--b-ref", "missing"), 2,
         ("--b-ref missing", "{t}/repo"), git_repo, writes=("out",), check=one_worktree),
    Case("ab-unknown-cell", "cli", ("ab", SMOKE_CELL[:-1] + "x", "--out", "{t}/out"), 2,
         ("unknown cell id", SMOKE_CELL[:-1] + "x", "perfsuite list")),

    # -- 5. the history store
    Case("history-path-with-%2F", "cli", ("history", "add", "{t}/run", "--commit", "a" * 40,
                                          "--history", "{t}/nightly%2Fmain.sqlite"), 0,
         ("stored run",), run_folder(), writes=("nightly%2Fmain.sqlite",),
         check=stored_exactly_at("nightly%2Fmain.sqlite")),
    Case("history-path-with-question-mark", "cli", ("history", "add", "{t}/run", "--commit", "a" * 40,
                                                    "--history", "{t}/h?mode=ro.sqlite"), 0,
         ("stored run",), run_folder(), writes=("h?mode=ro.sqlite",), check=stored_exactly_at("h?mode=ro.sqlite")),
    Case("history-path-with-hash", "cli", ("run", GPU_CELL, "--allow-no-gpu", "--no-probe", "--out", "{t}/out",
                                           "--history", "{t}/runs#1.sqlite"), 0,
         ("{t}/out/results.json", "history: stored run"), writes=("out", "runs#1.sqlite"),
         check=stored_exactly_at("runs#1.sqlite", show=None)),
    Case("history-url-typo-sqlit", "cli", ("history", "add", "{t}/run", "--commit", "abc",
                                           "--history", "sqlit:///x.db"), 2,
         ("sqlit:///x.db", "no database kind 'sqlit'"), run_folder()),
    Case("run-with-history-url-typo", "cli", ("run", SMOKE_CELL, "--out", "{t}/out", "--no-probe",
                                              "--history", "sqlit:///x.db"), 2,
         ("sqlit:///x.db", "no database kind 'sqlit'"), check=nothing_under("out/results.json")),
    Case("history-store-of-another-program", "cli", ("history", "add", "{t}/run", "--commit", "abc",
                                                     "--history", "{t}/app.db"), 2,
         ("{t}/app.db", "not a perfsuite history"), foreign_store, check=users_left_alone),
    Case("run-into-a-store-of-another-program", "cli", ("run", SMOKE_CELL, "--out", "{t}/out", "--no-probe",
                                                        "--history", "{t}/app.db"), 2,
         ("{t}/app.db", "not a perfsuite history"), foreign_store, check=users_left_alone),
    Case("history-store-missing-its-runs-table", "cli", ("history", "show", RUN_CELL, "--history", "{t}/h.sqlite"),
         2, ("{t}/h.sqlite", "lacks its table runs"), store_without_runs_table),
    Case("history-impossible-since", "cli", ("history", "show", RUN_CELL, "--history", "{t}/h.sqlite",
                                             "--since", "2026-02-30"), 2,
         ("--since 2026-02-30", "YYYY-MM-DD"), stored_store),
    Case("history-show-metric-typo", "cli", ("history", "show", RUN_CELL, "--history", "{t}/h.sqlite",
                                             "--metric", "step_tim"), 2,
         ("--metric step_tim", "did you mean step_time"), stored_store),
    Case("history-add-an-interrupted-run", "cli", ("history", "add", "{t}/cut", "--commit", "abc",
                                                   "--history", "{t}/h.sqlite"), 2,
         ("{t}/cut/results.json", "interrupted", "--resume"), interrupted_run,
         check=interrupted_run_kept),

    Case("history-store-path-not-utf8", "cli", ("history", "add", "{t}/run", "--commit", "a" * 40,
                                                "--history", "{t}/h-\udcfe.sqlite"), 2,
         ("h-\\xfe.sqlite", "not valid UTF-8"), run_folder()),  # refused: an SQLite store's name is UTF-8
    Case("run-out-not-utf8-kept-in-history", "cli", ("run", GPU_CELL, "--allow-no-gpu", "--no-probe",
                                                     "--out", "{t}/out-\udcfe", "--history", "{t}/h.sqlite"), 0,
         ("history: stored run",), writes=("out-\udcfe", "h.sqlite"), check=stored_exactly_at("h.sqlite", show=None)),
    Case("run-overwrite-into-an-ab-folder", "cli", ("run", GPU_CELL, "--allow-no-gpu", "--out", "{t}/out",
                                                    "--overwrite", *NO_LAUNCH), 2,
         ("{t}/out", "ab.json"), ab_folder, check=ab_folder_intact),
    Case("run-resume-into-an-ab-folder", "cli", ("run", GPU_CELL, "--allow-no-gpu", "--out", "{t}/out",
                                                 "--resume", *NO_LAUNCH), 2,
         ("{t}/out", "ab.json"), ab_folder, check=ab_folder_intact),

    # -- 6. results.json and baselines nothing can judge
    Case("compare-a-zero-step-time", "cli", ("compare", "{t}/a", "{t}/b"), 2,
         ("{t}/b/results.json", "step_time/samples/3", "not above 0", RUN_CELL),
         two_runs(None, lambda d: step_time(d)["samples"].__setitem__(3, 0.0))),
    Case("compare-a-negative-step-time", "cli", ("compare", "{t}/a", "{t}/b"), 2,
         ("{t}/a/results.json", "step_time/value", "-0.1", RUN_CELL),
         two_runs(lambda d: step_time(d).__setitem__("value", -0.1), None)),
    Case("compare-a-step-time-in-text", "cli", ("compare", "{t}/a", "{t}/b"), 2,
         ("{t}/b/results.json", "step_time/value", RUN_CELL),
         two_runs(None, lambda d: step_time(d).__setitem__("value", "0.1"))),
    Case("report-a-nan-step-time", "cli", ("report", "{t}/run"), 2,
         ("{t}/run/results.json", "step_time/samples/0", "NaN"),
         run_folder(lambda d: step_time(d)["samples"].__setitem__(0, math.nan)),
         check=nothing_under("run/report.html")),
    Case("report-a-cell-twice", "cli", ("report", "{t}/run"), 2,
         ("{t}/run/results.json", RUN_CELL, "repeats cells/0"),
         run_folder(lambda d: d["cells"].append(dict(d["cells"][0]))), check=nothing_under("run/report.html")),
    Case("history-add-a-cell-twice", "cli", ("history", "add", "{t}/run", "--commit", "abc",
                                             "--history", "{t}/h.sqlite"), 2,
         ("{t}/run/results.json", RUN_CELL, "twice"),
         run_folder(lambda d: d["cells"].append(dict(d["cells"][0])))),  # and no store made
    Case("baseline-record-a-cell-twice", "cli", ("baseline", "record", "{t}/run", "--baselines", "{t}/bl"), 2,
         ("{t}/run/results.json", RUN_CELL, "repeats cells/0"),
         run_folder(lambda d: d["cells"].append(dict(d["cells"][0]))), writes=("bl",), check=nothing_recorded),
    Case("baseline-record-a-negative-sample", "cli", ("baseline", "record", "{t}/run", "--baselines", "{t}/bl"), 2,
         ("{t}/run/results.json", "step_time/samples/5", RUN_CELL),
         run_folder(lambda d: step_time(d)["samples"].__setitem__(5, -0.1)), writes=("bl",), check=nothing_recorded),
    Case("baseline-record-profile-id-escaping", "cli",
         ("baseline", "record", "{t}/run", "--baselines", "{t}/bl", "--hardware-profile", "../escape", "--force"), 2,
         ("'../escape'", "profile id"), run_folder(), check=nothing_under("bl", "escape")),
    Case("baseline-record-profile-id-empty", "cli",
         ("baseline", "record", "{t}/run", "--baselines", "{t}/bl", "--hardware-profile", "", "--force"), 2,
         ("profile id ''",), run_folder(), check=nothing_under("bl")),
    Case("run-against-a-baseline-with-a-zero-sample", "cli",
         ("run", SMOKE_CELL, "--baselines", "{t}/bl", "--out", "{t}/out", *NO_LAUNCH), 2,
         ("samples.json", f"{RUN_CELL}:step_time", "sample 4"), baselines_with(zero_sample),
         writes=("out",), check=nothing_under("out/results.json")),
    Case("pytest-against-a-baseline-with-a-nan-sample", "pytest",
         ("--perf-cell", SMOKE_CELL, "--perf-baselines", "{t}/bl", "--perf-out", "{t}/out", "--perf-no-probe",
          "--perf-history", "off"), 4,
         ("samples.json", f"{RUN_CELL}:step_time", "sample 1"), baselines_with(nan_sample), writes=("out",),
         files={"test_probed_cells.py": 'import pytest\n\n@pytest.mark.perf(workload="image")\n'
                                 'def test_cell(perf_cell, perf_result):\n    pass\n'},
         check=nothing_under("out/results.json")),

    # -- 7. an output encoding that cannot say the path (its own process: PYTHONIOENCODING)
    Case("ascii-stdout-unicode-out", "sub", ("history", "report", "--history", "{t}/h.sqlite",
                                             "--out", "{t}/tendances-\u00e9t\u00e9.html"), 0,
         ("tendances-\\xe9t\\xe9.html", "1 cell(s)"), stored_store, env={"PYTHONIOENCODING": "ascii"},
         writes=("tendances-\u00e9t\u00e9.html",), check=unicode_report_written),
    Case("ascii-stdout-unicode-path-refused", "sub", ("compare", "{t}/\u00e4", "{t}/\u00f6"), 2,
         ("\\xe4",), env={"PYTHONIOENCODING": "ascii"}),

    # -- 8. what selects nothing, names nothing, or is of the wrong type
    Case("run-selects-no-cell-fail-on-skipped", "cli",
         ("run", "--tier", "smoke", "--workload", "probe", "--fail-on-skipped", "--out", "{t}/out", *NO_LAUNCH), 2,
         ("tier smoke, workload probe selects no cell",), check=nothing_under("out")),
    Case("pytest-selects-no-cell-fail-on-skipped", "pytest",
         ("-k", "nothing_matches", "--perf-fail-on-skipped", "--perf-out", "{t}/out", "--perf-history", "off"), 1,
         ("no cell was measured (--perf-fail-on-skipped)",),
         files={"test_probed_cells.py": 'import pytest\n\n@pytest.mark.perf(workload="image")\n'
                                 'def test_cell(perf_cell, perf_result):\n    pass\n'}),
    Case("run-unknown-cell-id", "cli", ("run", SMOKE_CELL.replace("ddp-ds", "ddp-sd"), "--out", "{t}/out",
                                        *NO_LAUNCH), 2,
         ("unknown cell id", SMOKE_CELL.replace("ddp-ds", "ddp-sd")), check=nothing_under("out")),
    Case("pytest-unknown-cell-id", "pytest", ("--perf-cell", "smoke/image/warp-drive/c9", "--perf-out", "{t}/out"), 4,
         ("smoke/image/warp-drive/c9", "perfsuite list"),
         files={"test_probed_cells.py": 'import pytest\n\n@pytest.mark.perf(workload="image")\n'
                                 'def test_cell(perf_cell, perf_result):\n    pass\n'},
         check=nothing_under("out")),
    Case("run-option-without-value", "cli", ("run", SMOKE_CELL, "--option", "max_steps", "--out", "{t}/out",
                                             *NO_LAUNCH), 2,
         ("option 'max_steps'", "KEY=VALUE"), check=nothing_under("out")),
    Case("perf-ranks-timeout-x", "pytest", ("--perf-out", "{t}/out"), 2,
         ("timeout='x'", "a number of seconds"),
         files={"test_mine.py": 'import pytest\n\n@pytest.mark.perf_ranks(2, timeout="x")\n'
                                'def test_step(perf_dist, perf_steps):\n    pass\n'},
         check=nothing_under("out")),
    Case("perf-ranks-misspelt-device-keyword", "pytest", ("--collect-only", "-q"), 2, ("devices",),
         files={"test_mine.py": 'import pytest\n\n@pytest.mark.perf_ranks(2, devices="cuda")\n'
                                'def test_step(perf_dist, perf_steps):\n    pass\n'}),
    Case("perf-marker-misspelt-workload-keyword", "pytest", ("--collect-only", "-q"), 2, ("workloads",),
         files={"test_typo.py": 'import pytest\n\n@pytest.mark.perf(workloads="image")\n'
                                'def test_cell(perf_cell, perf_result):\n    pass\n'}),
    Case("perf-marker-workload-positional", "pytest", ("--collect-only", "-q"), 2, ("workload=",),
         files={"test_typo.py": 'import pytest\n\n@pytest.mark.perf("image")\n'
                                'def test_cell(perf_cell, perf_result):\n    pass\n'}),
    Case("perf-marker-workload-imgae", "pytest", ("--perf-out", "{t}/out"), 2,
         ("workload='imgae'", "no cell has that workload", "known: image"),
         files={"test_typo.py": 'import pytest\n\n@pytest.mark.perf(workload="imgae")\n'
                                'def test_cell(perf_cell, perf_result):\n    pass\n'},
         check=nothing_under("out")),
]


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


@pytest.fixture
def no_launch(monkeypatch):
    """A case that must be refused before any launch fails if one starts."""
    from perfsuite.launch import starting

    started = []

    class Refuse:  # the starter every launch gets: it starts nothing
        name, python, ran_once = "exec", sys.executable, {}

        def warm(self, cell, env):
            pass

        def start(self, argv, *rest, **kw):
            started.append(argv)
            raise RuntimeError("the probe allows no launch here")

    monkeypatch.setattr(starting, "choose", lambda *args, **kw: (Refuse(), None))
    return started


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """One `perfsuite run` of the five cells of the probe's own workload (one launch
    each), as a user runs it: a process of its own, from the workload's folder."""
    folder = tmp_path_factory.mktemp("launched")
    (folder / "probework.py").write_text(WORKLOAD)
    (folder / "exp.toml").write_text(OWN_EXPERIMENT)
    sleep_link(folder)
    watch = Watch(folder, Path(os.environ["PERFSUITE_HISTORY"]).parent)
    watch.start()
    kids = children()
    done = subprocess.run([sys.executable, "-m", "perfsuite.cli.main", "run", *[own_cell(k) for k in range(1, 6)],
                           "--out", str(folder / "out"), *NO_LAUNCH], cwd=folder, capture_output=True, text=True,
                          env={**os.environ, "PERFSUITE_EXPERIMENTS": str(folder / "exp.toml")}, timeout=300)
    session = SimpleNamespace(folder=folder, code=done.returncode, text=done.stdout + done.stderr,
                              strays=watch.strays(("out", "helpers-4.txt", "helpers-5.txt", "__pycache__")),
                              left=left_processes(folder) + new_children(kids))
    yield session
    kill_survivors(folder)


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


def check_launched(case: Case, session: SimpleNamespace) -> None:
    from perfsuite.schemas import results

    verdicts = Verdicts()
    said_checks(verdicts, case, session.code, session.text, session.folder)

    def kept() -> None:
        saved = {c["id"]: c for c in results.load(session.folder / "out")["cells"]}  # the schema, checked
        assert sorted(saved) == sorted(own_cell(k) for k in range(1, 6))  # every cell kept, failed or not
        mine = saved[own_cell(case.cell)]
        if case.cell <= 3:  # the record's error, naming the field, is the cell's
            assert mine["status"] == "error" and case.says[-1] in mine["reason"], mine["reason"]
            assert "WorkloadRecordError" in mine["reason"] or "TypeError" in mine["reason"], mine["reason"]
        elif case.cell == 4:  # measured, and kept: no result lost
            assert mine["status"] == "ok", mine["reason"]
            step = mine["metrics"]["step_time"]
            assert step["n"] == 6 and all(s > 0 for s in step["samples"]), step
        else:
            assert mine["status"] == "error" and "RuntimeError" in mine["reason"], mine["reason"]

    verdicts.run("kept", kept)
    if case.cell >= 4:
        verdicts.run("processes", lambda: helpers_gone(session.folder, str(case.cell)))
    verdicts.expect("processes", session.left == [], f"left: {session.left}")
    verdicts.expect("files", session.strays == [], f"written: {session.strays}")
    verdicts.judge(case)


def launching(case: Case) -> bool:
    return case.via == "launched" or case.launches


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=[pytest.mark.slow] if launching(c) else [])
                                  for c in CASES])
def test_probe(case: Case, request, tmp_path, capsys, monkeypatch):
    if case.via == "launched":
        check_launched(case, request.getfixturevalue("launched"))
        return
    started = [] if case.launches else request.getfixturevalue("no_launch")
    if case.via == "pytest":
        pytester = request.getfixturevalue("pytester")
        t = cwd = pytester.path
        for name, text in case.files.items():
            (t / name).write_text(text)
        sleep_link(t)
    else:
        t, cwd = tmp_path, tmp_path / "cwd"
        cwd.mkdir()
        monkeypatch.chdir(cwd)
    request.addfinalizer(lambda: kill_survivors(t))
    for name, value in case.env.items():
        monkeypatch.setenv(name, fmt(value, t))
    cells.matrix.cache_clear()
    cells.findings.cache_clear()
    request.addfinalizer(cells.findings.cache_clear)
    request.addfinalizer(cells.matrix.cache_clear)
    request.addfinalizer(end_holders)
    if case.setup is not None:
        case.setup(t)
    capsys.readouterr()
    kids = children()
    watch = Watch(t, Path(os.environ["PERFSUITE_HISTORY"]).parent)
    watch.start()
    argv = [fmt(a, t) for a in case.argv]

    if case.via == "cli":
        try:
            code = cli_main(argv)
            said = capsys.readouterr()
            text = said.out + said.err
        except Exception:  # what the console script would print, and its exit status
            said = capsys.readouterr()
            code, text = 1, said.out + said.err + traceback.format_exc()
    elif case.via == "pytest":
        result = pytester.runpytest("-p", "no:cacheprovider", *argv)
        code, text = int(result.ret), "\n".join(result.outlines + result.errlines)
    else:
        done = subprocess.run([sys.executable, "-m", "perfsuite.cli.main", *argv], cwd=cwd, capture_output=True,
                              timeout=120)
        code = done.returncode
        text = done.stdout.decode("ascii") + done.stderr.decode("ascii")  # all of it said in ASCII

    verdicts = Verdicts()
    said_checks(verdicts, case, code, text, t)
    if case.check is not None:
        verdicts.run("kept", lambda: case.check(t, text))
    verdicts.expect("no launch", started == [], f"a launch started: {started}")
    end_holders()
    verdicts.expect("processes", not (left := left_processes(t)), f"left: {left}")
    allowed = case.writes + ((BENCHMARKS,) if case.via == "pytest" else ())
    verdicts.expect("files", not (strays := watch.strays(allowed)), f"written: {strays}")
    if BENCHMARKS in allowed and (t / BENCHMARKS).exists():
        verdicts.expect("files", not list((t / BENCHMARKS).iterdir()), "pytest-benchmark stored something")
    verdicts.expect("children", not (left := new_children(kids)), f"left: {left}")
    if left:
        from perfsuite.launch.agent import close_zygotes

        close_zygotes()
    verdicts.judge(case)
