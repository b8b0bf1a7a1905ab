"""The history of runs per commit, and the change points in it.

A gate (``perfsuite compare``, ``perfsuite ab``) judges two versions; a
nightly run on main needs the other half: every run kept with its commit,
so that a slow drift is found and the commit that caused a step is named.

Store: SQLAlchemy Core over any database URL. The default is an SQLite file,
``.perfsuite/history.sqlite`` (embedded, nothing to start); a team shares
one history through a PostgreSQL URL. Each run keeps its commit, branch,
time, hardware profile id and fingerprint, software versions, and per cell
every metric with its samples' summary (median, n, IQR, min) and its launch
medians and floors where the cell was launched more than once, the work
counters per step, and the checks' verdicts. A run is stored once (its key:
a hash of ``run.started`` and the cell ids); a run that has not finished is
refused. The layout is versioned (table ``meta``, ``schema_version``) and
older layouts are migrated on open (``MIGRATIONS``).

Change points: per cell, metric and hardware profile (another profile
starts another series), one point per commit in the order the commits were
first measured, found by Apache Otava's E-Divisive implementation
(``otava.analysis.compute_change_points``: E-Divisive candidates, Student's
t-test significance, Hunter's split/merge). Each change is told with the
last good and first bad commit, its size as a Hodges-Lehmann ratio of the
segments' values with its Mann-Whitney interval (``stats.shift_ratio_interval``)
and what the work counters of the two runs say (``counters.diff``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import numpy as np
import sqlalchemy as sa
from sqlalchemy import event

SCHEMA_VERSION = 1
DEFAULT_PATH = Path(".perfsuite") / "history.sqlite"
BUSY_TIMEOUT_S = 60.0  # SQLite: how long a writer waits for another's transaction
_PG_LOCK_KEY = 0x70657266  # PostgreSQL advisory lock: one schema set-up at a time
# The software a run is measured with: kept apart from the machine's fingerprint.
SOFTWARE_KEYS = ("python", "torch", "torchvision", "torchtune", "torchao", "perfsuite", "cuda",
                 "cudnn", "nccl", "driver", "driver_cuda", "platform")
DEFAULT_METRIC = "step_time"
# Otava defaults to p 0.001 and windows of 50 commits. Measured by `perfsuite
# history detection` (200 series): 0.001 called a change in 4-6 % of unchanged
# 30-commit series, 0.0001 in 1-2 % with the same power from 16 launches a
# run; windows of 20 keep a step and its fix 10 commits later apart (with
# windows of 30 or 50 and p 0.0001, neither was found in 50/50 series).
DEFAULT_MAX_PVALUE = 0.0001
DEFAULT_WINDOW = 20


class HistoryError(RuntimeError):
    """A run refused (unfinished, no commit, not a results.json) or a store
    that cannot be opened or written; the message says why."""


# --------------------------------------------------------------------------- the store

metadata = sa.MetaData()

meta = sa.Table(
    "meta", metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.String(255), nullable=False),
)

runs = sa.Table(
    "runs", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("run_key", sa.String(64), nullable=False, unique=True),
    sa.Column("commit_sha", sa.String(64), nullable=False),
    sa.Column("branch", sa.String(255)),
    sa.Column("started", sa.Float),  # run.started of results.json (epoch seconds)
    sa.Column("finished", sa.Float),
    sa.Column("added", sa.Float, nullable=False),
    sa.Column("profile", sa.String(255), nullable=False),
    sa.Column("fingerprint", sa.JSON),
    sa.Column("software", sa.JSON),
    sa.Column("source", sa.Text),  # where results.json was read from
)

cells = sa.Table(
    "cells", metadata,
    sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("cell", sa.String(512), primary_key=True),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("reason", sa.Text),
    sa.Column("repeats", sa.Integer),
    sa.Column("counters", sa.JSON),  # {"per_step": {...}, "unstable": [...], ...}
    sa.Column("verdicts", sa.JSON),  # [{"name", "verdict", "metric", "message"}, ...]
)

metrics = sa.Table(
    "metrics", metadata,
    sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("cell", sa.String(512), primary_key=True),
    sa.Column("metric", sa.String(128), primary_key=True),
    sa.Column("unit", sa.String(32)),
    sa.Column("value", sa.Float),
    sa.Column("median", sa.Float),
    sa.Column("n", sa.Integer),
    sa.Column("iqr", sa.Float),
    sa.Column("min", sa.Float),
    sa.Column("launches", sa.JSON),  # {"medians": [...], "floors": [...]} with --repeats
)

sa.Index("ix_runs_profile_started", runs.c.profile, runs.c.started)
sa.Index("ix_metrics_cell_metric", metrics.c.cell, metrics.c.metric)


def _add_column(conn: sa.Connection, table: str, column: sa.Column) -> None:
    kind = column.type.compile(dialect=conn.dialect)
    name = conn.dialect.identifier_preparer.quote(column.name)
    conn.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")


def _migrate_0_to_1(conn: sa.Connection) -> None:
    """Version 0, the layout before versioning: runs, cells and metrics, no
    ``meta`` table, runs without ``branch`` and ``software``, metrics without
    ``launches``. The software versions are filled in from the fingerprint."""
    meta.create(conn, checkfirst=True)
    have = {c["name"] for c in sa.inspect(conn).get_columns("runs")}
    for column in (sa.Column("branch", sa.String(255)), sa.Column("software", sa.JSON)):
        if column.name not in have:
            _add_column(conn, "runs", column)
    if "launches" not in {c["name"] for c in sa.inspect(conn).get_columns("metrics")}:
        _add_column(conn, "metrics", sa.Column("launches", sa.JSON))
    for run_id, fingerprint in conn.execute(sa.select(runs.c.id, runs.c.fingerprint)).all():
        conn.execute(runs.update().where(runs.c.id == run_id)
                     .values(software=software_versions(fingerprint or {})))


# Version -> the function that brings a store of that version to the next.
MIGRATIONS: dict[int, Callable[[sa.Connection], None]] = {0: _migrate_0_to_1}


def resolve_url(url: str | os.PathLike | None) -> str:
    """A database URL: None for ``.perfsuite/history.sqlite`` under the
    current directory, a file path for an SQLite file, or any SQLAlchemy URL
    (``postgresql://user@host/db``; psycopg 3 serves it where psycopg2 is not
    installed)."""
    if url is None or str(url) == "":
        url = DEFAULT_PATH
    text = str(url)
    if "://" not in text:
        return f"sqlite:///{Path(text).expanduser().resolve()}"
    if text.startswith(("postgresql://", "postgres://")):
        try:
            import psycopg2  # noqa: F401
        except ImportError:
            text = "postgresql+psycopg://" + text.split("://", 1)[1]
    return text


def _shown(url: str) -> str:
    """The URL with its password hidden, for messages."""
    try:
        return sa.make_url(url).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        return url


def _sqlite_file(url: str) -> Path | None:
    parsed = sa.make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def _engine(url: str) -> sa.Engine:
    sqlite_file = _sqlite_file(url)
    if sqlite_file is None:
        return sa.create_engine(url, pool_pre_ping=True)
    sqlite_file.parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_S})

    # pysqlite's own transaction handling begins late and deferred: two
    # writers then fail at once ("database is locked") instead of waiting.
    # Every transaction here begins IMMEDIATE and waits up to the busy timeout.
    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def _stored_version(conn: sa.Connection) -> int | None:
    """The store's layout version; None for an empty database."""
    names = set(sa.inspect(conn).get_table_names())
    if "meta" in names:
        row = conn.execute(sa.select(meta.c.value).where(meta.c.key == "schema_version")).first()
        if row is not None:
            return int(row[0])
    if "runs" in names:
        return 0
    return None


