"""Baseline lookup: which rows and counters of the loaded baseline folders
apply to a cell, and what they expect of it.

Rows are keyed by cell parameters, not cell ids, so a cell of any tier finds
the rows whose parameters it shares (a blank key matches anything). Absolute
metrics (seconds, images/s, bytes) compare only within one hardware profile,
ratios within one GPU (or CPU) model, accuracy anywhere; otherwise the
Expectation is not available and says why, never a pass. The folders
themselves are loaded and validated by ``perfsuite.judge.baselines``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from perfsuite import hardware
from perfsuite.judge.baselines import (
    HIGHER_IS_BETTER,
    KEY_COLUMNS,
    PORTABLE_METRICS,
    RATIO_METRICS,
    BaselineError,
    BaselineSet,
    CounterBaseline,
    counter_versions,
    load_all,
    norm,
    parse_reference,
)
from perfsuite.judge.spreads import ANY_KIND, Spreads, spread_for
from perfsuite.stats import launches as launchstats


def find_counters(params: Mapping[str, Any], env: Mapping[str, Any],
                  sets: list[BaselineSet]) -> tuple[CounterBaseline | None, str]:
    """The newest counters recorded for these cell parameters on this
    software stack, from any folder (counts do not depend on the hardware
    model); otherwise None and why."""
    device, workload = str(params.get("device", "cpu")), params.get("workload")
    versions = counter_versions(env, device, workload)
    same_cell = [c for s in sets for c in s.counters if row_matches(c.params, params)]
    # recorded stacks seen through the same keys: an image cell's entry may name a torchtune
    same_stack = [c for c in same_cell if counter_versions(c.versions, device, workload) == versions]
    if same_stack:
        return max(same_stack, key=lambda c: c.recorded_at), ""
    if same_cell:
        other = max(same_cell, key=lambda c: c.recorded_at)
        stack = "; ".join(f"{k}={v}" for k, v in other.versions.items())
        here = "; ".join(f"{k}={v}" for k, v in versions.items())
        return None, (f"counters of this cell were recorded on {stack}, this run has {here}: "
                      "compare the two stacks with `perfsuite ab`, or record this stack's counters")
    return None, "no work counters recorded for these parameters; `perfsuite baseline record` keeps them"


def other_stack_counters(params: Mapping[str, Any], env: Mapping[str, Any],
                         sets: list[BaselineSet]) -> CounterBaseline | None:
    """The newest counters recorded for these cell parameters on another
    software stack than this run's (None where there are none): what a step
    did before a torch, CUDA or torchtune change, to show what it changed."""
    device, workload = str(params.get("device", "cpu")), params.get("workload")
    versions = counter_versions(env, device, workload)
    other = [c for s in sets for c in s.counters if row_matches(c.params, params)
             and counter_versions(c.versions, device, workload) != versions]
    return max(other, key=lambda c: c.recorded_at) if other else None


def row_matches(row: Mapping[str, Any], params: Mapping[str, Any]) -> bool:
    """Every non-blank key of the row equals the parameter (a missing parameter: no match)."""
    return all(not row.get(key) or (key in params and norm(params[key]) == norm(row[key]))
               for key in KEY_COLUMNS)


# A loaded table's rows as dicts, by the table's id (the table kept, so that
# the id is its own): judging one cell looks its tables up ~40 times, and
# DataFrame.to_dict each time was ~0.6 s a cell on the 2-core VM.
_ROWS: dict[int, tuple[pd.DataFrame, list[dict[str, Any]]]] = {}
_ROWS_KEPT = 32


def _rows(table: pd.DataFrame) -> list[dict[str, Any]]:
    kept = _ROWS.get(id(table))
    if kept is not None and kept[0] is table:
        return kept[1]
    if len(_ROWS) >= _ROWS_KEPT:
        _ROWS.pop(next(iter(_ROWS)))
    rows = table.to_dict("records")
    _ROWS[id(table)] = (table, rows)
    return rows


def lookup(table: pd.DataFrame, params: Mapping[str, Any], metric: str | None = None,
           reference: str | None = None) -> pd.DataFrame:
    """Rows of ``table`` that apply to a cell with ``params``. ``table``: one of
    a loaded BaselineSet's, not changed after (its rows are read once)."""
    if table.empty:
        return table
    ref = parse_reference(reference) if reference is not None else None
    matching = [i for i, row in enumerate(_rows(table))
                if metric in (None, row["metric"]) and row_matches(row, params)
                and (ref is None or parse_reference(row.get("reference", "")) == ref)]
    return table.iloc[matching] if matching else table.iloc[:0]  # a slice: no copy of the columns


