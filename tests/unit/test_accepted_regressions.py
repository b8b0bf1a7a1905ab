"""Regressions accepted on purpose (perfsuite-accept.toml): the file's
validation, ``perfsuite ab`` passing an accepted change and failing one
beyond it, the gate's step-time check judged against the baseline times the
accepted ratio, and the history's level starting at the accepted commit."""

import math
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from perfsuite.ab import session as ab
from perfsuite.ab import verdicts
from perfsuite.cli import main as cli
from perfsuite.history.changes import find_changes
from perfsuite.history.store import History
from perfsuite.judge import accepted
from perfsuite.judge.checks import StepTimeNotRegressed
from perfsuite.judge.lookup import Expectation
from tests.unit.cellkit import tiny_image_cell
from tests.unit.test_ab import fake_launches
from tests.unit.test_history import CELLS, build_series, sha, url_of

CELL = tiny_image_cell(world_size=1)


def accept_file(tmp_path, monkeypatch, body, name="perfsuite-accept.toml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    monkeypatch.setenv(accepted.ENV_VAR, str(path))
    return path


def entry(cell="*", ratio=1.10, why="exact fp32 all-reduce", since="3f2c1a9e", **more):
    extra = "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in more.items())
    return f'[[accept]]\ncell = "{cell}"\nratio = {ratio}\nwhy = "{why}"\nsince = "{since}"\n{extra}'


# ------------------------------------------------------------------ the file

def test_a_well_formed_file_gives_its_entries_with_their_defaults(tmp_path, monkeypatch):
    path = accept_file(tmp_path, monkeypatch, entry("gate/image/*", 1.08) + entry("smoke/x", 0.9, since="#123",
                                                                                metric="throughput", tolerance=0.05))
    first, second = accepted.load()
    assert (first.cell, first.metric, first.ratio, first.tolerance, first.since) == (
        "gate/image/*", "step_time", 1.08, accepted.DEFAULT_TOLERANCE, "3f2c1a9e")
    assert first.file == str(path) and first.index == 1 and first.commit == "3f2c1a9e"
    assert second.metric == "throughput" and second.commit is None and second.index == 2
    assert first.line() == "accepted: +8 % (exact fp32 all-reduce; since 3f2c1a9e, perfsuite-accept.toml entry 1)"


@pytest.mark.parametrize(("second", "said"), [
    (entry(ratio='"x"'), "ratio must be a number above 0"),
    (entry(ratio=0), "ratio must be a number above 0"),
    (entry(why=""), "why is required"),
    (entry(since="main"), "since must be a commit"),
    (entry(tolerance=1.5), "tolerance must be a fraction"),
    (entry(color="red"), "unknown key 'color'"),
])
def test_a_malformed_entry_is_refused_naming_the_file_and_the_entry(tmp_path, monkeypatch, second, said):
    path = accept_file(tmp_path, monkeypatch, entry("gate/a") + second.replace('cell = "*"', 'cell = "gate/b"'))
    with pytest.raises(accepted.AcceptError) as err:
        accepted.load()
    assert str(err.value).startswith(f"{path}: entry 2 (cell gate/b): ") and said in str(err.value)


def test_a_file_that_is_not_toml_or_names_no_file_is_refused(tmp_path, monkeypatch):
    path = accept_file(tmp_path, monkeypatch, "[[accept]\n")
    with pytest.raises(accepted.AcceptError, match=f"{path}: not TOML"):
        accepted.load()
    monkeypatch.setenv(accepted.ENV_VAR, str(tmp_path / "missing.toml"))
    with pytest.raises(accepted.AcceptError, match="no such file"):
        accepted.load()


def test_the_default_file_is_found_at_the_repository_root_and_not_above_it(tmp_path, monkeypatch):
    monkeypatch.delenv(accepted.ENV_VAR, raising=False)
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "sub").mkdir()
    (repo / "perfsuite-accept.toml").write_text(entry())
    assert accepted.find(repo / "sub") == repo / "perfsuite-accept.toml"
    (tmp_path / "outer").mkdir()
    (tmp_path / "outer" / ".git").mkdir()
    (tmp_path / "perfsuite-accept.toml").write_text(entry())  # above the repository: not its file
    assert accepted.find(tmp_path / "outer") is None


