"""Bisect: the first commit of a repository whose cell is worse than a good commit's.

The repository is the training stack a cell runs, as for ``perfsuite ab
--a-ref/--b-ref``: a commit becomes a side through a git worktree and a
venv that reuses the current interpreter's packages with the worktree
installed on top in editable mode (``ab.checkout_side``), so a launch runs
that commit's code (for perfsuite's own repository: its worker, workloads
and training step). Nothing is injected from outside the commit.

``git bisect`` picks the commits, but it does not run them: ``git bisect
run`` would judge each commit in a child process, and a judgement needs what
this process holds (the good commit's counters, its side, the session's
settings). So the loop is ours and the bookkeeping git's: ``git bisect
start BAD GOOD`` in a throwaway worktree of the user's repository (bisect
state is per worktree, so their own checkout, HEAD and refs stay as they
were), then per commit git checked out there one judgement and ``git bisect
good``, ``bad`` or ``skip``, until git names the first bad commit.
``git bisect log`` is kept in bisect.json.

A commit is judged against the good one in one of two ways:

- A/B (the default): an ``ab.ABSession`` between the good commit's side (A)
  and the commit's (B), launches interleaved ABBA until decided; "regressed"
  is bad, "same" or "improved" good, anything else ("unknown" at the cap, a
  failed launch) is ``git bisect skip``.
- ``counters``: one launch of the commit decides. Its work counters are
  compared with one launch of the good commit (``WorkCountersUnchanged``,
  exact but for ``counters.INEXACT``, unstable counters not judged); any
  change is bad, whichever way it goes.

The walking worktree is installed once; ``pip install -e`` runs again only
where a commit changes the packaging files, as editable installs map the
package to the worktree's directory and every other change is read from
there at import time.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfsuite.ab import session as ab
from perfsuite.cells import Cell
from perfsuite.judge.baselines import CounterBaseline
from perfsuite.judge.checks import WorkCountersUnchanged
from perfsuite.launch.launch import LaunchOptions, run_cell
from perfsuite.options import DEFAULT_LAUNCH_STATISTIC
from perfsuite.rank import counters
from perfsuite.stats.samples import DEFAULT_TOLERANCE
from perfsuite.system.atomic import atomic_write_json

SCHEMA = "perfsuite.bisect/1"
EXIT_FOUND, EXIT_USAGE, EXIT_UNDECIDED, EXIT_INTERRUPTED = 0, 2, 3, 130
# A change to one of these can change what `pip install -e` installs.
PACKAGING_FILES = ("pyproject.toml", "setup.py", "setup.cfg")
FIRST_BAD = re.compile(r"^([0-9a-f]{40}) is the first bad commit", re.M)
ONLY_SKIPPED = "only 'skip'ped commits left to test"


class BisectError(ab.ABError):
    """A usage or environment problem, said in a sentence (exit code 2)."""


@dataclass
class Judgement:
    """One commit judged against the good one."""

    commit: str
    subject: str
    verdict: str  # "good", "bad" or "skip": what git bisect was told
    judged: str  # the check's own word: pass/fail/skipped, or same/regressed/improved/unknown/error
    reason: str = ""  # one line: why bad (the evidence) or why skipped
    evidence: list[str] = field(default_factory=list)  # counter changes, or the A/B interval
    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    launches: int = 0
    dir: str = ""
    seconds: float = 0.0
    ran_commit: str | None = None  # the commit of the perfsuite that ran the ranks, as they said
    reinstalled: bool = False


def _git(repo: Path, *argv: str, what: str) -> str:
    return ab._run(["git", "-C", repo, *argv], what)


def resolve(repo: Path, ref: str, flag: str) -> str:
    """The commit a ref names in ``repo``, or a BisectError naming the flag."""
    try:
        inside = _git(repo, "rev-parse", "--is-inside-work-tree", what="git rev-parse")
    except ab.ABError:
        inside = ""
    if inside != "true":
        raise BisectError(f"--repo {repo}: not a git repository's working tree")
    try:
        return _git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", what="git rev-parse")
    except ab.ABError:
        raise BisectError(f"{flag} {ref}: no such commit in {repo}") from None


class Bisection:
    """Commits of good..bad judged one at a time, where git bisect says,
    until git names the first bad one; bisect.json rewritten after each."""

    def __init__(self, cell: Cell, repo: Path | str, good: str, bad: str, out_dir: Path | str, *,
                 use_counters: bool = False, max_launches: int = ab.DEFAULT_MAX_LAUNCHES,
                 tolerance: float = DEFAULT_TOLERANCE, statistic: str = DEFAULT_LAUNCH_STATISTIC,
                 argv: list[str] | None = None, launch: LaunchOptions | None = None,
                 log: Callable[[str], None] = lambda line: print(line, flush=True)) -> None:
        ab.check_settings(tolerance, statistic, max_launches)
        self.cell, self.repo = cell, Path(repo).resolve()
        self.out_dir = Path(out_dir).resolve()
        self.path = self.out_dir / "bisect.json"
        if self.path.exists():
            raise BisectError(f"{self.out_dir} already holds a bisection (bisect.json); "
                              "choose another --out")
        self.good_commit = resolve(self.repo, good, "--good")
        self.bad_commit = resolve(self.repo, bad, "--bad")
        if self.good_commit == self.bad_commit:
            raise BisectError(f"--good {good} and --bad {bad} are the same commit: nothing to bisect")
        try:
            _git(self.repo, "merge-base", "--is-ancestor", self.good_commit, self.bad_commit, what="")
        except ab.ABError:
            raise BisectError(f"--good {good} is not an ancestor of --bad {bad}: git bisect needs "
                              "the good commit in the bad one's history") from None
        self.use_counters, self.max_launches = use_counters, max_launches
        self.tolerance, self.statistic, self.log = tolerance, statistic, log
        self.launch = launch  # every launch's data dir, workload options, timeout, GPUs, nodes, profiler
        self.in_range = int(_git(self.repo, "rev-list", "--count",
                                 f"{self.good_commit}..{self.bad_commit}", what="git rev-list"))
        self.walker: ab.Side | None = None  # the worktree git bisect moves; side B
        self.good_side: ab.Side | None = None  # A/B only: side A, at the good commit
        self.reference: dict[str, Any] | None = None  # counters only: the good commit's launch
        self.judged: list[Judgement] = []
        self.installed_at: str | None = None  # the commit whose packaging files are installed
        self.data: dict[str, Any] = {
            "schema": SCHEMA, "started": time.time(), "finished": None, "argv": argv or [],
            "cell": cell.id, "params": cell.params(), "repo": str(self.repo),
            "good": {"ref": good, "commit": self.good_commit, "subject": self.subject(self.good_commit)},
            "bad": {"ref": bad, "commit": self.bad_commit, "subject": self.subject(self.bad_commit)},
            "mode": "counters" if use_counters else "ab", "commits_in_range": self.in_range,
            "settings": {"tolerance": tolerance, "launch_statistic": statistic,
                         "max_launches": max_launches, "launch": ab.launch_settings(launch)},
            "reference": None, "judged": [], "measured_commits": 0, "first_bad": None,
            "candidates": [], "outcome": None, "reason": None, "bisect_log": "",
            "interrupted": False, "exit_code": None}

    def subject(self, commit: str) -> str:
        return _git(self.repo, "log", "-1", "--format=%s", commit, what="git log")

    # -- the session ---------------------------------------------------------

    def run(self) -> int:
        """Bisect; 0 with the first bad commit named, 3 undecided, 2 a problem
        found before anything was judged, 130 on Ctrl-C."""
        started = time.monotonic()
        how = ("work counters, one launch a commit" if self.use_counters else
               f"A/B against the good commit, up to {self.max_launches} launches a side")
        self.log(f"bisect {self.cell.id}: {self.in_range} commit(s) in "
                 f"{self.good_commit[:12]}..{self.bad_commit[:12]} of {self.repo}; judged by {how}")
        bisecting = False
        try:
            self._set_up()
            out = self._bisect("start", self.bad_commit, self.good_commit)
            bisecting = True
            code = self._walk(out)
        except ab.ABError as err:  # BisectError, or a side that could not be set up
            code = self._end(EXIT_USAGE if not self.judged else EXIT_UNDECIDED, "error", str(err))
            self.log(f"perfsuite bisect: {err}")
        except KeyboardInterrupt:
            self.data["interrupted"] = True
            code = self._end(EXIT_INTERRUPTED, "interrupted", "Ctrl-C or SIGTERM")
            self.log("perfsuite bisect: interrupted")
        finally:
            if bisecting:
                self.data["bisect_log"] = self._bisect_quietly("log")
                self._bisect_quietly("reset")
            self._tear_down()
            self.write()
        measured = len(self.judged) + (self.reference is not None)
        self.log(f"measured {measured} commit(s) in {time.monotonic() - started:.0f} s"
                 + (" (the good reference and the judged ones)" if self.reference is not None else ""))
        self.log(f"bisect.json: {self.path}")
        return code

    def write(self) -> None:
        self.data["judged"] = [vars(j) for j in self.judged]
        self.data["measured_commits"] = len(self.judged) + (self.reference is not None)
        self.data["finished"] = time.time()
        atomic_write_json(self.path, self.data)

    def _end(self, code: int, outcome: str, reason: str | None = None) -> int:
        self.data.update(exit_code=code, outcome=outcome, reason=reason)
        return code

    def _set_up(self) -> None:
        """The walking worktree (at the good commit, where a counters
        reference is launched before git bisect moves it), and in A/B the
        good commit's own side."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.write()
        self.walker = ab.checkout_side("B", self.good_commit, self.repo, self.out_dir / "walk",
                                       flag="--good")
        self.installed_at = self.good_commit
        self.log(f"worktree {self.walker_src} set up in {self.walker.setup_s:.1f} s "
                 "(git worktree, venv, pip install -e); git bisect walks it")
        if self.use_counters:
            self._launch_reference()
        else:
            self.good_side = ab.checkout_side("A", self.good_commit, self.repo,
                                              self.out_dir / "sides" / "good", flag="--good")
            self.log(f"side A: good {self.good_commit[:12]} set up in {self.good_side.setup_s:.1f} s")

    @property
    def walker_src(self) -> Path:
        return self.out_dir / "walk" / "src"

    def _tear_down(self) -> None:
        """The worktrees go (launches stay under OUT), so the user's
        repository lists no worktree of ours afterwards."""
        for side_dir in (self.out_dir / "walk", self.out_dir / "sides" / "good"):
            if (side_dir / "src").exists():
                try:
                    _git(self.repo, "worktree", "remove", "--force", str(side_dir / "src"),
                         what="git worktree remove")
                except ab.ABError as err:
                    self.log(f"perfsuite bisect: {err}; `git worktree prune` forgets it")
            shutil.rmtree(side_dir, ignore_errors=True)

    def _bisect(self, *argv: str) -> str:
        """A git bisect command in the walking worktree; its output (stdout,
        where git names the first bad commit or the skipped candidates)."""
        proc = subprocess.run(["git", "-C", str(self.walker_src), "bisect", *argv],
                              capture_output=True, text=True)
        out = proc.stdout + proc.stderr
        if proc.returncode != 0 and ONLY_SKIPPED not in out:
            tail = " ".join(out.strip().splitlines()[-3:])
            raise BisectError(f"git bisect {argv[0]} failed: {tail}")
        return out

    def _bisect_quietly(self, *argv: str) -> str:
        try:
            return self._bisect(*argv)
        except BisectError as err:
            self.log(f"perfsuite bisect: {err}")
            return ""

    def _walk(self, out: str) -> int:
        """Judge what git checked out and tell git, until it has an answer."""
        while True:
            found = FIRST_BAD.search(out)
            if found:
                return self._found(found.group(1))
            if ONLY_SKIPPED in out:
                return self._ambiguous(out)
            step = re.search(r"roughly (\d+) step", out)
            head = _git(self.walker_src, "rev-parse", "HEAD", what="git rev-parse")
            self.log(f"[{len(self.judged) + 1}] {head[:12]} {self.subject(head)}"
                     + (f"  (git: about {step.group(1)} more step(s) after this)" if step else ""))
            judgement = self._judge(head)
            out = self._bisect(judgement.verdict, head)

    def _found(self, commit: str) -> int:
        judgement = next((j for j in self.judged if j.commit == commit), None)
        if judgement is None:  # --bad itself, as git was told, not yet measured: its evidence
            self.log(f"[{len(self.judged) + 1}] {commit[:12]} {self.subject(commit)}  (--bad: "
                     "git names it; judged for the evidence)")
            judgement = self._judge(commit)
            if judgement.verdict != "bad":
                why = (f"--bad {self.data['bad']['ref']} was judged {judgement.judged} against "
                       f"--good ({judgement.reason}): nothing regressed in the range, by this judgement"
                       if judgement.verdict == "good" else
                       f"the first bad commit is --bad {self.data['bad']['ref']} if it is bad, and it "
                       f"could not be judged: {judgement.reason}")
                self.data["candidates"] = [commit]
                self.log(f"undecided: {why}")
                return self._end(EXIT_UNDECIDED, "undecided", why)
        self.data["first_bad"] = {"commit": commit, "subject": judgement.subject,
                                  "reason": judgement.reason, "evidence": judgement.evidence,
                                  "ratio": judgement.ratio, "dir": judgement.dir}
        self.log(f"first bad commit: {commit} {judgement.subject}")
        for line in judgement.evidence:
            self.log(f"    {line}")
        return self._end(EXIT_FOUND, "found")

    def _ambiguous(self, out: str) -> int:
        """git's candidates when only skipped commits are left between good and bad."""
        candidates = re.findall(r"^([0-9a-f]{40})$", out.split(ONLY_SKIPPED, 1)[1], re.M)
        self.data["candidates"] = candidates
        skipped = {j.commit: j.reason for j in self.judged if j.verdict == "skip"}
        why = (f"only skipped commits are left: the first bad commit is one of {len(candidates)}, "
               "which more launches a commit (--max-launches) or a quieter machine may decide")
        self.log(f"undecided: {why}")
        for commit in candidates:
            note = skipped.get(commit, "not judged" if commit != self.bad_commit else "--bad")
            self.log(f"    {commit[:12]} {self.subject(commit)}  ({note})")
        return self._end(EXIT_UNDECIDED, "undecided", why)

    # -- judging one commit --------------------------------------------------

    def _judge(self, commit: str) -> Judgement:
        reinstalled = self._checkout(commit)
        started = time.monotonic()
        step_dir = self.out_dir / "commits" / f"{len(self.judged) + 1:02d}-{commit[:12]}"
        judgement = (self._judge_counters if self.use_counters else self._judge_ab)(commit, step_dir)
        judgement.seconds = round(time.monotonic() - started, 2)
        judgement.reinstalled = reinstalled
        self.judged.append(judgement)
        self.write()
        self.log(f"    -> {judgement.verdict.upper()} ({judgement.judged})  {judgement.reason}  "
                 f"({judgement.seconds:.1f} s)")
        return judgement

    def _checkout(self, commit: str) -> bool:
        """The walking worktree at ``commit`` (git bisect put it there, but
        for --bad judged at the end), installed again where its packaging
        files differ from the installed commit's. True if it was."""
        assert self.walker is not None
        if _git(self.walker_src, "rev-parse", "HEAD", what="git rev-parse") != commit:
            _git(self.walker_src, "checkout", "--quiet", "--detach", commit, what="git checkout")
        changed = _git(self.walker_src, "diff", "--name-only", self.installed_at or commit, commit,
                       "--", *PACKAGING_FILES, what="git diff")
        if not changed:
            return False
        ab._run([self.walker.python, "-m", "pip", "install", "--quiet", "--no-deps",
                 "--no-build-isolation", "-e", self.walker_src],
                f"pip install -e {self.walker_src} at {commit[:12]}", cwd=self.out_dir / "walk")
        self.installed_at = commit
        self.log(f"    {', '.join(changed.split())} changed: installed again")
        return True

    def _side(self, commit: str) -> ab.Side:
        assert self.walker is not None
        return ab.Side("B", self.walker.python, dict(self.walker.env), ref=commit, commit=commit)

    def _launch_reference(self) -> None:
        """Counters: one launch of the good commit, what every other is compared with."""
        assert self.walker is not None
        started = time.monotonic()
        result = run_cell(self.cell, self.out_dir / "commits" / f"00-{self.good_commit[:12]}-good",
                          self._side(self.good_commit).options(self.launch))
        seconds = round(time.monotonic() - started, 2)
        counted = result.get("counters") or {}
        self.reference = {"commit": self.good_commit, "subject": self.data["good"]["subject"],
                          "status": result["status"], "reason": result.get("reason"),
                          "counters": counted or None, "dir": result.get("dir"),
                          "ran_commit": (result.get("env") or {}).get("commit"), "seconds": seconds}
        self.data["reference"] = self.reference
        self.write()
        if result["status"] != "ok":
            raise BisectError(f"the good commit {self.good_commit[:12]} did not launch "
                              f"({result['status']}: {result.get('reason')}); nothing can be "
                              "judged against it")
        if not counted.get("per_step"):
            raise BisectError(f"the good commit's launch of {self.cell.id} counted no work "
                              "(count_steps=0, or a workload without a counting window): "
                              "bisect it without --counters")
        self.log(f"reference: good {self.good_commit[:12]} launched once, "
                 f"{len(counted['per_step'])} counters per step ({seconds:.1f} s)")

    def _judge_counters(self, commit: str, step_dir: Path) -> Judgement:
        assert self.reference is not None
        subject = self.subject(commit)
        result = run_cell(self.cell, step_dir, self._side(commit).options(self.launch))
        base = self.reference["counters"]
        baseline = CounterBaseline(self.cell.id, {}, {}, base["per_step"],
                                   unstable=tuple(base.get("unstable", [])),
                                   source=f"good {self.good_commit[:12]}")
        check = WorkCountersUnchanged(baseline).evaluate(result)
        judgement = Judgement(commit, subject, {"pass": "good", "fail": "bad"}.get(check.verdict, "skip"),
                              check.verdict, check.message or "", launches=1,
                              dir=str(result.get("dir") or step_dir),
                              ran_commit=(result.get("env") or {}).get("commit"))
        if check.verdict == "fail":
            measured = result["counters"]
            unstable = set(measured.get("unstable", [])) | set(baseline.unstable)
            judgement.evidence = counters.describe(counters.diff(measured["per_step"], base["per_step"],
                                                                 unstable=unstable))
            judgement.reason = "work counters changed: " + "; ".join(judgement.evidence)
        elif check.verdict != "pass" and result["status"] != "ok":
            judgement.reason = f"launch {result['status']}: {result.get('reason')}"
        return judgement

    def _judge_ab(self, commit: str, step_dir: Path) -> Judgement:
        assert self.good_side is not None
        session = ab.ABSession([self.cell], self.good_side, self._side(commit), step_dir,
                               tolerance=self.tolerance, statistic=self.statistic,
                               max_launches=self.max_launches, launch=self.launch, mode="launches",
                               log=lambda line: self.log(f"    {line}"))
        session.run()
        if session.data["interrupted"]:
            raise KeyboardInterrupt
        (record,) = session.data["cells"]
        verdict = {"regressed": "bad", "same": "good", "improved": "good"}.get(record["verdict"], "skip")
        if record["verdict"] in ab.DECIDED:
            reason = (f"step time {record['verdict'].upper()} {ab.interval(record)}, {record['n_b']} vs "
                      f"{record['n_a']} launches, against good {self.good_commit[:12]}")
        elif record["verdict"] == "unknown":
            reason = f"step time undecided, {ab.interval(record)}: {record['reason']}"
        else:
            reason = f"{record['verdict']}: {record.get('reason')}"
        return Judgement(commit, self.subject(commit), verdict, record["verdict"], reason,
                         evidence=[reason] if verdict == "bad" else [], ratio=record.get("ratio"),
                         ci_low=record.get("ci_low"), ci_high=record.get("ci_high"),
                         launches=record["n_a"] + record["n_b"], dir=str(step_dir))
