"""The ``perfsuite`` command: list, run, compare, ab, baseline record, report, profile, overhead, doctor."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from perfsuite import cells as cells_mod


def _cmd_list(args: argparse.Namespace) -> int:
    chosen = cells_mod.select(tier=args.tier, workload=args.workload)
    if args.json:
        print(json.dumps([{"id": cell.id, "params": cell.params()} for cell in chosen], indent=1))
        return 0
    for cell in chosen:
        print(cell.id)
    return 0


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("perfsuite")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _cmd_doctor(args: argparse.Namespace) -> int:
    from perfsuite import doctor

    checks = doctor.run_checks(tier=args.tier, data_dir=args.data_dir)
    if args.json:
        print(json.dumps(doctor.summary(checks, args.tier), indent=1))
    else:
        print(doctor.text(checks, args.tier))
    return EXIT_FAILED if any(c.status == doctor.BLOCKER for c in checks) else EXIT_OK


class UsageProblem(Exception):
    """A command-line problem found before anything was measured: exit 2."""


EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNDECIDED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


def _cmd_run(args: argparse.Namespace) -> int:
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
    if gpu_cells and not args.allow_no_gpu:
        from perfsuite.hardware import why_no_gpu

        why = why_no_gpu()
        if why is not None:  # skipping every cell would exit 0 having measured nothing
            raise UsageProblem(
                f"perfsuite run: {len(gpu_cells)} GPU cell(s) selected ({gpu_cells[0]}"
                f"{', ...' if len(gpu_cells) > 1 else ''}), and torch sees no GPU: {why}. "
                "Nothing was launched; pass --allow-no-gpu to skip the GPU cells instead")
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


def _cmd_run_maybe_json(args: argparse.Namespace) -> int:
    """``run --json``: stdout carries one JSON document at the end (_run_cells
    writes it to the stdout kept here); everything said on the way, by
    _cmd_run, the runner's notices and progress, goes to stderr."""
    if not args.json:
        return _cmd_run(args)
    import contextlib

    args.json_out = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        return _cmd_run(args)


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


def _load_run(path: Path) -> dict:
    from perfsuite.results import load

    try:
        return load(path)
    except (OSError, ValueError) as err:
        raise UsageProblem(f"perfsuite: {err}") from None


def _cmd_compare(args: argparse.Namespace) -> int:
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


def _cmd_baseline_record(args: argparse.Namespace) -> int:
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


def _cmd_report(args: argparse.Namespace) -> int:
    from perfsuite.report.html import write_reports

    _load_run(args.run)  # a clear message for a missing or malformed results.json
    for name, path in write_reports(args.run).items():
        print(f"{name}: {path}")
    return 0


def _cmd_profile(args: argparse.Namespace) -> int:
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


def _cmd_detection(args: argparse.Namespace) -> int:
    from perfsuite.detection import measure_ab_detection, measure_counter_detection, measure_detection

    if args.ab:
        out = measure_ab_detection(trials=args.trials, cell_id=args.cell, steps=args.steps,
                                   max_launches=args.max_launches, work_dir=args.work_dir)
        print(json.dumps(out, indent=1))
        n = out["trials"]
        print(f"perfsuite ab, unchanged B called regressed: {out['false_alarms']}/{n} (goal <= 1/20)")
        print(f"perfsuite ab, 10% slower B called regressed: {out['caught_10']}/{n} (goal >= 19/20)")
        print(f"perfsuite ab,  5% slower B called regressed: {out['caught_5']}/{n} (goal >= 16/20)")
        print(f"median wall time per A/B session: {out['median_seconds']} (goal <= 180 s)")
        return 0
    if args.counters:
        out = measure_counter_detection(trials=args.trials, cell_id=args.cell,
                                        work_dir=args.work_dir)
        print(json.dumps(out, indent=1))
        n = out["trials"]
        print(f"unchanged code passed the counter check:  {out['unchanged_passed']}/{n} (goal 20/20)")
        print(f"one extra all-reduce per step failed it:   {out['allreduce_failed']}/{n} (goal 20/20)")
        print(f"one extra copy of every parameter failed: {out['copy_failed']}/{n} (goal 20/20)")
        print(f"counting window: {out['window_overhead']:+.1%} of a launch's wall time "
              f"(median {out['wall_median_s']['counted']} s vs {out['wall_median_s']['bare']} s "
              "without; goal <= +10 %)")
        return 0
    try:
        out = measure_detection(trials=args.trials, cell_id=args.cell, steps=args.steps,
                                launches=args.launches,
                                reference_launches=args.reference_launches,
                                statistic=args.launch_statistic, work_dir=args.work_dir,
                                resume=args.resume)
    except ValueError as err:
        print(f"perfsuite detection: {err}", file=sys.stderr)
        return 2
    print(json.dumps({k: v for k, v in out.items() if k != "per_trial"}, indent=1))
    n = out["trials"]
    print(f"false alarms on unchanged code: {out['false_alarms']}/{n} (goal <= 1/20)")
    print(f"10% slowdown called regressed:  {out['caught_10']}/{n} (goal >= 19/20)")
    print(f" 5% slowdown called regressed:  {out['caught_5']}/{n}")
    spread = [s for s in out["launch_spread_log_sd"] if s == s]
    if spread:
        print(f"spread between identical launches: {sorted(spread)[len(spread) // 2]:.1%} "
              f"(s.d. of log launch {out['statistic']}s, median over trials)")
    return 0