def test_history_changes_refuses_a_malformed_file_with_exit_2(tmp_path, monkeypatch, capsys):
    path = accept_file(tmp_path, monkeypatch, entry() + entry(ratio=-1))
    build_series(tmp_path, url_of(tmp_path), [0.1] * 4)
    assert cli.main(["history", "changes", "--url", url_of(tmp_path)]) == 2
    assert f"{path}: entry 2 (cell *): ratio must be a number above 0" in capsys.readouterr().err


def test_an_ab_session_refuses_a_malformed_file_before_any_launch(tmp_path, monkeypatch):
    fake = fake_launches(monkeypatch)
    accept_file(tmp_path, monkeypatch, entry(since="nope"))
    with pytest.raises(OSError, match="entry 1 .*since must be a commit"):  # main says it, exit 2
        ab.ABSession([CELL], ab.Side("A", sys.executable), ab.Side("B", sys.executable), tmp_path / "out")
    assert not fake.calls


# ------------------------------------------------------------------------ ab

def _ab(tmp_path, side_a=None):
    lines = []
    side_a = side_a or ab.Side("A", sys.executable)
    session = ab.ABSession([CELL], side_a, ab.Side("B", sys.executable, {"FAKE_SLOW": "0.1"}), tmp_path / "out",
                           mode="launches", log=lines.append)
    return session.run(), session.data["cells"][0], lines


def test_ab_passes_a_regression_within_the_accepted_one_stating_it(tmp_path, monkeypatch):
    fake_launches(monkeypatch, launch_sigma=0.02)
    accept_file(tmp_path, monkeypatch, entry(CELL.id, 1.10, tolerance=0.03))
    code, record, lines = _ab(tmp_path)
    assert record["verdict"] == "regressed" and record["accepted"]["within"] and code == ab.EXIT_OK
    said = next(line for line in lines if line.startswith(f"{CELL.id}  REGRESSED"))
    assert "accepted: +10 % (exact fp32 all-reduce; since 3f2c1a9e, perfsuite-accept.toml entry 1)" in said


def test_ab_fails_a_regression_beyond_the_accepted_one(tmp_path, monkeypatch):
    fake_launches(monkeypatch, launch_sigma=0.02)
    accept_file(tmp_path, monkeypatch, entry(CELL.id, 1.02))
    code, record, lines = _ab(tmp_path)
    assert record["verdict"] == "regressed" and not record["accepted"]["within"] and code == ab.EXIT_REGRESSED
    assert any("beyond the accepted +2 %" in line for line in lines)


def test_an_entry_whose_commit_side_a_already_holds_accepts_nothing(tmp_path, monkeypatch):
    fake_launches(monkeypatch, launch_sigma=0.02)
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "the change"], check=True)
    accepted_at = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "later"], check=True)
    later = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    accept_file(repo, monkeypatch, entry(CELL.id, 1.10, since=accepted_at[:10], tolerance=0.03))
    code, record, _ = _ab(tmp_path, ab.Side("A", sys.executable, commit=later))  # a base that has it
    assert "accepted" not in record and code == ab.EXIT_REGRESSED


def test_a_failed_check_within_an_accepted_change_passes_the_exit_code():
    record = {"id": "c", "verdict": "same", "ratio": 1.0, "checks": [
        {"name": "peak_rss", "metric": "peak_rss", "verdict": "regressed", "ratio": 1.2, "ci_low": 1.2,
         "ci_high": 1.2}]}
    [memory] = accepted.read_entries([{"cell": "c", "metric": "peak_rss", "ratio": 1.2, "why": "a bigger cache",
                                       "since": "#7"}])
    assert verdicts.exit_code([record]) == ab.EXIT_REGRESSED
    verdicts.accept(record, [memory])
    assert record["checks"][0]["accepted"]["within"] and verdicts.exit_code([record]) == ab.EXIT_OK


# ---------------------------------------------------------------------- gate

def _launches(level, n=6, seed=0):
    rng = np.random.default_rng(seed)
    return [[float(x) for x in rng.lognormal(math.log(level * math.exp(rng.normal(0, 0.01))), 0.01, 20)]
            for _ in range(n)]


def _gate_check(cell_id, slowdown, commit=""):
    base = _launches(0.1, seed=1)
    expectation = Expectation("step_time", tolerance=0.05, samples=tuple(x for run in base for x in run),
                              launches=tuple(map(tuple, base)), source="recorded baseline", commit=commit)
    new = _launches(0.1 * slowdown, seed=2)
    result = {"id": cell_id, "status": "ok",
              "metrics": {"step_time": {"samples": [x for run in new for x in run], "launches": new, "unit": "s"}}}
    return StepTimeNotRegressed(expectation).evaluate(result)