def _set_version(conn: sa.Connection, version: int) -> None:
    done = conn.execute(meta.update().where(meta.c.key == "schema_version").values(value=str(version)))
    if done.rowcount == 0:
        conn.execute(meta.insert().values(key="schema_version", value=str(version)))


class History:
    """A history store at ``url`` (see ``resolve_url``); its layout is
    created or migrated when it is opened. ``create=False`` refuses an SQLite
    file that is not there instead of creating it (the commands that read)."""

    def __init__(self, url: str | os.PathLike | None = None, *, create: bool = True) -> None:
        self.url = resolve_url(url)
        sqlite_file = _sqlite_file(self.url)
        if not create and sqlite_file is not None and not sqlite_file.exists():
            raise HistoryError(f"no history at {sqlite_file}: `perfsuite history add RUN_DIR` "
                               "stores a run first (or pass --url)")
        try:
            self.engine = _engine(self.url)
            self.version = self._set_up()
        except sa.exc.SQLAlchemyError as err:
            raise HistoryError(f"history {_shown(self.url)}: {_first_line(err)}") from err
        except ModuleNotFoundError as err:
            raise HistoryError(f"history {_shown(self.url)}: its database driver is not installed "
                               f"({err.name})") from err

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> History:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _set_up(self) -> int:
        with self.engine.begin() as conn:
            if conn.dialect.name == "postgresql":  # two jobs creating the tables at once
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})
            version = _stored_version(conn)
            if version is None:
                metadata.create_all(conn)
                _set_version(conn, SCHEMA_VERSION)
                return SCHEMA_VERSION
            if version > SCHEMA_VERSION:
                raise HistoryError(f"history {_shown(self.url)} has layout version {version}, newer "
                                   f"than this perfsuite reads ({SCHEMA_VERSION}): upgrade perfsuite")
            while version < SCHEMA_VERSION:
                MIGRATIONS[version](conn)
                version += 1
                _set_version(conn, version)
            return version

    # ------------------------------------------------------------------ adding

    def add_run(self, results_path: Path | str, *, commit: str | None = None,
                branch: str | None = None, cwd: Path | str | None = None) -> Added:
        """Store a finished run's results.json (or its directory). The commit
        and branch default to ``git rev-parse`` in ``cwd`` (the current
        directory), the commit then to the one the run's env names. A run
        already stored is kept once (``Added.new`` False)."""
        data, raw = read_finished(results_path)
        key = run_key(data, raw)
        env = run_env(data)
        commit = commit or git_commit(cwd) or env.get("commit")
        if not commit:
            raise HistoryError(f"{results_path}: no commit: not in a git checkout and the run's env "
                               "names none; pass --commit SHA")
        branch = branch or git_branch(cwd)
        from perfsuite.hardware import profile_id

        profile = profile_id(env)
        run_row = {"run_key": key, "commit_sha": commit, "branch": branch,
                   "started": _number((data.get("run") or {}).get("started")),
                   "finished": _number((data.get("run") or {}).get("finished")),
                   "added": time.time(), "profile": profile, "fingerprint": _json_safe(env),
                   "software": software_versions(env), "source": str(Path(results_path).resolve())}
        cell_rows, metric_rows = _cell_rows(data["cells"])
        added = Added(run_key=key, commit=commit, branch=branch, profile=profile,
                      cells=len(cell_rows), url=_shown(self.url))
        try:
            with self.engine.begin() as conn:
                existing = conn.execute(sa.select(runs.c.id, runs.c.commit_sha)
                                        .where(runs.c.run_key == key)).first()
                if existing is not None:
                    return _kept(added, existing)
                run_id = conn.execute(runs.insert().values(**run_row)).inserted_primary_key[0]
                if cell_rows:
                    conn.execute(cells.insert(), [{**r, "run_id": run_id} for r in cell_rows])
                if metric_rows:
                    conn.execute(metrics.insert(), [{**r, "run_id": run_id} for r in metric_rows])
                added.run_id = run_id
                return added
        except sa.exc.IntegrityError:  # another job stored the same run a moment before
            with self.engine.connect() as conn:
                existing = conn.execute(sa.select(runs.c.id, runs.c.commit_sha)
                                        .where(runs.c.run_key == key)).first()
            if existing is None:
                raise
            return _kept(added, existing)
        except sa.exc.SQLAlchemyError as err:
            raise HistoryError(f"history {_shown(self.url)}: cannot store {results_path}: "
                               f"{_first_line(err)}") from err

    # ------------------------------------------------------------------ reading

    def all_runs(self) -> list[dict[str, Any]]:
        """Every stored run, oldest first (the run rows as dicts)."""
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(runs).order_by(runs.c.started, runs.c.id)).mappings().all()
        return [dict(r) for r in rows]

    def cell_ids(self) -> list[str]:
        with self.engine.connect() as conn:
            return sorted(r[0] for r in conn.execute(sa.select(metrics.c.cell).distinct()))

    def series(self, *, cell: str | None = None, metric: str = DEFAULT_METRIC,
               since: str | None = None, branch: str | None = None,
               cwd: Path | str | None = None) -> dict[tuple[str, str, str], list[Point]]:
        """Per (cell, metric, profile): one point per commit, in the order the
        commits were first measured; cells that did not finish ok are left out.
        ``cell`` is an id or a glob (``smoke/image/*``); ``since`` a commit
        (a prefix, or a ref git resolves) or a date (2026-11-24): only runs
        from it on count."""
        query = (sa.select(runs.c.id, runs.c.commit_sha, runs.c.branch, runs.c.started, runs.c.added,
                           runs.c.profile, metrics.c.cell, metrics.c.metric, metrics.c.unit,
                           metrics.c.value, metrics.c.n, metrics.c.launches, cells.c.counters)
                 .join(metrics, metrics.c.run_id == runs.c.id)
                 .join(cells, sa.and_(cells.c.run_id == metrics.c.run_id, cells.c.cell == metrics.c.cell))
                 .where(cells.c.status == "ok", metrics.c.metric == metric)
                 .order_by(sa.func.coalesce(runs.c.started, runs.c.added), runs.c.id))
        if branch:
            query = query.where(runs.c.branch == branch)
        if cell and not _is_glob(cell):
            query = query.where(metrics.c.cell == cell)
        start = self._since(since, cwd) if since else None
        if start is not None:
            query = query.where(sa.func.coalesce(runs.c.started, runs.c.added) >= start)
        with self.engine.connect() as conn:
            rows = conn.execute(query).mappings().all()
        grouped: dict[tuple[str, str, str], dict[str, Point]] = {}
        for row in rows:
            if cell and _is_glob(cell) and not fnmatchcase(row["cell"], cell):
                continue
            value = run_value(row["value"], row["launches"])
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
                    counters=row["counters"], run_ids=[row["id"]])
            else:  # the same commit measured again: one point, its runs' median
                point.values.append(value)
                point.launches += len((row["launches"] or {}).get("medians") or []) or 1
                point.counters = row["counters"] or point.counters
                point.run_ids.append(row["id"])
        return {key: list(points.values()) for key, points in sorted(grouped.items())}

    def _since(self, ref: str, cwd: Path | str | None) -> float:
        """The time a --since REF starts at."""
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}([T ][\d:.]+)?([+-]\d{2}:?\d{2}|Z)?", ref):
            moment = datetime.fromisoformat(ref.replace("Z", "+00:00"))
            if moment.tzinfo is None:
                moment = moment.astimezone()  # local time, as a person types it
            return moment.timestamp()
        candidates = [ref.lower()]
        resolved = _git(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], cwd)
        if resolved:
            candidates.append(resolved.lower())
        first = sa.func.min(sa.func.coalesce(runs.c.started, runs.c.added))
        with self.engine.connect() as conn:
            for candidate in candidates:
                pattern = candidate.replace("%", "").replace("_", "") + "%"
                found = conn.execute(sa.select(first).where(sa.func.lower(runs.c.commit_sha).like(pattern))).scalar()
                if found is not None:
                    return float(found)
        raise HistoryError(f"--since {ref}: no stored run of that commit (a commit or its prefix, "
                           "a ref git resolves here, or a date YYYY-MM-DD)")


