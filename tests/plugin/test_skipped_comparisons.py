"""A run that compared nothing must not read green in CI.

The first H100 run passed with every step-time comparison skipped (no
baseline for its profile). The example GPU workflow's gate job therefore runs
with --perf-fail-on-skipped: here, cells that measured fine but whose
step-time comparisons were all skipped fail their tests under that option,
and the workflow's gate line carries it.
"""

from pathlib import Path

import pytest

from perfsuite import cells
from tests.plugin.test_plugin import CELL_TEST

pytest_plugins = ["pytester"]

WORKFLOW = Path(__file__).resolve().parents[2] / ".github" / "workflows" / "perfsuite-gpu.yml"
CELLS = ["smoke/image/ddp-ds/c1/fp32/px32/nopin/nchw", "smoke/image/ddp-ds/c2/fp32/px32/nopin/nchw"]


@pytest.fixture
def measured_fine(monkeypatch):
    """Every launch ends ok with plausible step times, and launches nothing."""
    def run_cell(cell, out_dir, opts=None):
        from perfsuite.hardware import fingerprint

        samples = [0.1, 0.11, 0.1, 0.12, 0.1]
        return {"id": cell.id, "params": cell.params(), "status": "ok", "reason": None,
                "env": fingerprint(), "duration_s": 1.0, "checks": [],
                "ranks": [{"rank": r, "status": "ok", "steps": 5, "device": "cpu", "host": "h",
                           "error": None} for r in range(cell.world_size)],
                "metrics": {"step_time": {"value": 0.1, "unit": "s", "samples": samples},
                            "throughput": {"value": 160.0, "unit": "images/s"}}}

    monkeypatch.setattr("perfsuite.launch.launch.run_cell", run_cell)


def test_fail_on_skipped_fails_a_run_whose_step_times_were_all_skipped(pytester, measured_fine):
    pytester.makepyfile(CELL_TEST)
    (pytester.path / "none").mkdir()  # a baselines root with no folder: nothing to compare with
    args = [arg for cell in CELLS for arg in ("--perf-cell", cell)] + [
        "--perf-no-probe", "--perf-history", "off", "--perf-baselines", str(pytester.path / "none")]
    green = pytester.runpytest(*args, "--perf-out", str(pytester.path / "a"))
    green.assert_outcomes(passed=2)  # what the H100's run read like
    red = pytester.runpytest(*args, "--perf-out", str(pytester.path / "b"), "--perf-fail-on-skipped")
    assert red.ret == pytest.ExitCode.TESTS_FAILED
    red.assert_outcomes(errors=2)  # failed in the fixture that hands out the result
    red.stdout.fnmatch_lines(["*comparison(s) could not be made (--perf-fail-on-skipped)*",
                              "*step_time: no comparable baseline for step_time on profile*"])


def test_the_gpu_workflows_gate_run_fails_on_skipped_comparisons():
    yaml = pytest.importorskip("yaml")
    gate = yaml.safe_load(WORKFLOW.read_text())["jobs"]["gate"]
    run = next(step["run"] for step in gate["steps"] if step.get("name") == "Gate tier")
    assert "--perf-tier gate" in run and "--perf-fail-on-skipped" in run
    assert cells.select(tier="gate")  # the tier it runs exists
