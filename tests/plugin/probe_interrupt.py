"""The hostile probe's cases: interrupt.

A session ended by a signal (a dropped ssh session's SIGHUP, a CI cancel's
SIGTERM, Ctrl-C pressed three times), its working directory removed under it,
a disk too full for its lock, a timeout shorter than the ranks' start. The
signals are sent by the session to itself, from a patched ``Runner.result``
at its second cell, in a process of its own (``interrupted``): the case's
command then reads what that session left.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.plugin.probekit import GPU_CELL, NO_LAUNCH, SMOKE_CELL, TRACEBACK, Case, nothing_under, run_folder

GPU_CELL_1 = "gate/image/ddp/g1/fp32/px500/nopin/nchw"  # skipped too, without a launch
EXIT_INTERRUPTED, PYTEST_INTERRUPTED = 130, 2

# Patches, selected by PROBE_SIGNALS ("SIGHUP", "SIGINT SIGINT SIGINT", "SIGTERM SIGHUP", ...):
# the first signal at the session's second cell, the others while it writes its
# report. PROBE_TERMINAL=gone: the terminal hung up first (writes to it fail, EIO).
PATCHES = '''
import os, signal, time

import perfsuite.report.html as _html
from perfsuite.runner import Runner

_signals = [getattr(signal, name) for name in os.environ.get("PROBE_SIGNALS", "").split()]
_result, _report, _calls = Runner.result, _html.write_reports, []


def _result_then_signal(self, cell):
    _calls.append(cell.id)
    if len(_calls) == 2 and _signals:
        if os.environ.get("PROBE_TERMINAL") == "gone":
            master, slave = os.openpty()
            os.dup2(slave, 1)
            os.dup2(slave, 2)
            os.close(master)
        os.kill(os.getpid(), _signals[0])
        time.sleep(5)  # the handler raises in this thread before this ends
    if len(_calls) == 2 and os.environ.get("PROBE_REMOVE_CWD"):
        os.rmdir(os.getcwd())
    return _result(self, cell)


def _report_under_signals(*args, **kw):
    for sig in _signals[1:]:  # pressed again while the report is written
        os.kill(os.getpid(), sig)
        time.sleep(0.2)
    return _report(*args, **kw)


Runner.result = _result_then_signal
_html.write_reports = _report_under_signals
'''

RUN_SCRIPT = PATCHES + '''
import sys

from perfsuite.cli.main import main

if os.environ.get("PROBE_CWD"):  # as a shell's cd
    os.chdir(os.environ["PROBE_CWD"])
    os.environ["PWD"] = os.environ["PROBE_CWD"]
sys.exit(main(sys.argv[1:]))
'''

CELL_TEST = ('import pytest\n\n@pytest.mark.perf(workload="image")\n'
             'def test_cell(perf_cell, perf_result):\n    pass\n')


def _default_signals() -> None:
    """The session sees Ctrl-C however the test process itself was started."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _full_disk() -> None:
    """Files stop growing at 64 bytes (EFBIG, as a full disk's ENOSPC)."""
    _default_signals()
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))


def session(t: Path, argv: list[str], signals: str = "", *, pytest_session: bool = False,
            env: dict[str, str] | None = None, full_disk: bool = False) -> tuple[int, str]:
    """A `perfsuite run` (or a pytest session of two cells) in a process of its
    own, sent ``signals``; its exit status and output, also kept as
    ``session.json`` beside it for the case's checks."""
    t.mkdir(parents=True, exist_ok=True)
    environ = {**os.environ, "PROBE_SIGNALS": signals, "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}
    if pytest_session:
        (t / "conftest.py").write_text(PATCHES)
        (t / "test_probed_cells.py").write_text(CELL_TEST)
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *argv]
    else:
        (t / "probe_run.py").write_text(RUN_SCRIPT)
        command = [sys.executable, str(t / "probe_run.py"), *argv]
    done = subprocess.run(command, cwd=t, env=environ, capture_output=True, text=True, timeout=180,
                          preexec_fn=_full_disk if full_disk else _default_signals)
    text = done.stdout + done.stderr
    (t / "session.json").write_text(json.dumps({"code": done.returncode, "text": text}))
    return done.returncode, text


