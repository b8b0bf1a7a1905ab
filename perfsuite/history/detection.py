"""``perfsuite selftest history-detection``: what ``history changes`` finds, on series
built from this machine's own measured launches.

Each series is a nightly history of ``commits`` commits, one run per commit;
a run is R launches of a cell and its value is the median of their launch
floors (fastest steps; or medians, ``--launch-statistic median``), as
``history`` takes it from a run with ``--repeats R``. A launch
is drawn from the launches this machine measured of unchanged code (its real
between-launch noise): the A/B sessions' ``ab.json`` under ``.perfsuite``
(side A, and side B where it ran the same code), else the baselines'
``samples.json`` (per-launch samples), else a baseline's recorded
``launch_spread`` (a normal model of its log s.d.). Runs' results.json
under ``--runs-dir`` with repeated launches come first, those the history
keeps as ``run`` (or would: launched without workload options) unless
``--include`` takes others, as ``history changes`` does. Three figures, each on
``series`` series, detected by the same ``history_changes.find_changes``:

- a 7 % step at the middle commit: found at that very commit (first bad);
- unchanged code: any change point reported (a false alarm);
- a drift of +1 % per commit over the last 10 commits: a regression whose
  first bad commit lies within those 10.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import sqlalchemy as sa

from perfsuite import hardware
from perfsuite.history.changes import DEFAULT_MAX_PVALUE, DEFAULT_WINDOW, find_changes
from perfsuite.history.rows import run_key, run_options
from perfsuite.history.schema import runs
from perfsuite.history.store import History, HistoryError, Point, run_purpose
from perfsuite.judge.spreads import ANY_KIND, parse_spreads
from perfsuite.stats.launches import LAUNCH_STATISTICS

TARGETS = {"step": 19 / 20, "unchanged": 1 / 20, "drift": 16 / 20}
DRIFT_COMMITS = 10
BASE_STEP_S = 0.1
MIN_LAUNCHES = 10  # fewer measured launches than this are no noise model


class NoNoise(Exception):
    """No measured launches, samples or recorded spread to build series from."""


@dataclass
class Noise:
    """Logs of launch floors or medians (``statistic``) over their cell's
    median (``values``), grouped by session; or, from a recorded spread only,
    a normal model (``sd``)."""

    source: str
    statistic: str = "floor"
    values: np.ndarray | None = None
    sessions: list[np.ndarray] = field(default_factory=list)
    sd: float | None = None
    cells: list[str] = field(default_factory=list)
    _within: np.ndarray | None = field(default=None, repr=False)
    _shift_sd: float | None = field(default=None, repr=False)

    def describe(self) -> str:
        if self.values is None:
            return f"{self.source}: normal model, s.d. of logs {self.sd:.1%}"
        arr = self.values
        robust = 1.4826 * float(np.median(np.abs(arr - np.median(arr))))
        text = (f"{self.source}: {arr.size} launches of {', '.join(self.cells[:2])}"
                f"{' ...' if len(self.cells) > 2 else ''}; between-launch s.d. of logs "
                f"{float(np.std(arr, ddof=1)):.1%} (robust {robust:.1%})")
        between = self.session_sd()
        if between is not None:
            text += f", session-to-session {between:.1%} over {len(self.sessions)} sessions"
        return text

    def session_sd(self) -> float | None:
        """One-way random-effects estimate of the sessions' own s.d."""
        groups = [g for g in self.sessions if g.size >= 2]
        if len(groups) < 3:
            return None
        n = np.array([g.size for g in groups], dtype=float)
        total, k = n.sum(), len(groups)
        grand = np.concatenate(groups).mean()
        msb = sum(g.size * (g.mean() - grand) ** 2 for g in groups) / (k - 1)
        msw = sum(((g - g.mean()) ** 2).sum() for g in groups) / (total - k)
        n0 = (total - (n ** 2).sum() / total) / (k - 1)
        return math.sqrt(max(0.0, (msb - msw) / n0))

    def within(self) -> np.ndarray:
        """Launches' deviations from their own session's mean, scaled to the
        s.d. of one launch (k / (k - 1)), over the sessions of 2+ launches."""
        parts = [(g - g.mean()) * math.sqrt(g.size / (g.size - 1)) for g in self.sessions if g.size >= 2]
        return np.concatenate(parts) if parts else np.zeros(0)

    def run_log(self, rng: np.random.Generator, launches: int, by_session: bool) -> float:
        """The log deviation of one run of ``launches`` launches: drawn from
        all launches; or, ``by_session``, a session's own shift (normal, the
        estimated session-to-session s.d.) plus launches drawn from the
        deviations within sessions."""
        if self.values is None:
            return float(np.median(rng.normal(0.0, self.sd, launches)))
        if by_session:
            if self._within is None:
                self._within, self._shift_sd = self.within(), self.session_sd() or 0.0
            shift = rng.normal(0.0, self._shift_sd)
            return shift + float(np.median(rng.choice(self._within, launches)))
        return float(np.median(rng.choice(self.values, launches)))

    def can_split_sessions(self) -> bool:
        return self.values is not None and self.session_sd() is not None and self.within().size >= MIN_LAUNCHES


