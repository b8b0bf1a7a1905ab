"""A scripted probe of hostile-but-realistic input, kept as a test CI runs.

One table of cases (``CASES``: this module's and those of the ``probe_*.py``
modules beside it, by the kind of trouble they bring; their kit in
``probekit.py``) drives one set of checks. Each case is a real
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

Cost (about 60 s on 2 cores): the cases that launch ranks are one ``perfsuite
run`` process (nine cells of a workload of the probe's own, one launch each),
one pytest session (one user test) and one ``perfsuite run`` of one cell
(``--rank-start exec``); every other case must be refused before any launch,
which ``no_launch`` makes a failure of its own.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from perfsuite import cells
from perfsuite.cli.main import main as cli_main
from tests.plugin import probe_ab, probe_config, probe_forked, probe_history, probe_interrupt
from tests.plugin.probekit import (
    BENCHMARKS,
    EXP_ENV,
    EXPERIMENT,
    FINDING,
    GPU_CELL,
    NO_LAUNCH,
    RUN_CELL,
    SMOKE_CELL,
    Case,
    Verdicts,
    Watch,
    ab_folder,
    ab_folder_intact,
    ab_session_held,
    baselines_with,
    bisect_json,
    children,
    end_holders,
    exp_case,
    fmt,
    foreign_store,
    git_repo,
    holders_lock_kept,
    interrupted_run,
    interrupted_run_kept,
    kill_survivors,
    left_processes,
    nan_sample,
    new_children,
    nothing_recorded,
    nothing_under,
    one_worktree,
    results_json_kept,
    run_folder,
    said_checks,
    step_time,
    store_without_runs_table,
    stored_exactly_at,
    stored_store,
    two_runs,
    unicode_report_written,
    users_left_alone,
    zero_sample,
)

pytest_plugins = ["pytester"]

# ============================================================================ the launched session

WORKLOAD = '''
import json
import subprocess
import sys
import time
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


def sleeper():
    time.sleep(600)


def leave(kind):
    """What a workload may leave as its rank ends (kinds 6-8): a thread, forked
    children, a daemon; forked helpers' pids go to a file."""
    import multiprocessing
    import os
    import threading

    pids = []
    if kind == 6:  # a logging thread that never ends, not a daemon
        threading.Thread(target=sleeper, name="probe-logger").start()
    if kind == 7:  # an os.fork child, and a multiprocessing one
        pid = os.fork()
        if pid == 0:
            time.sleep(600)
            os._exit(0)
        child = multiprocessing.get_context("fork").Process(target=sleeper)
        child.start()
        pids += [pid, child.pid]
    if kind == 8:  # a child that called setsid, and a double-forked daemon
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.setsid()
            time.sleep(600)
            os._exit(0)
        if os.fork() == 0:
            os.setsid()
            grandchild = os.fork()
            if grandchild == 0:
                time.sleep(600)
                os._exit(0)
            os.write(w, str(grandchild).encode())
            os._exit(0)
        os.close(w)
        pids += [pid, int(os.read(r, 64))]
    if pids:
        (HERE / f"helpers-{kind}.txt").write_text(" ".join(map(str, pids)))


def facts(kind):
    """What a forked rank starts from (kinds 6, 7: two launches of one zygote)."""
    import atexit
    import os

    import numpy
    import torch

    atexit.register(lambda: (HERE / f"atexit-{kind}.txt").write_text("ran"))
    said = {"torch": torch.rand(1).item(), "numpy": float(numpy.random.rand()),
            "stdin": [os.path.realpath("/proc/self/fd/0"), sys.stdin.name, sys.stdin is sys.__stdin__,
                      sys.stdin.read()]}
    (HERE / f"facts-{kind}.json").write_text(json.dumps(said))


def run(cell, ctx):
    kind = cell.batch_size
    if kind in (6, 7):
        facts(kind)
    if kind in (6, 7, 8):
        leave(kind)
    if kind == 9:
        breakpoint()
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
axes = {batch_size = [1, 2, 3, 4, 5, 6, 7, 8, 9]}
'''


OWN_KINDS = range(1, 10)
HELPER_KINDS = (4, 5, 7, 8)  # the kinds that leave helper processes, their pids in helpers-<kind>.txt


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



# each module's cases, by the kind of trouble they bring
CASES += [*probe_forked.CASES, *probe_ab.CASES, *probe_config.CASES, *probe_history.CASES, *probe_interrupt.CASES]


# ============================================================================ the run

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
    """One `perfsuite run` of the nine cells of the probe's own workload (one launch
    each), as a user runs it: a process of its own, from the workload's folder."""
    folder = tmp_path_factory.mktemp("launched")
    (folder / "probework.py").write_text(WORKLOAD)
    (folder / "exp.toml").write_text(OWN_EXPERIMENT)
    sleep_link(folder)
    watch = Watch(folder, Path(os.environ["PERFSUITE_HISTORY"]).parent)
    watch.start()
    kids = children()
    done = subprocess.run([sys.executable, "-m", "perfsuite.cli.main", "run", *map(own_cell, OWN_KINDS),
                           "--out", str(folder / "out"), *NO_LAUNCH], cwd=folder, capture_output=True, text=True,
                          env={**os.environ, "PERFSUITE_EXPERIMENTS": str(folder / "exp.toml")}, timeout=300)
    session = SimpleNamespace(folder=folder, code=done.returncode, text=done.stdout + done.stderr,
                              strays=watch.strays(("out", "__pycache__", *(f"helpers-{k}.txt" for k in HELPER_KINDS),
                                                   "facts-6.json", "facts-7.json")),
                              left=left_processes(folder) + new_children(kids))
    yield session
    kill_survivors(folder)


def check_launched(case: Case, session: SimpleNamespace) -> None:
    from perfsuite.schemas import results

    verdicts = Verdicts()
    said_checks(verdicts, case, session.code, session.text, session.folder)

    def kept() -> None:
        saved = {c["id"]: c for c in results.load(session.folder / "out")["cells"]}  # the schema, checked
        assert sorted(saved) == sorted(map(own_cell, OWN_KINDS))  # every cell kept, failed or not
        mine = saved[own_cell(case.cell)]
        if case.cell <= 3:  # the record's error, naming the field, is the cell's
            assert mine["status"] == "error" and case.says[-1] in mine["reason"], mine["reason"]
            assert "WorkloadRecordError" in mine["reason"] or "TypeError" in mine["reason"], mine["reason"]
        elif case.cell in (4, 6, 7, 8):  # measured, and kept: no result lost (threads, children left)
            assert mine["status"] == "ok", mine["reason"]
            step = mine["metrics"]["step_time"]
            assert step["n"] == 6 and all(s > 0 for s in step["samples"]), step
        elif case.cell == 9:  # breakpoint(): a sentence, not an empty BdbQuit
            assert mine["status"] == "error" and "RankBreakpoint" in mine["reason"], mine["reason"]
        else:
            assert mine["status"] == "error" and "RuntimeError" in mine["reason"], mine["reason"]
        if case.check is not None:
            case.check(session.folder, session.text)

    verdicts.run("kept", kept)
    if case.cell in HELPER_KINDS:
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
