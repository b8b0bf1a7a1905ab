"""results.json values the schema's types allow but nothing can judge: zero or
negative times, rates and memory, NaN and infinities, a cell id twice. The
loader refuses them naming the file, the cell and the field, and
``perfsuite compare`` answers with that sentence and exit status 2."""

import copy
import json
import math

import pytest

from perfsuite.cli.main import main
from perfsuite.judge.comparing import compare_runs
from perfsuite.schemas import results

CPU_ENV = {"cpu_model": "AMD EPYC 9334", "cpu_cores": 2, "gpu_count": 0, "torch": "2.14.0"}
CELL = "smoke/image/ddp-ds/c1/fp32/px32/nopin/nchw"


def cell(cell_id=CELL, samples=(0.1, 0.11, 0.1, 0.12, 0.1)):
    samples = list(samples)
    return {"id": cell_id, "params": {"device": "cpu", "world_size": 1}, "status": "ok",
            "reason": None, "env": CPU_ENV, "checks": [],
            "metrics": {"step_time": {"value": 0.1, "unit": "s", "samples": samples, "n": len(samples),
                                      "launches": [samples[:2], samples[2:]],
                                      "launch_medians": [0.1, 0.1], "launch_floors": [0.1, 0.1]},
                        "time_per_token": {"value": 0.001, "unit": "s/token", "samples": [0.001, 0.002]},
                        "throughput": {"value": 160.0, "unit": "images/s"},
                        "peak_rss": {"value": 1.5e9, "unit": "bytes"},
                        "peak_mem_allocated": {"value": 2e9, "unit": "bytes"},
                        "total_time": {"value": 3.0, "unit": "s"},
                        "h2d_bytes": {"value": 0, "unit": "bytes"},  # none copied on a CPU
                        "loss": {"value": -0.5, "unit": "", "samples": [None, -0.5]}}}  # not judged


def run(*cells):
    return {"schema": results.SCHEMA, "run": {"started": 1.0, "finished": 2.0, "argv": []},
            "env": CPU_ENV, "cells": list(cells) or [cell()]}


def write(folder, data):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "results.json"
    path.write_text(json.dumps(data, allow_nan=True))  # NaN, Infinity: Python's JSON allows them
    return path


def _at(where, value):
    def change(data):
        target = data["cells"][0]
        for key in where[:-1]:
            target = target[key]
        target[where[-1]] = value
    return change


UNJUDGEABLE = {
    "a zero step time": (_at(["metrics", "step_time", "samples", 1], 0.0), "metrics/step_time/samples/1"),
    "a negative step time": (_at(["metrics", "step_time", "samples", 0], -0.1), "metrics/step_time/samples/0"),
    "a zero step-time value": (_at(["metrics", "step_time", "value"], 0), "metrics/step_time/value"),
    "a zero in a launch": (_at(["metrics", "step_time", "launches", 1, 0], 0.0), "metrics/step_time/launches/1/0"),
    "a null step time": (_at(["metrics", "step_time", "samples", 2], None), "metrics/step_time/samples/2"),
    "a negative time per token": (_at(["metrics", "time_per_token", "samples", 0], -1e-3),
                                  "metrics/time_per_token/samples/0"),
    "a zero throughput": (_at(["metrics", "throughput", "value"], 0), "metrics/throughput/value"),
    "a negative throughput": (_at(["metrics", "throughput", "value"], -3.0), "metrics/throughput/value"),
    "a zero peak RSS": (_at(["metrics", "peak_rss", "value"], 0), "metrics/peak_rss/value"),
    "a negative peak memory": (_at(["metrics", "peak_mem_allocated", "value"], -5), "metrics/peak_mem_allocated/value"),
    "a zero total time": (_at(["metrics", "total_time", "value"], 0.0), "metrics/total_time/value"),
    "negative copied bytes": (_at(["metrics", "h2d_bytes", "value"], -1), "metrics/h2d_bytes/value"),
    "a NaN step time": (_at(["metrics", "step_time", "samples", 3], math.nan), "metrics/step_time/samples/3"),
    "an infinite step time": (_at(["metrics", "step_time", "samples", 0], math.inf), "metrics/step_time/samples/0"),
    "an infinite throughput": (_at(["metrics", "throughput", "value"], math.inf), "metrics/throughput/value"),
    "a NaN loss": (_at(["metrics", "loss", "value"], math.nan), "metrics/loss/value"),  # written as null
}


@pytest.mark.parametrize("case", list(UNJUDGEABLE))
def test_a_value_nothing_can_judge_is_refused_naming_file_cell_and_field(tmp_path, case):
    change, field = UNJUDGEABLE[case]
    data = run()
    change(data)
    path = write(tmp_path, data)
    with pytest.raises(ValueError) as err:
        results.load(path)
    message = str(err.value)
    assert f"{path}: cells/0/{field}: " in message and CELL in message, message
    assert "Traceback" not in message


def test_a_cell_id_twice_is_refused_naming_both_places(tmp_path):
    other = cell("smoke/other")
    path = write(tmp_path, run(cell(), other, copy.deepcopy(cell())))
    with pytest.raises(ValueError) as err:
        results.load(path)
    message = str(err.value)
    assert f"{path}: cells/2: " in message and f"id {CELL!r}" in message and "cells/0" in message, message


def test_what_perfsuite_writes_still_loads(tmp_path):
    data = run(cell(), cell("smoke/other", samples=[0.2]))
    data["cells"][1]["metrics"]["step_time"].update(value=None, samples=[], n=0)  # no step measured
    assert results.load(write(tmp_path, data))["cells"][0]["id"] == CELL


@pytest.mark.parametrize("case", ["a zero step time", "a negative throughput", "a NaN step time",
                                  "a negative peak memory"])
@pytest.mark.parametrize("side", ["a", "b"])
def test_compare_answers_in_a_sentence_with_exit_2(tmp_path, capsys, case, side):
    bad = run()
    UNJUDGEABLE[case][0](bad)
    paths = {"a": write(tmp_path / "a", run()), "b": write(tmp_path / "b", run())}
    paths[side] = write(tmp_path / side, bad)
    code = main(["compare", str(paths["a"].parent), str(paths["b"].parent)])
    said = capsys.readouterr()
    assert code == 2, said
    assert str(paths[side]) in said.err and CELL in said.err and UNJUDGEABLE[case][1] in said.err
    assert "Traceback" not in said.err and said.out == ""


def test_compare_answers_for_a_cell_id_twice(tmp_path, capsys):
    a = write(tmp_path / "a", run())
    b = write(tmp_path / "b", run(cell(), cell()))
    assert main(["compare", str(a.parent), str(b.parent)]) == 2
    said = capsys.readouterr().err
    assert str(b) in said and CELL in said and "Traceback" not in said


def test_compare_runs_names_the_cell_of_values_it_cannot_judge():
    """Runs handed over in memory, not loaded from a file: still no bare
    statistics error."""
    bad = run()
    bad["cells"][0]["metrics"]["step_time"].update(samples=[0.0] * 5, launches=[[0.0] * 2, [0.0] * 3])
    with pytest.raises(ValueError, match=f"cell {CELL}: .*positive"):
        compare_runs(run(), bad)
    bad["cells"][0]["metrics"]["peak_rss"]["value"] = -1.0
    with pytest.raises(ValueError, match=f"cell {CELL}: "):
        compare_runs(run(), bad)
