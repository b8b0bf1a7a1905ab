"""Image data: real MNIST IDX files when given, the bundled digits otherwise.

Neither source is downloaded. MNIST comes from a directory the user points
at (``--perf-data-dir``) holding the four IDX files, gzipped or not.
perfsuite ships 1,797 real 8x8 handwritten digits; both are resized to the
cell's image size and given 3 channels, as the paper resized MNIST for
MobileNetV2. The resize happens once per split and size (``resize_split``),
not per item in the DataLoader; see ``ResizedImages`` for why.
"""

from __future__ import annotations

import gzip
import hashlib
import math
import os
import struct
import zlib
from pathlib import Path

import torch
from torch.utils.data import Dataset
from torchvision.transforms.v2 import functional as TF

from perfsuite.system.atomic import atomic_write_chunks

MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}

DTYPES = {"fp64": torch.float64, "fp32": torch.float32, "fp16": torch.float16,
          "bf16": torch.bfloat16}


class DataMissing(FileNotFoundError):
    """A data directory without the expected files."""


class DataInvalid(ValueError):
    """A data file that is there but cannot be used as it stands."""


# What to do about an MNIST file that is there but unusable. MNIST cells are
# the full tier's; the gate tier runs the same strategies on the bundled digits.
def _mnist_fix(it: str = "it") -> str:
    return (f"replace {it} with an intact copy of the MNIST IDX files (the four files "
            f"{', '.join(MNIST_FILES.values())}, gzipped or not, from one download), "
            "or run the gate tier (--perf-tier gate), which trains on the bundled digits "
            "and needs no MNIST")


_GZIP_MAGIC = b"\x1f\x8b"
_IDX_DTYPES = {0x08: "unsigned byte", 0x09: "signed byte", 0x0B: "int16", 0x0C: "int32",
               0x0D: "float32", 0x0E: "float64"}
_IDX_SHAPES = {1: "labels need 1 (count)", 3: "images need 3 (count, rows, columns)"}


def _invalid(path: Path, problem: str) -> DataInvalid:
    return DataInvalid(f"{path}: {problem}; {_mnist_fix()}")


