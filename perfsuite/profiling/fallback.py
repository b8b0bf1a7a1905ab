"""A torch.profiler summary for a cell whose nsys capture stayed a .qdstrm.

An nsys without its QdstrmImporter records a capture and cannot make a
report of it, and ranks that ran under nsys ran no torch.profiler. So such a
cell is launched once more, for its profile only: under torch.profiler, cut
to its warm-up and profiled steps, with no counting window and no
evaluation. Its summary is the cell's profile; the cell's timings, counters
and checks stay those of the first launch. That costs one short launch, once
a session: later cells go to torch.profiler from the start (choose_profiler
remembers the nsys that failed).

Host side, no torch: the launch itself is the caller's ``run_cell``.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The second launch's steps after warm-up: the workloads profile windows of
# at most this many (image 10, LLM 5).
PROFILE_ONLY_STEPS = 10
CAPTURES_DIR = "qdstrm"  # in the cell's profile/: the captures nsys could not import
LAUNCH_DIR = "torch-launch"  # in the cell's profile/: the second launch's own folder
TRACE_SUFFIXES = (".trace.json", ".trace.json.gz")


def profile_only(cell: Any, options: dict[str, str]) -> tuple[Any, dict[str, str]]:
    """The cell and options of a launch that only profiles: the cell's own
    warm-up, then PROFILE_ONLY_STEPS steps (fewer where the cell has fewer),
    one epoch, no evaluation; no counting window."""
    steps = cell.warmup_steps + PROFILE_ONLY_STEPS
    max_steps = min(cell.max_steps, steps) if cell.max_steps > 0 else steps
    return (cell.replace(epochs=1, max_steps=max_steps, min_accuracy=0.0),
            {**options, "count_steps": "0"})


def set_captures_aside(profile_dir: Path) -> Path | None:
    """Move the .qdstrm captures into profile/qdstrm/ (a full nsys elsewhere
    can still import them), so the folder reads as the torch.profiler one
    (`perfsuite profile DIR`)."""
    captures = sorted(profile_dir.glob("*.qdstrm"))
    if not captures:
        return None
    aside = profile_dir / CAPTURES_DIR
    aside.mkdir(exist_ok=True)
    for capture in captures:
        os.replace(capture, aside / capture.name)
    return aside


def _adopt_traces(launched: Path, profile_dir: Path, profile: dict[str, Any]) -> None:
    """The second launch's traces into the cell's profile/ folder, where the
    report links them; the summary's trace paths follow them."""
    moved = {}
    for trace in sorted((launched / "profile").glob("*")):
        if trace.is_file() and trace.name.endswith(TRACE_SUFFIXES):
            os.replace(trace, profile_dir / trace.name)
            moved[str(trace)] = str(profile_dir / trace.name)
    for part in [profile, *(profile.get("ranks") or [])]:
        meta = part.get("meta") or {}
        if meta.get("trace") in moved:
            meta["trace"] = moved[meta["trace"]]


def profile_with_torch(result: dict[str, Any], cell: Any, opts: Any, profile_dir: Path,
                       run_cell: Callable[..., dict[str, Any]]) -> None:
    """Give ``result`` (a launch under nsys that left only .qdstrm files) the
    profile of a second, profile-only launch under torch.profiler, and say so
    in its profiler note. ``opts`` is the first launch's LaunchOptions."""
    profiler = result["profiler"]
    first_note = profiler.get("note", "")
    aside = set_captures_aside(profile_dir)
    kept = f" (kept in {aside})" if aside else ""
    if opts.nodes.nnodes > 1:  # every node would have to relaunch together
        profiler["note"] = "; ".join(filter(None, [first_note, (
            f"nsys left only .qdstrm captures{kept}; a cell across nodes is not launched again for a "
            "torch.profiler summary: `--perf-profiler torch` (pytest) or `--profiler torch` (perfsuite run) "
            "profiles it")]))
        return
    short, options = profile_only(cell, dict(opts.options))
    launch_dir = profile_dir / LAUNCH_DIR
    shutil.rmtree(launch_dir, ignore_errors=True)
    began = time.time()
    second = run_cell(short, launch_dir, dataclasses.replace(opts, profiler="torch", options=options))
    took = time.time() - began
    launched = Path(second.get("dir") or launch_dir)
    profiler["profile_launch"] = {"dir": str(launched), "status": second.get("status"),
                                  "max_steps": short.max_steps, "duration_s": round(took, 3)}
    if second.get("status") == "ok" and second.get("profile"):
        _adopt_traces(launched, profile_dir, second["profile"])
        result["profile"] = second["profile"]
        profiler["timed_under"] = "nsys"
        profiler["mode"] = "torch"
        profiler["note"] = "; ".join(filter(None, [first_note, (
            f"nsys left only .qdstrm captures{kept}: the profile is from a second, profile-only launch "
            f"under torch.profiler ({short.max_steps} steps, {took:.0f} s, {launched}); the timings, "
            "counters and checks are this launch's, under nsys. Later cells of this session are profiled "
            "with torch.profiler from the start")]))
        return
    why = second.get("reason") or "it returned no profile"
    profiler["error"] = (f"{profiler.get('error', '')}; the profile-only launch under torch.profiler "
                         f"failed ({second.get('status')}: {why})").lstrip("; ")
    profiler["note"] = "; ".join(filter(None, [first_note, (
        f"nsys left only .qdstrm captures{kept} and the profile-only launch under torch.profiler failed "
        f"(see {launched}); this launch's timings stand without a profile")]))
