"""The pre-flight probe of the session's node (GPUs, host link, interconnect)."""

import math

import pytest


def test_preflight_probe(request, perf_session):
    tier = request.config.getoption("--perf-tier")
    device = "cuda" if tier in ("gate", "full") else "cpu"
    probe = perf_session.preflight(device)
    if probe["status"] == "skipped":
        pytest.skip(f"pre-flight probe skipped: {probe['reason']}")
    assert probe["status"] == "ok", probe.get("reason")
    figures = probe["metrics"]
    assert figures, "the probe measured nothing"
    for name, metric in figures.items():
        assert math.isfinite(metric["value"]) and metric["value"] > 0, name
    per_rank = probe["info"]["per_rank"]
    assert all(len(values) == probe["params"]["world_size"] for values in per_rank.values())
    assert probe["ranks"] and all(r["status"] == "ok" for r in probe["ranks"])
    if device == "cpu":
        assert probe["info"]["allreduce"]["backend"] == "gloo"
        assert set(figures) == {"matmul_tflops_fp32", "allreduce_busbw_gbps"}
    assessment = probe["assessment"]
    assert assessment["trusted"], "node below its datasheet figures: " + "; ".join(assessment["flags"])