def _same_code(sides: dict[str, Any]) -> bool:
    """Whether an A/B session's two sides ran the same code and options."""
    keys = ("python", "env", "ref", "commit", "workload_options")
    a, b = sides.get("A") or {}, sides.get("B") or {}
    return all(a.get(k) == b.get(k) for k in keys)


def _sessions(runs_dir: Path, name: str):
    """(session index, path, data) of every readable JSON file ``name`` under
    ``runs_dir``, each one session."""
    files = sorted(runs_dir.rglob(name)) if runs_dir.is_dir() else []
    for session, path in enumerate(files):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            yield session, path, data


def _from_ab(runs_dir: Path, statistic: str) -> Noise | None:
    per_cell: dict[str, list[tuple[int, float]]] = {}
    used = []
    for session, path, data in _sessions(runs_dir, "ab.json"):
        if not str(data.get("schema", "")).startswith("perfsuite.ab"):
            continue
        both = _same_code((data.get("settings") or {}).get("sides") or {})
        for cell in data.get("cells") or []:
            for launch in cell.get("launches") or []:
                samples = [s for s in launch.get("samples") or [] if isinstance(s, (int, float)) and s > 0]
                if launch.get("status") != "ok" or not samples:
                    continue
                if launch.get("side") == "A" or both:
                    value = float(LAUNCH_STATISTICS[statistic](samples))
                    per_cell.setdefault(cell["id"], []).append((session, math.log(value)))
        used.append(path)
    where = sorted({str(p.parent.parent.parent) for p in used})
    return _grouped(per_cell, statistic, f"{len(used)} A/B sessions' ab.json under {', '.join(where[:3])} "
                                         f"(launch {statistic}s; side B only where it ran the same code)")


def _stored_purposes(url: str | None) -> dict[str, str]:
    """run key -> the purpose the history at ``url`` (None: the default
    store) keeps each run with; nothing where there is no store."""
    try:
        with History(url, create=False) as history, history.engine.connect() as conn:
            return dict(conn.execute(sa.select(runs.c.run_key, runs.c.purpose)).all())
    except (HistoryError, sa.exc.SQLAlchemyError):
        return {}


def _purpose_of(path: Path, data: dict[str, Any], stored: dict[str, str]) -> str:
    """A run's purpose: as the history keeps it, else as it would be stored
    (``experiment`` when its cells were launched with workload options)."""
    try:
        key = run_key(data, path.read_bytes())
    except OSError:
        key = None
    return stored.get(key) or run_purpose(run_options(data)).name


def _from_runs(runs_dir: Path, statistic: str, include: tuple[str, ...] = (),
               url: str | None = None) -> Noise | None:
    """Launch floors or medians of cells a run launched several times
    (``perfsuite run --repeats R``, ``--perf-repeats R``): the form a nightly
    run takes, each results.json one session; runs stored with another
    purpose than ``run`` only when ``include`` names it, as ``history
    changes`` takes them."""
    per_cell: dict[str, list[tuple[int, float]]] = {}
    used = []
    stored: dict[str, str] | None = None
    left_out: dict[str, int] = {}
    for session, path, data in _sessions(runs_dir, "results.json"):
        if stored is None:  # opened once, and only where there are runs
            stored = _stored_purposes(url)
        purpose = _purpose_of(path, data, stored)
        if purpose not in ("run", *include):
            left_out[purpose] = left_out.get(purpose, 0) + 1
            continue
        cells = data.get("cells")
        took = False
        for cell in cells if isinstance(cells, list) else []:
            step = (cell.get("metrics") or {}).get("step_time") or {} if cell.get("status") == "ok" else {}
            launched = [m for m in step.get(f"launch_{statistic}s") or [] if isinstance(m, (int, float)) and m > 0]
            if len(launched) >= 2:
                per_cell.setdefault(cell["id"], []).extend((session, math.log(m)) for m in launched)
                took = True
        if took:
            used.append(path)
    where = sorted({str(p.parent.parent) for p in used})
    skipped = "".join(f"; {n} {purpose} run(s) left out" for purpose, n in sorted(left_out.items()))
    return _grouped(per_cell, statistic, f"{len(used)} runs' results.json under {', '.join(where[:3])} "
                                         f"(launch {statistic}s of cells launched 2+ times{skipped})")


