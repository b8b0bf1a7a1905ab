"""A pytest run outside a git checkout is stored in the history under the
commit (and branch) given by --perf-commit / --perf-branch, as `perfsuite run
--commit / --branch`; without them the history line says what to pass.
Launches are stood in for: what is tested is what the run is stored under."""

import pytest

from tests.plugin.test_plugin import CELL_TEST

pytest_plugins = ["pytester"]

CELL = "smoke/image/ddp-ds/c1/fp32/px32/nopin/nchw"


@pytest.fixture
def launched_from_a_wheel(monkeypatch):
    """Every launch ends ok at once; the env names no commit of perfsuite's, as
    an installed wheel's does not."""
    from perfsuite import hardware

    installed = {**hardware.fingerprint(), "commit": None}
    monkeypatch.setattr(hardware, "fingerprint", lambda: installed)

    def run_cell(cell, out_dir, opts=None):
        samples = [0.1, 0.11, 0.1, 0.12, 0.1]
        return {"id": cell.id, "params": cell.params(), "status": "ok", "reason": None, "env": installed,
                "duration_s": 1.0, "checks": [],
                "ranks": [{"rank": 0, "status": "ok", "steps": 5, "device": "cpu", "host": "h", "error": None}],
                "metrics": {"step_time": {"value": 0.1, "unit": "s", "samples": samples}}}

    monkeypatch.setattr("perfsuite.launch.launch.run_cell", run_cell)


def history_line(result):
    return next(line for line in result.outlines if line.startswith("history: "))


def test_a_pytest_run_outside_git_is_stored_under_the_commit_it_is_given(pytester, launched_from_a_wheel):
    pytester.makepyfile(CELL_TEST)
    (pytester.path / "none").mkdir()
    args = ["--perf-cell", CELL, "--perf-no-probe", "--perf-baselines", str(pytester.path / "none"),
            "--perf-history", str(pytester.path / "history.sqlite")]
    unnamed = pytester.runpytest(*args, "--perf-out", "one")
    unnamed.assert_outcomes(passed=1)
    assert history_line(unnamed).startswith("history: not stored: ") and "no commit" in history_line(unnamed)
    named = pytester.runpytest(*args, "--perf-out", "two", "--perf-commit", "c0ffee", "--perf-branch", "nightly")
    named.assert_outcomes(passed=1)
    assert history_line(named).startswith("history: stored run ") and "of commit c0ffee (nightly)" in history_line(named)
