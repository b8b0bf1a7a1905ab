"""The history store's layout: its tables, their version and migrations,
and the database behind them (a URL, an engine that waits for other writers).

SQLAlchemy Core over any database URL. The default is an SQLite file,
``.perfsuite/history.sqlite`` (embedded, nothing to start); a team shares
one history through a PostgreSQL URL; ``$PERFSUITE_HISTORY`` names the
store to use when none is given. The layout is versioned (table ``meta``,
``schema_version``) and older layouts are migrated on open (``MIGRATIONS``).
``perfsuite.history.store`` reads and writes through it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event

from perfsuite import extras
from perfsuite.history.errors import HistoryError, NotMigrated
from perfsuite.history.rows import options_of_file, software_versions
from perfsuite.system.folders import folder_problem

SCHEMA_VERSION = 2
DEFAULT_PATH = Path(".perfsuite") / "history.sqlite"
HISTORY_ENV = "PERFSUITE_HISTORY"  # the store used when no --history / --url names one
# What a stored run is for: "run" (meant to be kept: the series read it), "experiment"
# (an injected fault or a workload option), "ad-hoc" (a look at a cell; see
# perfsuite.history.purpose.run_purpose). Readers take "run" only unless asked for more.
PURPOSES = ("run", "experiment", "ad-hoc")
DEFAULT_PURPOSE = "run"
BUSY_TIMEOUT_S = 60.0  # SQLite: how long a writer waits for another's transaction
_PG_LOCK_KEY = 0x70657266  # PostgreSQL advisory lock: one schema set-up at a time


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
    sa.Column("purpose", sa.String(16), nullable=False, server_default=DEFAULT_PURPOSE),
    sa.Column("options", sa.JSON),  # the workload options it was launched with ({} for none)
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


def _migrate_0_to_1(conn: sa.Connection, _url: str) -> None:
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


def _migrate_1_to_2(conn: sa.Connection, url: str) -> None:
    """Version 1 kept every run alike; version 2 marks each with its purpose
    and workload options. A stored run gets the purpose it would be stored
    with now, as far as the store can tell: ``experiment`` when its
    results.json is still that run's (the same run key: a folder used again
    holds another run) and its cells were launched with workload options;
    ``ad-hoc`` when the store is a ``.perfsuite/history.sqlite`` file
    (perfsuite's default) and the run's folder lies outside that folder;
    else ``run``. ``perfsuite history mark`` re-marks a run."""
    have = {c["name"] for c in sa.inspect(conn).get_columns("runs")}
    if "purpose" not in have:
        conn.exec_driver_sql(f"ALTER TABLE runs ADD COLUMN purpose VARCHAR(16) NOT NULL "
                             f"DEFAULT '{DEFAULT_PURPOSE}'")
    if "options" not in have:
        _add_column(conn, "runs", sa.Column("options", sa.JSON))
    store = sqlite_file(url)
    runs_folder = store.parent if store is not None and store.parts[-2:] == DEFAULT_PATH.parts else None
    for run_id, key, source in conn.execute(sa.select(runs.c.id, runs.c.run_key, runs.c.source)).all():
        options = options_of_file(source, key) if source else None
        purpose = DEFAULT_PURPOSE
        if options:
            purpose = "experiment"
        elif runs_folder is not None and source and not _inside(Path(source), runs_folder):
            purpose = "ad-hoc"
        conn.execute(runs.update().where(runs.c.id == run_id).values(purpose=purpose, options=options or {}))


def _inside(path: Path, folder: Path) -> bool:
    try:
        return path.resolve().is_relative_to(folder.resolve())
    except OSError:
        return False


# Version -> the function that brings a store of that version to the next
# (given the store's URL: a copy read in memory is migrated as its file).
MIGRATIONS: dict[int, Callable[[sa.Connection, str], None]] = {0: _migrate_0_to_1, 1: _migrate_1_to_2}


OFF = "off"  # as a store (--history off, $PERFSUITE_HISTORY=off): none


def history_off(url: str | os.PathLike | None) -> bool:
    """Whether no history is kept: ``url`` is "off", or it is None and
    ``$PERFSUITE_HISTORY`` is "off"."""
    asked = os.environ.get(HISTORY_ENV) if url is None or str(url) == "" else url
    return asked is not None and str(asked) == OFF


def resolve_url(url: str | os.PathLike | None) -> str:
    """A database URL: None for ``$PERFSUITE_HISTORY``, else
    ``.perfsuite/history.sqlite`` under the current directory; a file path
    for an SQLite file, or any SQLAlchemy URL
    (``postgresql://user@host/db``; psycopg 3, perfsuite's postgres extra,
    serves it where psycopg2 is not installed; with neither, HistoryError
    names the extra)."""
    if history_off(url):
        named = "--history off" if url is not None and str(url) != "" else f"${HISTORY_ENV} is off"
        raise HistoryError(f"{named}: no history store to use; name one with --history (a file path or "
                           "a database URL)")
    if url is None or str(url) == "":
        url = os.environ.get(HISTORY_ENV) or DEFAULT_PATH
    text = str(url)
    if "://" not in text:  # a path is a path: built as an URL, never read as one (%2F, ?, #)
        path = str(Path(text).expanduser().resolve())
        try:
            path.encode("utf-8")
        except UnicodeEncodeError:  # an SQLite URL, and SQLite's own file name, are UTF-8
            raise HistoryError(f"history store {os.fsencode(path).decode('utf-8', 'backslashreplace')}: "
                               "its path is not valid UTF-8, which an SQLite store's name must be; "
                               "choose a store path in UTF-8 (--history or $PERFSUITE_HISTORY)") from None
        return sa.URL.create("sqlite", database=path).render_as_string(hide_password=False)
    if text.startswith(("postgresql://", "postgres://", "postgresql+psycopg://")):
        if text.startswith("postgresql+psycopg://") or not extras.installed("psycopg2"):
            absent = extras.missing("postgres")
            if absent:
                raise HistoryError(f"history {shown_url(text)}: {extras.message('postgres', absent)}")
            text = "postgresql+psycopg://" + text.split("://", 1)[1]
    return text


def shown_url(url: str) -> str:
    """The URL with its password hidden, for messages."""
    try:
        return sa.make_url(url).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        return url


def sqlite_file(url: str) -> Path | None:
    parsed = sa.make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def check_usable(url: str) -> None:
    """HistoryError with the reason when the store at ``url`` (resolved)
    cannot take a run: an unknown database kind, a driver not installed, an
    SQLite file that cannot be made or written, a database that is not
    perfsuite's or is newer than this perfsuite. Writes nothing: an SQLite
    file is opened read-only, a server's database only looked at."""
    shown = shown_url(url)
    parsed = _known_kind(url)
    path = sqlite_file(url)
    if path is not None:
        problem = folder_problem(path)
        if problem:
            raise HistoryError(f"history {shown}: {problem}; give --history a place you can write, or off")
        if not path.exists() or path.stat().st_size == 0:
            return  # made, or laid out, when the run is added
        if not os.access(path.parent, os.W_OK | os.X_OK):  # SQLite writes its journal beside the store
            raise HistoryError(f"history {shown}: cannot write in {path.parent}, where SQLite keeps the "
                               "store's journal while it writes; give --history a place you can write, or off")
        import sqlite3
        from urllib.parse import quote

        uri = f"file:{quote(str(path))}?mode=ro"
        engine = sa.create_engine("sqlite://", creator=lambda: sqlite3.connect(uri, uri=True))
    elif parsed.get_backend_name() == "sqlite":
        return  # in memory
    else:
        timeout = {"connect_timeout": 10} if parsed.get_backend_name() == "postgresql" else {}
        try:
            engine = sa.create_engine(url, connect_args=timeout)
        except ModuleNotFoundError as err:
            raise HistoryError(f"history {shown}: its database driver is not installed ({err.name})") from None
    try:
        with engine.connect() as conn:
            version = stored_version(conn, url)
    except sa.exc.SQLAlchemyError as err:
        text = str(getattr(err, "orig", None) or err).strip()
        raise HistoryError(f"history {shown}: cannot open it ({text.splitlines()[0] if text else type(err).__name__})"
                           "; give --history a store that is there, or off") from None
    finally:
        engine.dispose()
    if version is not None and version > SCHEMA_VERSION:
        raise HistoryError(_newer(url, version))


def _known_kind(url: str) -> sa.URL:
    """The parsed URL; HistoryError for a kind of database SQLAlchemy does
    not know (``sqlit://``, a typo) or a URL it cannot read."""
    try:
        parsed = sa.make_url(url)
        parsed.get_dialect()
    except sa.exc.NoSuchModuleError:
        raise HistoryError(f"history {shown_url(url)}: no database kind {parsed.drivername!r}; give --history "
                           "a file path, sqlite:///PATH or postgresql://USER@HOST/DB") from None
    except sa.exc.ArgumentError as err:
        raise HistoryError(f"history {shown_url(url)}: not a database URL ({err}); give --history a file "
                           "path or an SQLAlchemy URL") from None
    return parsed


def _newer(url: str, version: int) -> str:
    return (f"history {shown_url(url)} has layout version {version}, newer than this perfsuite reads "
            f"({SCHEMA_VERSION}): upgrade perfsuite")


def open_engine(url: str) -> sa.Engine:
    _known_kind(url)
    sqlite_path = sqlite_file(url)
    if sqlite_path is None:
        return sa.create_engine(url, pool_pre_ping=True)
    problem = None if sqlite_path.is_file() else folder_problem(sqlite_path)
    if problem:
        raise HistoryError(f"history {shown_url(url)}: {problem}; give --history a place you can write")
    sqlite_path.parent.mkdir(parents=True, exist_ok=True)
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


PERFSUITE_TABLES = ("runs", "cells", "metrics")  # and meta, from version 1 on


def stored_version(conn: sa.Connection, url: str) -> int | None:
    """The store's layout version; None for an empty database. HistoryError
    for a database that is not perfsuite's, lacks one of its tables, or
    whose version is not a number: the readers' queries would fail later,
    and a writer must not add perfsuite's tables to another program's file."""
    names = set(sa.inspect(conn).get_table_names())
    version = None
    if "meta" in names:
        try:
            row = conn.execute(sa.select(meta.c.value).where(meta.c.key == "schema_version")).first()
        except sa.exc.SQLAlchemyError:  # a table "meta" of another shape: another program's
            row = None
        if row is not None:
            try:
                version = int(row[0])
            except (TypeError, ValueError):
                raise HistoryError(f"history {shown_url(url)}: its schema_version {row[0]!r} (table meta) is "
                                   "not a number: the store was edited by hand or by another program; "
                                   "restore it from a copy, or give --history another store") from None
    if version is None and "runs" in names:
        version = 0  # the layout before versioning
    if version is None:
        if names:
            raise HistoryError(f"history {shown_url(url)} is not a perfsuite history: it holds table(s) "
                               f"{', '.join(sorted(names)[:6])} and none of perfsuite's; give --history "
                               "another store (a new file path makes a new one)")
        return None
    missing = [t for t in PERFSUITE_TABLES if t not in names]
    if missing:
        raise HistoryError(f"history {shown_url(url)} lacks its table {', '.join(missing)}: it was damaged "
                           "or changed by another program; restore it from a copy, or give --history "
                           "another store")
    return version


def _set_version(conn: sa.Connection, version: int) -> None:
    done = conn.execute(meta.update().where(meta.c.key == "schema_version").values(value=str(version)))
    if done.rowcount == 0:
        conn.execute(meta.insert().values(key="schema_version", value=str(version)))


def set_up_layout(engine: sa.Engine, url: str) -> int:
    """Create the tables in an empty database, or migrate an older layout;
    the layout version the store now has."""
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":  # two jobs creating the tables at once
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})
        version = stored_version(conn, url)
        if version is None:
            metadata.create_all(conn)
            _set_version(conn, SCHEMA_VERSION)
            return SCHEMA_VERSION
        if version > SCHEMA_VERSION:
            raise HistoryError(_newer(url, version))
        older = version
        try:
            while version < SCHEMA_VERSION:
                MIGRATIONS[version](conn, url)
                version += 1
                _set_version(conn, version)
        except sa.exc.SQLAlchemyError as err:  # rolled back: the store is as it was
            text = str(getattr(err, "orig", None) or err).strip()
            raise NotMigrated(f"history {shown_url(url)}: its layout version {older} is older than this "
                              f"perfsuite's ({SCHEMA_VERSION}) and could not be migrated in place "
                              f"({text.splitlines()[0] if text else type(err).__name__})") from err
        return version


def migrated_copy(path: Path, url: str) -> tuple[sa.Engine, int]:
    """An older SQLite store read without writing it: copied into memory
    (opened read-only) and migrated there; the engine and its version."""
    import sqlite3
    from urllib.parse import quote

    from sqlalchemy.pool import StaticPool

    memory = sqlite3.connect(":memory:", check_same_thread=False)
    source = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True)
    try:
        source.backup(memory)
    finally:
        source.close()
    engine = sa.create_engine("sqlite://", creator=lambda: memory, poolclass=StaticPool)
    return engine, set_up_layout(engine, url)