def _cmd_overhead(args: argparse.Namespace) -> int:
    from perfsuite.overhead import measure_overhead

    out = measure_overhead(device=args.device, image_size=args.image_size,
                           batch_size=args.batch_size, steps=args.steps, blocks=args.blocks)
    print(json.dumps(out, indent=1))
    print(f"suite/bare median step time: {out['ratio']:.4f} "
          f"({out['overhead_percent']:+.2f} %; goal <= +1 %)")
    return 0


def _ab_cells(targets: list[str]) -> list[cells_mod.Cell]:
    """Cell ids and tier names, in the order given, each cell once."""
    ids = [t for t in targets if t not in cells_mod.TIERS]
    by_id = {c.id: c for c in cells_mod.select(ids=ids)} if ids else {}  # names every unknown id
    chosen: dict[str, cells_mod.Cell] = {}
    for target in targets:
        found = cells_mod.select(tier=target) if target in cells_mod.TIERS else [by_id[target]]
        chosen.update((cell.id, cell) for cell in found)
    return list(chosen.values())


def _ab_side(args: argparse.Namespace, name: str, out: Path):
    """Side A or B from its --X-python or --X-ref, and its --X-env."""
    from perfsuite import ab

    flag = name.lower()
    python, ref = getattr(args, f"{flag}_python"), getattr(args, f"{flag}_ref")
    env = ab.parse_env(getattr(args, f"{flag}_env"), f"--{flag}-env")
    if python and ref:
        raise ab.ABError(f"--{flag}-python and --{flag}-ref: a side is one or the other")
    if not ref:
        return ab.python_side(name, python or sys.executable, env)
    side = ab.checkout_side(name, ref, args.repo.resolve(), out / "sides" / flag, env)
    print(f"side {name}: {ref} ({side.commit[:12]}) set up in {side.setup_s:.1f} s "
          "(git worktree, venv, pip install -e)", flush=True)
    return side


def _cmd_ab(args: argparse.Namespace) -> int:
    import os
    import time

    from perfsuite import ab
    from perfsuite.runner import handle_sigterm

    default_out = Path(".perfsuite") / f"ab-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    out = (args.out or default_out).resolve()
    try:
        chosen = _ab_cells([*args.targets, *([args.tier] if args.tier else [])])
        if not chosen:
            raise ab.ABError("give cell ids or a tier (smoke, gate, full); `perfsuite list` "
                             "prints ids")
        ab.check_settings(args.tolerance, args.launch_statistic, args.max_launches)
        if (out / "ab.json").exists():
            raise ab.ABError(f"{out} already holds an A/B session (ab.json); choose another --out")
        handle_sigterm()
        sides = [_ab_side(args, name, out) for name in "AB"]
        for side in sides:
            ab.check_interpreter(side)
            env = " ".join(f"{k}={v}" for k, v in side.env.items())
            print(f"side {side.name}: {side.python} (torch {side.torch}, perfsuite from "
                  f"{side.perfsuite}) env {env}", flush=True)
    except ab.ABError as err:
        print(f"perfsuite ab: {err}", file=sys.stderr)
        return ab.EXIT_USAGE
    except KeyboardInterrupt:
        print("perfsuite ab: interrupted before the first launch", file=sys.stderr)
        return ab.EXIT_INTERRUPTED
    return ab.ABSession(chosen, *sides, out, tolerance=args.tolerance,
                        statistic=args.launch_statistic, max_launches=args.max_launches,
                        argv=sys.argv).run()


