"""What an undecided resident A/B session says would decide it
(perfsuite.ab.verdicts.what_would_decide): computed from its own ratio and
scatter, as compare_windows would pool a session so planned, not a fixed
doubling of its quads and pairs."""

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from perfsuite.ab.resident import judged_quads
from perfsuite.ab.verdicts import pair_look_confidence, what_would_decide
from perfsuite.stats.windows import compare_windows, design_half_width, within_pair_variance

STORED = Path(__file__).resolve().parents[1] / "data" / "cpu-2026-11-28" / "repro" / "unchanged.ab.json"


def pair(quads: int, mean: float, sd: float) -> list[float]:
    """``quads`` log-ratios whose mean and sample s.d. are exactly these."""
    z = np.linspace(-1.0, 1.0, quads)
    return list(mean + sd * (z - z.mean()) / z.std(ddof=1))


@pytest.mark.parametrize("mean,verdict", [(0.004, "same"), (0.035, "regressed")])
def test_the_quads_it_names_decide_a_session_with_that_scatter_and_one_fewer_does_not(mean, verdict):
    sd, tolerance, max_pairs = 0.038, 0.02, 4  # one H200 fp64 cell's steps, as 5-step windows
    measured = [pair(4, mean, sd), pair(4, mean, sd)]  # two pairs that agree: no launch effect
    advice = what_would_decide(measured, math.exp(mean), 0.0, tolerance, 4, max_pairs)
    quads = int(re.search(r"--quads (\d+)", advice).group(1))
    assert f"{sd * 100:.2f} % within its pair" in advice and f"±{tolerance * 100:g} %" in advice
    confidence = pair_look_confidence(max_pairs)
    enough = compare_windows([pair(quads, mean, sd)] * 2, tolerance, confidence)
    fewer = compare_windows([pair(quads - 1, mean, sd)] * 2, tolerance, confidence)
    assert (enough.verdict, fewer.verdict) == (verdict, "unknown")


def test_the_stored_undecided_cpu_session_is_told_more_pairs_from_its_own_scatter():
    """On the 2-core VM (tests/data/cpu-2026-11-28) an unchanged session read
    1.009 (0.9976-1.0208) after 4 pairs of 16 quads: its pairs disagreed, so
    more quads alone would not decide it at the first look; one more pair
    would, at this scatter (the fixed advice was --max-pairs 8 or --quads 32)."""
    cell = json.loads(STORED.read_text())["cells"][0]
    quads = [judged_quads(p["windows"]) for p in cell["pairs"]]
    advice = what_would_decide(quads, cell["ratio"], cell["tau2"], 0.02, 16, 4)
    assert "2.89 % within its pair, the pairs 0.49 % between them" in advice
    assert "--quads" not in advice and "about --max-pairs 5 at 16 quads" in advice
    within, target = within_pair_variance(quads), math.log1p(0.02) - math.log(cell["ratio"])
    assert design_half_width(within, cell["tau2"], 16, 5, pair_look_confidence(5)) <= target


def test_a_ratio_at_the_tolerances_bound_is_said_to_be_undecidable_there():
    measured = [pair(16, 0.0195, 0.01), pair(16, 0.0195, 0.01)]
    advice = what_would_decide(measured, math.exp(0.0195), 0.0, 0.02, 16, 4)
    assert "near the ±2 % bound" in advice and "no session of up to 1000 quads or 100 pairs" in advice
