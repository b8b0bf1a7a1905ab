"""Workload specs: one resolver for built-in names, module:function, entry
points and pytest tests; cells of one's own workloads; the perf_steps meter."""

import json
import os
import socket
import sys
import types
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
import tomllib

from perfsuite import cells, specs
from perfsuite.cells import Cell, CellError

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = '''
from perfsuite.steps import Dist, Steps


def train(cell, ctx):
    import torch

    dist = Dist.start(cell, ctx)
    steps = Steps(cell, ctx)
    weight = torch.ones(8, 8, requires_grad=True)
    for x in steps(iter(lambda: torch.ones(4, 8), None), warmup=1, steps=4, items=4):
        (x @ weight).sum().backward()
    assert dist.world_size == 1 and dist.device.type == "cpu" and dist.device_ids is None
    return steps.record()
'''


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project folder with a workload module, the working directory, not on sys.path."""
    (tmp_path / "mywork.py").write_text(WORKLOAD)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    yield tmp_path
    sys.modules.pop("mywork", None)


@pytest.fixture
def entry_points(monkeypatch):
    """A package of one's own registered in the group perfsuite.workloads."""
    import importlib.metadata

    registered = [EntryPoint("mine", "mywork:train", specs.ENTRY_POINTS),
                  EntryPoint("other", "othertool:main", "console_scripts")]
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda group=None: [e for e in registered if group in (None, e.group)])
    specs.entry_point_names.cache_clear()
    yield
    specs.entry_point_names.cache_clear()


def test_built_in_names_are_functions_found_by_the_same_resolver():
    imported = []
    fake = types.SimpleNamespace(run=lambda cell, ctx: {})

    def import_module(name):
        imported.append(name)
        return fake

    modules = {"image": "image", "llm": "llm", "probe": "preflight"}  # the pre-flight probe's module
    assert set(modules) == set(cells.WORKLOADS)
    for name in cells.WORKLOADS:
        assert specs.kind(name) == "builtin"
        assert specs.target(name) == f"perfsuite.workloads.{modules[name]}:run"
        assert specs.resolve(name, import_module) is fake.run
        assert specs.resolve(f"perfsuite.workloads.{modules[name]}:run", import_module) is fake.run
    assert imported == [f"perfsuite.workloads.{modules[n]}" for n in cells.WORKLOADS for _ in (1, 2)]
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    assert declared[specs.ENTRY_POINTS] == specs.BUILTIN  # the same names in the same group


def test_kinds_and_what_is_not_a_workload():
    assert specs.kind("tests/test_train.py::test_step") == "test"
    assert specs.kind("tests/test_train.py::TestA::test_step[c2-64]") == "test"
    assert specs.kind("pkg.mod:train") == "function"
    assert specs.target("tests/test_x.py::test_a") == specs.TEST_RUNNER
    for bad, why in [("imgae", "neither built in"), ("pkg.mod:", "package.module:function"),
                     ("test_x::test_a", "node id"), ("", "give a name")]:
        assert why in specs.problem(bad)
    with pytest.raises(CellError, match="imgae.*entry-point group 'perfsuite.workloads'"):
        Cell(tier="smoke", workload="imgae", **cells.USER_DEFAULTS)


def test_module_function_is_found_in_the_project_folder(project):
    train = specs.resolve("mywork:train")
    assert train.__name__ == "train" and str(project) in sys.path  # after what is installed
    with pytest.raises(specs.SpecError, match="mywork has no 'nope'"):
        specs.resolve("mywork:nope")
    with pytest.raises(specs.SpecError, match="no module 'not_here_at_all'"):
        specs.resolve("not_here_at_all:run")


def test_entry_point_of_an_installed_package(project, entry_points):
    assert specs.kind("mine") == "entry point" and specs.kind("other") is None
    assert specs.target("mine") == "mywork:train"
    assert specs.resolve("mine").__name__ == "train"
    cell = Cell(tier="smoke", workload="mine", **{**cells.USER_DEFAULTS, "world_size": 2})
    assert cell.id == "smoke/mine/c2/fp32"
    with pytest.raises(CellError, match=r"registered in the entry-point group.*\(mine\)"):
        Cell(tier="smoke", workload="theirs", **cells.USER_DEFAULTS)