@dataclass
class Added:
    """What ``History.add_run`` did."""

    run_key: str
    commit: str
    branch: str | None
    profile: str
    cells: int
    url: str
    run_id: int | None = None
    new: bool = True
    stored_commit: str | None = None  # the commit it was first stored with, when kept

    def describe(self) -> str:
        if not self.new:
            return (f"history: run {self.run_key[:12]} already stored (commit "
                    f"{(self.stored_commit or self.commit)[:12]}) in {self.url}; kept once")
        return (f"history: stored run {self.run_key[:12]} of commit {self.commit[:12]}"
                f"{f' ({self.branch})' if self.branch else ''}, {self.cells} cell(s), profile "
                f"{self.profile} in {self.url}")


def _kept(added: Added, existing: Any) -> Added:
    added.run_id, added.new, added.stored_commit = existing[0], False, existing[1]
    return added


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

    @property
    def value(self) -> float:
        return float(np.median(self.values))


# ------------------------------------------------------------------------- reading runs

def read_finished(results_path: Path | str) -> tuple[dict[str, Any], bytes]:
    """A finished run's results.json (checked against its schema) and its
    bytes; HistoryError with the reason for a run still running or cut off."""
    path = Path(results_path)
    if path.is_dir():
        path = path / "results.json"
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise HistoryError(f"{path}: no results file") from None
    except OSError as err:
        raise HistoryError(f"{path}: cannot read it ({err.strerror or err})") from None
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise HistoryError(f"{path}: not valid JSON ({err})") from None
    if isinstance(data, dict):
        run = data.get("run")
        if not isinstance(run, dict) or run.get("finished") is None:
            raise HistoryError(f"{path}: incomplete run: run.finished is missing (still running, or "
                               "stopped before it wrote its end); only finished runs go into the history")
        running = [c.get("id") for c in data.get("cells") or [] if isinstance(c, dict)
                   and c.get("status") == "running"]
        if running:
            raise HistoryError(f"{path}: incomplete run: cell {running[0]} is still 'running'"
                               f"{f' (and {len(running) - 1} more)' if len(running) > 1 else ''}")
    from perfsuite import results as results_mod

    try:
        if isinstance(data, dict) and data.get("schema") == results_mod.SCHEMA:
            results_mod.validate(data, path)
        else:  # not a results.json: load says what it is
            results_mod.load(path)
    except ValueError as err:
        raise HistoryError(str(err)) from None
    return data, raw


