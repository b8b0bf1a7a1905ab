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
    with pytest.raises(image_data.DataInvalid, match="bad: truncated data: expected 10 bytes.*got 3"):
        image_data._read_idx(tmp_path / "bad")


# -- MNIST files that are there but cannot be used -------------------------

def _idx_bytes(dims, payload=None, dtype=0x08):
    import struct

    if payload is None:
        count = 1
        for n in dims:
            count *= n
        payload = bytes(i % 10 for i in range(count))
    return struct.pack(">BBBB", 0, 0, dtype, len(dims)) + struct.pack(">" + "I" * len(dims), *dims) + payload


def _mnist_dir(tmp_path, gz=False, **files):
    """The four MNIST files, small (10 train and 4 test images of 28x28);
    ``files`` replaces one by its key (train_images, ...) with raw bytes."""
    import gzip

    sizes = {"train": 10, "test": 4}
    for key, stem in image_data.MNIST_FILES.items():
        part, kind = key.split("_")
        n = sizes[part]
        data = files.get(key, _idx_bytes((n, 28, 28) if kind == "images" else (n,)))
        if gz:
            (tmp_path / (stem + ".gz")).write_bytes(gzip.compress(data))
        else:
            (tmp_path / stem).write_bytes(data)
    return tmp_path


FIX = "with an intact copy of the MNIST IDX files"


def test_small_mnist_fixture_loads(tmp_path):
    train_x, train_y, test_x, test_y = image_data.load("mnist", _mnist_dir(tmp_path))
    assert train_x.shape == (10, 28, 28) and test_y.tolist() == [0, 1, 2, 3]
    assert float(train_x.max()) <= 1.0


@pytest.mark.parametrize("key,data,message", [
    ("train_images", b"PK\x03\x04" + bytes(100),
     r"bad magic number 0x504b0304 \(an IDX file starts with 0x0000 then a dtype code and the "
     r"number of dimensions\)"),
    ("train_images", b"\x00\x00", r"2 bytes, too short for an IDX header"),
    ("train_images", _idx_bytes((10, 28, 28), bytes(7000)),
     r"truncated data: expected 7840 bytes after the header \(10x28x28\), got 7000"),
    ("train_images", _idx_bytes((10, 28, 28), bytes(7845)),
     r"expected 7840 bytes after the header \(10x28x28\), got 7845"),
    ("test_labels", _idx_bytes((4,), dtype=0x0D),
     r"wrong dtype code 0x0d \(float32\); MNIST files hold unsigned bytes \(0x08\)"),
    ("train_images", _idx_bytes((10, 784)),
     r"wrong number of dimensions: 2 \(10x784\), images need 3 \(count, rows, columns\)"),
    ("train_labels", _idx_bytes((10, 28, 28)),
     r"wrong number of dimensions: 3 \(10x28x28\), labels need 1 \(count\)"),
    ("train_images", bytes([0, 0, 8, 3]) + bytes(6),
     r"10 bytes, too short for the header of 3 dimensions \(16 bytes\)"),
    ("test_images", _idx_bytes((0, 28, 28)), r"holds no images \(0x28x28\)"),
    ("test_images", _idx_bytes((4, 0, 28)), r"holds no images \(4x0x28\)"),
    ("test_labels", _idx_bytes((0,)), r"holds no labels \(0\)"),
], ids=["magic", "short", "truncated", "trailing", "dtype", "images-ndim", "labels-ndim",
        "short-dims", "no-images", "empty-images", "no-labels"])
@pytest.mark.parametrize("gz", [False, True])
def test_a_bad_mnist_file_is_named_with_what_is_wrong_and_the_fix(tmp_path, key, data, message, gz):
    folder = _mnist_dir(tmp_path, gz=gz, **{key: data})
    path = folder / (image_data.MNIST_FILES[key] + (".gz" if gz else ""))
    with pytest.raises(image_data.DataInvalid) as err:
        image_data.load("mnist", folder)
    text = str(err.value)
    assert text.startswith(f"{path}: "), text
    assert __import__("re").search(message, text), text
    assert FIX in text and "--perf-tier gate" in text
    assert isinstance(err.value, ValueError)