def test_user_test_ids_round_trip_and_stay_apart_from_built_in_ids():
    cell = cells.cell_of_test("tests/test_a.py::test_b[64]", 2)
    assert cell.id == "user/tests/test_a.py::test_b[64]/c2" and cell.tier == "smoke"
    gpu = cells.cell_of_test("tests/test_a.py::TestA::test_b", 4, "cuda", profile=True)
    assert gpu.id == "user/tests/test_a.py::TestA::test_b/g4/prof" and gpu.gpus_needed == 4
    for c in (cell, gpu):
        assert cells.select(ids=[c.id]) == [c]
        assert Cell.from_params(c.params()) == c
    with pytest.raises(CellError, match="unknown cell id"):
        cells.select(ids=["user/tests/test_a.py/c2"])
    image = cells.get("smoke/image/ddp-ds/c2/fp32/px32/nopin/nchw")
    assert image.id == "smoke/image/ddp-ds/c2/fp32/px32/nopin/nchw"  # built-in ids as they were


@pytest.fixture
def own_experiments(tmp_path, monkeypatch):
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "mine.toml").write_text('''
[[experiment]]
name = "mymodel batch sizes"
tier = "smoke"
workload = "mymodel.train:run"
fixed = {device = "cpu", max_steps = 20}
axes = {world_size = [1, 2], batch_size = [16, 64]}
''')
    monkeypatch.setenv(cells.EXPERIMENTS_ENV, str(tmp_path / "exp"))
    cells.matrix.cache_clear()
    yield tmp_path / "exp"
    monkeypatch.delenv(cells.EXPERIMENTS_ENV)
    cells.matrix.cache_clear()


def test_experiment_file_of_ones_own_workload_joins_the_matrix(own_experiments):
    built_in = len(cells.load_matrix(sorted(cells.EXPERIMENTS_DIR.glob("*.toml"))))
    mine = cells.select(tier="smoke", workload="mymodel.train:run")
    assert sorted(c.id for c in mine) == sorted(
        f"smoke/mymodel.train:run/c{n}/fp32/batch_size={b}/max_steps=20" for n in (1, 2) for b in (16, 64))
    assert len(cells.matrix()) == built_in + 4
    assert cells.get(mine[0].id) == mine[0]  # perfsuite run / ab find them by id


def test_steps_measure_count_and_report_like_the_built_in_meter(tmp_path):
    import torch

    from perfsuite.context import RankContext
    from perfsuite.rank.meter import Progress
    from perfsuite.steps import Steps

    cell = cells.cell_of_test("tests/test_a.py::test_b", 2)
    ctx = RankContext(rank=0, world_size=2, local_rank=0, device="cpu", out_dir=tmp_path)
    ctx.progress = Progress(tmp_path / "progress-rank0")
    steps = Steps(cell, ctx)
    weight = torch.ones(8, 8)
    bodies = 0
    for x in steps(iter(lambda: torch.ones(4, 8), None), warmup=2, steps=5, items=4):
        x @ weight
        bodies += 1
    assert bodies == 2 + 5 + 2  # warm-up, measured, the counting window
    record = steps.record()
    samples = record["metrics"]["step_time"]["samples"]
    assert record["steps"] == len(samples) == 5 and all(s > 0 for s in samples)
    throughput = record["metrics"]["throughput"]
    assert throughput["unit"] == "items/s"
    assert throughput["value"] == pytest.approx(4 * 2 / record["metrics"]["step_time"]["value"])
    assert record["counters"]["window_steps"] == 2
    assert record["counters"]["per_step"]["ops/aten::mm"] == 1
    assert record["counters"]["per_step"]["flops"] == 2 * 4 * 8 * 8
    assert (tmp_path / "progress-rank0").read_text().split()[::2] == ["7", "count"]
    with pytest.raises(RuntimeError, match="one loop per test"):
        steps([1])
    short = Steps(cell.replace(warmup_steps=1), ctx)
    assert len(list(short([torch.ones(1)] * 3))) == 3  # the cell's warm-up; until the end
    record = short.record()
    assert record["steps"] == 2 and record["counters"] is None
    assert record["metrics"]["throughput"]["unit"] == "steps/s"
    assert "ended before the counting window" in record["info"]["no_count_window"]
    with pytest.raises(RuntimeError, match="nothing was measured"):
        Steps(cell, ctx).record()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def as_rank_zero(monkeypatch, worker, **env):
    """The worker in this process as the one rank of a launch: its own
    process set-up, which would act on the test process, left out."""
    monkeypatch.setattr(worker, "die_with_parent", lambda ppid: True)
    monkeypatch.setattr(worker, "watch_launcher", lambda: None)
    monkeypatch.setattr(worker, "faulthandler", types.SimpleNamespace(register=lambda *a, **k: None))
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                       **env}.items():
        monkeypatch.setenv(key, value)


