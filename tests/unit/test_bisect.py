"""perfsuite bisect: git bisect over a repository, each commit judged against the good one.

One test launches real cells: its repository is a copy of the perfsuite
package that the launches import (so a commit's code is what the ranks
run), and one of its 16 commits makes every training step do one more
all-reduce. The others stand in for launches (``run_cell``) with fakes
that read the walking worktree's files, so a commit still decides."""

import json
import math
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

import perfsuite
from perfsuite import options
from perfsuite.ab import bisect
from perfsuite.cli import main as cli
from perfsuite.launch.launch import LaunchOptions
from tests.unit.cellkit import tiny_image_cell

SMOKE_CELL = "smoke/image/ddp-ds/c1/fp32/px32/nopin/nchw"
PYPROJECT = ('[build-system]\nrequires = ["setuptools>=68"]\nbuild-backend = "setuptools.build_meta"\n'
             '[project]\nname = "bisectprobe"\nversion = "0.1"\n')
# The bad commit of the real test: from here on every step of every rank
# all-reduces four more float32 values (perfsuite.rank.faults' own extra work),
# written into the training code of the repository's commit.
EXTRA_ALLREDUCE = '''

_from_options = from_options


def from_options(options):  # every step all-reduces once more
    return _from_options(options) or Fault.parse("allreduce:*:0")
'''


def _git(repo, *argv):
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *argv],
                          check=True, capture_output=True, text=True).stdout.strip()


def _commit(repo, message):
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", message)
    return _git(repo, "rev-parse", "HEAD")


def probe_repo(tmp_path, files_by_commit):
    """A one-module package; commit k writes files_by_commit[k] (name -> text)."""
    repo = tmp_path / "repo"
    (repo / "bisectprobe").mkdir(parents=True)
    (repo / "pyproject.toml").write_text(PYPROJECT)
    (repo / "bisectprobe" / "__init__.py").write_text("")
    _git(repo, "init", "-q")
    commits = []
    for k, files in enumerate(files_by_commit):
        (repo / "bisectprobe" / "__init__.py").write_text(f"VERSION = {k}\n")
        for name, text in files.items():
            (repo / name).write_text(text)
        commits.append(_commit(repo, f"commit {k}"))
    return repo, commits


def _worktree_file(opts, name, default="0"):
    """The walking worktree's file, as the fake launch's 'code': the side's
    python is OUT/walk/venv/bin/python (or OUT/sides/good/...), its code in ../../src."""
    path = Path(opts.python).parents[2] / "src" / name
    return path.read_text().strip() if path.exists() else default


class FakeCounterLaunch:
    """run_cell's stand-in for --counters: the worktree's allreduce.txt is the
    number of all-reduces a step does; broken.txt makes the launch fail."""

    def __init__(self):
        self.commits, self.opts = [], []

    def __call__(self, cell, out_dir, opts=None):
        opts = opts or LaunchOptions()
        self.opts.append(opts)
        src = Path(opts.python).parents[2] / "src"
        head = _git(src, "rev-parse", "HEAD")
        self.commits.append(head)
        base = {"id": cell.id, "params": cell.params(), "dir": str(out_dir), "env": {"commit": head},
                "checks": [], "ranks": [], "metrics": {}}
        if _worktree_file(opts, "broken.txt", "") == "yes":
            return {**base, "status": "error", "reason": "rank 0 failed: ImportError: broken"}
        calls = int(_worktree_file(opts, "allreduce.txt", "4"))
        per_step = {"collectives/allreduce/calls": calls, "collectives/allreduce/bytes": 1000 + 16 * calls,
                    "ops/aten::mm": 12, "memory/peak_allocated": 1e6}
        return {**base, "status": "ok", "reason": None,
                "counters": {"window_steps": 2, "ranks": 2, "per_step": per_step, "unstable": []}}


