"""The pull request's comment (perfsuite/report/pr_comment.py), rendered from
stored A/B sessions: the H100's ab.json files (tests/data/h100-2026-11-26)
and the 2-core VM's detection record (tests/data/cpu-2026-11-26), whose
sessions are put back into ab.json's shape with the benchmark's settings.
Every column is read back from the table, and every repro line is parsed
by perfsuite's own `ab` parser."""

from __future__ import annotations

import copy
import json
import math
import shlex
import shutil
from pathlib import Path

import pytest

from perfsuite.cli.main import build_parser
from perfsuite.cli.main import main as cli_main
from perfsuite.report import pr_comment
from perfsuite.report.error_rates import load_error_rates
from perfsuite.report.markdown import summary_markdown
from tests.unit.test_summary_markdown import rows

DATA = Path(__file__).resolve().parents[1] / "data"
H100 = DATA / "h100-2026-11-26"
H100_SESSIONS = ("ab-unchanged-1.json", "ab-slow2.json", "ab-unchanged-2.json")
CPU_RECORD = DATA / "cpu-2026-11-26" / "ab-detection-20.json"
CPU_FAULTS = {"unchanged": None, "slow10": "slow:*:0:0.1", "slow5": "slow:*:0:0.05"}  # selftest's ab_fault
HEADER = "cell | verdict | ratio B/A | interval | detectable | where the time went"


def h100(name: str) -> dict:
    return json.loads((H100 / name).read_text())


def cpu_session(condition: str, trial: int = 1) -> dict:
    """One session of the 2-core record as ab.json: both sides this
    interpreter, side B slowed by the condition's fault, the record's settings."""
    record = json.loads(CPU_RECORD.read_text())
    found = next(s for s in record["sessions"] if s["condition"] == condition and s["trial"] == trial)
    settings = record["settings"]
    fault = CPU_FAULTS[condition]
    side = {"python": "/usr/bin/python3", "env": {"PYTHONSAFEPATH": "1"}, "ref": None, "commit": None}
    return {"schema": "perfsuite.ab/1", "argv": [], "interrupted": False,
            "settings": {"tolerance": settings["tolerance"], "confidence": settings["confidence"],
                         "launch_statistic": "median", "max_launches": 12, "mode": "auto",
                         "resident": settings["resident"],
                         "launch": {"data_dir": None, "options": {}, "timeout_s": None, "profiler": None,
                                    "gpus": None, "nnodes": 1, "slurm": False},
                         "sides": {"A": {"name": "A", **side, "workload_options": {}},
                                   "B": {"name": "B", **side,
                                         "workload_options": {"fault": fault} if fault else {}}}},
            "cells": [{"id": found["cell"], "verdict": found["verdict"], "ratio": found["ratio"],
                       "ci_low": found["ci_low"], "ci_high": found["ci_high"], "confidence": found["confidence"],
                       "mode": "resident", "reason": None, "checks": []}]}


def repro_lines(text: str) -> list[str]:
    block = text.split("Measure a cell again on your machine:", 1)[1].split("```sh\n", 1)[1]
    return block.split("\n```", 1)[0].splitlines()


def parsed(line: str, command: str = "ab"):
    words = shlex.split(line)
    assert words[:2] == ["perfsuite", command]
    return build_parser().parse_args(words[1:])


def expected_columns(record: dict) -> list[str]:
    """What each column must say, worked out here from the record."""
    low, high = record["ci_low"], record["ci_high"]
    detectable = record.get("detectable") or (math.sqrt(high / low) - 1)
    return [f"`{record['id']}`", record["verdict"], f"{record['ratio']:.4g}",
            f"{low:.4g}–{high:.4g} ({record['confidence'] * 100:.0f} %)", f"{detectable * 100:.2f} %", "–"]


# ------------------------------------------------------------------- table
@pytest.mark.parametrize("name", H100_SESSIONS)
def test_an_h100_session_renders_every_column_of_its_cell(name):
    data = h100(name)
    text = pr_comment.ab_comment(data)
    assert text.splitlines()[0] == pr_comment.AB_MARKER  # the workflow finds its comment by it
    (row,) = rows(text, HEADER)
    (record,) = data["cells"]
    want = expected_columns(record)
    assert row[0] == want[0] and row[1].endswith(want[1]) and row[2:] == want[2:]
    assert "detectable" not in record  # recorded before ab kept it: worked out from the interval
    assert row[1].startswith("❌" if record["verdict"] == "regressed" else "✅")


