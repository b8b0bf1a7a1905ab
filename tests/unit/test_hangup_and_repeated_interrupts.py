"""A session ended by a signal keeps what it measured: SIGHUP (a dropped ssh
session) and SIGTERM are taken as Ctrl-C, once, and Ctrl-C pressed again
while the results and the report are written waits for them; the run ends
`interrupted`, with its report, its lock released, exit 130 (pytest: 2).

A session under nohup keeps SIGHUP ignored. Each session is a process of its own (tests/plugin/probe_interrupt.py), the
signals sent from a patched ``Runner.result`` at its second cell: no launch."""

import json
import signal
import subprocess
import sys

import pytest

from tests.plugin.probe_interrupt import (
    EXIT_INTERRUPTED,
    GPU_CELL,
    PYTEST_INTERRUPTED,
    interrupted_by,
    kept_as_interrupted,
    pytest_interrupted_by,
)

SIGNALS_ONCE = """
import os, signal, sys, time
from perfsuite.runner import handle_sigterm

restore = handle_sigterm()
said = []
try:
    os.kill(os.getpid(), signal.SIGHUP)
    time.sleep(5)
except KeyboardInterrupt as stop:
    said.append(str(stop))
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # the session is ending: they wait
    os.kill(os.getpid(), sig)
    time.sleep(0.1)
restore()
print(json.dumps({"said": said, "restored": [signal.getsignal(s) == signal.SIG_DFL
                                              for s in (signal.SIGTERM, signal.SIGHUP)]}))
""".replace("import os,", "import json, os,")


def test_sighup_interrupts_once_later_signals_wait_and_the_handlers_are_put_back():
    done = subprocess.run([sys.executable, "-c", SIGNALS_ONCE], capture_output=True, text=True, timeout=60,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout) == {"said": ["signal SIGHUP"], "restored": [True, True]}
    assert "still keeping what was measured" in done.stderr  # said once, of the later signals
    assert done.stderr.count("still keeping") == 1


def test_a_session_under_nohup_keeps_sighup_ignored():
    script = ("import signal\nfrom perfsuite.runner import handle_sigterm\nhandle_sigterm()\n"
              "print(signal.getsignal(signal.SIGHUP) == signal.SIG_IGN)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    assert done.stdout.strip() == "True", done.stdout + done.stderr


@pytest.mark.parametrize("signals", ["SIGHUP", "SIGINT SIGINT SIGINT", "SIGTERM SIGHUP SIGTERM"])
def test_a_run_ended_by_signals_keeps_its_cells_report_and_mark_and_frees_its_folder(tmp_path, signals):
    interrupted_by(signals)(tmp_path)
    kept_as_interrupted(EXIT_INTERRUPTED)(tmp_path, "")
    said = json.loads((tmp_path / "session.json").read_text())["text"]
    first = signals.split()[0]
    assert f"interrupted ({'Ctrl-C' if first == 'SIGINT' else 'signal ' + first}): 1 cell(s) kept" in said
    assert f"{GPU_CELL}  SKIPPED" in said


def test_a_run_whose_terminal_hung_up_still_writes_its_report_and_exits_130(tmp_path):
    """After a dropped ssh session every write to its terminal fails (EIO)."""
    interrupted_by("SIGHUP", env={"PROBE_TERMINAL": "gone"})(tmp_path)
    kept_as_interrupted(EXIT_INTERRUPTED, said=None)(tmp_path, "")


@pytest.mark.parametrize("signals", ["SIGHUP", "SIGINT SIGINT SIGINT"])
def test_a_pytest_session_ended_by_signals_keeps_its_cells_report_and_mark(tmp_path, signals):
    pytest_interrupted_by(signals)(tmp_path)
    kept_as_interrupted(PYTEST_INTERRUPTED, "KeyboardInterrupt")(tmp_path, "")
