"""Image workload pieces that need no process group."""

import pytest

from perfsuite.cells import Cell
from perfsuite.workloads import image, image_data


@pytest.mark.parametrize("batches,world,max_steps,expected", [
    (90, 2, 0, 45), (89, 2, 0, 44), (7, 4, 0, 1), (3, 4, 0, 0), (89, 2, 10, 10)])
def test_round_robin_cap_is_a_multiple_of_world(batches, world, max_steps, expected):
    steps = image.steps_per_epoch("ddp-rr", batches, world, max_steps)
    assert steps == expected
    assert steps * world <= batches  # no rank waits in an all-reduce the others skip


@pytest.mark.parametrize("strategy", ["dp", "ddp", "ddp-ds"])
def test_other_strategies_take_every_batch(strategy):
    assert image.steps_per_epoch(strategy, 89, 2, 0) == 89
    assert image.steps_per_epoch(strategy, 89, 2, 5) == 5


def _cell(**kw):
    base = dict(tier="smoke", workload="image", strategy="ddp-ds", device="cpu", world_size=2,
                precision="fp32", pin_memory=False, dataset="digits", batch_size=16, image_size=32)
    return Cell(**{**base, **kw})


def test_images_per_step():
    assert image.images_per_step(_cell(strategy="ddp")) == 16
    assert image.images_per_step(_cell(strategy="ddp-rr")) == 32
    assert image.images_per_step(_cell(strategy="ddp-ds", world_size=1)) == 16


def test_digits_split_and_resize():
    train_x, train_y, test_x, test_y = image_data.load("digits", None)
    assert len(train_y) + len(test_y) == 1797 and len(test_y) == 360
    ds = image_data.ResizedImages(train_x, train_y, 48, "fp64")
    img, label = ds[0]
    assert img.shape == (3, 48, 48) and str(img.dtype) == "torch.float64"
    assert 0 <= int(label) <= 9


def test_the_digits_split_is_cached_whole_and_rebuilt_when_damaged(tmp_path, monkeypatch):
    import sys

    import torch

    fresh = image_data.load("digits", None, tmp_path)
    (cached,) = (tmp_path / "image").glob("digits-split-*.pt")
    assert not list((tmp_path / "image").glob(".*tmp"))
    # a later launch reads the file and leaves scikit-learn unimported
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    again = image_data.load("digits", None, tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(fresh, again))
    monkeypatch.delitem(sys.modules, "sklearn.datasets")
    cached.write_bytes(b"half a file")
    rebuilt = image_data.load("digits", None, tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(fresh, rebuilt))


def test_mnist_needs_a_directory(tmp_path):
    with pytest.raises(image_data.DataMissing, match="--perf-data-dir"):
        image_data.load("mnist", None)
    with pytest.raises(image_data.DataMissing, match="train-images-idx3-ubyte"):
        image_data.load("mnist", tmp_path)


def test_mnist_idx_files_are_read(tmp_path):
    import gzip
    import struct

    def write(name, dims, payload):
        header = struct.pack(">I", 0x0800 | len(dims)) + struct.pack(">" + "I" * len(dims), *dims)
        with gzip.open(tmp_path / (name + ".gz"), "wb") as fh:
            fh.write(header + payload)

    for prefix, n in (("train", 5), ("t10k", 3)):
        write(f"{prefix}-images-idx3-ubyte", (n, 28, 28), bytes(range(256)) * 0 + bytes(n * 784))
        write(f"{prefix}-labels-idx1-ubyte", (n,), bytes(range(n)))
    train_x, train_y, test_x, test_y = image_data.load("mnist", tmp_path)
    assert train_x.shape == (5, 28, 28) and test_y.tolist() == [0, 1, 2]


def test_truncated_idx_file_is_named(tmp_path):
    import struct

    (tmp_path / "bad").write_bytes(struct.pack(">II", 0x0801, 10) + b"\x00" * 3)
    with pytest.raises(ValueError, match="bad: 3 bytes"):
        image_data._read_idx(tmp_path / "bad")
