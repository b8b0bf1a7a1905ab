"""The 2-core VM's detection and launch-cost benchmarks of two checkouts,
back to back (tests/data/cpu-2026-11-28/before-after/README.md): the
figures its tables state are those the stored output printed."""

import re
import statistics
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1] / "data" / "cpu-2026-11-28" / "before-after"
SESSION = re.compile(r"^trial \d+/\d+ (unchanged|slow 10%|slow 5%)\s+-> (\w+) \(ratio [\d.]+, [\d.]+-[\d.]+, "
                     r"resident, (\d) vs \d launches, (\d+) s\)$")
COST = re.compile(r"^(old|new): (fork|exec): median before training ([\d.]+) s|^(old|new): the zygote's start "
                  r"\(first forked launch\): before training ([\d.]+) s")


def sessions(name: str) -> list[tuple[str, str, int, int]]:
    lines = (HERE / f"detection-{name}.txt").read_text().splitlines()
    return [(m[1], m[2], int(m[3]), int(m[4])) for line in lines if (m := SESSION.match(line))]


@pytest.mark.parametrize("name, unchanged, walls", [
    ("66c9dd0", ["same", "same", "unknown"], {"unchanged": 64, "slow 10%": 69, "slow 5%": 67}),
    ("a795147", ["same", "same", "same"], {"unchanged": 96, "slow 10%": 72, "slow 5%": 68}),
])
def test_each_checkouts_nine_sessions_are_what_the_table_states(name, unchanged, walls):
    found = sessions(name)
    assert len(found) == 9
    by = {c: [s for s in found if s[0] == c] for c in walls}
    assert sorted(s[1] for s in by["unchanged"]) == sorted(unchanged)
    assert [s[1] for s in by["slow 10%"] + by["slow 5%"]] == ["regressed"] * 6
    assert {c: round(statistics.median(s[3] for s in v)) for c, v in by.items()} == walls
    assert statistics.median(s[2] for s in found) == 2  # launch pairs a session


def test_the_launch_costs_are_what_the_table_states():
    text = (HERE / "launch-cost-66c9dd0.txt").read_text().splitlines()
    first_old = [f"old: {line}" for line in text if "before training" in line]
    lines = first_old + (HERE / "launch-cost-pairs.txt").read_text().splitlines()
    got: dict[tuple[str, str], list[float]] = {}
    for line in lines:
        if m := COST.match(line):
            key = (m[1], m[2]) if m[1] else (m[4], "zygote")
            got.setdefault(key, []).append(float(m[3] or m[5]))
    assert got == {("old", "fork"): [0.36, 0.28], ("old", "exec"): [2.52, 2.57], ("old", "zygote"): [2.10, 2.07],
                   ("new", "fork"): [0.40, 0.26], ("new", "exec"): [2.42, 2.41], ("new", "zygote"): [1.97, 2.18]}
