"""Confirm before alerting: ``perfsuite history changes --confirm`` measures a
regression at a series' head again by an A/B of its first bad commit against
its last good one (perfsuite.ab.confirm); only a confirmed one is reported.
The A/B sessions are simulated: ``measure`` returns ab's record, or (the last
tests) ab's own session runs on fake launches and sides."""

import json
import sys

import pytest

from perfsuite.ab import confirm
from perfsuite.ab import session as ab
from perfsuite.cli import main as cli
from perfsuite.hardware import profile_id
from perfsuite.history.changes import find_changes
from perfsuite.history.store import History
from tests.unit.test_ab import fake_launches
from tests.unit.test_history import CELLS, ENV, build_series, sha, url_of

GOOD, BAD = sha(11), sha(12)
HEAD = f"{CELLS[0]} step_time [{profile_id(ENV)}] {GOOD[:12]}..{BAD[:12]}"


def record(verdict, ratio=1.1):
    return {"id": CELLS[0], "verdict": verdict, "reason": "undecided at the cap" if verdict == "unknown" else None,
            "ratio": ratio, "ci_low": ratio - 0.02, "ci_high": ratio + 0.02, "confidence": 0.99, "n_a": 6, "n_b": 6,
            "checks": []}


@pytest.fixture
def regressed_history(tmp_path):
    url = url_of(tmp_path)
    build_series(tmp_path, url, [0.1] * 12 + [0.11] * 12)  # regressed at head since sha(12)
    return url


@pytest.fixture
def simulated(monkeypatch):
    """ab's verdict per call, the changes it was asked about, and the bisections run."""
    calls = {"measured": [], "bisected": [], "verdict": "regressed", "between": 0}

    def measure(change, out_dir, settings):
        calls["measured"].append((change.last_good.commit, change.first_bad.commit, out_dir, settings.repo))
        return record(calls["verdict"]), str(out_dir / "ab.json")

    def bisect_range(change, out_dir, settings):
        calls["bisected"].append((change.last_good.commit, change.first_bad.commit))
        return {"outcome": "found", "reason": None, "first_bad": {"commit": "f" * 40, "subject": "slower loader"}}

    monkeypatch.setattr(confirm, "measure", measure)
    monkeypatch.setattr(confirm, "bisect_range", bisect_range)
    monkeypatch.setattr(confirm, "commits_between", lambda repo, good, bad: calls["between"])
    return calls


def changes(url, tmp_path, *more):
    return cli.main(["history", "changes", "--url", url, "--confirm", "--repo", str(tmp_path),
                     "--out", str(tmp_path / "confirm"), *more])


def test_a_confirmed_change_point_is_reported_and_exits_1(regressed_history, simulated, tmp_path, capsys):
    assert changes(regressed_history, tmp_path) == 1
    out = capsys.readouterr().out
    [(good, bad, out_dir, repo)] = simulated["measured"]
    assert (good, bad, repo) == (GOOD, BAD, tmp_path.resolve())
    assert out_dir.parent == (tmp_path / "confirm").resolve()
    assert f"to confirm, regressed at head: {CELLS[0]}" in out and "REGRESSED at head" not in out
    assert f"CONFIRMED  {HEAD}: ab says {CELLS[0]}  REGRESSED  ratio 1.1 (99 % CI 1.08-1.12)" in out
    assert "(reported)" in out and "measured again by A/B: 1 confirmed, 0 not confirmed, 0 undecided" in out


def test_a_change_point_ab_calls_the_same_is_listed_as_not_confirmed_and_exits_0(
        regressed_history, simulated, tmp_path, capsys):
    simulated["verdict"] = "same"
    assert changes(regressed_history, tmp_path) == 0
    out = capsys.readouterr().out
    assert f"NOT CONFIRMED  {HEAD}: ab says {CELLS[0]}  SAME" in out and "(not reported)" in out
    assert "0 confirmed, 1 not confirmed, 0 undecided" in out


def test_an_undecided_change_point_says_so_and_exits_3(regressed_history, simulated, tmp_path, capsys):
    simulated["verdict"] = "unknown"
    assert changes(regressed_history, tmp_path) == 3
    out = capsys.readouterr().out
    assert f"UNDECIDED  {HEAD}: ab says {CELLS[0]}  UNKNOWN" in out and "(neither confirmed nor cleared)" in out
    assert "0 confirmed, 0 not confirmed, 1 undecided" in out


