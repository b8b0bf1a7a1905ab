"""Confirm before alerting: a regression ``perfsuite history changes`` finds at
a series' head is measured again, by an A/B session of its first bad commit
(side B) against its last good one (side A) in the repository of the
training stack, as ``perfsuite ab CELL --a-ref GOOD --b-ref BAD --repo REPO``
measures them: both on this machine, interleaved, so that a slow night or
another machine's history is not taken for a change.

- confirmed: the A/B says regressed (beyond any change accepted on purpose):
  reported, exit 1, and with ``bisect`` the commits between the two (where
  there are any) bisected by ``perfsuite.ab.bisect``;
- not confirmed: the A/B says same or improved (or the change is the one
  accepted): listed, not reported;
- undecided: the A/B says unknown, or could not run (a commit not in the
  repository, a failed launch): listed with why, exit 3 where none is confirmed.

The history knows nothing of A/B (it comes first in the data flow); this
module reads its change points and runs ab's sessions.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfsuite import cells
from perfsuite.ab import session as ab
from perfsuite.ab.sides import _forget_worktree
from perfsuite.ab.verdicts import summary_line, within_accepted
from perfsuite.launch.launch import LaunchOptions
from perfsuite.options import DEFAULT_LAUNCH_STATISTIC
from perfsuite.stats.samples import DEFAULT_TOLERANCE

CONFIRMED, NOT_CONFIRMED, UNDECIDED = "confirmed", "not confirmed", "undecided"
EXIT_OK, EXIT_REGRESSED, EXIT_UNDECIDED = 0, 1, 3


@dataclass
class Settings:
    """How every change point is measured again: ab's judging options, where."""

    repo: Path
    out: Path
    bisect: bool = False
    tolerance: float = DEFAULT_TOLERANCE
    statistic: str = DEFAULT_LAUNCH_STATISTIC
    max_launches: int = ab.DEFAULT_MAX_LAUNCHES
    launch: LaunchOptions | None = None
    log: Callable[[str], None] = lambda line: print(line, flush=True)


@dataclass
class Confirmation:
    """A change point measured again: the outcome and ab's own words."""

    change: Any  # perfsuite.history.changes.Change
    outcome: str
    verdict: str  # ab's: regressed, same, improved, unknown, error, skipped; or "not run"
    line: str  # ab's summary line, or why it did not run
    ab_json: str | None = None
    between: int | None = None  # commits strictly between the last good and the first bad
    bisect: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**self.change.to_dict(), "confirmation": {
            "outcome": self.outcome, "verdict": self.verdict, "line": self.line, "ab_json": self.ab_json,
            "commits_between": self.between, "bisect": self.bisect}}

    def describe(self) -> list[str]:
        change = self.change
        head = (f"{self.outcome.upper()}  {change.cell} {change.metric} [{change.profile}] "
                f"{change.last_good.commit[:12]}..{change.first_bad.commit[:12]}")
        tail = {CONFIRMED: "reported", NOT_CONFIRMED: "not reported",
                UNDECIDED: "neither confirmed nor cleared"}[self.outcome]
        lines = [f"{head}: ab says {self.line} ({tail})"]
        if self.bisect is not None:
            first = self.bisect.get("first_bad") or {}
            lines.append(f"    bisect: first bad commit {first['commit'][:12]} {first.get('subject', '')}"
                         if first else f"    bisect: {self.bisect.get('outcome')}: {self.bisect.get('reason')}")
        elif self.outcome == CONFIRMED and self.between:
            lines.append(f"    {self.between} commit(s) between them: --bisect names the first bad one")
        return lines


def commits_between(repo: Path, good: str, bad: str) -> int | None:
    """Commits strictly between ``good`` and ``bad`` in ``repo``; None where git cannot say."""
    done = subprocess.run(["git", "-C", str(repo), "rev-list", "--count", f"{good}..{bad}"],
                          capture_output=True, text=True)
    return max(0, int(done.stdout.strip()) - 1) if done.returncode == 0 and done.stdout.strip() else None