class FakeABLaunch:
    """run_cell's stand-in for A/B: the worktree's slow.txt slows every step
    by that fraction; launches scatter 1 % around their level."""

    def __init__(self):
        self.rng = np.random.default_rng(0)
        self.calls, self.opts = 0, []

    def __call__(self, cell, out_dir, opts=None):
        self.calls += 1
        opts = opts or LaunchOptions()
        self.opts.append(opts)
        level = 0.1 * (1 + float(_worktree_file(opts, "slow.txt"))) * math.exp(self.rng.normal(0, 0.01))
        if _worktree_file(opts, "broken.txt", "") == "yes":
            return {"id": cell.id, "status": "error", "reason": "rank 0 failed: broken", "metrics": {},
                    "checks": [], "ranks": [], "env": {}, "dir": str(out_dir)}
        samples = [float(x) for x in self.rng.lognormal(math.log(level), 0.01, 20)]
        return {"id": cell.id, "params": cell.params(), "status": "ok", "reason": None, "env": {},
                "checks": [], "ranks": [], "dir": str(out_dir), "duration_s": 1.0,
                "metrics": {"step_time": {"value": float(np.median(samples)), "unit": "s",
                                          "samples": samples}}}


def bisection(repo, good, bad, out, **settings):
    lines = []
    session = bisect.Bisection(tiny_image_cell(), repo, good, bad, out, log=lines.append, **settings)
    return session, lines


def untouched(repo, head):
    """The user's checkout as it was: HEAD, a clean tree, no bisect, no worktree of ours."""
    assert _git(repo, "rev-parse", "HEAD") == head
    assert _git(repo, "status", "--porcelain") == ""
    assert subprocess.run(["git", "-C", str(repo), "bisect", "log"], capture_output=True).returncode != 0
    assert len(_git(repo, "worktree", "list").splitlines()) == 1
    assert not [r for r in _git(repo, "for-each-ref", "--format=%(refname)").split() if "bisect" in r]


@pytest.mark.slow
def test_counters_name_the_commit_with_one_more_allreduce_a_step(tmp_path, monkeypatch, capsys):
    fake = FakeCounterLaunch()
    monkeypatch.setattr("perfsuite.ab.bisect.run_cell", fake)
    files = [{}] * 11 + [{"allreduce.txt": "5"}] * 5  # commit 11 adds one
    repo, commits = probe_repo(tmp_path, files)
    head = _git(repo, "rev-parse", "HEAD")
    code = cli.main(["bisect", SMOKE_CELL, "--good", commits[0], "--bad", "HEAD", "--counters",
                     "--repo", str(repo), "--out", str(tmp_path / "out"), "--option", "count_steps=3",
                     "--timeout", "90", "--json"])
    captured = capsys.readouterr()
    out, summary = captured.err, json.loads(captured.out)  # --json: the words go to stderr
    assert code == 0 == summary["exit_code"] and summary["first_bad"]["commit"] == commits[11]
    assert summary["bisect_json"] == str(tmp_path / "out" / "bisect.json")
    assert all(opts.options == {"count_steps": "3"} and opts.timeout_s == 90.0 for opts in fake.opts)
    assert f"first bad commit: {commits[11]} commit 11\n" in out
    assert "    c10d allreduce per step 4 -> 5 (+16 B)" in out
    data = json.loads((tmp_path / "out" / "bisect.json").read_text())
    assert data["first_bad"]["commit"] == commits[11] and data["exit_code"] == 0
    assert data["measured_commits"] == len(fake.commits) <= 5  # the reference and log2(15) rounded up
    assert fake.commits[0] == commits[0] and data["reference"]["commit"] == commits[0]
    assert [j["commit"] for j in data["judged"]] == fake.commits[1:]
    assert all(j["verdict"] == ("bad" if commits.index(j["commit"]) >= 11 else "good")
               for j in data["judged"])
    assert "git bisect start" in data["bisect_log"] and "first bad commit" in data["bisect_log"]
    untouched(repo, head)
    assert not (tmp_path / "out" / "walk").exists()


@pytest.mark.slow
def test_ab_names_the_slower_commit_with_its_ratio(tmp_path, monkeypatch):
    fake = FakeABLaunch()
    monkeypatch.setattr("perfsuite.ab.session.run_cell", fake)
    repo, commits = probe_repo(tmp_path, [{}] * 3 + [{"slow.txt": "0.2"}] * 3)
    session, lines = bisection(repo, commits[0], commits[-1], tmp_path / "out", max_launches=4,
                               launch=LaunchOptions(options={"count_steps": "0"}, timeout_s=60.0))
    assert session.run() == bisect.EXIT_FOUND
    assert all(opts.options == {"count_steps": "0"} and opts.timeout_s == 60.0 for opts in fake.opts)
    data = json.loads((tmp_path / "out" / "bisect.json").read_text())
    first = data["first_bad"]
    assert first["commit"] == commits[3] and first["ratio"] == pytest.approx(1.2, rel=0.03)
    assert first["evidence"][0].startswith("step time REGRESSED ratio 1.2")
    assert first["evidence"][0].endswith(f", 4 vs 4 launches, against good {commits[0][:12]}")
    assert f"first bad commit: {commits[3]} commit 3" in lines
    for judged in data["judged"]:  # each an A/B session of its own, good (A) against it (B)
        ab_json = json.loads((Path(judged["dir"]) / "ab.json").read_text())
        assert ab_json["settings"]["sides"]["A"]["commit"] == commits[0]
        assert ab_json["settings"]["sides"]["B"]["commit"] == judged["commit"]
        assert judged["launches"] == 8 and judged["verdict"] in ("good", "bad")
    untouched(repo, _git(repo, "rev-parse", "HEAD"))