def _read_bytes(path: Path) -> bytes:
    """The file's bytes, gunzipped when it is gzip (by its first bytes, not its name)."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise _invalid(path, f"cannot read it ({err.strerror or err})") from None
    if not data.startswith(_GZIP_MAGIC):
        return data
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as err:  # BadGzipFile is an OSError
        raise _invalid(path, f"damaged gzip file ({err})") from None


def _read_idx(path: Path, ndim: int | None = None) -> torch.Tensor:
    """An unsigned-byte IDX file; ``ndim`` (1 labels, 3 images) when known.

    Every problem is a DataInvalid naming the file, what is wrong and the fix.
    """
    data = _read_bytes(path)
    if len(data) < 4:
        raise _invalid(path, f"{len(data)} bytes, too short for an IDX header "
                             "(4 bytes of magic number, then 4 per dimension)")
    magic, = struct.unpack(">I", data[:4])
    code, dims = data[2], data[3]
    if data[:2] != b"\x00\x00" or code not in _IDX_DTYPES or dims == 0:
        raise _invalid(path, f"bad magic number {magic:#010x} (an IDX file starts with 0x0000 "
                             "then a dtype code and the number of dimensions): not an IDX file")
    if code != 0x08:
        raise _invalid(path, f"wrong dtype code {code:#04x} ({_IDX_DTYPES[code]}); "
                             "MNIST files hold unsigned bytes (0x08)")
    if len(data) < 4 + 4 * dims:
        raise _invalid(path, f"{len(data)} bytes, too short for the header of {dims} dimensions "
                             f"({4 + 4 * dims} bytes)")
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    shown = "x".join(map(str, shape))
    if dims != ndim and (ndim is not None or dims not in _IDX_SHAPES):
        need = _IDX_SHAPES.get(ndim, "MNIST files have 1 (labels) or 3 (images)")
        raise _invalid(path, f"wrong number of dimensions: {dims} ({shown}), {need}")
    payload = data[4 + 4 * dims:]
    expected = math.prod(shape)
    if len(payload) != expected:
        what = "truncated data: expected" if len(payload) < expected else "trailing data: expected"
        raise _invalid(path, f"{what} {expected} bytes after the header ({shown}), "
                             f"got {len(payload)}")
    if 0 in shape:
        raise _invalid(path, f"holds no {'labels' if dims == 1 else 'images'} ({shown})")
    return torch.frombuffer(bytearray(payload), dtype=torch.uint8).reshape(shape)


def _find(data_dir: Path, stem: str) -> Path:
    for name in (stem, stem + ".gz", stem.replace("-idx", ".idx"), stem.replace("-idx", ".idx") + ".gz"):
        for candidate in (data_dir / name, data_dir / "MNIST" / "raw" / name):
            if candidate.exists():
                return candidate
    raise DataMissing(
        f"MNIST file {stem}[.gz] not found in {data_dir} (nor {data_dir}/MNIST/raw); "
        f"put the four IDX files ({', '.join(MNIST_FILES.values())}) there, "
        "or run the cells on the bundled digits (dataset 'digits')")


def _check_labels(images_path: Path, images: torch.Tensor, labels_path: Path,
                  labels: torch.Tensor) -> None:
    if len(images) != len(labels):
        raise DataInvalid(
            f"{images_path} and {labels_path}: image and label counts differ: "
            f"{len(images)} vs {len(labels)} (the two files come from different downloads, "
            f"or one is damaged); {_mnist_fix('them')}")
    bad = labels > 9
    if bool(bad.any()):
        found = sorted(int(v) for v in labels[bad].unique())
        listed = ", ".join(map(str, found[:-1])) + " and " if len(found) > 1 else ""
        raise _invalid(labels_path, f"labels outside 0-9: found {listed}{found[-1]} "
                                    f"({int(bad.sum())} of {len(labels)} labels)")


def load_mnist(data_dir: Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The four MNIST IDX files of ``data_dir``, checked: DataMissing names a
    missing file, DataInvalid a file that is there but cannot be used."""
    if not data_dir.is_dir():
        raise DataMissing(
            f"{data_dir}: no such directory; pass --perf-data-dir DIR (pytest) or --data-dir DIR "
            f"(perfsuite run) naming the directory with the IDX files "
            f"{', '.join(MNIST_FILES.values())}")
    paths = {key: _find(data_dir, stem) for key, stem in MNIST_FILES.items()}
    parts = {key: _read_idx(path, 3 if key.endswith("images") else 1) for key, path in paths.items()}
    for split in ("train", "test"):
        _check_labels(paths[f"{split}_images"], parts[f"{split}_images"],
                      paths[f"{split}_labels"], parts[f"{split}_labels"])
    scale = lambda images: images.float() / 255.0  # noqa: E731
    return (scale(parts["train_images"]), parts["train_labels"].long(),
            scale(parts["test_images"]), parts["test_labels"].long())


DIGITS_FILE = Path(__file__).resolve().parent.parent / "data" / "digits.npz"


def load_digits(path: Path = DIGITS_FILE):
    """The 1,797 real 8x8 handwritten digits shipped with perfsuite, and their
    fixed stratified train/test split (1,437 / 360 images).

    ``perfsuite/data/digits.npz`` holds scikit-learn's copy of the UCI
    "Optical Recognition of Handwritten Digits" test set (CC BY 4.0; pixel
    values 0-16) and the split ``train_test_split(range(1797), test_size=0.2,
    random_state=0, stratify=labels)`` gave, in its order: the same tensors
    scikit-learn made, without importing it in every rank (1.5-2.5 s a
    launch on 2 cores) or installing it (tests/unit/test_digits_data.py
    compares the two where scikit-learn is there).
    """
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as data:
            images = torch.from_numpy(data["images"].astype("float32")) / 16.0
            labels = torch.from_numpy(data["labels"].astype("int64"))
            train, test = (torch.from_numpy(data[k].astype("int64")) for k in ("train_index", "test_index"))
    except (OSError, KeyError, ValueError) as err:
        raise DataInvalid(f"{path}: the bundled digits cannot be read ({err}); reinstall perfsuite") from err
    return images[train], labels[train], images[test], labels[test]


