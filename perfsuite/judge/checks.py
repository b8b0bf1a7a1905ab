"""Checks: expectations about measured cells, answered with a Verdict.

Single-cell checks read one cell result (the results.json dict); cross-cell
checks also read a twin cell, e.g. the 1-GPU run of the same configuration
for scaling efficiency. Every check has ``name`` and
``evaluate(result, twin=None) -> Verdict``. Checks know nothing of pytest or
torch; their baselines come from perfsuite.judge.baselines as Expectations.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, ClassVar, cast

from perfsuite.judge.accepted import accept_verdict
from perfsuite.judge.baselines import CounterBaseline, norm
from perfsuite.judge.lookup import Expectation
from perfsuite.judge.spreads import launch_kind
from perfsuite.rank import counters
from perfsuite.schemas.records import CheckRecord
from perfsuite.stats import launches as launchstats
from perfsuite.stats.samples import (
    DEFAULT_CONFIDENCE,
    DEFAULT_TOLERANCE,
    Comparison,
    Interval,
    compare_interval,
    compare_values,
    median_ratio_interval,
    summary,
    within_range,
)

STATES = ("same", "regressed", "improved", "unknown", "pass", "fail", "skipped")
FAILING = frozenset({"regressed", "fail"})


@dataclass
class Verdict:
    """One check's answer. ``ci_low``/``ci_high`` bound ``ratio`` (observed over
    expected) when the check compares with a baseline value, and ``observed``
    itself when it checks a range or threshold."""

    name: str
    verdict: str
    observed: float | None = None
    expected: float | None = None
    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    confidence: float | None = None
    p_value: float | None = None
    tolerance: float | None = None
    metric: str | None = None
    unit: str | None = None
    baseline: str | None = None
    message: str = ""
    cell: str | None = None
    # a skip for want of a baseline: "baseline" (none on this hardware for this
    # metric), "counters" (none for this software stack), or an `unknown` for
    # want of a between-launch spread of the cell's launch kind ("spread"); what a
    # run that records its runner's baselines records (perfsuite.judge.recording.record_missing)
    missing: str | None = None

    def __post_init__(self) -> None:
        if self.verdict not in STATES:
            raise ValueError(f"verdict {self.verdict!r} not in {STATES}")

    @property
    def failed(self) -> bool:
        return self.verdict in FAILING

    def to_dict(self) -> CheckRecord:
        """An entry of a cell's "checks" list; JSON-safe (no NaN or infinity)."""
        return cast(CheckRecord, {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                                  for k, v in asdict(self).items() if k != "missing" or v is not None})


def _fmt(x: float | None, unit: str = "") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:.4g}{(' ' + unit) if unit else ''}"


def _skip(name: str, metric: str, message: str, cell: str | None = None,
          missing: str | None = None) -> Verdict:
    return Verdict(name, "skipped", metric=metric, message=message, cell=cell, missing=missing)


def _metric(result: Mapping[str, Any], metric: str) -> dict[str, Any]:
    return result.get("metrics", {}).get(metric) or {}


def _not_ok(name: str, metric: str, *results: Mapping[str, Any] | None) -> Verdict | None:
    """A skip verdict when a needed cell is absent or did not finish ok."""
    for res in results:
        if res is None:
            return _skip(name, metric, "the twin cell this check needs was not run")
        if res.get("status") != "ok":
            return _skip(name, metric, f"cell {res.get('id')} has status {res.get('status')}",
                         res.get("id"))
    return None


