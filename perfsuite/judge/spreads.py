"""Between-launch spreads, kept per launch kind.

How much identical launches of a cell scatter depends on what bounds them:
one H100's pinned image cell's launch medians scattered 0.08 %, one H200's
pageable ones 3.8 %, and two launches of one LLM configuration ran 18 %
apart. So a baseline folder keeps the spread of each kind of launch it saw
repeated, and a cell is judged only with its own kind's: a kind never
measured there gives none (one launch against one is then ``unknown``),
never another kind's, which could be far narrower than its own.

A launch kind is the workload and, on a GPU, whether its batches cross from
pinned or pageable host memory (``launch_kind``). profile.json's
``launch_spread`` is ``{kind: {statistic: {"log_sd": s, "dof": n}}}``; the
kind ``*`` stands for every kind without its own, which is what a folder
written before kinds holds (``{statistic: {...}}`` reads as ``{"*": ...}``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from perfsuite.stats import launches as launchstats

ANY_KIND = "*"
Spreads = dict[str, dict[str, launchstats.LaunchSpread]]  # kind -> statistic -> spread


def launch_kind(params: Mapping[str, Any]) -> str:
    """``image``, ``llm`` (on a CPU), ``image/pinned``, ``llm/pageable`` (on a GPU)."""
    workload = str(params.get("workload") or "")
    if str(params.get("device") or "cpu") != "cuda":
        return workload
    pinned = str(params.get("pin_memory")).strip().lower() == "true"  # a bool, or a row's "true"
    return f"{workload}/{'pinned' if pinned else 'pageable'}"


def _entry(statistic: str, entry: Any, statistics: tuple[str, ...]) -> launchstats.LaunchSpread:
    try:
        spread = launchstats.LaunchSpread(float(entry["log_sd"]), int(entry["dof"]))
    except (KeyError, TypeError, ValueError):
        spread = None
    if (statistic not in statistics or spread is None or spread.dof < 1
            or not math.isfinite(spread.log_sd) or spread.log_sd < 0):
        raise ValueError(f"'launch_spread' entry {statistic!r}: write {{\"log_sd\": <s.d. of log launch "
                         f"values>, \"dof\": <n>}} under a statistic among {statistics} (per launch "
                         "kind: {\"image/pageable\": {\"floor\": {...}}})")
    return spread


def parse_spreads(data: Any, statistics: tuple[str, ...]) -> Spreads:
    """profile.json's ``launch_spread``, per kind (ValueError names a bad entry)."""
    data = data or {}
    if data and all(key in statistics for key in data):  # written before kinds: every kind's
        data = {ANY_KIND: data}
    out: Spreads = {}
    for kind, entries in data.items():
        if not isinstance(entries, Mapping):
            raise ValueError(f"'launch_spread' entry {kind!r}: write {{statistic: {{\"log_sd\": ..., "
                             "\"dof\": ...}}} under each launch kind")
        out[str(kind)] = {statistic: _entry(statistic, entry, statistics)
                          for statistic, entry in entries.items()}
    return out


def spread_for(spreads: Spreads, params: Mapping[str, Any],
               statistic: str) -> launchstats.LaunchSpread | None:
    """The spread that judges a cell with ``params`` by launch ``statistic``s, if any."""
    own = spreads.get(launch_kind(params))
    return (own if own is not None else spreads.get(ANY_KIND, {})).get(statistic)


def spreads_json(spreads: Spreads) -> dict[str, dict[str, dict[str, float | int]]]:
    return {kind: {statistic: {"log_sd": round(s.log_sd, 5), "dof": s.dof} for statistic, s in entries.items()}
            for kind, entries in sorted(spreads.items())}
