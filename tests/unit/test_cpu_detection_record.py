"""The 2-core VM's detection benchmark of `perfsuite ab`, judged again.

`perfsuite selftest verdict-detection --ab --trials 20` ran on the 2-core
VM (tests/data/cpu-2026-11-26/README.md): per trial one resident A/B
session each with side B unchanged, 10 % slower and 5 % slower, at a 2 %
tolerance. Its record keeps every session's verdict and the ABBA quad
log-ratios of each launch pair. Judged again here by `ab`'s own rule (a look
after every pair from the second, at the looks' confidence) they give the
verdicts and intervals they gave, so the figures README and
docs/how-to/gate-a-change.md state are the record's and today's rule's.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from perfsuite.ab.session import DECIDED, MIN_PAIRS
from tests.unit.conftest import judge_at_looks

RECORD = Path(__file__).resolve().parents[1] / "data" / "cpu-2026-11-26" / "ab-detection-20.json"
CONDITIONS = ("unchanged", "slow10", "slow5")
# What README and docs/how-to/gate-a-change.md say of this record; the goals
# asked: unchanged same in >= 16/20 and regressed in <= 1/20, 10 % caught in
# >= 19/20, 5 % in >= 16/20, <= 3 minutes a session.
EXPECTED_COUNTS = {"unchanged": {"same": 16, "regressed": 0, "unknown": 4},
                   "slow10": {"same": 0, "regressed": 20, "unknown": 0},
                   "slow5": {"same": 0, "regressed": 20, "unknown": 0}}
EXPECTED_MEDIAN_WALL_S = {"unchanged": 146, "slow10": 115, "slow5": 116}
EXPECTED_MAX_WALL_S = 155


@pytest.fixture(scope="module")
def record() -> dict:
    return json.loads(RECORD.read_text())


def sessions_of(record: dict, condition: str) -> list[dict]:
    return [s for s in record["sessions"] if s["condition"] == condition]


def test_the_record_is_twenty_trials_of_the_benchmarks_defaults(record):
    settings = record["settings"]
    assert settings["tolerance"] == 0.02 and settings["order"] == "ABBA"
    assert settings["resident"]["window_steps"] == 5 and settings["resident"]["quads_per_pair"] == 16
    assert (settings["resident"]["min_pairs"], settings["resident"]["max_pairs"]) == (MIN_PAIRS, 4)
    assert record["env"]["cpu_cores"] == 2 and record["env"]["torch"].startswith("2.14.0")
    for condition in CONDITIONS:
        assert [s["trial"] for s in sessions_of(record, condition)] == list(range(1, 21))
        assert {s["cell"] for s in sessions_of(record, condition)} == {"smoke/image/ddp-ds/c1/fp32/px32/nopin/nchw"}


def test_every_session_judged_again_by_abs_looks_gives_its_verdict(record):
    judge_again(record)


def judge_again(record: dict) -> None:
    """The record's rule (``recorded_looks``): pair 2 and each later pair is a
    look; a session stops at its first decided look or after 4 pairs. Every
    look before a session's last was undecided, and its last gives the
    verdict and interval recorded."""
    tolerance = record["settings"]["tolerance"]
    resident = record["settings"]["resident"]
    assert "looks" not in resident and resident["look_confidence"] == pytest.approx(1 - 0.05 / 3)
    for session in record["sessions"]:
        quads = [p["quad_log_ratios"] for p in session["pairs"]]
        firsts = [p["first"] for p in session["pairs"]]
        assert firsts == ["A", "B", "A", "B"][:len(quads)], session["trial"]  # the lead alternates
        assert all(len(q) == 16 for q in quads)
        looks = judge_at_looks(quads, firsts, tolerance, resident)
        assert len(looks) == len(quads) - 1, session["trial"]
        where = (session["trial"], session["condition"])
        assert all(look.verdict not in DECIDED for look in looks[:-1]), where
        last = looks[-1]
        assert last.verdict == session["verdict"], where
        assert last.verdict in DECIDED or len(quads) == 4, where
        assert (last.ratio, last.ci_low, last.ci_high) == pytest.approx(
            (session["ratio"], session["ci_low"], session["ci_high"]), rel=1e-9), where


def test_the_figures_the_docs_state(record):
    """README and gate-a-change.md: the counts, and the wall time a session."""
    counts = {c: {v: [s["verdict"] for s in sessions_of(record, c)].count(v) for v in ("same", "regressed", "unknown")}
              for c in CONDITIONS}
    walls = {c: statistics.median(s["wall_s"] for s in sessions_of(record, c)) for c in CONDITIONS}
    assert counts == EXPECTED_COUNTS
    assert {c: round(w) for c, w in walls.items()} == EXPECTED_MEDIAN_WALL_S
    assert max(s["wall_s"] for s in record["sessions"]) < EXPECTED_MAX_WALL_S
    # The launch order (modelled from four pairs): pairs whose side A came up
    # first read lower than those whose B did in every such session.
    orders = [s["order_effect"] for s in record["sessions"] if len(s["pairs"]) == 4]
    assert len(orders) == 26 and max(orders) < 1.0
    assert statistics.median(orders) == pytest.approx(0.9767, abs=5e-5)