def interrupted_by(signals: str, **kw) -> Callable[[Path], None]:
    """Setup: `perfsuite run` of two GPU cells (skipped without a launch) into
    {t}/cut, sent ``signals``."""
    return lambda t: session(t, ["run", GPU_CELL, GPU_CELL_1, "--out", str(t / "cut"), "--allow-no-gpu",
                                 *NO_LAUNCH], signals, **kw)


def pytest_interrupted_by(signals: str) -> Callable[[Path], None]:
    return lambda t: session(t, ["--perf-cell", GPU_CELL, "--perf-cell", GPU_CELL_1, "--perf-out", str(t / "cut"),
                                 "--perf-allow-no-gpu", "--perf-no-probe", "--perf-history", "off"],
                             signals, pytest_session=True)


def lock_released(folder: Path) -> None:
    """No holder left, and the folder can be taken at once by another session."""
    from perfsuite.system.locking import HOLDER_NAME, FolderLock

    assert not (folder / HOLDER_NAME).exists(), f"{folder} still names a holder: a stale lock"
    lock = FolderLock(folder, "probe").acquire()
    lock.release()


def kept_as_interrupted(code: int, said: str | None = "interrupted") -> Callable[[Path, str], None]:
    """What the interrupted session left: its exit status, no traceback, the
    first cell kept, the run marked interrupted, its report, its lock released."""
    def check(t: Path, text: str) -> None:
        done = json.loads((t / "session.json").read_text())
        assert done["code"] == code, done["text"][-3000:]
        assert TRACEBACK not in done["text"] and "INTERNALERROR" not in done["text"], done["text"][-3000:]
        if said:  # on its terminal, unless that hung up
            assert said in done["text"], done["text"][-3000:]
        saved = json.loads((t / "cut" / "results.json").read_text())
        assert saved["run"]["status"] == "interrupted", saved["run"]
        assert [c["id"] for c in saved["cells"]] == [GPU_CELL]
        assert (t / "cut" / "report.html").stat().st_size > 0, "no report written"
        lock_released(t / "cut")
    return check


def removed_mid_run(t: Path) -> None:
    """Setup: `perfsuite run` whose working directory is removed before its second cell."""
    (t / "shell").mkdir()
    session(t, ["run", GPU_CELL, SMOKE_CELL, "--out", str(t / "cut"), "--allow-no-gpu", *NO_LAUNCH],
            env={"PROBE_REMOVE_CWD": "1", "PROBE_CWD": str(t / "shell")})


def failed_with_a_sentence(t: Path, text: str) -> None:
    done = json.loads((t / "session.json").read_text())
    assert done["code"] == 1 and TRACEBACK not in done["text"], done["text"][-3000:]
    saved = json.loads((t / "cut" / "results.json").read_text())
    cells = {c["id"]: c for c in saved["cells"]}
    assert cells[GPU_CELL]["status"] == "skipped" and saved["run"]["status"] == "complete"
    reason = cells[SMOKE_CELL]["reason"]
    assert cells[SMOKE_CELL]["status"] == "error" and f"{t / 'shell'}" in reason and "--resume" in reason, reason
    assert not list((t / "cut" / "cells").rglob("output.log")), "the cell was launched"
    assert f"report: {t / 'cut' / 'report.html'}" in done["text"], done["text"][-3000:]
    lock_released(t / "cut")


def removed_cwd(t: Path) -> None:
    """Setup: the case's working directory removed under it (the shell's cd still there)."""
    (t / "cwd").rmdir()


def not_called_hung(t: Path, text: str) -> None:
    assert "hung before its first step" not in text, text[-2000:]


