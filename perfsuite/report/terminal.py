"""Plain-text views of cell results, for the terminal and pytest sections."""

from __future__ import annotations

from typing import Any

from perfsuite.report.cellview import accuracy_meaningful

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
                if name == "accuracy" and not accuracy_meaningful(r):
                    continue  # a brief run's chance-level accuracy reads like a failure
                if name in m:
                    parts.append(f"{name} {_fmt(m[name])}")
            busy = r.get("gpu_busy_share")
            if isinstance(busy, (int, float)):  # GPU cells with a counting window
                parts.append(f"gpu busy {busy * 100:.0f} %")
        else:
            parts.append(str(r.get("reason")))
        lines.append(f"{r['id']:<{width}}  " + "  ".join(parts))
        lines += check_lines(r.get("checks", []), " " * (width + 4))
    return lines


def check_lines(checks: list[dict[str, Any]], indent: str) -> list[str]:
    """A line per check that did not pass; under a step-time check with a profile
    diff, its top 3 rows, after the work counters' line where they changed (the
    noise-free first answer: a step that does other work)."""
    from perfsuite.judge.baseline_profiles import attribution_text

    counted = next((k for k in checks if k.get("name") == "work_counters"
                    and k.get("verdict") in ("fail", "unknown")), None)
    lines, held, seen = [], [], counted is None
    for check in checks:
        if check["verdict"] not in ("pass", "same", "improved"):
            lines.append(f"{indent}{check['verdict'].upper()} {check['name']}: "
                         f"{check.get('message') or check.get('observed')}")
        seen = seen or check is counted
        if check.get("attribution"):
            held += attribution_text(check["attribution"], indent + "  ", counters_changed=counted is not None).splitlines()
        if seen:
            lines, held = lines + held, []
    return lines + held


def not_run_line(results: list[dict[str, Any]]) -> str | None:
    """"21 cell(s) not run: they need 2-4 GPUs, 1 present": the cells that
    need more GPUs than the machine has, once (they are no failure)."""
    short = [r for r in results if r["status"] == "skipped" and r.get("needs_gpus")]
    if not short:
        return None
    needs = sorted({r["needs_gpus"] for r in short})
    present = sorted({r.get("gpus_present", 0) for r in short})
    span = f"{needs[0]}" if len(needs) == 1 else f"{needs[0]}-{needs[-1]}"
    return (f"{len(short)} cell(s) not run: they need {span} GPUs, "
            f"{'/'.join(map(str, present))} present")


def recorded_line(results: list[dict[str, Any]]) -> str | None:
    """"first baselines of this runner: 9 cell(s) recorded into DIR, judged from the next run"."""
    folders = {c["recorded"]: None for r in results for c in r.get("checks", []) if c.get("recorded")}
    cells = [r for r in results if any(c.get("recorded") for c in r.get("checks", []))]
    if not cells:
        return None
    return (f"this runner's new baselines: {len(cells)} cell(s) had none to be judged against and were "
            f"recorded into {', '.join(folders)}; the next run judges them")


def skipped_lines(results: list[dict[str, Any]]) -> list[str]:
    """How many comparisons were not made, and why: a green run that judged
    nothing must not read like one that judged everything."""
    from collections import Counter

    why = Counter(c.get("message") or "no reason given" for r in results
                  for c in r.get("checks", []) if c["verdict"] == "skipped" and not c.get("recorded"))
    cells = Counter(str(r.get("reason")) for r in results
                    if r["status"] == "skipped" and not r.get("needs_gpus"))
    lines = [line for line in (not_run_line(results), recorded_line(results)) if line]
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
        if name == "accuracy" and not accuracy_meaningful(result):
            lines.append(f"  {name:<20} {_fmt(metric)} (no accuracy target: chance level, not judged)")
            continue
        lines.append(f"  {name:<20} {_fmt(metric)}")
    for check in result.get("checks", []):
        lines.append(f"  check {check['name']:<28} {check['verdict']:<9} observed "
                     f"{check.get('observed')} expected {check.get('expected')}")
    return "\n".join(lines)


CHECK_FIELDS = ("observed", "expected", "ratio", "ci_low", "ci_high", "confidence", "tolerance",
                "unit", "baseline")


def junit_properties(result: dict[str, Any]) -> list[tuple[str, Any]]:
    """(name, value) pairs for JUnit XML: the cell's metrics, and per check its
    verdict with what decided it (ratio to the baseline, its interval, the
    baseline it came from). Empty values are left out."""
    props = [("perf.id", result["id"]), ("perf.status", result["status"])]
    if result.get("reason"):
        props.append(("perf.reason", result["reason"]))
    for name, metric in result.get("metrics", {}).items():
        if name == "accuracy" and not accuracy_meaningful(result):
            continue
        props.append((f"perf.{name}", metric.get("value")))
        props.append((f"perf.{name}.unit", metric.get("unit")))
    for check in result.get("checks", []):
        props.append((f"perf.check.{check['name']}", check["verdict"]))
        props += [(f"perf.check.{check['name']}.{field}", check.get(field)) for field in CHECK_FIELDS]
    return [(name, value) for name, value in props if value is not None and value != ""]


def junit_suite_properties(result: dict[str, Any]) -> list[tuple[str, Any]]:
    """The same, for ``<testsuite>`` properties (the only place xunit2 allows
    them; pytest's record_testsuite_property): each name carries the cell id,
    "perf[<cell id>].step_time", as the suite holds every cell's."""
    cell = result["id"]
    return [(f"perf[{cell}]{name.removeprefix('perf')}", value)
            for name, value in junit_properties(result)]


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
