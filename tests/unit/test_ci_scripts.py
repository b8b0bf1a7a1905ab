"""The example GPU workflow's scripts (.ci/runner-venv, .ci/history-changes,
.ci/full-shard, .ci/ab-gate-cells), run here as a runner's `run:` step runs
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
SCRIPTS = ("runner-venv", "history-changes", "full-shard", "ab-gate-cells")
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


# --------------------------------------------------------- .ci/ab-gate-cells
@pytest.mark.parametrize(("rc", "exits"), [(0, 0), (1, 1), (3, 0)])
def test_ab_measures_the_gates_one_gpu_image_cells_at_2_percent_and_warns_when_undecided(tmp_path, runner, rc,
                                                                                        exits):
    """`perfsuite list` is this checkout's; `perfsuite ab` logs what it was asked and exits rc."""
    folder = tmp_path / "venv"
    stub(folder / "bin" / "perfsuite", f'if [ "$1" = list ]; then exec "{sys.executable}" -m perfsuite.cli.main "$@"; fi\n'
                                       + LOG_ARGS + f"exit {rc}\n")
    done = run_script(["bash", ".ci/ab-gate-cells", "base123", ".perfsuite/ab"], {**runner, "VENV": str(folder)})
    assert done.returncode == exits, done.stderr
    (call,) = logged(Path(runner["STUB_LOG"]))
    wanted = [c.id for c in cells.select(tier="gate", workload="image") if c.world_size == 1 and not c.profile]
    assert wanted and call == ["ab", *wanted, "--a-ref", "base123", "--b-ref", "HEAD", "--gpus", "0",
                               "--tolerance", "0.02", "--out", ".perfsuite/ab"]
    assert ("::warning::perfsuite ab: a cell is undecided after 4 launch pairs" in done.stdout) == (rc == 3)
