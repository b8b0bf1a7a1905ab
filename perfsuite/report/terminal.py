"""Plain-text views of cell results, for the terminal and pytest sections."""

from __future__ import annotations

from typing import Any

_UNITS = {"bytes": (2**20, "MiB"), "s": (1e-3, "ms"), "fraction": (0.01, "%")}


def _fmt(metric: dict[str, Any]) -> str:
    value = metric.get("value")
    if value is None:
        return "n/a"
    scale, unit = _UNITS.get(metric.get("unit", ""), (1, metric.get("unit", "")))
    return f"{value / scale:.4g} {unit}".strip()


def _step(metrics: dict[str, Any]) -> str:
    step = metrics.get("step_time")
    if not step or step.get("value") is None:
        return "step n/a"
    iqr = step.get("iqr")
    spread = f" iqr {iqr * 1e3:.3g}" if iqr is not None else ""
    return f"step {step['value'] * 1e3:.4g} ms{spread} (n={step.get('n', 0)})"


def summary_lines(results: list[dict[str, Any]]) -> list[str]:
    """One line per cell, then one per check that did not pass."""
    lines = []
    width = max((len(r["id"]) for r in results), default=0)
    for r in results:
        m = r.get("metrics", {})
        parts = [r["status"].upper()]
        if r["status"] == "ok":
            parts.append(_step(m))
            for name in ("throughput", "accuracy", "peak_mem_allocated", "peak_rss"):
                if name in m:
                    parts.append(f"{name} {_fmt(m[name])}")
        else:
            parts.append(str(r.get("reason")))
        lines.append(f"{r['id']:<{width}}  " + "  ".join(parts))
        for check in r.get("checks", []):
            if check["verdict"] not in ("pass", "same", "improved"):
                lines.append(f"{'':<{width}}    {check['verdict'].upper()} {check['name']}: "
                             f"{check.get('message') or check.get('observed')}")
    return lines


def skipped_lines(results: list[dict[str, Any]]) -> list[str]:
    """How many comparisons were not made, and why: a green run that judged
    nothing must not read like one that judged everything."""
    from collections import Counter

    why = Counter(c.get("message") or "no reason given" for r in results
                  for c in r.get("checks", []) if c["verdict"] == "skipped")
    cells = Counter(str(r.get("reason")) for r in results if r["status"] == "skipped")
    if not why and not cells:
        return []
    lines = []
    if cells:
        lines.append(f"{sum(cells.values())} cell(s) skipped:")
        lines += [f"    {n} x {reason}" for reason, n in cells.most_common()]
    if why:
        lines.append(f"{sum(why.values())} check(s) skipped, no comparison made:")
        lines += [f"    {n} x {reason}" for reason, n in why.most_common()]
    return lines


def cell_text(result: dict[str, Any]) -> str:
    lines = [f"cell {result['id']}: {result['status']}"
             + (f" ({result['reason']})" if result.get("reason") else "")]
    for name, metric in result.get("metrics", {}).items():
        lines.append(f"  {name:<20} {_fmt(metric)}")
    for check in result.get("checks", []):
        lines.append(f"  check {check['name']:<28} {check['verdict']:<9} observed "
                     f"{check.get('observed')} expected {check.get('expected')}")
    return "\n".join(lines)


def junit_properties(result: dict[str, Any]) -> list[tuple[str, Any]]:
    props = [("perf.id", result["id"]), ("perf.status", result["status"])]
    for name, metric in result.get("metrics", {}).items():
        props.append((f"perf.{name}", metric.get("value")))
        props.append((f"perf.{name}.unit", metric.get("unit")))
    for check in result.get("checks", []):
        props.append((f"perf.check.{check['name']}", check["verdict"]))
    return props


def probe_lines(probe: dict[str, Any] | None) -> list[str]:
    """The pre-flight probe: its figures, and whether the node is trusted."""
    if not probe or probe.get("status") == "skipped":
        return [f"pre-flight probe: skipped ({probe.get('reason')})"] if probe else []
    if probe.get("status") != "ok":
        return [f"pre-flight probe: {probe.get('status')}: {probe.get('reason')}"]
    assessment = probe.get("assessment", {})
    figures = ", ".join(f"{name} {_fmt(m)}" for name, m in probe.get("metrics", {}).items())
    state = "trusted" if assessment.get("trusted") else "NOT TRUSTED"
    lines = [f"pre-flight probe ({probe['id']}): {state}; {figures}"]
    lines += [f"    FLAG {flag}" for flag in assessment.get("flags", [])]
    lines += [f"    note: {note}" for note in assessment.get("notes", [])]
    return lines
