"""``perfsuite compare``, ``baseline record``, ``report`` and ``profile``: the
commands that read what a run wrote (results.json, an nsys report)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from perfsuite import options
from perfsuite.cli.exits import EXIT_FAILED, EXIT_OK, EXIT_UNDECIDED, UsageProblem, emit_json

# perfsuite.judge (scipy, pandas), perfsuite.report (matplotlib),
# perfsuite.profiling and the results schema: imported in the commands that use
# them. main imports every cli module to build its parser, and the CLI's first
# screen (perfsuite list, --help) imports nothing heavy.


def _load_run(path: Path) -> dict:
    from perfsuite.schemas.results import load

    try:
        return load(path)
    except (OSError, ValueError) as err:
        raise UsageProblem(f"perfsuite: {err}") from None


def cmd_compare(args: argparse.Namespace) -> int:
    from perfsuite.judge.comparing import compare_runs

    run_a, run_b = _load_run(args.run_a), _load_run(args.run_b)
    try:
        verdicts = compare_runs(run_a, run_b, tolerance=args.tolerance, confidence=args.confidence,
                                allow_other_hardware=args.allow_other_hardware,
                                launch_statistic=args.launch_statistic)
    except ValueError as err:  # what the loader lets through and no statistic can judge
        raise UsageProblem(f"perfsuite compare: {args.run_a} against {args.run_b}: {err}; fix that "
                           "cell's results, or measure it again") from None
    if args.json:
        emit_json(args, verdicts)
    else:
        for v in verdicts:
            print(f"{v.get('cell')}  {v['name']:<24} {v['verdict'].upper():<10} {v.get('message', '')}")
        from perfsuite.cli.diff import print_attributions

        print_attributions(run_a, run_b)  # where both sides of a cell were profiled
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
    from perfsuite.judge.baselines import BaselineError
    from perfsuite.judge.recording import record_run

    try:
        plan = record_run(_load_run(args.run), args.hardware_profile, root=args.baselines, force=args.force,
                          write=not args.dry_run, launch_statistic=args.launch_statistic)
    except BaselineError as err:
        print(f"perfsuite baseline record: {err}", file=sys.stderr)
        return 2
    if args.json:
        emit_json(args, {
            "folder": str(plan.folder), "written": plan.written,
            "changes": [{"id": r.id, "change": r.change, "old": _finite(r.old), "new": _finite(r.new),
                         "ratio": _finite(r.ratio)}
                        for r in plan.diff.itertuples() if r.change != "same"],
            "unchanged": int((plan.diff["change"] == "same").sum()),
            "launch_spread": {kind: {k: v.to_dict() for k, v in entries.items()}
                              for kind, entries in plan.launch_spreads.items()},
            "launch_statistic_chosen": plan.chosen or None, "kinds_without_spread": list(plan.unspread),
            "counted_cells": plan.counted_cells, "profiled_cells": plan.profiled_cells})
    else:
        print(plan.describe())
    return 0


def _finite(value: float | None) -> float | None:
    import math

    return float(value) if value is not None and math.isfinite(value) else None


def add_summary_options(p: argparse.ArgumentParser) -> None:
    """What the Markdown of --summary-md shows beside the verdicts (report and ab)."""
    p.add_argument("--error-rates", type=Path, metavar="FILE",
                   help="this runner's published error rates, shown beside each cell's verdict: the "
                        "perfsuite.error-rates/1 file `perfsuite selftest error-rates` writes (default: none)")
    p.add_argument("--artifacts-url", metavar="URL",
                   help="where the session's files can be downloaded, linked at the end (default: none)")


def error_rates(args: argparse.Namespace, command: str) -> dict | None:
    """--error-rates read before anything is measured or written; a bad file is a usage error."""
    if getattr(args, "error_rates", None) is None:
        return None
    from perfsuite.report.error_rates import load_error_rates

    try:
        return load_error_rates(args.error_rates)
    except ValueError as err:
        raise UsageProblem(f"perfsuite {command}: --error-rates {err}") from None


def write_summary(markdown: str, dest: str) -> str | None:
    """``markdown`` printed ('-') or appended to ``dest``: a CI step's summary
    file may hold other steps' lines. The path written, else None."""
    if dest == "-":
        print(markdown)
        return None
    with open(dest, "a", encoding="utf-8") as out:
        out.write(markdown + "\n")
    print(f"summary: {dest}")
    return dest


def ab_json_of(path: Path) -> Path | None:
    """An A/B session's ab.json, where ``path`` is one or its folder (and no run's)."""
    if path.name == "ab.json" and path.is_file():
        return path
    if path.is_dir() and (path / "ab.json").is_file() and not (path / "results.json").exists():
        return path / "ab.json"
    return None


