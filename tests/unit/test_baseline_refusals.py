"""What a baseline folder, ``perfsuite baseline record`` and a ``[[finding]]``
must refuse up front, naming the file and the row, cell or field: samples and
numbers nothing can judge, duplicated rows, malformed records, profile ids
outside the baselines root, findings of the wrong types."""

import json

import pandas as pd
import pytest

from perfsuite import cells
from perfsuite.cli.main import main
from perfsuite.hardware import profile_id
from perfsuite.judge import baselines as bl
from perfsuite.judge import recording

CPU_ENV = {"cpu_model": "AMD EPYC 9334 32-Core Processor", "cpu_cores": 2, "gpu_count": 0,
           "torch": "2.14.0", "python": "3.12.1", "commit": "abc123"}
CPU = profile_id(CPU_ENV)
PARAMS = {"tier": "smoke", "workload": "image", "strategy": "ddp-ds", "device": "cpu", "world_size": 1,
          "precision": "fp32", "pin_memory": False, "dataset": "digits", "batch_size": 16,
          "image_size": 32, "memory_format": "nchw"}


def cell_result(cell_id="smoke/a", steps=(0.1, 0.11, 0.1, 0.12, 0.1), **params):
    steps = list(steps)
    return {"id": cell_id, "params": {**PARAMS, **params}, "status": "ok", "env": CPU_ENV, "checks": [],
            "metrics": {"step_time": {"value": 0.1, "unit": "s", "samples": steps},
                        "throughput": {"value": 160.0, "unit": "images/s"},
                        "peak_rss": {"value": 1.5e9, "unit": "bytes"}},
            "counters": {"per_step": {"flops": 100, "ops/aten::add": 3}, "unstable": []}}


def run(*cells_):
    return {"schema": "perfsuite.results/1", "env": CPU_ENV,
            "cells": list(cells_) or [cell_result(), cell_result("smoke/b", pin_memory=True)]}


@pytest.fixture
def folder(tmp_path):
    """A recorded folder as perfsuite writes it: samples, metrics, counters."""
    plan = recording.record_run(run(), root=tmp_path / "root", date="2026-11-22T00:00:00Z")
    bl.load_profile(plan.folder)  # loads as written
    return plan.folder


def edit_json(file, change):
    data = json.loads(file.read_text())
    change(data)
    file.write_text(json.dumps(data, allow_nan=True))


def refused(folder):
    """The BaselineError load_all gives for the folder's root, as text."""
    with pytest.raises(bl.BaselineError) as err:
        bl.load_all(folder.parent)
    message = str(err.value)
    assert "Traceback" not in message
    return message


STEP = "smoke/a:step_time"

BAD_SAMPLES = {
    "a zero sample": (lambda d: d[STEP].__setitem__(2, 0.0), "sample 3"),
    "a negative sample": (lambda d: d[STEP].__setitem__(0, -0.1), "sample 1"),
    "a text sample": (lambda d: d[STEP].__setitem__(1, "0.1"), "sample 2"),
    "a true sample": (lambda d: d[STEP].__setitem__(1, True), "sample 2"),
    "a null sample": (lambda d: d[STEP].__setitem__(4, None), "sample 5"),
    "a NaN sample": (lambda d: d[STEP].__setitem__(0, float("nan")), "sample 1"),
    "an infinite sample": (lambda d: d[STEP].__setitem__(0, float("inf")), "sample 1"),
    "no samples": (lambda d: d.__setitem__(STEP, []), "no samples"),
    "a number, not a list": (lambda d: d.__setitem__(STEP, 0.1), "a list"),
    "a zero in a launch": (lambda d: d.__setitem__(STEP, [[0.1, 0.1], [0.1, 0.0]]), "launch 2, sample 2"),
    "an empty launch": (lambda d: d.__setitem__(STEP, [[0.1, 0.1], []]), "launch 2"),
}


@pytest.mark.parametrize("case", list(BAD_SAMPLES))
def test_a_sample_nothing_can_judge_is_refused_at_load_naming_file_and_row(folder, case):
    change, where = BAD_SAMPLES[case]
    edit_json(folder / "samples.json", change)
    message = refused(folder)
    assert str(folder / "samples.json") in message and STEP in message and where in message, message


def test_samples_json_of_the_wrong_shape_is_refused(folder):
    (folder / "samples.json").write_text("[0.1, 0.2]")
    assert str(folder / "samples.json") in refused(folder)


