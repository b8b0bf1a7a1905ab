"""``perfsuite history``: add, mark, changes, show, report (see perfsuite.history.store and
perfsuite.history.changes); its detection benchmark is ``perfsuite selftest
history-detection``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from perfsuite import options
from perfsuite.cli import selftest as cli_selftest
from perfsuite.cli.exits import emit_json
from perfsuite.options import DEFAULT_MAX_PVALUE, DEFAULT_METRIC, DEFAULT_WINDOW, HISTORY_HELP, INCLUDE_HELP

# perfsuite.history (SQLAlchemy, numpy) and perfsuite.report's pages: imported
# in the commands that use them. main imports every cli module to build its
# parser, and the CLI's first screen (perfsuite list, --help) imports nothing
# heavy.

EXIT_OK, EXIT_REGRESSED, EXIT_USAGE = 0, 1, 2
LAUNCH_STATISTICS, DEFAULT_LAUNCH_STATISTIC = options.LAUNCH_STATISTICS, options.DEFAULT_LAUNCH_STATISTIC
LAUNCH_STATISTIC_HELP = ("what each launch of a step time gives its run's point: its median step, or its floor "
                         "(fastest step), for a shared machine whose neighbours only ever add time")
PURPOSES = options.HISTORY_PURPOSES


def _fail(command: str, err: Exception) -> int:
    print(f"perfsuite history {command}: {err}", file=sys.stderr)
    return EXIT_USAGE


def _include(args: argparse.Namespace, command: str) -> tuple[str, ...] | None:
    from perfsuite.history.store import parse_include

    try:
        return parse_include(args.include)
    except ValueError as err:
        _fail(command, err)
        return None


def _say_left_out(left_out: dict[str, int]) -> None:
    from perfsuite.history.store import left_out_line

    line = left_out_line(left_out)
    if line:
        print(line)


def _cmd_add(args: argparse.Namespace) -> int:
    from perfsuite.history.rows import read_finished
    from perfsuite.history.store import History, HistoryError

    try:
        read_finished(args.run)  # a run the store would refuse makes no store either
        with History(args.history) as history:
            added = history.add_run(args.run, commit=args.commit, branch=args.branch,
                                    purpose=args.history_purpose)
    except HistoryError as err:
        return _fail("add", err)
    if args.json:
        from dataclasses import asdict

        emit_json(args, {**asdict(added), "line": added.describe()})
    else:
        print(added.describe())
    return EXIT_OK


def _cmd_mark(args: argparse.Namespace) -> int:
    from perfsuite.history.marks import mark_runs
    from perfsuite.history.store import History, HistoryError

    if args.history_purpose is None:
        return _fail("mark", ValueError(f"give --history-purpose {'|'.join(PURPOSES)}: the purpose the runs "
                                        "are marked with"))
    try:  # read_only=False: an older store is migrated in place, never marked in a copy
        with History(args.history, create=False, read_only=False) as history:
            marked = mark_runs(history, args.runs, args.history_purpose)
    except HistoryError as err:
        return _fail("mark", err)
    if args.json:
        from dataclasses import asdict

        emit_json(args, {"marked": [{**asdict(m), "line": m.describe()} for m in marked]})
        return EXIT_OK
    for one in marked:
        print(one.describe())
    if args.history_purpose != "run":
        print(f"`perfsuite history changes` leaves {args.history_purpose} runs out; "
              f"--include {args.history_purpose} shows them")
    return EXIT_OK


def _fmt(value: float, unit: str | None) -> str:
    return f"{value:.6g}{f' {unit}' if unit else ''}"


def _cmd_changes(args: argparse.Namespace) -> int:
    from perfsuite.history.changes import find_changes, level_start, regressed_at_head
    from perfsuite.history.store import HistoryError
    from perfsuite.judge import accepted

    if not 0 < args.max_pvalue < 1 or args.min_change < 0 or args.window < 2:
        return _fail("changes", ValueError("--max-pvalue must lie in (0, 1), --min-change >= 0, "
                                           "--window >= 2"))
    if args.bisect and not args.confirm:
        return _fail("changes", ValueError("--bisect bisects the confirmed change points: give --confirm too"))
    include = _include(args, "changes")
    if include is None:
        return EXIT_USAGE
    try:
        entries = accepted.load()  # a change accepted at a commit starts its series' level there
        series, left_out, _ = _read_series(args, include)
    except (HistoryError, accepted.AcceptError) as err:
        return _fail("changes", err)
    if not series:
        from perfsuite.history.store import left_out_line

        if args.json:
            emit_json(args, {"series": [], "regressed_at_head": [], "left_out": left_out})
        if args.cell:  # a name that matches nothing must not pass a nightly gate quietly
            hint = f"; {left_out_line(left_out)}" if left_out else ""
            return _fail("changes", LookupError(f"no {args.metric} history of {args.cell}{hint} "
                                                "(`perfsuite history show` lists a cell's runs)"))
        if left_out:  # runs there are, none of them taken: not "no history yet"
            return _fail("changes", LookupError(_all_left_out(args, left_out)))
        if not args.json:
            print(f"no {args.metric} history yet")
        return EXIT_OK
    report, at_head, levels = [], [], {}
    for (cell, metric, profile), points in series.items():
        starts = accepted.level_starts(entries, cell, metric)
        changes = find_changes(points, cell=cell, metric=metric, profile=profile,
                               max_pvalue=args.max_pvalue, min_change=args.min_change,
                               window=args.window, level_from=[e.commit for e in starts])
        at = level_start(points, [e.commit for e in starts])  # the entry that started it, said below
        levels[cell, metric, profile] = next(e for e in reversed(starts) if points[at].commit.startswith(
            e.commit)) if at else None
        if regressed_at_head(changes):
            at_head.append(changes[-1])
        report.append((cell, metric, profile, points, changes))
    confirmed = None
    if args.json:
        confirmed = _confirm(args, at_head) if args.confirm else None
        emit_json(args, {"series": [{"cell": c, "metric": m, "profile": p, "commits": len(points),
                                     "changes": [ch.to_dict() for ch in changes],
                                     "level_from": levels[c, m, p] and vars(levels[c, m, p])}
                                    for c, m, p, points, changes in report],
                         "regressed_at_head": [ch.to_dict() for ch in at_head], "left_out": left_out,
                         **({"confirmed": [c.to_dict() for c in confirmed]} if confirmed is not None else {})})
    else:
        for cell, metric, profile, points, changes in report:
            if not changes and not args.verbose:
                continue
            print(f"{cell} {metric} [{profile}] {len(points)} commit(s): "
                  f"{len(changes) or 'no'} change point(s)")
            if levels[cell, metric, profile] is not None:
                entry = levels[cell, metric, profile]
                print(f"  level from {entry.commit[:12]}: {entry.line()}")
            for change in changes:
                print("\n".join(change.describe()))
        found = sum(len(r[4]) for r in report)
        print(f"{found} change point(s) in {len(report)} series (Apache Otava E-Divisive, "
              f"p <= {args.max_pvalue:g}, windows of {args.window})")
        _say_left_out(left_out)
        for change in at_head:
            print(f"{'to confirm, regressed' if args.confirm else 'REGRESSED'} at head: {change.cell} "
                  f"{change.metric} [{change.profile}] since {change.first_bad.commit[:12]}")
        confirmed = _confirm(args, at_head) if args.confirm else None
    if confirmed is not None:
        from perfsuite.ab.confirm import exit_code

        return exit_code(confirmed)
    return EXIT_REGRESSED if at_head else EXIT_OK


def _confirm(args: argparse.Namespace, changes: list) -> list:
    """Each regression at a head measured again by an A/B of its two commits (perfsuite.ab.confirm)."""
    from perfsuite.ab import confirm

    if not changes:
        print("nothing to measure again: no series regressed at its head")
        return []
    settings = confirm.Settings(repo=args.repo.resolve(), out=(args.out or confirm.default_out()).resolve(),
                                bisect=args.bisect, statistic=args.launch_statistic)
    found = confirm.confirm_changes(changes, settings)
    print("\n".join(confirm.report(found)))
    return found


def _all_left_out(args: argparse.Namespace, left_out: dict[str, int]) -> str:
    from perfsuite.history.store import left_out_line, resolve_url, shown_url

    return (f"no {args.metric} history of runs in history {shown_url(resolve_url(args.history))}: every run "
            f"it holds was left out for its purpose; {left_out_line(left_out)}, and `perfsuite history mark "
            "RUN --history-purpose run` re-marks a run that was meant as one")


def _check_branch(history, branch: str | None) -> None:
    """HistoryError naming the branches there are when ``branch`` holds no run."""
    from perfsuite.history.store import HistoryError, shown_url

    there = history.branches()
    if branch is None or branch in there or not there:
        return
    named = ", ".join(f"{b} ({n} run(s))" for b, n in sorted(there.items(), key=lambda i: str(i[0])) if b)
    loose = there.get(None)
    raise HistoryError(f"--branch {branch}: no run on branch {branch} in history {shown_url(history.url)}; "
                       f"its branches: {named or 'none'}"
                       + (f" ({loose} run(s) stored without a branch: a detached HEAD)" if loose else ""))


def _read_series(args: argparse.Namespace, include: tuple[str, ...], *,
                 cell_ids: bool = False) -> tuple[list, dict[str, int], list[str]]:
    """The series ``history changes`` and ``show`` read, the runs they leave
    out, and (``cell_ids``, where neither holds any) the store's cell ids."""
    from perfsuite.history.store import History

    with History(args.history, create=False) as history:
        series = history.series(cell=args.cell, metric=args.metric, since=args.since,
                                branch=args.branch, launch_statistic=args.launch_statistic,
                                include=include)
        left_out = history.left_out(cell=args.cell, metric=args.metric, since=args.since,
                                    branch=args.branch, include=include)
        if not series:  # a branch, a metric that is not there: not a cell's typo, nor "no history yet"
            _check_branch(history, args.branch)
        if not series and not left_out:
            _check_metrics(history, [args.metric])
        known = history.cell_ids() if cell_ids and not series and not left_out else []
    return series, left_out, known


