"""The overhead benchmark runs both loops and reports figures (no timing asserts)."""

from perfsuite.selftest.overhead import measure_overhead


def test_overhead_benchmark_reports_both_medians():
    out = measure_overhead(image_size=16, batch_size=4, steps=2, blocks=2)
    assert out["bare_median_s"] > 0 and out["suite_median_s"] > 0
    assert out["ratio"] == out["suite_median_s"] / out["bare_median_s"]
    assert out["blocks"] == 2 and out["steps_per_block"] == 2