def test_a_row_twice_in_samples_json_is_refused(folder):
    text = (folder / "samples.json").read_text()
    line = next(x for x in text.splitlines() if x.startswith(f'"{STEP}"'))
    (folder / "samples.json").write_text(text.replace(line, f"{line}\n{line}"))
    message = refused(folder)
    assert str(folder / "samples.json") in message and STEP in message and "twice" in message, message


def edit_row(folder, row_id, **values):
    file = folder / "metrics.csv"
    df = pd.read_csv(file, dtype=str, keep_default_na=False)
    for column, value in values.items():
        df.loc[df["id"] == row_id, column] = value
    df.to_csv(file, index=False)


@pytest.mark.parametrize("row_id, values", [
    ("smoke/a:step_time", {"value": "0"}),
    ("smoke/a:throughput", {"value": "-160"}),
    ("smoke/a:peak_rss", {"value": "0.0"}),
    ("smoke/a:step_time", {"value": "nan"}),
    ("smoke/a:throughput", {"value": "inf"}),
    ("smoke/a:step_time", {"tolerance": "-0.05"}),
    ("smoke/a:step_time", {"tolerance": "nan"}),
])
def test_a_metric_row_nothing_can_judge_is_refused_naming_file_line_and_row(folder, row_id, values):
    edit_row(folder, row_id, **values)
    message = refused(folder)
    assert f"{folder / 'metrics.csv'}, line " in message and row_id in message, message
    assert next(iter(values)) in message


def test_a_row_twice_in_metrics_csv_is_refused(folder):
    file = folder / "metrics.csv"
    lines = file.read_text().splitlines()
    file.write_text("\n".join([*lines, lines[1]]) + "\n")
    message = refused(folder)
    assert f"{file}, line {len(lines) + 1}" in message and "repeats" in message


def counters_entry(data, i=0):
    return data["entries"][i]


@pytest.mark.parametrize("case, change, where", [
    ("a NaN count", lambda d: counters_entry(d)["per_step"].__setitem__("flops", float("nan")), "flops"),
    ("a negative count", lambda d: counters_entry(d)["per_step"].__setitem__("flops", -1), "flops"),
    ("a count as text", lambda d: counters_entry(d)["per_step"].__setitem__("flops", "100"), "flops"),
    ("a count true", lambda d: counters_entry(d)["per_step"].__setitem__("flops", True), "flops"),
    ("a negative tolerance", lambda d: counters_entry(d).__setitem__("tolerance", {"flops": -0.1}), "flops"),
    ("unstable as text", lambda d: counters_entry(d).__setitem__("unstable", "flops"), "unstable"),
    ("params as a list", lambda d: counters_entry(d).__setitem__("params", ["cpu"]), "params"),
    ("an entry twice", lambda d: d["entries"].append(dict(counters_entry(d))), "twice"),
])
def test_a_malformed_counter_entry_is_refused_naming_file_and_entry(folder, case, change, where):
    edit_json(folder / "counters.json", change)
    message = refused(folder)
    assert str(folder / "counters.json") in message and "smoke/a" in message and where in message, message


def test_the_session_stops_before_its_first_launch(folder, tmp_path):
    """Baselines are read when the session begins (Runner.begin): a bad
    sample stops it there, not in the middle of the run."""
    from perfsuite.runner import Runner

    edit_json(folder / "samples.json", BAD_SAMPLES["a zero sample"][0])
    with pytest.raises(bl.BaselineError, match="samples.json.*smoke/a:step_time"):
        Runner(tmp_path / "out", baselines=folder.parent).begin()


# ------------------------------------------------------------- recording

BAD_IDS = ["../escape", "", "a/b", "/tmp/elsewhere", ".hidden", "_private", "..", " spaced", "x\\y"]


@pytest.mark.parametrize("bad", BAD_IDS)
def test_record_refuses_a_profile_id_outside_the_root_before_writing(tmp_path, bad):
    root = tmp_path / "inner" / "root"
    with pytest.raises(bl.BaselineError, match="profile id") as err:
        recording.record_run(run(), bad, root=root, force=True)
    assert repr(bad) in str(err.value)
    assert not root.exists() and sorted(p.name for p in tmp_path.rglob("*")) == []


def test_record_refuses_an_id_the_runs_own_env_gives_outside_the_root(tmp_path):
    env = {"gpu_count": 2, "gpu_name": "H100", "gpu_memory_bytes": 80 * 2**30, "interconnect": "../../up"}
    results = run(cell_result())
    results["env"] = env
    results["cells"][0]["env"] = env
    with pytest.raises(bl.BaselineError, match="profile id"):
        recording.record_run(results, root=tmp_path / "root")
    assert list(tmp_path.rglob("*")) == []


