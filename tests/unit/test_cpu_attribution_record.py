"""The 2-core attribution benchmark's record (tests/data/cpu-2026-11-28/attribution/):
the figures its README states are those of the stored output."""

import json
import re
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parents[1] / "data" / "cpu-2026-11-28" / "attribution"


def test_the_printed_figures_are_the_readmes():
    text = (HERE / "selftest-attribution-10.txt").read_text()
    found = dict(re.findall(r"^([a-z-]+): top row names the injected place (\d+/10)", text, re.M))
    assert found == {"conv-spin": "10/10", "allreduce": "7/10", "copy": "0/10", "slow-linear": "10/10"}
    assert "unchanged: sessions with a row above the noise 0/10" in text
    assert "profiling adds 66 % to a launch's wall time" in text


def test_diffed_again_with_call_counts_every_fault_is_named_and_nothing_unchanged_is_listed():
    sessions = json.loads((HERE / "diffed-again.json").read_text())["sessions"]
    by = {}
    for s in sessions:
        by.setdefault(s["fault"], []).append(s)
    assert all(len(v) == 10 for v in by.values())
    for fault in ("conv-spin", "allreduce", "copy", "slow-linear"):
        assert all(s["hit"] for s in by[fault]), fault
    assert all(s["rows"] == 0 for s in by["unchanged"])
    assert all(s["top"]["calls_changed"] and s["top"]["calls"][1] - s["top"]["calls"][0] == 158 for s in by["copy"])
    assert statistics.median(s["explained"] for s in by["copy"]) < 0  # its time change is noise
