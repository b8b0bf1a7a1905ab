"""``perfsuite shards``: a tier's cells as shards, each one job's pytest
session over cells whose timeouts sum to at most ``--hours``. The full tier's
106 cells carry 10-12 h timeouts each (1144 h; ~78 h at the papers' speeds),
far beyond one job of a self-hosted runner (72 h); the example workflow's
plan job prints these shards as the full job's matrix.

Shards run one after another into one output folder with ``--perf-resume``,
so every twin a cell's cross-cell checks or findings may ask for is planned
in the cell's own shard or an earlier one, and measured once: each group of
cells joined by twins in turn (image, then LLM; the largest first), each
cell after its twins, a new shard begun where the next cell would exceed the
budget. The last shard also runs the cross-technique findings over the cells
measured by then."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from perfsuite import cells as cells_mod
from perfsuite.cells import Cell
from perfsuite.cli.exits import EXIT_OK, UsageProblem

# perfsuite.judge (scipy, pandas): imported in the commands that use them. main
# imports every cli module to build its parser, and the CLI's first screen
# (perfsuite list, --help) imports nothing heavy.

HOURS = 71  # a self-hosted runner's job limit, 72 h, less 1 h of setup: checkout, venv, probe, reports


def twins(cell: Cell, tier: dict[str, Cell]) -> frozenset[str]:
    """The cells of ``tier`` this cell's cross-cell checks and findings may
    measure (every check that applies, whether or not a baseline asks for it
    today)."""
    from perfsuite.judge.checks import CROSS_CELL, FindingRatio

    if cell.profile:  # a profiled cell's steps carry the profiler: no cross-cell checks
        return frozenset()
    found = [check() for check in CROSS_CELL if check().applies(cell.params())]
    found += [FindingRatio(f) for f in cells_mod.findings() if f.applies(cell.params())]
    ids = {Cell.from_params(check.twin_params(cell.params())).id for check in found}
    return frozenset((ids & set(tier)) - {cell.id})


def plan(tier: dict[str, Cell], budget_s: float) -> list[list[str]]:
    """The cells' ids in shards, in order: twins before the cells that need them."""
    ids = list(tier)
    edges = {c: twins(tier[c], tier) for c in ids}
    group = {c: c for c in ids}

    def root(c: str) -> str:
        while group[c] != c:
            c = group[c]
        return c

    for c, found in edges.items():
        for t in found:
            group[root(c)] = root(t)
    members: dict[str, list[str]] = {}
    for c in ids:
        members.setdefault(root(c), []).append(c)

    def cost(group_ids: list[str]) -> int:
        return sum(tier[c].timeout_s for c in group_ids)

    ordered: list[str] = []
    visiting: set[str] = set()

    def visit(c: str) -> None:
        if c in ordered or c in visiting:  # twins of each other: the first one visited comes first
            return
        visiting.add(c)
        for t in sorted(edges[c], key=ids.index):
            visit(t)
        ordered.append(c)

    for group_ids in sorted(members.values(), key=lambda g: (tier[g[0]].workload, -cost(g))):
        for c in group_ids:
            visit(c)
    too_long = [c for c in ordered if tier[c].timeout_s > budget_s]
    if too_long:
        raise UsageProblem(f"perfsuite shards: {too_long[0]}'s timeout, {tier[too_long[0]].timeout_s / 3600:g} h, "
                           f"exceeds a shard's {budget_s / 3600:g} h ({len(too_long)} such cell(s)); "
                           "give --hours more")
    out: list[list[str]] = [[]]
    for c in ordered:
        if out[-1] and cost(out[-1] + [c]) > budget_s:
            out.append([])
        out[-1].append(c)
    return out if out[0] else []


def shards(tier: str = "full", hours: float = HOURS) -> list[dict[str, Any]]:
    """The shards as the workflow's matrix takes them: ``shard`` ("01", ...),
    ``cells`` and ``findings`` (true for the last only)."""
    chosen = {c.id: c for c in cells_mod.select(tier=tier)}
    planned = plan(chosen, hours * 3600)
    return [{"shard": f"{k:0{max(2, len(str(len(planned))))}d}", "cells": shard, "findings": k == len(planned)}
            for k, shard in enumerate(planned, 1)]


def cmd_shards(args: argparse.Namespace) -> int:
    if not args.hours > 0:
        raise UsageProblem(f"perfsuite shards: --hours {args.hours:g}: expected more than 0")
    found = shards(args.tier, args.hours)
    if args.json:
        print(json.dumps(found), file=getattr(args, "json_out", None) or sys.stdout, flush=True)
        return EXIT_OK
    timeout = {c.id: c.timeout_s for c in cells_mod.select(tier=args.tier)}
    for shard in found:
        summed = sum(timeout[c] for c in shard["cells"]) / 3600
        findings = ", then the findings" if shard["findings"] else ""
        print(f"shard {shard['shard']}: {len(shard['cells'])} cell(s), timeouts {round(summed, 1):g} h{findings}")
        for cell in shard["cells"]:
            print(f"  {cell}")
    return EXIT_OK


DESCRIPTION = """\
The tier's cells as shards, each one job's pytest session over cells whose
timeouts sum to at most --hours (`pytest tests/perf --perf-tier full -k
"[ID] or ..." --perf-resume`, one output folder for every shard). Every twin
a cell's cross-cell checks or findings may ask for is in the cell's shard or
an earlier one, so that it is measured once; the last shard also runs the
findings. The example workflow's full job takes its matrix from --json."""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("shards", help="a tier's cells as shards of at most --hours of timeouts, one job each",
                       description=DESCRIPTION)
    p.add_argument("--tier", default="full", choices=cells_mod.TIERS, help="the tier to shard")
    p.add_argument("--hours", type=float, default=HOURS,
                   help="what a shard's cells' timeouts may sum to: a job's limit less its setup")
    p.add_argument("--json", action="store_true",
                   help="one line of JSON, as a GitHub job output takes it: an array of the shards "
                        "(shard, cells, findings)")
    p.set_defaults(func=cmd_shards)