@dataclass(frozen=True)
class Expectation:
    """What a baseline says about one metric of one cell (or why it says nothing)."""

    metric: str
    value: float | None = None
    low: float | None = None
    high: float | None = None
    tolerance: float = 0.0
    better: str = "lower"
    unit: str = ""
    samples: tuple[float, ...] = ()  # pooled over launches
    launches: tuple[tuple[float, ...], ...] = ()  # per launch, when recorded repeated
    launch_statistic: str = "median"  # the baseline profile's: each launch's median or floor
    launch_spread: launchstats.LaunchSpread | None = None  # recorded between-launch spread, if any
    reference: str = ""
    source: str = ""
    baseline: str = ""
    row_ids: tuple[str, ...] = ()
    reason: str = ""
    # the recorded cell's profile summary (profiles.json), for the diff of a step-time verdict
    profile: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    commit: str = ""  # the commit a recorded row was measured at ("": a paper's, or not said)

    @property
    def available(self) -> bool:
        return bool(self.samples) or any(x is not None for x in (self.value, self.low, self.high))


def samples_of(entry: Any) -> tuple[tuple[float, ...], tuple[tuple[float, ...], ...]]:
    """A samples.json entry: one launch's samples, or a list of launches'.
    Returns the pooled samples and the launches (none for a single launch)."""
    if not entry:
        return (), ()
    if isinstance(entry[0], list):
        launches = tuple(tuple(float(x) for x in launch) for launch in entry)
        return tuple(x for launch in launches for x in launch), launches
    return tuple(float(x) for x in entry), ()


def _from_rows(rows: pd.DataFrame, bset: BaselineSet, metric: str, reference: str,
               spread: launchstats.LaunchSpread | None) -> Expectation:
    """One expectation from matching rows, judged with ``spread`` (its launch
    kind's); repeated measurements widen the tolerance."""
    records = rows.to_dict("records")
    if any(r.get("samples_key") for r in records):  # recorded: the newest row, with samples
        records = [max((r for r in records if r.get("samples_key")),
                       key=lambda r: r.get("recorded_at", ""))]
    values = [float(r["value"]) for r in records if r.get("value")]
    value = sum(values) / len(values) if values else None
    tol = max(float(r["tolerance"]) for r in records)
    if value and len(values) > 1:  # the paper's own repeats disagree: allow that much more
        tol += (max(values) - min(values)) / (2 * value)
    lows = [float(r["low"]) for r in records if r.get("low")]
    highs = [float(r["high"]) for r in records if r.get("high")]
    first = records[0]
    return Expectation(
        metric, value, max(lows) if lows else None, min(highs) if highs else None, tol,
        first.get("better") or ("higher" if metric in HIGHER_IS_BETTER else "lower"),
        first.get("unit", ""), *samples_of(bset.samples.get(first.get("samples_key") or "")),
        bset.launch_statistic, spread, reference,
        "; ".join(dict.fromkeys(r["source"] for r in records)),
        bset.path.name, tuple(r["id"] for r in records),
        profile=(bset.profiles.get(first.get("cell") or "") or {}).get("summary"),
        commit=str(first.get("commit") or "") if first.get("samples_key") else "")


def profile_spreads(bset: BaselineSet, sets: list[BaselineSet]) -> Spreads:
    """The launch spreads of ``bset``'s hardware profile, per kind: its own,
    else another recorded folder's of the same profile (a runner's own
    baselines beside the project's: launches of one kind on one hardware
    scatter alike whichever folder recorded them)."""
    others = [s.launch_spread for s in sets if s is not bset and s.kind == "recorded"
              and s.hardware == bset.hardware]
    return {kind: entries for spreads in [*others, bset.launch_spread] for kind, entries in spreads.items()
            if kind != ANY_KIND or spreads is bset.launch_spread}