def _from_comparison(name: str, metric: str, unit: str, cmp: Comparison,
                     observed: float | None, expected: float | None, exp: Expectation | None,
                     cell: str | None) -> Verdict:
    source = exp.source if exp else ""
    ci = f"{_fmt(cmp.ci_low)}-{_fmt(cmp.ci_high)}"
    conf = f"{cmp.confidence:.0%} CI " if cmp.confidence else ""
    if "launch" in cmp.method:  # say over what the interval runs
        ci += f", {cmp.method} over {cmp.n_new} vs {cmp.n_base} launches"
    message = (f"{metric} {cmp.verdict}: observed {_fmt(observed, unit)}, baseline "
               f"{_fmt(expected, unit)} ±{cmp.tolerance:.0%} ({source or 'given'}); "
               f"ratio {cmp.ratio:.4g} ({conf}{ci})" + (f"; {cmp.reason}" if cmp.reason else ""))
    return Verdict(name, cmp.verdict, observed, expected, cmp.ratio, cmp.ci_low, cmp.ci_high,
                   cmp.confidence, cmp.p_value, cmp.tolerance, metric, unit, source or None,
                   message, cell, missing="spread" if cmp.reason == launchstats.DRIFT_UNKNOWN else None)


def whose_spread(verdict: Verdict, result: Mapping[str, Any], exp: Expectation) -> Verdict:
    """An `unknown` for want of a launch spread says whose kind wants one: the
    folder may hold other kinds' spreads (perfsuite.judge.spreads)."""
    if verdict.missing != "spread":
        return verdict
    return replace(verdict, message=f"{verdict.message} (no spread of {launch_kind(result.get('params') or {})} "
                   f"launches is recorded for {exp.baseline} or its hardware)")


class StepTimeNotRegressed:
    """Step-time samples against baseline samples (preferred) or one number."""

    def __init__(self, expectation: Expectation | None = None, *, samples: Sequence[float] = (),
                 value: float | None = None, tolerance: float = DEFAULT_TOLERANCE,
                 confidence: float = DEFAULT_CONFIDENCE, name: str = "step_time",
                 metric: str = "step_time") -> None:
        if expectation is None and (samples or value is not None):
            expectation = Expectation(metric, value, tolerance=tolerance, samples=tuple(samples),
                                      source="given")
        self.expectation, self.confidence, self.name, self.metric = (
            expectation, confidence, name, metric)

    def evaluate(self, result: Mapping[str, Any], twin: Mapping[str, Any] | None = None) -> Verdict:
        cell = result.get("id")
        if (skip := _not_ok(self.name, self.metric, result)) is not None:
            return skip
        exp = self.expectation
        if exp is None or not exp.available:
            return _skip(self.name, self.metric, exp.reason if exp else "no comparable baseline",
                         cell, missing="baseline")
        data = _metric(result, self.metric)
        observed = data.get("samples") or []
        if not observed:
            return Verdict(self.name, "unknown", metric=self.metric, cell=cell,
                           message=f"cell {cell} reported no {self.metric} samples")
        launches = data.get("launches") or [observed]
        if exp.samples:
            cmp = launchstats.compare_launches(launches, exp.launches or [exp.samples],
                                               exp.tolerance, self.confidence,
                                               statistic=exp.launch_statistic,
                                               spread=exp.launch_spread)
            expected = summary(exp.samples)["median"]
        else:  # one number (a paper's table): one launch of the baseline, its typical step
            cmp = launchstats.compare_launches(launches, [[exp.value]], exp.tolerance,
                                               self.confidence, statistic="median",
                                               spread=exp.launch_spread)
            expected = exp.value
        verdict = whose_spread(_from_comparison(self.name, self.metric, data.get("unit", "s"), cmp,
                                                summary(observed)["median"], expected, exp, cell), result, exp)
        # a regression accepted on purpose: judged against the baseline times its ratio
        return accept_verdict(verdict, baseline_commit=exp.commit or None)


