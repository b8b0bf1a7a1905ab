"""``perfsuite detection`` and ``perfsuite overhead``: the suite measured on
itself (its verdicts' false alarms and detection power, its instrumentation's
cost on a training step)."""

from __future__ import annotations

import argparse
import json
import sys


def cmd_detection(args: argparse.Namespace) -> int:
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


def cmd_overhead(args: argparse.Namespace) -> int:
    from perfsuite.overhead import measure_overhead

    out = measure_overhead(device=args.device, image_size=args.image_size,
                           batch_size=args.batch_size, steps=args.steps, blocks=args.blocks)
    print(json.dumps(out, indent=1))
    print(f"suite/bare median step time: {out['ratio']:.4f} "
          f"({out['overhead_percent']:+.2f} %; goal <= +1 %)")
    return 0

