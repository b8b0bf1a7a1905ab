"""The example GPU workflow's scripts (.ci/runner-venv, .ci/history-changes,
.ci/full-shard, .ci/perfsuite-action), run here as a runner's `run:` step runs
them, with stubs for the venv's python and perfsuite and for .ci/install:
what they write to $GITHUB_ENV and the job summary, what they clean up on the
runner's disk, the commands they run and how they exit. A full shard's -k
expression is collected by pytest for real. tests/unit/test_workflow.py
checks that the workflow calls them; tests/unit/test_install.py runs the
Install step with the real .ci/install."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from perfsuite import cells
from perfsuite.cli import shards as cli_shards

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ("runner-venv", "history-changes", "full-shard", "perfsuite-action")
MNIST = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
DAY_S = 24 * 3600


def run_script(argv: list[str], env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """As a runner runs a `run:` step (`shell: bash`): bash -eo pipefail."""
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", shlex.join(argv)], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=300)


def stub(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(0o755)
    return path


def aged(path: Path, days: float) -> Path:
    then = time.time() - days * DAY_S
    os.utime(path, (then, then))
    return path


def aged_dir(path: Path, days: float) -> Path:
    path.mkdir(parents=True)
    return aged(path, days)


def logged(log: Path) -> list[list[str]]:
    """The calls a stub logged, one argument a line, calls ended by a blank line."""
    return [call.splitlines() for call in log.read_text().split("\n\n") if call] if log.exists() else []


LOG_ARGS = 'printf "%s\\n" "$@" >> "$STUB_LOG"; echo >> "$STUB_LOG"\n'


@pytest.fixture
def runner(tmp_path) -> dict[str, str]:
    """A job's environment on the runner: its own HOME, the files Actions hands a step."""
    home = tmp_path / "home"
    home.mkdir()
    for name in ("github_env", "summary.md"):
        (tmp_path / name).touch()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PERFSUITE", "GITHUB_", "RUNNER_"))}
    env.update(HOME=str(home), GITHUB_ENV=str(tmp_path / "github_env"), GITHUB_STEP_SUMMARY=str(tmp_path / "summary.md"),
               RUNNER_TEMP=str(tmp_path), GITHUB_RUN_ID="4242", STUB_LOG=str(tmp_path / "calls"))
    return env