def _report_ab(args: argparse.Namespace, path: Path) -> int:
    """report of an A/B session's folder: ab.png and ab.html again, and its pull-request comment."""
    import json

    from perfsuite.report.ab import write_ab_reports
    from perfsuite.report.pr_comment import ab_comment

    rates = error_rates(args, "report")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UsageProblem(f"perfsuite report: {path}: cannot read it ({err})") from None
    if not str(data.get("schema", "")).startswith("perfsuite.ab/"):
        raise UsageProblem(f"perfsuite report: {path}: not an A/B session's ab.json")
    written = {name: str(p) for name, p in write_ab_reports(data, path.parent).items()}
    for name, where in written.items():
        print(f"{name}: {where}")
    markdown = ab_comment(data, error_rates=rates, artifacts_url=args.artifacts_url) if args.summary_md else None
    if markdown is not None and write_summary(markdown, args.summary_md):
        written["summary_md"] = args.summary_md
    if args.json:
        emit_json(args, {**written, **({"summary_markdown": markdown} if args.summary_md == "-" else {})})
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from perfsuite.report.html import write_reports

    ab_json = ab_json_of(args.run)
    if ab_json is not None:
        return _report_ab(args, ab_json)
    run = _load_run(args.run)  # a clear message for a missing or malformed results.json
    rates = error_rates(args, "report")
    written = {name: str(path) for name, path in write_reports(args.run, error_rates=rates).items()}
    for name, path in written.items():
        print(f"{name}: {path}")
    markdown = None
    if args.summary_md:
        from perfsuite.report.markdown import summary_markdown

        markdown = summary_markdown(run, str(args.run), error_rates=rates, artifacts_url=args.artifacts_url)
        if write_summary(markdown, args.summary_md):
            written["summary_md"] = args.summary_md
    if args.json:
        emit_json(args, {**written, **({"summary_markdown": markdown} if args.summary_md == "-" else {})})
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    from perfsuite.profiling import NsysError, format_summary, summarize_path

    try:
        summary = summarize_path(args.path)
    except (NsysError, FileNotFoundError, ValueError) as err:
        print(f"perfsuite profile: {err}", file=sys.stderr)
        return 2
    if args.json:
        emit_json(args, summary.to_dict())
    else:
        print(format_summary(summary, top=args.top, h2d_limit_gbps=args.h2d_limit_gbps))
    return 0



def add_compare_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="per-cell verdicts of RUN_B against RUN_A")
    p.add_argument("run_a", type=Path, help="reference run (directory or results.json)")
    p.add_argument("run_b", type=Path, help="run to judge")
    p.add_argument("--tolerance", type=float, default=0.05, metavar="FRACTION",
                   help="a change within this fraction is the same; beyond it, with the interval "
                        "clear of 1, regressed or improved")
    p.add_argument("--confidence", type=float, default=0.95, help="of the step-time interval")
    p.add_argument("--allow-other-hardware", action="store_true",
                   help="compare absolute numbers across hardware profiles anyway")
    p.add_argument("--launch-statistic", choices=options.LAUNCH_STATISTICS,
                   default=options.DEFAULT_LAUNCH_STATISTIC, help=options.LAUNCH_STATISTIC_HELP)
    p.add_argument("--json", action="store_true", help="print the verdicts as a JSON array")
    p.set_defaults(func=cmd_compare)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """baseline record, report, profile."""
    p = sub.add_parser("baseline", help="stored baselines: record a run as its hardware's")
    baseline = p.add_subparsers(dest="baseline_command", required=True, metavar="COMMAND")
    p = baseline.add_parser("record", help="record a run as the baseline of its hardware profile")
    p.add_argument("run", type=Path, help="run directory or results.json")
    hardware = p.add_argument("--hardware-profile", metavar="ID",
                              help="the hardware profile's folder to record into (default: the run's own)")
    options.add_old_name(p, "--profile", hardware)
    root = p.add_argument("--baselines", type=Path, metavar="DIR",
                          help="baselines root (default: $PERFSUITE_BASELINES, else the project's baselines/)")
    options.add_old_name(p, "--root", root)
    p.add_argument("--force", action="store_true",
                   help="write into a folder of another hardware profile")
    p.add_argument("--dry-run", action="store_true", help="show the difference, write nothing")
    p.add_argument("--launch-statistic", choices=options.LAUNCH_STATISTICS,
                   help=options.LAUNCH_STATISTIC_HELP + "; kept in the folder's profile.json (default: as set "
                   "there by hand; else the steadier of the two once the folder's repeated launches show both "
                   f"over {options.STEADIER_DOF} d.o.f., {options.DEFAULT_LAUNCH_STATISTIC} before)")
    p.add_argument("--json", action="store_true",
                   help="print the folder, the rows that changed and the launch spread as JSON")
    p.set_defaults(func=cmd_baseline_record)

    p = sub.add_parser("report", help="write results.csv, checks.csv and report.html of a run "
                                      "(ab.png and ab.html of an A/B session)")
    p.add_argument("run", type=Path, help="run directory or results.json; or an A/B session's folder or ab.json")
    p.add_argument("--summary-md", metavar="PATH",
                   help="also append the verdicts as Markdown to PATH ('-': print them), "
                        'e.g. "$GITHUB_STEP_SUMMARY", a CI job\'s summary page; of an A/B session, its '
                        "pull-request comment (default: none)")
    add_summary_options(p)
    p.add_argument("--json", action="store_true", help="print the files written as JSON")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("profile", help="summarise an nsys report, its CSV exports, "
                                       "or a perfsuite profile summary")
    p.add_argument("path", type=Path, help="a .nsys-rep, a folder of its `nsys stats` CSVs, a torch.profiler "
                                           "trace, or a cell's profile/ folder")
    p.add_argument("--top", type=int, default=15, metavar="N", help="kernels listed")
    p.add_argument("--h2d-limit-gbps", type=float,
                   help="host-to-device limit to compare with, GB/s (default: none)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd_profile)
