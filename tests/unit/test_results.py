"""Rank records -> cell result, and the results.json schema."""

import json
import math

import pytest

from perfsuite import results
from perfsuite.cells import Cell


def cell(**kw):
    base = dict(tier="smoke", workload="image", strategy="ddp-ds", device="cpu", world_size=2,
                precision="fp32", pin_memory=False, dataset="digits", batch_size=16, image_size=32)
    return Cell(**{**base, **kw})


def record(rank, samples, **metrics):
    return {"rank": rank, "status": "ok", "steps": len(samples), "device": "cpu",
            "env": {"hostname": "h"} if rank == 0 else None,
            "metrics": {"step_time": {"value": 0, "unit": "s", "samples": samples},
                        **{k: {"value": v, "unit": "x"} for k, v in metrics.items()}},
            "info": {"images_per_step": 32}}


def aggregate(c, records, **kw):
    args = dict(status="ok", reason=None, duration_s=1.0)
    return results.aggregate(c, records, **{**args, **kw})


def test_step_time_is_the_slowest_rank_per_step():
    out = aggregate(cell(), [record(0, [1.0, 2.0, 3.0], peak_rss=5, h2d_bytes=1, throughput=9),
                             record(1, [1.5, 1.0, 4.0], peak_rss=7, h2d_bytes=2, throughput=8)])
    assert out["status"] == "ok"
    step = out["metrics"]["step_time"]
    assert step["samples"] == [1.5, 2.0, 4.0] and step["median"] == 2.0 == step["value"]
    assert step["n"] == 3 and step["unit"] == "s" and {"iqr", "p10", "p90"} <= set(step)
    assert out["metrics"]["peak_rss"]["value"] == 7  # max over ranks
    assert out["metrics"]["h2d_bytes"]["value"] == 3  # summed
    assert out["metrics"]["throughput"]["value"] == 8  # the slower view
    assert out["env"] == {"hostname": "h"}


def test_unequal_step_counts_are_an_error():
    out = aggregate(cell(), [record(0, [1.0, 2.0]), record(1, [1.0])])
    assert out["status"] == "error" and "different numbers of measured steps" in out["reason"]


def test_failed_cells_keep_status_and_reason_but_no_metrics():
    out = aggregate(cell(), [record(0, [1.0]), None], status="error",
                    reason="rank 1 died without a result (killed by SIGKILL)")
    assert out["status"] == "error" and out["metrics"] == {}
    assert out["ranks"][1]["status"] == "missing"


def test_results_file_schema_and_atomic_rewrite(tmp_path):
    store = results.ResultsFile(tmp_path, env={"torch": "x"}, argv=["pytest"])
    first = aggregate(cell(), [record(0, [1.0]), record(1, [1.0], loss=math.nan)])
    store.add(first)
    store.add(results.skipped_result(cell(world_size=1), "needs 1 GPU(s), 0 present"))
    store.add(first)  # a rerun replaces the earlier entry
    text = (tmp_path / "results.json").read_text()
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON {c}"))
    assert data["schema"] == results.SCHEMA
    assert set(data) == {"schema", "run", "env", "cells"}
    assert [c["status"] for c in data["cells"]] == ["skipped", "ok"]
    for entry in data["cells"]:
        assert {"id", "params", "status", "reason", "env", "metrics", "checks"} <= set(entry)
        assert entry["status"] in results.STATUSES
        for metric in entry["metrics"].values():
            assert {"value", "unit"} <= set(metric)
    assert not list(tmp_path.glob(".results.json.*"))  # no temporary left behind
    assert results.load(tmp_path)["cells"][1]["id"] == first["id"]


def test_load_names_a_bad_file(tmp_path):
    (tmp_path / "results.json").write_text("{oops")
    with pytest.raises(ValueError, match="results.json: not valid JSON"):
        results.load(tmp_path)
    with pytest.raises(FileNotFoundError, match="--perf-out"):
        results.load(tmp_path / "nowhere")


def measured(samples, status="ok", **metrics):
    return {"id": "c", "status": status, "reason": None if status == "ok" else "boom",
            "duration_s": 2.0, "metrics": {
                "step_time": {"value": sorted(samples)[len(samples) // 2], "unit": "s",
                              "samples": samples},
                **{k: {"value": v, "unit": "x"} for k, v in metrics.items()}}}


def test_repeated_launches_keep_their_samples_apart():
    merged = results.merge_repeats([measured([1.0, 1.2, 1.1], peak_rss=5, throughput=10),
                                    measured([2.0, 2.2, 2.1], peak_rss=7, throughput=20),
                                    measured([3.0, 3.2, 3.1], peak_rss=6, throughput=30)])
    step = merged["metrics"]["step_time"]
    assert step["launches"] == [[1.0, 1.2, 1.1], [2.0, 2.2, 2.1], [3.0, 3.2, 3.1]]
    assert step["launch_medians"] == [1.1, 2.1, 3.1] and step["n"] == 9
    assert step["samples"] == [1.0, 1.2, 1.1, 2.0, 2.2, 2.1, 3.0, 3.2, 3.1]
    assert step["median"] == 2.1 and step["value"] == 2.1
    assert merged["metrics"]["peak_rss"]["value"] == 6  # the median launch, peaks too: a cold first launch fills caches
    assert merged["metrics"]["throughput"]["value"] == 20  # others: the median launch
    assert merged["repeats"] == 3 and merged["duration_s"] == 6.0


def test_a_failed_launch_is_the_result_and_says_which():
    merged = results.merge_repeats([measured([1.0]), measured([1.0], status="error"),
                                    measured([1.0])])
    assert merged["status"] == "error"
    assert merged["reason"] == "launch 2 of 3: boom (2 launch(es) ok)"


def test_one_launch_is_left_as_it_is():
    one = measured([1.0, 2.0])
    assert results.merge_repeats([one]) is one
