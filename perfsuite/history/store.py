"""The history of runs per commit: the store, and the series read from it.

A gate (``perfsuite compare``, ``perfsuite ab``) judges two versions; a
nightly run on main needs the other half: every run kept with its commit,
so that a slow drift is found and the commit that caused a step is named.

Store: SQLAlchemy Core over any database URL (its tables, versions and
migrations: ``perfsuite.history.schema``). The default is an SQLite file,
``.perfsuite/history.sqlite`` (embedded, nothing to start); a team shares
one history through a PostgreSQL URL. Each run keeps its commit, branch,
time, hardware profile id and fingerprint, software versions, and per cell
every metric with its samples' summary (median, n, IQR, min) and its launch
medians and floors where the cell was launched more than once, the work
counters per step, and the checks' verdicts (read from results.json by
``perfsuite.history.rows``). A run is stored once (its key: a hash of
``run.started`` and the cell ids); a run that has not finished is refused.

Nothing measured is dropped, but each run is stored with its purpose
(``run_purpose``): ``run``, ``experiment`` or ``ad-hoc``; the series read
``run`` only unless asked for more (``include``).

The change points in a series: ``perfsuite.history.changes``.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import numpy as np
import sqlalchemy as sa

from perfsuite.hardware import profile_id
from perfsuite.history.errors import HistoryError, NotMigrated, StoreNotWritten
from perfsuite.history.marks import Added, Marked, kept, mark_runs
from perfsuite.history.purpose import Purpose, left_out_line, parse_include, run_purpose, store_named  # noqa: F401 - the store's face
from perfsuite.history.rows import (
    DEFAULT_LAUNCH_STATISTIC,
    finite_number,
    json_safe,
    read_finished,
    rows_of_cells,
    run_env,
    run_key,
    run_options,
    run_value,
    software_versions,
)
from perfsuite.history.schema import (
    DEFAULT_PURPOSE,
    cells,
    check_usable,
    history_off,
    metrics,
    migrated_copy,
    open_engine,
    resolve_url,
    runs,
    set_up_layout,
    shown_url,
    sqlite_file,
)

DEFAULT_METRIC = "step_time"


def _text(path: Path) -> str:
    """A path as text a database can hold: a name that is not UTF-8 (byte 0xfe
    in a folder's name) is kept with that byte written as ``\\xfe``."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


class History:
    """A history store at ``url`` (see ``resolve_url``); its layout is
    created or migrated when it is opened. ``create=False`` refuses an SQLite
    file that is not there instead of creating it (the commands that read).
    ``read_only`` (default: ``not create``): an older layout that cannot be
    migrated in place (a read-only file or folder, a full disk) is read from a
    copy migrated in memory, the store left as it is."""

    def __init__(self, url: str | os.PathLike | None = None, *, create: bool = True,
                 read_only: bool | None = None) -> None:
        self.url = resolve_url(url)
        sqlite_path = sqlite_file(self.url)
        if not create and sqlite_path is not None and not sqlite_path.exists():
            raise HistoryError(f"no history at {sqlite_path}: `perfsuite history add RUN_DIR` "
                               "stores a run first (or pass --history)")
        shown = shown_url(self.url)
        try:
            self.engine = open_engine(self.url)
            self.version = set_up_layout(self.engine, self.url)
        except NotMigrated as err:
            self.engine.dispose()
            if not (create is False if read_only is None else read_only):
                raise NotMigrated(f"{err}; make it writable, or give --history another store") from None
            if sqlite_path is None:
                raise NotMigrated(f"{err}; run any `perfsuite history` command on it once as a user who "
                                  "may write it, which migrates it") from None
            self.engine, self.version = migrated_copy(sqlite_path, self.url)
        except sa.exc.SQLAlchemyError as err:
            raise StoreNotWritten(f"history {shown}: {_first_line(err)}") from err
        except ModuleNotFoundError as err:
            raise HistoryError(f"history {shown}: its database driver is not installed ({err.name})") from err
        except OSError as err:  # its folder could not be made after all
            raise StoreNotWritten(f"history {shown}: cannot make it ({err.strerror or err})") from err

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> History:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ adding

    def add_run(self, results_path: Path | str, *, commit: str | None = None,
                branch: str | None = None, cwd: Path | str | None = None,
                purpose: Purpose | str | None = None,
                options: Mapping[str, Any] | None = None) -> Added:
        """Store a finished run's results.json (or its directory). The commit
        and branch default to ``git rev-parse`` in ``cwd`` (the current
        directory), the commit then to the one the run's env names.
        ``options``: the workload options it was launched with (default: as
        its cells' launch commands name them); ``purpose``: a ``Purpose``, or
        a name asked for (``run_purpose(declared=...)``), else derived from the
        options. A run already stored is kept once (``Added.new`` False); a
        purpose asked for then re-marks it."""
        data, raw = read_finished(results_path)
        key = run_key(data, raw)
        options = dict(options) if options is not None else run_options(data)
        if not isinstance(purpose, Purpose):
            purpose = run_purpose(options, declared=purpose)
        env = run_env(data)
        commit = commit or git_commit(cwd) or env.get("commit")
        if not commit:
            raise HistoryError(f"{results_path}: no commit: not in a git checkout and the run's env "
                               "names none; pass --commit SHA")
        branch = branch or git_branch(cwd)
        profile = profile_id(env)
        run_row = {"run_key": key, "commit_sha": commit, "branch": branch,
                   "started": finite_number((data.get("run") or {}).get("started")),
                   "finished": finite_number((data.get("run") or {}).get("finished")),
                   "added": time.time(), "profile": profile, "fingerprint": json_safe(env),
                   "software": software_versions(env), "source": _text(Path(results_path).resolve()),
                   "purpose": purpose.name, "options": json_safe(options)}
        cell_rows, metric_rows = rows_of_cells(data["cells"])
        added = Added(run_key=key, commit=commit, branch=branch, profile=profile,
                      cells=len(cell_rows), url=shown_url(self.url), purpose=purpose.name, why=purpose.why)
        try:
            with self.engine.begin() as conn:
                existing = conn.execute(sa.select(runs.c.id, runs.c.commit_sha, runs.c.purpose)
                                        .where(runs.c.run_key == key)).first()
                if existing is not None:
                    if purpose.declared and existing[2] != purpose.name:
                        conn.execute(runs.update().where(runs.c.id == existing[0]).values(purpose=purpose.name))
                        added.earlier_purpose = existing[2]
                        return kept(added, existing, purpose.name)
                    return kept(added, existing)
                run_id = conn.execute(runs.insert().values(**run_row)).inserted_primary_key[0]
                if cell_rows:
                    conn.execute(cells.insert(), [{**r, "run_id": run_id} for r in cell_rows])
                if metric_rows:
                    conn.execute(metrics.insert(), [{**r, "run_id": run_id} for r in metric_rows])
                added.run_id = run_id
                return added
        except sa.exc.IntegrityError as err:  # another job stored the same run a moment before
            with self.engine.connect() as conn:
                existing = conn.execute(sa.select(runs.c.id, runs.c.commit_sha, runs.c.purpose)
                                        .where(runs.c.run_key == key)).first()
            if existing is None:  # not a race: a row of this run refused (a cell id twice)
                raise HistoryError(f"history {shown_url(self.url)}: cannot store {results_path}: "
                                   f"{_first_line(err)}") from None
            return kept(added, existing)
        except sa.exc.SQLAlchemyError as err:
            raise StoreNotWritten(f"history {shown_url(self.url)}: cannot store {results_path}: "
                                  f"{_first_line(err)}") from err

    def mark(self, selector: str, purpose: str) -> list[Marked]:
        """Re-mark the stored runs ``selector`` names (``marks.mark_runs``)."""
        return mark_runs(self, [selector], purpose)

    # ------------------------------------------------------------------ reading

    def all_runs(self) -> list[dict[str, Any]]:
        """Every stored run, oldest first (the run rows as dicts)."""
        with self._reading() as conn:
            rows = conn.execute(sa.select(runs).order_by(runs.c.started, runs.c.id)).mappings().all()
        return [dict(r) for r in rows]

    def cell_ids(self) -> list[str]:
        with self._reading() as conn:
            return sorted(r[0] for r in conn.execute(sa.select(metrics.c.cell).distinct()))

    def branches(self) -> dict[str | None, int]:
        """How many runs each branch holds (None: runs stored without one)."""
        with self._reading() as conn:
            query = sa.select(runs.c.branch, sa.func.count()).group_by(runs.c.branch)
            return {branch: count for branch, count in conn.execute(query)}

    def metric_names(self) -> list[str]:
        """The metrics stored of any run, sorted."""
        with self._reading() as conn:
            return sorted(r[0] for r in conn.execute(sa.select(metrics.c.metric).distinct()))

    @contextmanager
    def _reading(self) -> Iterator[sa.Connection]:
        """A connection whose failures (a table dropped, a server gone) are
        HistoryError with the store's URL: a sentence, never a traceback."""
        try:
            with self.engine.connect() as conn:
                yield conn
        except sa.exc.SQLAlchemyError as err:
            raise HistoryError(f"history {shown_url(self.url)}: cannot read it ({_first_line(err)})") from None

    def series(self, *, cell: str | None = None, metric: str = DEFAULT_METRIC,
               since: str | None = None, branch: str | None = None,
               cwd: Path | str | None = None,
               launch_statistic: str = DEFAULT_LAUNCH_STATISTIC,
               include: tuple[str, ...] | list[str] = ()) -> dict[tuple[str, str, str], list[Point]]:
        """Per (cell, metric, profile): one point per commit, in the order the
        commits were first measured; cells that did not finish ok are left out,
        and so are runs of another purpose than ``run`` unless ``include``
        names it (``experiment``, ``ad-hoc``).
        ``cell`` is an id or a glob (``smoke/image/*``); ``since`` a commit
        (a prefix, or a ref git resolves) or a date (2026-11-24): only runs
        from it on count. A step time's point takes each launch's
        ``launch_statistic``, its median or its floor (``run_value``; the
        default: ``perfsuite.options.DEFAULT_LAUNCH_STATISTIC``)."""
        query = (sa.select(runs.c.id, runs.c.commit_sha, runs.c.branch, runs.c.started, runs.c.added,
                           runs.c.profile, runs.c.purpose, metrics.c.cell, metrics.c.metric, metrics.c.unit,
                           metrics.c.value, metrics.c.n, metrics.c.min, metrics.c.launches,
                           cells.c.counters)
                 .where(runs.c.purpose.in_(_taken(include)))
                 .order_by(sa.func.coalesce(runs.c.started, runs.c.added), runs.c.id))
        grouped: dict[tuple[str, str, str], dict[str, Point]] = {}
        for row in self._matching(query, cell, metric, since, branch, cwd):
            value = run_value(row["value"], row["launches"], metric=metric, statistic=launch_statistic,
                              minimum=row["min"])
            if value is None:
                continue
            key = (row["cell"], row["metric"], row["profile"])
            points = grouped.setdefault(key, {})
            point = points.get(row["commit_sha"])
            if point is None:
                points[row["commit_sha"]] = Point(
                    commit=row["commit_sha"], branch=row["branch"],
                    time=row["started"] if row["started"] is not None else row["added"],
                    profile=row["profile"], values=[value], unit=row["unit"],
                    launches=len((row["launches"] or {}).get("medians") or []) or 1,
                    counters=row["counters"], run_ids=[row["id"]], purposes=[row["purpose"]])
            else:  # the same commit measured again: one point, its runs' median
                point.values.append(value)
                point.launches += len((row["launches"] or {}).get("medians") or []) or 1
                point.counters = row["counters"] or point.counters
                point.run_ids.append(row["id"])
                point.purposes.append(row["purpose"])
        return {key: list(points.values()) for key, points in sorted(grouped.items())}

    def left_out(self, *, cell: str | None = None, metric: str = DEFAULT_METRIC,
                 since: str | None = None, branch: str | None = None, cwd: Path | str | None = None,
                 include: tuple[str, ...] | list[str] = ()) -> dict[str, int]:
        """How many runs ``series`` with the same arguments leaves out for
        their purpose: {purpose: runs}, none for none."""
        query = (sa.select(runs.c.id, runs.c.purpose, metrics.c.cell)
                 .where(runs.c.purpose.not_in(_taken(include))))
        seen: dict[str, set[int]] = {}
        for row in self._matching(query, cell, metric, since, branch, cwd):
            seen.setdefault(row["purpose"], set()).add(row["id"])
        return {purpose: len(ids) for purpose, ids in sorted(seen.items())}

    def _matching(self, query: Any, cell: str | None, metric: str, since: str | None,
                  branch: str | None, cwd: Path | str | None) -> list[Any]:
        """The rows of ``query`` (over runs, joined here to their metrics and
        cells) of cells that finished ok, of ``metric``, matching ``cell``
        (an id or a glob), from ``since`` on, of ``branch``."""
        query = (query.join(metrics, metrics.c.run_id == runs.c.id)
                 .join(cells, sa.and_(cells.c.run_id == metrics.c.run_id, cells.c.cell == metrics.c.cell))
                 .where(cells.c.status == "ok", metrics.c.metric == metric))
        if branch:
            query = query.where(runs.c.branch == branch)
        if cell and not _is_glob(cell):
            query = query.where(metrics.c.cell == cell)
        start = self._since(since, cwd) if since else None
        if start is not None:
            query = query.where(sa.func.coalesce(runs.c.started, runs.c.added) >= start)
        with self._reading() as conn:
            rows = conn.execute(query).mappings().all()
        return [row for row in rows if not (cell and _is_glob(cell) and not fnmatchcase(row["cell"], cell))]

    def _since(self, ref: str, cwd: Path | str | None) -> float:
        """The time a --since REF starts at."""
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}([T ][\d:.]+)?([+-]\d{2}:?\d{2}|Z)?", ref):
            try:
                moment = datetime.fromisoformat(ref.replace("Z", "+00:00"))
            except ValueError as err:  # 2026-13-45: shaped like a date, but none
                raise HistoryError(f"--since {ref}: not a date ({err}); give a date YYYY-MM-DD, "
                                   "or a commit") from None
            if moment.tzinfo is None:
                moment = moment.astimezone()  # local time, as a person types it
            return moment.timestamp()
        candidates = [ref.lower()]
        resolved = _git(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], cwd)
        if resolved:
            candidates.append(resolved.lower())
        first = sa.func.min(sa.func.coalesce(runs.c.started, runs.c.added))
        with self._reading() as conn:
            for candidate in candidates:
                pattern = candidate.replace("%", "").replace("_", "") + "%"
                found = conn.execute(sa.select(first).where(sa.func.lower(runs.c.commit_sha).like(pattern))).scalar()
                if found is not None:
                    return float(found)
        raise HistoryError(f"--since {ref}: no stored run of that commit (a commit or its prefix, "
                           "a ref git resolves here, or a date YYYY-MM-DD)")


