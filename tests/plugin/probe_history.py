"""The hostile probe's cases: history."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.plugin.probekit import GPU_CELL, RUN_CELL, Case, quietly, results_file, stored_store

STORE = "{t}/h.sqlite"
FULL = pytest.MonkeyPatch()  # the full disk of a case: set by its setup, undone by its check


def nights(purpose: str | None = None, branch: str = "main") -> Callable[[Path], None]:
    """Three nightly runs of three commits stored from one output folder."""
    def setup(t: Path) -> None:
        for night in range(3):
            results_file(t / "nightly", lambda d, n=night: d["run"].update(started=1_700_000_000.0 + 86400 * n))
            argv = ["history", "add", str(t / "nightly"), "--commit", f"{night}abc".ljust(40, "0"),
                    "--branch", branch, "--history", str(t / "h.sqlite")]
            assert quietly(argv + (["--history-purpose", purpose] if purpose else [])) == 0
    return setup


def to_version_1(t: Path) -> None:
    with sqlite3.connect(t / "h.sqlite") as conn:
        conn.execute("ALTER TABLE runs DROP COLUMN purpose")
        conn.execute("ALTER TABLE runs DROP COLUMN options")
        conn.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    conn.close()


def reused_folder(t: Path) -> None:
    """The nightly runs in a version 1 store, and tonight's run, with a
    workload option, written into their folder since."""
    nights()(t)
    to_version_1(t)
    results_file(t / "nightly", lambda d: (d["run"].update(started=1_800_000_000.0),
                                           d["cells"][0].update(argv=["--option", "max_steps=5"])))


def purposes_are(*expected: str) -> Callable[[Path, str], None]:
    def check(t: Path, text: str) -> None:
        with sqlite3.connect(t / "h.sqlite") as conn:
            assert [r[0] for r in conn.execute("SELECT purpose FROM runs ORDER BY started")] == list(expected)
        conn.close()
    return check


READ_ONLY: list[Callable[[], None]] = []


def read_only_older_store(t: Path) -> None:
    """A version 1 store this process cannot write (root: the immutable flag)."""
    from tests.unit.test_history_honest_answers import read_only

    nights()(t)
    to_version_1(t)
    READ_ONLY.append(read_only(t / "h.sqlite"))


def writable_again(t: Path, text: str) -> None:
    while READ_ONLY:
        READ_ONLY.pop()()
    with sqlite3.connect(t / "h.sqlite") as conn:  # left as it was: version 1
        assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("1",)
    conn.close()


def failed_run(t: Path) -> None:
    """A stored run whose one cell failed: the cell is in the store, with no step time that counts."""
    results_file(t / "run", lambda d: d["cells"][0].update(status="error", reason="RuntimeError: boom"))
    assert quietly(["history", "add", str(t / "run"), "--commit", "a" * 40, "--history", str(t / "h.sqlite")]) == 0


def disk_full(then: Callable[[Path], None] | None = None) -> Callable[[Path], None]:
    """``then``, and the disk under the store full from here on (SQLite's own error on every write)."""
    def setup(t: Path) -> None:
        from tests.unit.test_history_honest_answers import disk_full_engine

        if then is not None:
            then(t)
        FULL.setattr("perfsuite.history.store.open_engine", disk_full_engine)
    return setup


def room_again(kept: Callable[[Path, str], None] | None = None) -> Callable[[Path, str], None]:
    def check(t: Path, text: str) -> None:
        FULL.undo()
        if kept is not None:
            kept(t, text)
    return check


def run_kept(t: Path, text: str) -> None:
    saved = json.loads((t / "out" / "results.json").read_text())
    assert saved["run"]["status"] == "complete" and saved["cells"][0]["id"] == GPU_CELL
    assert (t / "out" / "report.html").is_file()
    assert quietly(["history", "add", str(t / "out"), "--commit", "c0ffee", "--history", str(t / "h.sqlite")]) == 0


CASES: list[Case] = [
    # -- a migration that took tonight's file for three older runs
    Case("history-migrate-reused-output-folder", "cli", ("history", "changes", "--history", STORE), 0,
         ("0 change point(s) in 1 series",), reused_folder, writes=("h.sqlite",),
         check=purposes_are("run", "run", "run")),
    Case("history-changes-every-run-left-out", "cli", ("history", "changes", "--history", STORE), 2,
         (STORE, "3 experiment run(s)", "--include experiment", "history mark"), nights("experiment")),
    Case("history-changes-json-every-run-left-out", "cli", ("history", "changes", "--history", STORE, "--json"), 2,
         ('"experiment": 3', "history mark"), nights("experiment")),
    Case("history-mark-by-commit", "cli", ("history", "mark", "1abc0000", "--history-purpose", "run",
                                           "--history", STORE), 0,
         ("now marked run (was experiment)", "{t}/nightly"), nights("experiment"), writes=("h.sqlite",),
         check=purposes_are("experiment", "run", "experiment")),
    Case("history-mark-by-folder-marks-every-run-from-it", "cli", ("history", "mark", "{t}/nightly", "--purpose",
                                                                   "run", "--history", STORE), 0,
         ("now marked run (was experiment)",), nights("experiment"),
         writes=("h.sqlite",), check=purposes_are("run", "run", "run")),
    Case("history-mark-names-nothing-stored", "cli", ("history", "mark", "ffff0000", "--history-purpose", "run",
                                                      "--history", STORE), 2,
         ("'ffff0000'", "no stored run matches", "0abc00000000"), nights("experiment"),
         check=purposes_are("experiment", "experiment", "experiment")),
    Case("history-mark-a-two-letter-prefix", "cli", ("history", "mark", "ab", "--history-purpose", "run",
                                                     "--history", STORE), 2,
         ("'ab'", "at least 4 characters"), nights("experiment")),
    Case("history-mark-without-a-purpose", "cli", ("history", "mark", "0abc", "--history", STORE), 2,
         ("--history-purpose run|experiment|ad-hoc",), nights("experiment")),
    Case("history-mark-without-a-store", "cli", ("history", "mark", "0abc", "--history-purpose", "run",
                                                 "--history", STORE), 2, ("no history at {t}/h.sqlite",)),

    # -- a read-only older store
    Case("history-show-read-only-older-store", "cli", ("history", "show", RUN_CELL, "--history", STORE), 0,
         ("0abc00000000", "2abc00000000"), read_only_older_store, check=writable_again),
    Case("history-changes-read-only-older-store", "cli", ("history", "changes", "--history", STORE), 0,
         ("0 change point(s) in 1 series",), read_only_older_store, check=writable_again),
    Case("history-mark-read-only-older-store", "cli", ("history", "mark", "0abc", "--history-purpose", "run",
                                                       "--history", STORE), 2,
         (STORE, "layout version 1", "make it writable"), read_only_older_store, check=writable_again),

    # -- a branch with no run, a cell stored without that history
    Case("history-changes-branch-nosuch", "cli", ("history", "changes", "--history", STORE, "--branch", "nosuch"), 2,
         ("--branch nosuch", "no run on branch nosuch", "main (3 run(s))"), nights()),
    Case("history-show-branch-nosuch", "cli", ("history", "show", RUN_CELL, "--history", STORE, "--branch",
                                               "nosuch"), 2, ("no run on branch nosuch", "main (3 run(s))"), nights()),
    Case("history-report-branch-nosuch", "cli", ("history", "report", "--history", STORE, "--branch", "nosuch",
                                                 "--out", "{t}/trends.html"), 2,
         ("no run on branch nosuch", "main (3 run(s))"), nights()),
    Case("history-show-stored-cell-that-failed", "cli", ("history", "show", RUN_CELL, "--history", STORE), 2,
         (f"no step_time history of {RUN_CELL}: it is stored, but no run of it finished ok",), failed_run,
         check=lambda t, text: None if f"did you mean {RUN_CELL}" not in text else pytest.fail("suggested itself")),
    Case("history-show-known-cell-never-stored", "cli", ("history", "show", GPU_CELL, "--history", STORE), 2,
         (GPU_CELL, "a cell perfsuite knows, not stored in this history yet"), stored_store),

    # -- a full disk under the store
    Case("history-add-disk-full", "cli", ("history", "add", "{t}/run", "--commit", "a" * 40, "--history", STORE), 2,
         (STORE, "database or disk is full"), disk_full(lambda t: results_file(t / "run")), writes=("h.sqlite",),
         check=room_again()),
    Case("run-history-write-disk-full", "cli", ("run", GPU_CELL, "--allow-no-gpu", "--no-probe", "--out", "{t}/out",
                                                "--history", STORE, "--commit", "c0ffee"), 2,
         ("history: not written", "database or disk is full", "{t}/out/results.json",
          "perfsuite history add {t}/out --commit c0ffee --history {t}/h.sqlite"),
         disk_full(), writes=("out", "h.sqlite"), check=room_again(run_kept)),
]