def test_the_gate_judges_an_accepted_step_time_against_the_baseline_times_its_ratio(tmp_path, monkeypatch):
    monkeypatch.delenv(accepted.ENV_VAR, raising=False)
    monkeypatch.chdir(tmp_path)
    assert _gate_check("gate/x", 1.08).verdict == "regressed"  # no accept file: the regression fails
    accept_file(tmp_path, monkeypatch, entry("gate/*", 1.08))
    check = _gate_check("gate/x", 1.08)
    assert check.verdict == "pass" and not check.failed
    assert check.message.startswith("step_time accepted: +8 % (exact fp32 all-reduce; since 3f2c1a9e")
    assert "judged against the baseline x1.08 ±2%" in check.message
    beyond = _gate_check("gate/x", 1.20)
    assert beyond.verdict == "regressed" and "beyond the accepted +8 %" in beyond.message
    assert _gate_check("smoke/y", 1.08).verdict == "regressed"  # another cell: not accepted


def git_repo(path):
    """A repository with the accepted change's commit and a later one: (accepted, later)."""
    path.mkdir()
    git = ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    commits = []
    for message in ("the change", "later"):
        subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", message], check=True)
        commits.append(subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip())
    return commits


def test_a_baseline_recorded_after_the_accepted_commit_holds_the_change_and_the_entry_accepts_nothing(
        tmp_path, monkeypatch):
    """Re-recorded baselines already hold the accepted slowdown: accepting it
    again on top would let a second one of the same size pass unseen."""
    accepted_at, later = git_repo(tmp_path / "repo")
    accept_file(tmp_path / "repo", monkeypatch, entry("gate/*", 1.08, since=accepted_at[:10]))
    check = _gate_check("gate/x", 1.08, commit=later)  # recorded at a commit that has the change
    assert check.verdict == "regressed"
    assert f"the baseline was recorded at {later[:12]}, which holds the accepted change" in check.message
    assert "perfsuite-accept.toml entry 1" in check.message
    assert _gate_check("gate/x", 1.08, commit="0123456789ab").verdict == "pass"  # a commit git does not know
    assert _gate_check("gate/x", 1.08).verdict == "pass"  # a baseline that names no commit (a paper's)


# ------------------------------------------------------------------- history

STEPS = [0.1] * 12 + [0.11] * 12 + [0.125] * 12  # a step at sha(12), another at sha(24)


def test_the_next_change_point_is_looked_for_from_the_accepted_commit(tmp_path):
    url = url_of(tmp_path)
    build_series(tmp_path, url, STEPS)
    with History(url, create=False) as store:
        [points] = store.series(cell=CELLS[0]).values()
    assert [c.first_bad.commit for c in find_changes(points)] == [sha(12), sha(24)]
    [later] = find_changes(points, level_from=[sha(12)[:10]])
    assert later.first_bad.commit == sha(24) and later.index == 24 and later.last_good.commit == sha(23)


def test_history_changes_starts_the_level_at_an_accepted_commit_and_says_so(tmp_path, monkeypatch, capsys):
    url = url_of(tmp_path)
    build_series(tmp_path, url, STEPS)
    accept_file(tmp_path, monkeypatch, entry("smoke/image/*", 1.10, since=sha(12)))
    assert cli.main(["history", "changes", "--url", url]) == 1  # the later step still regresses at head
    out = capsys.readouterr().out
    assert f"level from {sha(12)[:12]}: accepted: +10 % (exact fp32 all-reduce" in out
    assert f"first bad {sha(24)[:12]}" in out and f"first bad {sha(12)[:12]}" not in out
    assert "1 change point(s) in 1 series" in out


def test_an_accepted_commit_at_head_leaves_no_regression_there(tmp_path, monkeypatch, capsys):
    url = url_of(tmp_path)
    build_series(tmp_path, url, [0.1] * 12 + [0.11] * 12)
    assert cli.main(["history", "changes", "--url", url]) == 1
    accept_file(tmp_path, monkeypatch, entry("smoke/image/*", 1.10, since=sha(12)))
    assert cli.main(["history", "changes", "--url", url]) == 0
    assert "0 change point(s) in 1 series" in capsys.readouterr().out
