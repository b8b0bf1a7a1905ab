"""Every check that applies to one measured cell, as entries of its "checks" list.

Sanity checks make sure a measurement is a measurement (finite, positive,
the same steps on every rank); the accuracy target comes from the cell's
experiment data.
"""

from __future__ import annotations

import math
from typing import Any

from perfsuite.cells import EXPERIMENTS_DIR, Cell, findings
from perfsuite.hardware import profile_id
from perfsuite.schemas.records import CellResult, CheckRecord

# The baseline checks (perfsuite.judge.applicable, .checks: pandas, scipy) are
# imported in baseline_checks: the runner imports this module, and `perfsuite
# doctor` and the self-tests import the runner without judging a cell.

PASS, FAIL = "pass", "fail"


def _check(name: str, ok: bool, observed: Any, expected: str, message: str = "") -> dict:
    return {"name": name, "verdict": PASS if ok else FAIL, "observed": observed,
            "expected": expected, "message": message}


def _finite_positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def sanity_checks(cell: Cell, result: CellResult) -> list[CheckRecord]:
    metrics = result.get("metrics", {})
    step = metrics.get("step_time", {})
    samples = step.get("samples") or []
    checks = [
        _check("sanity.step_time_samples", len(samples) > 0 and all(map(_finite_positive, samples)),
               len(samples), "> 0 finite positive samples",
               "every measured step must have a positive, finite duration"),
        _check("sanity.throughput", _finite_positive(metrics.get("throughput", {}).get("value")),
               metrics.get("throughput", {}).get("value"), "> 0"),
    ]
    loss = metrics.get("loss", {})
    if loss:
        curve = loss.get("samples") or [loss.get("value")]
        checks.append(_check("sanity.loss_finite",
                             all(isinstance(v, float) and math.isfinite(v) for v in curve),
                             loss.get("value"), "finite at every step"))
    memory = [k for k in ("peak_mem_allocated", "peak_rss") if k in metrics]
    for key in memory:
        checks.append(_check(f"sanity.{key}", _finite_positive(metrics[key]["value"]),
                             metrics[key]["value"], "> 0 bytes"))
    if "accuracy" in metrics:
        acc = metrics["accuracy"]["value"]
        checks.append(_check("sanity.accuracy_range", isinstance(acc, float) and 0 <= acc <= 1,
                             acc, "within [0, 1]"))
    if cell.device == "cuda" and cell.workload == "image":
        moved = metrics.get("h2d_bytes", {}).get("value")
        checks.append(_check("sanity.h2d_bytes", _finite_positive(moved), moved,
                             "> 0: every batch crosses to the GPU"))
        # A GPU cell whose steps wait on the DataLoader measures the loader; the limit is data.
        limits = _image_limits()
        share = (result.get("info") or {}).get("loader_wait_share")
        limit = limits.get("max_loader_wait_share")
        if (share is not None and limit is not None
                and cell.strategy not in limits.get("loader_wait_exempt_strategies", ())):
            checks.append(_check(
                "sanity.loader_wait_share", share <= limit, share, f"<= {limit} (image.toml [limits])",
                "" if share <= limit else f"rank 0 waited for its DataLoader {share:.0%} of a median "
                "step: the cell measures the loader, not the GPU; give it more loader_workers or cores"))
        if cell.strategy not in limits.get("gpu_busy_exempt_strategies", ()):
            checks.append(gpu_busy_check(result, limits.get("min_gpu_busy_share")))
    profiler = result.get("profiler", {}).get("mode", "off")
    if profiler != "off":
        rows = (result.get("profile") or {}).get("rows", [])
        checks.append(_check("sanity.profile_rows", len(rows) > 0, len(rows),
                             f"> 0 rows from {profiler}", result["profiler"].get("error", "")))
        if cell.processes > 1:
            comm = [r for r in rows if r["category"] == "collective" or "nccl" in r["name"].lower()]
            checks.append(_check("sanity.profile_collectives", len(comm) > 0, len(comm),
                                 "> 0 collective rows: ranks exchange gradients"))
    return checks


