"""Fixtures shared by the unit tests: launches stood in for by a fake
``run_cell`` whose launches scatter in level (as identical launches do on a
shared machine) and slow down by the injected ``slow`` fault; the real launch
path has its own tests."""

import math

import numpy as np
import pytest
import sqlalchemy  # noqa: F401 - before pytester's in-process perf runs: see tests/plugin/conftest.py

from perfsuite.launch.launch import LaunchOptions

CPU_ENV = {"cpu_model": "AMD EPYC 9334", "cpu_cores": 2, "gpu_count": 0}


class FakeLaunches:
    """run_cell's stand-in: records each launch's directory and options."""

    def __init__(self, seed=0, launch_sigma=0.01, level=0.1):
        self.rng = np.random.default_rng(seed)
        self.launch_sigma, self.level = launch_sigma, level
        self.calls = []

    def __call__(self, cell, out_dir, opts=None):
        opts = opts or LaunchOptions()
        self.calls.append((cell.id, out_dir, dict(opts.options)))
        fault = opts.options.get("fault", "")
        slow = float(fault.split(":")[3]) if fault.startswith("slow") else 0.0
        level = self.level * math.exp(self.rng.normal(0, self.launch_sigma)) * (1 + slow)
        samples = list(self.rng.lognormal(math.log(level), 0.01, 20))
        return {"id": cell.id, "params": cell.params(), "status": "ok", "reason": None,
                "env": CPU_ENV, "duration_s": 1.0, "checks": [], "ranks": [],
                "metrics": {"step_time": {"value": float(np.median(samples)), "unit": "s",
                                          "samples": samples},
                            "throughput": {"value": 16 / level, "unit": "images/s"}}}


def no_baselines(tmp_path):
    """An empty baselines root: nothing to compare with."""
    (tmp_path / "none").mkdir(exist_ok=True)
    return tmp_path / "none"


@pytest.fixture
def fake(monkeypatch):
    launches = FakeLaunches()
    monkeypatch.setattr("perfsuite.launch.launch.run_cell", launches)
    monkeypatch.setattr("perfsuite.selftest.detection.run_cell", launches)
    return launches


def judge_at_looks(quads_by_pair, firsts, tolerance, resident):
    """A stored resident session judged again as it was judged: the looks,
    confidence and pairs' errors its settings name (``recorded_looks``,
    ``recorded_within``), up to the session's
    last pair; each look's comparison, in order."""
    from perfsuite.ab.settings import MIN_PAIRS
    from perfsuite.ab.verdicts import recorded_looks, recorded_within
    from perfsuite.stats.windows import compare_windows

    looks, confidence = recorded_looks(resident)
    return [compare_windows(quads_by_pair[:k], tolerance, confidence, min_pairs=MIN_PAIRS, firsts=firsts[:k],
                            within=recorded_within(resident))
            for k in looks if k <= len(quads_by_pair)]
