"""The experiment matrix: every paper cell present, ids unique and stable."""

import dataclasses
import itertools
import json
from pathlib import Path

import pytest

from perfsuite import cells
from perfsuite.cells import Cell, CellError


def ids(tier):
    return {c.id for c in cells.select(tier=tier)}


def test_fig1_every_strategy_and_gpu_count():
    for strategy, n in itertools.product(["ddp", "ddp-rr", "ddp-ds"], [1, 2, 3, 4]):
        cell = cells.get(f"full/image/{strategy}/g{n}/fp32/px700/nopin/nchw")
        assert "2503.15252 Fig. 1" in cell.sources
        assert cell.epochs == 20 and cell.dataset == "mnist"


def test_fig2_image_sizes_fp64():
    for px, n in itertools.product([100, 200, 300, 400, 500], [1, 2, 3, 4]):
        assert "2503.15252 Fig. 2" in cells.get(f"full/image/ddp-ds/g{n}/fp64/px{px}/nopin/nchw").sources


def test_table2_and_table3_rows_share_cells():
    for prec, n in itertools.product(["fp64", "fp32", "fp16"], [1, 2, 3, 4]):
        assert "2503.15252 Table 2" in cells.get(f"full/image/ddp-ds/g{n}/{prec}/px500/nopin/nchw").sources
    for pin, n in itertools.product(["pin", "nopin"], [1, 2, 3, 4]):
        assert "2503.15252 Table 3" in cells.get(f"full/image/ddp-ds/g{n}/fp32/px500/{pin}/nchw").sources
    # Table 2's FP32 row and Table 3's pin=False row are one measurement.
    shared = cells.get("full/image/ddp-ds/g2/fp32/px500/nopin/nchw")
    assert {"2503.15252 Table 2", "2503.15252 Table 3"} <= set(shared.sources)
    # Fig. 2's 500 px FP64 cells are Table 2's FP64 rows.
    assert "2503.15252 Fig. 2" in cells.get("full/image/ddp-ds/g4/fp64/px500/nopin/nchw").sources


def test_dataparallel_and_memory_format():
    for n in [1, 2, 3, 4]:
        assert cells.get(f"full/image/dp/g{n}/fp32/px500/nopin/nchw").processes == 1
        assert cells.get(f"full/image/ddp-ds/g{n}/fp16/px500/nopin/nhwc")


def test_smoke_tier_covers_every_axis_on_cpu():
    smoke = cells.select(tier="smoke", workload="image")
    assert {c.device for c in smoke} == {"cpu"}
    assert {c.strategy for c in smoke} == set(cells.IMAGE_STRATEGIES)
    assert {c.precision for c in smoke} >= {"fp64", "fp32", "bf16"}
    assert {c.pin_memory for c in smoke} == {False, True}
    assert {c.world_size for c in smoke} == {1, 2}
    assert {c.memory_format for c in smoke} == {"nchw", "nhwc"}
    accuracy = [c for c in smoke if c.min_accuracy > 0]
    assert len(accuracy) == 1 and accuracy[0].min_accuracy >= 0.9


def test_gate_tier_is_gpu_and_short():
    gate = cells.select(tier="gate", workload="image")
    assert gate and {c.device for c in gate} == {"cuda"}
    assert {c.strategy for c in gate} == set(cells.IMAGE_STRATEGIES)
    assert {c.precision for c in gate} == {"fp64", "fp32", "fp16"}
    assert all(c.dataset == "digits" for c in gate)  # needs no data download


# The first H100 run's 500 px cells (the papers' per-step setting, 1 GPU).
MEASURED_500PX = Path(__file__).parents[1] / "data" / "h100-2026-11-25" / "px500-b64-g1.results.json"
VARIED = {"strategy", "world_size", "precision", "pin_memory", "memory_format", "profile", "sources"}


