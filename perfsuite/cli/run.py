"""``perfsuite run``: measure cells into results.json, print each verdict, write
the report, add the run to the history; ``--json`` for a summary on stdout."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from perfsuite import cells as cells_mod
from perfsuite import options
from perfsuite.cli.exits import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, UsageProblem, emit_json

# perfsuite.runner (numpy), perfsuite.judge (scipy, pandas), perfsuite.history
# (SQLAlchemy) and perfsuite.report: imported in the commands that use them.
# main imports every cli module to build its parser, and the CLI's first screen
# (perfsuite list, --help) imports nothing heavy.

HISTORY_HELP = ("history store the run is added to: an SQLite file or any SQLAlchemy URL, 'off' for none "
                "(default: $PERFSUITE_HISTORY, else .perfsuite/history.sqlite)")


def add_launch_group(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The options that launch cells, the same on run, ab and bisect (and, as
    --perf-NAME, pytest's)."""
    group = parser.add_argument_group("launching cells", "the same on run, ab and bisect; pytest's "
                                                         "--perf-NAME options of the same names")
    return options.add_launch_options(group.add_argument)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="measure cells: results.json, the verdicts, the report, the history")
    p.add_argument("ids", nargs="*", metavar="ID", help="cell ids (`perfsuite list` prints them)")
    p.add_argument("--tier", choices=[*cells_mod.TIERS, "all"], help="every cell of a tier (default: the ids given)")
    p.add_argument("--workload", choices=cells_mod.WORKLOADS,
                   help="only cells of this workload (default: every one)")
    p.add_argument("--out", type=Path, metavar="DIR", help="output directory (default: .perfsuite/run-<time>-<pid>)")
    launching = add_launch_group(p)
    options.add_old_name(p, "--profile", launching["profiler"])
    p.add_argument("--baselines", type=Path, metavar="DIR",
                   help="baselines root (default: $PERFSUITE_BASELINES, else the project's baselines/)")
    p.add_argument("--runner-baselines", type=Path, metavar="DIR",
                   help="this runner's own baselines root, searched after --baselines (default: none)")
    p.add_argument("--record-new", action="store_true",
                   help="record what a cell had no baseline for (its times on this hardware, its "
                        "counters on this stack) into --runner-baselines: a runner's first run "
                        "records, later runs judge")
    p.add_argument("--no-probe", action="store_true", help="skip the pre-flight probe")
    p.add_argument("--repeats", type=int, default=1, metavar="N",
                   help="launch every cell N times (from 4, verdicts weigh their spread)")
    p.add_argument("--resume", action="store_true",
                   help="keep cells an earlier run into --out measured fully")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the run already in --out (refused otherwise)")
    p.add_argument("--history", metavar="URL", help=HISTORY_HELP)
    p.add_argument("--history-purpose", choices=options.HISTORY_PURPOSES,
                   help="mark the stored run so (default: experiment with --option, ad-hoc with an --out "
                        "outside .perfsuite/ and no store named, else run); an injected fault is always "
                        "an experiment")
    p.add_argument("--commit", metavar="SHA",
                   help="the commit the run is stored under (default: git rev-parse HEAD here, else the "
                        "run's env)")
    p.add_argument("--branch", metavar="NAME", help="the branch it is stored under (default: the one "
                                                    "checked out here, none outside git)")
    p.add_argument("--fail-on-skipped", action="store_true",
                   help="exit 1 when a comparison could not be made (no comparable baseline, "
                        "a skipped cell): for CI, where a green run must have judged something; a "
                        "cell that needs more GPUs than the machine has is listed as not run, and a "
                        "baseline --record-new recorded is said so, neither a failure")
    p.add_argument("--json", action="store_true",
                   help="print a JSON summary on stdout at the end (results.json's path, each "
                        "cell's status and failed checks); progress goes to stderr")
    p.set_defaults(func=cmd_run, launches_cells=True)


