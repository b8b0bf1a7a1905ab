"""Why a cell's verdict came out so: both sides profiled after the timing, diffed.

A cell that ends ``regressed`` or ``improved`` (any verdict with
``--attribute always``; none with ``never``) gets one short launch of each
side under torch.profiler once its judged launches or launch pairs are
over: the cell's own warm-up, then ``PROFILE_ONLY_STEPS`` profiled steps, no
counting window, no evaluation (perfsuite.profiling.fallback.profile_only).
Nothing judged ever runs under the profiler. In resident mode too the
profile is a short launch a side after the pairs, not a window of the
resident ranks: a window served under the profiler would need the ranks'
window protocol to open, summarise and write a profile, which a side of an
older perfsuite could not follow. The two summaries are diffed against the
verdict's step-time change (perfsuite.profiling.attribution). A profiling
failure is recorded as ``{"error": ...}`` and never touches the verdict.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from perfsuite.ab.sides import ABError, Side
from perfsuite.ab.verdicts import DECIDED
from perfsuite.cells import Cell
from perfsuite.launch.launch import LaunchOptions
from perfsuite.profiling.attribution import attribute, format_attribution
from perfsuite.profiling.fallback import PROFILE_ONLY_STEPS, profile_only

ATTRIBUTE_WHEN = ("changed", "always", "never")  # --attribute; the command's default is the first
CHANGED = ("regressed", "improved")
PROFILE_DIR = "profiled"  # each side's profiled launch: OUT/launches/<side>/profiled


def check_attribute(when: str) -> str:
    if when not in ATTRIBUTE_WHEN:
        raise ABError(f"--attribute {when}: use one of {', '.join(ATTRIBUTE_WHEN)}")
    return when


def wanted(verdict: str | None, when: str) -> bool:
    """Whether a cell of ``verdict`` is profiled for its attribution."""
    if when == "never" or verdict not in (*DECIDED, "unknown"):
        return False
    return when == "always" or verdict in CHANGED


def change_s(record: Mapping[str, Any]) -> float | None:
    """The verdict's step-time change, B - A in seconds: (ratio - 1) times
    side A's level, the median of its judged windows (resident) or of its
    launch values (launch rounds); None where there is no ratio."""
    ratio = record.get("ratio")
    if ratio is None:
        return None
    if record.get("mode") == "resident":
        values = [w["value"] for pair in record.get("pairs") or [] for w in pair.get("windows") or []
                  if w.get("side") == "A" and not w.get("settling") and w.get("value") is not None]
    else:
        values = [x["value"] for x in record.get("launches") or []
                  if x["side"] == "A" and x["status"] == "ok" and x.get("value") is not None]
    return (float(ratio) - 1.0) * statistics.median(values) if values else None


def _profiled_launch(cell: Cell, side: Side, launch: LaunchOptions | None, folder: Path,
                     run_cell: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """One short launch of ``side`` under torch.profiler, into ``folder``; its profile summary."""
    opts = side.options(launch)
    if opts.nodes.nnodes > 1 or opts.nodes.slurm:
        raise RuntimeError("a cell across nodes is not launched again for a profile: every node would have "
                           "to relaunch together")
    short, options = profile_only(cell, dict(opts.options))
    result = run_cell(short, folder, replace(opts, profiler="torch", options=options))
    where = result.get("dir") or folder
    if result.get("status") != "ok":
        raise RuntimeError(f"side {side.name}'s profiled launch ended {result.get('status')}: "
                           f"{result.get('reason')} (its log: {where})")
    if not result.get("profile"):
        why = (result.get("profiler") or {}).get("error")
        raise RuntimeError(f"side {side.name}'s profiled launch left no profile summary"
                           + (f" ({why})" if why else "") + f"; its folder: {where}")
    return result["profile"]


def attribute_cell(session: Any, cell: Cell, record: dict[str, Any],
                   run_cell: Callable[..., dict[str, Any]]) -> None:
    """``record["attribution"]`` of an ABSession's cell just judged: both
    sides profiled (A, then B) with the session's launch options, diffed; the
    lines said, the seconds added to the session's ``attribution_s`` and
    ab.json written. Any failure is said and recorded as the attribution's
    ``error``, the verdict untouched (an interrupt is raised, as ever)."""
    began = time.monotonic()
    session.log("  attribution: each side profiled in a short launch under torch.profiler (its warm-up, then up "
                f"to {PROFILE_ONLY_STEPS} steps), after the judged ones")
    dirs = {name: session.out_dir / "launches" / side.label / PROFILE_DIR for name, side in session.sides.items()}
    try:
        summaries = {name: _profiled_launch(cell, session.sides[name], session.launch, dirs[name], run_cell)
                     for name in "AB"}
        diff = attribute(summaries["A"], summaries["B"], change_s=change_s(record))
    except Exception as err:  # noqa: BLE001 - the verdict stands whatever the profile did
        diff, error = None, str(err) or type(err).__name__
    wall = time.monotonic() - began
    # The cell's time from its first launch (resident: its first pair's) to now, this profiling in it.
    cell_wall = max(time.time() - min((x["started"] for x in record["launches"]), default=time.time()), wall, 1e-6)
    profiled = {"how": "launch", "steps": min(diff.steps) if diff else None, "wall_s": round(wall, 3),
                "cell_wall_s": round(cell_wall, 3), "dirs": {name: str(path) for name, path in dirs.items()}}
    if diff is None:
        record["attribution"] = {"error": error, "profiled": profiled}
        session.log(f"  attribution: not made, the verdict stands: {error}")
    else:
        record["attribution"] = {**diff.to_dict(), "profiled": profiled}
        session.log(format_attribution(diff, top=3, indent="    "))
    session.log(f"    profiling added {wall:.1f} s ({100 * wall / cell_wall:.0f} % of this cell's {cell_wall:.0f} s)")
    session.attribution_s += wall
    session.data["attribution_wall_s"] = round(session.attribution_s, 3)
    session.write()


def session_line(added_s: float, session_s: float) -> str:
    """The session's last word on what the attributions cost."""
    return (f"attribution: profiling added {added_s:.1f} s, {100 * added_s / max(session_s, added_s, 1e-6):.0f} % "
            f"of the session's {session_s:.0f} s")
