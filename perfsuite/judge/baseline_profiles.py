"""Profile summaries kept with a baseline, and the diff a step-time check gets from them.

``perfsuite baseline record`` of a run that profiled a cell (``--profiler
torch``) keeps the cell's profile summary beside its samples, in the
folder's ``profiles.json``, keyed by cell id: per-name totals, not a trace,
and only what the attribution diff reads (its levels' categories, the
ROWS_KEPT largest rows of each; the largest row left out stays as
``meta["capped"]``, so that a row only the run has is diffed against at most
that). A step-time check that regressed or could not decide, of a cell whose
baseline has one, in a run that profiled the cell, carries the diff
(``perfsuite.profiling.attribution``) as ``attribution``; where the run did
not profile the cell, its message says how to get it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from perfsuite.profiling.attribution import LEVEL_OF, Attribution, attribute, format_attribution
from perfsuite.profiling.summary import SCHEMA, ProfileSummary
from perfsuite.schemas.results import json_safe

PROFILES_FILE = "profiles.json"
PROFILES_FORMAT = "perfsuite.baseline-profiles/1"
# Rows kept per category, largest first: MobileNetV2 on 2 CPU ranks has 264
# module rows (forward and backward of every module), of which the first 100
# hold all but ~3 % of the module time; a Llama3 cell has thousands.
ROWS_KEPT = 100
ATTRIBUTED = frozenset({"regressed", "unknown"})  # the step-time verdicts that get the diff
STEP_METRICS = ("step_time", "time_per_token")
HOW = ("profile this cell to see where the time went against the baseline's profile: --profiler torch "
       "(perfsuite run) or --perf-profiler torch (pytest)")


def _row(row: Any) -> dict[str, Any]:
    out = row.to_dict()
    del out["avg_s"], out["share"]  # derived: read back from total_s and calls
    return out


def compact(profile: Mapping[str, Any]) -> dict[str, Any]:
    """A cell's profile summary as a baseline keeps it (see the module doc); per rank
    only its steps and step times, the diff's noise."""
    summary = ProfileSummary.from_dict(profile)
    rows, capped = [], {}
    for category in dict.fromkeys(LEVEL_OF):
        ranked = summary.top(len(summary.rows), category)
        rows += [_row(r) for r in ranked[:ROWS_KEPT]]
        if len(ranked) > ROWS_KEPT:
            capped[category] = ranked[ROWS_KEPT].total_s
    meta = {k: summary.meta[k] for k in ("world_size", "step_times_s") if k in summary.meta}
    ranks = [{"schema": SCHEMA, "source": part.source, "rank": part.rank, "steps": part.steps,
              "meta": {"step_times_s": list(part.meta.get("step_times_s") or [])}, "rows": []}
             for part in summary.ranks]
    return json_safe({"schema": SCHEMA, "source": summary.source, "rank": None, "steps": summary.steps,
                      "window_s": summary.window_s, "rows": rows, "ranks": ranks,
                      "meta": {**meta, "rows_kept": ROWS_KEPT, **({"capped": capped} if capped else {})}})


def profile_entries(cells: Iterable[Mapping[str, Any]], recorded: set[str], date: str) -> dict[str, dict]:
    """profiles.json entries: each cell whose step time is recorded now (``recorded``) and that was profiled."""
    return {c["id"]: {"recorded_at": date, "summary": compact(c["profile"])} for c in cells
            if c.get("id") in recorded and isinstance(c.get("profile"), Mapping) and c["profile"].get("rows")}


def merged_profiles(old: Mapping[str, dict], new: Mapping[str, dict], recorded: set[str]) -> dict[str, dict]:
    """The folder's entries after a record: a cell whose step time was recorded again keeps only
    this run's profile (none where this run did not profile it: an old one would judge new samples)."""
    return dict(sorted({**{k: v for k, v in old.items() if k not in recorded}, **new}.items()))