def test_a_damaged_gzip_file_is_named(tmp_path):
    folder = _mnist_dir(tmp_path, gz=True)
    path = folder / "train-images-idx3-ubyte.gz"
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(image_data.DataInvalid, match=rf"^{path}: damaged gzip file") as err:
        image_data.load("mnist", folder)
    assert FIX in str(err.value)
    path.write_bytes(b"not gzip at all" * 10)  # named .gz but plain bytes
    with pytest.raises(image_data.DataInvalid, match=rf"^{path}: bad magic number"):
        image_data.load("mnist", folder)


def test_a_gzipped_file_without_gz_suffix_is_read(tmp_path):
    import gzip

    folder = _mnist_dir(tmp_path)
    path = folder / "train-labels-idx1-ubyte"
    path.write_bytes(gzip.compress(path.read_bytes()))
    assert image_data.load("mnist", folder)[1].tolist() == list(range(10))


@pytest.mark.parametrize("part,n_images,n_labels", [("train", 10, 9), ("test", 4, 5)])
def test_image_and_label_counts_must_agree(tmp_path, part, n_images, n_labels):
    folder = _mnist_dir(tmp_path, **{f"{part}_labels": _idx_bytes((n_labels,))})
    prefix = "train" if part == "train" else "t10k"
    with pytest.raises(image_data.DataInvalid) as err:
        image_data.load("mnist", folder)
    text = str(err.value)
    assert str(folder / f"{prefix}-images-idx3-ubyte") in text
    assert str(folder / f"{prefix}-labels-idx1-ubyte") in text
    assert f"image and label counts differ: {n_images} vs {n_labels}" in text and FIX in text


def test_labels_outside_0_to_9_are_named(tmp_path):
    folder = _mnist_dir(tmp_path, train_labels=_idx_bytes((10,), bytes([0, 1, 10, 3, 255, 5, 6, 7, 10, 9])))
    path = folder / "train-labels-idx1-ubyte"
    with pytest.raises(image_data.DataInvalid,
                       match=rf"^{path}: labels outside 0-9: found 10 and 255 \(3 of 10 labels\)") as err:
        image_data.load("mnist", folder)
    assert FIX in str(err.value)


def test_a_data_dir_that_does_not_exist_is_named(tmp_path):
    missing = tmp_path / "no-such-dir"
    with pytest.raises(image_data.DataMissing, match=rf"{missing}: no such directory.*--perf-data-dir"):
        image_data.load("mnist", missing)


# -- which steps are samples ------------------------------------------------

def _run_in_process(tmp_path, monkeypatch, **changes):
    """The workload run in this process (``dp`` on the CPU needs no process
    group) on 40 of the digits, with the DataLoader worker starts counted."""
    from torch.utils.data import dataloader

    from perfsuite.context import RankContext

    digits = image_data.load("digits", None)
    monkeypatch.setattr(image.image_data, "load", lambda *args: (digits[0][:40], digits[1][:40],
                                                                   digits[2][:8], digits[3][:8]))
    starts = []
    real = dataloader._MultiProcessingDataLoaderIter.__init__

    def counted(self, loader):
        starts.append(loader.num_workers)
        real(self, loader)

    monkeypatch.setattr(dataloader._MultiProcessingDataLoaderIter, "__init__", counted)
    monkeypatch.delenv("PERFSUITE_PROFILER", raising=False)
    # 40 images in batches of 16: two whole batches and one of 8 an epoch
    cell = _cell(strategy="dp", world_size=1, batch_size=16, image_size=8, epochs=2,
                 warmup_steps=1, **changes)
    ctx = RankContext(rank=0, world_size=1, local_rank=0, device="cpu", out_dir=tmp_path,
                      options={"count_steps": "0", "cache_dir": str(tmp_path)})
    return image.run(cell, ctx), starts


