"""``perfsuite history``: add, changes, show, detection (see perfsuite.history and
perfsuite.history_changes)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EXIT_OK, EXIT_REGRESSED, EXIT_USAGE = 0, 1, 2
# As perfsuite.history and history_changes have them (a test checks), without importing them here.
DEFAULT_METRIC, DEFAULT_MAX_PVALUE, DEFAULT_WINDOW = "step_time", 0.0001, 20
LAUNCH_STATISTICS, DEFAULT_LAUNCH_STATISTIC = ("floor", "median"), "floor"
LAUNCH_STATISTIC_HELP = ("what each launch of a step time gives its run's point: its floor (fastest "
                         "step; neighbours on a shared machine only ever add time) or its median")
URL_HELP = ("history store: an SQLite file or any SQLAlchemy URL, e.g. postgresql://user@host/db "
            "(default .perfsuite/history.sqlite)")


def _fail(command: str, err: Exception) -> int:
    print(f"perfsuite history {command}: {err}", file=sys.stderr)
    return EXIT_USAGE


def _cmd_add(args: argparse.Namespace) -> int:
    from perfsuite.history import History, HistoryError

    try:
        with History(args.url) as history:
            added = history.add_run(args.run, commit=args.commit, branch=args.branch)
    except HistoryError as err:
        return _fail("add", err)
    print(added.describe())
    return EXIT_OK


def _fmt(value: float, unit: str | None) -> str:
    return f"{value:.6g}{f' {unit}' if unit else ''}"


def _change_lines(change) -> list[str]:
    from perfsuite.history import when

    if change.ratio is not None:
        r = change.ratio
        size = (f"x{r.estimate:.4f} ({r.low:.4f}-{r.high:.4f}, {r.confidence:.0%} {r.method})")
    else:
        size = f"{_fmt(change.last_good.value, None)} -> {_fmt(change.first_bad.value, None)}"
    before, after = ("last good", "first bad") if change.direction == "regressed" else (
        "last before", "first after")
    lines = [f"  {change.direction} {size}, p={change.pvalue:.2g}",
             f"    {before} {change.last_good.commit[:12]} ({when(change.last_good.time)}, "
             f"{_fmt(change.last_good.value, change.last_good.unit)})",
             f"    {after} {change.first_bad.commit[:12]} ({when(change.first_bad.time)}, "
             f"{_fmt(change.first_bad.value, change.first_bad.unit)})"]
    if change.counter_lines is None:
        lines.append("    work counters: not recorded on both runs")
    elif not change.counter_lines:
        lines.append("    work counters: unchanged (the same work per step)")
    else:
        lines += [f"    work counters: {line}" for line in change.counter_lines]
    return lines


def _cmd_changes(args: argparse.Namespace) -> int:
    from perfsuite.history import History, HistoryError
    from perfsuite.history_changes import find_changes, regressed_at_head

    if not 0 < args.max_pvalue < 1 or args.min_change < 0 or args.window < 2:
        return _fail("changes", ValueError("--max-pvalue must lie in (0, 1), --min-change >= 0, "
                                           "--window >= 2"))
    try:
        with History(args.url, create=False) as history:
            series = history.series(cell=args.cell, metric=args.metric, since=args.since,
                                    branch=args.branch, launch_statistic=args.launch_statistic)
    except HistoryError as err:
        return _fail("changes", err)
    if not series:
        if args.cell:  # a name that matches nothing must not pass a nightly gate quietly
            return _fail("changes", LookupError(f"no {args.metric} history of {args.cell} "
                                                "(`perfsuite history show` lists a cell's runs)"))
        print(f"no {args.metric} history yet")
        return EXIT_OK
    report, at_head = [], []
    for (cell, metric, profile), points in series.items():
        changes = find_changes(points, cell=cell, metric=metric, profile=profile,
                               max_pvalue=args.max_pvalue, min_change=args.min_change,
                               window=args.window)
        if regressed_at_head(changes):
            at_head.append(changes[-1])
        report.append((cell, metric, profile, points, changes))
    if args.json:
        print(json.dumps({"series": [{"cell": c, "metric": m, "profile": p, "commits": len(points),
                                      "changes": [ch.to_dict() for ch in changes]}
                                     for c, m, p, points, changes in report],
                          "regressed_at_head": [ch.to_dict() for ch in at_head]}, indent=1))
    else:
        for cell, metric, profile, points, changes in report:
            if not changes and not args.verbose:
                continue
            print(f"{cell} {metric} [{profile}] {len(points)} commit(s): "
                  f"{len(changes) or 'no'} change point(s)")
            for change in changes:
                print("\n".join(_change_lines(change)))
        found = sum(len(r[4]) for r in report)
        print(f"{found} change point(s) in {len(report)} series (Apache Otava E-Divisive, "
              f"p <= {args.max_pvalue:g}, windows of {args.window})")
        for change in at_head:
            print(f"REGRESSED at head: {change.cell} {change.metric} [{change.profile}] since "
                  f"{change.first_bad.commit[:12]}")
    return EXIT_REGRESSED if at_head else EXIT_OK


def _cmd_show(args: argparse.Namespace) -> int:
    from perfsuite.history import History, HistoryError, when

    try:
        with History(args.url, create=False) as history:
            series = history.series(cell=args.cell, metric=args.metric, since=args.since,
                                    branch=args.branch, launch_statistic=args.launch_statistic)
            known = history.cell_ids() if not series else []
    except HistoryError as err:
        return _fail("show", err)
    if not series:
        import difflib

        close = difflib.get_close_matches(args.cell, known, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        return _fail("show", LookupError(f"no {args.metric} history of {args.cell}{hint}"))
    for (cell, metric, profile), points in series.items():
        print(f"{cell} {metric} [{profile}]")
        print(f"  {'commit':12}  {'time':20}  {'value':>14}  launches  branch")
        for point in points:
            runs = f" ({len(point.values)} runs)" if len(point.values) > 1 else ""
            print(f"  {point.commit[:12]:12}  {when(point.time):20}  "
                  f"{_fmt(point.value, point.unit):>14}  {point.launches:8}  {point.branch or '-'}{runs}")
    return EXIT_OK


def _cmd_report(args: argparse.Namespace) -> int:
    from perfsuite.history import HistoryError
    from perfsuite.report.trends import write_trends_page

    if not 0 < args.max_pvalue < 1 or args.window < 2:
        return _fail("report", ValueError("--max-pvalue must lie in (0, 1), --window >= 2"))
    cells = args.cell or None
    try:
        out, trends = write_trends_page(args.url, args.out, cells, args.metric or [DEFAULT_METRIC],
                                        since=args.since, branch=args.branch,
                                        max_pvalue=args.max_pvalue, window=args.window,
                                        launch_statistic=args.launch_statistic)
    except (HistoryError, LookupError) as err:
        return _fail("report", err)
    changes = sum(len(t.changes) for t in trends)
    print(f"trends: {out} ({len({t.cell for t in trends})} cell(s), {len(trends)} series, "
          f"{changes} change point(s))")
    return EXIT_OK


def _cmd_detection(args: argparse.Namespace) -> int:
    from perfsuite import history_detection

    try:
        launches = [int(x) for x in str(args.launches).split(",") if x.strip()]
        if args.series < 1 or not launches or min(launches) < 1 or args.commits < 12:
            raise ValueError
    except ValueError:
        return _fail("detection", ValueError("--series >= 1, --launches N[,N...] each >= 1, "
                                             "--commits >= 12"))
    try:
        noise = history_detection.load_noise(args.runs_dir, args.baselines, args.launch_statistic)
    except history_detection.NoNoise as err:
        return _fail("detection", err)
    return history_detection.run(noise, series=args.series, launches=launches, commits=args.commits,
                                 step=args.step, drift=args.drift, seed=args.seed,
                                 by_session=args.by_session, max_pvalue=args.max_pvalue)


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    """``perfsuite history ...`` on the CLI's subparsers (imports nothing heavy:
    every perfsuite command builds this parser)."""
    parser = subparsers.add_parser("history", help="runs kept per commit; change points in them")
    sub = parser.add_subparsers(dest="history_command", required=True)

    p = sub.add_parser("add", help="store a finished run (its results.json) in the history")
    p.add_argument("run", type=Path, help="run directory or results.json")
    p.add_argument("--commit", metavar="SHA", help="default: git rev-parse HEAD here, else the run's env")
    p.add_argument("--branch", metavar="NAME", help="default: the branch checked out here")
    p.add_argument("--url", help=URL_HELP)
    p.set_defaults(func=_cmd_add)

    p = sub.add_parser("changes", help="change points per cell, metric and hardware profile; "
                                       "exit 1 when the newest run sits after a regression")
    p.add_argument("--cell", metavar="PATTERN", help="a cell id or a glob (smoke/image/*)")
    p.add_argument("--metric", default=DEFAULT_METRIC, metavar="NAME")
    p.add_argument("--since", metavar="REF", help="only runs from this commit (or date YYYY-MM-DD) on")
    p.add_argument("--branch", metavar="NAME", help="only runs of this branch")
    p.add_argument("--url", help=URL_HELP)
    p.add_argument("--max-pvalue", type=float, default=DEFAULT_MAX_PVALUE,
                   help="significance of a change point (Otava's t-test; default %(default)s)")
    p.add_argument("--min-change", type=float, default=0.0, metavar="FRACTION",
                   help="keep a significant change point only beyond this relative size")
    p.add_argument("--window", type=int, default=DEFAULT_WINDOW, metavar="COMMITS",
                   help="commits per window of Otava's split step (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the changes as JSON")
    p.add_argument("-v", "--verbose", action="store_true", help="list series without changes too")
    p.add_argument("--launch-statistic", choices=LAUNCH_STATISTICS, default=DEFAULT_LAUNCH_STATISTIC,
                   help=LAUNCH_STATISTIC_HELP)
    p.set_defaults(func=_cmd_changes)

    p = sub.add_parser("show", help="print a cell's series: commit, time, value, per profile")
    p.add_argument("cell", metavar="CELL", help="a cell id or a glob")
    p.add_argument("--metric", default=DEFAULT_METRIC, metavar="NAME")
    p.add_argument("--since", metavar="REF")
    p.add_argument("--branch", metavar="NAME")
    p.add_argument("--url", help=URL_HELP)
    p.add_argument("--launch-statistic", choices=LAUNCH_STATISTICS, default=DEFAULT_LAUNCH_STATISTIC,
                   help=LAUNCH_STATISTIC_HELP)
    p.set_defaults(func=_cmd_show)

    p = sub.add_parser("report", help="write the trends page: per cell and metric the values over "
                                      "commits, change points marked, one series per hardware profile")
    p.add_argument("--url", help=URL_HELP)
    p.add_argument("--out", type=Path, metavar="PATH",
                   help="the page (default: trends.html beside the SQLite store, "
                        ".perfsuite/trends.html for the default one; else ./trends.html)")
    p.add_argument("--cell", action="append", metavar="PATTERN",
                   help="a cell id or a glob (smoke/image/*); repeat for more (default: every cell)")
    p.add_argument("--metric", action="append", metavar="NAME",
                   help=f"repeat for more (default {DEFAULT_METRIC})")
    p.add_argument("--since", metavar="REF", help="only runs from this commit (or date YYYY-MM-DD) on")
    p.add_argument("--branch", metavar="NAME", help="only runs of this branch")
    p.add_argument("--max-pvalue", type=float, default=DEFAULT_MAX_PVALUE,
                   help="as `history changes` (default %(default)s)")
    p.add_argument("--window", type=int, default=DEFAULT_WINDOW, metavar="COMMITS",
                   help="as `history changes` (default %(default)s)")
    p.add_argument("--launch-statistic", choices=LAUNCH_STATISTICS, default=DEFAULT_LAUNCH_STATISTIC,
                   help=LAUNCH_STATISTIC_HELP)
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser("detection", help="how often `history changes` finds a 7 %% step at its "
                                         "commit, a 1 %%-per-commit drift, and nothing in unchanged "
                                         "code, on series built from this machine's measured launches")
    p.add_argument("--series", type=int, default=20, help="series per figure")
    p.add_argument("--launches", default="1,4,16,32,64", metavar="N[,N...]",
                   help="launches per nightly run (its value: their medians' median)")
    p.add_argument("--commits", type=int, default=30, help="commits per series")
    p.add_argument("--step", type=float, default=0.07, help="the step's size")
    p.add_argument("--drift", type=float, default=0.01, help="the drift per commit (10 commits)")
    p.add_argument("--by-session", action="store_true",
                   help="each run's launches from one measured session (keeps session-to-session "
                        "shifts) instead of from all launches")
    p.add_argument("--max-pvalue", type=float, default=DEFAULT_MAX_PVALUE)
    p.add_argument("--seed", type=int, default=20261124)
    p.add_argument("--runs-dir", type=Path, default=Path(".perfsuite"),
                   help="where A/B sessions' ab.json files are looked for")
    p.add_argument("--baselines", type=Path, default=Path("baselines"),
                   help="baselines root, for samples.json or launch_spread when no ab.json is found")
    p.add_argument("--launch-statistic", choices=LAUNCH_STATISTICS, default=DEFAULT_LAUNCH_STATISTIC,
                   help=LAUNCH_STATISTIC_HELP)
    p.set_defaults(func=_cmd_detection)
