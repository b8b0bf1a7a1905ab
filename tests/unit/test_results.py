"""Rank records -> cell result, and the results.json schema."""

import json
import math
from pathlib import Path

import pytest

from perfsuite import results
from perfsuite.cells import Cell
from perfsuite.schemas import results as results_schema


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


def gpu_record(rank, samples, busy_s, h2d_s=0.0):
    """A GPU rank's record whose counting window measured ``busy_s`` of device
    time a step, ``h2d_s`` of it host-to-device copies (perfsuite.rank.counting)."""
    out = {**record(rank, samples), "device": f"cuda:{rank}"}
    out["counters"] = {"window_steps": 2, "per_step": {"flops": 10}, "unstable": [],
                       "device_time": {"per_step_s": busy_s, "kernels_s": busy_s - h2d_s,
                                       "memcpy_h2d_s": h2d_s, "memcpy_d2h_s": 0.0,
                                       "memcpy_d2d_s": 0.0, "memset_s": 0.0}}
    return out


def test_gpu_busy_share_is_device_time_over_the_median_step_and_the_cell_takes_the_least_busy_rank():
    gpu = cell(device="cuda", world_size=2)
    out = aggregate(gpu, [gpu_record(0, [0.1, 0.2, 0.2], busy_s=0.19, h2d_s=0.02),
                          gpu_record(1, [0.2, 0.2, 0.3], busy_s=0.15, h2d_s=0.05)])
    assert [r["gpu_busy_share"] for r in out["ranks"]] == [0.95, 0.75]
    assert [r["h2d_copy_share"] for r in out["ranks"]] == [0.1, 0.25]
    assert out["gpu_busy_share"] == 0.75  # rank 1's GPU idled most
    results_schema.validate({"schema": results_schema.SCHEMA, "cells": [out]})


def test_gpu_busy_share_is_unknown_without_device_time():
    on_cpu = aggregate(cell(), [record(0, [1.0]), record(1, [1.0])])  # counters without device_time
    assert on_cpu["gpu_busy_share"] is None and on_cpu["ranks"][0]["gpu_busy_share"] is None
    no_window = gpu_record(0, [0.1, 0.2], busy_s=0.1)
    no_window.pop("counters")  # count_steps=0: no counting window, no device time
    assert aggregate(cell(device="cuda", world_size=1), [no_window])["gpu_busy_share"] is None


def test_repeated_launches_take_the_median_gpu_busy_share():
    gpu = cell(device="cuda", world_size=1)
    launches = [aggregate(gpu, [gpu_record(0, [0.2, 0.2], busy_s=b)]) for b in (0.18, 0.14, 0.16)]
    assert results.merge_repeats(launches)["gpu_busy_share"] == 0.8


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
    assert data["schema"] == results_schema.SCHEMA
    assert set(data) == {"schema", "run", "env", "cells"}
    assert [c["status"] for c in data["cells"]] == ["skipped", "ok"]
    for entry in data["cells"]:
        assert {"id", "params", "status", "reason", "env", "metrics", "checks"} <= set(entry)
        assert entry["status"] in results_schema.STATUSES
        for metric in entry["metrics"].values():
            assert {"value", "unit"} <= set(metric)
    assert not list(tmp_path.glob(".results.json.*"))  # no temporary left behind
    assert results_schema.load(tmp_path)["cells"][1]["id"] == first["id"]


def test_load_names_a_bad_file(tmp_path):
    (tmp_path / "results.json").write_text("{oops")
    with pytest.raises(ValueError, match="results.json: not valid JSON"):
        results_schema.load(tmp_path)
    with pytest.raises(FileNotFoundError, match="--perf-out"):
        results_schema.load(tmp_path / "nowhere")


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


# -- results.json checked against its published JSON Schema -----------------

REPO = Path(__file__).resolve().parents[2]


