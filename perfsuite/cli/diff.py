"""``perfsuite diff RUN_A RUN_B``: why each shared cell's step time changed,
from both runs' profile summaries (perfsuite.profiling.attribution)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from perfsuite.cli.exits import EXIT_OK, UsageProblem, emit_json

# perfsuite.profiling.attribution and the results schema: imported in the
# command. main imports every cli module to build its parser.


def _results_file(path: Path) -> Path:
    return path / "results.json" if path.is_dir() else path


def _cells(path: Path) -> dict[str, dict[str, Any]]:
    """A run's measured cells by id (a cell launched again: its first result)."""
    import json

    from perfsuite.schemas.results import load

    try:
        single = json.loads(path.read_text()) if path.is_file() else None
        if isinstance(single, dict) and "id" in single and "metrics" in single:  # one cell's result.json
            return {single["id"]: single} if single.get("status") == "ok" else {}
        run = load(path)
    except (OSError, ValueError) as err:
        raise UsageProblem(f"perfsuite diff: {err}") from None
    out: dict[str, dict[str, Any]] = {}
    for cell in run["cells"]:
        if cell.get("status") == "ok":
            out.setdefault(cell["id"], cell)
    return out


def cmd_diff(args: argparse.Namespace) -> int:
    from perfsuite.profiling.attribution import attribute_results, format_attribution, markdown_attribution

    cells_a, cells_b = _cells(args.run_a), _cells(args.run_b)
    shared = [cell for cell in cells_a if cell in cells_b and (not args.cell or cell in args.cell)]
    if not shared:
        raise UsageProblem(f"perfsuite diff: {_results_file(args.run_a)} and {_results_file(args.run_b)} share no "
                           "cell measured in both" + (f" among {', '.join(args.cell)}" if args.cell else "")
                           + "; give two runs of the same cells")
    for run, cells in ((args.run_a, cells_a), (args.run_b, cells_b)):
        bare = [cell for cell in shared if not cells[cell].get("profile")]
        if bare:
            raise UsageProblem(
                f"perfsuite diff: {_results_file(run)} has no profile summary for {', '.join(bare[:3])}"
                + (f" and {len(bare) - 3} more" if len(bare) > 3 else "")
                + "; run the cells profiled (`perfsuite run CELL --profiler torch`) and diff those runs")
    document, blocks = [], []
    for cell in shared:
        a, b = cells_a[cell], cells_b[cell]
        diff = attribute_results(a, b, z=args.noise_z)
        a_s, b_s = a["metrics"]["step_time"]["value"], b["metrics"]["step_time"]["value"]
        document.append({"cell": cell, "a_step_time_s": a_s, "b_step_time_s": b_s, "attribution": diff.to_dict()})
        head = f"{cell}: step time {a_s * 1e3:.2f} ms -> {b_s * 1e3:.2f} ms ({100 * (b_s / a_s - 1):+.1f} %)"
        if args.markdown:
            blocks.append(f"### {cell}\n\n{head.split(': ', 1)[1]}\n\n{markdown_attribution(diff, top=args.top)}")
        else:
            blocks.append(f"{head}\n{format_attribution(diff, top=args.top)}")
    if args.json:
        emit_json(args, document)
    else:
        print("\n\n".join(blocks))
    return EXIT_OK


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("diff", help="why each shared cell's step time changed: its modules, operators, "
                                    "kernels, collectives and copies, from both runs' profiles",
                       description="Diff the profile summaries of the cells two runs share (runs made "
                                   "with --profiler torch, or profile cells): the rows that explain the "
                                   "step-time change, per level, above the diff's own noise. Exit 0, or "
                                   "2 where a run cannot be read or a cell has no profile summary.")
    p.add_argument("run_a", type=Path, help="reference run (directory, results.json, or a cell's result.json)")
    p.add_argument("run_b", type=Path, help="run to explain")
    p.add_argument("--cell", action="append", metavar="ID", help="only this cell (repeatable; default: every shared one)")
    p.add_argument("--top", type=int, default=3, help="rows shown per cell")
    p.add_argument("--noise-z", type=float, default=3.0, metavar="Z",
                   help="standard errors of the profiled steps' spread under which a row is not listed")
    p.add_argument("--markdown", action="store_true", help="print markdown tables instead")
    p.add_argument("--json", action="store_true", help="print the attributions as a JSON array")
    p.set_defaults(func=cmd_diff)


def print_attributions(run_a: dict[str, Any], run_b: dict[str, Any], top: int = 3) -> None:
    """``perfsuite compare``'s part: the attribution of every shared cell
    both runs profiled (cells without a profile summary say nothing)."""
    from perfsuite.profiling.attribution import attribute_results, format_attribution

    b_cells = {c["id"]: c for c in run_b["cells"] if c.get("status") == "ok"}
    seen = set()
    for a in run_a["cells"]:
        b = b_cells.get(a["id"])
        if a.get("status") != "ok" or b is None or a["id"] in seen:
            continue
        seen.add(a["id"])
        diff = attribute_results(a, b)
        if diff is not None:
            print(f"{a['id']}: where the step time went (perfsuite diff)\n{format_attribution(diff, top=top)}")
