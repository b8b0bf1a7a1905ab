"""Re-measuring an undecided cell never makes its launches longer.

The runner once re-measured an ``unknown`` step-time verdict with twice the
epochs (or steps) per round, 20 -> 40 -> 80, under the cell's unchanged
timeout: a full-tier Llama3-8B cell (one epoch of alpaca-cleaned in hours,
``timeout_s`` 12 h) then ended as a timeout instead of a verdict. Today more
launches are what an undecided verdict gets (``REMEASURE_ROUNDS``,
``judge.needs_more_launches``), each one the cell as the experiment data
defines it; a single launch is not re-measured at all. These tests hold
that: the launches are the fake ones of conftest.py, the verdict is forced
to ``unknown``.
"""

import pytest

from perfsuite import cells
from perfsuite.launch.launch import LaunchOptions
from perfsuite.runner import REMEASURE_ROUNDS, Runner
from tests.unit.conftest import FakeLaunches, no_baselines

CELL_ID = "full/llm/lora/alpaca/g1/fp32/nopin"  # Table 5: one whole epoch, 12 h timeout


class RecordingLaunches(FakeLaunches):
    """The fake launches, also keeping each launch's cell and its timeout."""

    def __init__(self):
        super().__init__()
        self.launched = []

    def __call__(self, cell, out_dir, opts=None):
        opts = opts or LaunchOptions()
        self.launched.append((cell, opts.timeout_s or cell.timeout_s))  # as launch.run_cell
        return super().__call__(cell, out_dir, opts)


@pytest.fixture
def undecided(monkeypatch):
    """Every step-time verdict ``unknown``: the runner's cue to measure more."""
    launches = RecordingLaunches()
    monkeypatch.setattr("perfsuite.launch.launch.run_cell", launches)

    def judge(cell, result, twin_of=None, sets=None, assessment=None):
        return [{"name": "step_time", "metric": "step_time", "verdict": "unknown",
                 "observed": None, "expected": None, "message": "forced unknown"}]

    monkeypatch.setattr("perfsuite.judge.judging.judge", judge)
    return launches


def test_the_cell_is_a_long_full_tier_llm_cell():
    cell = cells.get(CELL_ID)
    assert (cell.tier, cell.workload, cell.epochs, cell.max_steps) == ("full", "llm", 1, 0)
    assert cell.timeout_s >= 3600


def test_a_single_launch_judged_unknown_is_not_launched_again(tmp_path, undecided):
    cell = cells.get(CELL_ID)
    result = Runner(tmp_path / "out", probe=False, baselines=no_baselines(tmp_path),
                    repeats=1).result(cell)
    assert [(c.id, c.epochs, c.max_steps, t) for c, t in undecided.launched] == \
        [(cell.id, cell.epochs, cell.max_steps, cell.timeout_s)]
    assert result["remeasured"] == 0
    assert result["checks"][0]["verdict"] == "unknown"  # said, not hidden by a longer launch


def test_more_launches_keep_the_cells_own_epochs_steps_and_timeout(tmp_path, undecided):
    cell = cells.get(CELL_ID)
    result = Runner(tmp_path / "out", probe=False, baselines=no_baselines(tmp_path),
                    repeats=2).result(cell)
    assert result["remeasured"] == REMEASURE_ROUNDS
    assert len(undecided.launched) == 2 * (REMEASURE_ROUNDS + 1)
    assert {(c.epochs, c.max_steps, timeout) for c, timeout in undecided.launched} == \
        {(cell.epochs, cell.max_steps, cell.timeout_s)}
    assert all(c == cell for c, _ in undecided.launched)  # nothing else about it changed either
