"""The gate tier on a one-GPU runner, as the example workflow runs it
(--perf-fail-on-skipped), with torch and NVML answering as that runner's
would: torch sees one GPU, the machine's fingerprint is the H100's of
tests/data/h100-2026-11-26, and each launch hands back that day's measured
result of its cell (what the cell measured there; a slowed one has its step
times stretched). The launcher's own GPU-count check decides what runs.

- unchanged: green, and the cells that need 2-4 GPUs are listed once as not run;
- a slowed cell: red;
- a runner and stack never seen: its first run records the runner's own
  baselines and says so (green, not judged); the second judges them; a
  slowdown after that is red against them;
- a cell whose launch kind has no between-launch spread there (the H100's
  pageable cells: only its pinned cell's launches were repeated) is
  `unknown`; a run recording the runner's baselines launches it again and
  records that kind's spread, and the next run judges it.
"""

import copy
import json
from pathlib import Path

import pytest
import torch

import perfsuite.hardware
import perfsuite.launch.launch as launching

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parents[1]
GATE_TEST = (TESTS / "perf" / "test_image.py").read_text()  # the image cells' test, as the workflow runs it
DAY = TESTS / "data" / "h100-2026-11-26"
RUN = json.loads((DAY / "gate-px500-g1.results.json").read_text())
STORED = {c["id"]: c for c in RUN["cells"]}  # the gate's 500 px fp64, fp32 and pinned fp32 cells
MULTI_GPU = ["gate/image/ddp-ds/g2/fp32/px500/nopin/nchw", "gate/image/ddp/g4/fp32/px500/nopin/nchw"]
SLOWED = "gate/image/ddp-ds/g1/fp32/px500/pin/nchw"  # its baseline allows 5 %
# a GPU the project holds no baselines of
B200 = {"gpu_name": "NVIDIA B200", "gpu_memory_bytes": 191_514_640_384, "torch": "2.14.0+cu130"}


@pytest.fixture
def one_gpu_runner(monkeypatch):
    """Make this process see the runner: ``runner(env=..., slow=...)`` sets
    what its GPU and stack are and which cell is slower, for the next session."""
    state = {"env": {}, "slow": {}, "jitter": [1.0], "launches": 0}

    def env() -> dict:
        return {**copy.deepcopy(RUN["env"]), **state["env"]}

    def launch(cell, out_dir, opts=None):
        skipped = launching.not_runnable(cell, opts or launching.LaunchOptions())
        if skipped is not None:
            return skipped
        result = copy.deepcopy(STORED[cell.id])
        result["env"] = {**result["env"], **state["env"]}
        factor = state["slow"].get(cell.id, 1.0) * state["jitter"][state["launches"] % len(state["jitter"])]
        state["launches"] += 1
        step = result["metrics"]["step_time"]
        for key in ("value", "median", "mean", "min", "max"):
            if isinstance(step.get(key), float):
                step[key] *= factor
        step["samples"] = [s * factor for s in step["samples"]]
        step.pop("launches", None)
        return result

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(perfsuite.hardware, "fingerprint", env)
    monkeypatch.setattr(launching, "run_cell", launch)

    def runner(env: dict | None = None, slow: dict | None = None, jitter: tuple = (1.0,)) -> None:
        state["env"], state["slow"], state["jitter"] = env or {}, slow or {}, list(jitter)
    return runner


def gate(pytester, out: str, *extra: str):
    cells = [a for cell in [*STORED, *MULTI_GPU] for a in ("--perf-cell", cell)]
    return pytester.runpytest(*cells, "--perf-fail-on-skipped", "--perf-no-probe", "--perf-history", "off",
                              "--perf-out", str(pytester.path / out), *extra)


def checks(pytester, out: str) -> dict:
    run = json.loads((pytester.path / out / "results.json").read_text())
    return {c["id"]: {k["name"]: k for k in c["checks"]} for c in run["cells"]}


def test_unchanged_is_green_and_lists_the_cells_that_need_more_gpus_once(pytester, one_gpu_runner):
    pytester.makepyfile(GATE_TEST)
    one_gpu_runner()
    result = gate(pytester, "a")
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(passed=3, skipped=2)
    result.stdout.fnmatch_lines(["*2 cell(s) not run: they need 2-4 GPUs, 1 present*"])
    judged = checks(pytester, "a")
    assert judged[SLOWED]["step_time"]["verdict"] == "same"
    for pageable in set(STORED) - {SLOWED}:  # no pageable launch spread in the H100's folder
        assert (judged[pageable]["step_time"]["verdict"], judged[pageable]["step_time"]["missing"]) == (
            "unknown", "spread")
    assert {judged[c]["work_counters"]["verdict"] for c in STORED} == {"pass"}
    page = (pytester.path / "a" / "report.html").read_text()
    assert "2 cell(s) not run: they need 2-4 GPUs, 1 present" in page
    from perfsuite.report.markdown import summary_markdown
    from perfsuite.schemas.results import load

    job_summary = summary_markdown(load(pytester.path / "a"), "gate")
    assert "- 2 cell(s) not run: they need 2-4 GPUs, 1 present." in job_summary
    assert "No check failed or regressed, but some could not decide (unknown)" in job_summary


def test_a_slowed_cell_is_red(pytester, one_gpu_runner):
    pytester.makepyfile(GATE_TEST)
    one_gpu_runner(slow={SLOWED: 1.10})
    result = gate(pytester, "a")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=2, skipped=2, failed=1)
    assert checks(pytester, "a")[SLOWED]["step_time"]["verdict"] == "regressed"