def _image_limits() -> dict[str, Any]:
    import tomllib

    return tomllib.loads((EXPERIMENTS_DIR / "image.toml").read_text()).get("limits", {})


# What keeps a GPU waiting, by what the check's message calls it and what to try.
_BOUNDS = {"loader": ("the loader", "give it more loader_workers or cores"),
           "copies": ("host-to-device copies", "pin_memory, or fewer bytes a step"),
           "host": ("the host", "a larger batch or image per GPU, or fewer kernel launches "
                                "and syncs a step")}


def gpu_busy_check(result: dict[str, Any], limit: float | None) -> dict[str, Any]:
    """"sanity.gpu_busy_share": the least busy GPU kept busy at least ``limit``
    of a median step, else the cell measures what kept it waiting, named by
    the largest part of the step: rank 0's wait in next(loader) (info
    ``loader_wait_share``), that rank's host-to-device copies, or the rest of
    the GPU's idle time (the host: Python, kernel launches, syncs). Busy is
    unknown without a counting window: a skipped check, not a failure."""
    name, expected = "sanity.gpu_busy_share", f">= {limit} (image.toml [limits])"
    busy = result.get("gpu_busy_share")
    if busy is None or limit is None:
        why = ("its counting window measured no GPU time (a perfsuite from before device_time)"
               if (result.get("counters") or {}).get("per_step") else "the cell ran no counting "
               "window (count_steps=0), where the GPU's time per step is measured")
        return {**_check(name, True, None, expected, f"GPU busy share unknown: {why}; not judged"),
                "verdict": "skipped"}
    if busy >= limit:
        return _check(name, True, busy, expected)
    ranks = [r for r in result.get("ranks") or [] if isinstance(r.get("gpu_busy_share"), (int, float))]
    rank = min(ranks, key=lambda r: r["gpu_busy_share"]) if ranks else {}  # repeats: the first launch's
    loader = (result.get("info") or {}).get("loader_wait_share") or 0.0
    parts = {"loader": loader, "copies": rank.get("h2d_copy_share") or 0.0,
             "host": max(1.0 - busy - loader, 0.0)}
    bound = max(parts, key=parts.get)
    what, fix = _BOUNDS[bound]
    return _check(name, False, busy, expected,
                  f"rank {rank.get('rank', '?')}'s GPU was busy {busy:.0%} of a median step: bound "
                  f"by {what}, so the cell measures it more than the GPU (of the step: loader "
                  f"{parts['loader']:.0%}, copies {parts['copies']:.0%}, host {parts['host']:.0%}); "
                  f"try {fix}")


