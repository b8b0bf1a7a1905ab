"""The suite's own tests never touch the user's data.

Every test outside ``tests/perf`` runs with perfsuite's stores pointed at one
folder of this session's temporary directory, through variables that the
processes it starts inherit: the default history store
(``$PERFSUITE_HISTORY``), the cache (``$PERFSUITE_CACHE_DIR``) and the tree
nsys installs are looked for under (``$PERFSUITE_NSYS_SEARCH_ROOT``, empty:
no test finds a real nsys under /opt/nvidia); a user's own baselines root,
experiment files and nsys are not read. A test that still writes under the
checkout's ``.perfsuite/`` (a run folder, a run stored in its history) fails,
naming what it wrote.

``tests/perf`` is the product's CPU tier and runs as a user runs it (README:
``pytest tests/perf --perf-out .perfsuite/smoke`` writes there on purpose).
Within the suite's own full run (``pytest``) it still measures for real, into
``.perfsuite/run-<time>-<pid>`` with its report, and is kept in the history;
but a test run measures the working tree as it stands, often with changes not
yet committed, which the history would file under HEAD: so that run is stored
as ``ad-hoc``, and ``perfsuite history changes`` leaves it out.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
from pathlib import Path

import pytest

# The tests of Ctrl-C and hang-ups send SIGINT and SIGHUP and expect
# perfsuite's handling of them, and perfsuite leaves a signal that is already
# ignored alone (`nohup perfsuite run` is to outlive its terminal): a suite
# started under nohup, or in the background of a script (SIGINT ignored), would
# hand that on to every test and process. The suite runs as from a terminal;
# the nohup test sets SIG_IGN itself.
signal.signal(signal.SIGHUP, signal.SIG_DFL)
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

HOME = pytest.StashKey[Path]()
BEFORE = pytest.StashKey[dict]()
STORE = "history.sqlite"


def _perf_dir(config: pytest.Config) -> Path:
    return config.rootpath / "tests" / "perf"


def is_perf(item: pytest.Item) -> bool:
    return Path(item.path).is_relative_to(_perf_dir(item.config))


def isolated_home(config: pytest.Config) -> Path:
    """This session's folder for what perfsuite keeps by default."""
    home = config.stash.get(HOME, None)
    if home is None:
        home = config.stash[HOME] = config._tmp_path_factory.mktemp("perfsuite-home", numbered=False)
        (home / "nsys-root").mkdir()  # empty: no nsys installs under it
    return home


# pytest-xdist tells its workers who they are through these; a pytest a test
# starts (pytester, a launch's ranks) would take itself for a worker too
# (pytest-benchmark then prints no table), so tests run without them.
XDIST_VARIABLES = ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID")


def isolated_env(home: Path) -> dict[str, str | None]:
    """The variables a test runs with (None: unset)."""
    return {"PERFSUITE_HISTORY": str(home / STORE), "PERFSUITE_CACHE_DIR": str(home / "cache"),
            "PERFSUITE_CACHE": None, "PERFSUITE_NSYS_SEARCH_ROOT": str(home / "nsys-root"),
            "PERFSUITE_NSYS_BIN": None, "PERFSUITE_BASELINES": None, "PERFSUITE_EXPERIMENTS": None,
            **dict.fromkeys(XDIST_VARIABLES)}


def guarded_folders(config: pytest.Config) -> list[Path]:
    """The user's ``.perfsuite/`` folders: the checkout's, and the one where pytest was started."""
    return sorted({(config.rootpath / ".perfsuite").resolve(),
                   (config.invocation_params.dir / ".perfsuite").resolve()})


# ----------------------------------------------------------------------------- what a test wrote

def _entries(folder: Path) -> dict[str, tuple[bool, int, int]] | None:
    try:
        return {e.name: (e.is_dir(), e.stat().st_size, e.stat().st_mtime_ns) for e in os.scandir(folder)}
    except FileNotFoundError:
        return None
    except OSError:
        return {}


