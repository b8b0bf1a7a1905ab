"""Two resident sides on one GPU: the memory plan before a cell, the ranks'
release of their cache while parked, the coordinator's look at the first
side's memory before the second comes up.

No GPU here: torch.cuda answers as an 80 GB H100 would (its total memory as
torch reported it on the machine of tests/data/h100-2026-11-26), and the
fp64 500 px cell's recorded peak is the baselines' 56.4 GB.
"""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from perfsuite.ab import resident
from perfsuite.ab import session as ab
from perfsuite.ab.resident import (
    CONTEXT_BYTES,
    LAUNCH_ROUNDS,
    RELEASE,
    RESIDENT,
    Coordinator,
    PairRun,
    choose_plan,
    plan_memory,
)
from perfsuite.cells import get
from perfsuite.launch.launch import LaunchOptions
from perfsuite.rank import windows as rank_windows
from perfsuite.rank.windows import RELEASE_ENV, SIDE_ENV, Windows

DATA = Path(__file__).resolve().parents[1] / "data" / "h100-2026-11-26"
H100_TOTAL = 85520809984  # torch's total_memory of an H100 80GB HBM3
FP64_PEAK = 56434360320  # peak_mem_reserved of the fp64 cell: baselines/h100-80gb-hbm3-80gb-x1
FP64 = "gate/image/ddp-ds/g1/fp64/px500/nopin/nchw"
FP32 = "gate/image/ddp-ds/g1/fp32/px500/nopin/nchw"
GB = 1e9


@pytest.fixture
def h100(monkeypatch):
    """torch.cuda and the machine's fingerprint as on one 80 GB H100; the project's baselines."""
    env = json.loads((DATA / "gate-px500-g1.results.json").read_text())["env"]
    device = SimpleNamespace(total=H100_TOTAL)
    monkeypatch.setattr("perfsuite.hardware.fingerprint", lambda: env)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace(
        name="NVIDIA H100 80GB HBM3", total_memory=device.total))
    monkeypatch.delenv("PERFSUITE_BASELINES", raising=False)
    return device


def test_the_fp64_cell_releases_while_parked_on_an_80_gb_h100(h100):
    plan = plan_memory(get(FP64), LaunchOptions())
    assert plan.plan == RELEASE and plan.peak_reserved == FP64_PEAK and plan.device_total == H100_TOTAL
    assert "h100-80gb-hbm3-80gb-x1" in plan.source
    assert "113" in plan.reason or "115" in plan.reason  # two sides at their peak: more than the device
    assert plan.to_dict()["plan"] == "resident-release"


def test_the_fp32_cell_fits_twice_and_stays_plainly_resident(h100):
    plan = plan_memory(get(FP32), LaunchOptions())
    assert plan.plan == RESIDENT and plan.peak_reserved == pytest.approx(28.27 * GB, rel=1e-3)


def test_a_cell_that_fits_once_only_is_run_in_launch_rounds():
    plan = choose_plan(70 * GB, 80 * GB, "recorded")
    assert plan.plan == LAUNCH_ROUNDS and "one at a time" in plan.reason
    assert choose_plan(56.4 * GB, 60 * GB, "recorded").plan == LAUNCH_ROUNDS
    # what a parked side was measured to hold decides where it is known
    assert choose_plan(56.4 * GB, 70 * GB, "recorded", parked=0.2 * GB).plan == RELEASE
    assert choose_plan(56.4 * GB, 70 * GB, "recorded").plan == LAUNCH_ROUNDS  # a quarter of 56.4 assumed


def test_without_a_recorded_peak_the_first_sides_warm_up_measures_it(h100, tmp_path, monkeypatch):
    (tmp_path / "none").mkdir()
    monkeypatch.setenv("PERFSUITE_BASELINES", str(tmp_path / "none"))
    plan = plan_memory(get(FP64), LaunchOptions())
    assert plan.plan == RELEASE and plan.peak_reserved is None and plan.device_total == H100_TOTAL
    assert "warm-up" in plan.reason and "no comparable baseline" in plan.source


def test_a_cpu_cell_has_no_memory_to_plan():
    plan = plan_memory(get("smoke/image/ddp-ds/c1/fp32/px32/nopin/nchw"), None)
    assert plan is None


# -- the session's choice, with launch pairs and launches stood in for --------------------

