"""``perfsuite ab`` and ``perfsuite bisect``: two versions judged on this
machine (interpreters, environments or git refs, launches interleaved), and
the first commit of a range that regressed."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from perfsuite import cells as cells_mod
from perfsuite import options
from perfsuite.cli.exits import emit_json
from perfsuite.cli.results import add_summary_options, error_rates, write_summary
from perfsuite.cli.run import add_launch_group

# perfsuite.ab (torch, scipy, pandas), perfsuite.runner (numpy) and
# perfsuite.hardware: imported in the commands that use them. main imports
# every cli module to build its parser, and the CLI's first screen (perfsuite
# list, --help) imports nothing heavy.

ATTRIBUTE_WHEN = ("changed", "always", "never")  # perfsuite.ab.attributing's, without importing it

AB_EPILOG = """\
Launches alternate A B B A, A B B A, ... and are judged after every round
once each side has 4; a cell stops when its verdict is same, regressed or
improved, or at --max-launches a side (unknown). A cell regressed or
improved then gets one short launch a side under torch.profiler, after the
judged ones, and the terminal says where its step time went (--attribute).
Writes OUT/ab.json (after every launch), ab.png and ab.html.

exit codes:
  0    no regression in any cell
  1    a regression (step time, or another check of compare: memory,
       accuracy, work counters), or a launch that failed
  2    usage or environment error (nothing launched), or OUT full or
       unwritable (said in one sentence; ab.json keeps what was measured)
  3    undecided: some cell unknown at the cap, none regressed
  130  interrupted (Ctrl-C, SIGTERM); ab.json keeps every launch and
       resident window done
