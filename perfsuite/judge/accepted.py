"""Regressions accepted on purpose: ``perfsuite-accept.toml``, a reviewed file
at the root of the user's repository (or the file ``PERFSUITE_ACCEPT_FILE``
names), each entry a cell (an id or a glob), a metric, the ratio accepted
(1.08: 8 % slower), a tolerance around it, why, and the commit (or pull
request, ``#123``) from which it holds:

    [[accept]]
    cell = "gate/image/ddp/*"
    ratio = 1.08
    why = "exact fp32 all-reduce for loss parity"
    since = "3f2c1a9e"

A regression is accepted when its interval, divided by the accepted ratio,
is no regression at the entry's tolerance (``beyond``): the change is the
one accepted, or less. ``perfsuite ab`` and the gate's step-time check pass
it saying so; ``perfsuite history changes`` starts the series' level at the
entry's commit.
"""

from __future__ import annotations

import errno
import functools
import math
import os
import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import tomllib

from perfsuite.judge.baselines import HIGHER_IS_BETTER
from perfsuite.stats.samples import classify

FILE_NAME = "perfsuite-accept.toml"
ENV_VAR = "PERFSUITE_ACCEPT_FILE"
DEFAULT_METRIC = "step_time"
DEFAULT_TOLERANCE = 0.02
KEYS = ("cell", "metric", "ratio", "tolerance", "why", "since")
COMMIT = re.compile(r"^[0-9a-f]{7,40}$")
PULL = re.compile(r"^(#\d+|https?://\S+/pull/\d+)$")


class AcceptError(OSError):
    """A malformed accept file, said as a file that cannot be read (exit 2),
    naming the file and the entry."""

    def __init__(self, path: Path | str, message: str) -> None:
        super().__init__(errno.EINVAL, message, str(path))

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


@dataclass(frozen=True)
class Accepted:
    """One entry of the accept file (``index`` counts from 1)."""

    cell: str
    ratio: float
    why: str
    since: str
    metric: str = DEFAULT_METRIC
    tolerance: float = DEFAULT_TOLERANCE
    file: str = ""
    index: int = 0

    @property
    def commit(self) -> str | None:
        """The commit the entry holds from; None for a pull request."""
        return self.since if COMMIT.match(self.since) else None

    def matches(self, cell: str | None, metric: str | None) -> bool:
        return bool(cell) and fnmatchcase(str(cell), self.cell) and (metric or DEFAULT_METRIC) == self.metric

    def change(self) -> str:
        """The accepted change as a signed percentage: +8 %."""
        return f"{(self.ratio - 1) * 100:+.3g} %"

    def where(self) -> str:
        return f"{Path(self.file).name} entry {self.index}"

    def line(self) -> str:
        return f"accepted: {self.change()} ({self.why}; since {self.since}, {self.where()})"


