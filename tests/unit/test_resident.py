"""Resident A/B: the coordinator and the ranks' windows, over a real Unix socket.

The ranks here are threads running perfsuite.rank.windows' own client with
a step that sleeps; the launches themselves are tested in test_ab.py.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from perfsuite.ab.resident import Coordinator, ResidentError, resident_refusal, step_times_of
from perfsuite.cells import get
from perfsuite.launch.launch import LaunchOptions
from perfsuite.launch.multinode import Nodes
from perfsuite.rank.windows import SIDE_ENV, SOCKET_ENV, Windows, WindowsLost
from perfsuite.stats.windows import ORDER, quad_log_ratios, window_value

CPU = torch.device("cpu")


def start_ranks(coordinator, side, world, step_s, served):
    def rank(r):
        windows = Windows.from_env(r, world, coordinator.env(side))
        try:
            served[(side, r)] = windows.serve(lambda: time.sleep(step_s), CPU)
        except WindowsLost as err:
            served[(side, r)] = err
        finally:
            windows.close()

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    return threads


def test_windows_alternate_and_each_side_measures_its_own_steps():
    coordinator = Coordinator()
    served = {}
    try:
        threads = start_ranks(coordinator, "A", 2, 0.004, served) + start_ranks(coordinator, "B", 2, 0.008, served)
        coordinator.wait_ready(lambda side: True, timeout_s=30)
        windows = []
        for _ in range(2):
            for side in ORDER:
                per_rank = coordinator.window(side, 3, timeout_s=30)
                assert len(per_rank) == 2 and all(len(times) == 3 for times in per_rank)
                windows.append((side, window_value(step_times_of(per_rank))))
        coordinator.stop()
        for t in threads:
            t.join(30)
    finally:
        coordinator.close()
    ratios = [2.718281828 ** d for d in quad_log_ratios(windows)]
    assert all(1.4 < r < 2.6 for r in ratios), ratios  # B sleeps twice as long a step
    assert {key: len(times) for key, times in served.items()} == {
        ("A", 0): 12, ("A", 1): 12, ("B", 0): 12, ("B", 1): 12}  # 2 quads, 2 windows a side, 3 steps


@pytest.mark.parametrize("pattern,calls,kept", [
    # every third step other work (an epoch's first or partial batch): run, not timed
    ((True, True, False), 4, 3),
    # nothing but epoch boundaries: the window stops at 3x its steps and every step counts
    ((False,), 9, 9),
])
def test_a_window_times_the_cells_own_steps_and_runs_others_in_their_place(pattern, calls, kept):
    coordinator = Coordinator()
    served, ran = {}, []

    def step():
        ran.append(1)
        return pattern[(len(ran) - 1) % len(pattern)]

    def rank():
        windows = Windows.from_env(0, 1, coordinator.env("A"))
        try:
            served["A"] = windows.serve(step, CPU)
        finally:
            windows.close()

    thread = threading.Thread(target=rank, daemon=True)
    thread.start()
    try:
        coordinator.wait_ready(lambda side: True, timeout_s=30, sides=("A",))
        (times,) = coordinator.window("A", 3, timeout_s=30)
        coordinator.stop()
        thread.join(30)
    finally:
        coordinator.close()
    assert (len(ran), len(times), len(served["A"])) == (calls, kept, kept)


def test_a_launch_that_ends_before_its_ranks_are_ready_is_named():
    coordinator = Coordinator()
    try:
        with pytest.raises(ResidentError, match="side A's launch ended"):
            coordinator.wait_ready(lambda side: side != "A", timeout_s=30)
    finally:
        coordinator.close()


def test_ranks_end_when_the_coordinator_goes_away():
    coordinator = Coordinator()
    served = {}
    threads = start_ranks(coordinator, "A", 1, 0.001, served) + start_ranks(coordinator, "B", 1, 0.001, served)
    coordinator.wait_ready(lambda side: True, timeout_s=30)
    coordinator.close()  # as on Ctrl-C
    for t in threads:
        t.join(30)
    assert all(isinstance(v, WindowsLost) for v in served.values()) and len(served) == 2


def test_a_rank_that_goes_away_during_a_window_is_an_error():
    coordinator = Coordinator()
    try:
        def vanishing():
            windows = Windows.from_env(0, 1, coordinator.env("A"))
            windows.next_window()
            windows.close()  # gone without its times

        threading.Thread(target=vanishing, daemon=True).start()
        start_ranks(coordinator, "B", 1, 0.001, {})
        coordinator.wait_ready(lambda side: True, timeout_s=30)
        with pytest.raises(ResidentError, match="side A"):
            coordinator.window("A", 2, timeout_s=30)
    finally:
        coordinator.stop()
        coordinator.close()


def test_no_socket_in_the_environment_means_no_windows(tmp_path):
    assert Windows.from_env(0, 1, {}) is None
    gone = str(tmp_path / "gone.sock")
    with pytest.raises(WindowsLost, match="gone.sock"):
        Windows.from_env(0, 1, {SOCKET_ENV: gone, SIDE_ENV: "A"})


def test_which_cells_can_be_resident():
    image = get("smoke/image/ddp-ds/c1/fp32/px32/nopin/nchw")
    assert resident_refusal(image, None) is None
    llm = get("smoke/llm/lora/alpaca/c1/fp32/nopin")
    assert "llm workload" in resident_refusal(llm, None)
    assert "across nodes" in resident_refusal(image, LaunchOptions(nodes=Nodes(nnodes=2)))
    assert "profiled" in resident_refusal(image, LaunchOptions(profiler="torch"))


def test_the_first_quad_of_a_pair_settles_and_is_not_judged(tmp_path, monkeypatch):
    """Just after both sides are ready one of them still settles (on an H200,
    side A's first window ran 1.3-2.3x slower while side B's DataLoader
    workers filled their queues): the pair's first quad is run and kept,
    marked settling, and its windows are left out of the verdict."""
    from perfsuite.ab import resident

    first = {"A": True}

    def fake_run_cell(cell, directory, opts):
        windows = Windows.from_env(0, 1, opts.env)

        def step():
            slow = first.get(opts.env[SIDE_ENV])
            time.sleep(0.06 if slow else 0.004)  # 15x: a loaded machine stretches the 4 ms

        measured = []
        # Windows.serve's loop, by hand: only side A's first window is slow
        while (n := windows.next_window()) > 0:
            times = []
            for _ in range(n):
                began = time.perf_counter()
                step()
                times.append(time.perf_counter() - began)
            first.pop(opts.env[SIDE_ENV], None)
            windows._send({"times": times})
            measured += times
        windows.close()
        return {"status": "ok", "steps": len(measured)}

    monkeypatch.setattr(resident, "run_cell", fake_run_cell)
    cell = get("smoke/image/ddp-ds/c1/fp32/px32/nopin/nchw")
    opts = {side: LaunchOptions(timeout_s=60) for side in "AB"}
    run = resident.run_pair(cell, opts, {s: tmp_path / s for s in "AB"}, quads=3, window_steps=3)
    assert run.error is None and [w.get("settling", False) for w in run.windows] == [True] * 4 + [False] * 12
    assert run.windows[0]["value"] > 3 * run.windows[4]["value"]  # side A's settling window, slow
    judged = resident.judged(run.windows)
    ratios = [2.718281828 ** d for d in quad_log_ratios([(w["side"], w["value"]) for w in judged])]
    assert len(ratios) == 3 and all(0.5 < r < 2.0 for r in ratios), ratios
    with_settling = quad_log_ratios([(w["side"], w["value"]) for w in run.windows])
    assert 2.718281828 ** with_settling[0] < 0.5  # what judging it would have said: B "faster"


@pytest.mark.parametrize("first", ["A", "B"])
def test_the_side_named_first_is_launched_first_and_windows_stay_abba(tmp_path, monkeypatch, first):
    """An A/B session alternates which side's launch comes up first (the
    second comes up beside a resident first one); the windows' order does not
    change with it."""
    from perfsuite.ab import resident

    launched = []

    def fake_run_cell(cell, directory, opts):
        launched.append(opts.env[SIDE_ENV])
        windows = Windows.from_env(0, 1, opts.env)
        while (n := windows.next_window()) > 0:
            windows._send({"times": [0.001] * n})
        windows.close()
        return {"status": "ok", "steps": 0}

    monkeypatch.setattr(resident, "run_cell", fake_run_cell)
    cell = get("smoke/image/ddp-ds/c1/fp32/px32/nopin/nchw")
    opts = {side: LaunchOptions(timeout_s=60) for side in "AB"}
    run = resident.run_pair(cell, opts, {s: tmp_path / s for s in "AB"}, quads=2, window_steps=1,
                            first=first)
    assert run.error is None and launched == [first, "B" if first == "A" else "A"]
    assert "".join(w["side"] for w in run.windows) == "ABBA" * 3