def _taken(include: tuple[str, ...] | list[str]) -> list[str]:
    """The purposes a reader takes: ``run`` and those it was asked to include."""
    return [DEFAULT_PURPOSE, *(p for p in include if p != DEFAULT_PURPOSE)]


@dataclass
class Point:
    """One commit of a series: its runs' value (the median of them when it
    was measured more than once) and the newest run's work counters."""

    commit: str
    branch: str | None
    time: float | None
    profile: str
    values: list[float]
    unit: str | None = None
    launches: int = 1
    counters: Mapping[str, Any] | None = None
    run_ids: list[int] = field(default_factory=list)
    purposes: list[str] = field(default_factory=list)  # each run's, as run_ids

    @property
    def value(self) -> float:
        return float(np.median(self.values))


# ------------------------------------------------------------------------- git

def _git(args: list[str], cwd: Path | str | None) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10,
                             cwd=cwd or Path.cwd())
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def git_commit(cwd: Path | str | None = None) -> str | None:
    return _git(["rev-parse", "HEAD"], cwd)


def git_branch(cwd: Path | str | None = None) -> str | None:
    """The checked-out branch; None on a detached HEAD (CI's checkouts)."""
    name = _git(["rev-parse", "--abbrev-ref", "HEAD"], cwd)
    return None if name in (None, "HEAD") else name


