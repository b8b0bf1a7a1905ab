"""Which checks judge one cell: every check with a comparable baseline.

Above the checks themselves (perfsuite.judge.checks, and the per-token
verdict of LLM cells in perfsuite.judge.checks_llm, which builds on them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from perfsuite.judge.baselines import load_all
from perfsuite.judge.checks import (
    CROSS_CELL,
    AccuracyAtLeast,
    PeakMemoryNotRegressed,
    StepTimeNotRegressed,
    WorkCountersUnchanged,
)
from perfsuite.judge.checks_llm import TimePerTokenNotRegressed
from perfsuite.judge.lookup import (
    Expectation,
    find_counters,
    find_expectations,
    find_time_per_token,
    other_stack_counters,
)


def checks_for(params: Mapping[str, Any], profile_id: str | None, *,
               sets: list | None = None, root: Any = None,
               cross_cell: bool = True, env: Mapping[str, Any] | None = None) -> list[Any]:
    """Every check with a comparable baseline for a cell; the step-time and
    (given the run's ``env``) work-counter checks always, so that a report
    says why they were skipped when there is none."""
    sets = load_all(root) if sets is None else sets

    def found(metric: str, reference: str = "") -> list[Expectation]:
        return find_expectations(params, metric, profile_id, reference=reference, sets=sets)

    # the step-time verdict, which says why when it skips
    out: list[Any] = [TimePerTokenNotRegressed(find_time_per_token(params, profile_id, sets=sets))
                      if params.get("workload") == "llm" else StepTimeNotRegressed(found("step_time")[0])]
    if env is not None:
        counted, why = find_counters(params, env, sets)
        out.append(WorkCountersUnchanged(counted, why, across=None if counted is not None
                                         else other_stack_counters(params, env, sets)))
    for metric in ("peak_mem_allocated", "peak_rss"):
        out += [PeakMemoryNotRegressed(e, metric=metric) for e in found(metric)[:1] if e.value]
    out += [AccuracyAtLeast.from_expectation(e) for e in found("accuracy")[:1] if e.value]
    for check in CROSS_CELL if cross_cell else ():
        if check().applies(params):
            out += [check(e) for e in found(check.metric, check().reference) if e.available]
    return out