@pytest.mark.parametrize(("between", "bisect", "bisected"), [(3, True, True), (3, False, False), (0, True, False)])
def test_a_confirmed_change_is_bisected_only_with_bisect_and_commits_between(
        regressed_history, simulated, tmp_path, capsys, between, bisect, bisected):
    simulated["between"] = between
    assert changes(regressed_history, tmp_path, *(["--bisect"] if bisect else [])) == 1
    out = capsys.readouterr().out
    assert simulated["bisected"] == ([(GOOD, BAD)] if bisected else [])
    assert ("bisect: first bad commit ffffffffffff slower loader" in out) == bisected
    assert ("3 commit(s) between them: --bisect names the first bad one" in out) == (between and not bisect)


def test_a_change_point_not_confirmed_is_never_bisected(regressed_history, simulated, tmp_path, capsys):
    simulated.update(verdict="same", between=3)
    assert changes(regressed_history, tmp_path, "--bisect") == 0
    assert simulated["bisected"] == []


def test_bisect_without_confirm_is_a_usage_error(regressed_history, simulated, capsys):
    assert cli.main(["history", "changes", "--url", regressed_history, "--bisect"]) == 2
    assert "--bisect bisects the confirmed change points: give --confirm too" in capsys.readouterr().err
    assert simulated["measured"] == []


def test_nothing_is_measured_where_no_series_regressed_at_its_head(tmp_path, simulated, capsys):
    url = url_of(tmp_path)
    build_series(tmp_path, url, [0.1] * 12)
    assert changes(url, tmp_path) == 0
    assert "nothing to measure again" in capsys.readouterr().out and simulated["measured"] == []


def test_the_json_document_holds_each_confirmation(regressed_history, simulated, tmp_path, capsys):
    assert changes(regressed_history, tmp_path, "--json") == 1
    report = json.loads(capsys.readouterr().out)
    [found] = report["confirmed"]
    assert found["first_bad"]["commit"] == BAD and found["confirmation"]["outcome"] == "confirmed"
    assert found["confirmation"]["verdict"] == "regressed" and found["confirmation"]["ab_json"].endswith("ab.json")


# ab's own session on both commits: fake sides (no worktree) and fake launches

@pytest.fixture
def fake_sides(monkeypatch):
    made, forgotten = [], []

    def checkout_side(name, ref, repo, side_dir, env=None, flag=None):
        made.append((name, ref, flag))
        if ref == "missing":
            raise ab.ABError(f"{flag} {ref}: finding the commit in {repo}")
        slow = {"FAKE_SLOW": "0.1"} if name == "B" else {}
        return ab.Side(name, sys.executable, slow, ref=ref, commit=ref)

    monkeypatch.setattr(ab, "checkout_side", checkout_side)
    monkeypatch.setattr(confirm, "_forget_worktree", lambda repo, side_dir: forgotten.append(side_dir.name))
    return made, forgotten


def test_measure_runs_an_ab_session_of_the_first_bad_commit_against_the_last_good(
        regressed_history, fake_sides, monkeypatch, tmp_path, capsys):
    fake_launches(monkeypatch, launch_sigma=0.02)
    monkeypatch.setattr("perfsuite.ab.session.resident_refusal", lambda cell, launch: "launch rounds here")
    assert changes(regressed_history, tmp_path) == 1
    made, forgotten = fake_sides
    assert made == [("A", GOOD, "last good"), ("B", BAD, "first bad")] and forgotten == ["a", "b"]
    [session] = (tmp_path / "confirm").resolve().glob("*/ab.json")
    data = json.loads(session.read_text())
    assert data["settings"]["sides"]["A"]["commit"] == GOOD and data["cells"][0]["verdict"] == "regressed"
    assert f"CONFIRMED  {HEAD}" in capsys.readouterr().out


def test_a_commit_the_repository_lacks_leaves_the_change_undecided(regressed_history, fake_sides, tmp_path):
    with History(regressed_history, create=False) as store:
        [points] = store.series(cell=CELLS[0]).values()
    [change] = find_changes(points, cell=CELLS[0])
    change.last_good.commit = "missing"
    settings = confirm.Settings(repo=tmp_path, out=tmp_path / "confirm", log=lambda line: None)
    [found] = confirm.confirm_changes([change], settings)
    assert found.outcome == confirm.UNDECIDED and found.verdict == "not run"
    assert "no A/B: last good missing: finding the commit in" in found.line
    assert confirm.exit_code([found]) == 3