def _candidates(bset: BaselineSet, params: Mapping[str, Any], metric: str,
                reference: str, sets: list[BaselineSet]) -> list[Expectation]:
    spread = spread_for(profile_spreads(bset, sets), params, bset.launch_statistic)
    if metric not in RATIO_METRICS:
        rows = lookup(bset.metrics, params, metric)
        return [_from_rows(rows, bset, metric, "", spread)] if not rows.empty else []
    out = [_from_rows(rows.loc[[i]], bset, metric, reference, spread)
           for rows in (lookup(t, params, metric, reference) for t in (bset.ratios, bset.findings))
           for i in rows.index]
    if bset.kind == "recorded":  # the ratio of the two cells' recorded numbers
        base = "throughput" if metric == "speedup" else "step_time"
        pair = [lookup(bset.metrics, p, base) for p in (params, {**params, **parse_reference(
            reference)})]
        subject, twin = (_from_rows(r, bset, base, "", spread) if not r.empty else None for r in pair)
        if subject and twin and subject.value and twin.value:
            out.append(Expectation(
                metric, subject.value / twin.value, tolerance=max(subject.tolerance,
                twin.tolerance), better="higher" if metric == "speedup" else "lower",
                reference=reference, source=f"derived from {subject.source}",
                baseline=bset.path.name, row_ids=subject.row_ids + twin.row_ids))
    return out


def find_expectations(params: Mapping[str, Any], metric: str, profile_id: str | None, *,
                      reference: str = "", sets: list[BaselineSet] | None = None,
                      root: Path | str | None = None) -> list[Expectation]:
    """Every comparable expectation, best first (exact profile before same model,
    recorded before paper, table values before findings); when there is none,
    a single unavailable Expectation whose ``reason`` says why."""
    sets = load_all(root) if sets is None else sets
    ratio = metric in RATIO_METRICS
    out = [e for s in sorted(sets, key=lambda s: (not s.matches(profile_id),
                                                  s.kind != "recorded", s.path.name))
           if metric in PORTABLE_METRICS or (s.same_model(profile_id) if ratio
                                             else s.matches(profile_id))
           for e in _candidates(s, params, metric, reference, sets)]
    if out:
        return out
    elsewhere = [f"{s.path.name} ({s.hardware})" for s in sets
                 if _candidates(s, params, metric, reference, sets)]
    why = (f"rows for these parameters exist only in {', '.join(elsewhere)}, and {metric} needs "
           f"the same hardware {'model' if ratio else 'profile'}" if elsewhere
           else "no baseline row matches these parameters")
    return [Expectation(metric, reference=reference, reason=f"no comparable baseline for "
                        f"{metric}{' vs ' + reference if reference else ''} on profile "
                        f"{profile_id}: {why}")]


def find_expectation(params: Mapping[str, Any], metric: str, profile_id: str | None,
                     **options: Any) -> Expectation:
    """The best comparable expectation, or one that says why there is none."""
    return find_expectations(params, metric, profile_id, **options)[0]


def find_here(params: Mapping[str, Any], metric: str) -> Expectation:
    """The best expectation on this machine's hardware profile, from the
    baselines root; one that says why where there is none or they cannot be read."""
    try:
        sets = load_all()
    except BaselineError as err:
        return Expectation(metric, reason=f"no baselines read ({err})")
    return find_expectation(params, metric, hardware.profile_id(hardware.fingerprint()), sets=sets)


def find_time_per_token(params: Mapping[str, Any], profile_id: str | None, *,
                        sets: list[BaselineSet] | None = None,
                        root: Path | str | None = None) -> Expectation:
    """What an LLM cell's step-time verdict compares: its time per token.

    Recorded per-step samples (time_per_token rows) where there are; else a
    launch recorded before per-step token counts: its tokens/s row inverted,
    the launch's total step time over its total tokens (``samples`` empty).
    Never a raw step time: a step's time follows its batch's padded length.
    """
    sets = load_all(root) if sets is None else sets
    per_step = find_expectation(params, "time_per_token", profile_id, sets=sets)
    if per_step.available:
        return per_step
    rates = [e for e in find_expectations(params, "throughput", profile_id, sets=sets)
             if e.value and e.unit == "tokens/s"]
    if rates:
        rate = rates[0]
        return replace(rate, metric="time_per_token", value=1.0 / rate.value, better="lower",
                       unit="s/token", samples=(), launches=(),
                       source=f"{rate.source}, its tokens/s inverted (no per-step token counts)")
    raw = find_expectation(params, "step_time", profile_id, sets=sets)
    why = (f"{raw.baseline} holds raw step times only for these parameters, no tokens; a run "
           "recorded with perfsuite baseline record keeps them" if raw.available else per_step.reason)
    return Expectation("time_per_token", reason=f"LLM cells are judged per token (a step's time "
                       f"follows its batch's length): {why}")