def test_gate_image_cells_run_the_setting_measured_on_an_h100():
    """Baselines recorded from those results apply to the gate cells: the
    same ids with the same parameters, and every other gate cell differs
    from them only in what its experiment varies."""
    measured = json.loads(MEASURED_500PX.read_text())["cells"]
    without = lambda params, keys: {k: v for k, v in params.items() if k not in keys}  # noqa: E731
    # parameters added since that run: the cells must hold them at their defaults
    defaults = {f.name: f.default for f in dataclasses.fields(Cell)}
    for entry in measured:
        entry["params"] = {**{k: defaults[k] for k in defaults.keys() - entry["params"].keys()},
                           **entry["params"]}
        assert without(cells.get(entry["id"]).params(), {"sources"}) == without(entry["params"], {"sources"})
    setting = without(measured[0]["params"], VARIED)
    for cell in cells.select(tier="gate", workload="image"):
        assert without(cell.params(), VARIED) == setting, cell.id


def test_ids_unique_and_round_trip():
    every = cells.matrix()
    assert len(every) == len({c.id for c in every.values()})
    for cell in every.values():
        assert Cell.from_params(cell.params()) == cell
        assert cell.id.startswith(f"{cell.tier}/{cell.workload}/")


def test_id_is_stable():
    cell = Cell(tier="full", workload="image", strategy="ddp-ds", device="cuda", world_size=4,
                precision="fp16", pin_memory=True, dataset="mnist", batch_size=64,
                image_size=500)
    assert cell.id == "full/image/ddp-ds/g4/fp16/px500/pin/nchw"
    assert cell.gpus_needed == 4


@pytest.mark.parametrize("bad", [
    {"precision": "fp16", "device": "cpu"},
    {"strategy": "zero3"},
    {"strategy": "dp", "device": "cpu", "world_size": 2},
    {"tier": "nightly"},
])
def test_invalid_cells_are_refused(bad):
    base = dict(tier="smoke", workload="image", strategy="ddp", device="cpu", world_size=1,
                precision="fp32", pin_memory=False, dataset="digits", batch_size=8,
                image_size=32)
    with pytest.raises(CellError):
        Cell(**{**base, **bad})


def test_unknown_id_names_it():
    with pytest.raises(CellError, match="smoke/image/nope"):
        cells.select(ids=["smoke/image/nope"])


def test_conflicting_experiments_are_refused(tmp_path):
    path = tmp_path / "x.toml"
    path.write_text("""
[[experiment]]
name = "a"
tier = "smoke"
workload = "image"
fixed = {strategy = "ddp", device = "cpu", world_size = 1, precision = "fp32", pin_memory = false, dataset = "digits", batch_size = 8, image_size = 32}
[[experiment]]
name = "b"
tier = "smoke"
workload = "image"
fixed = {strategy = "ddp", device = "cpu", world_size = 1, precision = "fp32", pin_memory = false, dataset = "digits", batch_size = 16, image_size = 32}
""")
    with pytest.raises(CellError, match="different parameters"):
        cells.load_matrix([path])


def test_malformed_experiment_file_is_named(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text("[[experiment]\nname=")
    with pytest.raises(CellError, match="broken.toml"):
        cells.load_matrix([path])


def test_findings_are_data_and_say_where_they_hold(tmp_path):
    found = {f.name: f for f in cells.findings()}
    fp64 = found["fp32-faster-than-fp64"]
    assert fp64.devices == ("cpu", "cuda") and fp64.low == 1.3 and "2503.15252" in fp64.source
    subject = cells.get("smoke/image/ddp-ds/c2/fp32/px32/nopin/nchw")
    assert fp64.applies(subject.params())
    assert not fp64.applies(cells.get("smoke/image/ddp-ds/c2/fp64/px32/nopin/nchw").params())
    assert not fp64.applies(subject.replace(profile=True).params())
    bad = tmp_path / "bad.toml"
    bad.write_text('[[finding]]\nname = "x"\nsource = "s"\nsubject = {colour = "red"}\n'
                   'twin = {precision = "fp64"}\nlow = 1.0\n')
    with pytest.raises(cells.CellError, match="finding 'x'.*not \\['colour'\\]"):
        cells.load_findings([bad])