def written_run(tmp_path):
    """A results.json as ResultsFile writes it: measured (a NaN loss, a NaN
    sample), repeated, failed and skipped cells."""
    store = results.ResultsFile(tmp_path, env={"torch": "x"}, argv=["pytest", "-q"])
    ranks = [record(0, [1.0, 2.0], loss=math.nan), record(1, [1.5, 1.0], peak_rss=7)]
    for rank in ranks:
        rank["counters"] = {"window_steps": 2, "per_step": {"flops": 10, "ops/aten::add": 3},
                            "unstable": []}
    measured_cell = aggregate(cell(), ranks)
    measured_cell["metrics"]["loss"]["samples"] = [2.3, math.nan]
    store.add(measured_cell)
    store.add(results.merge_repeats([aggregate(cell(pin_memory=True), [record(0, [1.0, 1.1])]),
                                     aggregate(cell(pin_memory=True), [record(0, [1.2, 1.3])])]))
    store.add(aggregate(cell(world_size=1), [None], status="error", reason="rank 0 died"))
    store.add(aggregate(cell(precision="bf16"), [record(0, [1.0]), record(1, [1.0, 2.0])]))
    store.add(results.skipped_result(cell(world_size=4), "needs 4 GPU(s), 0 present"))
    store.add(results.skipped_result(cell(world_size=8), "measured on node 0", partner=True))
    return store.path


def test_the_schema_file_is_a_valid_draft_2020_12_schema():
    from jsonschema import Draft202012Validator

    assert results_schema.SCHEMA_FILE.is_file()
    assert results_schema.SCHEMA_FILE.parent == Path(results_schema.__file__).parent  # package data
    schema = json.loads(results_schema.SCHEMA_FILE.read_text())
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["properties"]["schema"] == {"const": results_schema.SCHEMA}
    assert tuple(schema["$defs"]["cell"]["properties"]["status"]["enum"]) == results_schema.STATUSES


def test_a_results_file_as_written_validates(tmp_path):
    from jsonschema import Draft202012Validator

    path = written_run(tmp_path)
    data = json.loads(path.read_text())
    assert len(data["cells"]) == 6 and {c["status"] for c in data["cells"]} == {"ok", "error", "skipped"}
    assert data["cells"][1]["repeats"] == 2 and "launches" in data["cells"][1]["metrics"]["step_time"]
    assert data["cells"][0]["counters"]["per_step"] == {"flops": 20, "ops/aten::add": 6}
    assert data["cells"][0]["metrics"]["loss"]["samples"] == [2.3, None]  # NaN written as null
    schema = json.loads(results_schema.SCHEMA_FILE.read_text())
    assert list(Draft202012Validator(schema).iter_errors(data)) == []
    assert results_schema.load(tmp_path)["cells"] == data["cells"]


def real_runs():
    found = [*REPO.glob(".perfsuite/*/results.json"), *REPO.glob(".perfsuite/**/results.json"),
             *REPO.glob("baselines/**/results.json")]
    return sorted(set(found))


def test_every_real_results_file_in_the_repository_validates():
    runs = real_runs()
    if not runs:
        pytest.skip("no results.json under .perfsuite/ or baselines/ (no run in this checkout)")
    for path in runs:
        assert results_schema.load(path)["schema"] == results_schema.SCHEMA, path


def broken(tmp_path, change):
    """A valid written run, changed by ``change(data)``, written back."""
    path = written_run(tmp_path)
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    return path


def _set(data, where, value):
    *head, last = where
    for key in head:
        data = data[key]
    data[last] = value


