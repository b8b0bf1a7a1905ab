"""A run's checks as the report page shows them: observed against expected,
the ratio with its interval, its place on the forest strip; and what needs
attention first (what failed, what could not decide, what was not judged).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

from perfsuite.report import cellview as cv
from perfsuite.report.formatting import fmt, quantity, sort_key
from perfsuite.report.terminal import not_run_line, recorded_line

GOOD, BAD = ("pass", "same", "improved"), ("fail", "regressed")
# The forest plot of a check against its baseline: ratios from 1/RANGE to RANGE.
FOREST_RANGE = 3.0


def _interval(check: Mapping[str, Any]) -> str:
    ratio, low, high = (cv.number(check.get(k)) for k in ("ratio", "ci_low", "ci_high"))
    confidence = cv.number(check.get("confidence"))
    interval = f" [{fmt(low)}, {fmt(high)}]" if low is not None and high is not None else ""
    level = f" {confidence:.0%} CI" if interval and confidence else ""
    return f"{fmt(ratio)}{interval}{level}" if ratio is not None or interval else "–"


def _ratio_short(check: Mapping[str, Any]) -> str:
    """"1.13x [0.83-1.55]": a ratio and its interval in a narrow column."""
    ratio, low, high = (cv.number(check.get(k)) for k in ("ratio", "ci_low", "ci_high"))
    if ratio is None:
        return "–"
    interval = f" [{low:.3g}–{high:.3g}]" if low is not None and high is not None else ""
    return f"{ratio:.3g}×{interval}"


def _expected(check: Mapping[str, Any], unit: str) -> str:
    expected = check.get("expected")
    tolerance = cv.number(check.get("tolerance"))
    text = quantity(expected, unit) if cv.number(expected) is not None else fmt(expected)
    if tolerance and expected is not None:
        text += f" ±{tolerance:.0%}"
    return text


def _forest(check: Mapping[str, Any]) -> dict[str, Any] | None:
    """Positions (percent of the strip) of a ratio, its interval and the
    tolerance band on a log scale from 1/FOREST_RANGE to FOREST_RANGE."""
    ratio = cv.number(check.get("ratio"))
    if ratio is None or ratio <= 0:
        return None
    span = math.log(FOREST_RANGE)

    def at(value: float | None) -> float | None:
        if value is None or value <= 0 or math.isinf(value):
            return None
        return round(50 + 50 * max(-1.0, min(1.0, math.log(value) / span)), 2)

    low, high = cv.number(check.get("ci_low")), cv.number(check.get("ci_high"))
    tolerance = cv.number(check.get("tolerance")) or 0.0
    band_low = at(max(1 - tolerance, 1 / FOREST_RANGE)) if tolerance < 1 else 0.0
    band_high = at(min(1 + tolerance, FOREST_RANGE))
    lo = at(low) if low is not None else None
    hi = at(high) if high is not None else (100.0 if high is None and low is not None else None)
    return {"at": at(ratio), "low": lo, "high": hi,
            "band_low": band_low or 0.0, "band_high": band_high or 100.0,
            "clipped": ratio < 1 / FOREST_RANGE or ratio > FOREST_RANGE}


def _unit(check: Mapping[str, Any], cell: Mapping[str, Any]) -> str:
    """The check's unit, else that of the cell metric it checks ("sanity.peak_rss"
    checks peak_rss, in bytes)."""
    if check.get("unit"):
        return str(check["unit"])
    name = str(check.get("metric") or check.get("name") or "").removeprefix("sanity.")
    return cv.unit(cell, name)


def check_row(check: Mapping[str, Any], cell: Mapping[str, Any]) -> dict[str, Any]:
    unit = _unit(check, cell)
    return {
        "cell": check.get("cell") or cell.get("id"), "name": check.get("name"),
        "metric": check.get("metric"), "verdict": str(check.get("verdict")),
        "expected": _expected(check, unit), "baseline": check.get("baseline") or "",
        "observed": quantity(check.get("observed"), unit),
        "observed_sort": sort_key(check.get("observed")),
        "ratio": _interval(check), "ratio_sort": sort_key(check.get("ratio")),
        "ratio_short": _ratio_short(check),
        "message": check.get("message") or "", "forest": _forest(check),
        "attribution": attribution_view(check, cell),
    }


ATTRIBUTION_ROWS = 10  # of a step-time check's profile diff, on the cell's page


def attribution_view(check: Mapping[str, Any], cell: Mapping[str, Any]) -> dict[str, Any] | None:
    """A step-time check's profile diff against its baseline's (its ``attribution``) as the
    page shows it: the change, the largest rows, the explained shares; ``counters_first``
    where the cell's work counters changed (they answer first: a step does other work)."""
    from perfsuite.profiling.attribution import Attribution

    record = check.get("attribution")
    if not isinstance(record, Mapping):
        return None
    diff = Attribution.from_dict(record)
    tags = {"appeared": " (appeared)", "vanished": " (vanished)", "capped": " (at least: under a cap on rows)"}
    rows = [{"level": r.level, "name": r.name + tags.get(r.status, ""), "a_ms": r.a_s * 1e3,
             "b_ms": r.b_s * 1e3, "delta_ms": r.delta_s * 1e3,
             "share": None if r.share is None else 100 * r.share, "calls": f"{r.a_calls:g} → {r.b_calls:g}"}
            for r in diff.top[:ATTRIBUTION_ROWS]]
    head = (f"measured change {fmt(diff.change_s * 1e3)} ms a step; profiled steps {fmt(diff.a_step_s * 1e3)} ms "
            f"(baseline) → {fmt(diff.b_step_s * 1e3)} ms (this run); rows within the diff's noise "
            f"({fmt(diff.noise_s * 1e3)} ms a step) are not listed")
    explained = ", ".join(f"{name} {100 * level.explained:.0f} %" for name, level in diff.levels.items()
                          if level.explained is not None)
    counted = any(k.get("name") == "work_counters" and k.get("verdict") in ("fail", "unknown")
                  for k in cell.get("checks") or [])
    return {"head": head, "rows": rows, "explained": explained, "counters_first": counted}