"""

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


def _add_judging_options(p: argparse.ArgumentParser, unknown_means: str) -> None:
    """How ab, and bisect through ab, judge step times."""
    p.add_argument("--max-launches", type=int, default=12, metavar="N",
                   help=f"launches a side before {unknown_means} (even, at least 4)")
    p.add_argument("--tolerance", type=float, default=0.05, metavar="FRACTION",
                   help="a change within this fraction is the same; beyond it, with the interval clear "
                        "of 1, regressed or improved")
    p.add_argument("--launch-statistic", choices=options.LAUNCH_STATISTICS,
                   default=options.DEFAULT_LAUNCH_STATISTIC, help=options.LAUNCH_STATISTIC_HELP)
    p.add_argument("--repo", type=Path, default=Path("."), metavar="DIR", help="git repository of the refs")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ab", help="A/B: two interpreters, environments or git refs, launches "
                                  "interleaved on this machine, B judged against A", epilog=AB_EPILOG)
    p.add_argument("targets", nargs="*", metavar="CELL_OR_TIER",
                   help="cell ids, or tier names (smoke, gate, full) for all their cells")
    p.add_argument("--tier", choices=cells_mod.TIERS, help="every cell of a tier (default: the targets given)")
    for side in ("a", "b"):
        p.add_argument(f"--{side}-python", metavar="PY",
                       help=f"interpreter of side {side.upper()} (default: this one)")
        p.add_argument(f"--{side}-env", action="append", default=[], metavar="KEY=VALUE",
                       help=f"environment variable for side {side.upper()}'s launches only, repeatable "
                            "(default: none)")
        p.add_argument(f"--{side}-option", action="append", default=[], metavar="KEY=VALUE",
                       help=f"workload option for side {side.upper()}'s launches only, on top of --option, "
                            "repeatable; e.g. an injected slowdown, fault=gpu-sleep:*:5:0.02 (2 %% of a "
                            "step as device time from step 5; CUDA cells) or fault=slow:*:0:0.02 (host "
                            "time): perfsuite/rank/faults.py (default: none)")
        p.add_argument(f"--{side}-ref", metavar="GIT_REF",
                       help=f"side {side.upper()} from this ref of --repo: a worktree and a venv reusing "
                            "this interpreter's packages, set up under OUT/sides/ (default: none)")
    p.add_argument("--out", type=Path, metavar="DIR", help="output directory (default: .perfsuite/ab-<time>-<pid>)")
    _add_judging_options(p, "a cell is left unknown")
    resident = p.add_argument_group("resident windows (see docs/explanation/verdicts.md)")
    options.add_resident_options(resident.add_argument)
    p.add_argument("--attribute", choices=ATTRIBUTE_WHEN, default=ATTRIBUTE_WHEN[0],
                   help="changed: a cell regressed or improved gets one short launch a side under "
                        "torch.profiler after its judged ones, and the diff of the two profiles (which "
                        "modules, operators, kernels, collectives and copies changed); always: every judged "
                        "cell; never: none")
    add_launch_group(p)
    p.add_argument("--json", action="store_true",
                   help="print a JSON summary on stdout at the end (each cell's verdict, interval, launches "
                        "and other checks; ab.json's path); progress goes to stderr")
    p.add_argument("--summary-md", metavar="PATH",
                   help="at the end, append the session's pull-request comment (each cell's verdict, interval, "
                        "smallest detectable change, attribution and the command that measures it again) as "
                        "Markdown to PATH ('-': print it), e.g. \"$GITHUB_STEP_SUMMARY\"; `perfsuite report OUT "
                        "--summary-md PATH` writes it of a finished folder (default: none)")
    add_summary_options(p)
    p.set_defaults(func=cmd_ab, launches_cells=True)

    p = sub.add_parser("bisect", help="the first commit of a repository whose cell regressed "
                                      "against a good commit (git bisect, A/B or work counters)",
                       epilog=BISECT_EPILOG)
    p.add_argument("cell", metavar="CELL", help="the cell id to judge every commit by")
    p.add_argument("--good", required=True, metavar="REF", help="a commit without the regression")
    p.add_argument("--bad", required=True, metavar="REF", help="a later commit with it")
    p.add_argument("--counters", action="store_true",
                   help="judge by the work counters alone: one launch a commit, any change is bad")
    p.add_argument("--out", type=Path, metavar="DIR", help="output directory (default: .perfsuite/bisect-<time>-<pid>)")
    _add_judging_options(p, "a commit is left unknown (skipped)")
    add_launch_group(p)
    p.add_argument("--json", action="store_true",
                   help="print a JSON summary on stdout at the end (the first bad commit or the "
                        "candidates, every judged commit; bisect.json's path); progress goes to stderr")
    p.set_defaults(func=cmd_bisect, launches_cells=True)


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
    from perfsuite.ab import session as ab

    flag = name.lower()
    python, ref = getattr(args, f"{flag}_python"), getattr(args, f"{flag}_ref")
    env = ab.parse_env(getattr(args, f"{flag}_env"), f"--{flag}-env")
    if python and ref:
        raise ab.ABError(f"--{flag}-python and --{flag}-ref: a side is one or the other")
    options = ab.parse_options(getattr(args, f"{flag}_option"), f"--{flag}-option")
    if not ref:
        side = ab.python_side(name, python or sys.executable, env)
        side.workload_options = options
        return side
    side = ab.checkout_side(name, ref, args.repo.resolve(), out / "sides" / flag, env)
    side.workload_options = options
    print(f"side {name}: {ref} ({side.commit[:12]}) set up in {side.setup_s:.1f} s "
          "(git worktree, venv, pip install -e)", flush=True)
    return side


def _launching(args: argparse.Namespace, chosen: list[cells_mod.Cell]):
    """The LaunchOptions of the launching group, as `perfsuite run` builds
    them; GPU cells where torch sees no GPU refused unless --allow-no-gpu."""
    from perfsuite.ab import session as ab
    from perfsuite.runner import launch_options

    try:
        launch = launch_options(data_dir=args.data_dir, options=args.option, timeout=args.timeout,
                                profiler=args.profiler, gpus=args.gpus, nnodes=args.nnodes,
                                rdzv_endpoint=args.rdzv_endpoint, rdzv_id=args.rdzv_id, slurm=args.slurm,
                                rank_start=args.rank_start)
    except ValueError as err:
        raise ab.ABError(str(err)) from None
    if not args.allow_no_gpu:
        from perfsuite.hardware import gpu_cells_without_gpu

        problem = gpu_cells_without_gpu([c.id for c in chosen if c.device == "cuda"], "--allow-no-gpu")
        if problem:
            raise ab.ABError(problem)
    launch.on_progress = lambda cell, line: print(f"    {cell.id}: {line}", flush=True)
    return launch


def _ab_summary(data: dict[str, Any], out: Path) -> dict[str, Any]:
    """ab --json: each cell's verdict and checks, without its launches' samples (ab.json has them)."""
    kept = ("id", "verdict", "reason", "ratio", "ci_low", "ci_high", "confidence", "p_value", "method",
            "detectable", "mode", "memory", "n_a", "n_b", "checks")
    return {"ab_json": str(out / "ab.json"), "report": str(out / "ab.html"), "exit": data["exit_code"],
            "interrupted": data["interrupted"],
            "settings": {k: v for k, v in data["settings"].items() if k != "sides"},
            "sides": {name: {k: side.get(k) for k in ("python", "env", "ref", "commit", "torch")}
                      for name, side in data["settings"]["sides"].items()},
            "cells": [{**{k: record.get(k) for k in kept}, "attribution": _attribution(record)}
                      for record in data["cells"]]}


def _attribution(record: dict[str, Any]) -> dict[str, Any] | None:
    """A cell's attribution for --json: its error, or the change, the explained share and the top 3 rows."""
    found = record.get("attribution")
    if not found:
        return None
    kept = ("error", "change_s", "explained", "noise_s", "profiled")
    return {**{k: found[k] for k in kept if k in found}, **({"top": found["top"][:3]} if "top" in found else {})}


