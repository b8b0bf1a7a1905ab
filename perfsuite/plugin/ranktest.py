"""A pytest test as the workload of a cell: the test runs in every rank.

The worker resolves a workload that is a pytest node id
(``perfsuite.specs``) to ``run``: the rank initialises its process group,
runs pytest in this process on that one test, with the perfsuite plugin
handing it ``perf_dist`` and ``perf_steps`` (``perfsuite.steps``), and
returns what ``perf_steps`` measured, as any workload returns its record.
A test that fails in the rank raises its own exception here (an
AssertionError with pytest's explanation), so the rank's record, and the
cell's reason, carry that rank's message; one that skips itself
(``pytest.skip``, a ``skipif``, an ``xfail`` that failed as expected) skips
the cell with its reason, in every rank: a rank that skips leaves a note and
closes its process group, and a peer whose collective then fails for the
lost peer skips with that reason; the worker's record, progress and stack
files give a raise, a hang or a kill the diagnosis of any cell.

The test is found from the launcher's pytest root: ``$PERFSUITE_PYTEST_ROOTDIR``
and ``$PERFSUITE_PYTEST_INIFILE`` (the plugin sets them for its launches),
else the working directory (``perfsuite run`` and ``perfsuite ab`` from the
project's folder). The rank's pytest leaves out the ini file's ``addopts``
and ``$PYTEST_ADDOPTS`` (a JUnit file or pytest-xdist are the launcher's,
not each rank's), the cache and pytest's own faulthandler (the worker's
stack dump on SIGUSR1 stays), and does not capture output: what the test
prints goes to the cell's ``output.log``, prefixed with its rank.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

# Before the rank's pytest starts (this module's package, imported first anyway):
# pytest rewrites the asserts of every module of a plugin's distribution imported
# after, perfsuite's too (seconds a rank).
import perfsuite.plugin  # noqa: F401
from perfsuite.rank.peers import is_peer_failure
from perfsuite.steps import Dist, Steps, measuring_modules
from perfsuite.system.atomic import atomic_write_text

ROOTDIR_ENV, INIFILE_ENV = "PERFSUITE_PYTEST_ROOTDIR", "PERFSUITE_PYTEST_INIFILE"
CURRENT: RankSession | None = None  # while pytest runs in this rank (perfsuite.plugin.usercells)
SKIP_NOTE = "skipped-rank{rank}.json"  # in the cell's directory: why a rank skipped, for its peers
PEER_NOTE_WAIT_S = 2.0  # a peer's note is written before its connections close; a shared folder may lag


class RankTestError(RuntimeError):
    """pytest did not run the test to a pass, and no exception of the test says why."""


class RankSession:
    """The pytest plugin of one rank's run: the cell, its Dist and Steps, and
    the first failure (the test's own exception)."""

    def __init__(self, cell: Any, dist: Dist, steps: Steps) -> None:
        self.cell, self.dist, self.steps = cell, dist, steps
        self.failure: BaseException | None = None
        self.errors: list[str] = []  # collection errors, reports without an exception
        self.skipped: str | None = None  # why the test skipped itself here
        self.passed = False

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        report = yield
        if report.skipped and self.skipped is None:  # pytest.skip, a skipif, an expected failure
            self.skipped = _skip_text(report)
        elif call.excinfo is not None and report.failed and self.failure is None:
            self.failure = _from_test(call.excinfo.value, Path(item.path))
        elif report.failed:  # no exception: an unexpected pass of a strict xfail
            self.errors.append(report.longreprtext)
        if report.when == "call" and report.passed:
            self.passed = True
        return report

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.errors.append(report.longreprtext)
        elif report.skipped and self.skipped is None:  # a module-level skip, importorskip
            self.skipped = _skip_text(report)


def _skip_text(report: pytest.TestReport | pytest.CollectReport) -> str:
    """What a skipped report says: the skip's reason, or the expected failure's."""
    if getattr(report, "wasxfail", None) is not None:
        return f"expected to fail (xfail){': ' + report.wasxfail if report.wasxfail else ''}"
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


def _from_test(err: BaseException, path: Path) -> BaseException:
    """``err`` with its traceback from the test file's first frame on: the
    rank's record and output show the test, not pytest's machinery."""
    tb = err.__traceback__
    while tb is not None and Path(tb.tb_frame.f_code.co_filename) != path:
        tb = tb.tb_next
    return err.with_traceback(tb) if tb is not None else err


def pytest_args(cell: Any, environ: dict[str, str] | None = None) -> list[str]:
    """The rank's pytest command line for the cell's test. Hypothesis's
    plugin is left out too: its end of session imports hypothesis (2 s in a
    rank on the 2-core machine), and a measured test draws no examples."""
    env = os.environ if environ is None else environ
    root = Path(env.get(ROOTDIR_ENV) or os.getcwd())
    test = re.sub(r"\[.*\]$", "", cell.workload)  # the function: its items carry c2 too
    args = [str(root / test), "--rootdir", str(root), "-p", "no:cacheprovider",
            "-p", "no:faulthandler", "-p", "no:unraisableexception", "-p", "no:xdist",
            "-p", "no:hypothesispytest",
            "-o", "addopts=", "-q", "-s", "--no-header", "--tb=short",
            "-W", "ignore::pytest.PytestAssertRewriteWarning"]
    if env.get(INIFILE_ENV):
        args += ["-c", env[INIFILE_ENV]]
    return args


def _leave_peers(ctx: Any, reason: str) -> None:
    """This rank skipped: say why where its peers look, then close its process
    group, so that a peer waiting in a collective fails at once rather than at
    the cell's timeout (a forked rank lives on until every rank returned)."""
    import torch.distributed as dist

    note = {"run_token": os.environ.get("PERFSUITE_RUN_TOKEN"), "rank": ctx.rank, "reason": reason}
    path = Path(ctx.out_dir) / SKIP_NOTE.format(rank=ctx.rank)
    atomic_write_text(path, json.dumps(note))  # whole or not at all, no temporary file left
    if ctx.world_size > 1 and dist.is_initialized():
        dist.destroy_process_group()


def _peer_skip(ctx: Any, err: BaseException) -> str | None:
    """Why a peer skipped, where ``err`` only says that a peer went away."""
    if ctx.world_size < 2 or not is_peer_failure(str(err)):
        return None
    deadline = time.monotonic() + PEER_NOTE_WAIT_S
    while True:
        for rank in range(ctx.world_size):
            try:
                note = json.loads((Path(ctx.out_dir) / SKIP_NOTE.format(rank=rank)).read_text())
            except (OSError, ValueError):
                continue
            if rank != ctx.rank and note.get("run_token") == os.environ.get("PERFSUITE_RUN_TOKEN"):
                return note.get("reason") or "a peer skipped"
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.1)


