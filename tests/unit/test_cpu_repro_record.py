"""The PR comment's repro lines, run as printed on the 2-core VM
(tests/data/cpu-2026-11-28/repro/README.md): the comment rendered from each
stored session prints the command that measured it, and the verdicts are
those the README states and the 2-core record had."""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path

import pytest

from perfsuite.cli.main import build_parser
from perfsuite.report import pr_comment
from tests.unit.test_pr_comment import cpu_session, repro_lines

HERE = Path(__file__).resolve().parents[1] / "data" / "cpu-2026-11-28" / "repro"
# the session, the record's condition, the verdict and interval the README states
SESSIONS = {"unchanged": ("unchanged", "unknown", "1.009", ("0.9976", "1.021"), 4),
            "slow10": ("slow10", "regressed", "1.121", ("1.068", "1.176"), 3)}


def stored(name: str) -> dict:
    return json.loads((HERE / f"{name}.ab.json").read_text())


def options(words: list[str]) -> dict:
    """`perfsuite ab ...` parsed by perfsuite's own parser, less where it wrote (--out)."""
    assert Path(words[0]).name == "perfsuite" and words[1] == "ab"
    parsed = vars(build_parser().parse_args(words[1:]))
    parsed.pop("out")
    return parsed


def test_the_stored_files_are_those_measured():
    for line in (HERE / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split()
        assert hashlib.sha256((HERE / name).read_bytes()).hexdigest() == digest, name


@pytest.mark.parametrize("name", SESSIONS)
def test_the_command_run_is_the_repro_line_the_records_comment_prints(name):
    condition = SESSIONS[name][0]
    (printed,) = repro_lines(pr_comment.ab_comment(cpu_session(condition)))
    ran = stored(name)["argv"]
    assert options(shlex.split(printed)) == options(ran)
    assert f"\n{printed}\n" in (HERE / "README.md").read_text()
    # and the session measured prints that same line again
    (again,) = repro_lines(pr_comment.ab_comment(stored(name)))
    assert again == printed


@pytest.mark.parametrize("name", SESSIONS)
def test_each_sessions_verdict_is_what_the_readme_states_and_the_record_allows(name):
    condition, verdict, ratio, (low, high), pairs = SESSIONS[name]
    (cell,) = stored(name)["cells"]
    assert cell["verdict"] == verdict and f"{cell['ratio']:.4g}" == ratio
    assert (f"{cell['ci_low']:.4g}", f"{cell['ci_high']:.4g}") == (low, high)
    assert cell["n_a"] == cell["n_b"] == pairs
    record = json.loads((Path(__file__).resolve().parents[1] / "data" / "cpu-2026-11-26" /
                         "ab-detection-20.json").read_text())
    seen = {s["verdict"] for s in record["sessions"] if s["condition"] == condition}
    assert verdict in seen and "regressed" not in (seen if condition == "unchanged" else set())
    last = (HERE / f"{name}.txt").read_text().splitlines()
    summary = next(line for line in last if line.startswith(cell["id"] + "  "))
    assert f"{verdict.upper()}  ratio {ratio} (98 % CI {low}-{high})" in summary


def test_the_slowed_sessions_interval_holds_the_injected_ten_percent_and_the_unchanged_one_holds_one():
    (unchanged,) = stored("unchanged")["cells"]
    (slow,) = stored("slow10")["cells"]
    assert unchanged["ci_low"] < 1 < unchanged["ci_high"]
    assert slow["ci_low"] < 1.10 < slow["ci_high"] and slow["ci_low"] > 1.02