def against_baseline(cell: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The cell's checks that compared it with a baseline value (a ratio
    observed / expected with an interval): what changed, and how surely."""
    return [check_row(k, cell) for k in cell.get("checks") or []
            if cv.number(k.get("ratio")) is not None and k.get("expected") is not None]


def attention(cells: list[dict]) -> dict[str, Any]:
    """Checks that did not pass, first, so a failing run is read from the top;
    and what was not judged at all, so a green run that compared nothing does
    not read like one that compared everything."""
    picked = [check_row(k, c) for c in cells for k in c.get("checks") or []
              if k.get("verdict") in (*BAD, "unknown")]
    broken = [{"id": c.get("id"), "status": str(c.get("status")), "reason": c.get("reason")}
              for c in cells if c.get("status") not in ("ok", "skipped")]
    checks = [k for c in cells for k in c.get("checks") or []]
    # recorded: skipped for want of a baseline the run then recorded (a runner's first run)
    recorded = [k for k in checks if k.get("recorded")]
    skipped = [k for k in checks if k.get("verdict") == "skipped" and not k.get("recorded")]
    judged = [k for k in checks if k.get("verdict") not in ("skipped", None)]
    step_checks = [k for k in checks if k.get("name") == "step_time"]
    step_skipped = [k for k in step_checks if k.get("verdict") == "skipped" and not k.get("recorded")]
    not_run = not_run_line(cells)
    notes = [line + "." for line in (not_run, recorded_line(cells)) if line]
    ran = "Every cell that could run here ran" if not_run else "Every cell ran"
    if step_checks and step_skipped and len(step_skipped) == len(step_checks):
        why = Counter(str(k.get("message") or "no reason given") for k in step_skipped)
        notes.append(f"No step time was compared with a baseline: all {len(step_checks)} "
                     "step_time check(s) were skipped ("
                     + "; ".join(f"{n} x {reason}" for reason, n in why.most_common(3)) + ").")
    if skipped:
        names = Counter(str(k.get("name")) for k in skipped)
        notes.append(f"{len(skipped)} comparison(s) could not be made (skipped, see each cell "
                     "for why): nothing was judged there ("
                     + ", ".join(f"{n} {name}" for name, n in names.most_common(6))
                     + (", ..." if len(names) > 6 else "") + ").")
    if broken or any(k["verdict"] in BAD for k in picked):
        headline, level = "Something failed or regressed: see below.", "bad"
    elif picked:
        headline, level = ("No check failed or regressed, but some could not decide "
                           "(unknown): measure more.", "warn")
    elif recorded:
        headline, level = (f"{ran}; {len(recorded)} comparison(s) had no baseline on this runner and "
                           "were recorded as its own: the next run judges them.", "warn")
    elif not judged:
        headline, level = "Nothing was judged: no check made a comparison.", "warn"
    elif step_checks and len(step_skipped) == len(step_checks):
        headline, level = (f"{ran} and none of the {len(judged)} judged check(s) failed, "
                           "but step times were not judged.", "warn")
    elif skipped:
        headline, level = (f"{ran} and none of the {len(judged)} judged check(s) "
                           f"failed or regressed; {len(skipped)} could not be made.", "warn")
    else:
        headline, level = (f"{ran} and none of the {len(judged)} check(s) failed or "
                           "regressed.", "ok")
    return {"headline": headline, "level": level, "notes": notes, "broken": broken,
            "checks": picked}