def load(dataset: str, data_dir: Path | None, cache_dir: Path | None = None):
    if dataset == "digits":
        return load_digits()
    if dataset == "mnist":
        if data_dir is None:
            raise DataMissing("cell uses MNIST but no data directory was given: pass "
                              "--perf-data-dir DIR (pytest) or --data-dir DIR (perfsuite run) "
                              f"with the IDX files {', '.join(MNIST_FILES.values())}")
        return load_mnist(Path(data_dir))
    raise ValueError(f"unknown image dataset {dataset!r}: use 'digits' or 'mnist'")


RESIZE_VERSION = 1  # in the cache files' names: a change to how images are resized makes new ones
RESIZE_CHUNK = 256  # images resized at a time while a cache is made (bounds the float buffers)


def _resize_chunks(images: torch.Tensor, size: int):
    """``images`` (N, H, W) with values in [0, 1], resized bilinearly to
    ``size`` px and stored as unsigned bytes, ``RESIZE_CHUNK`` images at a time."""
    for start in range(0, len(images), RESIZE_CHUNK):
        part = images[start:start + RESIZE_CHUNK].float().unsqueeze(1)
        part = TF.resize(part, [size, size], antialias=True).squeeze(1)
        yield part.mul_(255).round_().clamp_(0, 255).to(torch.uint8)


def resized_cache_path(images: torch.Tensor, size: int, cache_dir: Path) -> Path:
    """Where the resized copy of ``images`` lives: named by their content, so a
    different MNIST download (or split) never reads another's file."""
    source = images.float().contiguous()
    digest = hashlib.sha256(str(tuple(source.shape)).encode())
    digest.update(source.numpy().data)  # ~0.13 s for MNIST's 60,000 images
    return (Path(cache_dir) / "image" / "resized"
            / f"{len(images)}x{size}px-{digest.hexdigest()[:24]}-v{RESIZE_VERSION}.u8")


def _map(path: Path, shape: tuple[int, ...]) -> torch.Tensor:
    """The file's bytes as a read-only-by-use uint8 tensor (a private mapping:
    pages come from the page cache, one copy for every process mapping it)."""
    return torch.from_file(str(path), shared=False, size=math.prod(shape),
                           dtype=torch.uint8).view(shape)


def resize_split(images: torch.Tensor, size: int, cache_dir: Path | None = None) -> torch.Tensor:
    """``images`` resized once to (N, size, size) unsigned bytes.

    With ``cache_dir`` the result is a file there, made by the first process
    that needs it (others wait on its lock) and mapped by every rank, every
    DataLoader worker and every later launch: MNIST's 70,000 images are
    17.5 GB at 500 px, 34.3 GB at 700 px, which N ranks could not each hold.
    Without ``cache_dir`` it is made in memory (tests, small splits).
    """
    shape = (len(images), size, size)
    if cache_dir is None:
        return torch.cat(list(_resize_chunks(images, size))) if len(images) else torch.empty(
            shape, dtype=torch.uint8)
    from filelock import FileLock

    path = resized_cache_path(images, size, cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):  # the ranks of a cell wait for the one making it
        if not path.exists() or path.stat().st_size != math.prod(shape):
            _write_resized(path, images, size)
    return _map(path, shape)


def _write_resized(path: Path, images: torch.Tensor, size: int) -> None:
    """Made whole beside ``path``, then renamed onto it. The other ranks wait
    on the lock meanwhile, so the making may use every core this process may
    (a GPU rank runs with one thread: MNIST at 500 px takes ~2 min on one)."""
    threads = torch.get_num_threads()
    try:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        torch.set_num_threads(max(threads, cores or 1))
        atomic_write_chunks(path, (part.numpy().data for part in _resize_chunks(images, size)))
    finally:
        torch.set_num_threads(threads)


