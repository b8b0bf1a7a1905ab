"""The pytest plugin, driven through pytester (in-process pytest runs)."""

import json

import pytest

from perfsuite import cells
from perfsuite.cli.main import main as cli_main

pytest_plugins = ["pytester"]

CELL_TEST = """
import pytest

@pytest.mark.perf(workload="image")
def test_cell(perf_cell, perf_result):
    assert perf_result["status"] == "ok"
"""


def test_tier_parametrises_every_image_cell(pytester):
    pytester.makepyfile(CELL_TEST)
    result = pytester.runpytest("--collect-only", "-q", "--perf-tier", "gate")
    expected = [c.id for c in cells.select(tier="gate", workload="image")]
    collected = [line for line in result.outlines if "::test_cell[" in line]
    assert len(collected) == len(expected)
    assert all(any(f"[{cid}]" in line for line in collected) for cid in expected)


def test_unknown_cell_id_is_a_usage_error(pytester):
    pytester.makepyfile(CELL_TEST)
    result = pytester.runpytest("--perf-cell", "smoke/image/warp-drive/c9")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown cell id*smoke/image/warp-drive/c9*perfsuite list*"])


def test_a_history_store_that_cannot_take_the_run_is_a_usage_error_before_any_launch(pytester):
    pytester.makepyfile(CELL_TEST)
    out = pytester.path / "out"
    result = pytester.runpytest("--perf-cell", "smoke/image/ddp-ds/c1/fp32/px32/nopin/nchw",
                                "--perf-out", str(out), "--perf-history", "sqlit:///typo.db")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*perfsuite:*sqlit*"])
    assert not (out / "cells").exists()  # nothing launched


def test_missing_gpus_skip_with_reason_and_are_recorded(pytester):
    pytester.makepyfile(CELL_TEST)
    out = pytester.path / "out"
    result = pytester.runpytest("--perf-cell", "gate/image/ddp/g2/fp32/px500/nopin/nchw",
                                "--perf-out", str(out), "-rs", "--perf-allow-no-gpu")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*needs 2 GPU(s), 0 present*"])
    saved = json.loads((out / "results.json").read_text())
    assert saved["cells"][0]["status"] == "skipped"


def test_k_selects_by_part_of_an_id(pytester):
    pytester.makepyfile(CELL_TEST)
    result = pytester.runpytest("--collect-only", "-q", "--perf-tier", "smoke", "-k", "ddp-rr and c2")
    collected = [line for line in result.outlines if "::test_cell[" in line]
    assert collected == ["test_k_selects_by_part_of_an_id.py::test_cell[smoke/image/ddp-rr/c2/fp32/px32/nopin/nchw]"]


def test_cli_list_prints_one_id_per_line(capsys):
    assert cli_main(["list", "--tier", "smoke", "--workload", "image"]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [c.id for c in cells.select(tier="smoke", workload="image")]


def test_cli_run_unknown_id_names_it(capsys):
    assert cli_main(["run", "smoke/image/nope"]) == 2
    assert "smoke/image/nope" in capsys.readouterr().err


def test_a_session_that_measured_no_cell_fails_with_fail_on_skipped(pytester):
    pytester.makepyfile("def test_plain():\n    pass\n")
    strict = pytester.runpytest("--perf-fail-on-skipped", "--perf-history", "off")
    assert strict.ret == pytest.ExitCode.TESTS_FAILED
    strict.stdout.fnmatch_lines(["*no cell was measured (--perf-fail-on-skipped)*"])
    assert pytester.runpytest("--perf-history", "off").ret == pytest.ExitCode.OK  # without it, as before
