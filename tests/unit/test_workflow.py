"""The example GPU workflow (.github/workflows/perfsuite-gpu.yml) against the
experiment data: the full tier's shards, the concurrency groups, the guard
that keeps fork code off the self-hosted runner.

The full tier's cells carry timeouts of 10-12 h each (1144 h summed; ~78 h
at the papers' speeds), far beyond one 72 h job. So the workflow runs it as a
matrix of shards, one at a time, each a pytest session over its own cells
(``--perf-tier full -k "[id] or ..."``) into one output directory on the
runner with ``--perf-resume``: a cross-cell check's twin measured by an
earlier shard is reused, not measured again. Hence the two rules checked
here: a shard's cells' timeouts fit its job's limit, and every twin a cell's
checks may ask for sits in the same or an earlier shard (else a shard would
measure it on top of its own cells). ``python -m tests.unit.test_workflow``
prints a plan that keeps both, for the matrix when the experiments change.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

from perfsuite import cells
from perfsuite.cells import Cell

WORKFLOW = Path(__file__).resolve().parents[2] / ".github" / "workflows" / "perfsuite-gpu.yml"
SETUP_S = 3600  # checkout, venv, pre-flight probe, reports: kept out of the cells' budget


@cache
def workflow() -> dict:
    yaml = pytest.importorskip("yaml")  # PyYAML: installed with torchtune (omegaconf, datasets)
    return yaml.safe_load(WORKFLOW.read_text())


def triggers() -> dict:
    data = workflow()
    return data.get("on", data.get(True))  # YAML 1.1 reads a bare `on` as true


def evaluate(text: str, **context) -> object:
    """A GitHub expression (``${{ ... }}`` or an ``if:``) of ==, &&, || and
    parentheses over the given context (dotted names; an unknown name is
    null), or a string with such expressions substituted."""
    def value(expression: str) -> object:
        code = expression.replace("&&", " and ").replace("||", " or ")
        names = {}

        def name(match: re.Match) -> str:
            names[f"v{len(names)}"] = context.get(match.group(0))
            return f"v{len(names) - 1}"

        code = re.sub(r"\b(?:github|inputs|matrix)(?:\.[A-Za-z_]+)+", name, code)
        return eval(code, {"__builtins__": {}}, names)  # our own file's expressions

    if "${{" not in text:
        return value(text)
    return re.sub(r"\$\{\{(.*?)\}\}", lambda m: str(value(m.group(1))), text)


# ----------------------------------------------------------------- full shards
@cache
def tier() -> dict[str, Cell]:
    return {c.id: c for c in cells.select(tier="full")}


@cache
def twins(cell: Cell) -> frozenset[str]:
    """Full-tier cells this cell's cross-cell checks and findings may measure
    (every applicable check, whether or not a baseline asks for it today)."""
    from perfsuite.checks import CROSS_CELL, FindingRatio

    if cell.profile:  # a profiled cell's steps carry the profiler: no cross-cell checks
        return frozenset()
    found = [check() for check in CROSS_CELL if check().applies(cell.params())]
    found += [FindingRatio(f) for f in cells.findings() if f.applies(cell.params())]
    ids = {Cell.from_params(check.twin_params(cell.params())).id for check in found}
    return frozenset((ids & set(tier())) - {cell.id})


def shards() -> list[dict]:
    return workflow()["jobs"]["full"]["strategy"]["matrix"]["include"]


def test_full_tier_runs_as_shards_one_at_a_time():
    job = workflow()["jobs"]["full"]
    assert job["strategy"]["max-parallel"] == 1  # one measurement on the GPUs at a time
    assert job["strategy"]["fail-fast"] is False  # a failed shard leaves the others to run
    steps = "\n".join(str(step.get("run", "")) for step in job["steps"])
    assert "--perf-resume" in steps and "--perf-tier full" in steps
    assert "SHARD_CELLS" in steps and "join(matrix.cells" in str(job["steps"])


def test_shards_cover_the_full_tier_exactly_once():
    listed = [cell for shard in shards() for cell in shard["cells"]]
    missing, extra = set(tier()) - set(listed), set(listed) - set(tier())
    twice = {c for c in listed if listed.count(c) > 1}
    assert not (missing or extra or twice), (
        f"full-tier shards out of date: missing {sorted(missing)}, not in the tier "
        f"{sorted(extra)}, listed twice {sorted(twice)}; `python -m tests.unit.test_workflow` "
        "prints a plan")


def test_every_shard_fits_its_job_limit():
    limit_s = int(workflow()["jobs"]["full"]["timeout-minutes"]) * 60
    assert limit_s <= 72 * 3600  # the runner's job limit
    for shard in shards():
        summed = sum(tier()[c].timeout_s for c in shard["cells"] if c in tier())
        assert summed + SETUP_S <= limit_s, (
            f"shard {shard['shard']}: its cells' timeouts sum to {summed / 3600:.0f} h, "
            f"+ {SETUP_S / 3600:.0f} h setup > the job's {limit_s / 3600:.0f} h")


def test_twins_are_measured_in_the_same_or_an_earlier_shard():
    where = {c: k for k, shard in enumerate(shards()) for c in shard["cells"]}
    late = [(c, t) for c in tier() for t in twins(tier()[c])
            if c in where and t in where and where[t] > where[c]]
    assert not late, f"twin after its cell (would be measured twice): {late[:5]}"


def test_findings_run_last_over_the_measured_cells():
    flagged = [k for k, shard in enumerate(shards()) if shard.get("findings")]
    assert flagged == [len(shards()) - 1]


# ---------------------------------------------------------- concurrency, guard
GATE_EVENTS = [{"github.event_name": "push"}, {"github.event_name": "pull_request"},
               {"github.event_name": "workflow_dispatch", "inputs.tier": "gate"}]
FULL_EVENTS = [{"github.event_name": "schedule"},
               {"github.event_name": "workflow_dispatch", "inputs.tier": "full"}]


def group_of(job: str, event: dict) -> str:
    spec = workflow()["jobs"][job].get("concurrency") or workflow()["concurrency"]
    return evaluate(spec["group"] if isinstance(spec, dict) else spec, **event)


def test_gate_and_full_runs_are_in_different_concurrency_groups():
    gate = {group_of(job, e) for job in ("gate", "ab") for e in GATE_EVENTS}
    full = {group_of("full", e) for e in FULL_EVENTS}
    assert len(gate) == 1 and len(full) == 1 and not gate & full, (gate, full)
    spec = workflow()["jobs"]["full"].get("concurrency") or workflow()["concurrency"]
    assert spec["cancel-in-progress"] is False  # a running shard is never cancelled


def test_full_schedule_is_weekly():
    (cron,) = [entry["cron"] for entry in triggers()["schedule"]]
    minute, hour, day, month, weekday = cron.split()
    assert day == month == "*" and weekday not in ("*", "")
    assert len(weekday.split(",")) == 1  # ~78 h at the papers' speeds: once a week


def pr_event(head_repo: str | None) -> dict:
    return {"github.event_name": "pull_request", "github.repository": "lab/perfsuite",
            "github.event.pull_request.head.repo.full_name": head_repo}


@pytest.mark.parametrize("job", ["gate", "ab"])
def test_pull_requests_from_forks_do_not_run_on_the_gpu_runner(job):
    condition = workflow()["jobs"][job]["if"]
    assert evaluate(condition, **pr_event("lab/perfsuite")) is True
    assert not evaluate(condition, **pr_event("someone/perfsuite"))
    assert not evaluate(condition, **pr_event(None))  # the fork was deleted
    assert "pull_request_target" not in triggers()  # no PR code with the base's rights


def test_gate_still_runs_on_push_and_the_cache_stays_on_the_runner():
    assert evaluate(workflow()["jobs"]["gate"]["if"], **{"github.event_name": "push"})
    for name, job in workflow()["jobs"].items():
        steps = "\n".join(str(step.get("run", "")) for step in job["steps"])
        assert 'PERFSUITE_CACHE_DIR=$HOME/.cache/perfsuite' in steps, name
        assert not any("actions/cache" in str(step.get("uses", "")) for step in job["steps"])


# ------------------------------------------------------------------- planning
def plan(budget_s: int) -> list[list[str]]:
    """Shards in order: each twin-connected group's cells twins first, groups
    one after another (image, then LLM; largest first), cut when the next cell
    would exceed the budget."""
    ids = list(tier())
    edges = {c: twins(tier()[c]) for c in ids}
    group = {c: c for c in ids}

    def root(c: str) -> str:
        while group[c] != c:
            c = group[c]
        return c

    for c, found in edges.items():
        for t in found:
            group[root(c)] = root(t)
    members: dict[str, list[str]] = {}
    for c in ids:
        members.setdefault(root(c), []).append(c)

    def cost(group_ids):
        return sum(tier()[c].timeout_s for c in group_ids)

    ordered: list[str] = []
    for group_ids in sorted(members.values(), key=lambda g: (tier()[g[0]].workload, -cost(g))):
        def visit(c: str) -> None:
            if c not in ordered:
                for t in sorted(edges[c], key=ids.index):
                    visit(t)
                ordered.append(c)

        for c in group_ids:
            visit(c)
    out: list[list[str]] = [[]]
    for c in ordered:
        if out[-1] and cost(out[-1] + [c]) > budget_s:
            out.append([])
        out[-1].append(c)
    return out


def test_the_plan_keeps_both_rules():
    planned = plan(72 * 3600 - SETUP_S)
    where = {c: k for k, shard in enumerate(planned) for c in shard}
    assert sorted(where) == sorted(tier())
    assert all(where[t] <= where[c] for c in tier() for t in twins(tier()[c]))


if __name__ == "__main__":
    for k, shard in enumerate(plan(72 * 3600 - SETUP_S), 1):
        print(f'          - shard: "{k:02d}"')
        print("            cells:")
        print("\n".join(f"              - {c}" for c in shard))