def _ok(cell, directory, peak=None):
    metrics = {"step_time": {"value": 0.35, "unit": "s", "samples": [0.35] * 8}}
    return {"id": cell.id, "params": cell.params(), "env": {"gpu_count": 1}, "checks": [], "ranks": [],
            "status": "ok", "reason": None, "duration_s": 1.0, "dir": str(directory), "metrics": metrics}


class FakePairs:
    """run_pair's stand-in: the keywords each pair got; ``short`` at pair
    ``short_at``; each side's ranks report ``peak`` reserved and ``parked`` held."""

    def __init__(self, short_at=None, peak=FP64_PEAK, parked=0.3 * GB):
        self.calls, self.short_at, self.peak, self.parked = [], short_at, peak, parked

    def __call__(self, cell, opts, dirs, *, quads, window_steps, first, **kwargs):
        self.calls.append(kwargs)
        memory = {s: [{"peak_reserved": self.peak, "reserved": self.parked, "free": H100_TOTAL - self.parked,
                       "total": H100_TOTAL, "released": bool(kwargs.get("release"))}] for s in "AB"}
        if len(self.calls) == self.short_at:
            return PairRun({first: _ok(cell, dirs[first])}, [], 2.0, "memory: not enough", memory={first: memory[first]},
                           short="side B needs ~57.5 GB and 28.0 GB are free")
        windows = [{"side": s, "value": 0.35 * (1 + 0.001 * math.sin(i)), "steps": [], "settling": q == 0}
                   for q in range(quads + 1) for i, s in enumerate("ABBA")]
        return PairRun({s: _ok(cell, dirs[s]) for s in "AB"}, windows, 1.0, memory=memory)


def _session(tmp_path, cell_id, lines, **settings):
    sides = [ab.Side("A", sys.executable), ab.Side("B", sys.executable)]
    return ab.ABSession([get(cell_id)], *sides, tmp_path, log=lines.append, quads=4, max_pairs=2,
                        **settings)


def test_the_session_says_its_plan_and_parks_the_fp64_cells_sides_with_their_cache_released(
        h100, tmp_path, monkeypatch):
    pairs = FakePairs()
    monkeypatch.setattr("perfsuite.ab.session.run_pair", pairs)
    lines = []
    _session(tmp_path, FP64, lines).run()
    record = json.loads((tmp_path / "ab.json").read_text())["cells"][0]
    assert record["mode"] == "resident" and [c["release"] for c in pairs.calls] == [True, True]
    assert all(c["need_bytes"] == FP64_PEAK + CONTEXT_BYTES for c in pairs.calls)
    memory = record["memory"]
    assert (memory["plan"], memory["peak_reserved"], memory["device_total"]) == (
        "resident-release", FP64_PEAK, H100_TOTAL)
    assert "h100-80gb-hbm3-80gb-x1" in memory["source"] and memory["reason"]
    assert record["pairs"][0]["memory"]["A"]["peak_reserved"] == FP64_PEAK
    said = next(line for line in lines if "memory plan:" in line)
    assert said.startswith("  memory plan: resident-release") and "56.4 GB" in said and "85.5 GB" in said


def test_the_fp32_cell_is_plainly_resident(h100, tmp_path, monkeypatch):
    pairs = FakePairs(peak=28.3 * GB)
    monkeypatch.setattr("perfsuite.ab.session.run_pair", pairs)
    lines = []
    _session(tmp_path, FP32, lines).run()
    assert [c["release"] for c in pairs.calls] == [False, False]
    assert json.loads((tmp_path / "ab.json").read_text())["cells"][0]["memory"]["plan"] == "resident"
    assert any(line.startswith("  memory plan: resident (") for line in lines)


def test_a_device_too_small_for_two_sides_runs_the_cell_in_launch_rounds(h100, tmp_path, monkeypatch):
    h100.total = 60 * 10**9
    monkeypatch.setattr("perfsuite.ab.session.run_pair", lambda *a, **kw: pytest.fail("resident"))
    launched = []
    monkeypatch.setattr("perfsuite.ab.session.run_cell", lambda cell, d, o: launched.append(d) or _ok(cell, d))
    lines = []
    _session(tmp_path, FP64, lines, max_launches=4).run()
    record = json.loads((tmp_path / "ab.json").read_text())["cells"][0]
    assert record["mode"] == "launches" and record["memory"]["plan"] == "launch-rounds"
    assert record["mode_reason"].startswith("memory: ") and len(launched) == 8
    assert any(line.startswith("  memory plan: launch-rounds") for line in lines)


