"""Two runs compared cell by cell: run B judged against run A (``perfsuite
compare``, and every check but step time in ``perfsuite ab``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from perfsuite.judge.baselines import CounterBaseline, run_cells, run_profile
from perfsuite.judge.checks import (
    AccuracyAtLeast,
    PeakMemoryNotRegressed,
    StepTimeNotRegressed,
    WorkCountersUnchanged,
    _metric,
    _skip,
)
from perfsuite.judge.lookup import Expectation
from perfsuite.stats.samples import DEFAULT_CONFIDENCE, DEFAULT_TOLERANCE


def _env_profile(results: Mapping[str, Any]) -> str | None:
    try:
        return run_profile(results)
    except (ImportError, ValueError):
        return None


def compare_runs(results_a: Mapping[str, Any], results_b: Mapping[str, Any], *,
                 tolerance: float = DEFAULT_TOLERANCE,
                 confidence: float = DEFAULT_CONFIDENCE,
                 allow_other_hardware: bool = False,
                 launch_statistic: str = "median") -> list[dict[str, Any]]:
    """Run B judged against run A (the reference), cell by cell.

    Step time by launches (each launch's ``launch_statistic``; one launch a
    side is "unknown": nothing tells drift from change), peak memory by
    value, accuracy against A's less 2%, work counters exactly (on any
    hardware: what a step does is not a property of the machine).
    Absolute metrics of runs on different hardware profiles are skipped with
    the reason unless ``allow_other_hardware``.
    """
    cells_a = {c["id"]: c for c in run_cells(results_a)}
    cells_b = {c["id"]: c for c in run_cells(results_b)}
    prof_a, prof_b = _env_profile(results_a), _env_profile(results_b)
    same_hw = allow_other_hardware or prof_a == prof_b
    out = []
    for cell_id in sorted(set(cells_a) | set(cells_b)):
        try:
            out += _compare_cell(cell_id, cells_a.get(cell_id), cells_b.get(cell_id), same_hw,
                                 (prof_a, prof_b), tolerance, confidence, launch_statistic)
        except ValueError as err:  # a value no statistic can judge: say which cell holds it
            raise ValueError(f"cell {cell_id}: {err}") from None
    for entry in out:
        entry.setdefault("cell", None)
    return out


# Metrics a rank's start changes: a forked rank's resident set counts the
# pages it shares with the zygote it was forked from (torch's, the workload's)
# as a fresh interpreter counts its own imports: another number for the same
# work. Device memory is the same either way.
RANK_START_METRICS = ("peak_rss",)


def rank_start_note(a: Mapping[str, Any], b: Mapping[str, Any], cell_id: str) -> str | None:
    """Where the two runs started this cell's ranks differently (each
    result's ``info.rank_start``): the sentence that says so, else None."""
    starts = [(c.get("info") or {}).get("rank_start") for c in (a, b)]
    if None in starts or starts[0] == starts[1]:
        return None
    return (f"run A's ranks started by {starts[0]}, run B's by {starts[1]} (forked ranks share the "
            f"zygote's imported pages, exec'd ones import their own): {', '.join(RANK_START_METRICS)} "
            "not judged across them; compare runs made with one --rank-start")


def _compare_cell(cell_id: str, a: Mapping[str, Any] | None, b: Mapping[str, Any] | None,
                  same_hw: bool, profiles: tuple[str | None, str | None], tolerance: float,
                  confidence: float, launch_statistic: str) -> list[dict[str, Any]]:
    """Run B's cell judged against run A's: step time, peak memory, work
    counters, accuracy (compare_runs)."""
    prof_a, prof_b = profiles
    if a is None or b is None:
        side = "A" if b is None else "B"
        return [_skip("compare", "step_time", f"cell only in run {side}", cell_id).to_dict()]
    out = []
    started_apart = rank_start_note(a, b, cell_id)
    if started_apart:
        out.append(_skip("rank_start", "rank_start", started_apart, cell_id).to_dict())
    if not same_hw:
        msg = f"no comparable baseline: run A on {prof_a}, run B on {prof_b}"
        out.append(_skip("step_time", "step_time", msg, cell_id).to_dict())
    else:
        base_samples = _metric(a, "step_time").get("samples") or []
        base_launches = tuple(map(tuple, _metric(a, "step_time").get("launches") or []))
        exp = (Expectation("step_time", None, tolerance=tolerance, samples=tuple(base_samples),
                           launches=base_launches if len(base_launches) > 1 else (),
                           launch_statistic=launch_statistic,
                           source=f"run A cell {cell_id}") if base_samples else
               Expectation("step_time", reason="run A has no step-time samples"))
        if a.get("status") != "ok":
            exp = Expectation("step_time", reason=f"run A cell has status {a.get('status')}")
        out.append(StepTimeNotRegressed(exp, confidence=confidence).evaluate(b).to_dict())
        for metric in ("peak_mem_allocated", "peak_mem_reserved", "peak_rss"):
            value = _metric(a, metric).get("value")
            if started_apart and metric in RANK_START_METRICS:
                out.append(_skip(metric, metric, started_apart, cell_id).to_dict())
            elif a.get("status") == "ok" and isinstance(value, (int, float)) and value > 0:
                check = PeakMemoryNotRegressed(value=float(value), tolerance=tolerance,
                                               metric=metric)
                out.append(check.evaluate(b).to_dict())
    if a.get("counters") and a.get("status") == "ok":
        base = CounterBaseline(cell_id, {}, {}, a["counters"]["per_step"],
                               unstable=tuple(a["counters"].get("unstable", [])),
                               source=f"run A cell {cell_id}")
        out.append(WorkCountersUnchanged(base).evaluate(b).to_dict())
    acc = _metric(a, "accuracy").get("value")
    if a.get("status") == "ok" and isinstance(acc, (int, float)) and math.isfinite(acc):
        check = AccuracyAtLeast(max(0.0, acc * 0.98), source=f"run A accuracy {acc:.4f} - 2%")
        out.append(check.evaluate(b).to_dict())
    return out