def github_env(env: dict[str, str]) -> dict[str, str]:
    return dict(line.split("=", 1) for line in Path(env["GITHUB_ENV"]).read_text().splitlines())


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_script_passes_shellcheck_and_is_executable(name):
    path = ROOT / ".ci" / name
    assert os.access(path, os.X_OK)
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck not installed (apt-get install shellcheck)")
    done = subprocess.run([shellcheck, str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


# ------------------------------------------------------------ .ci/runner-venv
def checkout(tmp_path: Path, install: str) -> Path:
    """A copy of the checkout's files runner-venv reads, whose .ci/install is ``install``."""
    work = tmp_path / "checkout"
    for name in ("pyproject.toml", "constraints.txt", ".ci/runner-venv"):
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, work / name)
    stub(work / ".ci" / "install", install)
    return work


def test_runner_venv_writes_the_jobs_environment_and_removes_venvs_unused_for_30_days(tmp_path, runner):
    work = checkout(tmp_path, 'mkdir -p "$1"\necho "asked: $*"\necho "perfsuite install: torch 2.14.0"\n')
    cache = Path(runner["HOME"]) / ".cache" / "perfsuite"
    old, recent = aged_dir(cache / "venv-0123456789abcdef", 40), aged_dir(cache / "venv-fedcba9876543210", 10)
    other = aged_dir(cache / "runs", 40)  # not a venv: left alone
    first = run_script(["bash", ".ci/runner-venv", "llm"], runner, cwd=work)
    assert first.returncode == 0, first.stderr
    written = github_env(runner)
    venv = Path(written["VENV"])
    assert written == {"VENV": str(venv), "PERFSUITE_CACHE_DIR": str(cache),
                       "HISTORY_URL": str(cache / "history.sqlite")}
    assert venv.parent == cache and venv.is_dir() and not old.exists() and recent.exists() and other.exists()
    assert first.stdout.splitlines() == [f"asked: {venv} llm", "perfsuite install: torch 2.14.0"]
    assert Path(runner["GITHUB_STEP_SUMMARY"]).read_text() == "perfsuite install: torch 2.14.0\n"

    aged(venv, 40)  # the job's own venv, unused for 40 days, is in use again: kept
    again = run_script(["bash", ".ci/runner-venv"], runner, cwd=work)
    assert again.returncode == 0, again.stderr
    assert venv.is_dir() and again.stdout.splitlines()[0] == f"asked: {venv}"  # no extras: none asked


def test_runner_venv_fails_with_the_install_and_keys_the_venv_by_the_install_script(tmp_path, runner):
    work = checkout(tmp_path, 'echo "no torch for this driver" >&2\nexit 2\n')
    done = run_script(["bash", ".ci/runner-venv", "llm"], runner, cwd=work)
    assert done.returncode == 2 and "no torch for this driver" in done.stderr  # through tee: pipefail
    assert Path(runner["GITHUB_STEP_SUMMARY"]).read_text() == ""
    before = github_env(runner)["VENV"]
    Path(runner["GITHUB_ENV"]).write_text("")
    stub(work / ".ci" / "install", 'mkdir -p "$1"\necho "perfsuite install: changed"\n')
    assert run_script(["bash", ".ci/runner-venv", "llm"], runner, cwd=work).returncode == 0
    assert github_env(runner)["VENV"] != before  # a new .ci/install: a new venv


# --------------------------------------------------------- .ci/history-changes
@pytest.fixture
def venv(tmp_path) -> Path:
    """A venv whose perfsuite logs its arguments, prints a line and exits $STUB_RC."""
    folder = tmp_path / "venv"
    stub(folder / "bin" / "perfsuite", LOG_ARGS + 'echo "gate/x: no change point"\nexit "${STUB_RC:-0}"\n')
    return folder


@pytest.mark.parametrize(("rc", "since"), [(0, ""), (1, "abc123")])
def test_history_changes_prints_fills_the_summary_and_exits_as_the_command(runner, venv, rc, since):
    env = {**runner, "VENV": str(venv), "HISTORY_URL": "/runner/history.sqlite", "STUB_RC": str(rc),
           "PERFSUITE_HISTORY_SINCE": since}
    done = run_script(["bash", ".ci/history-changes", "gate"], env)
    assert done.returncode == rc, done.stderr  # 1: a series regressed at its newest run fails the job
    assert done.stdout == "gate/x: no change point\n"
    (call,) = logged(Path(env["STUB_LOG"]))
    assert call == ["history", "changes", "--history", "/runner/history.sqlite", "--cell", "gate/*",
                    "--confirm", "--bisect", "--repo", ".", "--out", ".perfsuite/confirm",
                    *(["--since", since] if since else [])]
    assert Path(env["GITHUB_STEP_SUMMARY"]).read_text() == (
        "### History: change points (gate)\n```\ngate/x: no change point\n```\n")


def test_history_changes_wants_its_tier(runner, venv):
    done = run_script(["bash", ".ci/history-changes"], {**runner, "VENV": str(venv), "HISTORY_URL": "h"})
    assert done.returncode != 0 and "usage: bash .ci/history-changes TIER" in done.stderr
    assert not logged(Path(runner["STUB_LOG"]))


# ------------------------------------------------------------ .ci/full-shard
def shard_env(runner: dict[str, str], tmp_path: Path, python: str, cells_: list[str], findings: bool,
              record: bool = True) -> dict[str, str]:
    mnist = tmp_path / "mnist"
    mnist.mkdir(exist_ok=True)
    for k, name in enumerate(MNIST):
        (mnist / (name + (".gz" if k == 0 else ""))).touch()  # either form
    folder = tmp_path / "shard-venv"
    stub(folder / "bin" / "python", python)
    return {**runner, "VENV": str(folder), "HISTORY_URL": "/runner/history.sqlite", "MNIST_DIR": str(mnist),
            "SHARD": "03", "SHARD_CELLS": " ".join(cells_), "SHARD_FINDINGS": str(findings).lower(),
            "RECORD_HISTORY": str(record).lower()}


@pytest.mark.parametrize(("findings", "record", "history"), [
    (False, True, "off"), (True, True, "/runner/history.sqlite"), (True, False, "off")])
def test_a_shard_resumes_the_runs_folder_and_only_the_last_on_main_adds_the_run(tmp_path, runner, findings,
                                                                                  record, history):
    env = shard_env(runner, tmp_path, LOG_ARGS, ["full/a", "full/b"], findings, record)
    runs = Path(runner["HOME"]) / ".cache" / "perfsuite" / "runs"
    old, recent = aged_dir(runs / "full-1", 40), aged_dir(runs / "full-4000", 10)
    done = run_script(["bash", ".ci/full-shard"], env)
    assert done.returncode == 0, done.stderr
    run_dir = runs / "full-4242"  # the run id, not the attempt: a re-run resumes
    assert github_env(env) == {"RUN_DIR": str(run_dir)}  # the session makes it
    assert not old.exists() and recent.exists()
    (call,) = logged(Path(env["STUB_LOG"]))
    select = "test_preflight_probe or [full/a] or [full/b]"
    if findings:
        select += " or test_qlora_uses_the_least_memory or test_qat_is_the_slowest"
    assert call == ["-m", "pytest", "tests/perf", "--perf-tier", "full", "-k", select,
                    "--perf-data-dir", env["MNIST_DIR"], "--perf-out", str(run_dir), "--perf-resume",
                    "--junitxml", f"{run_dir}/junit-03.xml", "--perf-history", history]


def test_a_shard_stops_before_measuring_where_mnist_is_missing(tmp_path, runner):
    env = shard_env(runner, tmp_path, LOG_ARGS, ["full/a"], False)
    (Path(env["MNIST_DIR"]) / "t10k-labels-idx1-ubyte").unlink()
    done = run_script(["bash", ".ci/full-shard"], env)
    assert done.returncode == 1
    assert (f"::error::{env['MNIST_DIR']} lacks t10k-labels-idx1-ubyte(.gz); set the repository variable "
            "PERFSUITE_MNIST_DIR") in done.stdout
    assert not logged(Path(env["STUB_LOG"]))


def collected(output: str) -> list[str]:
    return re.findall(r"^tests/perf/\S+", output, re.M)


@pytest.mark.parametrize("which", [0, 8, -1])
def test_a_shards_selection_collects_exactly_its_cells(tmp_path, runner, which):
    """The script's -k, collected by pytest for the plan's first shard, the
    first with profiled cells (whose unprofiled twins ran earlier: the
    brackets must not select them again) and the last, with the findings."""
    plan = cli_shards.shards("full")
    shard = plan[which]
    python = f'exec "{sys.executable}" "$@" --collect-only -q -p no:cacheprovider\n'
    env = shard_env(runner, tmp_path, python, shard["cells"], shard["findings"], record=False)
    done = run_script(["bash", ".ci/full-shard"], env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    nodes = collected(done.stdout)
    ids = [re.search(r"\[(.*)\]$", n).group(1) for n in nodes if n.endswith("]")]
    assert sorted(ids) == sorted(shard["cells"])
    others = sorted(n.rsplit("::", 1)[1] for n in nodes if not n.endswith("]"))
    findings = ["test_qat_is_the_slowest", "test_qlora_uses_the_least_memory"] if shard["findings"] else []
    assert others == sorted(["test_preflight_probe", *findings])
    if which == 8:
        assert any(c.endswith("/prof") for c in shard["cells"])
        assert not any(c.endswith("/prof") for c in plan[0]["cells"])


# ------------------------------------------------------ .ci/perfsuite-action
WORKFLOW = ROOT / ".github" / "workflows" / "perfsuite-gpu.yml"
ACTION = ROOT / ".github" / "actions" / "perfsuite" / "action.yml"
AB_SESSION = ROOT / "tests" / "data" / "h100-2026-11-26" / "ab-slow2.json"  # a regressed cell
CLI = f'exec "{sys.executable}" -m perfsuite.cli.main "$@"\n'  # this checkout's perfsuite


def yaml_of(path: Path) -> dict:
    return pytest.importorskip("yaml").safe_load(path.read_text())


def ab_inputs() -> dict[str, str]:
    """What the workflow's ab job gives the action."""
    job = yaml_of(WORKFLOW)["jobs"]["ab"]
    return next(step for step in job["steps"] if step.get("uses") == "$/.github/actions/perfsuite")["with"]


def perfsuite_venv(tmp_path: Path, on_ab: str = "exit 0\n") -> Path:
    """A venv whose perfsuite is this checkout's for list and report, and logs ab and run, then ``on_ab``."""
    folder = tmp_path / "venv"
    stub(folder / "bin" / "perfsuite", 'case "$1" in list | report) ' + CLI.strip() + " ;; esac\n" + LOG_ARGS + on_ab)
    return folder


@pytest.mark.parametrize(("rc", "exits"), [(0, 0), (1, 1), (3, 0)])
def test_the_actions_ab_measures_the_cells_it_matched_and_warns_when_undecided(tmp_path, runner, rc, exits):
    given = ab_inputs()
    env = {**runner, "VENV": str(perfsuite_venv(tmp_path, f"exit {rc}\n")), "MODE": "ab", "TIER": given["tier"],
           "CELLS_MATCHING": given["cells-matching"], "GPUS": given["gpus"], "TOLERANCE": given["tolerance"],
           "BASE": "base123", "OUT": given["out"]}
    done = run_script(["bash", ".ci/perfsuite-action", "measure"], env)
    assert done.returncode == exits, done.stderr
    (call,) = logged(Path(runner["STUB_LOG"]))
    wanted = [c.id for c in cells.select(tier="gate", workload="image") if c.world_size == 1 and not c.profile]
    assert wanted and call == ["ab", *wanted, "--a-ref", "base123", "--b-ref", "HEAD", "--gpus", "0",
                               "--tolerance", "0.02", "--quads", "16", "--out", ".perfsuite/ab"]
    assert ("::warning::perfsuite ab: a cell is undecided" in done.stdout) == (rc == 3)


@pytest.mark.parametrize("record", [True, False])
def test_the_actions_gate_runs_the_cells_given_against_the_runners_baselines(tmp_path, runner, record):
    env = {**runner, "VENV": str(perfsuite_venv(tmp_path, "exit 1\n")), "MODE": "gate", "CELLS": "gate/a  gate/b",
           "RECORD_NEW": str(record).lower(), "OUT": "out"}
    done = run_script(["bash", ".ci/perfsuite-action", "measure"], env)
    assert done.returncode == 1  # a regression fails the step
    (call,) = logged(Path(runner["STUB_LOG"]))
    assert call == ["run", "gate/a", "gate/b", "--out", "out", "--fail-on-skipped", "--history", "off",
                    "--runner-baselines", f"{runner['HOME']}/.cache/perfsuite/baselines",
                    *(["--record-new"] if record else [])]


def test_a_selection_of_no_cell_stops_before_measuring(tmp_path, runner):
    env = {**runner, "VENV": str(perfsuite_venv(tmp_path)), "MODE": "ab", "CELLS_MATCHING": "^nothing$", "BASE": "b"}
    done = run_script(["bash", ".ci/perfsuite-action", "measure"], env)
    assert done.returncode == 2 and "no cell of tier gate matches cells-matching ^nothing$" in done.stderr
    assert not logged(Path(runner["STUB_LOG"]))


def test_the_actions_report_writes_the_comment_into_the_job_summary(tmp_path, runner):
    out = tmp_path / "ab"
    out.mkdir()
    comment = tmp_path / "comment.md"
    env = {**runner, "VENV": str(perfsuite_venv(tmp_path)), "OUT": str(out), "COMMENT": str(comment),
           "ARTIFACTS_URL": "https://example.org/artifacts/9"}
    empty = run_script(["bash", ".ci/perfsuite-action", "report"], env)  # stopped before its first cell
    assert empty.returncode == 0 and "holds no session" in empty.stdout and not comment.exists()
    shutil.copy(AB_SESSION, out / "ab.json")
    done = run_script(["bash", ".ci/perfsuite-action", "report"], env)
    assert done.returncode == 0, done.stderr
    text = comment.read_text()
    assert text.startswith("<!-- perfsuite-ab -->\n") and "https://example.org/artifacts/9" in text
    assert "| `gate/image/ddp-ds/g1/fp32/px500/pin/nchw` | ❌ regressed |" in text
    assert Path(runner["GITHUB_STEP_SUMMARY"]).read_text() == text
    assert run_script(["bash", ".ci/perfsuite-action", "report"], env).returncode == 0
    assert comment.read_text() == text  # written afresh, not appended to the last one


def gh_stub(tmp_path: Path, found: str) -> Path:
    """gh: logs each call; lists ``found`` as the id of a comment with the marker."""
    folder = tmp_path / "gh-bin"
    stub(folder / "gh", LOG_ARGS + f'case "$*" in *--paginate*) echo "{found}" ;; esac\n')
    return folder


@pytest.mark.parametrize(("mode", "found"), [("ab", ""), ("ab", "77"), ("gate", "78")])
def test_the_comment_is_edited_in_place_where_there_is_one_else_posted(tmp_path, runner, mode, found):
    comment = tmp_path / "comment.md"
    comment.write_text("<!-- perfsuite-ab -->\n## perfsuite ab\n" if mode == "ab" else "## perfsuite: gate\n")
    env = {**runner, "PATH": f"{gh_stub(tmp_path, found)}:{os.environ['PATH']}", "MODE": mode,
           "COMMENT": str(comment), "REPO": "lab/perfsuite", "PR": "5", "GH_TOKEN": "t"}
    done = run_script(["bash", ".ci/perfsuite-action", "comment"], env)
    assert done.returncode == 0, done.stderr
    listed, sent = logged(Path(runner["STUB_LOG"]))
    marker = f"<!-- perfsuite-{mode} -->"
    assert listed == ["api", "--paginate", "repos/lab/perfsuite/issues/5/comments", "--jq",
                      f'.[] | select(.body | startswith("{marker}")) | .id']
    target = f"repos/lab/perfsuite/issues/comments/{found}" if found else "repos/lab/perfsuite/issues/5/comments"
    assert sent == ["api", "--method", "PATCH" if found else "POST", target, "-F", f"body=@{comment}"]
    assert comment.read_text().splitlines()[0] == marker  # the gate's summary marked, the ab's kept as it was
    assert comment.read_text().count(marker) == 1


def test_without_gh_the_comment_is_left_to_the_job_summary(tmp_path, runner):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name in ("bash", "dirname", "head", "cat", "mv"):
        (bin_ / name).symlink_to(shutil.which(name))
    comment = tmp_path / "comment.md"
    comment.write_text("<!-- perfsuite-ab -->\nx\n")
    done = run_script(["bash", ".ci/perfsuite-action", "comment"],
                      {**runner, "PATH": str(bin_), "COMMENT": str(comment)})
    assert done.returncode == 0 and "::warning::perfsuite action: gh (GitHub's CLI) is not on this runner" in done.stdout


def expression(text: str, context: dict[str, object]) -> object:
    """A GitHub expression of the action's kinds: names, ==, &&, ||, !cancelled() (never, here)."""
    code = text.replace("!cancelled()", "True").replace("&&", " and ").replace("||", " or ")
    names: dict[str, object] = {}

    def name(match: re.Match) -> str:
        names[f"v{len(names)}"] = context.get(match.group(0))
        return f"v{len(names) - 1}"

    code = re.sub(r"\b(?:github|inputs|steps|runner)(?:\.[A-Za-z_-]+)+", name, code)
    return eval(code, {"__builtins__": {}}, names)  # the action's own expressions


def substituted(value: object, context: dict[str, object]) -> str:
    return re.sub(r"\$\{\{(.*?)\}\}", lambda m: str(expression(m.group(1), context)), str(value))


def test_a_dry_run_of_the_actions_steps_as_the_workflows_ab_job_runs_them(tmp_path, runner):
    """Every step of action.yml in order, as a runner runs a composite action:
    its env from the inputs the ab job gives (the rest their defaults), what
    a step writes to $GITHUB_ENV handed to the next, the upload's URL as its
    output; a stub runner-venv, perfsuite ab (a regressed session, exit 1)
    and gh, this checkout's perfsuite for list and report."""
    action = yaml_of(ACTION)
    copy = tmp_path / "action-repo"  # the action's repository as the runner fetched it
    (copy / ".ci").mkdir(parents=True)
    shutil.copy2(ROOT / ".ci" / "perfsuite-action", copy / ".ci" / "perfsuite-action")
    venv = perfsuite_venv(tmp_path, f'out="${{@: -1}}"; mkdir -p "$out"; cp "{AB_SESSION}" "$out/ab.json"; exit 1\n')
    stub(copy / ".ci" / "runner-venv", f'echo "VENV={venv}" >> "$GITHUB_ENV"\n'
                                       'echo "torch index: ${PERFSUITE_TORCH_INDEX-unset}; extras: $*"\n')
    inputs = {name: spec.get("default", "") for name, spec in action["inputs"].items()}
    context = {"github.event.pull_request.base.sha": "base123", "github.token": "t", "github.event_name": "pull_request",
               "github.repository": "lab/perfsuite", "github.event.pull_request.head.repo.full_name": "lab/perfsuite",
               "github.event.pull_request.number": 5, "runner.temp": str(tmp_path),
               "steps.upload.outputs.artifact-url": "https://example.org/artifacts/4242"}
    inputs = {k: substituted(v, context) for k, v in inputs.items()}
    inputs.update({k: v for k, v in ab_inputs().items() if "${{" not in str(v)})  # torch: a repository variable
    inputs["out"] = str(tmp_path / "ab")  # the workspace's folder, here
    context.update({f"inputs.{k}": v for k, v in inputs.items()})
    env = {**runner, "PATH": f"{gh_stub(tmp_path, '')}:{os.environ['PATH']}",
           "GITHUB_ACTION_PATH": str(copy / ".github" / "actions" / "perfsuite")}
    (copy / ".github" / "actions" / "perfsuite").mkdir(parents=True)
    ran = {}
    for step in action["runs"]["steps"]:
        if "if" in step and not expression(step["if"].strip().removeprefix("${{").removesuffix("}}"), context):
            continue
        if "uses" in step:  # the upload: its output is in the context
            continue
        step_env = {**env, **github_env(env), **{k: substituted(v, context) for k, v in step["env"].items()}}
        assert step["shell"] == "bash"
        ran[step["name"]] = run_script(["bash", "-c", step["run"]], step_env)
    assert list(ran) == ["Install", "Measure", "Report", "Comment"]
    assert ran["Install"].stdout == "torch index: unset; extras: llm\n"  # pinned: constraints.txt's
    assert ran["Measure"].returncode == 1  # regressed: the step fails, the reports follow
    assert all(ran[name].returncode == 0 for name in ("Install", "Report", "Comment")), ran
    summary = Path(runner["GITHUB_STEP_SUMMARY"]).read_text()
    assert summary.startswith("<!-- perfsuite-ab -->\n") and "https://example.org/artifacts/4242" in summary
    calls = logged(Path(runner["STUB_LOG"]))
    assert calls[0][0] == "ab" and "gate/image/ddp-ds/g1/fp32/px500/pin/nchw" in calls[0]
    assert calls[0][-12:] == ["--a-ref", "base123", "--b-ref", "HEAD", "--gpus", "0", "--tolerance", "0.02",
                              "--quads", "16", "--out", str(tmp_path / "ab")]
    assert calls[-1][:4] == ["api", "--method", "POST", "repos/lab/perfsuite/issues/5/comments"]