@pytest.mark.slow
def test_commits_that_cannot_be_judged_are_skipped_and_can_leave_it_undecided(tmp_path, monkeypatch):
    monkeypatch.setattr("perfsuite.ab.bisect.run_cell", FakeCounterLaunch())
    # commit 3 fails to launch; commit 4 adds the all-reduce: 3 or 4, git cannot tell
    files = [{}] * 3 + [{"broken.txt": "yes"}, {"broken.txt": "no", "allreduce.txt": "5"}, {}, {}]
    repo, commits = probe_repo(tmp_path, files)
    session, lines = bisection(repo, commits[0], commits[-1], tmp_path / "out", use_counters=True)
    assert session.run() == bisect.EXIT_UNDECIDED
    data = json.loads((tmp_path / "out" / "bisect.json").read_text())
    assert data["outcome"] == "undecided" and data["first_bad"] is None
    assert set(data["candidates"]) == {commits[3], commits[4]}
    skipped = [j for j in data["judged"] if j["verdict"] == "skip"]
    assert [j["commit"] for j in skipped] == [commits[3]]
    assert "launch error: rank 0 failed: ImportError: broken" in skipped[0]["reason"]
    assert any(line.startswith("undecided: only skipped commits are left") for line in lines)


@pytest.mark.slow
def test_a_bad_ref_judged_good_is_undecided_and_a_packaging_change_reinstalls(tmp_path, monkeypatch):
    monkeypatch.setattr("perfsuite.ab.bisect.run_cell", FakeCounterLaunch())
    repo, commits = probe_repo(tmp_path, [{}, {"pyproject.toml": PYPROJECT.replace("0.1", "0.2")}])
    session, lines = bisection(repo, commits[0], commits[1], tmp_path / "out", use_counters=True)
    assert session.run() == bisect.EXIT_UNDECIDED
    data = json.loads((tmp_path / "out" / "bisect.json").read_text())
    (judged,) = data["judged"]  # git names --bad at once; judged for its evidence, it is good
    assert judged["commit"] == commits[1] and judged["verdict"] == "good" and judged["reinstalled"]
    assert "nothing regressed in the range" in data["reason"]
    untouched(repo, commits[1])


