"""The LLM cells' profiler: a window of steps, stepped on every rank that
has a capture (torch.profiler on rank 0 of a distributed recipe, nsys on
each rank)."""

from types import SimpleNamespace

import pytest
import torch

from perfsuite.cells import Cell
from perfsuite.profiling.torch_profile import PROFILE_DIR_ENV, PROFILER_ENV
from perfsuite.workloads import llm, llm_watch


def _cell(**changes):
    base = dict(tier="smoke", workload="llm", strategy="lora", device="cpu", world_size=2, precision="fp32",
                pin_memory=False, dataset="alpaca", batch_size=2, max_steps=60, warmup_steps=10, profile=True)
    return Cell(**{**base, **changes})


def _ctx(rank=0, **options):
    return SimpleNamespace(rank=rank, options=options)


@pytest.fixture
def torch_mode(monkeypatch, tmp_path):
    monkeypatch.setenv(PROFILER_ENV, "torch")
    monkeypatch.setenv(PROFILE_DIR_ENV, str(tmp_path))


def test_a_window_after_the_warm_up(torch_mode):
    prof = llm._step_profiler(_cell(), _ctx(), distributed=False)
    assert (prof.wait, prof.warmup, prof.active) == (9, 1, llm.PROFILED_STEPS)
    assert prof.trace_path.name == "rank0.trace.json.gz"
    assert llm._step_profiler(_cell(), _ctx(profile_steps="2"), distributed=False).active == 2
    assert llm._step_profiler(_cell(max_steps=12), _ctx(), distributed=False).active == 2  # the steps there are


def test_ranks_that_log_no_steps_profile_only_under_nsys(torch_mode, monkeypatch):
    assert llm._step_profiler(_cell(), _ctx(rank=1), distributed=True).mode == "off"
    assert llm._step_profiler(_cell(), _ctx(rank=0), distributed=True).mode == "torch"
    monkeypatch.setenv(PROFILER_ENV, "nsys")
    assert llm._step_profiler(_cell(), _ctx(rank=1), distributed=True).mode == "nsys"


def _train(steps):
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()


def test_a_rank_without_the_step_log_steps_with_its_optimizer(monkeypatch):
    """Under nsys a rank's capture opens and closes with its profiler's window
    (cudaProfilerStart/Stop): one that never steps would capture nothing."""
    monkeypatch.setenv(PROFILER_ENV, "nsys")
    prof = llm._step_profiler(_cell(warmup_steps=2), _ctx(rank=1), distributed=True)
    with prof, llm._profiler_steps(prof, distributed=True, rank=1):
        _train(5)
    assert prof.captured_steps == 3
    _train(2)  # the hook is gone with the block
    assert prof._steps_done == 5
    logged = llm._step_profiler(_cell(warmup_steps=2), _ctx(rank=0), distributed=True)
    with logged, llm._profiler_steps(logged, distributed=True, rank=0):
        _train(5)  # rank 0 steps with the recipe's log, not the optimizer
        for _ in range(4):
            for hook in llm_watch.STEP_HOOKS:
                hook()
    assert logged._steps_done == 4 and not llm_watch.STEP_HOOKS