def run_key(data: Mapping[str, Any], raw: bytes) -> str:
    """A run's identity: its start time and cell ids, or the file's bytes."""
    started = (data.get("run") or {}).get("started")
    if started is None:
        return hashlib.sha256(raw).hexdigest()
    ids = sorted(str(c.get("id")) for c in data.get("cells") or [])
    text = json.dumps({"started": started, "cells": ids}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def run_env(data: Mapping[str, Any]) -> dict[str, Any]:
    """The run's fingerprint; the first cell's where the run has none."""
    if data.get("env"):
        return dict(data["env"])
    return next((dict(c["env"]) for c in data.get("cells") or [] if c.get("env")), {})


def software_versions(env: Mapping[str, Any]) -> dict[str, Any]:
    return {k: env.get(k) for k in SOFTWARE_KEYS if env.get(k) is not None}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _numbers(values: Iterable[Any] | None) -> list[float] | None:
    if not values:
        return None
    out = [_number(v) for v in values]
    return [v for v in out if v is not None] or None


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


_VERDICT_KEYS = ("name", "verdict", "metric", "message", "ratio", "ci_low", "ci_high")


def _cell_rows(cell_results: list[dict[str, Any]]) -> tuple[list[dict], list[dict]]:
    cell_rows, metric_rows = [], []
    for cell in cell_results:
        cell_rows.append({
            "cell": cell["id"], "status": cell["status"], "reason": cell.get("reason"),
            "repeats": cell.get("repeats"), "counters": _json_safe(cell.get("counters")),
            "verdicts": [_json_safe({k: c.get(k) for k in _VERDICT_KEYS if k in c})
                         for c in cell.get("checks") or []]})
        for name, metric in (cell.get("metrics") or {}).items():
            if not isinstance(metric, dict):
                continue
            launches = None
            if metric.get("launch_medians"):
                launches = {"medians": _numbers(metric.get("launch_medians")),
                            "floors": _numbers(metric.get("launch_floors"))}
            n = metric.get("n")
            metric_rows.append({
                "cell": cell["id"], "metric": name, "unit": metric.get("unit"),
                "value": _number(metric.get("value")), "median": _number(metric.get("median")),
                "n": n if isinstance(n, int) and not isinstance(n, bool) else None,
                "iqr": _number(metric.get("iqr")), "min": _number(metric.get("min")),
                "launches": launches})
    return cell_rows, metric_rows


def run_value(value: float | None, launches: Mapping[str, Any] | None) -> float | None:
    """A run's point in a series: the median of its launch medians where the
    cell was launched more than once (a noisy launch moves it least), else
    the metric's value."""
    medians = (launches or {}).get("medians") or []
    if len(medians) >= 2:
        return float(np.median(medians))
    return _number(value)


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
                          commit: str | None = None, branch: str | None = None) -> str:
    """Store a finished run in the history at ``url`` (None: the default
    SQLite file) and return the line to print. The pytest plugin
    (``--perf-history URL``) and ``perfsuite run --history URL`` call it once
    the run's results.json is complete. Raises HistoryError with the reason
    when the run is refused (unfinished, no commit) or the store cannot be
    written."""
    with History(url) as history:
        return history.add_run(results_path, commit=commit, branch=branch).describe()