class ResizedImages(Dataset):
    """Grey images resized once, given 3 channels and normalised per item.

    Where the resize happens decides what the pin_memory x image size cells
    measure. The papers' DataLoader handed the GPU full-size batches in the
    cell's precision (their host-to-device time halves from FP64 to FP32 to
    FP16), so the loader here still yields (3, size, size) tensors in the
    cell's dtype and the host-to-device copy carries the papers' bytes.
    Resizing on the GPU instead would move 28x28 images, about 300 times fewer
    bytes at 500 px, and leave the pin_memory cells nothing to measure.
    Resizing per item on the CPU (as before) made 500 px cells measure the
    loader: ~0.2-0.9 s a batch of 64 on one core, of which the resize was the
    larger part. So the split is resized once (``resize_split``, kept as
    unsigned bytes: a quarter of fp32) and an item is a slice of it, scaled,
    normalised, cast to the cell's dtype and expanded to 3 channels; the
    batch is materialised by the DataLoader's collate, as before.
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, size: int,
                 precision: str, cache_dir: Path | None = None) -> None:
        self.images, self.labels, self.size = images, labels, size
        self.dtype = DTYPES[precision]
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        mean, std = float(images.mean()), float(images.std())
        # (byte / 255 - mean) / std as one multiply-add on the cached bytes
        self.scale, self.shift = 1.0 / (255.0 * std), -mean / std
        self.resized: torch.Tensor | None = None

    def prepare(self) -> ResizedImages:
        """Resize the split now (or map its cache). Call it before a
        DataLoader forks its workers, so they share it instead of each
        making its own; an item asked for earlier prepares it then."""
        if self.resized is None:
            self.resized = resize_split(self.images, self.size, self.cache_dir)
        return self

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.resized is None:
            self.prepare()
        image = self.resized[index].to(torch.float32).mul_(self.scale).add_(self.shift)
        # The host tensor carries the cell's precision, so host-to-device
        # volume shrinks with it as in the paper's profiles.
        return image.to(self.dtype).expand(3, -1, -1), self.labels[index]

    def __getstate__(self) -> dict:
        """A worker started by spawn or forkserver maps the cache file itself
        rather than receiving gigabytes through a pipe."""
        state = dict(self.__dict__)
        if self.cache_dir is not None:
            state["resized"] = None
        return state


def idx_problem(path: Path, ndim: int) -> tuple[str | None, int]:
    """Why an IDX file cannot be used, read from its header and size (not its
    data), and the count it holds."""
    try:
        with open(path, "rb") as raw:
            gzipped = raw.read(2) == b"\x1f\x8b"
        opener = gzip.open if gzipped else open
        with opener(path, "rb") as f:
            header = f.read(4 + 4 * ndim)
    except (OSError, EOFError) as err:
        return f"cannot read it ({getattr(err, 'strerror', None) or err})", 0
    if len(header) < 4 or header[:2] != b"\x00\x00" or header[2] != 0x08:
        return "not an unsigned-byte IDX file (bad magic number)", 0
    if header[3] != ndim or len(header) < 4 + 4 * ndim:
        return f"{header[3]} dimensions, {'images' if ndim == 3 else 'labels'} need {ndim}", 0
    shape = [int.from_bytes(header[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    expected = 4 + 4 * ndim + math.prod(shape)
    if gzipped:  # the gzip trailer holds the size mod 2**32: no need to inflate it all
        with open(path, "rb") as raw:
            raw.seek(-4, os.SEEK_END)
            size = int.from_bytes(raw.read(4), "little")
        ok = size == expected % 2**32
    else:
        size = path.stat().st_size
        ok = size == expected
    if not ok:
        return (f"{size} bytes{' unpacked' if gzipped else ''}, its header "
                f"({'x'.join(map(str, shape))}) says {expected}: truncated or damaged"), 0
    return None, shape[0]
