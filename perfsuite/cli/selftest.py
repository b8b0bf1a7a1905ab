"""``perfsuite selftest``: the suite measured on itself. ``verdict-detection``:
the verdicts' false alarms and detection power on a real cell (step time,
``--counters``, ``--ab``); ``history-detection``: what ``history changes``
finds in series built from this machine's launches; ``overhead``: the
instrumentation's cost on a training step; ``error-rates``: ``perfsuite ab``'s
false calls, smallest detectable change and minutes per verdict on this
runner. Their old commands (``perfsuite detection``, ``perfsuite history
detection``, ``perfsuite overhead``) stay for one release and say where they
went."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from perfsuite import options
from perfsuite.cli.exits import EXIT_OK, EXIT_USAGE, emit_json
from perfsuite.options import DEFAULT_MAX_PVALUE, HISTORY_HELP, INCLUDE_HELP

# perfsuite.selftest (torch, scipy, pandas), perfsuite.history (SQLAlchemy) and
# perfsuite.judge (scipy, pandas): imported in the commands that use them. main
# imports every cli module to build its parser, and the CLI's first screen
# (perfsuite list, --help) imports nothing heavy.

COMMANDS = {  # subcommand: (its one-line help, its old command)
    "verdict-detection": ("false alarms and detection power of the verdicts (step time, work counters, "
                          "ab) on a real CPU cell with injected slowdowns", "perfsuite detection"),
    "history-detection": ("how often `history changes` finds a 7 %% step at its commit, a 1 %%-per-commit "
                          "drift, and nothing in unchanged code, on series built from this machine's launches",
                          "perfsuite history detection"),
    "overhead": ("the suite's own overhead on a training step, bare against instrumented",
                 "perfsuite overhead"),
    "launch-cost": ("where a launch's wall time goes (before training: start, imports and the "
                    "workload's set-up; training, counting, exit), ranks forked from a zygote "
                    "against fresh interpreters", None),
    "attribution": ("whether `perfsuite diff` names what side B changed (on a CPU cell an injected conv "
                    "spin, all-reduce, parameter copy and slower Linear; on a CUDA cell a device-side "
                    "slowdown and fp16 against fp32) and nothing in an unchanged pair, on profiled launches",
                    None),
    "error-rates": ("perfsuite ab's error rates on this runner: A/A sessions (side B unchanged) and injected "
                    "ones per cell; false calls, the smallest detectable change, minutes per verdict", None),
}


def _verdict_detection_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trials", type=int, default=20, help="trials, each every condition once")
    p.add_argument("--cell", default="smoke/image/ddp-ds/c1/fp32/px32/nopin/nchw", help="the cell launched")
    p.add_argument("--steps", type=int, default=40, help="steps per launch, warm-up included")
    p.add_argument("--launches", type=int, default=4,
                   help="launches per judged group and round (the verdict weighs their spread "
                        "from 4; an unknown verdict gets as many more, twice at most)")
    p.add_argument("--reference-launches", type=int, default=12,
                   help="launches of the recorded reference (a baseline is recorded once)")
    p.add_argument("--launch-statistic", choices=options.LAUNCH_STATISTICS,
                   default=options.DEFAULT_LAUNCH_STATISTIC, help=options.LAUNCH_STATISTIC_HELP)
    out = p.add_argument("--out", type=Path, metavar="DIR",
                         help="where the launches and detection.json go (default: a new temporary folder)")
    options.add_old_name(p, "--work-dir", out)
    p.add_argument("--resume", action="store_true", help="go on from the trials a stopped run left in --out")
    p.add_argument("--ab", action="store_true",
                   help="perfsuite ab judged on itself: side B unchanged, 10 %% and 5 %% slower, "
                        "one A/B session each per trial")
    p.add_argument("--max-launches", type=int, default=12,
                   help="with --ab: launches a side before an A/B session in launch rounds says unknown")
    p.add_argument("--tolerance", type=float, default=0.02, metavar="FRACTION",
                   help="with --ab: the sessions' tolerance (default 0.02: well below the 5 %% change called)")
    p.add_argument("--fault-kind", choices=options.AB_FAULT_KINDS, default=options.AB_FAULT_KINDS[0],
                   help="with --ab: how side B is slowed: slow (host time after each step) or gpu-sleep "
                        "(device time after each optimizer step, sized from the measured step; CUDA cells)")
    p.add_argument("--slowdowns", metavar="F[,F...]",
                   help="with --ab: side B slowed by these fractions besides unchanged (default: 0.10,0.05)")
    options.add_resident_options(p.add_argument, note="with --ab, as perfsuite ab: ")
    p.add_argument("--counters", action="store_true",
                   help="the work counters instead: single launches with one extra all-reduce or "
                        "one extra copy of every parameter per step against an unchanged baseline, "
                        "and the counting window's share of a launch's wall time")
    p.add_argument("--json", action="store_true", help="print only the figures, as JSON")
    p.set_defaults(func=cmd_verdict_detection, launches_cells=True)


def _history_detection_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--series", type=int, default=20, help="series per figure")
    p.add_argument("--launches", default="1,4,16,32,64", metavar="N[,N...]",
                   help="launches per nightly run (its value: the median of their launch values)")
    p.add_argument("--commits", type=int, default=30, help="commits per series")
    p.add_argument("--step", type=float, default=0.07, help="the step's size")
    p.add_argument("--drift", type=float, default=0.01, help="the drift per commit (10 commits)")
    p.add_argument("--by-session", action="store_true",
                   help="each run's launches from one measured session (keeps session-to-session "
                        "shifts) instead of from all launches")
    p.add_argument("--max-pvalue", type=float, default=DEFAULT_MAX_PVALUE,
                   help="significance of a change point, as `history changes`")
    p.add_argument("--seed", type=int, default=20261124, help="of the series drawn")
    p.add_argument("--runs-dir", type=Path, default=Path(".perfsuite"),
                   help="where runs' results.json and A/B sessions' ab.json files are looked for")
    p.add_argument("--baselines", type=Path,
                   help="baselines root, for samples.json or launch_spread when no run is found "
                        "(default: $PERFSUITE_BASELINES, else the project's baselines/)")
    p.add_argument("--launch-statistic", choices=options.LAUNCH_STATISTICS,
                   default=options.DEFAULT_LAUNCH_STATISTIC, help=options.LAUNCH_STATISTIC_HELP)
    p.add_argument("--include", action="append", metavar="PURPOSES",
                   help=INCLUDE_HELP + "; a run the history does not hold counts as an experiment where its "
                        "cells were launched with workload options")
    store = p.add_argument("--history", metavar="URL", help=HISTORY_HELP + "; where the runs' purposes are looked up")
    options.add_old_name(p, "--url", store)
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(func=cmd_history_detection)


def _overhead_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cpu", help="where the steps run: cpu or cuda")
    p.add_argument("--image-size", type=int, default=32, help="pixels a side")
    p.add_argument("--batch-size", type=int, default=16, help="images per step")
    p.add_argument("--steps", type=int, default=20, help="steps per block")
    p.add_argument("--blocks", type=int, default=10, help="blocks of each kind, alternating")
    p.add_argument("--json", action="store_true", help="print only the figures, as JSON")
    p.set_defaults(func=cmd_overhead, launches_cells=True)


def _launch_cost_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cell", default="smoke/image/ddp-ds/c1/fp32/px32/nopin/nchw", help="the cell launched")
    p.add_argument("--launches", type=int, default=3, help="launches per rank start")
    p.add_argument("--rank-start", default="fork,exec", metavar="START[,START...]",
                   help="how the ranks start, in this order: fork (from a zygote), exec (fresh interpreters)")
    p.add_argument("--steps", type=int, help="steps per launch, warm-up included (default: the cell's)")
    p.add_argument("--out", type=Path, metavar="DIR",
                   help="where the launches and launch-cost.json go (default: a new temporary folder)")
    p.add_argument("--json", action="store_true", help="print only the figures, as JSON")
    p.set_defaults(func=cmd_launch_cost, launches_cells=True)


def _attribution_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sessions", type=int, default=10, help="sessions per change, each two profiled launches")
    p.add_argument("--faults", metavar="NAME[,NAME...]",
                   help="what side B changes, in this order: conv-spin, allreduce, copy, slow-linear (a CPU "
                        "cell's default), gpu-sleep (device time after each optimizer step), precision (the "
                        "cell at fp16) (a CUDA cell's default: gpu-sleep,precision,unchanged), unchanged")
    p.add_argument("--cell", help="the cell launched (default: gate/image/ddp-ds/g1/fp32/px500/pin/nchw where "
                                  "torch sees a GPU, else smoke/image/ddp/c2/fp32/px32/nopin/nchw)")
    p.add_argument("--steps", type=int, help="steps a launch, warm-up included (default: the cell's)")
    p.add_argument("--out", type=Path, metavar="DIR", help="where the launches and attribution-selftest.json "
                                                           "go (default: a new temporary folder)")
    p.add_argument("--json", action="store_true", help="print only the figures, as JSON")
    p.set_defaults(func=cmd_attribution, launches_cells=True)


def cmd_attribution(args: argparse.Namespace) -> int:
    from perfsuite.selftest.attribution import figure_lines, measure_attribution

    try:
        faults = tuple(f.strip() for f in args.faults.split(",") if f.strip()) if args.faults is not None else None
        out = measure_attribution(args.sessions, faults, args.cell, args.out,
                                  log=(lambda line: None) if args.json else print, steps=args.steps)
    except (ValueError, KeyError, RuntimeError) as err:
        print(f"perfsuite selftest attribution: {str(err).strip(chr(39))}", file=sys.stderr)
        return EXIT_USAGE
    return _figures(args, out, figure_lines(out))


def _error_rates_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cell", action="append", metavar="CELL",
                   help="a cell measured, once each (default: a smoke cell on a machine without a GPU, "
                        "gate/image/ddp-ds/g1/fp32/px500/pin/nchw on one with)")
    p.add_argument("--sessions", type=int, metavar="N",
                   help="A/A sessions a cell, and as many injected ones (default: 40 a CPU cell, 10 a GPU cell)")
    p.add_argument("--injected", type=int, metavar="N",
                   help="injected sessions a cell, alternating with the A/A ones while both last "
                        "(default: as many as --sessions)")
    p.add_argument("--fraction", type=float, default=0.05, metavar="F",
                   help="how much slower the injected sessions' side B is (default 0.05)")
    p.add_argument("--fault-kind", choices=("auto", *options.AB_FAULT_KINDS), default="auto",
                   help="how side B is slowed: auto (gpu-sleep on a CUDA cell, else slow), slow (host time "
                        "after each step) or gpu-sleep (device time after each optimizer step)")
    p.add_argument("--tolerance", type=float, default=0.02, metavar="FRACTION",
                   help="the sessions' tolerance (default 0.02, as the example workflow's A/B)")
    p.add_argument("--steps", type=int, default=40, help="steps per launch, warm-up included")
    p.add_argument("--max-launches", type=int, default=12,
                   help="launches a side before a session in launch rounds says unknown")
    options.add_resident_options(p.add_argument, note="as perfsuite ab: ")
    p.add_argument("--out", type=Path, metavar="DIR",
                   help="where the sessions and error-rates.json go (default: .perfsuite/error-rates)")
    p.add_argument("--resume", action="store_true",
                   help="go on from the sessions a stopped run left in --out (or add sessions: a larger --sessions), "
                        "measured on this machine by this commit with these settings")
    p.add_argument("--from-detection", type=Path, metavar="FILE",
                   help="measure nothing: the figures from a record of `verdict-detection --ab` (its unchanged "
                        "sessions are A/A ones), written to --out where given (default: none, measure)")
    p.add_argument("--json", action="store_true", help="print only the figures, as JSON")
    p.set_defaults(func=cmd_error_rates, launches_cells=True)


def cmd_error_rates(args: argparse.Namespace) -> int:
    import json

    from perfsuite.selftest import error_rates as rates
    from perfsuite.system.atomic import atomic_write_json

    log = (lambda line: None) if args.json else (lambda line: print(line, flush=True))
    try:
        if args.from_detection:
            try:
                record = json.loads(args.from_detection.read_text(encoding="utf-8"))
            except (OSError, ValueError) as err:
                raise ValueError(f"--from-detection {args.from_detection}: cannot read it as JSON ({err})") from err
            out = rates.from_detection(record, args.fraction, str(args.from_detection))
            if args.out:
                args.out.mkdir(parents=True, exist_ok=True)
                atomic_write_json(args.out / rates.FILE, out)
                log(f"error-rates.json: {args.out / rates.FILE}")
        else:
            out = rates.measure_error_rates(args.cell, args.sessions, args.fraction, args.out,
                                            injected=args.injected, resume=args.resume,
                                            tolerance=args.tolerance, steps=args.steps,
                                            max_launches=args.max_launches, mode=args.mode,
                                            resident={"window_steps": args.window_steps, "quads": args.quads,
                                                      "max_pairs": args.max_pairs},
                                            fault_kind=args.fault_kind, log=log)
            log(f"error-rates.json: {out['file']}")
    except (ValueError, KeyError, RuntimeError) as err:
        print(f"perfsuite selftest error-rates: {str(err).strip(chr(39))}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"perfsuite selftest error-rates: stopped; the sessions that ended are kept in "
              f"{(args.out or rates.DEFAULT_OUT) / rates.FILE}, and --resume goes on from them", file=sys.stderr)
        raise
    return _figures(args, {k: v for k, v in out.items() if k != "per_session"}, rates.figure_lines(out))


ADD_OPTIONS = {"attribution": _attribution_options, "verdict-detection": _verdict_detection_options,
               "history-detection": _history_detection_options, "overhead": _overhead_options,
               "launch-cost": _launch_cost_options, "error-rates": _error_rates_options}


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """``selftest`` and its subcommands; the old top-level commands, hidden."""
    p = sub.add_parser("selftest", help="the suite measured on itself: its verdicts' detection power, "
                                        "history's change points, its own overhead")
    verbs = p.add_subparsers(dest="selftest_command", required=True, metavar="COMMAND")
    for name, (help_text, _) in COMMANDS.items():
        ADD_OPTIONS[name](verbs.add_parser(name, help=help_text))
    for name in ("verdict-detection", "overhead"):
        add_old_command(sub, COMMANDS[name][1].split()[-1], name)


def add_old_command(sub: argparse._SubParsersAction, old: str, new: str) -> None:
    """``old`` (a subcommand of ``sub``, not listed in its help) doing what
    ``perfsuite selftest NEW`` does, and saying so."""
    p = sub.add_parser(old, description=f"The old name of `perfsuite selftest {new}`.")
    ADD_OPTIONS[new](p)
    p.set_defaults(renamed_command=(COMMANDS[new][1], f"perfsuite selftest {new}"))


def cmd_verdict_detection(args: argparse.Namespace) -> int:
    from perfsuite.selftest.detection import measure_ab_detection, measure_counter_detection, measure_detection

    if args.ab:
        try:
            slowdowns = (None if not args.slowdowns
                         else tuple(float(x) for x in args.slowdowns.split(",") if x.strip()))
            out = measure_ab_detection(trials=args.trials, cell_id=args.cell, steps=args.steps,
                                       max_launches=args.max_launches, work_dir=args.out,
                                       tolerance=args.tolerance, mode=args.mode, slowdowns=slowdowns,
                                       fault_kind=args.fault_kind, resume=args.resume,
                                       resident={"window_steps": args.window_steps, "quads": args.quads,
                                                 "max_pairs": args.max_pairs})
        except ValueError as err:
            print(f"perfsuite selftest verdict-detection: {err}", file=sys.stderr)
            return EXIT_USAGE
        n = out["trials"]
        lines = [f"perfsuite ab at a {out['tolerance']:.0%} tolerance ({out['mode']} mode), {out['cell']}",
                 f"perfsuite ab, unchanged B called regressed: {out['false_alarms']}/{n} (goal <= 1/20)",
                 f"perfsuite ab, unchanged B called same:      {out['unchanged_same']}/{n} (goal >= 16/20)"]
        goals = {"slow 10%": " (goal >= 19/20)", "slow 5%": " (goal >= 16/20)"}
        lines += [f"perfsuite ab, {name[5:]:>3} slower B called regressed: {caught}/{n}{goals.get(name, '')}"
                  for name, caught in out["caught"].items()]
        lines.append(f"median wall time per A/B session: {out['median_seconds']} (goal <= 180 s)")
        return _figures(args, out, lines)
    if args.counters:
        out = measure_counter_detection(trials=args.trials, cell_id=args.cell, work_dir=args.out)
        n = out["trials"]
        lines = [f"unchanged code passed the counter check:  {out['unchanged_passed']}/{n} (goal 20/20)",
                 f"one extra all-reduce per step failed it:   {out['allreduce_failed']}/{n} (goal 20/20)",
                 f"one extra copy of every parameter failed: {out['copy_failed']}/{n} (goal 20/20)",
                 f"counting window: {out['window_overhead']:+.1%} of a launch's wall time "
                 f"(median {out['wall_median_s']['counted']} s vs {out['wall_median_s']['bare']} s "
                 "without; goal <= +10 %)"]
        return _figures(args, out, lines)
    try:
        out = measure_detection(trials=args.trials, cell_id=args.cell, steps=args.steps,
                                launches=args.launches, reference_launches=args.reference_launches,
                                statistic=args.launch_statistic, work_dir=args.out, resume=args.resume)
    except ValueError as err:
        print(f"perfsuite selftest verdict-detection: {err}", file=sys.stderr)
        return EXIT_USAGE
    n = out["trials"]
    lines = [f"false alarms on unchanged code: {out['false_alarms']}/{n} (goal <= 1/20)",
             f"10% slowdown called regressed:  {out['caught_10']}/{n} (goal >= 19/20)",
             f" 5% slowdown called regressed:  {out['caught_5']}/{n}"]
    spread = [s for s in out["launch_spread_log_sd"] if s == s]
    if spread:
        lines.append(f"spread between identical launches: {sorted(spread)[len(spread) // 2]:.1%} "
                     f"(s.d. of log launch {out['statistic']}s, median over trials)")
    return _figures(args, {k: v for k, v in out.items() if k != "per_trial"}, lines)


def _figures(args: argparse.Namespace, out: dict[str, Any], lines: list[str]) -> int:
    """The figures as JSON, then in words unless --json."""
    emit_json(args, out)
    if not args.json:
        print("\n".join(lines))
    return EXIT_OK


def cmd_history_detection(args: argparse.Namespace) -> int:
    from perfsuite.history import detection as history_detection
    from perfsuite.history.store import parse_include
    from perfsuite.judge.baselines import default_root

    def fail(err: Exception) -> int:
        print(f"perfsuite selftest history-detection: {err}", file=sys.stderr)
        return EXIT_USAGE

    try:
        launches = [int(x) for x in str(args.launches).split(",") if x.strip()]
        if args.series < 1 or not launches or min(launches) < 1 or args.commits < 12:
            raise ValueError
    except ValueError:
        return fail(ValueError("--series >= 1, --launches N[,N...] each >= 1, --commits >= 12"))
    try:
        include = parse_include(args.include)
        noise = history_detection.load_noise(args.runs_dir, args.baselines or default_root(),
                                             args.launch_statistic, include=include, url=args.history)
    except (ValueError, history_detection.NoNoise) as err:
        return fail(err)
    settings = {"series": args.series, "commits": args.commits, "step": args.step, "drift": args.drift,
                "seed": args.seed, "by_session": args.by_session, "max_pvalue": args.max_pvalue}
    if not args.json:
        return history_detection.run(noise, launches=launches, **settings)
    by_session = args.by_session and noise.can_split_sessions()
    figures = [history_detection.figures(noise, launches=r, **{**settings, "by_session": by_session})
               for r in launches]
    emit_json(args, {"noise": noise.describe(), "statistic": noise.statistic, **settings,
                     "by_session": by_session, "figures": figures})
    return EXIT_OK


def cmd_launch_cost(args: argparse.Namespace) -> int:
    from perfsuite.selftest.launchcost import measure_launch_cost

    try:
        out = measure_launch_cost(args.cell, launches=args.launches,
                                  starts=tuple(s.strip() for s in args.rank_start.split(",") if s.strip()),
                                  steps=args.steps, work_dir=args.out,
                                  log=(lambda line: None) if args.json else print)
    except (ValueError, KeyError, RuntimeError) as err:
        print(f"perfsuite selftest launch-cost: {str(err).strip(chr(39))}", file=sys.stderr)
        return EXIT_USAGE
    lines = [f"{start}: median before training {m['before_training']:.2f} s (goal <= 3 s on 2 cores, "
             f"<= 2 s on a GPU host), wall {m['wall']:.2f} s, training {m['training']:.2f} s"
             for start, m in out["medians"].items()]
    if out["first_fork"]:
        lines.append(f"the zygote's start (first forked launch): before training "
                     f"{out['first_fork']['before_training']:.2f} s")
    return _figures(args, out, lines)


def cmd_overhead(args: argparse.Namespace) -> int:
    from perfsuite.selftest.overhead import measure_overhead

    out = measure_overhead(device=args.device, image_size=args.image_size,
                           batch_size=args.batch_size, steps=args.steps, blocks=args.blocks)
    return _figures(args, out, [f"suite/bare median step time: {out['ratio']:.4f} "
                                f"({out['overhead_percent']:+.2f} %; goal <= +1 %)"])