# ------------------------------------------------------------------------- change points

def higher_is_better(metric: str) -> bool:
    from perfsuite.baselines import HIGHER_IS_BETTER

    return metric in HIGHER_IS_BETTER


@dataclass
class Change:
    """A change point of one series: ``points[index]`` is the first bad commit."""

    cell: str
    metric: str
    profile: str
    index: int
    last_good: Point
    first_bad: Point
    ratio: Any  # stats.Interval of after / before, or None (a non-positive value)
    pvalue: float
    direction: str  # "regressed" or "improved"
    counter_lines: list[str] | None  # None: a side has no counters

    def to_dict(self) -> dict[str, Any]:
        return {"cell": self.cell, "metric": self.metric, "profile": self.profile,
                "index": self.index, "direction": self.direction, "pvalue": self.pvalue,
                "last_good": {"commit": self.last_good.commit, "time": self.last_good.time,
                              "value": self.last_good.value},
                "first_bad": {"commit": self.first_bad.commit, "time": self.first_bad.time,
                              "value": self.first_bad.value},
                "ratio": self.ratio.to_dict() if self.ratio is not None else None,
                "counters": self.counter_lines}


def _size(after: list[float], before: list[float]) -> Any:
    from perfsuite.stats import shift_ratio_interval

    try:
        return shift_ratio_interval(after, before)
    except ValueError:  # zero or negative values (a loss, an accuracy of 0): no ratio
        return None


