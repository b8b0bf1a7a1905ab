"""perfsuite.history.edivisive, the copy of Apache Otava's change point detection:
the same points, statistics and p-values as the package, on series of every
shape the history holds (apache-otava comes with the test extra)."""

import math

import numpy as np
import pytest

from perfsuite.history import edivisive


def _series(rng: np.random.Generator, n: int, kind: str) -> list[float]:
    base = rng.normal(100.0, rng.choice([0.1, 1.0, 5.0]), n)
    if kind == "steps":  # one to three shifts, up or down, some small
        for at in sorted(rng.choice(np.arange(1, n), size=min(n - 1, rng.integers(1, 4)), replace=False)):
            base[at:] *= rng.choice([0.7, 0.97, 1.02, 1.1, 1.5])
    elif kind == "spike":
        base[rng.integers(0, n)] *= 3.0
    elif kind == "ties":  # few distinct values: equal distances, equal Q, ties in argmax and max
        base = rng.choice([1.0, 2.0, 3.0], n)
    elif kind == "constant":
        base = np.full(n, 7.0)
    elif kind == "zeros":  # means of 0: the relative change is 0 by Otava's rule
        base = np.where(rng.random(n) < 0.5, 0.0, rng.normal(0.0, 1.0, n))
    return [float(v) for v in base]


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


CASES = [(seed, kind, n) for seed, (kind, n) in enumerate(
    (kind, n) for kind in ("noise", "steps", "spike", "ties", "constant", "zeros")
    for n in (3, 4, 7, 12, 25, 40, 64, 101))]


@pytest.mark.parametrize("window,max_pvalue,min_magnitude",
                         [(20, 0.0001, 0.0), (50, 0.001, 0.0), (3, 0.05, 0.0), (5, 0.05, 0.02),
                          (30, 0.3, 0.0), (7, 0.6, 0.1)])
def test_the_same_change_points_as_otava(window, max_pvalue, min_magnitude):
    analysis = pytest.importorskip("otava.analysis")
    compared = 0
    for seed, kind, n in CASES:
        series = _series(np.random.default_rng(seed), n, kind)
        theirs, _weak = analysis.compute_change_points(list(series), window_len=window, max_pvalue=max_pvalue,
                                                       min_magnitude=min_magnitude)
        ours = edivisive.compute_change_points(list(series), window_len=window, max_pvalue=max_pvalue,
                                               min_magnitude=min_magnitude)
        where = f"{kind} n={n} seed={seed}"
        assert [p.index for p in ours] == [p.index for p in theirs], where
        for mine, other in zip(ours, theirs):
            assert _same(float(mine.qhat), float(other.qhat)), where
            for name in ("pvalue", "mean_1", "mean_2", "std_1", "std_2"):
                assert _same(float(getattr(mine.stats, name)), float(getattr(other.stats, name))), (where, name)
        compared += len(theirs)
    assert compared > 0  # the cases hold change points, not only quiet series


def test_a_step_is_found_where_it_is_and_noise_has_none():
    rng = np.random.default_rng(3)
    quiet = list(rng.normal(10.0, 0.05, 30))
    assert edivisive.compute_change_points(quiet, window_len=20, max_pvalue=0.0001) == []
    step = quiet[:17] + [v * 1.2 for v in quiet[17:]]
    found = edivisive.compute_change_points(step, window_len=20, max_pvalue=0.0001)
    assert [p.index for p in found] == [17]
    assert found[0].stats.pvalue < 0.0001 and found[0].stats.mean_2 > found[0].stats.mean_1


def test_min_magnitude_drops_a_significant_but_small_change():
    rng = np.random.default_rng(4)
    quiet = list(rng.normal(10.0, 0.001, 40))
    small = quiet[:20] + [v * 1.01 for v in quiet[20:]]
    assert [p.index for p in edivisive.compute_change_points(small, window_len=20, max_pvalue=0.001)] == [20]
    assert edivisive.compute_change_points(small, window_len=20, max_pvalue=0.001, min_magnitude=0.05) == []


def test_an_array_is_split_as_a_list():
    rng = np.random.default_rng(5)
    values = list(rng.normal(1.0, 0.01, 24)) + list(rng.normal(1.3, 0.01, 24))
    as_list = edivisive.compute_change_points(values, window_len=20, max_pvalue=0.001)
    as_array = edivisive.compute_change_points(np.array(values), window_len=20, max_pvalue=0.001)
    assert [p.index for p in as_array] == [p.index for p in as_list] == [24]
