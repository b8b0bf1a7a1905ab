"""``perfsuite compare``, ``baseline record``, ``report`` and ``profile``: the
commands that read what a run wrote (results.json, an nsys report)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from perfsuite.cli_exits import EXIT_FAILED, EXIT_OK, EXIT_UNDECIDED, UsageProblem


def _load_run(path: Path) -> dict:
    from perfsuite.results import load

    try:
        return load(path)
    except (OSError, ValueError) as err:
        raise UsageProblem(f"perfsuite: {err}") from None


def cmd_compare(args: argparse.Namespace) -> int:
    from perfsuite.comparing import compare_runs

    run_a, run_b = _load_run(args.run_a), _load_run(args.run_b)
    verdicts = compare_runs(run_a, run_b, tolerance=args.tolerance, confidence=args.confidence,
                            allow_other_hardware=args.allow_other_hardware,
                            launch_statistic=args.launch_statistic)
    if args.json:
        print(json.dumps(verdicts, indent=1, default=str))
    else:
        for v in verdicts:
            print(f"{v.get('cell')}  {v['name']:<24} {v['verdict'].upper():<10} {v.get('message', '')}")
    if any(v["verdict"] in ("regressed", "fail") for v in verdicts):
        return EXIT_FAILED
    shared = {c["id"] for c in run_a["cells"]} & {c["id"] for c in run_b["cells"]}
    if not shared:  # nothing compared is not a pass
        print(f"perfsuite compare: the two runs share no cell ({args.run_a}: "
              f"{len(run_a['cells'])} cell(s), {args.run_b}: {len(run_b['cells'])}); "
              "nothing was compared", file=sys.stderr)
        return EXIT_UNDECIDED
    return EXIT_OK


def cmd_baseline_record(args: argparse.Namespace) -> int:
    from perfsuite.baselines import BaselineError
    from perfsuite.recording import record_run

    try:
        plan = record_run(_load_run(args.run), args.profile, root=args.root, force=args.force,
                          write=not args.dry_run, launch_statistic=args.launch_statistic)
    except BaselineError as err:
        print(f"perfsuite baseline record: {err}", file=sys.stderr)
        return 2
    print(plan.describe())
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from perfsuite.report.html import write_reports

    _load_run(args.run)  # a clear message for a missing or malformed results.json
    for name, path in write_reports(args.run).items():
        print(f"{name}: {path}")
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    from perfsuite.profiling import NsysError, format_summary, summarize_path

    try:
        summary = summarize_path(args.path)
    except (NsysError, FileNotFoundError, ValueError) as err:
        print(f"perfsuite profile: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(summary.to_dict(), indent=1))
    else:
        print(format_summary(summary, top=args.top, h2d_limit_gbps=args.h2d_limit_gbps))
    return 0

