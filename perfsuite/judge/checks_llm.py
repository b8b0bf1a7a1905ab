"""The step-time verdict of an LLM cell: per token, not per step.

An LLM step's time follows its batch's padded length (on one H100 the 8B
cells' steps spread over an IQR of 14-21 % of their median), so raw step
times mostly compare padding. ``TimePerTokenNotRegressed`` judges
each step's time over its tokens (``time_per_token``, recorded per step by
``perfsuite.workloads.llm_metrics``) as step times are judged; against a
folder recorded before per-step token counts, whose tokens/s row
(``baseline_lookup.find_time_per_token``) is one launch's total tokens over
its measured time, it compares each launch's total step time over its total
tokens on both sides, never a median of steps with such a total.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from perfsuite.judge.checks import StepTimeNotRegressed, Verdict, _from_comparison, _not_ok, whose_spread
from perfsuite.judge.lookup import Expectation
from perfsuite.stats import launches as launchstats
from perfsuite.stats.samples import summary


def launch_time_per_token(result: Mapping[str, Any]) -> list[float]:
    """Each launch's step times summed over its tokens summed (what its tokens/s
    inverts); from its tokens/s where it kept no per-step token counts."""
    metrics = result.get("metrics", {})
    steps, tokens = metrics.get("step_time") or {}, metrics.get("tokens") or {}
    pairs = list(zip(steps.get("launches") or [steps.get("samples") or []],
                     tokens.get("launches") or [tokens.get("samples") or []]))
    if pairs and all(len(d) == len(n) and sum(n) > 0 for d, n in pairs):
        return [sum(d) / sum(n) for d, n in pairs]
    rate = (metrics.get("throughput") or {}).get("value")
    return [1.0 / rate] if isinstance(rate, (int, float)) and rate > 0 else []


class TimePerTokenNotRegressed(StepTimeNotRegressed):
    """An LLM cell's step-time verdict, per token (a step's time follows its
    batch's padded length): per-step samples as step times are judged; against
    a launch recorded without per-step token counts (``find_time_per_token``),
    each launch's total step time over its total tokens, on both sides."""

    def __init__(self, expectation: Expectation | None = None, **options: Any) -> None:
        super().__init__(expectation, metric="time_per_token", **options)

    def evaluate(self, result: Mapping[str, Any], twin: Mapping[str, Any] | None = None) -> Verdict:
        exp, cell = self.expectation, result.get("id")
        if (exp is None or not exp.available or exp.samples
                or _not_ok(self.name, self.metric, result) is not None):
            return super().evaluate(result, twin)
        values = launch_time_per_token(result)
        if not values:
            return Verdict(self.name, "unknown", metric=self.metric, cell=cell,
                           message=f"cell {cell} reported no tokens to judge its steps by")
        cmp = launchstats.compare_launches([[v] for v in values], [[exp.value]], exp.tolerance,
                                           self.confidence, spread=exp.launch_spread)
        verdict = whose_spread(_from_comparison(self.name, self.metric, "s/token", cmp,
                                                summary(values)["median"], exp.value, exp, cell), result, exp)
        verdict.message += "; each launch: its total step time over its total tokens"
        return verdict
