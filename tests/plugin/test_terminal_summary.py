"""A perf run's last lines are perfsuite's: where its results, report and
history are. pytest-benchmark (installed with perfsuite) prints its table of
the cells' step times in the same terminal summary, 240 columns wide; it comes
before them, and pytest's own short summary after."""

import pytest

from tests.plugin.test_plugin import CELL_TEST
from tests.plugin.test_skipped_comparisons import CELLS, measured_fine  # noqa: F401 - a fixture

pytest_plugins = ["pytester"]


def _tail(lines: list[str]) -> list[str]:
    """The lines before pytest's short summary (or its final line)."""
    end = next(k for k, line in enumerate(lines) if "short test summary info" in line
               or (line.startswith("=") and (" passed" in line or " failed" in line)))
    return lines[:end]


@pytest.mark.parametrize("outcome", ["pass", "fail"])
def test_perfsuites_lines_come_last_after_pytest_benchmarks_table(pytester, measured_fine, outcome):  # noqa: F811
    test = CELL_TEST if outcome == "pass" else CELL_TEST + "    assert False, 'a failing cell test'\n"
    pytester.makepyfile(test)
    args = [arg for cell in CELLS for arg in ("--perf-cell", cell)]
    run = pytester.runpytest(*args, "--perf-no-probe", "--perf-out", str(pytester.path / "out"),
                             "--perf-history", str(pytester.path / "history.sqlite"), "-rA")
    lines = run.outlines
    table = next(k for k, line in enumerate(lines) if "benchmark: 2 tests" in line)
    tail = _tail(lines)
    assert [line.split(":")[0] for line in tail[-3:]] == ["results", "report", "history"], tail[-8:]
    assert table < len(tail) - 3  # the table before perfsuite's lines
    assert any("short test summary info" in line for line in lines[len(tail):])  # pytest's, after them


def test_perfsuites_lines_are_written_when_another_plugins_summary_raises(pytester, measured_fine):  # noqa: F811
    """As pytest-benchmark's does with --benchmark-compare-fail."""
    pytester.makepyfile(CELL_TEST)
    pytester.makeconftest("def pytest_terminal_summary():\n    raise RuntimeError('a summary that raises')\n")
    run = pytester.runpytest("--perf-cell", CELLS[0], "--perf-no-probe", "--perf-out", str(pytester.path / "out"),
                             "--perf-history", "off")
    assert "a summary that raises" in run.stdout.str() + run.stderr.str()
    run.stdout.fnmatch_lines(["*= perfsuite =*", f"{CELLS[0]}  OK*", "results: *results.json", "report: *report.html"])