# ------------------------------------------------------------------------- the runners' hook

def record_run_in_history(results_path: Path | str, url: str | os.PathLike | None,
                          commit: str | None = None, branch: str | None = None, *,
                          purpose: Purpose | str | None = None,
                          options: Mapping[str, Any] | None = None) -> str:
    """Store a finished run in the history at ``url`` (None: $PERFSUITE_HISTORY,
    else the default SQLite file) and return the line to print, which says
    the purpose it was stored with (``run_purpose``; default: derived from
    ``options``, else from its cells' launch commands). The pytest plugin
    (``--perf-history URL``) and ``perfsuite run --history URL`` call it once
    the run's results.json is complete. Raises HistoryError with the reason
    when the run is refused (unfinished, no commit) or the store cannot be
    written."""
    with History(url) as history:
        return history.add_run(results_path, commit=commit, branch=branch, purpose=purpose,
                               options=options).describe()


def not_written_line(why: str, run_dir: Path, url: str | os.PathLike | None, commit: str | None,
                     branch: str | None, purpose: Purpose | None) -> str:
    """The line a runner prints when its finished run could not be written
    to the history (``why``: a full disk, a read-only store): what is kept,
    and the ``perfsuite history add`` command that stores the run later."""
    import shlex

    argv = ["perfsuite", "history", "add", _text(run_dir)]
    argv += ["--commit", commit] if commit else []
    argv += ["--branch", branch] if branch else []
    argv += ["--history", str(url)] if url is not None and str(url) != "" else []
    argv += ["--history-purpose", purpose.name] if purpose is not None and purpose.name != DEFAULT_PURPOSE else []
    return (f"history: not written: {why}; results.json and the report are kept: `{shlex.join(argv)}` "
            "adds the run once the store can be written")


def check_store_usable(url: str | os.PathLike | None) -> str | None:
    """Whether a run can be added to the history at ``url`` (as
    ``record_run_in_history`` takes it; "off": none), checked before a
    session's first launch and writing nothing: its shown URL (None for
    "off"), or HistoryError with the sentence (an unknown database kind, a
    driver not installed, a file that cannot be made or written, a database
    not perfsuite's). ``perfsuite run`` and ``perfsuite doctor`` call it."""
    if history_off(url):
        return None
    resolved = resolve_url(url)
    check_usable(resolved)
    return shown_url(resolved)


def _is_glob(pattern: str) -> bool:
    return any(ch in pattern for ch in "*?[")


def _first_line(err: BaseException) -> str:
    text = str(getattr(err, "orig", None) or err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def when(timestamp: float | None) -> str:
    if timestamp is None:
        return "-"
    return datetime.fromtimestamp(timestamp, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
