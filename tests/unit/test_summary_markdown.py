"""`perfsuite report RUN --summary-md PATH`: a run's verdicts in Markdown for a
CI job's summary page ($GITHUB_STEP_SUMMARY), read from the H100 gate runs."""

import copy
import shutil
from pathlib import Path

from perfsuite.cli import main as cli
from perfsuite.report import markdown
from perfsuite.schemas.results import load

DATA = Path(__file__).resolve().parents[1] / "data" / "h100-2026-11-25"


def run(name: str) -> dict:
    return load(DATA / f"{name}.results.json")


def rows(text: str, header_start: str) -> list[list[str]]:
    """The rows of the table whose header starts so, split into their cells."""
    lines = text.splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith(f"| {header_start}"))
    body = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        body.append([cell.strip() for cell in line.strip("|").replace("\\|", "\0").split("|")])
    return body


def test_failed_cells_are_named_first_and_every_cell_is_listed():
    gate = run("gate-llm-g1")
    text = markdown.summary_markdown(gate, ".perfsuite/gate")
    failed = [c["id"] for c in gate["cells"] if c["status"] not in ("ok", "skipped")]
    assert failed  # this run has cells that failed in their ranks
    assert text.index("Something failed or regressed") < text.index("### Cells that did not run")
    assert [row[0] for row in rows(text, "cell | status | reason")] == failed
    listed = rows(text, "cell | status | step time")
    assert [row[0] for row in listed] == [c["id"] for c in gate["cells"]]
    assert {row[1] for row in listed} == {c["status"] for c in gate["cells"]}
    skipped = sum(k["verdict"] == "skipped" for c in gate["cells"] for k in c["checks"])
    assert f"{skipped} skipped" in text  # a comparison not made is said, not hidden


def test_a_regressed_check_is_listed_with_its_ratio_and_the_headline_says_so():
    gate = copy.deepcopy(run("gate-image-g1"))
    cell = gate["cells"][0]
    check = next(k for k in cell["checks"] if k["verdict"] == "pass")
    check.update(verdict="regressed", ratio=1.31, ci_low=1.2, ci_high=1.45, confidence=0.95,
                 message="slower | than <b>baseline</b>\nsecond line")
    text = markdown.summary_markdown(gate, "gate")
    (row,) = rows(text, "cell | check | verdict")
    assert row[:3] == [cell["id"], check["name"], "REGRESSED"]
    assert "1.31" in row[5] and "1.2" in row[5] and "1.45" in row[5]
    # the message stays in its cell of one row, its markup shown as text
    assert row[6] == "slower \0 than &lt;b&gt;baseline&lt;/b&gt; second line"
    assert "Something failed or regressed" in text


def test_a_clean_run_reads_clean():
    gate = copy.deepcopy(run("gate-image-g1"))
    for cell in gate["cells"]:
        cell["checks"] = [k for k in cell["checks"] if k["verdict"] != "skipped"]
    text = markdown.summary_markdown(gate, "gate")
    assert text.splitlines()[2].startswith("✅") and "none of the" in text
    assert "### Checks that failed" not in text and "### Cells that did not run" not in text


def test_long_runs_are_capped(monkeypatch):
    monkeypatch.setattr(markdown, "MAX_ROWS", 3)
    gate = run("gate-image-g1")
    text = markdown.summary_markdown(gate, "gate")
    assert len(rows(text, "cell | status | step time")) == 3
    assert f"{len(gate['cells']) - 3} more cells: see report.html" in text


def test_the_report_command_appends_the_summary(tmp_path, capsys):
    folder = tmp_path / "gate"
    folder.mkdir()
    shutil.copy(DATA / "gate-llm-g1.results.json", folder / "results.json")
    summary = tmp_path / "step_summary.md"
    summary.write_text("an earlier step's line\n")
    assert cli.main(["report", str(folder), "--summary-md", str(summary)]) == 0
    assert (folder / "report.html").exists()
    text = summary.read_text()
    assert text.startswith("an earlier step's line\n## perfsuite: ")
    assert f"summary: {summary}" in capsys.readouterr().out
    assert cli.main(["report", str(folder), "--summary-md", "-"]) == 0
    assert "### Cells that did not run" in capsys.readouterr().out


def test_a_missing_run_is_a_usage_error(tmp_path):
    assert cli.main(["report", str(tmp_path / "none"), "--summary-md", str(tmp_path / "s.md")]) == 2
    assert not (tmp_path / "s.md").exists()