def _stored_runs(folder: Path, after_id: int = 0) -> list[tuple[int, str | None]]:
    """(id, source) of the runs stored in the folder's history after ``after_id``."""
    path = folder / STORE
    if not path.is_file():
        return []
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10) as conn:
            return conn.execute("SELECT id, source FROM runs WHERE id > ? ORDER BY id", (after_id,)).fetchall()
    except sqlite3.Error:
        return []


def snapshot(folders: list[Path]) -> dict[Path, tuple]:
    out = {}
    for folder in folders:
        stored = _stored_runs(folder)
        out[folder] = (_entries(folder), stored[-1][0] if stored else 0)
    return out


def _someone_elses(path: Path) -> bool:
    """Whether a live process other than this one and its children holds
    this folder (a measurement running in the same checkout meanwhile)."""
    import psutil

    try:
        pid = int(json.loads((path / ".perfsuite.lock.json").read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    try:
        return pid != os.getpid() and os.getpid() not in {p.pid for p in psutil.Process(pid).parents()}
    except psutil.Error:
        return False


def written(before: dict[Path, tuple], basetemp: Path) -> list[str]:
    """What changed under the guarded folders since ``before`` and was not
    another process's doing: entries made or removed, runs stored from this
    session's temporary folders or from entries it made."""
    found = []
    for folder, (entries, last_id) in before.items():
        now = _entries(folder)
        if now is None:
            if entries is not None:
                found.append(f"removed {folder}")
            continue
        if entries is None and not now:
            found.append(f"made {folder}/")
            continue
        made = [name for name in now if name not in (entries or {}) and not _someone_elses(folder / name)]
        found += [f"made {folder / name}{'/' if now[name][0] else ''}" for name in sorted(made)]
        found += [f"removed {folder / name}" for name in sorted(set(entries or {}) - set(now))]
        ours = [basetemp.resolve(), *(folder / name for name in made)]
        for run_id, source in _stored_runs(folder, last_id):
            if source and any(Path(source).resolve().is_relative_to(root) for root in ours):
                found.append(f"stored run {run_id} ({source}) in {folder / STORE}")
    return found


# ----------------------------------------------------------------------------- hooks

def pytest_configure(config: pytest.Config) -> None:
    """A pytest-xdist worker computes with torch on one thread: its tests that
    train in-process share the cores with the other workers and their launches,
    and torch's OpenMP threads then spin waiting for each other (on the 2-core
    VM beside two busy processes, a 12-step MobileNetV2 loop used 18 CPU-s on
    2 threads, 6 on 1). Launches set their ranks' threads themselves."""
    if hasattr(config, "workerinput"):
        import torch

        torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist, the tests marked ``slow`` (real launches, fresh
    venvs: 37 of ~1400 tests took two thirds of the workers' time) go first:
    `.ci/test` hands tests out a few at a time in this order, so the long ones
    start early and the short ones fill the cores at the end, instead of a
    30 s test starting last beside idle workers. Every worker sorts alike."""
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: file order otherwise


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    if is_perf(item):
        return (yield)
    with pytest.MonkeyPatch.context() as patch:
        for name, value in isolated_env(isolated_home(item.config)).items():
            if value is None:
                patch.delenv(name, raising=False)
            else:
                patch.setenv(name, value)
        item.stash[BEFORE] = snapshot(guarded_folders(item.config))
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    before = item.stash.get(BEFORE, None)
    if call.when == "teardown" and before is not None:
        found = written(before, item.config._tmp_path_factory.getbasetemp())
        if found:
            report.outcome = "failed"
            report.longrepr = (f"{item.nodeid} wrote into the user's data: {'; '.join(found)}. A test keeps "
                               f"to its tmp_path: give runs --out / --perf-out there and stores --url / "
                               f"--history there (the defaults point at {isolated_home(item.config)} here)")
    return report


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """The suite's own full run measures tests/perf too: its run is kept, as ad-hoc."""
    from perfsuite import plugin

    runner = session.config.stash.get(plugin.SESSION_KEY, None)
    if runner is None or getattr(runner, "history_purpose", None) is not None:
        return
    if any(not is_perf(item) for item in session.items):
        from perfsuite.history.store import Purpose

        runner.history_purpose = Purpose("ad-hoc", "measured within the suite's own tests, on the working "
                                         "tree as it stands", declared=True)