def test_worker_runs_a_module_function_and_writes_its_record(project, monkeypatch):
    from perfsuite.rank import worker

    as_rank_zero(monkeypatch, worker, MASTER_PORT=str(_free_port()))
    cell = Cell(tier="smoke", workload="mywork:train", **cells.USER_DEFAULTS)
    (project / "cell.json").write_text(json.dumps(cell.params()))
    assert worker.main(["--cell-file", str(project / "cell.json"), "--out", str(project)]) == 0
    record = json.loads((project / "rank0.json").read_text())
    assert record["status"] == "ok", record.get("error")
    assert record["steps"] == 4 and record["counters"]["window_steps"] == 2
    import torch.distributed as dist

    assert not dist.is_initialized()  # the worker ended the group the workload left up
    assert os.getcwd() == str(project)


RANK_TESTS = '''
import pytest


@pytest.mark.perf_ranks(1)
@pytest.mark.parametrize("width", [4, 8])
def test_widths(perf_dist, perf_steps, width):
    import torch

    for x in perf_steps(iter(lambda: torch.ones(width), None), warmup=1, steps=3, count=0):
        x.sum()
    assert width == 4, f"rank {perf_dist.rank} finds width {width}"
'''


def test_a_test_runs_in_the_rank_as_its_own_cell_and_fails_with_its_message(project, monkeypatch):
    """What the worker does in a rank of a user test (perfsuite.plugin.ranktest),
    in this process: pytest on that one test, its own parameters kept."""
    from perfsuite.rank import worker

    (project / "test_rank.py").write_text(RANK_TESTS)
    as_rank_zero(monkeypatch, worker, PERFSUITE_PYTEST_ROOTDIR=str(project))
    records = {}
    for width in (4, 8):
        monkeypatch.setenv("MASTER_PORT", str(_free_port()))
        cell = cells.cell_of_test(f"test_rank.py::test_widths[{width}]", 1)
        (project / "cell.json").write_text(json.dumps(cell.params()))
        worker.main(["--cell-file", str(project / "cell.json"), "--out", str(project)])
        records[width] = json.loads((project / "rank0.json").read_text())
    import torch.distributed as dist

    if dist.is_initialized():  # the failed rank's group: a launch ends its process
        dist.destroy_process_group()
    assert records[4]["status"] == "ok" and records[4]["steps"] == 3
    error = records[8]["error"]
    assert error["type"] == "AssertionError" and "rank 0 finds width 8" in error["message"]
    assert "assert 8 == 4" in error["message"]  # pytest's explanation, from the rank
    assert 'test_rank.py", line 12, in test_widths' in error["traceback"]
    assert "_pytest" not in error["traceback"]  # the test's frames, not pytest's


@pytest.mark.parametrize("returned, named", [
    ('{"metrics": [1, 2]}', "metrics"),
    ('{"metrics": {"step_time": 0.1}}', "metrics.step_time"),
    ('{"metrics": {"step_time": {"value": "fast", "unit": "s"}}}', "metrics.step_time.value"),
    ('{"metrics": {"step_time": {"value": 0.1, "unit": "s", "samples": [0.1, None]}}}',
     "metrics.step_time.samples"),
    ('{"steps": "many"}', "steps"),
    ('{"counters": 3}', "counters"),
    ('{"status": "ok", "metrics": {}}', "status"),
    ('{"info": {"model": object()}}', "info"),
])
def test_a_workload_record_of_the_wrong_shape_is_that_cells_error(project, monkeypatch, returned, named):
    """Checked in the rank, where it is made: the record says which field is
    wrong, and the cell is an error instead of the results merge's traceback."""
    from perfsuite.rank import worker

    module = "bad_" + named.replace(".", "_")  # one module a case: an imported one stays imported
    (project / f"{module}.py").write_text(f"def train(cell, ctx):\n    return {returned}\n")
    as_rank_zero(monkeypatch, worker, MASTER_PORT=str(_free_port()))
    cell = Cell(tier="smoke", workload=f"{module}:train", **cells.USER_DEFAULTS)
    (project / "cell.json").write_text(json.dumps(cell.params()))
    assert worker.main(["--cell-file", str(project / "cell.json"), "--out", str(project)]) == 1
    record = json.loads((project / "rank0.json").read_text())
    assert record["status"] == "error" and record["error"]["type"] == "WorkloadRecordError"
    assert f"workload '{module}:train' returned a record whose {named}" in record["error"]["message"]