def test_resident_mode_asked_for_a_cell_that_does_not_fit_is_an_error(h100, tmp_path, monkeypatch):
    h100.total = 60 * 10**9
    monkeypatch.setattr("perfsuite.ab.session.run_pair", lambda *a, **kw: pytest.fail("resident"))
    _session(tmp_path, FP64, [], mode="resident").run()
    record = json.loads((tmp_path / "ab.json").read_text())["cells"][0]
    assert record["verdict"] == "error" and record["reason"].startswith("--mode resident: memory: ")


def test_a_first_side_that_leaves_too_little_free_turns_the_cell_to_launch_rounds(
        h100, tmp_path, monkeypatch):
    monkeypatch.setattr("perfsuite.ab.session.run_pair", FakePairs(short_at=1))
    launched = []
    monkeypatch.setattr("perfsuite.ab.session.run_cell", lambda cell, d, o: launched.append(d) or _ok(cell, d))
    lines = []
    _session(tmp_path, FP64, lines, max_launches=4).run()
    record = json.loads((tmp_path / "ab.json").read_text())["cells"][0]
    assert record["mode"] == "launches" and record["memory"]["plan"] == "launch-rounds"
    assert "pair 1" in record["memory"]["source"] and "28.0 GB are free" in record["memory"]["reason"]
    assert len(launched) == 8 and record["pairs"] == [] and record["n_a"] == record["n_b"] == 4
    assert any("memory plan: launch-rounds" in line for line in lines)


def test_a_peak_measured_in_the_first_pair_plans_the_next(h100, tmp_path, monkeypatch):
    (tmp_path / "none").mkdir()
    monkeypatch.setenv("PERFSUITE_BASELINES", str(tmp_path / "none"))
    pairs = FakePairs(peak=20 * GB)
    monkeypatch.setattr("perfsuite.ab.session.run_pair", pairs)
    lines = []
    _session(tmp_path / "out", FP64, lines).run()
    assert [(c["release"], c["need_bytes"]) for c in pairs.calls] == [
        (True, None), (False, 20 * GB + CONTEXT_BYTES)]
    memory = json.loads((tmp_path / "out" / "ab.json").read_text())["cells"][0]["memory"]
    assert memory["plan"] == "resident" and memory["peak_reserved"] == 20 * GB
    assert "pair 1" in memory["source"]
    assert any(line.startswith("  memory plan: resident (") for line in lines)


# -- the ranks' side: release when parked, ready after the warm-up -------------------------

class SimulatedCudaMemory:
    """torch.cuda's memory calls for a rank on an 80 GB device, recorded in order."""

    def __init__(self, monkeypatch):
        self.calls = []
        self.reserved = FP64_PEAK
        sim = self

        class Event:
            def __init__(self, enable_timing=False):
                self.at = 0.0

            def record(self, stream=None):
                self.at = time.perf_counter()

            def synchronize(self):
                pass

            def elapsed_time(self, end):
                return (end.at - self.at) * 1e3

        def empty_cache():
            sim.calls.append("empty_cache")
            sim.reserved = int(0.2 * GB)

        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
        monkeypatch.setattr(torch.cuda, "empty_cache", empty_cache)
        monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: sim.reserved)
        monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: FP64_PEAK)
        monkeypatch.setattr(torch.cuda, "mem_get_info",
                            lambda device=None: (H100_TOTAL - sim.reserved - CONTEXT_BYTES, H100_TOTAL))


