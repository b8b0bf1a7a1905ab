"""A runner's first baselines (perfsuite.judge.recording.record_missing):
what a judged cell had no baseline for is recorded and said so; where it
cannot be recorded, the checks say why and the measured result stands."""

import copy
import json
from pathlib import Path

from perfsuite.judge import baselines as bl
from perfsuite.judge.judging import unjudged
from perfsuite.judge.recording import lacks_time_baseline, record_missing

DAY = Path(__file__).resolve().parents[1] / "data" / "h100-2026-11-26"
CELL = json.loads((DAY / "gate-px500-g1.results.json").read_text())["cells"][0]


def unjudged_cell() -> dict:
    """The cell as a runner without a baseline judges it: step time and counters missing."""
    cell = copy.deepcopy(CELL)
    cell["checks"] = [
        {"name": "step_time", "verdict": "skipped", "metric": "step_time", "missing": "baseline",
         "message": "no comparable baseline for step_time on profile x"},
        {"name": "work_counters", "verdict": "skipped", "metric": "counters", "missing": "counters",
         "message": "no work counters recorded for these parameters"},
        {"name": "sanity.throughput", "verdict": "pass", "metric": "throughput"}]
    return cell


def test_what_was_missing_is_recorded_and_each_check_says_where(tmp_path):
    cell = unjudged_cell()
    assert lacks_time_baseline(cell) and len(unjudged(cell)) == 2
    folder = record_missing(cell, tmp_path)
    assert folder == tmp_path / "h100-80gb-hbm3-80gb-x1"
    recorded = [c for c in cell["checks"] if c.get("recorded")]
    assert [c["name"] for c in recorded] == ["step_time", "work_counters"]
    assert all("recorded into" in c["message"] for c in recorded) and not unjudged(cell)
    kept = bl.load_profile(folder)
    assert CELL["id"] + ":step_time" in set(kept.metrics["id"]) and [c.cell for c in kept.counters] == [CELL["id"]]


def test_only_the_counters_are_recorded_where_only_they_were_missing(tmp_path):
    cell = unjudged_cell()
    cell["checks"][0] = {"name": "step_time", "verdict": "same", "metric": "step_time"}
    assert not lacks_time_baseline(cell)
    kept = bl.load_profile(record_missing(cell, tmp_path))
    assert kept.metrics.empty and len(kept.counters) == 1


def test_a_folder_that_cannot_be_written_is_said_on_the_checks_and_the_result_stands(tmp_path):
    cell = unjudged_cell()
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    assert record_missing(cell, blocked) is None
    assert cell["status"] == "ok" and cell["metrics"] == CELL["metrics"]
    missing = [c for c in cell["checks"] if c.get("missing")]
    assert all("not recorded:" in c["message"] and not c.get("recorded") for c in missing)
    assert len(unjudged(cell)) == 2  # a run that must judge still fails there


def test_nothing_is_recorded_of_a_cell_that_did_not_finish(tmp_path):
    cell = {**unjudged_cell(), "status": "failed"}
    assert record_missing(cell, tmp_path) is None and not any(tmp_path.iterdir())