class PeakMemoryNotRegressed:
    """Peak memory (one number per run, nearly deterministic) against its baseline."""

    def __init__(self, expectation: Expectation | None = None, *, value: float | None = None,
                 tolerance: float = 0.05, metric: str = "peak_mem_allocated",
                 name: str | None = None) -> None:
        if expectation is None and value is not None:
            expectation = Expectation(metric, value, tolerance=tolerance, source="given")
        self.expectation, self.metric = expectation, metric
        self.name = name or metric

    def evaluate(self, result: Mapping[str, Any], twin: Mapping[str, Any] | None = None) -> Verdict:
        cell = result.get("id")
        if (skip := _not_ok(self.name, self.metric, result)) is not None:
            return skip
        exp = self.expectation
        if exp is None or not exp.available or not exp.value:
            return _skip(self.name, self.metric, exp.reason if exp else "no comparable baseline",
                         cell, missing="baseline")
        observed = _metric(result, self.metric).get("value")
        if not isinstance(observed, (int, float)) or not math.isfinite(observed):
            return Verdict(self.name, "unknown", metric=self.metric, cell=cell,
                           message=f"cell {cell} reported no {self.metric}")
        cmp = compare_values(float(observed), exp.value, exp.tolerance,
                             higher_is_better=exp.better == "higher")
        return _from_comparison(self.name, self.metric, "bytes", cmp, float(observed), exp.value,
                                exp, cell)


class AccuracyAtLeast:
    """Test accuracy (a fraction) at or above a threshold."""

    def __init__(self, threshold: float, *, source: str = "",
                 name: str = "accuracy_at_least") -> None:
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"accuracy threshold is a fraction in [0, 1], got {threshold}")
        self.threshold, self.source, self.name = threshold, source, name

    @classmethod
    def from_expectation(cls, exp: Expectation) -> AccuracyAtLeast:
        """The baseline's accuracy less its relative tolerance."""
        return cls(exp.value * (1.0 - exp.tolerance), source=exp.source)

    def evaluate(self, result: Mapping[str, Any], twin: Mapping[str, Any] | None = None) -> Verdict:
        cell = result.get("id")
        if (skip := _not_ok(self.name, "accuracy", result)) is not None:
            return skip
        acc = _metric(result, "accuracy").get("value")
        if not isinstance(acc, (int, float)) or not math.isfinite(acc):
            return Verdict(self.name, "fail", None, self.threshold, metric="accuracy", cell=cell,
                           message=f"cell {cell} reported no accuracy; the check needs one")
        verdict = "pass" if acc >= self.threshold else "fail"
        return Verdict(self.name, verdict, float(acc), self.threshold, metric="accuracy",
                       unit="fraction", baseline=self.source or None, cell=cell,
                       message=f"accuracy {verdict}: observed {acc:.4f}, at least "
                               f"{self.threshold:.4f} ({self.source or 'given'})")


def samples_per_step(result: Mapping[str, Any]) -> float:
    """Distinct samples one step advances across ranks (what throughput counts)."""
    info = result.get("info") or {}
    if info.get("images_per_step"):
        return float(info["images_per_step"])
    params = result.get("params", {})
    batch, world = params.get("batch_size", 1), params.get("world_size", 1)
    # "ddp" (no distribution): every rank trains on the same batch.
    return float(batch if params.get("strategy") == "ddp" else batch * world)