def cmd_ab(args: argparse.Namespace) -> int:
    import os
    import time

    from perfsuite.ab import session as ab
    from perfsuite.runner import handle_sigterm
    from perfsuite.system.locking import FolderLock

    default_out = Path(".perfsuite") / f"ab-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    out = (args.out or default_out).resolve()
    lock = FolderLock(out, "perfsuite ab session")
    try:
        return _ab_session(args, ab, out, lock, handle_sigterm)
    finally:
        lock.release()


# What another kind of session leaves in its folder: ab takes none of them.
OTHER_SESSIONS = {"ab.json": "an A/B session", "results.json": "a perfsuite run",
                  "bisect.json": "a bisect session"}


def _ab_session(args: argparse.Namespace, ab: Any, out: Path, lock: Any, handle_sigterm: Any) -> int:
    from perfsuite.system.locking import LockBusy

    rates = error_rates(args, "ab")  # a bad file refused before anything is set up
    try:
        chosen = _ab_cells([*args.targets, *([args.tier] if args.tier else [])])
        if not chosen:
            raise ab.ABError("give cell ids or a tier (smoke, gate, full); `perfsuite list` "
                             "prints ids")
        ab.check_settings(args.tolerance, args.launch_statistic, args.max_launches)
        ab.check_resident_settings(args.mode, args.window_steps, args.quads, args.max_pairs)
        launch = _launching(args, chosen)
        ab.check_resident_cells(args.mode, chosen, launch)
        held = [f"{what} ({name})" for name, what in OTHER_SESSIONS.items() if (out / name).exists()]
        if held:
            raise ab.ABError(f"{out} already holds {held[0]}; choose another --out")
        try:
            lock.acquire()  # a second session into this folder is refused, never mixed in
        except LockBusy as err:
            raise ab.ABError(str(err)) from None
        except OSError as err:
            raise ab.ABError(f"--out {out}: cannot create it ({err.strerror or err})") from None
        handle_sigterm()
        refs = {f"--{f}-ref": getattr(args, f"{f}_ref") for f in "ab" if getattr(args, f"{f}_ref")}
        if refs:  # every ref looked up before any worktree is made
            from perfsuite.ab.sides import check_refs

            check_refs(args.repo.resolve(), refs)
        for name in "ab":  # a side's fault read before any side is set up
            ab.check_workload_options(ab.Side(name.upper(), sys.executable, workload_options=ab.parse_options(
                getattr(args, f"{name}_option"), f"--{name}-option")), chosen)
        sides = [_ab_side(args, name, out) for name in "AB"]
        for side in sides:
            side.imports = ab.side_imports(chosen, args.mode)
            ab.check_interpreter(side)
            env = " ".join(f"{k}={v}" for k, v in side.env.items())
            options = " ".join(f"{k}={v}" for k, v in side.workload_options.items())
            print(f"side {side.name}: {side.python} (torch {side.torch}, perfsuite from "
                  f"{side.perfsuite}) env {env}" + (f" options {options}" if options else ""), flush=True)
    except ab.ABError as err:
        print(f"perfsuite ab: {err}", file=sys.stderr)
        return ab.EXIT_USAGE
    except KeyboardInterrupt:
        print("perfsuite ab: interrupted before the first launch", file=sys.stderr)
        return ab.EXIT_INTERRUPTED
    session = ab.ABSession(chosen, *sides, out, tolerance=args.tolerance, statistic=args.launch_statistic,
                           max_launches=args.max_launches, argv=sys.argv, launch=launch, mode=args.mode,
                           window_steps=args.window_steps, quads=args.quads, max_pairs=args.max_pairs,
                           attribute=args.attribute)
    code = session.run()
    if args.summary_md:
        from perfsuite.report.pr_comment import ab_comment

        try:
            write_summary(ab_comment(session.data, error_rates=rates, artifacts_url=args.artifacts_url),
                          args.summary_md)
        except OSError as err:  # the session is measured and kept: said, not raised
            print(f"perfsuite ab: --summary-md {args.summary_md}: cannot write it ({err.strerror or err}); "
                  f"`perfsuite report {out} --summary-md PATH` writes it again", file=sys.stderr)
    if args.json:
        emit_json(args, _ab_summary(session.data, out))
    from perfsuite.ab.stopping import deferred_interrupts
    from perfsuite.launch.agent import close_zygotes

    with deferred_interrupts():  # after every side's launch has ended; a Ctrl-C now would break it off
        close_zygotes()
    return code


def cmd_bisect(args: argparse.Namespace) -> int:
    import os
    import time

    from perfsuite.ab import bisect
    from perfsuite.ab import session as ab
    from perfsuite.runner import handle_sigterm

    cell = cells_mod.get(args.cell)  # an unknown id: CellError, exit 2
    default_out = Path(".perfsuite") / f"bisect-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    try:
        ab.check_settings(args.tolerance, args.launch_statistic, args.max_launches)
        session = bisect.Bisection(cell, args.repo, args.good, args.bad, args.out or default_out,
                                   use_counters=args.counters, max_launches=args.max_launches,
                                   tolerance=args.tolerance, statistic=args.launch_statistic,
                                   argv=sys.argv, launch=_launching(args, [cell]))
    except ab.ABError as err:
        print(f"perfsuite bisect: {err}", file=sys.stderr)
        return bisect.EXIT_USAGE
    handle_sigterm()
    code = session.run()
    if args.json:
        kept = ("cell", "repo", "good", "bad", "mode", "settings", "outcome", "reason", "first_bad",
                "candidates", "measured_commits", "judged", "interrupted", "exit_code")
        emit_json(args, {"bisect_json": str(session.path), **{k: session.data.get(k) for k in kept}})
    return code
