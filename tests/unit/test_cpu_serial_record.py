"""The 2-core VM's A/B windows and the regimes they meet
(tests/data/cpu-2026-11-28/serial/README.md): the stored files are those
measured, each session's serial diagnostic is what its README says, and the
explanation page states it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "tests" / "data" / "cpu-2026-11-28" / "serial"


def test_the_stored_files_are_those_measured():
    for line in (HERE / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split()
        assert hashlib.sha256((HERE / name).read_bytes()).hexdigest() == digest, name


def test_the_windows_met_the_machines_regimes_as_the_readme_and_the_explanation_say():
    record = json.loads((HERE / "ab-detection.json").read_text())
    assert record["within"] == "pooled"
    (trial,) = record["trials"]
    seen = {name: judged["serial"] for name, judged in trial["conditions"].items()}
    assert {name: judged["verdict"] for name, judged in trial["conditions"].items()} == {
        "unchanged": "same", "slow 10%": "regressed"}
    readme = " ".join((HERE / "README.md").read_text().split())
    page = " ".join((ROOT / "docs" / "explanation" / "ab.md").read_text().split())
    for name, words in (("unchanged", "Unchanged: {s:.2f} same side, {a:.2f} across"),
                        ("slow 10%", "10 % slower: {s:.2f} and {a:.2f}")):
        said = words.format(s=seen[name]["same_side"], a=seen[name]["across_sides"])
        assert said in readme
        # both well above zero and alike: the machine's state, which a quad cancels
        assert seen[name]["same_side"] > 0.3 and abs(seen[name]["same_side"] - seen[name]["across_sides"]) < 0.1
    assert (f"same side {seen['unchanged']['same_side']:.2f} / across {seen['unchanged']['across_sides']:.2f}"
            in page)
