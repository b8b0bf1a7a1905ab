"""Properties of perfsuite.stats.samples that every verdict must keep."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from perfsuite.stats import launches as launchstats
from perfsuite.stats.samples import VERDICTS, classify, median_ratio_interval, shift_ratio_interval

# Step times on a millisecond grid (0.001 s to 1000 s): real timers have finite
# resolution, and it keeps two different samples from being one float apart.
seconds = st.integers(1, 1_000_000).map(lambda i: i / 1000)
samples = st.lists(seconds, min_size=5, max_size=40)
factors = st.sampled_from([1e-3, 0.37, 0.5, 3.0, 7.25, 1000.0])
tolerances = st.sampled_from([0.0, 0.02, 0.05, 0.1, 0.25])
confidences = st.sampled_from([0.8, 0.9, 0.95, 0.99])
FAST = {"deadline": None, "max_examples": 40}


@settings(**FAST)
@given(st.lists(seconds, min_size=4, max_size=12), tolerances)
def test_a_large_enough_shift_between_launches_is_always_called(values, tol):
    # Every new launch beyond every old one by more than the tolerance: the
    # rank test over launches sees complete separation (4 a side: p = 0.029).
    # Faster must clear 1 - tol, which needs a larger factor than 1 + tol.
    base = [[v] for v in values]
    shift = max(values) / min(values) * max(1 + tol, 1 / (1 - tol)) * 1.01
    slower, faster = [[v * shift] for v in values], [[v / shift] for v in values]
    assert launchstats.compare_launches(slower, base, tol).verdict == "regressed"
    assert launchstats.compare_launches(faster, base, tol).verdict == "improved"


@settings(**FAST)
@given(samples, samples, st.sampled_from([0.5, 1.0, 2.0]), confidences)
def test_ratio_intervals_contain_their_estimate(num, den, factor, conf):
    boot = median_ratio_interval(num, den, factor=factor, confidence=conf, n_resamples=300)
    assert boot.low <= boot.estimate <= boot.high
    rank = shift_ratio_interval(num, den, confidence=conf)
    assert rank.low <= rank.estimate <= rank.high


@settings(**FAST)
@given(samples, samples)
def test_a_wider_confidence_gives_a_wider_rank_interval(num, den):
    narrow = shift_ratio_interval(num, den, confidence=0.8)
    wide = shift_ratio_interval(num, den, confidence=0.95)
    assert wide.low <= narrow.low and wide.high >= narrow.high


@settings(deadline=None, max_examples=100)
@given(st.floats(0.01, 100), st.floats(0.01, 100), st.floats(0, 1), tolerances, st.booleans())
def test_classify_is_consistent(a, b, where, tol, higher):
    low, high = min(a, b), max(a, b)
    estimate = low + where * (high - low)
    verdict = classify(low, high, tol, estimate=estimate, higher_is_better=higher)
    if verdict == "same":
        assert 1 - tol - 1e-9 <= low and high <= 1 + tol + 1e-9
    slower, faster = ("improved", "regressed") if higher else ("regressed", "improved")
    if verdict == slower:  # a real change (1 outside the interval), large enough
        assert low > 1 and estimate > 1 + tol - 1e-9
    if verdict == faster:
        assert high < 1 and estimate < 1 - tol + 1e-9
    # without an estimate, the interval's end nearer to 1 must clear the tolerance
    if classify(low, high, tol, higher_is_better=higher) == slower:
        assert low > 1 + tol - 1e-9
    assert verdict in VERDICTS


statistics = st.sampled_from(sorted(launchstats.LAUNCH_STATISTICS))
launch_sets = st.lists(st.lists(seconds, min_size=3, max_size=12), min_size=1, max_size=7)


@settings(**FAST)
@given(launch_sets, launch_sets, tolerances, st.randoms(use_true_random=False), statistics)
def test_launch_verdict_ignores_the_order_of_launches_and_of_their_steps(new, base, tol, rnd,
                                                                         statistic):
    first = launchstats.compare_launches(new, base, tol, statistic=statistic)
    shuffled = [[rnd.sample(launch, len(launch)) for launch in side] for side in (new, base)]
    for side in shuffled:
        rnd.shuffle(side)
    assert launchstats.compare_launches(*shuffled, tol, statistic=statistic) == first


@settings(**FAST)
@given(launch_sets, launch_sets, tolerances, factors, statistics)
def test_launch_verdict_survives_scaling_both_sides(new, base, tol, factor, statistic):
    scaled = [[[x * factor for x in launch] for launch in side] for side in (new, base)]
    one, other = (launchstats.compare_launches(new, base, tol, statistic=statistic),
                  launchstats.compare_launches(*scaled, tol, statistic=statistic))
    assert other.verdict == one.verdict
    assert math.isclose(other.ratio, one.ratio, rel_tol=1e-9)


@settings(**FAST)
@given(st.lists(st.lists(seconds, min_size=3, max_size=12), min_size=4, max_size=7), tolerances)
def test_identical_launches_are_never_called_regressed(launches, tol):
    for statistic in ("median", "floor"):
        cmp = launchstats.compare_launches(launches, launches, tol, statistic=statistic)
        assert cmp.verdict in ("same", "unknown") and cmp.ci_low <= cmp.ratio <= cmp.ci_high


# ----------------------------------------- launches made at different times

one_launch = st.lists(seconds, min_size=1, max_size=30).map(lambda steps: [steps])
few_launches = st.lists(st.lists(seconds, min_size=1, max_size=12), min_size=1, max_size=3)
spreads = st.builds(launchstats.LaunchSpread, st.sampled_from([0.0, 0.01, 0.05, 0.2]),
                    st.integers(1, 60))


@settings(**FAST)
@given(one_launch, one_launch, tolerances, statistics)
def test_one_launch_a_side_without_a_known_spread_is_always_unknown(new, base, tol, statistic):
    cmp = launchstats.compare_launches(new, base, tol, statistic=statistic)
    assert cmp.verdict == "unknown" and cmp.reason == launchstats.DRIFT_UNKNOWN


@settings(**FAST)
@given(few_launches, few_launches, tolerances, statistics, spreads, confidences)
def test_a_direction_is_claimed_only_where_the_widened_interval_excludes_one(
        new, base, tol, statistic, spread, confidence):
    cmp = launchstats.compare_launches(new, base, tol, confidence, statistic=statistic, spread=spread)
    assert cmp.ci_low <= cmp.ratio * (1 + 1e-12) and cmp.ratio <= cmp.ci_high * (1 + 1e-12)
    if cmp.verdict == "regressed":
        assert cmp.ci_low > 1 and cmp.ratio > 1 + tol - 1e-9
    if cmp.verdict == "improved":
        assert cmp.ci_high < 1 and cmp.ratio < 1 - tol + 1e-9


@settings(**FAST)
@given(few_launches, few_launches, statistics, spreads)
def test_a_larger_recorded_spread_never_narrows_the_interval(new, base, statistic, spread):
    narrow = launchstats.compare_launches(new, base, statistic=statistic, spread=spread)
    wide = launchstats.compare_launches(new, base, statistic=statistic,
                                  spread=launchstats.LaunchSpread(spread.log_sd * 2 + 0.01, spread.dof))
    assert wide.ci_low <= narrow.ci_low * (1 + 1e-12)
    assert wide.ci_high * (1 + 1e-12) >= narrow.ci_high
    if narrow.verdict == "unknown":
        assert wide.verdict == "unknown"