def record_on_a_full_disk(t: Path) -> None:
    run_folder()(t)
    session(t, ["baseline", "record", str(t / "run"), "--baselines", str(t / "bl")], full_disk=True)


def run_on_a_full_disk(t: Path) -> None:
    session(t, ["run", GPU_CELL, "--allow-no-gpu", "--out", str(t / "out"), *NO_LAUNCH], full_disk=True)


def refused_leaving_nothing(*names: str) -> Callable[[Path, str], None]:
    """The session on a full disk exited 2 with a sentence naming the folder, and left no file there."""
    def check(t: Path, text: str) -> None:
        done = json.loads((t / "session.json").read_text())
        assert done["code"] == 2 and TRACEBACK not in done["text"], done["text"][-3000:]
        assert str(t) in done["text"], done["text"][-3000:]
        nothing_under(*names)(t, text)
    return check


def history_add(folder: str = "cut") -> tuple[str, ...]:
    """The case's own command: the interrupted run is refused by the history."""
    return ("history", "add", "{t}/" + folder, "--commit", "abc", "--history", "{t}/h.sqlite")


REFUSED = ("{t}/cut/results.json", "interrupted", "--resume")

CASES: list[Case] = [
    Case("run-hangup-kept-as-interrupted", "cli", history_add(), 2, REFUSED, interrupted_by("SIGHUP"),
         check=kept_as_interrupted(EXIT_INTERRUPTED)),
    Case("run-hangup-on-a-terminal-gone", "cli", history_add(), 2, REFUSED,
         interrupted_by("SIGHUP", env={"PROBE_TERMINAL": "gone"}),
         check=kept_as_interrupted(EXIT_INTERRUPTED, said=None)),
    Case("run-three-quick-ctrl-c", "cli", history_add(), 2, REFUSED, interrupted_by("SIGINT SIGINT SIGINT"),
         check=kept_as_interrupted(EXIT_INTERRUPTED)),
    Case("run-sigterm-then-hangup-while-reporting", "cli", history_add(), 2, REFUSED,
         interrupted_by("SIGTERM SIGHUP SIGTERM"), check=kept_as_interrupted(EXIT_INTERRUPTED)),
    Case("pytest-hangup-kept-as-interrupted", "cli", history_add(), 2, REFUSED, pytest_interrupted_by("SIGHUP"),
         check=kept_as_interrupted(PYTEST_INTERRUPTED, "KeyboardInterrupt: signal SIGHUP")),
    Case("pytest-three-quick-ctrl-c", "cli", history_add(), 2, REFUSED,
         pytest_interrupted_by("SIGINT SIGINT SIGINT"),
         check=kept_as_interrupted(PYTEST_INTERRUPTED, "KeyboardInterrupt")),
    Case("run-in-a-removed-working-directory", "cli", ("run", SMOKE_CELL, "--out", "{t}/out", *NO_LAUNCH), 2,
         ("working directory {t}/cwd", "is gone", "cd to an existing folder"), removed_cwd,
         env={"PWD": "{t}/cwd"}, check=nothing_under("out")),
    Case("run-working-directory-removed-mid-run", "cli", ("report", "{t}/cut"), 0, ("report.html",),
         removed_mid_run, writes=("cut",), check=failed_with_a_sentence),
    Case("baseline-record-on-a-full-disk", "cli", ("report", "{t}/run"), 0, ("{t}/run/report.html",),
         record_on_a_full_disk, writes=("run",), check=refused_leaving_nothing("bl")),
    Case("run-on-a-full-disk", "cli", ("report", "{t}/out"), 2, ("{t}/out",), run_on_a_full_disk,
         check=refused_leaving_nothing("out")),
    Case("run-timeout-shorter-than-exec-ranks-start", "cli",
         ("run", SMOKE_CELL, "--timeout", "1", "--rank-start", "exec", "--out", "{t}/out", *NO_LAUNCH), 1,
         ("TIMEOUT", "still starting", "importing torch"), writes=("out",), check=not_called_hung, launches=True),
]