class CrossCellRatio:
    """A ratio between a cell and its twin, from both cells' step-time samples.

    ``speedup`` = throughput(cell) / throughput(twin); with an expected value
    it is judged same/regressed/improved, with a range (a paper's finding or
    explicit ``minimum``/``maximum``) pass/fail/unknown.
    """

    name = "ratio"
    metric = "speedup"
    higher_is_better = True
    twin_overrides: ClassVar[dict[str, Any]] = {}

    def __init__(self, expectation: Expectation | None = None, *, minimum: float | None = None,
                 maximum: float | None = None, tolerance: float = 0.0,
                 confidence: float = DEFAULT_CONFIDENCE, name: str | None = None) -> None:
        # Thresholds given here are in this check's own units (e.g. efficiency),
        # while baselines store the speed-up as the paper prints it.
        self.own_units = expectation is None and (minimum is not None or maximum is not None)
        if self.own_units:
            expectation = Expectation(self.metric, None, minimum, maximum, tolerance,
                                      reference=self.reference, source="given")
        self.expectation, self.confidence = expectation, confidence
        self.name = name or self.name

    @property
    def reference(self) -> str:
        return "; ".join(f"{k}={norm(v)}" for k, v in self.twin_overrides.items())

    def applies(self, params: Mapping[str, Any]) -> bool:
        return any(norm(params.get(k)) != norm(v) for k, v in self.twin_overrides.items())

    def twin_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return {**params, **self.twin_overrides}

    def observed(self, result: Mapping[str, Any], twin: Mapping[str, Any]) -> Interval:
        factor = samples_per_step(result) / samples_per_step(twin)
        return median_ratio_interval(_metric(twin, "step_time")["samples"],
                                     _metric(result, "step_time")["samples"],
                                     factor=factor, confidence=self.confidence)

    def expected_scale(self, result: Mapping[str, Any]) -> float:
        """Factor turning the stored speed-up into this check's quantity."""
        return 1.0

    def evaluate(self, result: Mapping[str, Any], twin: Mapping[str, Any] | None = None) -> Verdict:
        cell = result.get("id")
        if (skip := _not_ok(self.name, self.metric, result, twin)) is not None:
            return skip
        exp = self.expectation
        if exp is None or not exp.available:
            return _skip(self.name, self.metric, exp.reason if exp else "no comparable baseline",
                         cell, missing="baseline")
        if not (_metric(result, "step_time").get("samples")
                and _metric(twin, "step_time").get("samples")):
            return Verdict(self.name, "unknown", metric=self.metric, cell=cell,
                           message=f"{cell} or its twin {twin.get('id')} has no step-time samples")
        interval = self.observed(result, twin)
        scale = 1.0 if self.own_units else self.expected_scale(result)
        what = f"{self.name} of {cell} vs {twin.get('id')}"
        if exp.value is not None:
            expected = exp.value * scale
            cmp = compare_interval(interval, expected, exp.tolerance,
                                   higher_is_better=self.higher_is_better)
            verdict = _from_comparison(self.name, self.name, "", cmp, interval.estimate, expected,
                                       exp, cell)
            verdict.message = f"{what}: " + verdict.message
            return verdict
        low = exp.low * scale if exp.low is not None else None
        high = exp.high * scale if exp.high is not None else None
        state = within_range(interval, low, high, exp.tolerance)
        source = exp.source or "given"
        return Verdict(self.name, state, interval.estimate, None, None, interval.low,
                       interval.high, interval.confidence, None, exp.tolerance, self.name, "",
                       exp.source or None,
                       f"{what} {state}: observed {_fmt(interval.estimate)} "
                       f"({interval.confidence:.0%} CI {_fmt(interval.low)}-{_fmt(interval.high)})"
                       f", expected within [{_fmt(low)}, {_fmt(high)}] ±{exp.tolerance:.0%} "
                       f"({source})", cell)


class ScalingEfficiency(CrossCellRatio):
    """T(1) / (N * T(N)) in throughput terms: speed-up over the 1-rank twin / N."""

    name = "scaling_efficiency"
    twin_overrides: ClassVar[dict[str, Any]] = {"world_size": 1}

    def _ranks(self, result: Mapping[str, Any]) -> int:
        return int(result.get("params", {}).get("world_size", 1))

    def observed(self, result: Mapping[str, Any], twin: Mapping[str, Any]) -> Interval:
        return super().observed(result, twin).scaled(1.0 / self._ranks(result))

    def expected_scale(self, result: Mapping[str, Any]) -> float:
        return 1.0 / self._ranks(result)  # baselines store the speed-up, as the paper prints it


class PrecisionSpeedup(CrossCellRatio):
    """Throughput at this precision over the FP64 twin's."""

    name = "precision_speedup"
    twin_overrides: ClassVar[dict[str, Any]] = {"precision": "fp64"}


class PinMemoryGain(CrossCellRatio):
    """Throughput with pin_memory over the twin without it."""

    name = "pin_memory_gain"
    twin_overrides: ClassVar[dict[str, Any]] = {"pin_memory": False}

    def applies(self, params: Mapping[str, Any]) -> bool:
        return norm(params.get("pin_memory")) == "true"