WRONG_SHAPES = {
    "cells as an object": (lambda d: _set(d, ["cells"], {c["id"]: c for c in d["cells"]}),
                           "cells: ", "is not of type 'array'"),
    "a cell without id": (lambda d: d["cells"][3].pop("id"),
                          "cells/3: ", "'id' is a required property"),
    "an id not a string": (lambda d: _set(d, ["cells", 1, "id"], 7),
                           "cells/1/id: ", "7 is not of type 'string'"),
    "samples as strings": (lambda d: _set(d, ["cells", 0, "metrics", "step_time", "samples"], ["a", "b"]),
                           "cells/0/metrics/step_time/samples/0: ", "'a' is not of type 'number'"),
    "params missing": (lambda d: d["cells"][2].pop("params"),
                       "cells/2: ", "'params' is a required property"),
    "a status not in STATUSES": (lambda d: _set(d, ["cells", 1, "status"], "passed"),
                                 "cells/1/status: ", "'passed' is not one of ['ok', 'failed'"),
    "a metric value as text": (lambda d: _set(d, ["cells", 0, "metrics", "peak_rss", "value"], "7 GB"),
                               "cells/0/metrics/peak_rss/value: ", "'7 GB' is not of type 'number'"),
    "a check without verdict": (lambda d: d["cells"][0]["checks"].append({"name": "step_time"}),
                                "cells/0/checks/0: ", "'verdict' is a required property"),
    "counters of text": (lambda d: _set(d, ["cells", 0, "counters", "per_step", "flops"], "many"),
                         "cells/0/counters/per_step/flops: ", "'many' is not of type 'number'"),
    "a busy share as text": (lambda d: _set(d, ["cells", 0, "gpu_busy_share"], "high"),
                             "cells/0/gpu_busy_share: ", "'high' is not of type 'number'"),
    "a rank's busy share as text": (lambda d: _set(d, ["cells", 0, "ranks", 1, "gpu_busy_share"], "idle"),
                                    "cells/0/ranks/1/gpu_busy_share: ", "'idle' is not of type 'number'"),
}


@pytest.mark.parametrize("shape", list(WRONG_SHAPES))
def test_a_wrong_shape_is_refused_naming_the_file_and_path(tmp_path, shape):
    change, where, what = WRONG_SHAPES[shape]
    path = broken(tmp_path, change)
    with pytest.raises(ValueError) as err:
        results_schema.load(tmp_path)
    message = str(err.value)
    assert f"{path}: {where}" in message and what in message, message
    assert str(results_schema.SCHEMA_FILE) in message and "--perf-out" in message  # what to do
    assert "Traceback" not in message and len(message) < 2000


def test_only_the_first_few_problems_are_listed(tmp_path):
    def strings(data):
        for entry in data["cells"]:
            entry["status"] = "weird"

    broken(tmp_path, strings)
    with pytest.raises(ValueError, match=r"cells/0/status: 'weird' is not one of") as err:
        results_schema.load(tmp_path / "results.json")
    message = str(err.value)
    assert message.count("is not one of") == results_schema.MAX_PROBLEMS == 3
    assert "and 3 more problem(s)" in message


def test_a_huge_wrong_value_is_not_printed_whole(tmp_path):
    path = broken(tmp_path, lambda d: _set(d, ["cells"], {f"c{i}": "x" * 100 for i in range(500)}))
    with pytest.raises(ValueError, match=f"{path}: cells: ") as err:
        results_schema.load(path)
    assert len(str(err.value)) < 2000


def test_the_existing_messages_stay(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps({"schema": "perfsuite.results/0", "cells": []}))
    with pytest.raises(ValueError, match=r"results.json: schema 'perfsuite.results/0', expected 'perfsuite.results/1'"):
        results_schema.load(tmp_path)
    (tmp_path / "results.json").write_text("[1, 2]")  # JSON, but not an object
    with pytest.raises(ValueError, match=r"results.json: a JSON array, expected an object"):
        results_schema.load(tmp_path)


@pytest.mark.parametrize("command", [["compare", "{run}", "{run}"], ["report", "{run}"],
                                     ["baseline", "record", "{run}", "--root", "{root}", "--dry-run"]])
def test_the_commands_name_the_problem_instead_of_a_traceback(tmp_path, capsys, command):
    from perfsuite.cli.main import main

    run = broken(tmp_path / "run", lambda d: _set(d, ["cells", 0, "metrics", "step_time", "samples"], ["a"]))
    argv = [a.format(run=run.parent, root=tmp_path / "baselines") for a in command]
    try:  # a usage error: printed with exit status 2, or raised as SystemExit(message)
        code, said = main(argv), capsys.readouterr().err
    except SystemExit as stop:
        code, said = 2, str(stop.code)
    assert code == 2 and f"perfsuite: {run}: cells/0/metrics/step_time/samples/0: 'a'" in said
    assert not (tmp_path / "baselines").exists() and not (run.parent / "report.html").exists()