def _number(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _entry(path: Path, index: int, raw: Any) -> Accepted:
    def bad(what: str) -> AcceptError:
        named = f" (cell {raw.get('cell')})" if isinstance(raw, dict) and raw.get("cell") else ""
        return AcceptError(path, f"entry {index}{named}: {what}; each [[accept]] entry takes "
                                 f"{', '.join(KEYS)} (see docs/how-to/gate-a-change.md)")

    if not isinstance(raw, dict):
        raise bad("not a table")
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise bad(f"unknown key {unknown[0]!r}")
    for key in ("cell", "why", "since"):
        if not isinstance(raw.get(key), str) or not raw[key].strip():
            raise bad(f"{key} is required, a non-empty string")
    metric = raw.get("metric", DEFAULT_METRIC)
    if not isinstance(metric, str) or not metric:
        raise bad("metric must be a metric's name, e.g. step_time")
    ratio, tolerance = _number(raw.get("ratio")), _number(raw.get("tolerance", DEFAULT_TOLERANCE))
    if ratio is None or ratio <= 0:
        raise bad(f"ratio must be a number above 0 (1.08: 8 % slower accepted), got {raw.get('ratio')!r}")
    if tolerance is None or not 0 <= tolerance < 1:
        raise bad(f"tolerance must be a fraction in [0, 1), got {raw.get('tolerance')!r}")
    since = raw["since"].strip()
    if not (COMMIT.match(since.lower()) or PULL.match(since)):
        raise bad(f"since must be a commit (7-40 hex digits) or a pull request (#123, or its URL), got {since!r}")
    since = since.lower() if COMMIT.match(since.lower()) else since
    return Accepted(raw["cell"].strip(), ratio, raw["why"].strip(), since, metric, tolerance, str(path), index)


def read(path: Path | str) -> list[Accepted]:
    """The entries of an accept file, each validated; AcceptError names the first bad one."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise AcceptError(path, f"not TOML ({err})") from None
    except OSError as err:
        raise AcceptError(path, f"cannot be read ({err.strerror or err})") from None
    other = sorted(set(data) - {"accept"})
    if other:
        raise AcceptError(path, f"unknown table or key {other[0]!r}; entries are [[accept]] tables")
    return read_entries(data.get("accept", []), path)


def read_entries(entries: Any, path: Path | str = FILE_NAME) -> list[Accepted]:
    """Entries as TOML gives them (a list of tables), each validated."""
    if not isinstance(entries, list):
        raise AcceptError(path, "accept must be a list of tables, written [[accept]]")
    return [_entry(Path(path), i, raw) for i, raw in enumerate(entries, 1)]


def find(cwd: Path | str | None = None) -> Path | None:
    """The accept file: PERFSUITE_ACCEPT_FILE where set, else perfsuite-accept.toml
    in the current folder or one above it, up to the repository's root."""
    named = os.environ.get(ENV_VAR, "").strip()
    if named:
        path = Path(named).expanduser()
        if not path.is_file():
            raise AcceptError(path, f"no such file ({ENV_VAR} names it)")
        return path
    here = Path(cwd or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / FILE_NAME).is_file():
            return folder / FILE_NAME
        if (folder / ".git").exists():
            break
    return None


_cache: dict[tuple[str, float], list[Accepted]] = {}


def load(cwd: Path | str | None = None) -> list[Accepted]:
    """The entries of the accept file ``find`` finds; none where there is none."""
    path = find(cwd)
    if path is None:
        return []
    key = (str(path.resolve()), path.stat().st_mtime)
    if key not in _cache:
        _cache[key] = read(path)
    return _cache[key]


@functools.lru_cache(maxsize=256)  # a gate asks once a check; git's answer holds for the run
def held_by(entry: Accepted, commit: str | None) -> bool:
    """Whether ``commit`` already holds the accepted change (the entry's commit
    or a descendant of it, by git in the accept file's repository): then the
    change is in both sides of a comparison, and the entry accepts nothing there."""
    if not commit or entry.commit is None:
        return False
    if commit.lower().startswith(entry.commit):
        return True
    done = subprocess.run(["git", "-C", str(Path(entry.file).parent), "merge-base", "--is-ancestor",
                           entry.commit, commit], capture_output=True)
    return done.returncode == 0


def applying(entries: Iterable[Accepted], cell: str | None, metric: str | None,
             commit_a: str | None = None) -> Accepted | None:
    """The entry that accepts a change of ``cell``'s ``metric`` against a side at
    ``commit_a`` (None: unknown); the last matching one, as a later line overrides."""
    found = [e for e in entries if e.matches(cell, metric) and not held_by(e, commit_a)]
    return found[-1] if found else None


def beyond(entry: Accepted, ratio: float, low: float | None, high: float | None) -> bool:
    """Whether the ratio's interval, judged against the accepted ratio, is still a regression."""
    low = ratio if low is None else low
    high = math.inf if high is None else high
    r = entry.ratio
    return classify(low / r, high / r, entry.tolerance, estimate=ratio / r,
                    higher_is_better=entry.metric in HIGHER_IS_BETTER) == "regressed"


def judged(entry: Accepted, ratio: float, low: float | None, high: float | None) -> dict[str, Any]:
    """What a verdict keeps of an accepted change: the entry, and whether the
    change measured is within it; ``line`` says which."""
    within = not beyond(entry, ratio, low, high)
    line = entry.line() if within else (f"beyond the accepted {entry.change()} (±{entry.tolerance:.0%}; "
                                        f"{entry.why}; {entry.where()})")
    return {"within": within, "ratio": entry.ratio, "tolerance": entry.tolerance, "why": entry.why,
            "since": entry.since, "file": entry.file, "entry": entry.index, "line": line}


def accept_verdict(verdict: Any, entries: list[Accepted] | None = None, baseline_commit: str | None = None) -> Any:
    """A regressed check (a ``checks.Verdict`` against a baseline) judged again
    against the baseline times the accepted ratio: a pass saying so, or the
    regression saying it is beyond the accepted one. A baseline recorded at
    ``baseline_commit`` that already holds an entry's change is judged as it
    is, saying why the entry accepts nothing there."""
    if verdict.verdict != "regressed" or verdict.ratio is None:
        return verdict
    try:
        entries = load() if entries is None else entries
    except AcceptError as err:
        return replace(verdict, message=f"{verdict.message}; accepted regressions not read: {err}")
    # an LLM cell's step-time check judges time_per_token: a step_time entry covers it too
    entry = (applying(entries, verdict.cell, verdict.metric, baseline_commit)
             or applying(entries, verdict.cell, verdict.name, baseline_commit))
    if entry is None:
        held = [e for e in entries if (e.matches(verdict.cell, verdict.metric) or e.matches(verdict.cell, verdict.name))
                and held_by(e, baseline_commit)]
        if held:
            return replace(verdict, message=f"{verdict.message}; not accepted: the baseline was recorded at "
                                            f"{baseline_commit[:12]}, which holds the accepted change "
                                            f"({held[-1].change()}, since {held[-1].since}, {held[-1].where()}): "
                                            "this is a further change (remove the entry once every baseline "
                                            "holds it)")
        return verdict
    said = judged(entry, verdict.ratio, verdict.ci_low, verdict.ci_high)
    if not said["within"]:
        return replace(verdict, message=f"{verdict.message}; {said['line']}")
    return replace(verdict, verdict="pass",
                   message=f"{verdict.metric} {said['line']}: judged against the baseline x{entry.ratio:.4g} "
                           f"±{entry.tolerance:.0%}, ratio {verdict.ratio:.4g} "
                           f"({_bound(verdict.ci_low)}-{_bound(verdict.ci_high)}); {verdict.message}")


def _bound(x: float | None) -> str:
    return "inf" if x is None or not math.isfinite(x) else f"{x:.4g}"


def level_starts(entries: Iterable[Accepted], cell: str, metric: str) -> list[Accepted]:
    """The entries naming a commit from which ``cell``'s ``metric`` has a new level."""
    return [e for e in entries if e.matches(cell, metric) and e.commit is not None]