def _counter_lines(good: Point, bad: Point) -> list[str] | None:
    from perfsuite import counters as counters_mod

    if not good.counters or not bad.counters:
        return None
    unstable = set(good.counters.get("unstable") or []) | set(bad.counters.get("unstable") or [])
    changes = counters_mod.diff(bad.counters.get("per_step") or {}, good.counters.get("per_step") or {},
                                unstable=unstable)
    return counters_mod.describe(changes)


def find_changes(points: list[Point], *, cell: str = "", metric: str = DEFAULT_METRIC,
                 profile: str = "", max_pvalue: float = DEFAULT_MAX_PVALUE,
                 min_change: float = 0.0, window: int = DEFAULT_WINDOW) -> list[Change]:
    """The change points of one series, oldest first, by Otava's E-Divisive
    (``compute_change_points``)."""
    from otava.analysis import compute_change_points

    values = [p.value for p in points]
    if len(values) < 3 or not all(math.isfinite(v) for v in values):
        return []
    # A list, not an array: otava's windowed split slices only lists.
    found, _weak = compute_change_points(list(map(float, values)), window_len=window,
                                         max_pvalue=max_pvalue, min_magnitude=min_change)
    indexes = sorted({int(cp.index) for cp in found if 0 < int(cp.index) < len(values)})
    pvalues = {int(cp.index): float(cp.stats.pvalue) for cp in found}
    bounds = [0, *indexes, len(values)]
    out = []
    for k, index in enumerate(indexes):
        before, after = values[bounds[k]:index], values[index:bounds[k + 2]]
        ratio = _size(after, before)
        moved = ratio.estimate if ratio is not None else float(np.median(after)) / float(np.median(before) or 1)
        worse = moved < 1 if higher_is_better(metric) else moved > 1
        out.append(Change(cell=cell, metric=metric, profile=profile, index=index,
                          last_good=points[index - 1], first_bad=points[index], ratio=ratio,
                          pvalue=pvalues.get(index, float("nan")),
                          direction="regressed" if worse else "improved",
                          counter_lines=_counter_lines(points[index - 1], points[index])))
    return out


def regressed_at_head(changes: list[Change]) -> bool:
    """The newest run sits after a regression: the series' latest change
    point is a regression (none after it brought the metric back)."""
    return bool(changes) and changes[-1].direction == "regressed"


def _is_glob(pattern: str) -> bool:
    return any(ch in pattern for ch in "*?[")


def _first_line(err: BaseException) -> str:
    text = str(getattr(err, "orig", None) or err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def when(timestamp: float | None) -> str:
    if timestamp is None:
        return "-"
    return datetime.fromtimestamp(timestamp, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