AB_EPILOG = """\
Launches alternate A B B A, A B B A, ... and are judged after every round
once each side has 4; a cell stops when its verdict is same, regressed or
improved, or at --max-launches a side (unknown). Writes OUT/ab.json (after
every launch), ab.png and ab.html.

exit codes:
  0    no regression in any cell
  1    a regression (step time, or another check of compare: memory,
       accuracy, work counters), or a launch that failed
  2    usage or environment error (nothing launched)
  3    undecided: some cell unknown at the cap, none regressed
  130  interrupted (Ctrl-C, SIGTERM); ab.json keeps every launch done
"""


LAUNCH_STATISTICS = ("median", "floor")
LAUNCH_STATISTIC_HELP = ("what each of 4+ repeated launches contributes to the step-time verdict: "
                         "its median step, or its floor (fastest step) on a machine whose "
                         "neighbours only ever add time")


def _cmd_bisect(args: argparse.Namespace) -> int:
    import os
    import time

    from perfsuite import ab, bisect
    from perfsuite.runner import handle_sigterm

    cell = cells_mod.get(args.cell)  # an unknown id: CellError, exit 2
    default_out = Path(".perfsuite") / f"bisect-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    try:
        session = bisect.Bisection(cell, args.repo, args.good, args.bad, args.out or default_out,
                                   use_counters=args.counters, max_launches=args.max_launches,
                                   tolerance=args.tolerance, statistic=args.launch_statistic,
                                   argv=sys.argv)
    except ab.ABError as err:
        print(f"perfsuite bisect: {err}", file=sys.stderr)
        return bisect.EXIT_USAGE
    handle_sigterm()
    return session.run()


