"""Work counters in the rank: the dispatch mode, FLOPs, collectives, copies
(the CUDA path, simulated: test_counting_cuda.py)."""

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from perfsuite.rank import counting


def small_step():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    images, labels = torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))

    def step():
        loss = nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    step()  # AdamW's state is made on the first step
    return model, step


def test_a_steady_step_counts_the_same_every_time_and_its_flops_match_flop_counter_mode():
    _, step = small_step()
    window = counting.count_window(step, torch.device("cpu"), steps=3)
    per_step = window["per_step"]
    assert window["window_steps"] == 3 and window["unstable"] == []
    assert per_step["ops/aten::convolution"] == 1 and per_step["ops/aten::addmm"] == 1
    assert per_step["ops/aten::convolution_backward"] == 1
    with FlopCounterMode(display=False) as reference:
        step()
    assert per_step["flops"] == reference.get_total_flops() > 0
    assert not any(k.startswith(("collectives/", "copies/", "cuda/")) for k in per_step)


def test_a_count_that_moves_between_steps_is_named_unstable():
    calls = iter(range(10))

    def step():
        for _ in range(next(calls)):  # one more add every step
            torch.ones(2) + 1

    window = counting.count_window(step, torch.device("cpu"), steps=3)
    assert "ops/aten::add" in window["unstable"] and window["per_step"]["ops/aten::add"] == 1


def test_copies_between_host_and_a_device_are_counted_with_their_bytes():
    host = torch.ones(16, dtype=torch.float32)
    counter = counting.WorkCounter()
    with counter:
        on_device = host.to("meta")  # a device other than the host, on any machine
        back = torch.empty(16, device="meta")
        back.copy_(host)
        host.clone()
    assert counter.counts["copies/h2d_calls"] == 2 and counter.counts["copies/h2d_bytes"] == 128
    assert on_device.device.type == "meta" and "copies/d2h_calls" not in counter.counts


@pytest.fixture
def one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_collectives_are_counted_with_the_bytes_they_send(one_rank_group):
    counter = counting.WorkCounter()
    with counter:
        dist.all_reduce(torch.ones(4))
        dist.all_reduce(torch.ones(8, dtype=torch.float64))
        dist.broadcast(torch.ones(3), src=0)
    assert counter.counts["collectives/allreduce/calls"] == 2
    assert counter.counts["collectives/allreduce/bytes"] == 16 + 64
    assert counter.counts["collectives/broadcast/bytes"] == 12
    assert counter.counts["ops/c10d::allreduce_"] == 2


def test_cuda_runtime_calls_are_read_from_the_profilers_events():
    events = [("cudaLaunchKernel", 120), ("cudaLaunchKernelExC", 3), ("cudaMemcpyAsync", 4),
              ("cudaMemsetAsync", 2), ("cudaStreamSynchronize", 1), ("aten::add", 50)]
    counts = counting.cuda_api_counts(events)
    assert counts["cuda/kernel_launches"] == 123 and counts["cuda/memcpy_calls"] == 4
    assert counts["cuda/memset_calls"] == 2 and counts["cuda/syncs/cudaStreamSynchronize"] == 1
    assert counts["cuda/syncs/cudaDeviceSynchronize"] == 0  # named even when none was made


@pytest.mark.slow
def test_a_real_launch_with_one_extra_allreduce_per_step_fails_against_the_unchanged_one(tmp_path):
    """Two real 2-rank launches: the counters of one judge the other, which
    does one extra 16-byte all-reduce per step (the ``allreduce`` fault)."""
    from cellkit import tiny_image_cell

    from perfsuite.judge.checks import WorkCountersUnchanged
    from perfsuite.judge.comparing import compare_runs
    from perfsuite.launch.launch import LaunchOptions, run_cell

    cell = tiny_image_cell()
    unchanged = run_cell(cell, tmp_path / "a", LaunchOptions())
    extra = run_cell(cell, tmp_path / "b", LaunchOptions(options={"fault": "allreduce:*:0"}))
    assert unchanged["status"] == extra["status"] == "ok", (unchanged["reason"], extra["reason"])
    counted = unchanged["counters"]
    assert counted["ranks"] == 2 and counted["window_steps"] == counting.DEFAULT_WINDOW_STEPS
    assert counted["per_step"]["collectives/allreduce/calls"] == 4  # 2 DDP buckets x 2 ranks
    assert counted["unstable"] == [] and counted["per_step"]["flops"] > 0
    assert "accuracy" not in unchanged["metrics"]  # no target: no evaluation
    results = [{"schema": "perfsuite.results/1", "env": r["env"], "cells": [r]}
               for r in (unchanged, extra)]
    check = next(v for v in compare_runs(*results) if v["name"] == WorkCountersUnchanged.name)
    assert check["verdict"] == "fail"
    assert "c10d allreduce per step 4 -> 6 (+32 B)" in check["message"], check["message"]


def test_a_loop_that_is_not_ours_is_counted_between_optimizer_steps():
    """torchtune's recipes run their own loop: the window opens after the
    ``start``-th optimizer step and counts each later one on its own."""
    model, step = small_step()
    with counting.OptimizerStepWindow(start=2, steps=2, device=torch.device("cpu")) as window:
        for _ in range(6):  # 2 before the window, 2 counted, 2 after
            step()
    counted = window.result()
    assert counted["window_steps"] == 2 and counted["unstable"] == []
    reference = counting.count_window(step, torch.device("cpu"), steps=1)["per_step"]
    assert counted["per_step"] == reference
    with counting.OptimizerStepWindow(start=5, steps=2, device=torch.device("cpu")) as short:
        for _ in range(5):  # the loop ends before a window step completes
            step()
    assert short.result() is None