def _check_metrics(history, asked: list[str]) -> None:
    """HistoryError naming the metrics the store holds when one asked for is
    none of them (a store that holds none yet takes any)."""
    import difflib

    from perfsuite.history.store import HistoryError, shown_url

    there = history.metric_names()
    unknown = [m for m in asked if there and m not in there]
    if unknown:
        close = difflib.get_close_matches(unknown[0], there, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise HistoryError(f"--metric {unknown[0]}: no such metric in history {shown_url(history.url)}; "
                           f"{hint}it holds {', '.join(there)}")


def _cmd_show(args: argparse.Namespace) -> int:
    from perfsuite.history.store import HistoryError, left_out_line, when

    include = _include(args, "show")
    if include is None:
        return EXIT_USAGE
    try:
        series, left_out, known = _read_series(args, include, cell_ids=True)
    except HistoryError as err:
        return _fail("show", err)
    if not series:
        import difflib

        if args.cell in known:  # stored, but no run of it that these options take
            hint = (f": it is stored, but no run of it finished ok with a {args.metric}"
                    + (f" on branch {args.branch}" if args.branch else "")
                    + (f" since {args.since}" if args.since else ""))
        elif not left_out and _known_cell(args.cell):  # a valid id: no other cell is what was meant
            hint = ": a cell perfsuite knows, not stored in this history yet (`perfsuite run` with --history stores it)"
        else:
            close = [c for c in difflib.get_close_matches(args.cell, known, n=4) if c != args.cell][:3]
            hint = f"; did you mean {', '.join(close)}?" if close else ""
        hint += f"; {left_out_line(left_out)}" if left_out else ""
        return _fail("show", LookupError(f"no {args.metric} history of {args.cell}{hint}"))
    if args.json:
        emit_json(args, {"series": [{"cell": cell, "metric": metric, "profile": profile, "points": [
            {"commit": p.commit, "branch": p.branch, "time": p.time, "value": p.value, "unit": p.unit,
             "values": p.values, "launches": p.launches, "purposes": sorted(set(p.purposes))} for p in points]}
            for (cell, metric, profile), points in series.items()], "left_out": left_out})
        return EXIT_OK
    for (cell, metric, profile), points in series.items():
        print(f"{cell} {metric} [{profile}]")
        print(f"  {'commit':12}  {'time':20}  {'value':>14}  launches  branch")
        for point in points:
            runs = f" ({len(point.values)} runs)" if len(point.values) > 1 else ""
            # with --include, a point that is not (only) meant runs says what it holds
            marks = sorted({p for p in point.purposes if p != "run"})
            runs += f" [{', '.join(marks)}]" if marks else ""
            print(f"  {point.commit[:12]:12}  {when(point.time):20}  "
                  f"{_fmt(point.value, point.unit):>14}  {point.launches:8}  {point.branch or '-'}{runs}")
    _say_left_out(left_out)
    return EXIT_OK


def _known_cell(cell_id: str) -> bool:
    from perfsuite import cells

    try:
        return bool(cells.select(ids=[cell_id]))
    except Exception:  # noqa: BLE001 - an unknown id, or an experiment file that does not load: not known
        return False


def _cmd_report(args: argparse.Namespace) -> int:
    from perfsuite.history.store import HistoryError
    from perfsuite.report.trends_page import write_trends_page

    if not 0 < args.max_pvalue < 1 or args.window < 2:
        return _fail("report", ValueError("--max-pvalue must lie in (0, 1), --window >= 2"))
    include = _include(args, "report")
    if include is None:
        return EXIT_USAGE
    cells = args.cell or None
    import sqlalchemy as sa

    try:
        from perfsuite.history.store import History

        with History(args.history, create=False) as history:
            _check_branch(history, args.branch)
            _check_metrics(history, args.metric or [DEFAULT_METRIC])
        out, trends = write_trends_page(args.history, args.out, cells, args.metric or [DEFAULT_METRIC],
                                        since=args.since, branch=args.branch,
                                        max_pvalue=args.max_pvalue, window=args.window,
                                        launch_statistic=args.launch_statistic, include=include)
    except (HistoryError, LookupError) as err:
        return _fail("report", err)
    except sa.exc.SQLAlchemyError as err:  # the page's own queries: a store broken while read
        return _fail("report", HistoryError(f"cannot read the history ({str(err).splitlines()[0]})"))
    changes = sum(len(t.changes) for t in trends)
    if args.json:
        emit_json(args, {"trends": str(out), "cells": len({t.cell for t in trends}), "series": [
            {"cell": t.cell, "metric": t.metric, "profile": t.profile, "commits": len(t.points),
             "changes": [c.to_dict() for c in t.changes]} for t in trends]})
    else:
        print(f"trends: {out} ({len({t.cell for t in trends})} cell(s), {len(trends)} series, "
              f"{changes} change point(s))")
    return EXIT_OK


def _store_option(p: argparse.ArgumentParser) -> None:
    options.add_old_name(p, "--url", p.add_argument("--history", metavar="URL", help=HISTORY_HELP))


def _series_options(p: argparse.ArgumentParser) -> None:
    """Which runs a reader takes and how it values them: changes, show, report."""
    p.add_argument("--since", metavar="REF", help="only runs from this commit (or date YYYY-MM-DD) on "
                                                  "(default: every run)")
    p.add_argument("--branch", metavar="NAME", help="only runs of this branch (default: every branch)")
    _store_option(p)
    p.add_argument("--launch-statistic", choices=LAUNCH_STATISTICS, default=DEFAULT_LAUNCH_STATISTIC,
                   help=LAUNCH_STATISTIC_HELP)
    p.add_argument("--include", action="append", metavar="PURPOSES", help=INCLUDE_HELP)


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    """``perfsuite history ...`` on the CLI's subparsers (imports nothing heavy:
    every perfsuite command builds this parser)."""
    parser = subparsers.add_parser("history", help="runs kept per commit; change points in them")
    sub = parser.add_subparsers(dest="history_command", required=True, metavar="COMMAND")

    p = sub.add_parser("add", help="store a finished run (its results.json) in the history")
    p.add_argument("run", type=Path, help="run directory or results.json")
    p.add_argument("--commit", metavar="SHA", help="default: git rev-parse HEAD here, else the run's env")
    p.add_argument("--branch", metavar="NAME", help="default: the branch checked out here")
    _store_option(p)
    purpose = p.add_argument("--history-purpose", choices=PURPOSES,
                             help="mark the run so, also one already stored (default: experiment when its cells "
                                  "were launched with workload options, else run); an injected fault is always "
                                  "an experiment")
    options.add_old_name(p, "--purpose", purpose)
    p.add_argument("--json", action="store_true", help="print what was stored as JSON")
    p.set_defaults(func=_cmd_add)

    p = sub.add_parser("mark", help="re-mark stored runs: run, experiment or ad-hoc (the series read runs only)")
    p.add_argument("runs", nargs="+", metavar="RUN",
                   help="a stored run: its key (or 4+ characters of it), a commit (or its prefix), or the "
                        "folder or results.json it was added from; a commit names each run of it")
    _store_option(p)
    purpose = p.add_argument("--history-purpose", choices=PURPOSES,
                             help="the purpose the runs are marked with (required: no default)")
    options.add_old_name(p, "--purpose", purpose)
    p.add_argument("--json", action="store_true", help="print the runs marked as JSON")
    p.set_defaults(func=_cmd_mark)

    p = sub.add_parser("changes", help="change points per cell, metric and hardware profile; "
                                       "exit 1 when the newest run sits after a regression (with "
                                       "--confirm: one an A/B confirms)")
    p.add_argument("--cell", metavar="PATTERN", help="a cell id or a glob, smoke/image/* (default: every cell)")
    p.add_argument("--metric", default=DEFAULT_METRIC, metavar="NAME", help="the metric of the series")
    _series_options(p)
    p.add_argument("--max-pvalue", type=float, default=DEFAULT_MAX_PVALUE,
                   help="significance of a change point (Otava's t-test)")
    p.add_argument("--min-change", type=float, default=0.0, metavar="FRACTION",
                   help="keep a significant change point only beyond this relative size")
    p.add_argument("--window", type=int, default=DEFAULT_WINDOW, metavar="COMMITS",
                   help="commits per window of Otava's split step")
    p.add_argument("--confirm", action="store_true",
                   help="measure each regression at a head again, by an A/B of its first bad commit against its "
                        "last good one in --repo: exit 1 only where the A/B says regressed, 3 where it is undecided")
    p.add_argument("--repo", type=Path, default=Path("."), metavar="DIR",
                   help="with --confirm: the git repository of the history's commits (default: here)")
    p.add_argument("--bisect", action="store_true",
                   help="with --confirm: bisect a confirmed change where commits lie between its two")
    p.add_argument("--out", type=Path, metavar="DIR",
                   help="with --confirm: the A/B sessions' folder (default: .perfsuite/confirm-<time>-<pid>)")
    p.add_argument("--json", action="store_true", help="print the changes as JSON")
    p.add_argument("-v", "--verbose", action="store_true", help="list series without changes too")
    p.set_defaults(func=_cmd_changes)

    p = sub.add_parser("show", help="print a cell's series: commit, time, value, per profile")
    p.add_argument("cell", metavar="CELL", help="a cell id or a glob")
    p.add_argument("--metric", default=DEFAULT_METRIC, metavar="NAME", help="the metric of the series")
    _series_options(p)
    p.add_argument("--json", action="store_true", help="print the series' points as JSON")
    p.set_defaults(func=_cmd_show)

    p = sub.add_parser("report", help="write the trends page: per cell and metric the values over "
                                      "commits, change points marked, one series per hardware profile")
    p.add_argument("--out", type=Path, metavar="PATH",
                   help="the page (default: trends.html beside the SQLite store, "
                        ".perfsuite/trends.html for the default one; else ./trends.html)")
    p.add_argument("--cell", action="append", metavar="PATTERN",
                   help="a cell id or a glob (smoke/image/*); repeat for more (default: every cell)")
    p.add_argument("--metric", action="append", metavar="NAME",
                   help=f"repeat for more (default: {DEFAULT_METRIC})")
    _series_options(p)
    p.add_argument("--max-pvalue", type=float, default=DEFAULT_MAX_PVALUE, help="as `history changes`")
    p.add_argument("--window", type=int, default=DEFAULT_WINDOW, metavar="COMMITS", help="as `history changes`")
    p.add_argument("--json", action="store_true", help="print the page's path and its series' change points as JSON")
    p.set_defaults(func=_cmd_report)

    cli_selftest.add_old_command(sub, "detection", "history-detection")