def test_a_new_runner_and_stack_records_first_then_judges(pytester, one_gpu_runner):
    pytester.makepyfile(GATE_TEST)
    own = pytester.path / "runner-baselines"
    one_gpu_runner(env=B200)
    # without recording, nothing can be judged there: red, every time
    unjudged = gate(pytester, "never", "--perf-runner-baselines", str(own))
    assert unjudged.ret == pytest.ExitCode.TESTS_FAILED
    unjudged.stdout.fnmatch_lines(["*no comparable baseline for step_time on profile b200-178gb-x1*"])

    first = gate(pytester, "first", "--perf-runner-baselines", str(own), "--perf-record-new")
    assert first.ret == pytest.ExitCode.OK  # recorded, and said so: not judged, not red
    first.assert_outcomes(passed=3, skipped=2)
    first.stdout.fnmatch_lines(["*this runner's new baselines: 3 cell(s) had none to be judged against "
                                f"and were recorded into {own}/b200-178gb-x1*"])
    recorded = checks(pytester, "first")
    assert {recorded[c]["step_time"]["verdict"] for c in STORED} == {"skipped"}
    assert {recorded[c]["step_time"]["recorded"] for c in STORED} == {str(own / "b200-178gb-x1")}
    summary = (pytester.path / "first" / "report.html").read_text()
    assert "had no baseline on this runner and were recorded as its own" in summary

    second = gate(pytester, "second", "--perf-runner-baselines", str(own), "--perf-record-new")
    assert second.ret == pytest.ExitCode.OK
    judged = checks(pytester, "second")
    assert {judged[c]["step_time"]["verdict"] for c in STORED} == {"same"}
    assert {judged[c]["work_counters"]["verdict"] for c in STORED} == {"pass"}
    assert not any(k.get("recorded") or k.get("missing") for c in judged.values() for k in c.values())
    assert "this runner's new baselines" not in second.stdout.str()

    one_gpu_runner(env=B200, slow={SLOWED: 1.10})
    slowed = gate(pytester, "third", "--perf-runner-baselines", str(own), "--perf-record-new")
    assert slowed.ret == pytest.ExitCode.TESTS_FAILED
    assert checks(pytester, "third")[SLOWED]["step_time"]["verdict"] == "regressed"


def test_a_new_stack_on_known_hardware_judges_times_across_it_and_records_its_counters(
        pytester, one_gpu_runner):
    pytester.makepyfile(GATE_TEST)
    own = pytester.path / "runner-baselines"
    one_gpu_runner(env={"torch": "2.14.0+cu130"})  # the workflow's pinned torch on the H100
    first = gate(pytester, "first", "--perf-runner-baselines", str(own), "--perf-record-new")
    assert first.ret == pytest.ExitCode.OK
    judged = checks(pytester, "first")
    assert {judged[c]["step_time"]["verdict"] for c in STORED} == {"same"}  # across the stack change
    counted = [judged[c]["work_counters"] for c in STORED]
    assert {k["verdict"] for k in counted} == {"pass"}  # shown against torch 2.11's, not skipped
    assert all("across the stack change" in k["message"] and k["recorded"] for k in counted)
    second = gate(pytester, "second", "--perf-runner-baselines", str(own), "--perf-record-new")
    assert second.ret == pytest.ExitCode.OK
    counted = [checks(pytester, "second")[c]["work_counters"] for c in STORED]
    assert all(k["verdict"] == "pass" and "across" not in k["message"] for k in counted)


def test_a_kind_without_a_spread_is_launched_again_recorded_and_then_judged(pytester, one_gpu_runner):
    pytester.makepyfile(GATE_TEST)
    own = pytester.path / "runner-baselines"
    one_gpu_runner(jitter=(1.0, 1.01, 0.99, 1.005))  # launches scatter ~1 %
    first = gate(pytester, "first", "--perf-runner-baselines", str(own), "--perf-record-new")
    assert first.ret == pytest.ExitCode.OK
    run = {c["id"]: c for c in json.loads((pytester.path / "first" / "results.json").read_text())["cells"]}
    pageable = sorted(set(STORED) - {SLOWED})
    launched = {len(run[c]["metrics"]["step_time"].get("launches") or [0]): c for c in pageable}
    assert sorted(launched) == [1, 4]  # the second of its kind is judged with the spread the first gave
    step = checks(pytester, "first")[launched[4]]["step_time"]
    assert step["verdict"] == "same" and "spread of image/pageable launches" in step["message"]
    from perfsuite.judge.baselines import load_profile

    spread = load_profile(own / "h100-80gb-hbm3-80gb-x1").launch_spread
    assert set(spread) == {"image/pageable"} and spread["image/pageable"]["median"].dof == 3
    second = gate(pytester, "second", "--perf-runner-baselines", str(own), "--perf-record-new")
    judged = checks(pytester, "second")
    assert second.ret == pytest.ExitCode.OK
    assert {judged[c]["step_time"]["verdict"] for c in STORED} == {"same"}
    assert not any(k.get("missing") for c in judged.values() for k in c.values())


def test_recording_new_baselines_needs_the_folder_they_go_to(pytester):
    pytester.makepyfile(GATE_TEST)
    result = pytester.runpytest("--perf-cell", MULTI_GPU[0], "--perf-record-new", "--perf-allow-no-gpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--perf-runner-baselines DIR*"])