def _loss_falls(curve: list[float]) -> tuple[bool, str]:
    """The last third of the loss curve below the first third, on average."""
    third = max(len(curve) // 3, 1)
    first, last = sum(curve[:third]) / third, sum(curve[-third:]) / third
    return last < first, f"mean loss {first:.4g} over the first {third} steps, {last:.4g} over the last {third}"


def target_checks(cell: Cell, result: CellResult) -> list[CheckRecord]:
    out = []
    curve = result.get("metrics", {}).get("loss", {}).get("samples") or []
    if cell.workload == "llm" and cell.tier == "smoke" and len(curve) >= 3:
        ok, how = _loss_falls(curve)
        out.append(_check("loss.decreases", ok, curve[-1], "last third below the first", how))
    if cell.min_accuracy > 0:
        acc = result.get("metrics", {}).get("accuracy", {}).get("value")
        ok = isinstance(acc, float) and acc >= cell.min_accuracy
        out.append(_check("accuracy.at_least", ok, acc, f">= {cell.min_accuracy}",
                          f"test accuracy {acc} vs target {cell.min_accuracy} "
                          f"(experiment data of {', '.join(cell.sources)})"))
    return out


UNTRUSTWORTHY = "untrustworthy"


def baseline_checks(cell: Cell, result: CellResult, twin_of, sets: list) -> list[CheckRecord]:
    """Checks against stored baselines; cross-cell ones get their twin's result; a step-time
    check that regressed or could not decide, the diff of the cell's profile against its
    baseline's (perfsuite.judge.baseline_profiles)."""
    from perfsuite.judge.applicable import checks_for
    from perfsuite.judge.baseline_profiles import attribute_check
    from perfsuite.judge.checks import FindingRatio, StepTimeNotRegressed

    profile = profile_id(result.get("env") or {}) if result.get("env") else None
    out = []
    # A profiled cell's steps carry the profiler's cost: no ratio with other cells.
    found = [FindingRatio(f) for f in findings() if not cell.profile and f.applies(cell.params())]
    for check in checks_for(cell.params(), profile, sets=sets, cross_cell=not cell.profile,
                            env=result.get("env") or {}) + found:
        twin = None
        if hasattr(check, "twin_params"):
            twin = twin_of(check.twin_params(cell.params()))
        out.append(check.evaluate(result, twin).to_dict())
        if isinstance(check, StepTimeNotRegressed) and check.expectation is not None:
            attribute_check(out[-1], result, check.expectation.profile)
    return out


def distrust(checks: list[CheckRecord], assessment: dict[str, Any]) -> list[CheckRecord]:
    """On a node the pre-flight probe flagged, a regression is not believed."""
    if assessment.get("trusted", True):
        return checks
    why = "; ".join(assessment.get("flags", [])) or "pre-flight probe flagged this node"
    for check in checks:
        if check["verdict"] in ("regressed", "improved", "fail") and not check["name"].startswith("sanity."):
            check["measured_verdict"] = check["verdict"]
            check["verdict"] = UNTRUSTWORTHY
            check["message"] = f"{check.get('message', '')} [untrustworthy node: {why}]"
    return checks


def judge(cell: Cell, result: CellResult, twin_of=None, sets: list | None = None,
          assessment: dict[str, Any] | None = None) -> list[CheckRecord]:
    """Every check of a measured cell, as entries of its "checks" list."""
    if result.get("status") != "ok":
        return []
    checks = sanity_checks(cell, result) + target_checks(cell, result)
    if sets is not None and cell.workload != "probe":
        checks += baseline_checks(cell, result, twin_of or (lambda params: None), sets)
    return distrust(checks, assessment or {})


def needs_more_launches(checks: list[CheckRecord]) -> bool:
    """A step-time comparison the launches could not decide: launch more."""
    return any(c["verdict"] == "unknown" and c.get("name") == "step_time" for c in checks)


def unjudged(result: CellResult) -> list[str]:
    """What a run that must judge (--fail-on-skipped) counts against this
    cell: a skipped cell, and each comparison that could not be made. Not
    a cell that needs more GPUs than the machine has (not runnable here, and
    listed as such), nor a comparison whose missing baseline the run has just
    recorded as its runner's first (the next run judges it)."""
    if result.get("status") == "skipped":
        return [] if result.get("needs_gpus") else [f"cell skipped: {result.get('reason')}"]
    return [f"{c['name']}: {c.get('message')}" for c in result.get("checks", [])
            if c["verdict"] == "skipped" and not c.get("recorded")]


def none_could_run(results: list[CellResult]) -> str | None:
    """Why a run that must judge (--fail-on-skipped) judged nothing because
    no cell of it could run on this machine (each needs more GPUs), else None."""
    own = [r for r in results if not r.get("partner")]
    if not own or not all(r.get("needs_gpus") for r in own):
        return None
    return (f"no cell could run here: all {len(own)} need more GPUs than the "
            f"{own[0].get('gpus_present', 0)} present")


def failures(result: CellResult) -> list[CheckRecord]:
    return [c for c in result.get("checks", []) if c["verdict"] in (FAIL, "regressed")]


def explain(result: dict[str, Any]) -> str:
    """The failed checks of a result, one line each: metric, observed, expected, why; under a
    step-time check with a profile diff, its top rows (after the work counters where they changed)."""
    from perfsuite.judge.baseline_profiles import attribution_text

    failed = failures(result)
    counted = any(c["name"] == "work_counters" for c in failed)
    lines = [f"{c['name']}: {c['verdict']}: observed {c['observed']}, expected "
             f"{c['expected']}. {c.get('message', '')}" for c in failed]
    return "\n".join(lines + [attribution_text(c["attribution"], "  ", counters_changed=counted)
                              for c in failed if c.get("attribution")])
