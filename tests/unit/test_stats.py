"""perfsuite.stats.samples: summaries, intervals and verdicts on known numbers."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from perfsuite.stats import launches as launchstats
from perfsuite.stats import samples


def lognormal(seed, n, scale=1.0, sigma=0.05):
    return list(np.random.default_rng(seed).lognormal(math.log(scale), sigma, n))


# ------------------------------------------------------------------ summary

def test_summary_of_known_samples():
    s = samples.summary([5.0, 1.0, 3.0, 2.0, 4.0])
    assert s["n"] == 5 and s["median"] == 3.0 and s["min"] == 1.0 and s["max"] == 5.0
    assert s["iqr"] == pytest.approx(2.0)
    assert s["p10"] == pytest.approx(1.4) and s["p90"] == pytest.approx(4.6)
    assert s["mad"] == 1.0


def test_summary_is_robust_to_one_outlier():
    s = samples.summary([1.0] * 9 + [100.0])
    assert s["median"] == 1.0 and s["mad"] == 0.0


def test_summary_of_nothing_has_n_zero():
    s = samples.summary([])
    assert s["n"] == 0 and math.isnan(s["median"])


@pytest.mark.parametrize("bad", [[1.0, float("nan")], [1.0, float("inf")]])
def test_non_finite_samples_are_refused(bad):
    with pytest.raises(ValueError, match="finite"):
        samples.as_samples(bad)


def test_non_positive_times_are_refused():
    with pytest.raises(ValueError, match="positive"):
        samples.as_samples([1.0, 0.0, 1.0])


# ---------------------------------------------------------------- intervals

def test_median_ratio_interval_brackets_the_true_ratio():
    base, new = lognormal(1, 60), lognormal(2, 60, scale=1.2)
    iv = samples.median_ratio_interval(new, base)
    assert iv.low < 1.2 < iv.high and iv.contains(iv.estimate)
    assert iv.high - iv.low < 0.1


def test_median_ratio_interval_is_deterministic_and_order_free():
    base, new = lognormal(3, 25), lognormal(4, 25, scale=1.1)
    first = samples.median_ratio_interval(new, base)
    assert samples.median_ratio_interval(new, base) == first
    assert samples.median_ratio_interval(new[::-1], sorted(base)) == first


def test_median_ratio_interval_factor_scales_everything():
    base, new = lognormal(5, 20), lognormal(6, 20)
    plain = samples.median_ratio_interval(new, base)
    half = samples.median_ratio_interval(new, base, factor=0.5)
    assert half.estimate == pytest.approx(plain.estimate / 2)
    assert half.low == pytest.approx(plain.low / 2) and half.high == pytest.approx(plain.high / 2)


def test_one_sample_gives_an_unbounded_interval():
    iv = samples.median_ratio_interval([2.0], [1.0, 1.1, 0.9])
    assert iv.estimate == pytest.approx(2.0) and iv.low == 0.0 and iv.high == math.inf


@pytest.mark.parametrize("m,n,critical", [(5, 5, 2), (3, 7, 1), (8, 6, 8), (10, 10, 23)])
def test_rank_critical_values_match_the_mann_whitney_table(m, n, critical):
    # Published two-sided 5% critical values of U; the interval uses the next rank.
    assert samples._rank_critical(m, n, 0.05) == critical + 1


@pytest.mark.parametrize("m,n", [(4, 6), (7, 7), (12, 9)])
def test_exact_null_distribution_matches_scipy(m, n):
    cdf = samples._mann_whitney_lower_cdf(m, n)
    x = np.arange(m) + 0.5  # all below y: U = 0 for x
    y = np.arange(n) + 100.0
    p = sps.mannwhitneyu(x, y, alternative="less", method="exact").pvalue
    assert cdf[0] == pytest.approx(p)
    assert cdf[-1] == pytest.approx(1.0)


def test_normal_approximation_agrees_with_exact_where_they_meet():
    exact = samples._rank_critical(100, 100, 0.05)
    z = sps.norm.ppf(0.975)
    approx = math.floor(100 * 100 / 2 - z * math.sqrt(100 * 100 * 201 / 12))
    assert abs(exact - approx) <= 2


def test_shift_interval_covers_the_true_ratio_about_as_often_as_promised():
    hits = 0
    for seed in range(200):
        rng = np.random.default_rng(seed)
        base = rng.lognormal(0.0, 0.1, 12)
        new = rng.lognormal(math.log(1.3), 0.1, 12)
        iv = samples.shift_ratio_interval(new, base, confidence=0.9)
        hits += iv.low <= 1.3 <= iv.high
    assert 0.84 <= hits / 200 <= 0.97


def test_shift_interval_needs_enough_samples():
    iv = samples.shift_ratio_interval([2.0, 2.1, 2.2], [1.0, 1.1, 1.2])
    assert iv.high == math.inf  # 3 vs 3 cannot reach 95%



# ---------------------------------------------------------------- verdicts











def test_compare_values_for_single_numbers():
    assert samples.compare_values(110.0, 100.0, 0.05).verdict == "regressed"
    assert samples.compare_values(103.0, 100.0, 0.05).verdict == "same"
    assert samples.compare_values(0.99, 0.97, 0.01, higher_is_better=True).verdict == "improved"


def test_compare_interval_against_an_expected_ratio():
    iv = samples.Interval(2.3, 2.25, 2.35, 0.95, "test")
    assert samples.compare_interval(iv, 2.31, 0.10).verdict == "same"
    assert samples.compare_interval(iv, 3.0, 0.10).verdict == "regressed"  # slower than expected
    assert samples.compare_interval(iv, 1.5, 0.10).verdict == "improved"


def test_within_range():
    iv = samples.Interval(1.6, 1.58, 1.62, 0.95, "test")
    assert samples.within_range(iv, 1.54, 1.68) == "pass"
    assert samples.within_range(iv, 1.7, None) == "fail"
    assert samples.within_range(iv, 1.6, None) == "unknown"
    assert samples.within_range(iv, None, 1.5, tolerance=0.1) == "pass"


def test_classify_at_the_tolerance_bound_is_same_not_regressed():
    assert samples.classify(1.05, 1.05, 0.05) == "same"
    assert samples.classify(1.0500000000000003, 1.06, 0.05) == "unknown"
    assert samples.classify(1.06, 1.07, 0.05) == "regressed"
    assert samples.classify(1.06, 1.07, 0.05, significant=False) == "unknown"
    with pytest.raises(ValueError):
        samples.classify(1.0, 1.0, -0.1)


def test_a_real_change_beyond_the_tolerance_is_called_without_the_whole_interval_beyond_it():
    # the interval excludes 1 and the estimate is past the tolerance: regressed
    assert samples.classify(1.02, 1.09, 0.05, estimate=1.055) == "regressed"
    assert samples.classify(0.91, 0.98, 0.05, estimate=0.94) == "improved"
    assert samples.classify(0.91, 0.98, 0.05, estimate=0.94, higher_is_better=True) == "regressed"
    # no real change shown (the interval holds 1), or too small to matter: measure more
    assert samples.classify(0.99, 1.12, 0.05, estimate=1.06) == "unknown"
    assert samples.classify(1.01, 1.07, 0.05, estimate=1.04) == "unknown"
    assert samples.classify(1.01, 1.04, 0.05, estimate=1.02) == "same"
    assert samples.classify(1.02, 1.09, 0.05, estimate=1.055, significant=False) == "unknown"


def test_comparison_to_dict_has_the_contract_keys():
    d = launchstats.compare_launches([lognormal(21, 10)], [lognormal(22, 10)]).to_dict()
    assert {"verdict", "ratio", "ci_low", "ci_high", "confidence", "p_value"} <= set(d)


# ---------------------------------------------------- repeated launches

def launches(seed, count, scale=1.0, launch_sigma=0.10, n=30):
    """Launches whose levels scatter (sd ``launch_sigma`` in log) far more than
    their steps do (sd 0.02): the shape measured on a shared VM."""
    rng = np.random.default_rng(seed)
    return [lognormal(int(rng.integers(1 << 30)), n, scale * math.exp(rng.normal(0, launch_sigma)),
                      sigma=0.02) for _ in range(count)]


def test_launch_spread_is_weighed_where_pooled_steps_would_call_a_false_regression():
    base, new = launches(1, 6), launches(2, 6)
    pooled = samples.median_ratio_interval([x for r in new for x in r], [x for r in base for x in r])
    judged = launchstats.compare_launches(new, base)
    # 180 tight steps a side: the pooled interval is far narrower than the
    # launch-to-launch scatter, the launch-level one is not.
    assert (pooled.high - pooled.low) < (judged.ci_high - judged.ci_low) / 3
    assert judged.n_new == 6 and judged.n_base == 6 and "launch medians" in judged.method
    assert judged.verdict != "regressed"


def test_identical_launch_distributions_are_rarely_called_regressed():
    called = sum(launchstats.compare_launches(launches(2 * s, 6), launches(2 * s + 1, 6)).verdict
                 == "regressed" for s in range(200))
    assert called <= 10  # 5 % at most, at 95 % confidence


def test_a_large_shift_between_launches_is_called():
    cmp = launchstats.compare_launches(launches(3, 6, scale=1.6, launch_sigma=0.02),
                                 launches(4, 6, launch_sigma=0.02))
    assert cmp.verdict == "regressed" and cmp.ci_low > 1.05 and cmp.p_value < 0.05


def test_launch_floors_see_through_neighbours_that_only_add_time():
    """Launches whose steps are sometimes slowed 1.5x by a neighbour (one-sided
    noise): the medians scatter with the neighbour, the floors do not."""
    rng = np.random.default_rng(11)

    def launch(level):
        busy = rng.random(30) < rng.uniform(0.2, 0.8)  # each launch its own share of busy steps
        return list(level * rng.lognormal(0, 0.01, 30) * np.where(busy, 1.5, 1.0))

    base = [launch(0.10) for _ in range(8)]
    slow = [launch(0.11) for _ in range(8)]
    by_median = launchstats.compare_launches(slow, base)
    by_floor = launchstats.compare_launches(slow, base, statistic="floor")
    assert by_floor.verdict == "regressed" and by_floor.ratio == pytest.approx(1.1, rel=0.02)
    assert (by_floor.ci_high - by_floor.ci_low) < (by_median.ci_high - by_median.ci_low) / 3
    assert "launch floors" in by_floor.method and "launch medians" in by_median.method
    assert launchstats.launch_values([[3.0, 1.0, 2.0]], "floor") == [1.0]
    with pytest.raises(ValueError, match="launch statistic 'mean'"):
        launchstats.compare_launches(slow, base, statistic="mean")


def test_one_launch_a_side_cannot_separate_a_change_from_drift():
    """The scenario users met: the baseline launched in a busy minute (1.6x),
    the new one on a quiet minute with a stack slowed by 15 %. The steps of
    each launch are tight, so pooled steps claimed "improved" at 95 %."""
    busy_baseline = [lognormal(31, 40, 1.6, sigma=0.02)]
    slowed_stack = [lognormal(32, 40, 1.15, sigma=0.02)]
    pooled = samples.median_ratio_interval(*[[x for r in side for x in r]
                                             for side in (slowed_stack, busy_baseline)])
    assert pooled.high < 0.95  # the steps' own interval: "improved" at 95 %
    for statistic in ("median", "floor"):
        cmp = launchstats.compare_launches(slowed_stack, busy_baseline, statistic=statistic)
        assert cmp.verdict == "unknown" and cmp.ci_low == 0.0 and cmp.ci_high == math.inf
        assert cmp.reason == launchstats.DRIFT_UNKNOWN and "perfsuite ab" in cmp.reason
        assert (cmp.n_new, cmp.n_base) == (1, 1)


def test_fewer_than_four_launches_weigh_the_spread_between_them():
    cmp = launchstats.compare_launches(launches(5, 3), launches(6, 8))
    assert (cmp.n_new, cmp.n_base) == (3, 8) and "t interval" in cmp.method
    assert "between-launch spread" in cmp.reason and "9 d.o.f." in cmp.reason
    # the launches scatter 10 % (s.d. of logs): the interval is about +-15 %, not +-1 %
    assert cmp.ci_high / cmp.ci_low > 1.2 and cmp.verdict == "unknown"


def test_a_recorded_spread_widens_a_single_launch_interval():
    one, other = [lognormal(41, 30, 1.0, sigma=0.01)], [lognormal(42, 30, 1.0, sigma=0.01)]
    spread = launchstats.LaunchSpread(0.05, 40)
    cmp = launchstats.compare_launches(one, other, spread=spread)
    half = sps.t.ppf(0.975, 40) * 0.05 * math.sqrt(2)
    assert math.log(cmp.ci_high / cmp.ci_low) == pytest.approx(2 * half, rel=1e-9)
    assert cmp.verdict == "unknown"  # +-14 % cannot fit within a 5 % tolerance
    doubled = launchstats.compare_launches([[x * 2 for x in one[0]]], other, spread=spread)
    assert doubled.verdict == "regressed" and doubled.ci_low > 1.5
    assert launchstats.compare_launches(one, other, 1.0, spread=spread).verdict == "same"


def test_launch_spread_pools_groups_of_identical_launches():
    spread = launchstats.launch_spread([[1.0, 1.0], [2.0, 2.0 * math.e ** 0.2], [5.0]])
    assert spread.dof == 2 and spread.log_sd == pytest.approx(math.sqrt(0.02 / 2))
    assert launchstats.launch_spread([[1.0]]).dof == 0
    assert launchstats.LaunchSpread(0.1, 2).pooled(launchstats.LaunchSpread(0.2, 2)).log_sd == pytest.approx(
        math.sqrt(0.025))
