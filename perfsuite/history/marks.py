"""A stored run's mark, said and changed: what adding a run did
(``Added``), and ``perfsuite history mark``, which re-marks the runs a
person names by run key, commit or the folder a run was added from
(``mark_runs``): a run tried under options, or marked so by an older
migration, that was meant after all.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from perfsuite.history.errors import HistoryError, StoreNotWritten
from perfsuite.history.schema import DEFAULT_PURPOSE, PURPOSES, runs, shown_url

MIN_PREFIX = 4  # a run key's or commit's prefix: fewer characters name runs by chance


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
    purpose: str = DEFAULT_PURPOSE  # the purpose it is stored with
    why: str | None = None
    earlier_purpose: str | None = None  # when kept and re-marked: the purpose it had

    def describe(self) -> str:
        if not self.new:
            line = (f"history: run {self.run_key[:12]} already stored (commit "
                    f"{(self.stored_commit or self.commit)[:12]}) in {self.url}")
            if self.earlier_purpose is not None:
                return f"{line}; kept once, now marked {self.purpose} (was {self.earlier_purpose})"
            return f"{line}{'' if self.purpose == DEFAULT_PURPOSE else ' ' + as_purpose(self.purpose)}; kept once"
        line = (f"history: stored run {self.run_key[:12]} of commit {self.commit[:12]}"
                f"{f' ({self.branch})' if self.branch else ''}, {self.cells} cell(s), profile "
                f"{self.profile} in {self.url}")
        if self.purpose == DEFAULT_PURPOSE:
            return line
        return (f"{line} {as_purpose(self.purpose)}{f' ({self.why})' if self.why else ''}: "
                f"`perfsuite history changes` leaves it out; --include {self.purpose} shows it")


def as_purpose(purpose: str) -> str:
    return {"experiment": "as an experiment", "ad-hoc": "as ad-hoc"}.get(purpose, f"as a {purpose}")


def kept(added: Added, existing: Any, purpose: str | None = None) -> Added:
    added.run_id, added.new, added.stored_commit = existing[0], False, existing[1]
    added.purpose = purpose or existing[2]
    return added


@dataclass
class Marked:
    """A run ``mark_runs`` named: its key, commit, when, where from, and its
    purpose before (``earlier``) and now."""

    run_key: str
    commit: str
    started: float | None
    source: str | None
    purpose: str
    earlier: str

    def describe(self) -> str:
        when = (datetime.fromtimestamp(self.started, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
                if self.started is not None else "-")
        head = f"history: run {self.run_key[:12]} (commit {self.commit[:12]}, {when}, from {self.source or '-'})"
        if self.earlier == self.purpose:
            return f"{head} already marked {self.purpose}"
        return f"{head} now marked {self.purpose} (was {self.earlier})"


def _text(path: Path) -> str:
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def _matches(row: Any, selector: str) -> bool:
    """Whether ``selector`` names the stored run ``row``: a prefix of its
    run key or commit, or the folder (or results.json) it was added from."""
    source = row["source"] or ""
    where = Path(selector).expanduser().resolve()
    if source in (_text(where), _text(where / "results.json")) or (
            where.name == "results.json" and source == _text(where.parent)):
        return True
    low = selector.lower()
    return len(selector) >= MIN_PREFIX and (row["run_key"].lower().startswith(low)
                                            or row["commit_sha"].lower().startswith(low))


def mark_runs(history: Any, selectors: list[str], purpose: str) -> list[Marked]:
    """Mark every stored run each of ``selectors`` names with ``purpose``,
    in one transaction; HistoryError naming a selector that names none
    (with the newest runs there are) and writing nothing."""
    if purpose not in PURPOSES:
        raise HistoryError(f"purpose {purpose!r}: expected one of {', '.join(PURPOSES)}")
    shown = shown_url(history.url)
    columns = (runs.c.id, runs.c.run_key, runs.c.commit_sha, runs.c.started, runs.c.source, runs.c.purpose)
    with history.engine.connect() as conn:
        stored = conn.execute(sa.select(*columns).order_by(runs.c.started, runs.c.id)).mappings().all()
    chosen: dict[int, Any] = {}
    for selector in selectors:
        found = [row for row in stored if _matches(row, selector)]
        if not found:
            short = len(selector) < MIN_PREFIX and not Path(selector).exists()
            newest = "; ".join(f"{r['run_key'][:12]} commit {r['commit_sha'][:12]} ({r['purpose']}, "
                               f"from {r['source'] or '-'})" for r in list(stored)[-5:][::-1]) or "none"
            raise HistoryError(
                f"no stored run matches {selector!r} in history {shown}"
                + (f" (give at least {MIN_PREFIX} characters of a run key or commit, or a run's folder)"
                   if short else " (a run key as `history: stored run KEY` says it, a commit or its prefix, "
                                 "or the folder a run was added from)")
                + f"; its newest runs: {newest}")
        chosen.update((row["id"], row) for row in found)
    try:
        with history.engine.begin() as conn:
            conn.execute(runs.update().where(runs.c.id.in_(list(chosen))).values(purpose=purpose))
    except sa.exc.SQLAlchemyError as err:
        text = str(getattr(err, "orig", None) or err).strip().splitlines()
        raise StoreNotWritten(f"history {shown}: cannot mark its runs ({text[0] if text else type(err).__name__})"
                              "; make the store writable, then mark them again") from None
    return [Marked(r["run_key"], r["commit_sha"], r["started"], r["source"], purpose, r["purpose"])
            for r in chosen.values()]