@pytest.mark.slow
def test_samples_leave_out_partial_batches_and_each_epochs_loader_start(tmp_path, monkeypatch):
    # 6 steps: 1 warm-up; each epoch's last batch (8 of 16 images) is other
    # work; with worker processes, each epoch's first step waits for them
    # (the first epoch's is also the warm-up)
    record, starts = _run_in_process(tmp_path, monkeypatch, loader_workers=1)
    assert record["steps"] == 6 - 1 - 2 - 1 == len(record["metrics"]["step_time"]["samples"])
    assert starts == [1]  # the workers start once and serve every epoch


def test_in_process_loading_keeps_each_epochs_first_step(tmp_path, monkeypatch):
    # no worker to start: an epoch's first step fetches its batch like any other
    record, starts = _run_in_process(tmp_path, monkeypatch, loader_workers=0)
    assert record["steps"] == 6 - 1 - 2 and starts == []


def _resident_in_process(tmp_path, monkeypatch, loader_workers, windows=2, steps=3):
    """The workload resident for an A/B session in this process: a
    coordinator asks for ``windows`` windows of ``steps`` steps."""
    import threading

    from perfsuite.ab.resident import Coordinator

    coordinator = Coordinator()
    try:
        for key, value in coordinator.env("A").items():
            monkeypatch.setenv(key, value)
        done = {}
        worker = threading.Thread(target=lambda: done.update(
            run=_run_in_process(tmp_path, monkeypatch, loader_workers=loader_workers)), daemon=True)
        worker.start()
        coordinator.wait_ready(lambda side: worker.is_alive(), timeout_s=60, sides=("A",))
        replies = [coordinator.window("A", steps, timeout_s=60) for _ in range(windows)]
        coordinator.stop()
        worker.join(60)
    finally:
        coordinator.close()
    record, _ = done["run"]
    return record, replies


@pytest.mark.slow
@pytest.mark.parametrize("loader_workers,steps_run", [
    # 3 batches an epoch (16, 16, 8 images); 1 warm-up step. With a worker,
    # an epoch's first step and its partial last are other work: one step an
    # epoch is the cell's, so 6 window steps take 6 epochs less the warm-up's
    (1, 6 * 3 - 1),
    # in-process loading: only the partial batches are other work
    (0, 1 + 9),
])
def test_resident_windows_leave_out_what_the_timed_loop_leaves_out(tmp_path, monkeypatch,
                                                                     loader_workers, steps_run):
    """A window holds the cell's own steps only: an epoch's partial batch
    and, with loader workers, its first step (the workers' restart: 0.4-0.7 s
    against 138 ms steps on an H100) run in their place but are not among the
    window's times, as the timed loop leaves them out of its samples."""
    record, replies = _resident_in_process(tmp_path, monkeypatch, loader_workers)
    assert [len(per_rank[0]) for per_rank in replies] == [3, 3]
    assert record["steps"] == 6 == len(record["metrics"]["step_time"]["samples"])
    assert len(record["metrics"]["loss"]["samples"]) == steps_run  # every step trained


# -- the learning rate over a run -------------------------------------------

def test_an_unknown_lr_decay_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"lr_decay 'linear' not in \('none', 'cosine'\)"):
        _cell(lr_decay="linear")


def _learning_rates(cell, total_steps, steps):
    import torch

    model = torch.nn.Linear(4, 2)
    step = image.make_train_step(cell, model, torch.device("cpu"), total_steps=total_steps)
    lrs = []
    for _ in range(steps):
        step(torch.randn(3, 4), torch.tensor([0, 1, 0]))
        lrs.append(step.optimizer.param_groups[0]["lr"])  # the next step's
    return lrs


def test_cosine_decay_reaches_zero_at_the_last_step_and_stays_there():
    lrs = _learning_rates(_cell(lr=4e-3, lr_decay="cosine"), total_steps=8, steps=11)
    assert lrs[3] == pytest.approx(4e-3 * 0.5)  # half-way: cos(pi / 2)
    assert all(a > b for a, b in zip(lrs[:8], lrs[1:8]))
    assert lrs[7:] == [0.0] * 4  # the counting window after training moves nothing


def test_without_decay_the_learning_rate_is_held():
    assert _learning_rates(_cell(lr=4e-3), total_steps=8, steps=10) == [4e-3] * 10