def test_baseline_record_refuses_a_bad_id_with_exit_2(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "results.json").write_text(json.dumps(run()))
    code = main(["baseline", "record", str(tmp_path / "run"), "--hardware-profile", "../escape",
                 "--baselines", str(tmp_path / "root"), "--force"])
    said = capsys.readouterr().err
    assert code == 2 and "'../escape'" in said and "Traceback" not in said and said.count("\n") == 1
    assert not (tmp_path / "root").exists() and not (tmp_path / "escape").exists()


def test_record_refuses_a_cell_twice_before_writing(tmp_path):
    with pytest.raises(bl.BaselineError, match="smoke/a.*twice|twice.*smoke/a"):
        recording.record_run(run(cell_result(), cell_result()), root=tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("steps", [(0.1, 0.0, 0.1), (-0.1, 0.1), (0.1, float("nan"))])
def test_record_refuses_samples_it_would_refuse_to_load(tmp_path, steps):
    with pytest.raises(bl.BaselineError, match="samples.json.*smoke/a:step_time"):
        recording.record_run(run(cell_result(steps=steps)), root=tmp_path)
    assert not (tmp_path / CPU).exists()  # the root's lock file aside, nothing written


def test_record_refuses_counters_it_would_refuse_to_load(tmp_path):
    bad = cell_result()
    bad["counters"]["per_step"]["flops"] = -3
    with pytest.raises(bl.BaselineError, match="counters.json.*smoke/a.*flops"):
        recording.record_run(run(bad), root=tmp_path)
    assert not (tmp_path / CPU).exists()


def test_a_good_record_still_lands(folder):
    assert {"samples.json", "metrics.csv", "counters.json", "profile.json"} <= {p.name for p in folder.iterdir()}
    assert bl.load_all(folder.parent)[0].samples[STEP] == [0.1, 0.11, 0.1, 0.12, 0.1]


# ------------------------------------------------------------- [[finding]]

FINDING = {"name": '"x"', "source": '"s"', "subject": '{strategy = "ddp-ds", world_size = 2}',
           "twin": '{precision = "fp64"}', "low": "1.3", "devices": '["cpu"]'}


def finding_file(tmp_path, **fields):
    """An experiment file of one [[finding]]; values are TOML as written (None: left out)."""
    lines = [f"{k} = {v}" for k, v in {**FINDING, **fields}.items() if v is not None]
    path = tmp_path / "findings.toml"
    path.write_text("[[finding]]\n" + "\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("field, value, expected", [
    ("low", '"1.3"', "number"),
    ("high", "true", "number"),
    ("subject", '"ddp-ds"', "object"),
    ("twin", "[1]", "object"),
    ("devices", '"cuda"', "array"),
    ("devices", '["gpu"]', "cpu"),
    ("name", "3", "string"),
    ("measured", "1.5", "string"),
    ("subject", '{world_size = "2"}', "integer"),
    ("twin", '{pin_memory = "no"}', "boolean"),
])
def test_a_finding_of_the_wrong_type_is_refused_naming_file_finding_field_and_type(tmp_path, field, value,
                                                                                  expected):
    path = finding_file(tmp_path, **{field: value})
    with pytest.raises(cells.CellError) as err:
        cells.load_findings([path])
    message = str(err.value)
    name = "'x'" if field != "name" else "#1"
    assert str(path) in message and f"finding {name}" in message and field in message, message
    assert expected in message


@pytest.mark.parametrize("low, high", [("nan", None), ("1.0", "inf"), ("2.0", "1.5")])
def test_a_finding_range_nothing_can_hold_is_refused(tmp_path, low, high):
    path = finding_file(tmp_path, low=low, high=high)
    with pytest.raises(cells.CellError, match=r"findings.toml: finding 'x'.*(low|high)"):
        cells.load_findings([path])


def test_a_good_finding_still_loads(tmp_path):
    (found,) = cells.load_findings([finding_file(tmp_path, high="2")])
    assert found.low == 1.3 and found.high == 2 and found.devices == ("cpu",)


def test_findings_are_checked_when_the_matrix_reads_the_file(tmp_path):
    path = finding_file(tmp_path, low='"1.3"')
    with pytest.raises(cells.CellError, match="finding 'x'.low"):
        cells.load_matrix([path])