def _serve_one_window(coordinator, env, steps_run, device, warmed):
    def rank():
        windows = Windows.from_env(0, 1, env)
        warmed.wait(30)  # the warm-up
        try:
            windows.serve(lambda: steps_run.append(1), device)
        finally:
            windows.close()

    thread = threading.Thread(target=rank, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("release", [True, False])
def test_a_parked_rank_releases_its_cache_before_it_replies_and_wakes_with_an_untimed_step(
        monkeypatch, release):
    sim = SimulatedCudaMemory(monkeypatch)
    coordinator = Coordinator()
    steps_run, warmed = [], threading.Event()
    env = {**coordinator.env("A"), **({RELEASE_ENV: "1"} if release else {})}
    thread = _serve_one_window(coordinator, env, steps_run, torch.device("cuda", 0), warmed)
    try:
        with pytest.raises(resident.ResidentError, match="not ready"):  # connected, warming up
            coordinator.wait_ready(lambda side: True, 0.6, ("A",))
        assert not coordinator.ready("A")
        warmed.set()
        coordinator.wait_ready(lambda side: True, 30, ("A",))
        ready = coordinator.memory["A"][0]
        assert ready["released"] is release and ready["peak_reserved"] == FP64_PEAK
        assert ready["reserved"] == (int(0.2 * GB) if release else FP64_PEAK)
        (times,) = coordinator.window("A", 3, timeout_s=30)
        after = coordinator.memory["A"][0]
        coordinator.stop()
        thread.join(30)
    finally:
        coordinator.close()
    assert len(times) == 3 and len(steps_run) == (4 if release else 3)  # one step after waking, untimed
    assert sim.calls == (["empty_cache"] * 2 if release else [])  # parked twice: after the warm-up, the window
    assert after["free"] == H100_TOTAL - after["reserved"] - CONTEXT_BYTES


def test_the_second_side_is_not_started_where_the_first_leaves_too_little(tmp_path, monkeypatch):
    """The first side's ranks say what they hold once warmed up and parked;
    where the second side's peak would not fit in what is free, it is not
    launched, and the first side's launch ends as usual."""
    free = {"A": 20 * GB}
    monkeypatch.setattr(rank_windows, "parked_memory", lambda device, release: {"memory": {
        "peak_reserved": FP64_PEAK, "reserved": FP64_PEAK, "free": free["A"], "total": H100_TOTAL,
        "released": release}})
    launched = []

    def fake_run_cell(cell, directory, opts):
        launched.append(opts.env[SIDE_ENV])
        windows = Windows.from_env(0, 1, opts.env)
        try:
            windows.serve(lambda: time.sleep(0.001), torch.device("cpu"))
        finally:
            windows.close()
        return _ok(cell, directory)

    monkeypatch.setattr(resident, "run_cell", fake_run_cell)
    cell = get(FP64)
    opts = {side: LaunchOptions(timeout_s=60) for side in "AB"}
    run = resident.run_pair(cell, opts, {s: tmp_path / s for s in "AB"}, quads=2, window_steps=1,
                            first="A", release=True, need_bytes=FP64_PEAK + CONTEXT_BYTES)
    assert launched == ["A"] and run.results["A"]["status"] == "ok" and "B" not in run.results
    assert run.short and "20.0 GB" in run.short and "57.5 GB" in run.short and run.windows == []
    free["A"] = 80 * GB
    launched.clear()
    run = resident.run_pair(cell, opts, {s: tmp_path / s for s in "AB"}, quads=2, window_steps=1,
                            first="B", release=True)  # no recorded need: the first side's measured peak
    assert launched == ["B", "A"] and run.short is None and run.error is None
    assert run.memory["A"][0]["peak_reserved"] == FP64_PEAK and len(run.windows) == 12


@pytest.mark.parametrize("release", [True, False])
def test_sides_that_release_end_their_launches_one_at_a_time(tmp_path, monkeypatch, release):
    """After the windows a launch trains again (its work counters) and
    evaluates: two sides that fit only one at a time end one at a time."""
    events = []

    def fake_run_cell(cell, directory, opts):
        side = opts.env[SIDE_ENV]
        assert (opts.env.get(RELEASE_ENV) == "1") is release
        windows = Windows.from_env(0, 1, opts.env)
        try:
            windows.serve(lambda: None, torch.device("cpu"))
        finally:
            windows.close()
        events.append(("stopped", side))
        time.sleep(0.3)  # counters, accuracy
        events.append(("ended", side))
        return _ok(cell, directory)

    monkeypatch.setattr(resident, "run_cell", fake_run_cell)
    opts = {side: LaunchOptions(timeout_s=60) for side in "AB"}
    run = resident.run_pair(get(FP64), opts, {s: tmp_path / s for s in "AB"}, quads=1, window_steps=1,
                            first="B", release=release)
    assert run.error is None and len(run.windows) == 8
    if release:
        assert events == [("stopped", "B"), ("ended", "B"), ("stopped", "A"), ("ended", "A")]
    else:
        assert {e for e, _ in events[:2]} == {"stopped"}
