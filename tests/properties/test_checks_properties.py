"""Properties of perfsuite.judge.checks: verdicts that do not depend on how samples arrive."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from perfsuite.judge import checks as ck
from perfsuite.judge.lookup import Expectation

seconds = st.integers(1, 1_000_000).map(lambda i: i / 1000)
samples = st.lists(seconds, min_size=5, max_size=30)
FAST = {"deadline": None, "max_examples": 30}


def cell(step_samples, world_size=1, precision="fp32", cell_id="c"):
    params = {"workload": "image", "strategy": "ddp-ds", "world_size": world_size,
              "precision": precision, "pin_memory": False, "batch_size": 16}
    return {"id": cell_id, "params": params, "status": "ok",
            "metrics": {"step_time": {"value": min(step_samples), "unit": "s",
                                      "samples": list(step_samples)}}}


def cross_checks():
    paper = Expectation("speedup", 3.0, tolerance=0.1, source="paper")
    finding = Expectation("speedup", None, 2.0, None, 0.05, source="finding")
    return st.sampled_from([ck.ScalingEfficiency(paper), ck.ScalingEfficiency(finding),
                            ck.ScalingEfficiency(minimum=0.5), ck.PrecisionSpeedup(paper)])


@settings(**FAST)
@given(samples, samples, cross_checks(), st.randoms(use_true_random=False))
def test_cross_cell_verdict_ignores_sample_order(one, four, check, rnd):
    subject, twin = cell(four, 4), cell(one, 1)
    first = check.evaluate(subject, twin)
    rnd.shuffle(one)
    rnd.shuffle(four)
    again = check.evaluate(cell(four, 4), cell(one, 1))
    assert again.to_dict() == first.to_dict()


@settings(**FAST)
@given(samples, samples, cross_checks(), st.sampled_from([0.25, 2.0, 10.0]))
def test_cross_cell_verdict_ignores_a_common_time_scale(one, four, check, factor):
    plain = check.evaluate(cell(four, 4), cell(one, 1))
    scaled = check.evaluate(cell([x * factor for x in four], 4), cell([x * factor for x in one], 1))
    assert scaled.verdict == plain.verdict


@settings(**FAST)
@given(samples, samples, st.sampled_from([0.0, 0.05, 0.1]))
def test_step_time_check_never_calls_identical_samples_a_change(base, other, tol):
    check = ck.StepTimeNotRegressed(samples=base, tolerance=tol)
    assert check.evaluate(cell(base)).verdict in ("same", "unknown")


@settings(**FAST)
@given(samples, samples, cross_checks())
def test_every_verdict_serialises_to_strict_json(one, four, check):
    for verdict in (check.evaluate(cell(four, 4), cell(one, 1)),
                    ck.StepTimeNotRegressed(value=0.5).evaluate(cell(four)),
                    check.evaluate(cell(four, 4), None)):
        json.dumps(verdict.to_dict(), allow_nan=False)
        assert verdict.verdict in ck.STATES


@settings(**FAST)
@given(samples, samples)
def test_a_pass_on_a_range_means_the_interval_is_inside_it(one, four):
    v = ck.ScalingEfficiency(minimum=0.5, maximum=1.0).evaluate(cell(four, 4), cell(one, 1))
    if v.verdict == "pass":
        assert 0.5 <= v.ci_low <= v.observed <= v.ci_high <= 1.0
    if v.verdict == "fail":
        assert v.ci_high < 0.5 or v.ci_low > 1.0