@pytest.mark.parametrize("condition", ["unchanged", "slow10", "slow5"])
def test_the_two_core_records_sessions_render_every_column(condition):
    data = cpu_session(condition)
    (row,) = rows(pr_comment.ab_comment(data), HEADER)
    want = expected_columns(data["cells"][0])
    assert row[0] == want[0] and row[1].endswith(want[1]) and row[2:] == want[2:]


def test_an_other_check_that_moved_is_listed_under_the_table():
    text = pr_comment.ab_comment(h100("ab-slow2.json"))  # its peak RSS improved
    assert "- `gate/image/ddp-ds/g1/fp32/px500/pin/nchw` peak_rss IMPROVED: peak_rss improved" in text


# -------------------------------------------------------------- repro line
@pytest.mark.parametrize("name", H100_SESSIONS)
def test_the_repro_line_parses_back_into_the_sessions_cell_and_options(name):
    data = h100(name)
    (line,) = repro_lines(pr_comment.ab_comment(data))
    args = parsed(line)
    settings = data["settings"]
    assert args.targets == [data["cells"][0]["id"]] and args.tier is None
    assert args.tolerance == settings["tolerance"] and args.mode == settings["mode"]
    assert (args.window_steps, args.quads, args.max_pairs) == (5, 16, 4) == tuple(
        settings["resident"][k] for k in ("window_steps", "quads_per_pair", "max_pairs"))
    assert args.max_launches == settings["max_launches"] and args.launch_statistic == settings["launch_statistic"]
    fault = settings["sides"]["B"]["workload_options"].get("fault")
    assert args.b_option == ([f"fault={fault}"] if fault else []) and args.a_option == []
    # both sides were one interpreter, with PYTHONSAFEPATH=1 as every side has it: no flag says so
    assert args.a_python is args.b_python is None and args.a_env == args.b_env == []
    assert args.option == [] and args.gpus is None and args.a_ref is args.b_ref is None


def test_the_two_core_records_repro_line_is_its_cell_at_its_tolerance():
    (line,) = repro_lines(pr_comment.ab_comment(cpu_session("unchanged")))
    assert line == "perfsuite ab smoke/image/ddp-ds/c1/fp32/px32/nopin/nchw --tolerance 0.02"
    (slow,) = repro_lines(pr_comment.ab_comment(cpu_session("slow10")))
    assert parsed(slow).b_option == ["fault=slow:*:0:0.1"]


def test_sides_from_git_refs_their_env_and_the_launch_options_come_back_exactly():
    data = h100("ab-slow2.json")
    sides, launch = data["settings"]["sides"], data["settings"]["launch"]
    sides["A"].update(ref="origin/main", commit="a" * 40, python="/w/sides/a/venv/bin/python")
    sides["B"].update(ref="HEAD", commit="b" * 40, python="/w/sides/b/venv/bin/python",
                      env={"PYTHONSAFEPATH": "1", "NCCL_ALGO": "Ring"}, workload_options={})
    launch.update(gpus=[0, 1], options={"llm_checkpoint_dir": "/models/x y"}, timeout_s=900.0,
                  rank_start="exec", profiler="off")
    data["settings"].update(mode="resident", max_launches=16, attribute="always")
    data["settings"]["resident"]["quads_per_pair"] = 32
    (line,) = repro_lines(pr_comment.ab_comment(data))
    args = parsed(line)
    assert (args.a_ref, args.b_ref) == ("a" * 40, "b" * 40)  # the commits measured, not the names
    assert args.b_env == ["NCCL_ALGO=Ring"] and args.a_env == [] and args.b_option == []
    assert args.gpus == "0,1" and args.option == ["llm_checkpoint_dir=/models/x y"] and args.timeout == 900
    assert (args.rank_start, args.profiler, args.mode, args.max_launches, args.quads) == (
        "exec", "off", "resident", 16, 32)
    assert args.attribute == "always"


def test_two_interpreters_are_named_on_the_line():
    data = h100("ab-unchanged-1.json")
    data["settings"]["sides"]["B"]["python"] = "/opt/candidate/bin/python"
    args = parsed(repro_lines(pr_comment.ab_comment(data))[0])
    assert (args.a_python, args.b_python) == ("/opt/torch/.venv/bin/python3", "/opt/candidate/bin/python")