def cmd_run(args: argparse.Namespace) -> int:
    from perfsuite.judge.baselines import BaselineError
    from perfsuite.runner import Runner, SessionError, default_out_dir, handle_sigterm, launch_options

    if not args.ids and not args.tier:
        raise UsageProblem("perfsuite run: give cell ids or --tier; `perfsuite list` prints ids")
    chosen = cells_mod.select(tier=args.tier, workload=args.workload, ids=args.ids)
    for cell_id in dict.fromkeys(i for i in args.ids if args.ids.count(i) > 1):  # select took it once
        times = args.ids.count(cell_id)
        print(f"perfsuite run: {cell_id} is given {'twice' if times == 2 else f'{times} times'}; it is measured once")
    if not chosen:  # a green run must have measured something
        asked = ", ".join(f"{k} {v}" for k, v in (("tier", args.tier), ("workload", args.workload)) if v)
        raise UsageProblem(f"perfsuite run: {asked} selects no cell; `perfsuite list"
                           f"{f' --tier {args.tier}' if args.tier else ''}` prints the cells there are")
    try:
        launch = launch_options(
            data_dir=args.data_dir, options=args.option, timeout=args.timeout,
            profiler=args.profiler, gpus=args.gpus, nnodes=args.nnodes,
            rdzv_endpoint=args.rdzv_endpoint, rdzv_id=args.rdzv_id, slurm=args.slurm,
            rank_start=args.rank_start)
        if args.repeats < 1:
            raise ValueError("--repeats must be at least 1")
    except ValueError as err:
        raise UsageProblem(f"perfsuite run: {err}") from None
    gpu_cells = [c.id for c in chosen if c.device == "cuda"]
    if not args.allow_no_gpu:
        from perfsuite.hardware import gpu_cells_without_gpu

        problem = gpu_cells_without_gpu(gpu_cells, "--allow-no-gpu")
        if problem:
            raise UsageProblem(f"perfsuite run: {problem}")
    launch.on_progress = lambda cell, line: print(f"    {cell.id}: {line}", flush=True)
    from perfsuite.history.store import HistoryError, check_store_usable

    try:  # a store that cannot take the run says so now, not after the measuring
        check_store_usable(args.history)
    except HistoryError as err:
        raise UsageProblem(f"perfsuite run: {err}") from None
    try:
        runner = Runner(args.out or default_out_dir(), launch, resume=args.resume,
                        repeats=args.repeats, baselines=args.baselines, probe=not args.no_probe,
                        overwrite=args.overwrite, on_notice=lambda line: print(f"perfsuite: {line}"),
                        runner_baselines=args.runner_baselines, record_new=args.record_new)
    except ValueError as err:
        raise UsageProblem(f"perfsuite run: {err}") from None
    runner.allow_no_gpu = args.allow_no_gpu  # read by its pre-flight probe
    runner.history_purpose = args.history_purpose  # read when it is added to the history
    try:
        runner.begin()
    except (SessionError, BaselineError) as err:
        raise UsageProblem(f"perfsuite run: {err}") from None
    restore = handle_sigterm()  # SIGTERM, SIGHUP: as Ctrl-C, and once
    measured: list = []
    ending = {"json_args": args if args.json else None, "history": args.history, "commit": args.commit,
              "branch": args.branch}
    try:
        return _run_cells(runner, chosen, args.fail_on_skipped, measured, **ending)
    except KeyboardInterrupt as stop:
        from perfsuite.system.lifetime import finishing

        finishing()  # a second Ctrl-C waits for the summary, the report and the mark
        print(f"interrupted ({str(stop) or 'Ctrl-C'}): {len(runner.results)} cell(s) kept in "
              f"{runner.out_dir / 'results.json'}; the same command with --resume measures the rest",
              file=sys.stderr, flush=True)
        # the cells kept get their summary, report and mark, as at a run's end
        _end_of_run(runner, measured, EXIT_INTERRUPTED, interrupted=True, **ending)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # stdout's reader left: main ends quietly
        raise
    except OSError as err:  # a full disk, a mount gone read-only
        print(f"perfsuite run: cannot write the results ({err}); {len(runner.results)} cell(s) "
              f"measured, each also kept in its cell directory under {runner.out_dir / 'cells'}",
              file=sys.stderr)
        return EXIT_USAGE
    finally:
        runner.end()
        if restore is not None:
            restore()


def _run_cells(runner, chosen: list, fail_on_skipped: bool, measured: list, **ending) -> int:
    """Measure ``chosen`` one by one (each result also appended to
    ``measured``), then the end of the run: ``_end_of_run``."""
    from perfsuite.judge.judging import failures, none_could_run, unjudged
    from perfsuite.report import probe_lines, summary_lines

    bad = 0
    for i, cell in enumerate(chosen, 1):
        print(f"[{i}/{len(chosen)}] {cell.id} ...", flush=True)
        result = runner.result(cell)
        measured.append(result)
        bad += (result["status"] not in ("ok", "skipped") or bool(failures(result))
                or (fail_on_skipped and bool(unjudged(result))))
        if i == 1:
            print("\n".join(probe_lines(runner.probe)), flush=True)
        print("\n".join("    " + line for line in summary_lines([result])), flush=True)
    nothing = fail_on_skipped and none_could_run(measured)
    if nothing:
        print(f"perfsuite run (--fail-on-skipped): {nothing}")
    return _end_of_run(runner, measured, EXIT_FAILED if bad or nothing else EXIT_OK, **ending)


def _end_of_run(runner, measured: list, code: int, json_args: argparse.Namespace | None = None,
                history: str | None = "off", commit: str | None = None, branch: str | None = None,
                interrupted: bool = False) -> int:
    """The skipped cells, where the results and the report are, the run
    kept in the history (an interrupted one only marked so), ``--json``'s
    document; ``code`` returned."""
    from perfsuite.judge.judging import failures
    from perfsuite.report import skipped_lines

    for line in skipped_lines(runner.results):
        print(line)
    kept = [r for r in runner.results if not r.get("partner")]
    report = None
    if not kept:
        print("no result written here")
    else:
        print(f"results: {runner.file.path}")
        from perfsuite.report.html import write_reports

        report = write_reports(runner.out_dir)["report_html"]
        print(f"report: {report}", flush=True)
    history_line = runner.add_to_history(history, interrupted=interrupted, commit=commit, branch=branch)
    if history_line:
        print(history_line)
    if code == EXIT_OK and getattr(runner, "history_unwritten", None):
        code = EXIT_USAGE  # measured and kept, but the history the run was for was not written
    if json_args is not None:
        emit_json(json_args, {
            "results": str(runner.file.path) if kept else None,
            "report": str(report) if report else None, "history": history_line, "exit": code,
            "interrupted": interrupted,
            "cells": [{"id": r["id"], "status": r["status"], "reason": r.get("reason"),
                       "failed_checks": failures(r),
                       "skipped_checks": [c["name"] for c in r.get("checks", [])
                                          if c["verdict"] == "skipped"]} for r in measured],
        })
    return code
