"""The gpu-sleep fault: a slowdown of device time alone, sized from the
steps measured before it, for acceptance runs of `perfsuite ab` on a GPU.

torch.cuda is simulated: a device clock that ``torch.cuda._sleep(cycles)``
advances at 1.8 GHz, CUDA events that read it, synchronisation that does
nothing. A real launch checks that a CPU cell refuses the kind.
"""

from __future__ import annotations

import pytest
import torch
from cellkit import tiny_image_cell

from perfsuite.launch.launch import LaunchOptions, run_cell
from perfsuite.rank import faults
from perfsuite.rank.faults import CALIBRATION_STEPS, Fault, GpuSleep

CUDA = torch.device("cuda", 0)
CLOCK_HZ = 1.8e9


class SimulatedCuda:
    """What the fault asks of torch.cuda, answered by a clock."""

    def __init__(self, monkeypatch, launch_s=5e-6):
        self.now, self.launch_s, self.sleeps, self.events = 0.0, launch_s, [], 0
        sim = self

        class Event:
            def __init__(self, enable_timing=False):
                assert enable_timing
                sim.events += 1
                self.at = None

            def record(self, stream=None):
                self.at = sim.now

            def synchronize(self):
                pass

            def elapsed_time(self, end):
                return (end.at - self.at) * 1e3

        def sleep(cycles):
            assert isinstance(cycles, int) and cycles > 0
            sim.sleeps.append(cycles)
            sim.now += self.launch_s + cycles / CLOCK_HZ

        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "_sleep", sleep)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)


@pytest.mark.parametrize("text, message", [
    ("gpu-sleep:*:5", "gpu-sleep:RANK:STEP:FRACTION"),
    ("gpu-sleep:*:5:0", "FRACTION above 0"),
    ("gpu-sleep:*:5:-0.1", "FRACTION above 0"),
    ("gpu-sleep:*:2:0.02", f"STEP of at least {CALIBRATION_STEPS}"),
    ("nap:*:5:0.02", "KIND in"),
])
def test_a_gpu_sleep_fault_is_given_in_full(text, message):
    with pytest.raises(ValueError, match=message):
        Fault.parse(text)
    assert Fault.parse("gpu-sleep:*:5:0.02") == Fault("gpu-sleep", "*", 5, 0.02)


def test_gpu_sleep_needs_a_cuda_cell():
    fault = Fault.parse("gpu-sleep:*:5:0.02")
    with pytest.raises(ValueError, match="needs a CUDA cell"):
        GpuSleep.for_rank(fault, 0, torch.device("cpu"))
    assert GpuSleep.for_rank(None, 0, torch.device("cpu")) is None
    assert GpuSleep.for_rank(Fault.parse("slow:*:0:0.1"), 0, torch.device("cpu")) is None


def test_the_sleep_is_its_fraction_of_the_median_step_before_it(monkeypatch):
    sim = SimulatedCuda(monkeypatch)
    fault = Fault.parse("gpu-sleep:*:5:0.02")
    sleeper = GpuSleep.for_rank(fault, 0, CUDA)
    steps = [0.9, 0.21, 0.2, 0.2, 0.22]  # the first: one-time set-up; median 0.21 s
    for step, seconds in enumerate(steps):
        assert faults.timed(fault, 0, step)  # measured (synchronised) to size the sleep
        sleeper.observe(step, seconds)
        sleeper.after_step(step)
    assert sim.sleeps == [] and sim.events == 0  # nothing added before STEP
    assert not faults.timed(fault, 0, 5)  # from STEP on: no synchronisation of its own
    sleeper.after_step(5)
    added = sim.sleeps[-1]
    assert added == pytest.approx(0.02 * 0.21 * CLOCK_HZ, rel=0.01)  # ~7.56 M cycles: 4.2 ms
    assert sleeper.step_s == pytest.approx(0.21)
    assert sleeper.cycles_per_s == pytest.approx(CLOCK_HZ, rel=0.01)
    calibrating = (len(sim.sleeps), sim.events)
    for step in (6, 7, 8):
        sleeper.after_step(step)
    assert sim.sleeps[calibrating[0]:] == [added] * 3 and sim.events == calibrating[1]  # sized once


def test_the_calibration_times_a_sleep_long_enough_to_outweigh_its_launch(monkeypatch):
    sim = SimulatedCuda(monkeypatch, launch_s=2e-4)  # a slow launch: 0.2 ms
    cycles_per_s = faults.calibrate_sleep(CUDA)
    assert cycles_per_s == pytest.approx(CLOCK_HZ, rel=0.02)
    assert max(sim.sleeps) / CLOCK_HZ >= faults.CALIBRATION_S


def test_a_gpu_sleep_fault_of_one_rank_leaves_the_others_alone(monkeypatch):
    sim = SimulatedCuda(monkeypatch)
    fault = Fault.parse("gpu-sleep:1:3:0.1")
    assert GpuSleep.for_rank(fault, 0, CUDA) is None
    assert not faults.timed(fault, 0, 0) and faults.timed(fault, 1, 0)
    sleeper = GpuSleep.for_rank(fault, 1, CUDA)
    for step in range(3):
        sleeper.observe(step, 0.1)
    sleeper.after_step(3)
    assert sim.sleeps[-1] == pytest.approx(0.1 * 0.1 * CLOCK_HZ, rel=0.01)


def test_other_faults_time_every_step_as_before():
    assert not faults.timed(None, 0, 0)
    for text in ("slow:*:0:0.1", "raise:1:3", "allreduce:*:0"):
        assert faults.timed(Fault.parse(text), 0, 0) and faults.timed(Fault.parse(text), 0, 50)


@pytest.mark.slow
def test_a_cpu_cell_launched_with_gpu_sleep_fails_and_says_why(tmp_path):
    cell = tiny_image_cell(world_size=1, max_steps=6, timeout_s=120)
    result = run_cell(cell, tmp_path, LaunchOptions(options={"fault": "gpu-sleep:*:3:0.02"}))
    assert result["status"] == "error" and "needs a CUDA cell" in result["reason"], result["reason"]