# ------------------------------------------------- attribution, error rates
def attribution() -> dict:
    from perfsuite.profiling.attribution import Attribution, AttributionRow, LevelShare

    rows_ = [AttributionRow("kernel", "sm90_xmma_gemm", 0.0100, 0.0130, 4, 4, "changed", 0.75, 0.0001),
             AttributionRow("operator", "aten::copy_", 0.0020, 0.0025, 2, 3, "changed", 0.125, 0.0001)]
    levels = {"kernel": LevelShare("kernel", 0.75, rows_[:1]), "operator": LevelShare("operator", 0.125, rows_[1:])}
    return Attribution(0.138, 0.142, 0.004, 0.0005, levels, (20, 20), (1, 1)).to_dict()


def test_a_cell_with_attribution_shows_its_top_rows_in_the_table_and_folded_below():
    data = h100("ab-slow2.json")
    data["cells"][0]["attribution"] = attribution()
    text = pr_comment.ab_comment(data)
    (row,) = rows(text, HEADER)
    assert row[5] == "kernel `sm90_xmma_gemm` +3.00 ms (75 %); operator `aten::copy_` +0.50 ms (12 %)"
    folded = text.split("<details><summary>gate/image/ddp-ds/g1/fp32/px500/pin/nchw: where the step-time "
                        "change went</summary>", 1)[1].split("</details>", 1)[0]
    assert "sm90_xmma_gemm" in folded and "aten::copy_" in folded and "+3.00 ms" in folded
    data["cells"][0]["attribution"] = {"error": "torch.profiler failed on side B"}
    (row,) = rows(pr_comment.ab_comment(data), HEADER)
    assert row[5] == "not attributed: torch.profiler failed on side B"


def test_an_attribution_with_no_row_above_the_noise_is_a_sentence_not_an_empty_table():
    data = h100("ab-slow2.json")
    empty = attribution()
    empty["levels"] = {name: {**level, "rows": []} for name, level in empty["levels"].items()}
    empty["top"] = []
    older = {"change_s": 0.004, "noise_s": 0.0005, "rows": []}  # a record of another version: no levels
    for found in (empty, older):
        data["cells"][0]["attribution"] = found
        text = pr_comment.ab_comment(data)
        assert rows(text, HEADER)[0][5] == "no row above the noise"
        folded = text.split("where the step-time change went</summary>", 1)[1].split("</details>", 1)[0]
        assert "No row changed by more than the noise" in folded and "| level |" not in folded


def error_rates_file(tmp_path: Path) -> Path:
    path = tmp_path / "error-rates.json"
    path.write_text(json.dumps({"schema": "perfsuite.error-rates/1", "host": {"gpu": "NVIDIA H100 80GB HBM3"},
                                "cells": {"gate/image/ddp-ds/g1/fp32/px500/pin/nchw": {
                                    "sessions": 40, "false_calls": 1, "same": 37, "detectable": 0.012,
                                    "detectable_spread": [0.008, 0.02], "minutes_per_verdict": 2.4,
                                    "injected": {"fraction": 0.02, "sessions": 10, "regressed": 10}}}}))
    return path


def test_published_error_rates_are_shown_beside_the_cell_when_given(tmp_path):
    rates = load_error_rates(error_rates_file(tmp_path))
    text = pr_comment.ab_comment(h100("ab-slow2.json"), error_rates=rates)
    (row,) = rows(text, HEADER + " | this runner's error rates")
    assert row[6] == "1/40 false calls; detects 1.2 %; 2.4 min a verdict"
    assert "Measured on NVIDIA H100 80GB HBM3." in text
    data = cpu_session("unchanged")  # a cell the file does not hold
    assert rows(pr_comment.ab_comment(data, error_rates=rates), HEADER)[0][6] == "–"
    assert "this runner's error rates" not in pr_comment.ab_comment(data)


def test_the_artifacts_link_ends_the_comment():
    text = pr_comment.ab_comment(h100("ab-slow2.json"), artifacts_url="https://example.org/a/1")
    assert text.rstrip().endswith("Artifacts (ab.json, the reports, every launch): https://example.org/a/1")


