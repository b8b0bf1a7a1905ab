"""What "fp32" runs on a GPU: the TF32 switches an image cell sets, and what
its result says ran. No GPU needed: torch's switches are process settings,
and the GPU's compute capability is monkeypatched."""

import pytest
import tomllib
import torch

from perfsuite import cells
from perfsuite.cells import Cell, CellError
from perfsuite.context import RankContext
from perfsuite.workloads import image

SWITCHES = {"conv": ("tf32", "ieee"), "off": ("ieee", "ieee"), "all": ("tf32", "tf32")}


def _cell(**kw):
    base = dict(tier="gate", workload="image", strategy="ddp-ds", device="cuda", world_size=1,
                precision="fp32", pin_memory=False, dataset="digits", batch_size=16, image_size=32)
    return Cell(**{**base, **kw})


def _switches():
    return (torch.backends.cudnn.conv.fp32_precision, torch.backends.cuda.matmul.fp32_precision)


@pytest.fixture(autouse=True)
def _restore_switches():
    saved = (*_switches(), torch.backends.cudnn.rnn.fp32_precision)
    yield
    (torch.backends.cudnn.conv.fp32_precision, torch.backends.cuda.matmul.fp32_precision,
     torch.backends.cudnn.rnn.fp32_precision) = saved


@pytest.fixture
def hopper(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    return torch.device("cuda:0")


@pytest.mark.parametrize("mode", ["conv", "off", "all"])
def test_an_image_cell_sets_its_tf32_switches_explicitly(mode):
    conv, matmul = SWITCHES[mode]
    flip = {"tf32": "ieee", "ieee": "tf32"}
    torch.backends.cudnn.conv.fp32_precision = flip[conv]  # not what the cell asks
    torch.backends.cuda.matmul.fp32_precision = flip[matmul]
    image.set_fp32_math(_cell(tf32=mode))
    assert _switches() == (conv, matmul)
    assert torch.backends.cudnn.rnn.fp32_precision == conv  # conv and rnn alike: no "mixed APIs" error


def test_the_model_is_built_with_the_cells_fp32_math(tmp_path):
    torch.backends.cudnn.conv.fp32_precision = "tf32"
    ctx = RankContext(rank=0, world_size=1, local_rank=0, device="cpu", out_dir=tmp_path)
    image.build_model(_cell(device="cpu", strategy="dp", tf32="off"), ctx)
    assert _switches() == ("ieee", "ieee")


def test_precision_effective_says_what_ran(hopper, monkeypatch):
    said = {}
    for mode in SWITCHES:
        image.set_fp32_math(_cell(tf32=mode))
        said[mode] = image.effective_precision(_cell(tf32=mode), hopper)
    assert said == {"conv": "fp32 (convolutions TF32)", "off": "fp32 (strict)",
                    "all": "fp32 (convolutions and matmuls TF32)"}
    image.set_fp32_math(_cell())
    assert image.effective_precision(_cell(device="cpu"), torch.device("cpu")) == "fp32 (strict)"
    assert image.effective_precision(_cell(precision="fp64"), hopper) == "fp64"
    assert image.effective_precision(_cell(precision="fp16"), hopper) == "fp16-autocast+gradscaler"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))
    assert image.effective_precision(_cell(), hopper) == "fp32 (strict)"  # a V100 has no TF32


def test_the_experiment_data_says_the_papers_fp32():
    data = tomllib.loads((cells.EXPERIMENTS_DIR / "image.toml").read_text())
    assert {tier: d["image"]["tf32"] for tier, d in data["defaults"].items()} == \
        {"smoke": "conv", "gate": "conv", "full": "conv"}
    image_cells = [c for c in cells.matrix().values() if c.workload == "image"]
    assert image_cells and {c.tf32 for c in image_cells} == {"conv"}
    table2 = cells.get("full/image/ddp-ds/g4/fp32/px500/nopin/nchw")  # ids stay as they were
    assert table2.tf32 == "conv"
    strict = table2.replace(tf32="off")
    assert strict.id == "full/image/ddp-ds/g4/fp32/px500/nopin/nchw/tf32-off"
    assert Cell.from_params(strict.params()) == strict
    with pytest.raises(CellError, match="tf32 'fp19' not in"):
        _cell(tf32="fp19")