def profiles_text(entries: Mapping[str, dict]) -> str:
    """profiles.json: a line per cell, so that a re-recorded cell is one changed line."""
    body = ",\n".join(f"{json.dumps(k)}: {json.dumps(v, sort_keys=True, allow_nan=False)}"
                      for k, v in entries.items())
    return f'{{"format": "{PROFILES_FORMAT}", "rows_kept": {ROWS_KEPT}, "profiles": {{\n{body}\n}}}}\n'


def _entry_problem(entry: Any) -> str | None:
    """Why an entry cannot be diffed against (None: it can)."""
    try:
        summary = ProfileSummary.from_dict(entry["summary"])
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        return f"{type(err).__name__} {err}"
    if not summary.rows:
        return "its summary has no rows"
    if bad := [r.name for r in summary.rows if not (math.isfinite(r.total_s) and r.total_s >= 0)]:
        return f"row {bad[0]!r}: total_s is not a time of 0 s or more"
    capped = summary.meta.get("capped") or {}
    if not isinstance(capped, dict) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                               and math.isfinite(v) and v >= 0 for v in capped.values()):
        return f"meta.capped is {capped!r}, not {{category: seconds}}"
    return None


def parse_profiles(data: Any, file: Path, error: type[Exception] = ValueError) -> dict[str, dict]:
    """profiles.json's entries, checked; a refusal (``error``: the caller's
    BaselineError) names ``file`` and the cell."""
    entries = data.get("profiles") if isinstance(data, dict) else None
    if not isinstance(data, dict) or data.get("format") != PROFILES_FORMAT or not isinstance(entries, dict):
        raise error(f"{file}: write {{\"format\": \"{PROFILES_FORMAT}\", \"profiles\": {{\"<cell id>\": "
                    "{\"summary\": <profile summary>}}}, or delete it and record the cells again")
    for cell, entry in entries.items():
        if problem := _entry_problem(entry):
            raise error(f"{file}: cell {cell!r}: {problem}; every entry is {{\"summary\": <a profile summary "
                        "with rows>}}: remove the entry, or record the cell again from a run that profiled it")
    return dict(entries)


def attribute_check(record: dict[str, Any], result: Mapping[str, Any], baseline: Mapping[str, Any] | None) -> None:
    """A step-time check's record (``Verdict.to_dict``) that regressed or could not decide,
    against a baseline with a profile summary (``baseline``): the diff of the run's
    profile against it as ``attribution``, or, where the run has none, how to get one."""
    if record.get("verdict") not in ATTRIBUTED or not baseline:
        return
    profile = result.get("profile")
    said = record.get("message") or ""
    if not isinstance(profile, Mapping) or not profile.get("rows"):
        record["message"] = f"{said}; {HOW}"
        return
    if profile.get("source") != baseline.get("source"):
        record["message"] = (f"{said}; the run's profile is from {profile.get('source')}, the baseline's from "
                             f"{baseline.get('source')}: profile with {baseline.get('source')} to diff them")
        return
    observed, expected = record.get("observed"), record.get("expected")
    numbers = all(isinstance(x, (int, float)) and math.isfinite(x) for x in (observed, expected))
    change = observed - expected if record.get("metric") == "step_time" and numbers else None
    try:  # an LLM cell's verdict is per token: the diff takes its profiled steps' change
        diff = attribute(baseline, profile, change_s=change or None)
    except (KeyError, TypeError, ValueError) as err:
        record["message"] = f"{said}; its profile could not be diffed against the baseline's ({err})"
        return
    record["attribution"] = json_safe(diff.to_dict())


def attribution_text(record: Mapping[str, Any], indent: str = "    ", top: int = 3,
                     counters_changed: bool = False) -> str:
    """A check's ``attribution`` for the terminal: a headline, then its top rows."""
    first = ("the work counters changed (work_counters: a step does other work); where its time went"
             if counters_changed else "where the time went")
    return (f"{indent}{first}, against the baseline's profile:\n"
            + format_attribution(Attribution.from_dict(record), top=top, indent=indent + "  "))
