"""Image data: real MNIST IDX files when given, scikit-learn's digits otherwise.

Neither source is downloaded. MNIST comes from a directory the user points
at (``--perf-data-dir``) holding the four IDX files, gzipped or not.
scikit-learn ships 1,797 real 8x8 handwritten digits; both are resized in the
DataLoader to the cell's image size and given 3 channels, as the paper
resized MNIST for MobileNetV2.
"""

from __future__ import annotations

import gzip
import io
import struct
from pathlib import Path

import torch
from torch.utils.data import Dataset
from torchvision.transforms.v2 import functional as TF

from perfsuite.fsutil import atomic_write_bytes

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


def _read_idx(path: Path) -> torch.Tensor:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        data = fh.read()
    magic, = struct.unpack(">I", data[:4])
    ndim = magic & 0xFF
    if magic >> 8 != 0x08 or ndim not in (1, 3):
        raise ValueError(f"{path}: not an unsigned-byte IDX file (magic {magic:#x})")
    shape = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    payload = data[4 + 4 * ndim:]
    expected = 1
    for n in shape:
        expected *= n
    if len(payload) != expected:
        raise ValueError(f"{path}: {len(payload)} bytes of data, header says {expected}")
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


def load_mnist(data_dir: Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    parts = {key: _read_idx(_find(data_dir, stem)) for key, stem in MNIST_FILES.items()}
    scale = lambda images: images.float() / 255.0  # noqa: E731
    return (scale(parts["train_images"]), parts["train_labels"].long(),
            scale(parts["test_images"]), parts["test_labels"].long())


def load_digits(test_fraction: float = 0.2, seed: int = 0, cache_dir: Path | None = None):
    """scikit-learn's bundled digits, a fixed stratified train/test split.

    With ``cache_dir`` the split is kept there after the first launch:
    importing scikit-learn costs every launch 1.5-2.5 s on 2 cores.
    """
    cached = (Path(cache_dir) / "image" / f"digits-split-{seed}-{test_fraction}-v1.pt"
              if cache_dir is not None else None)
    if cached is not None and cached.exists():
        try:
            return tuple(torch.load(cached, weights_only=True))
        except Exception:  # noqa: BLE001 - unreadable in any way: made again below
            pass
    from sklearn.datasets import load_digits as sk_digits
    from sklearn.model_selection import train_test_split

    bunch = sk_digits()
    images = torch.tensor(bunch.images, dtype=torch.float32) / 16.0
    labels = torch.tensor(bunch.target, dtype=torch.long)
    train_idx, test_idx = train_test_split(range(len(labels)), test_size=test_fraction,
                                           random_state=seed, stratify=bunch.target)
    split = (images[train_idx], labels[train_idx], images[test_idx], labels[test_idx])
    if cached is not None:  # written whole: ranks filling the cache at once never read half
        buffer = io.BytesIO()
        torch.save(split, buffer)
        atomic_write_bytes(cached, buffer.getvalue())
    return split


def load(dataset: str, data_dir: Path | None, cache_dir: Path | None = None):
    if dataset == "digits":
        return load_digits(cache_dir=cache_dir)
    if dataset == "mnist":
        if data_dir is None:
            raise DataMissing("cell uses MNIST but no data directory was given: pass "
                              "--perf-data-dir DIR (pytest) or --data-dir DIR (perfsuite run) "
                              f"with the IDX files {', '.join(MNIST_FILES.values())}")
        return load_mnist(Path(data_dir))
    raise ValueError(f"unknown image dataset {dataset!r}: use 'digits' or 'mnist'")


class ResizedImages(Dataset):
    """Grey images resized per item (in DataLoader workers), 3 channels, normalised."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, size: int,
                 precision: str) -> None:
        self.images, self.labels, self.size = images, labels, size
        self.dtype = DTYPES[precision]
        self.mean, self.std = float(images.mean()), float(images.std())

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = self.images[index].unsqueeze(0)
        image = TF.resize(image, [self.size, self.size], antialias=True)
        image = ((image - self.mean) / self.std).expand(3, -1, -1)
        # The host tensor carries the cell's precision, so host-to-device
        # volume shrinks with it as in the paper's profiles.
        return image.to(self.dtype), self.labels[index]
