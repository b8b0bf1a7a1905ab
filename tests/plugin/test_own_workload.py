"""Your own workload as a cell: a pytest test run in its ranks, judged here.

The example project (examples/own-workload) runs as its README says, in 2
ranks on CPU, with its own recorded baseline; a rank's failed assertion, a
raise, a hang and a kill are diagnosed as for a built-in cell and leave no
process behind; collecting starts nothing and imports no torch.
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from perfsuite.schemas import results
from tests.unit.cellkit import survivors

pytest_plugins = ["pytester"]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own-workload"
EXAMPLE_ID = "user/tests/test_train.py::test_train_step/c2"




@pytest.mark.slow
def test_the_example_runs_in_two_ranks_on_cpu_and_is_judged_against_its_baseline(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:hypothesispytest",
         "--perf-baselines", "baselines", "--perf-out", str(out), "--perf-no-probe",
         "--perf-history", "off"],
        cwd=EXAMPLE, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    saved = results.load(out)  # the results schema, checked
    (cell,) = saved["cells"]
    assert cell["id"] == EXAMPLE_ID and cell["status"] == "ok"
    assert cell["params"]["workload"] == "tests/test_train.py::test_train_step"
    assert cell["params"]["world_size"] == 2 and cell["params"]["device"] == "cpu"
    assert [r["status"] for r in cell["ranks"]] == ["ok", "ok"]
    step = cell["metrics"]["step_time"]
    assert step["n"] == len(step["samples"]) == 20 and all(s > 0 for s in step["samples"])
    assert cell["metrics"]["throughput"]["unit"] == "items/s"
    per_step = cell["counters"]["per_step"]
    assert per_step["flops"] > 0 and per_step["collectives/allreduce/calls"] >= 1
    checks = {c["name"]: c for c in cell["checks"]}
    assert {"sanity.step_time_samples", "sanity.throughput", "step_time", "work_counters"} <= set(checks)
    assert not [c for c in cell["checks"] if c["verdict"] in ("fail", "regressed")]
    recorded = json.loads(next((EXAMPLE / "baselines").glob("*/counters.json")).read_text())["entries"]
    from perfsuite.judge.baselines import counter_versions

    if any(e["versions"] == counter_versions(cell["env"], "cpu") for e in recorded):
        assert checks["work_counters"]["verdict"] == "pass", checks["work_counters"]  # the same stack
    assert EXAMPLE_ID in done.stdout and (out / "cells" / EXAMPLE_ID / "output.log").exists()


FAULTY = '''
import os
import signal
import time

import pytest


def _steps(perf_dist, perf_steps, fault):
    import torch
    import torch.distributed as dist

    for step, x in enumerate(perf_steps(iter(lambda: torch.ones(4), None), warmup=1, steps=6)):
        if perf_dist.rank == 1 and step == 3:
            fault()
        dist.all_reduce(x)


@pytest.mark.perf_ranks(2)
def test_asserts(perf_dist, perf_steps):
    def fault():
        assert perf_dist.world_size == 3, "rank 1 says the world is too small"
    _steps(perf_dist, perf_steps, fault)


@pytest.mark.perf_ranks(2, timeout=9)  # the ranks reach step 3 within ~4 s of the launch
def test_hangs(perf_dist, perf_steps):
    _steps(perf_dist, perf_steps, lambda: time.sleep(3600))


@pytest.mark.perf_ranks(2)
def test_killed(perf_dist, perf_steps):
    _steps(perf_dist, perf_steps, lambda: os.kill(os.getpid(), signal.SIGKILL))
'''


@pytest.mark.slow
def test_a_rank_that_fails_raises_hangs_or_is_killed_is_diagnosed_and_leaves_nothing(pytester):
    pytester.makepyfile(test_faulty=FAULTY)
    out = pytester.path / "out"
    began = time.monotonic()
    run = pytester.runpytest("--perf-out", str(out), "--perf-no-probe", "--perf-history", "off")
    elapsed = time.monotonic() - began
    run.assert_outcomes(failed=3)
    text = run.stdout.str()
    # the assertion of rank 1, as pytest explains it there, fails the test here
    run.stdout.fnmatch_lines([
        "*user/test_faulty.py::test_asserts/c2: error: rank 1 failed: AssertionError: "
        "rank 1 says the world is too small",
        "assert 2 == 3",
        "*where 2 = Dist(rank=1, world_size=2*).world_size",
        "--- where the ranks were: rank 0 step 3* (train); rank 1 step 3* (train)"])
    assert "test_faulty.py:21: in fault" in text and "line 21, in fault" in text  # its stack, both ways
    cells = {c["id"].rsplit("::", 1)[1]: c for c in json.loads((out / "results.json").read_text())["cells"]}
    hung = cells["test_hangs/c2"]
    assert hung["status"] == "timeout"
    assert "rank 1 hung at step 3 in train (File" in hung["reason"] and "test_faulty.py" in hung["reason"]
    assert "waiting: rank 0 at step 3" in hung["reason"]
    assert "time.sleep" in hung["ranks"][1]["stack"] or "test_faulty.py" in hung["ranks"][1]["stack"]
    killed = cells["test_killed/c2"]
    assert killed["reason"] == "rank 1 died without a result (killed by SIGKILL)"
    assert killed["ranks"][1]["signal"] == "SIGKILL"
    assert elapsed < 9 + 2 + 10 + 2 * 30  # the hang's timeout, stack grace, termination; two launches
    assert survivors(str(out)) == []


SKIPPING = '''
import pytest


@pytest.mark.perf_ranks(2)
def test_skips_in_its_ranks(perf_dist, perf_steps):
    pytest.skip(f"needs NCCL, rank {perf_dist.rank} has gloo")


@pytest.mark.perf_ranks(1)
@pytest.mark.xfail(reason="the fused path is not there yet")
def test_fails_as_expected(perf_dist, perf_steps):
    assert perf_dist.world_size == 2
'''


@pytest.mark.slow
def test_a_test_that_skips_itself_or_fails_as_expected_in_its_ranks_is_a_skipped_cell(pytester):
    pytester.makepyfile(test_skipping=SKIPPING)
    out = pytester.path / "out"
    run = pytester.runpytest("--perf-out", str(out), "--perf-no-probe", "--perf-history", "off", "-rs")
    run.assert_outcomes(skipped=2)
    cells = {c["id"].rsplit("::", 1)[1]: c for c in results.load(out)["cells"]}
    skipped, xfailed = cells["test_skips_in_its_ranks/c2"], cells["test_fails_as_expected/c1"]
    assert skipped["status"] == "skipped" and skipped["reason"] in (
        "ranks 0, 1 skipped: needs NCCL, rank 0 has gloo", "ranks 0, 1 skipped: needs NCCL, rank 1 has gloo")
    assert [r["status"] for r in skipped["ranks"]] == ["skipped", "skipped"]
    assert xfailed["status"] == "skipped"
    assert xfailed["reason"] == "rank 0 skipped: expected to fail (xfail): the fused path is not there yet"
    run.stdout.fnmatch_lines(["*test_skips_in_its_ranks/c2: ranks 0, 1 skipped: needs NCCL*"])


def test_collect_only_starts_no_process_and_imports_no_torch():
    # From the session's start on (pytest-benchmark, installed with perfsuite,
    # asks git and hg for the commit while pytest configures): no fork
    # (torchrun's agent), no subprocess, no torch. Hypothesis's plugin, here
    # for the suite's own tests and not the example's, takes 0.8 s of its own.
    probe = (
        "import os, subprocess, sys, time\n"
        "def refuse(*a, **k): raise AssertionError(f'a process was started: {a}')\n"
        "class NoProcess:\n"
        "    def pytest_sessionstart(self, session):\n"
        "        os.fork = os.posix_spawn = os.posix_spawnp = refuse\n"
        "        subprocess.Popen.__init__ = refuse\n"
        "import pytest\n"
        "began = time.perf_counter()\n"
        "code = pytest.main(['--collect-only', '-q', '-p', 'no:cacheprovider',\n"
        "                    '-p', 'no:hypothesispytest', 'tests'], plugins=[NoProcess()])\n"
        "print('SECONDS', time.perf_counter() - began, 'TORCH', 'torch' in sys.modules)\n"
        "sys.exit(code)\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=EXAMPLE, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tests/test_train.py::test_train_step[c2]" in done.stdout
    seconds, torch = done.stdout.split("SECONDS ")[1].split(" TORCH ")
    assert torch.strip() == "False" and float(seconds) < 2.0


USER_TESTS = '''
import pytest

@pytest.mark.perf_ranks([1, 2])
@pytest.mark.parametrize("width", [64, 128])
def test_widths(perf_dist, perf_steps, width):
    pass

@pytest.mark.perf_ranks(4, device="cuda", timeout=30)
def test_on_gpus(perf_steps):
    pass

def test_plain():
    pass
'''


def _collected(pytester, *args):
    run = pytester.runpytest("--collect-only", "-q", *args)
    return [line for line in run.outlines if "::" in line]


def test_user_tests_are_parametrised_over_their_cells(pytester):
    pytester.makepyfile(test_mine=USER_TESTS)
    assert _collected(pytester) == [
        "test_mine.py::test_widths[c1-64]", "test_mine.py::test_widths[c1-128]",
        "test_mine.py::test_widths[c2-64]", "test_mine.py::test_widths[c2-128]",
        "test_mine.py::test_on_gpus[g4]", "test_mine.py::test_plain"]
    assert _collected(pytester, "--perf-tier", "gate") == [
        "test_mine.py::test_widths[g1-64]", "test_mine.py::test_widths[g1-128]",
        "test_mine.py::test_widths[g2-64]", "test_mine.py::test_widths[g2-128]",
        "test_mine.py::test_on_gpus[g4]", "test_mine.py::test_plain"]
    # a cell per test and parameters, chosen by id like a built-in cell
    assert _collected(pytester, "--perf-cell", "user/test_mine.py::test_widths[128]/c2") == [
        "test_mine.py::test_widths[c2-128]", "test_mine.py::test_plain"]
    from perfsuite.cells import select

    (gpu,) = select(ids=["user/test_mine.py::test_on_gpus/g4"])
    assert gpu.device == "cuda" and gpu.world_size == 4


def test_the_rank_fixtures_without_the_marker_are_a_collection_error(pytester):
    pytester.makepyfile("def test_forgot(perf_dist):\n    pass\n")
    run = pytester.runpytest("--collect-only")
    run.stdout.fnmatch_lines(["*perf_dist and perf_steps run in the ranks*@pytest.mark.perf_ranks(N)*"])
    assert run.ret == pytest.ExitCode.INTERRUPTED


def test_an_experiment_file_of_ones_own_parametrises_perf_tests_for_the_session(pytester):
    pytester.makepyprojecttoml('[tool.pytest.ini_options]\nperf_experiments = ["perf/mine.toml"]\n')
    (pytester.path / "perf").mkdir()
    (pytester.path / "perf" / "mine.toml").write_text(
        '[[experiment]]\nname = "batch sizes"\ntier = "smoke"\nworkload = "mymodel.train:run"\n'
        'axes = {world_size = [1, 2], batch_size = [16, 64]}\n')
    pytester.makepyfile(test_my_cells='''  # a name no module of the suite has
import pytest

@pytest.mark.perf(workload="mymodel.train:run")
def test_cell(perf_cell, perf_result):
    assert not perf_result["checks"] or True
''')
    assert _collected(pytester) == [f"test_my_cells.py::test_cell[smoke/mymodel.train:run/c{n}/fp32/batch_size={b}]"
                                    for n in (1, 2) for b in (16, 64)]
    from perfsuite import cells

    assert not cells.select(workload="mymodel.train:run")  # that session's, not this one's


@pytest.mark.parametrize("given", ['"x"', "0", "-5", "True", "float('nan')"])
def test_a_timeout_that_is_no_number_of_seconds_is_a_collection_error_naming_it(pytester, given):
    pytester.makepyfile(f"import pytest\n\n@pytest.mark.perf_ranks(1, timeout={given})\n"
                        "def test_slow(perf_steps):\n    pass\n")
    run = pytester.runpytest("--collect-only")
    text = run.stdout.str()
    assert run.ret != 0 and "Traceback" not in text and "INTERNALERROR" not in text
    assert "timeout=" in text and "a number of seconds (> 0)" in text


HELPERS = '''
import subprocess
import sys

import pytest

MARKER = {marker!r}
SLEEP = "import time; time.sleep(600)  # " + MARKER
STUBBORN = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "time.sleep(600)  # " + MARKER)


def leave_helpers():
    py = sys.executable
    subprocess.Popen([py, "-c", SLEEP, MARKER])
    subprocess.Popen([py, "-c", STUBBORN, MARKER])
    subprocess.Popen([py, "-c", "import subprocess, sys, time; subprocess.Popen([sys.executable, "
                      "'-c', sys.argv[1], sys.argv[2]]); time.sleep(600)", SLEEP, MARKER])
    subprocess.Popen([py, "-c", SLEEP, MARKER], start_new_session=True)


@pytest.mark.perf_ranks(1)
def test_passes(perf_dist, perf_steps):
    leave_helpers()
    for _ in perf_steps(range(6), warmup=1):
        pass


@pytest.mark.perf_ranks(1)
def test_fails(perf_dist, perf_steps):
    leave_helpers()
    assert perf_dist.world_size == 2, "this rank fails"
'''


@pytest.mark.slow
def test_helpers_a_test_leaves_behind_end_with_its_launch_passed_or_failed(pytester):
    import uuid

    marker = f"perfsuite-helper-{uuid.uuid4().hex}"
    pytester.makepyfile(test_helpers=HELPERS.format(marker=marker))
    out = pytester.path / "out"
    try:
        pytester.runpytest("--perf-out", str(out), "--perf-no-probe", "--perf-history", "off")
        cells = {c["id"].rsplit("::", 1)[1]: c for c in results.load(out)["cells"]}
        assert cells["test_passes/c1"]["status"] == "ok", cells["test_passes/c1"]["reason"]
        assert cells["test_fails/c1"]["status"] == "error"
        assert survivors(marker) == []  # a child, one deaf to SIGTERM, a grandchild, one in its own session
    finally:
        import os
        import signal

        for pid in survivors(marker):
            os.kill(pid, signal.SIGKILL)


PEER_SKIPS = '''
import pytest


@pytest.mark.perf_ranks(2, timeout=60)
def test_one_rank_skips(perf_dist, perf_steps):
    import torch
    import torch.distributed as dist

    if perf_dist.rank == 1:
        pytest.skip("rank 1 lacks the fused kernel")
    dist.all_reduce(torch.ones(4))  # rank 0 waits for a peer that is gone


@pytest.mark.perf_ranks(2, timeout=60)
def test_one_rank_skips_after_the_last_collective(perf_dist, perf_steps):
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.ones(4))
    if perf_dist.rank == 1:
        pytest.skip("rank 1 found nothing to compare")
'''


@pytest.mark.slow
def test_a_peer_that_skips_skips_the_cell_with_its_reason_not_a_lost_connection(pytester):
    pytester.makepyfile(test_peer=PEER_SKIPS)
    out = pytester.path / "out"
    run = pytester.runpytest("--perf-out", str(out), "--perf-no-probe", "--perf-history", "off", "-rs")
    cells = {c["id"].rsplit("::", 1)[1]: c for c in results.load(out)["cells"]}
    for test, reason in (("test_one_rank_skips/c2", "rank 1 lacks the fused kernel"),
                         ("test_one_rank_skips_after_the_last_collective/c2", "rank 1 found nothing to compare")):
        cell = cells[test]
        assert cell["status"] == "skipped", cell["reason"]
        assert cell["reason"].endswith(f"skipped: {reason}") and "onnection" not in cell["reason"]
    run.assert_outcomes(skipped=2)