class StepTimeRatio(CrossCellRatio):
    """Median step time over the 1-rank twin's (per-iteration cost of more ranks)."""

    name = "step_time_ratio"
    metric = "step_time_ratio"
    higher_is_better = False
    twin_overrides: ClassVar[dict[str, Any]] = {"world_size": 1}

    def observed(self, result: Mapping[str, Any], twin: Mapping[str, Any]) -> Interval:
        return median_ratio_interval(_metric(result, "step_time")["samples"],
                                     _metric(twin, "step_time")["samples"],
                                     confidence=self.confidence)


class FindingRatio(CrossCellRatio):
    """A finding of the experiment data (``perfsuite.cells.Finding``): the
    subject's throughput over its twin's, within the finding's range."""

    def __init__(self, finding: Any, confidence: float = DEFAULT_CONFIDENCE) -> None:
        self.finding = finding
        self.twin_overrides = dict(finding.twin)
        super().__init__(Expectation("speedup", None, finding.low, finding.high, 0.0,
                                     better="higher", source=finding.source),
                         confidence=confidence, name=f"finding.{finding.name}")

    def applies(self, params: Mapping[str, Any]) -> bool:
        return self.finding.applies(dict(params))


class WorkCountersUnchanged:
    """The work counters of a cell's step against recorded ones: exact (a
    per-counter tolerance only where the baseline gives one), so one launch
    decides. A failure names what changed. Where none were recorded on this
    run's software stack, ``across`` (the newest of another stack) shows what
    the stack change changed: ``pass`` where nothing did, else ``unknown``
    (a new torch may rightly change them), never a silent skip."""

    name = "work_counters"
    metric = "counters"

    def __init__(self, baseline: CounterBaseline | None, reason: str = "",
                 across: CounterBaseline | None = None) -> None:
        self.baseline, self.reason, self.across = baseline, reason, across

    def evaluate(self, result: Mapping[str, Any], twin: Mapping[str, Any] | None = None) -> Verdict:
        cell = result.get("id")
        if (skip := _not_ok(self.name, self.metric, result)) is not None:
            return skip
        base = self.baseline or self.across
        if base is None:
            return _skip(self.name, self.metric, self.reason or "no comparable counters", cell,
                         missing="counters")
        measured = result.get("counters") or {}
        if not measured.get("per_step"):
            return _skip(self.name, self.metric, f"cell {cell} counted no work (count_steps=0, "
                         "or a workload without a counting window)", cell)
        unstable = set(measured.get("unstable", [])) | set(base.unstable)
        changes = counters.diff(measured["per_step"], base.per_step, base.tolerance, unstable)
        lines = counters.describe(changes)
        if len(lines) > 12:
            lines = lines[:12] + [f"... {len(lines) - 12} more"]
        judged = len(set(measured["per_step"]) | set(base.per_step)) - len(unstable)
        message = (f"work counters {'changed' if changes else 'unchanged'} against "
                   f"{base.source or base.cell}: "
                   + ("; ".join(lines) if changes else f"{judged} counters per step equal"))
        if unstable:
            message += f" (not judged, unstable between steps or launches: {', '.join(sorted(unstable))})"
        verdict, missing = ("fail" if changes else "pass"), None
        if self.baseline is None:  # another stack's: shown, not judged
            stacks = self.reason.split(": compare")[0]  # "... recorded on X, this run has Y"
            message = (f"across the stack change ({stacks}): {message}; record this stack's "
                       "counters to judge them")
            verdict, missing = ("unknown" if changes else "pass"), "counters"
        return Verdict(self.name, verdict, float(len(changes)), 0.0,
                       metric=self.metric, unit="changed counters", baseline=base.source or None,
                       message=message, cell=cell, missing=missing)


CROSS_CELL = (ScalingEfficiency, PrecisionSpeedup, PinMemoryGain, StepTimeRatio)


def needed_cells(params: Mapping[str, Any], checks: tuple[type[CrossCellRatio], ...] = CROSS_CELL
                 ) -> dict[str, dict[str, Any]]:
    """The twin cells' parameters each applicable cross-cell check needs."""
    out = {}
    for check in checks:
        probe = check()
        if probe.applies(params):
            out[probe.name] = probe.twin_params(params)
    return out
