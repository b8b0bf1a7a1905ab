"""The ``perfsuite`` command: list, run, compare, ab, baseline record, report, profile, overhead, doctor."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from perfsuite import cells as cells_mod
from perfsuite import cli_ab, cli_results, cli_run, cli_selftest
from perfsuite.cli_exits import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, UsageProblem


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
    p.set_defaults(func=cli_run.cmd_run_maybe_json, json_out=None)

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
    p.set_defaults(func=cli_results.cmd_compare)

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
    p.set_defaults(func=cli_results.cmd_baseline_record)

    p = sub.add_parser("report", help="write results.csv, checks.csv and report.html of a run")
    p.add_argument("run", type=Path)
    p.set_defaults(func=cli_results.cmd_report)

    p = sub.add_parser("profile", help="summarise an nsys report, its CSV exports, "
                                       "or a perfsuite profile summary")
    p.add_argument("path", type=Path)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--h2d-limit-gbps", type=float, help="host-to-device limit to compare with")
    p.set_defaults(func=cli_results.cmd_profile)

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
    p.set_defaults(func=cli_selftest.cmd_detection)

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
    p.set_defaults(func=cli_ab.cmd_ab)

    p = sub.add_parser("overhead", help="the suite's own overhead on a training step")
    p.add_argument("--device", default="cpu")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=20, help="steps per block")
    p.add_argument("--blocks", type=int, default=10)
    p.set_defaults(func=cli_selftest.cmd_overhead)

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
    p.set_defaults(func=cli_ab.cmd_bisect)
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