def _grouped(per_cell: dict[str, list[tuple[int, float]]], statistic: str, source: str) -> Noise | None:
    """Logs centred on their cell's median, grouped by (cell, session)."""
    if sum(len(v) for v in per_cell.values()) < MIN_LAUNCHES:
        return None
    values, sessions = [], {}
    for cell_id, rows in per_cell.items():
        centre = float(np.median([v for _, v in rows]))
        for session, v in rows:
            values.append(v - centre)
            sessions.setdefault((cell_id, session), []).append(v - centre)
    return Noise(source=source, statistic=statistic, values=np.array(values),
                 sessions=[np.array(s) for s in sessions.values()], cells=sorted(per_cell))


def _this_profile() -> str | None:
    try:
        return hardware.profile_id(hardware.fingerprint())
    except Exception:  # no torch, no machine facts: take every profile
        return None


def _profile_dirs(baselines: Path) -> list[Path]:
    dirs = sorted(p for p in baselines.iterdir() if p.is_dir()) if baselines.is_dir() else []
    mine = _this_profile() if dirs else None
    return [p for p in dirs if p.name == mine] or dirs


def _from_samples(baselines: Path, statistic: str) -> Noise | None:
    values, cells, used = [], [], []
    for folder in _profile_dirs(baselines):
        try:
            data = json.loads((folder / "samples.json").read_text())
        except (OSError, ValueError):
            continue
        for key, launches in data.items():
            if not key.endswith(":step_time") or not isinstance(launches, list):
                continue
            logs = [math.log(float(LAUNCH_STATISTICS[statistic](s))) for s in launches
                    if isinstance(s, list) and s and min(s) > 0]
            if len(logs) < 2:
                continue
            # Deviations from the cell's mean, scaled to the s.d. of one launch.
            k, mean = len(logs), float(np.mean(logs))
            dev = [(v - mean) * math.sqrt(k / (k - 1)) for v in logs]
            values += dev  # centred per cell: no session shifts left to estimate
            cells.append(f"{folder.name}:{key.rsplit(':', 1)[0]}")
        used.append(folder.name)
    if len(values) < MIN_LAUNCHES:
        return None
    return Noise(source=f"baselines' samples.json ({', '.join(used)}; launch {statistic}s as deviations "
                        "from their cell's mean)", statistic=statistic, values=np.array(values), cells=cells)


def _from_spread(baselines: Path, statistic: str) -> Noise | None:
    best = None
    for folder in _profile_dirs(baselines):
        try:
            spreads = parse_spreads(json.loads((folder / "profile.json").read_text()).get("launch_spread"),
                                    tuple(LAUNCH_STATISTICS))
        except (OSError, ValueError):
            continue
        for kind, entries in spreads.items():  # the best measured kind
            entry = entries.get(statistic)
            if entry and entry.log_sd and (best is None or entry.dof > best[2].dof):
                best = (folder.name, kind, entry)
    if best is None:
        return None
    kind = "" if best[1] == ANY_KIND else f"{best[1]} "
    return Noise(source=f"the launch_spread of {kind}launch {statistic}s recorded in baselines/{best[0]}/"
                        f"profile.json (dof {best[2].dof})", statistic=statistic, sd=float(best[2].log_sd))


def load_noise(runs_dir: Path | str = ".perfsuite", baselines: Path | str = "baselines",
               statistic: str = "floor", *, include: tuple[str, ...] = (), url: str | None = None) -> Noise:
    """This machine's between-launch noise of launch floors (or medians),
    from the best source there is. Runs' results.json count when the
    history at ``url`` (None: the default store) keeps them as ``run``, or
    with a purpose in ``include``."""
    for source in (lambda: _from_runs(Path(runs_dir), statistic, tuple(include), url),
                   lambda: _from_ab(Path(runs_dir), statistic),
                   lambda: _from_samples(Path(baselines), statistic),
                   lambda: _from_spread(Path(baselines), statistic)):
        noise = source()
        if noise is not None:
            return noise
    raise NoNoise(f"no measured launches: no results.json of repeated launches and no ab.json with "
                  f"{MIN_LAUNCHES}+ launches under {runs_dir}, "
                  f"no samples.json or launch_spread under {baselines}; run `perfsuite selftest verdict-detection --ab` "
                  "or `perfsuite run CELL --repeats 16`, or record a baseline with --perf-repeats 2 first")