def test_an_accepted_regression_says_so_and_why():
    data = h100("ab-slow2.json")
    data["cells"][0]["accepted"] = {"within": True, "line": "accepted on purpose: 1.04 within 1.05 (new loss)"}
    (row,) = rows(pr_comment.ab_comment(data), HEADER)
    assert row[1] == "✅ regressed, accepted on purpose"
    assert "- `gate/image/ddp-ds/g1/fp32/px500/pin/nchw`: accepted on purpose: 1.04 within 1.05" in (
        pr_comment.ab_comment(data))


# ------------------------------------------------------------ the gate tier
def test_the_gates_report_has_the_same_table_for_its_step_time_checks():
    run = json.loads((H100 / "gate-px500-g1.results.json").read_text())
    text = summary_markdown(run, "gate")
    table = rows(text, "cell | verdict | ratio / baseline | interval | detectable")
    checks = [(c, k) for c in run["cells"] for k in c["checks"] if k["name"] == "step_time"]
    assert len(table) == len(checks) == 3
    for row, (cell, check) in zip(table, checks):
        low, high = check["ci_low"], check["ci_high"]
        assert row[0] == f"`{cell['id']}`" and row[1].endswith(check["verdict"])
        assert row[2] == f"{check['ratio']:.4g}" and row[3] == f"{low:.4g}–{high:.4g} (95 %)"
        assert row[4] == f"{(math.sqrt(high / low) - 1) * 100:.2f} %"
    lines = repro_lines(text)
    assert [parsed(line, "run").ids for line in lines] == [[c["id"]] for c, _ in checks]


def test_a_gate_runs_repro_keeps_its_workload_options_and_repeats():
    cell = {"id": "gate/x", "repeats": 4, "argv": ["python", "-m", "perfsuite.rank.worker", "--option", "a=1",
                                                   "--option", "count_steps=0", "--data-dir", "/data"]}
    args = parsed(pr_comment.run_repro(cell), "run")
    assert args.ids == ["gate/x"] and args.option == ["a=1"] and args.data_dir == "/data" and args.repeats == 4


# ---------------------------------------------------------------- commands
def h100_ab_folder(tmp_path: Path) -> Path:
    """A finished A/B folder: the H100 session of the "2 %" fault."""
    folder = tmp_path / "ab"
    folder.mkdir()
    shutil.copy(H100 / "ab-slow2.json", folder / "ab.json")
    return folder


def test_report_of_an_ab_folder_appends_its_comment(tmp_path, capsys):
    folder = h100_ab_folder(tmp_path)
    summary = tmp_path / "summary.md"
    summary.write_text("an earlier step's line\n")
    rates = error_rates_file(tmp_path)
    assert cli_main(["report", str(folder), "--summary-md", str(summary), "--error-rates", str(rates),
                     "--artifacts-url", "https://example.org/a/2"]) == 0
    text = summary.read_text()
    assert text.startswith("an earlier step's line\n" + pr_comment.AB_MARKER + "\n")
    assert "https://example.org/a/2" in text and "1/40 false calls" in text
    assert (folder / "ab.html").exists()
    capsys.readouterr()
    assert cli_main(["report", str(folder / "ab.json"), "--summary-md", "-"]) == 0
    assert capsys.readouterr().out.count(pr_comment.AB_MARKER) == 1


def test_report_refuses_a_bad_error_rates_file_before_writing(tmp_path, capsys):
    folder = h100_ab_folder(tmp_path)
    bad = tmp_path / "rates.json"
    bad.write_text("{}")
    assert cli_main(["report", str(folder), "--summary-md", "-", "--error-rates", str(bad)]) == 2
    said = capsys.readouterr().err
    assert f"perfsuite report: --error-rates {bad} is not an error-rates file" in said
    assert not (folder / "ab.html").exists()


def test_ab_takes_the_same_summary_options():
    args = build_parser().parse_args(["ab", "smoke", "--summary-md", "-", "--artifacts-url", "u"])
    assert (args.summary_md, args.artifacts_url, args.error_rates) == ("-", "u", None)


def test_an_interrupted_session_says_so():
    data = copy.deepcopy(h100("ab-unchanged-2.json"))
    data["interrupted"] = True
    assert "(interrupted: what was measured until then)" in pr_comment.ab_comment(data)