@pytest.mark.parametrize("argv, message", [
    (["--good", "nope", "--bad", "HEAD"], "--good nope: no such commit in"),
    (["--good", "HEAD", "--bad", "HEAD~1"], "--good HEAD is not an ancestor of --bad HEAD~1"),
    (["--good", "HEAD", "--bad", "HEAD"], "are the same commit: nothing to bisect"),
    (["--good", "HEAD~1", "--bad", "HEAD", "--max-launches", "5"], "--max-launches 5: give an even"),
])
def test_usage_errors_exit_2_with_a_sentence(tmp_path, capsys, argv, message):
    repo, _ = probe_repo(tmp_path, [{}, {}])
    code = cli.main(["bisect", SMOKE_CELL, "--repo", str(repo), "--out", str(tmp_path / "out"), *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_not_a_repository_an_unknown_cell_and_a_used_out_exit_2(tmp_path, capsys):
    argv = ["--good", "HEAD~1", "--bad", "HEAD", "--out", str(tmp_path / "out")]
    assert cli.main(["bisect", SMOKE_CELL, "--repo", str(tmp_path), *argv]) == 2
    assert "not a git repository" in capsys.readouterr().err
    repo, _ = probe_repo(tmp_path, [{}, {}])
    assert cli.main(["bisect", "smoke/image/nope", "--repo", str(repo), *argv]) == 2
    assert "unknown cell id(s) ['smoke/image/nope']" in capsys.readouterr().err
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "bisect.json").write_text("{}")
    assert cli.main(["bisect", SMOKE_CELL, "--repo", str(repo), *argv]) == 2
    assert "already holds a bisection" in capsys.readouterr().err


def perfsuite_repo(tmp_path, commits, bad_at):
    """A repository of the perfsuite package the ranks import, as it is here:
    ``commits`` commits, each a harmless change to the training code (a
    comment in the image workload) but the one at ``bad_at``, which also
    makes every step do one more all-reduce."""
    source, repo = Path(perfsuite.__file__).resolve().parent, tmp_path / "repo"
    shutil.copytree(source, repo / "perfsuite", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(source.parent / name, repo / name)
    shutil.copytree(source.parent / "baselines", repo / "baselines")  # the package's _baselines
    _git(repo, "init", "-q")
    shas = []
    for k in range(commits):
        with open(repo / "perfsuite" / "workloads" / "image.py", "a") as module:
            module.write(f"# bisect test commit {k}\n")
        if k == bad_at:
            with open(repo / "perfsuite" / "rank" / "faults.py", "a") as module:
                module.write(EXTRA_ALLREDUCE)
        shas.append(_commit(repo, f"commit {k}" + (": one more all-reduce a step" if k == bad_at else "")))
    return repo, shas


@pytest.mark.slow
def test_real_launches_find_the_extra_allreduce_in_16_commits_by_counters_alone(tmp_path):
    repo, commits = perfsuite_repo(tmp_path, 16, bad_at=11)
    lines = []
    started = time.monotonic()
    # one rank: ~4 s a launch less than two, and its all-reduces are counted all the same
    session = bisect.Bisection(tiny_image_cell(world_size=1, max_steps=6), repo, commits[0], commits[-1],
                               tmp_path / "out", use_counters=True, log=lines.append)
    code = session.run()
    wall_s = time.monotonic() - started
    data = json.loads((tmp_path / "out" / "bisect.json").read_text())
    print("\n".join(lines))
    print(f"real bisect: {data['measured_commits']} commits measured in {wall_s:.0f} s")
    assert code == bisect.EXIT_FOUND, lines
    assert data["first_bad"]["commit"] == commits[11]
    assert f"first bad commit: {commits[11]} commit 11: one more all-reduce a step" in lines
    # one more all-reduce of 16 bytes a step (then the operators it took)
    assert data["first_bad"]["evidence"][0].startswith("c10d allreduce per step "), data["first_bad"]
    assert data["first_bad"]["evidence"][0].endswith("(+16 B)"), data["first_bad"]
    assert data["measured_commits"] <= 5  # the good reference, then log2(15) rounded up
    # every launch ran the perfsuite of the commit judged: the ranks' git HEAD is that commit
    assert data["reference"]["ran_commit"] == commits[0]
    assert all(j["ran_commit"] == j["commit"] for j in data["judged"])
    assert all(j["verdict"] == ("bad" if commits.index(j["commit"]) >= 11 else "good")
               for j in data["judged"])
    untouched(repo, commits[-1])



def test_bisect_launches_with_every_launching_option_of_run(tmp_path, monkeypatch):
    seen = {}

    class Bisection:  # records what the command hands a bisection
        def __init__(self, cell, repo, good, bad, out, **settings):
            seen.update(settings, cell=cell.id)
            self.path, self.data = Path(out) / "bisect.json", {"outcome": "found"}

        def run(self):
            return bisect.EXIT_FOUND

    monkeypatch.setattr("perfsuite.ab.bisect.Bisection", Bisection)
    monkeypatch.setattr("perfsuite.runner.handle_sigterm", lambda: None)
    data = tmp_path / "mnist"
    data.mkdir()
    assert cli.main(["bisect", SMOKE_CELL, "--good", "a", "--bad", "b", "--data-dir", str(data), "--option",
                     "k=v", "--timeout", "30", "--gpus", "1", "--profiler", "torch", "--out", str(tmp_path)]) == 0
    launch = seen["launch"]
    assert (launch.data_dir, launch.options, launch.timeout_s, launch.gpus, launch.profiler) == (
        data, {"k": "v"}, 30.0, [1], "torch")
    assert seen["cell"] == SMOKE_CELL and seen["statistic"] == options.DEFAULT_LAUNCH_STATISTIC
