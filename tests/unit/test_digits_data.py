"""The bundled digits: the same split scikit-learn made, without scikit-learn."""

import sys

import pytest
import torch

from perfsuite.workloads import image_data


def test_the_bundled_digits_load_without_scikit_learn(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)  # any import of it would fail
    train_x, train_y, test_x, test_y = image_data.load("digits", None)
    assert train_x.shape == (1437, 8, 8) and test_x.shape == (360, 8, 8)
    assert train_x.dtype == torch.float32 and 0.0 <= float(train_x.min()) and float(train_x.max()) == 1.0
    # stratified: every class in both splits, in proportion
    for split in (train_y, test_y):
        counts = torch.bincount(split, minlength=10)
        assert int(counts.min()) > 0
        assert float(counts.max()) / float(counts.min()) < 1.2


def test_the_bundled_digits_are_scikit_learns_split():
    datasets = pytest.importorskip("sklearn.datasets")
    from sklearn.model_selection import train_test_split

    bunch = datasets.load_digits()
    images = torch.tensor(bunch.images, dtype=torch.float32) / 16.0
    labels = torch.tensor(bunch.target, dtype=torch.long)
    train, test = train_test_split(range(len(labels)), test_size=0.2, random_state=0, stratify=bunch.target)
    expected = (images[train], labels[train], images[test], labels[test])
    assert all(torch.equal(a, b) for a, b in zip(image_data.load("digits", None), expected))


def test_a_damaged_digits_file_is_named(tmp_path):
    broken = tmp_path / "digits.npz"
    broken.write_bytes(b"half a file")
    with pytest.raises(image_data.DataInvalid, match="digits.npz.*reinstall perfsuite"):
        image_data.load_digits(broken)