def measure(change: Any, out_dir: Path, settings: Settings) -> tuple[dict[str, Any], str]:
    """The A/B of the change's first bad commit against its last good one: the
    cell's record and ab.json's path. The sides' worktrees go afterwards."""
    cell = cells.get(change.cell)
    sides = out_dir / "sides"
    try:
        side_a = ab.checkout_side("A", change.last_good.commit, settings.repo, sides / "a", flag="last good")
        side_b = ab.checkout_side("B", change.first_bad.commit, settings.repo, sides / "b", flag="first bad")
        session = ab.ABSession([cell], side_a, side_b, out_dir, tolerance=settings.tolerance,
                               statistic=settings.statistic, max_launches=settings.max_launches,
                               launch=settings.launch, log=lambda line: settings.log(f"    {line}"))
        session.run()
    finally:  # ab.json and the launches stay under OUT; no worktree stays registered in --repo
        for side in ("a", "b"):
            _forget_worktree(settings.repo, sides / side)
    if session.data["interrupted"]:
        raise KeyboardInterrupt
    (record,) = session.data["cells"]
    return record, str(session.path)


def bisect_range(change: Any, out_dir: Path, settings: Settings) -> dict[str, Any]:
    """``perfsuite bisect`` of the change's cell over last good..first bad."""
    from perfsuite.ab.bisect import Bisection

    bisection = Bisection(cells.get(change.cell), settings.repo, change.last_good.commit,
                          change.first_bad.commit, out_dir, tolerance=settings.tolerance,
                          statistic=settings.statistic, max_launches=settings.max_launches,
                          launch=settings.launch, log=lambda line: settings.log(f"    {line}"))
    code = bisection.run()
    return {"exit_code": code, "outcome": bisection.data["outcome"], "reason": bisection.data["reason"],
            "first_bad": bisection.data["first_bad"], "bisect_json": str(bisection.path)}


def _outcome(record: dict[str, Any]) -> str:
    if record["verdict"] == "regressed":
        return NOT_CONFIRMED if within_accepted(record) else CONFIRMED
    return NOT_CONFIRMED if record["verdict"] in ("same", "improved") else UNDECIDED


def confirm_one(change: Any, out_dir: Path, settings: Settings) -> Confirmation:
    settings.log(f"measuring again: {change.cell} {change.metric}, {change.first_bad.commit[:12]} against "
                 f"{change.last_good.commit[:12]} in {settings.repo}")
    try:
        record, ab_json = measure(change, out_dir, settings)
    except (ab.ABError, cells.CellError) as err:
        return Confirmation(change, UNDECIDED, "not run", f"no A/B: {err}")
    found = Confirmation(change, _outcome(record), record["verdict"], summary_line(record), ab_json)
    if found.outcome == CONFIRMED:
        found.between = commits_between(settings.repo, change.last_good.commit, change.first_bad.commit)
        if settings.bisect and found.between:
            try:
                found.bisect = bisect_range(change, out_dir / "bisect", settings)
            except ab.ABError as err:
                found.bisect = {"outcome": "error", "reason": str(err), "first_bad": None}
    return found


def confirm_changes(changes: list[Any], settings: Settings) -> list[Confirmation]:
    """Each change measured again, one A/B session each, under ``settings.out``."""
    out = []
    for k, change in enumerate(changes, 1):
        where = settings.out / f"{k:02d}-{change.cell.replace('/', '_')}-{change.first_bad.commit[:12]}"
        out.append(confirm_one(change, where, settings))
    return out


def default_out() -> Path:
    import os

    return Path(".perfsuite") / f"confirm-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def exit_code(confirmations: list[Confirmation]) -> int:
    """1 where a change point is confirmed, else 3 where one is undecided, else 0."""
    outcomes = {c.outcome for c in confirmations}
    return EXIT_REGRESSED if CONFIRMED in outcomes else EXIT_UNDECIDED if UNDECIDED in outcomes else EXIT_OK


def report(confirmations: list[Confirmation]) -> list[str]:
    """Every change point measured again, then how many of each outcome."""
    lines = [line for c in confirmations for line in c.describe()]
    counts = {o: sum(c.outcome == o for c in confirmations) for o in (CONFIRMED, NOT_CONFIRMED, UNDECIDED)}
    lines.append(f"measured again by A/B: {counts[CONFIRMED]} confirmed, {counts[NOT_CONFIRMED]} not confirmed, "
                 f"{counts[UNDECIDED]} undecided")
    return lines
