"""``perfsuite ab`` and ``perfsuite bisect``: two versions judged on this
machine (interpreters, environments or git refs, launches interleaved), and
the first commit of a range that regressed."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from perfsuite import cells as cells_mod


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


def cmd_ab(args: argparse.Namespace) -> int:
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



def cmd_bisect(args: argparse.Namespace) -> int:
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

