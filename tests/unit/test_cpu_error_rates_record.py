"""The 2-core VM's error rates of `perfsuite ab`, measured by `perfsuite
selftest error-rates` (tests/data/cpu-2026-11-28/error-rates*/README.md):
the stored files are the ones measured, the figures are those the sessions
give, every session judged again by the looks it ran under gives its
verdict, and the README and the top-level README state the figures.

Two records: ``error-rates`` (40 A/A sessions, a look after each of pairs
2-4) and ``error-rates-balanced`` (20, a look after pairs 2 and 4 only:
``perfsuite.ab.verdicts.look_pairs``)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from perfsuite.ab.session import DECIDED
from perfsuite.selftest import error_rates as rates
from tests.unit.conftest import judge_at_looks

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "cpu-2026-11-28"
CELL = "smoke/image/ddp-ds/c1/fp32/px32/nopin/nchw"
# each record's folder: its A/A sessions, and the looks its sessions took
RECORDS = {"error-rates": (40, [2, 3, 4]), "error-rates-balanced": (20, [2, 4])}


@pytest.fixture(params=sorted(RECORDS))
def here(request) -> Path:
    return DATA / request.param


def record(here: Path) -> dict:
    return json.loads((here / "error-rates.json").read_text())


def test_the_stored_files_are_those_measured(here):
    for line in (here / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split()
        assert hashlib.sha256((here / name).read_bytes()).hexdigest() == digest, name


def test_its_figures_are_what_its_sessions_give(here):
    data = record(here)
    sessions = data["per_session"]
    assert data["cells"][CELL] == rates.cell_figures(sessions, data["settings"]["fraction"])
    figures = data["cells"][CELL]
    assert figures["sessions"] == RECORDS[here.name][0] == sum(s["kind"] == "aa" for s in sessions)
    assert all(s["verdict"] in rates.VERDICTS for s in sessions)
    assert sorted((s["kind"], s["index"]) for s in sessions) == sorted(
        {(s["kind"], s["index"]) for s in sessions})  # no session counted twice
    assert data["settings"]["tolerance"] == 0.02 and data["host"]["cores"] == 2


def test_the_figures_printed_are_those_the_readmes_state(here):
    data = record(here)
    printed = "\n".join(rates.figure_lines(data))
    assert printed in (here / "README.md").read_text()
    f = data["cells"][CELL]
    low, high = f["detectable_spread"]
    stated = (f"{f['false_calls']} false calls, {f['same']} `same`, a smallest detectable change of "
              f"{100 * f['detectable']:.2f} % (median; {100 * low:.2f}-{100 * high:.2f} %)")
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert stated in readme


def test_every_session_judged_again_by_its_looks_gives_its_verdict(here):
    """sessions.json keeps each launch pair's ABBA quad log-ratios: the looks
    of the rule the sessions ran under (``recorded_looks``; a record from
    before ``looks`` were kept looked after every pair from the second)
    stop at the first decided one, as ab did, and give the verdict and
    interval recorded."""
    compact = json.loads((here / "sessions.json").read_text())
    settings = compact["settings"]
    resident = {**settings["resident"], **({"looks": settings["looks"]} if "looks" in settings else {})}
    taken = RECORDS[here.name][1]
    kept = {(s["kind"], s["index"]): s for s in record(here)["per_session"]}
    assert {(s["kind"], s["index"]) for s in compact["sessions"]} == set(kept)
    for session in compact["sessions"]:
        quads = [p["quad_log_ratios"] for p in session["pairs"]]
        firsts = [p["first"] for p in session["pairs"]]
        where = (session["kind"], session["index"])
        assert firsts == ["A", "B", "A", "B"][:len(quads)] and all(len(q) == 16 for q in quads), where
        assert (session["fault"] is None) == (session["kind"] == "aa"), where
        looks = judge_at_looks(quads, firsts, settings["tolerance"], resident)
        assert len(looks) == sum(k <= len(quads) for k in taken) and len(quads) in taken, where
        assert looks[-1].confidence == pytest.approx(session["confidence"]), where
        assert all(look.verdict not in DECIDED for look in looks[:-1]), where
        last = looks[-1]
        assert last.verdict == session["verdict"] == kept[where]["verdict"], where
        assert last.verdict in DECIDED or len(quads) == settings["resident"]["max_pairs"], where
        assert (last.ratio, last.ci_low, last.ci_high) == pytest.approx(
            (session["ratio"], session["ci_low"], session["ci_high"]), rel=1e-9), where


def test_judged_again_with_the_pairs_scatter_pooled_the_sessions_give_what_the_explanation_says():
    """Stored under each pair's own scatter (no ``within``), judged again by
    today's pooled rule: one false call fewer, one `same` fewer a record
    (docs/explanation/ab.md, "A pair's error")."""
    said = {"error-rates": (2, 1, 19, 18, 3), "error-rates-balanced": (0, 0, 11, 10, 4)}
    page = " ".join((ROOT / "docs" / "explanation" / "ab.md").read_text().split())
    for name, (wrong_own, wrong_pooled, same_own, same_pooled, caught) in said.items():
        compact = json.loads((DATA / name / "sessions.json").read_text())
        settings = compact["settings"]
        assert "within" not in settings
        counts = {}
        for within in ("per-pair", "pooled"):
            resident = {**settings["resident"], **({"looks": settings["looks"]} if "looks" in settings else {}),
                        "within": within}
            verdicts = []
            for s in compact["sessions"]:
                looks = judge_at_looks([p["quad_log_ratios"] for p in s["pairs"]], [p["first"] for p in s["pairs"]],
                                       settings["tolerance"], resident)
                verdicts.append((s["kind"], next((k.verdict for k in looks if k.verdict in DECIDED),
                                                 looks[-1].verdict)))
            counts[within] = (sum(k == "aa" and v in ("regressed", "improved") for k, v in verdicts),
                              sum(k == "aa" and v == "same" for k, v in verdicts),
                              sum(k == "injected" and v == "regressed" for k, v in verdicts))
        assert counts == {"per-pair": (wrong_own, same_own, caught), "pooled": (wrong_pooled, same_pooled, caught)}
    assert ("unchanged called a change 2 -> 1 of 40 and 0 -> 0 of 20, `same` 19 -> 18 and 11 -> 10; 5 % slower "
            "`regressed` 3 of 4 and 4 of 4, as before") in page
