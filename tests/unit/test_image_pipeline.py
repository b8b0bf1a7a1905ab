"""The image data pipeline: images resized once (not per item while a step
waits), the data's share of a step in every result, DataLoader workers per GPU."""

import pickle
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader
from torchvision.transforms.v2 import functional as TF

from perfsuite.cells import Cell
from perfsuite.judge import judging as judge
from perfsuite.launch.launch import LaunchOptions, run_cell
from perfsuite.rank import meter
from perfsuite.workloads import image, image_data
from tests.unit.cellkit import tiny_image_cell


@pytest.fixture
def resizes(monkeypatch):
    """Calls of the resize the data module makes, counted."""
    calls = []
    real = image_data.TF.resize

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(image_data.TF, "resize", counted)
    return calls


def _grey(n=80, side=28, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(n, side, side, generator=gen), torch.randint(0, 10, (n,), generator=gen)


def test_a_500px_batch_is_sliced_from_a_split_resized_once(resizes):
    images, labels = _grey(n=130)
    dataset = image_data.ResizedImages(images, labels, 500, "fp32")
    batches = iter(DataLoader(dataset, batch_size=64, shuffle=True))
    next(batches)  # the first batch may resize the split: in whole chunks, not per item
    made = len(resizes)
    assert made <= 2, f"{made} resizes for a batch of 64"  # 130 images: one chunk
    batch, batch_labels = next(batches)
    assert len(resizes) == made  # a later batch resizes nothing
    # what the GPU receives is the papers' full-size, 3-channel batch in the cell's precision
    assert batch.shape == (64, 3, 500, 500) and batch.dtype == torch.float32
    assert batch_labels.shape == (64,)


def test_an_item_is_the_per_item_resize_to_within_a_byte(resizes):
    images, labels = _grey(n=3, side=8)
    for precision in ("fp64", "fp16"):
        item, label = image_data.ResizedImages(images, labels, 40, precision)[2]
        expected = TF.resize(images[2].unsqueeze(0), [40, 40], antialias=True)
        expected = ((expected - images.mean()) / images.std()).expand(3, -1, -1)
        assert item.dtype == image_data.DTYPES[precision] and item.shape == (3, 40, 40)
        quantum = 1 / (255 * float(images.std()))  # one step of the cached bytes, normalised
        assert float((item.double() - expected.double()).abs().max()) <= quantum / 2 + 2e-3
        assert int(label) == int(labels[2])


def test_the_resized_split_is_one_file_for_every_rank_and_launch(tmp_path, resizes):
    images, labels = _grey(n=40)
    first = image_data.ResizedImages(images, labels, 64, "fp32", tmp_path).prepare()
    made = len(resizes)
    (cached,) = (tmp_path / "image" / "resized").glob("*.u8")
    assert cached.stat().st_size == 40 * 64 * 64
    second = image_data.ResizedImages(images, labels, 64, "fp32", tmp_path).prepare()
    assert len(resizes) == made  # another rank (or launch) maps the file
    assert torch.equal(first.resized, second.resized)
    # a worker started by spawn gets the file's name, not its pixels
    shipped = pickle.loads(pickle.dumps(second))
    assert shipped.resized is None and len(pickle.dumps(second)) < cached.stat().st_size
    assert torch.equal(shipped[7][0], second[7][0]) and len(resizes) == made
    # other images (another download, the test split) get a file of their own
    other, _ = _grey(n=40, seed=1)
    image_data.ResizedImages(other, labels, 64, "fp32", tmp_path).prepare()
    assert len(list((tmp_path / "image" / "resized").glob("*.u8"))) == 2


def _cell(**kw):
    base = dict(tier="gate", workload="image", strategy="dp", device="cuda", world_size=4,
                precision="fp32", pin_memory=False, dataset="digits", batch_size=32,
                image_size=224, loader_workers=4)
    return Cell(**{**base, **kw})


@pytest.mark.parametrize("strategy,world,expected", [
    ("dp", 4, 16), ("dp", 2, 8), ("dp", 1, 4), ("ddp-ds", 4, 4), ("ddp", 2, 4), ("ddp-rr", 4, 4)])
def test_loader_workers_are_per_gpu(strategy, world, expected):
    assert image.loader_workers(_cell(strategy=strategy, world_size=world)) == expected


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_a_dp_loader_feeds_every_gpu_with_its_own_workers():
    images, labels = _grey(n=8)
    dataset = image_data.ResizedImages(images, labels, 8, "fp32")
    ctx = SimpleNamespace(seed=0, rank=0, world_size=1, device="cpu")
    loader = image.build_loader(_cell(world_size=3), ctx, dataset)
    assert loader.num_workers == 12 and loader.batch_size == 3 * 32
    assert loader.persistent_workers  # started once, not every epoch
    in_process = image.build_loader(_cell(device="cpu", world_size=1, loader_workers=0), ctx, dataset)
    assert in_process.num_workers == 0 and not in_process.persistent_workers  # CPU smoke cells


def test_data_waits_are_shares_of_the_measured_steps():
    clock = iter([0.0, 1.0, 2.0, 4.0, 10.0, 11.0, 13.0])
    waits = meter.DataWaits(1, clock=lambda: next(clock))
    waits.mark()                 # step 0 (warm-up): 0 -> 1
    waits.add(0.9, 0.0)
    waits.mark()                 # step 1: 1 -> 2
    waits.add(0.25, 0.25)
    waits.mark()                 # step 2: 2 -> 4
    waits.add(0.2, 0.2)
    waits.mark()                 # end of epoch
    waits.close_epoch()          # the gap 4 -> 10 is no step
    waits.mark()                 # step 3: 10 -> 11
    waits.add(0.1, 0.5)
    waits.add(0.1, 0.0)          # ddp-rr: a second batch in the same step
    waits.mark()                 # step 4: 11 -> 13
    waits.add(0.0, 0.2)
    waits.mark()
    shares = waits.shares()
    # data (fetch + copy) / span: 0.5, 0.2, 0.7, 0.1 -> median 0.35; fetch alone: 0.25, 0.1, 0.2, 0
    assert shares == {"data_wait_share": 0.35, "loader_wait_share": 0.15}
    assert meter.DataWaits(0).shares() == {"data_wait_share": None, "loader_wait_share": None}


def test_data_waits_leave_out_the_steps_the_samples_leave_out():
    measured = meter.MeasuredSteps(warmup_steps=1)
    clock = iter([0.0, 1.0, 2.0, 4.0, 5.0])
    waits = meter.DataWaits(measured, clock=lambda: next(clock))
    for fetch, copy in ((0.9, 0.0), (0.25, 0.25), (1.0, 1.0), (0.1, 0.1)):
        waits.mark()
        waits.add(fetch, copy)
    waits.mark()
    measured.leave_out(2)  # say, a partial batch: its 2 s step is not a sample
    assert measured.keep([10, 11, 12, 13]) == [11, 13]
    # data / span of steps 1 and 3: 0.5, 0.2; fetch alone: 0.25, 0.1
    assert waits.shares() == {"data_wait_share": 0.35, "loader_wait_share": 0.175}


def _gpu_result(share):
    return {"metrics": {"step_time": {"samples": [0.1]}, "throughput": {"value": 1.0},
                        "h2d_bytes": {"value": 1.0}},
            "info": {"loader_wait_share": share, "data_wait_share": share}}


def _wait_check(cell, share):
    found = [c for c in judge.sanity_checks(cell, _gpu_result(share))
             if c["name"] == "sanity.loader_wait_share"]
    return found[0] if found else None


def test_a_gpu_cell_that_waits_on_its_loader_is_flagged():
    cell = _cell(strategy="ddp-ds", world_size=1)
    assert _wait_check(cell, 0.04)["verdict"] == judge.PASS
    flagged = _wait_check(cell, 0.31)
    assert flagged["verdict"] == judge.FAIL and "0.1" in flagged["expected"]
    assert "31%" in flagged["message"] and "loader_workers" in flagged["message"]
    assert _wait_check(_cell(strategy="ddp-rr", world_size=2), 0.5) is None  # by design
    assert _wait_check(_cell(device="cpu", world_size=1), 0.5) is None  # GPU cells only
    assert _wait_check(cell, None) is None  # results from before the share was measured


@pytest.mark.slow
def test_a_real_cell_reports_its_data_share(tmp_path):
    cell = tiny_image_cell(world_size=1)
    result = run_cell(cell, tmp_path, LaunchOptions())
    assert result["status"] == "ok", result.get("reason")
    info = result["info"]
    assert info["loader_workers"] == 0
    data, loader = info["data_wait_share"], info["loader_wait_share"]
    assert 0 < loader <= data < 1  # in-process loading on CPU: a part of every step
    assert not [c for c in judge.sanity_checks(cell, result) if c["verdict"] != judge.PASS]
    # the timeline's parts add up to the launch, the set-up (data, model) its own part
    parts = result["timeline"]
    assert 0 < parts["workload_setup"] < parts["wall"] and parts["workload_other"] >= 0
    assert sum(v for k, v in parts.items() if k != "wall") == pytest.approx(parts["wall"])