BISECT_EPILOG = """\
git bisect over --good..--bad in a throwaway worktree of --repo (the
user's checkout is left as it is): each commit git picks is installed into
a venv reusing this interpreter's packages and judged against --good, by an
A/B session (regressed = bad; unknown or a failed launch = skip) or with
--counters by one launch's work counters (any change = bad). Writes
OUT/bisect.json with every judged commit.

exit codes:
  0    the first bad commit named, with the evidence
  2    usage or environment error
  3    undecided: only skipped commits left, or --bad not judged bad
  130  interrupted (Ctrl-C, SIGTERM); bisect.json keeps every judgement
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="perfsuite", description=__doc__)
    parser.add_argument("--version", action="version", version=f"perfsuite {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("list", help="print cell ids, one per line")
    p.add_argument("--tier", default="all", choices=[*cells_mod.TIERS, "all"])
    p.add_argument("--workload", choices=cells_mod.WORKLOADS)
    p.add_argument("--json", action="store_true", help="a JSON array of the cells: id and params")
    p.set_defaults(func=_cmd_list)

    p = sub.add_parser("doctor", help="what will and will not work here, before a GPU run: "
                                      "GPUs, driver, NCCL, nsys, /dev/shm, disk, MNIST",
                       description="One line per check: ok, warn, or BLOCKER with the fix. "
                                   "Exit 1 on a blocker, 0 otherwise.")
    p.add_argument("--tier", choices=cells_mod.TIERS,
                   help="judge for this tier: gate and full need a GPU, smoke does not "
                        "(default: say which tiers can run, nothing blocks)")
    p.add_argument("--data-dir", type=Path, help="directory with the MNIST IDX files (full tier)")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.set_defaults(func=_cmd_doctor)

    p = sub.add_parser("run", help="measure cells and write results.json")
    p.add_argument("ids", nargs="*", metavar="ID")
    p.add_argument("--tier", choices=[*cells_mod.TIERS, "all"])
    p.add_argument("--workload", choices=cells_mod.WORKLOADS)
    p.add_argument("--out", type=Path, help="output directory (default .perfsuite/run-...)")
    p.add_argument("--data-dir", type=Path, help="directory with real datasets")
    p.add_argument("--timeout", type=float, help="override each cell's timeout (s)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--profile", choices=["nsys", "torch", "off"],
                   help="profile every cell (default: only profile cells)")
    p.add_argument("--baselines", type=Path, help="baselines root (default: baselines/)")
    p.add_argument("--no-probe", action="store_true", help="skip the pre-flight probe")
    p.add_argument("--repeats", type=int, default=1, metavar="N",
                   help="launch every cell N times (from 4, verdicts weigh their spread)")
    p.add_argument("--resume", action="store_true",
                   help="keep cells an earlier run into --out measured fully")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the run already in --out (refused otherwise)")
    p.add_argument("--history", metavar="URL",
                   help="history store the run is added to (SQLite path or SQLAlchemy URL; "
                        "default .perfsuite/history.sqlite; 'off' keeps none)")
    p.add_argument("--fail-on-skipped", action="store_true",
                   help="exit 1 when a comparison could not be made (no comparable baseline, "
                        "a skipped cell): for CI, where a green run must have judged something")
    p.add_argument("--gpus", metavar="0,1", help="GPUs this run may use")
    p.add_argument("--allow-no-gpu", action="store_true",
                   help="where torch sees no GPU, skip the GPU cells instead of exiting 2 "
                        "(the default: a GPU run that measured nothing must not pass)")
    p.add_argument("--nnodes", type=int, default=1, help="nodes a cell spans (c10d)")
    p.add_argument("--rdzv-endpoint", metavar="HOST:PORT")
    p.add_argument("--rdzv-id", metavar="JOB", help="the same on every node, new per job")
    p.add_argument("--slurm", action="store_true",
                   help="inside a SLURM allocation: nodes from the job, torchrun via srun")
    p.add_argument("--json", action="store_true",
                   help="print a JSON summary on stdout at the end (results.json's path, each "
                        "cell's status and failed checks); progress goes to stderr")
    p.set_defaults(func=_cmd_run_maybe_json, json_out=None)

    p = sub.add_parser("compare", help="per-cell verdicts of RUN_B against RUN_A")
    p.add_argument("run_a", type=Path, help="reference run (directory or results.json)")
    p.add_argument("run_b", type=Path, help="run to judge")
    p.add_argument("--tolerance", type=float, default=0.05)
    p.add_argument("--confidence", type=float, default=0.95)
    p.add_argument("--allow-other-hardware", action="store_true",
                   help="compare absolute numbers across hardware profiles anyway")
    p.add_argument("--launch-statistic", choices=LAUNCH_STATISTICS, default="median",
                   help=LAUNCH_STATISTIC_HELP)
    p.add_argument("--json", action="store_true", help="print the verdicts as a JSON array")
    p.set_defaults(func=_cmd_compare)

    p = sub.add_parser("baseline", help="stored baselines")
    baseline = p.add_subparsers(dest="baseline_command", required=True)
    p = baseline.add_parser("record", help="record a run as the baseline of its hardware")
    p.add_argument("run", type=Path, help="run directory or results.json")
    p.add_argument("--profile", help="hardware profile id (default: the run's own)")
    p.add_argument("--root", type=Path, help="baselines root (default: baselines/)")
    p.add_argument("--force", action="store_true",
                   help="write into a folder of another hardware profile")
    p.add_argument("--dry-run", action="store_true", help="show the difference, write nothing")
    p.add_argument("--launch-statistic", choices=LAUNCH_STATISTICS,
                   help=LAUNCH_STATISTIC_HELP + " (kept in the profile's profile.json; "
                   "default: as it is there, median for a new profile)")
    p.set_defaults(func=_cmd_baseline_record)

    p = sub.add_parser("report", help="write results.csv, checks.csv and report.html of a run")
    p.add_argument("run", type=Path)
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser("profile", help="summarise an nsys report, its CSV exports, "
                                       "or a perfsuite profile summary")
    p.add_argument("path", type=Path)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--h2d-limit-gbps", type=float, help="host-to-device limit to compare with")
    p.set_defaults(func=_cmd_profile)

    p = sub.add_parser("detection", help="false-alarm and detection rates of the step-time "
                                         "verdict on a real CPU cell with injected slowdowns")
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--cell", default="smoke/image/ddp-ds/c1/fp32/px32/nopin/nchw")
    p.add_argument("--steps", type=int, default=40, help="steps per launch, warm-up included")
    p.add_argument("--launches", type=int, default=4,
                   help="launches per judged group and round (the verdict weighs their spread "
                        "from 4; an unknown verdict gets as many more, twice at most)")
    p.add_argument("--reference-launches", type=int, default=12,
                   help="launches of the recorded reference (a baseline is recorded once)")
    p.add_argument("--launch-statistic", choices=LAUNCH_STATISTICS, default="floor",
                   help=LAUNCH_STATISTIC_HELP)
    p.add_argument("--work-dir", type=Path,
                   help="where the launches and detection.json go (default: a new temp dir)")
    p.add_argument("--resume", action="store_true",
                   help="go on from the trials a stopped run left in --work-dir")
    p.add_argument("--ab", action="store_true",
                   help="perfsuite ab judged on itself: side B unchanged, 10 %% and 5 %% slower, "
                        "one A/B session each per trial")
    p.add_argument("--max-launches", type=int, default=12,
                   help="with --ab: launches a side before an A/B session says unknown")
    p.add_argument("--counters", action="store_true",
                   help="the work counters instead: single launches with one extra all-reduce or "
                        "one extra copy of every parameter per step against an unchanged baseline, "
                        "and the counting window's share of a launch's wall time")
    p.set_defaults(func=_cmd_detection)

    p = sub.add_parser("ab", help="A/B: two interpreters, environments or git refs, launches "
                                  "interleaved on this machine, B judged against A",
                       epilog=AB_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("targets", nargs="*", metavar="CELL_OR_TIER",
                   help="cell ids, or tier names (smoke, gate, full) for all their cells")
    p.add_argument("--tier", choices=cells_mod.TIERS, help="every cell of a tier")
    for side in ("a", "b"):
        p.add_argument(f"--{side}-python", metavar="PY",
                       help=f"interpreter of side {side.upper()} (default: this one)")
        p.add_argument(f"--{side}-env", action="append", default=[], metavar="KEY=VALUE",
                       help=f"environment variable for side {side.upper()}'s launches only")
        p.add_argument(f"--{side}-ref", metavar="GIT_REF",
                       help=f"side {side.upper()} from this ref of --repo: a worktree and a "
                            "venv reusing this interpreter's packages, set up under OUT/sides/")
    p.add_argument("--repo", type=Path, default=Path("."), help="git repository of the refs")
    p.add_argument("--out", type=Path, help="output directory (default .perfsuite/ab-<time>-<pid>)")
    p.add_argument("--max-launches", type=int, default=12, metavar="N",
                   help="launches a side before a cell is left unknown (even, at least 4)")
    p.add_argument("--tolerance", type=float, default=0.05)
    p.add_argument("--launch-statistic", choices=LAUNCH_STATISTICS, default="floor",
                   help=LAUNCH_STATISTIC_HELP)
    p.set_defaults(func=_cmd_ab)

    p = sub.add_parser("overhead", help="the suite's own overhead on a training step")
    p.add_argument("--device", default="cpu")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=20, help="steps per block")
    p.add_argument("--blocks", type=int, default=10)
    p.set_defaults(func=_cmd_overhead)

    p = sub.add_parser("bisect", help="the first commit of a repository whose cell regressed "
                                      "against a good commit (git bisect, A/B or work counters)",
                       epilog=BISECT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cell", metavar="CELL", help="the cell id to judge every commit by")
    p.add_argument("--good", required=True, metavar="REF", help="a commit without the regression")
    p.add_argument("--bad", required=True, metavar="REF", help="a later commit with it")
    p.add_argument("--repo", type=Path, default=Path("."), help="git repository of the refs")
    p.add_argument("--counters", action="store_true",
                   help="judge by the work counters alone: one launch a commit, any change is bad")
    p.add_argument("--max-launches", type=int, default=12, metavar="N",
                   help="A/B: launches a side before a commit is left unknown (skipped)")
    p.add_argument("--tolerance", type=float, default=0.05)
    p.add_argument("--launch-statistic", choices=LAUNCH_STATISTICS, default="floor",
                   help=LAUNCH_STATISTIC_HELP)
    p.add_argument("--out", type=Path, help="output directory (default .perfsuite/bisect-<time>-<pid>)")
    p.set_defaults(func=_cmd_bisect)
    __import__("perfsuite.cli_history").cli_history.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    import os
    import signal
    import threading

    args = build_parser().parse_args(argv)
    # `perfsuite list | head -1`: end of SIGPIPE, quietly, as other command-line
    # tools do, not in a BrokenPipeError traceback. Only as the console script
    # (argv None; a caller in-process, pytest included, keeps Python's handling),
    # and not for the commands that launch ranks: their BrokenPipeError unwinds
    # through the code that ends the ranks and keeps what was measured, and
    # ends quietly below.
    if (argv is None and hasattr(signal, "SIGPIPE") and args.command not in ("run", "ab", "detection", "bisect")
            and threading.current_thread() is threading.main_thread()):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        return args.func(args)
    except BrokenPipeError:  # the reader went away: nothing more to say, nowhere to say it
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the exit's flush does not complain
        return 128 + signal.SIGPIPE
    except (cells_mod.CellError, UsageProblem) as err:
        print(f"perfsuite: {err}" if isinstance(err, cells_mod.CellError) else str(err),
              file=sys.stderr)
        return EXIT_USAGE
    except OSError as err:  # a file that cannot be read or written: say which, no traceback
        print(f"perfsuite {args.command}: {err.filename or ''}: {err.strerror or err}",
              file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"perfsuite {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
