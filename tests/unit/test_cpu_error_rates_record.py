"""The 2-core VM's error rates of `perfsuite ab`, measured by `perfsuite
selftest error-rates` (tests/data/cpu-2026-11-28/error-rates/README.md): the
stored file is the one measured, its figures are those its sessions give,
and the README and the top-level README state them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from perfsuite.ab.session import DECIDED
from perfsuite.selftest import error_rates as rates
from tests.unit.conftest import judge_at_looks

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "tests" / "data" / "cpu-2026-11-28" / "error-rates"
CELL = "smoke/image/ddp-ds/c1/fp32/px32/nopin/nchw"


def record() -> dict:
    return json.loads((HERE / "error-rates.json").read_text())


def test_the_stored_files_are_those_measured():
    for line in (HERE / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split()
        assert hashlib.sha256((HERE / name).read_bytes()).hexdigest() == digest, name


def test_its_figures_are_what_its_sessions_give_and_there_are_forty_a_a_sessions():
    data = record()
    sessions = data["per_session"]
    assert data["cells"][CELL] == rates.cell_figures(sessions, data["settings"]["fraction"])
    figures = data["cells"][CELL]
    assert figures["sessions"] == 40 == sum(s["kind"] == "aa" for s in sessions)
    assert all(s["verdict"] in rates.VERDICTS for s in sessions)
    assert sorted((s["kind"], s["index"]) for s in sessions) == sorted(
        {(s["kind"], s["index"]) for s in sessions})  # no session counted twice
    assert data["settings"]["tolerance"] == 0.02 and data["host"]["cores"] == 2


def test_the_figures_printed_are_those_the_readmes_state():
    data = record()
    printed = "\n".join(rates.figure_lines(data))
    assert printed in (HERE / "README.md").read_text()
    f = data["cells"][CELL]
    low, high = f["detectable_spread"]
    stated = (f"{f['false_calls']} false calls, {f['same']} `same`, a smallest detectable change of "
              f"{100 * f['detectable']:.2f} % (median; {100 * low:.2f}-{100 * high:.2f} %)")
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert stated in readme


def test_every_session_judged_again_by_abs_looks_gives_its_verdict():
    """sessions.json keeps each launch pair's ABBA quad log-ratios: the looks
    of the rule these sessions ran under (after every pair from the second,
    Bonferroni over them: ``recorded_looks``) stop at the first decided one,
    as ab did, and give the verdict and interval recorded."""
    compact = json.loads((HERE / "sessions.json").read_text())
    settings = compact["settings"]
    assert "looks" not in settings["resident"]  # measured before ab looked only where the orders weigh alike
    kept = {(s["kind"], s["index"]): s for s in record()["per_session"]}
    assert {(s["kind"], s["index"]) for s in compact["sessions"]} == set(kept)
    for session in compact["sessions"]:
        quads = [p["quad_log_ratios"] for p in session["pairs"]]
        firsts = [p["first"] for p in session["pairs"]]
        where = (session["kind"], session["index"])
        assert firsts == ["A", "B", "A", "B"][:len(quads)] and all(len(q) == 16 for q in quads), where
        assert (session["fault"] is None) == (session["kind"] == "aa"), where
        looks = judge_at_looks(quads, firsts, settings["tolerance"], settings["resident"])
        assert len(looks) == len(quads) - 1, where
        assert all(look.verdict not in DECIDED for look in looks[:-1]), where
        last = looks[-1]
        assert last.verdict == session["verdict"] == kept[where]["verdict"], where
        assert last.verdict in DECIDED or len(quads) == settings["resident"]["max_pairs"], where
        assert (last.ratio, last.ci_low, last.ci_high) == pytest.approx(
            (session["ratio"], session["ci_low"], session["ci_high"]), rel=1e-9), where