def _points(noise: Noise, rng: np.random.Generator, effects: list[float], launches: int,
            by_session: bool) -> list[Point]:
    return [Point(commit=f"c{i:03d}", branch="main", time=float(i), profile="bench",
                  values=[BASE_STEP_S * math.exp(noise.run_log(rng, launches, by_session)) * effect],
                  unit="s", launches=launches)
            for i, effect in enumerate(effects)]


def figures(noise: Noise, *, series: int = 20, launches: int = 16, commits: int = 30,
            step: float = 0.07, drift: float = 0.01, seed: int = 20261124, by_session: bool = False,
            max_pvalue: float = DEFAULT_MAX_PVALUE) -> dict[str, Any]:
    """Counts of the three figures over ``series`` series each."""
    rng = np.random.default_rng([seed, launches])
    by_session = by_session and noise.can_split_sessions()
    at = commits // 2
    drift_from = commits - DRIFT_COMMITS
    shapes = {"step": [1.0] * at + [1.0 + step] * (commits - at),
              "unchanged": [1.0] * commits,
              "drift": [1.0] * drift_from + [(1.0 + drift) ** (i + 1) for i in range(DRIFT_COMMITS)]}
    counts = {"step": 0, "step_near": 0, "unchanged": 0, "drift": 0}
    for _ in range(series):
        found = {name: find_changes(_points(noise, rng, effects, launches, by_session),
                                    max_pvalue=max_pvalue)
                 for name, effects in shapes.items()}
        regressions = {name: [c.index for c in changes if c.direction == "regressed"]
                       for name, changes in found.items()}
        counts["step"] += at in regressions["step"]
        counts["step_near"] += any(abs(i - at) <= 1 for i in regressions["step"])
        counts["unchanged"] += bool(found["unchanged"])
        counts["drift"] += any(drift_from <= i < commits for i in regressions["drift"])
    return {"launches": launches, "series": series, "commits": commits, "step_at": at, **counts}


def _meets(counts: dict[str, Any]) -> dict[str, bool]:
    n = counts["series"]
    return {"step": counts["step"] >= math.ceil(TARGETS["step"] * n - 1e-9),
            "unchanged": counts["unchanged"] <= math.floor(TARGETS["unchanged"] * n + 1e-9),
            "drift": counts["drift"] >= math.ceil(TARGETS["drift"] * n - 1e-9)}


def run(noise: Noise, *, series: int = 20, launches: list[int] | None = None, commits: int = 30,
        step: float = 0.07, drift: float = 0.01, seed: int = 20261124, by_session: bool = False,
        max_pvalue: float = DEFAULT_MAX_PVALUE, out: Any = None) -> int:
    """Print the figures for each number of launches per run; exit status 0."""
    import sys

    out = out or sys.stdout
    launches = launches or [1, 4, 16, 32, 64]
    if by_session and not noise.can_split_sessions():
        by_session = False
        print("(--by-session: too few sessions in this noise source; launches drawn from all)", file=out)
    print(f"history detection: noise from {noise.describe()}", file=out)
    drawn = ("a session's shift plus R launches drawn from the deviations within sessions" if by_session
             else "R launches drawn from all launches")
    print(f"{series} series per figure, {commits} commits each, one run per commit: {drawn} (its value: "
          f"the median of its launch {noise.statistic}s); Apache Otava E-Divisive, p <= {max_pvalue:g}, windows of "
          f"{DEFAULT_WINDOW}", file=out)
    n = series
    print(f"{'R':>3}  {f'{step:.0%} step at its commit':>24}  {'(within 1)':>10}  "
          f"{'unchanged: a change':>20}  {f'{drift:.0%}/commit drift found':>24}  {'time':>6}", file=out)
    for r in launches:
        started = time.perf_counter()
        counts = figures(noise, series=series, launches=r, commits=commits, step=step, drift=drift,
                         seed=seed, by_session=by_session, max_pvalue=max_pvalue)
        ok = _meets(counts)
        mark = {k: "ok" if v else "MISS" for k, v in ok.items()}
        print(f"{r:>3}  {counts['step']:>15}/{n} {mark['step']:>4}  {counts['step_near']:>7}/{n}  "
              f"{counts['unchanged']:>11}/{n} {mark['unchanged']:>4}  {counts['drift']:>15}/{n} "
              f"{mark['drift']:>4}  {time.perf_counter() - started:5.1f}s", file=out)
    print(f"targets: step found at its commit >= {math.ceil(TARGETS['step'] * n - 1e-9)}/{n}, unchanged "
          f"code a change <= {math.floor(TARGETS['unchanged'] * n + 1e-9)}/{n}, drift found within its "
          f"{DRIFT_COMMITS} commits >= {math.ceil(TARGETS['drift'] * n - 1e-9)}/{n}", file=out)
    return 0