def _meet(ctx: Any) -> None:
    """After a pass, meet the peers once more: one that skipped after the last
    collective is found here (the worker's own barrier would call it a failure)."""
    import torch.distributed as dist

    if ctx.world_size < 2 or not dist.is_initialized():
        return
    try:
        dist.barrier()
    except Exception as err:  # noqa: BLE001 - a lost peer that skipped; anything else stands
        reason = _peer_skip(ctx, err)
        if reason is not None:
            raise pytest.skip.Exception(reason) from None
        raise


def run(cell: Any, ctx: Any) -> dict[str, Any]:
    """Run the cell's test in this rank; the measured part of its record."""
    global CURRENT
    measuring_modules()
    session = RankSession(cell, Dist.start(cell, ctx), Steps(cell, ctx))
    os.environ.pop("PYTEST_ADDOPTS", None)
    CURRENT = session
    try:
        code = pytest.main(pytest_args(cell), plugins=[session])
    finally:
        CURRENT = None
    if session.failure is not None:
        reason = _peer_skip(ctx, session.failure)
        if reason is not None:  # the peer's skip, not this rank's failure
            raise pytest.skip.Exception(reason)
        raise session.failure
    if session.skipped is not None and not session.passed:  # the worker records the cell skipped
        _leave_peers(ctx, session.skipped)
        raise pytest.skip.Exception(session.skipped)
    if not session.passed:
        why = "; ".join(session.errors) or (
            "no such test here" if code == pytest.ExitCode.NO_TESTS_COLLECTED else f"exit code {code}")
        raise RankTestError(f"pytest in rank {ctx.rank} did not pass {cell.workload}: {why}")
    _meet(ctx)
    return session.steps.record()
