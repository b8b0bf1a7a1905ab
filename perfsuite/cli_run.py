"""``perfsuite run``: measure cells into results.json, print each verdict, write
the report, add the run to the history; ``--json`` for a summary on stdout."""

from __future__ import annotations

import argparse
import json
import sys

from perfsuite import cells as cells_mod
from perfsuite.cli_exits import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, UsageProblem


def cmd_run(args: argparse.Namespace) -> int:
    from perfsuite.baselines import BaselineError
    from perfsuite.runner import Runner, SessionError, default_out_dir, handle_sigterm, launch_options

    if not args.ids and not args.tier:
        raise UsageProblem("perfsuite run: give cell ids or --tier; `perfsuite list` prints ids")
    chosen = cells_mod.select(tier=args.tier, workload=args.workload, ids=args.ids)
    try:
        launch = launch_options(
            data_dir=args.data_dir, options=args.option, timeout=args.timeout,
            profiler=args.profile, gpus=args.gpus, nnodes=args.nnodes,
            rdzv_endpoint=args.rdzv_endpoint, rdzv_id=args.rdzv_id, slurm=args.slurm)
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
    runner = Runner(args.out or default_out_dir(), launch, resume=args.resume,
                    repeats=args.repeats, baselines=args.baselines, probe=not args.no_probe,
                    overwrite=args.overwrite, on_notice=lambda line: print(f"perfsuite: {line}"))
    runner.allow_no_gpu = args.allow_no_gpu  # read by its pre-flight probe
    try:
        runner.begin()
    except (SessionError, BaselineError) as err:
        raise UsageProblem(f"perfsuite run: {err}") from None
    handle_sigterm()
    try:
        return _run_cells(runner, chosen, args.fail_on_skipped, json_out=args.json_out,
                          history=args.history)
    except KeyboardInterrupt as stop:
        print(f"interrupted ({str(stop) or 'Ctrl-C'}): {len(runner.results)} cell(s) kept in "
              f"{runner.out_dir / 'results.json'}", file=sys.stderr)
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


def cmd_run_maybe_json(args: argparse.Namespace) -> int:
    """``run --json``: stdout carries one JSON document at the end (_run_cells
    writes it to the stdout kept here); everything said on the way, by
    cmd_run, the runner's notices and progress, goes to stderr."""
    if not args.json:
        return cmd_run(args)
    import contextlib

    args.json_out = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        return cmd_run(args)


def _run_cells(runner, chosen: list, fail_on_skipped: bool, json_out=None,
               history: str | None = "off") -> int:
    from perfsuite.judge import failures
    from perfsuite.report import probe_lines, skipped_lines, summary_lines

    bad = 0
    measured = []
    for i, cell in enumerate(chosen, 1):
        print(f"[{i}/{len(chosen)}] {cell.id} ...", flush=True)
        result = runner.result(cell)
        measured.append(result)
        skipped = result["status"] == "skipped" or any(
            c["verdict"] == "skipped" for c in result.get("checks", []))
        bad += (result["status"] not in ("ok", "skipped") or bool(failures(result))
                or (fail_on_skipped and skipped))
        if i == 1:
            print("\n".join(probe_lines(runner.probe)), flush=True)
        print("\n".join("    " + line for line in summary_lines([result])), flush=True)
    for line in skipped_lines(runner.results):
        print(line)
    kept = [r for r in runner.results if not r.get("partner")]
    code = EXIT_FAILED if bad else EXIT_OK
    report = None
    if not kept:
        print("no result written here")
    else:
        print(f"results: {runner.file.path}")
        from perfsuite.report.html import write_reports

        report = write_reports(runner.out_dir)["report_html"]
        print(f"report: {report}")
        history_line = runner.add_to_history(history)
        if history_line:
            print(history_line)
    if json_out is not None:
        print(json.dumps({
            "results": str(runner.file.path) if kept else None,
            "report": str(report) if report else None, "exit": code,
            "cells": [{"id": r["id"], "status": r["status"], "reason": r.get("reason"),
                       "failed_checks": failures(r),
                       "skipped_checks": [c["name"] for c in r.get("checks", [])
                                          if c["verdict"] == "skipped"]} for r in measured],
        }, indent=1, default=str), file=json_out, flush=True)
    return code

