"""LRA Image: grey-level CIFAR-10 from its python pickles (:func:`load_cifar10_dir`), the stand-in
Fashion-MNIST padded to 32×32 (:func:`load_fashion_mnist`, fetched from Debian; :func:`primal_attention.data.idx.read_idx` reads its
IDX files), and :func:`load` / :func:`fetch`, which :func:`~primal_attention.data.lra.load_lra` and
:func:`~primal_attention.data.lra.fetch_lra` dispatch to.

Sequences are the flattened 32×32 image, ``(M, 1024)``; tokens: grey level + 1 (257 ids); 10 classes.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from primal_attention.data.base import DataError, SequenceData
from primal_attention.data.idx import read_idx
from primal_attention.data.safe_pickle import load_data_pickle
from primal_attention.data.fetch import fetch_debian_package
from primal_attention.data.lra.common import (
    check_fixed_seq_len,
    check_split,
    pixels_to_tokens,
    random_subset,
    to_data,
)

__all__ = ["load_cifar10_dir", "load_fashion_mnist", "load", "fetch"]


def _rgb_to_grey(rgb: np.ndarray) -> np.ndarray:
    """``(..., 3)`` uint8 → uint8 as ``tf.image.rgb_to_grayscale`` on uint8 input (what LRA applies):
    weights (0.2989, 0.5870, 0.1140) on values / 255, then back to uint8 by truncating value · 255.5."""
    f = rgb.astype(np.float32) * np.float32(1 / 255)
    w = np.array([0.2989, 0.5870, 0.1140], np.float32)
    grey = f[..., 0] * w[0] + f[..., 1] * w[1] + f[..., 2] * w[2]
    return (grey * np.float32(255.5)).astype(np.uint8)


def load_cifar10_dir(data_dir: str | Path, split: str, *, num_examples: int | None = None, seed: int = 0
                     ) -> SequenceData:
    """LRA Image: CIFAR-10 from its python pickles (``data_batch_1..5``, ``test_batch``), converted to
    grey levels as LRA does, flattened to 1024 tokens (grey + 1). As in LRA, train is the first 90% of
    the training batches and val the last 10%.
    """
    check_split(split)
    root = Path(data_dir)
    if (root / "cifar-10-batches-py").is_dir():
        root = root / "cifar-10-batches-py"
    names = ["test_batch"] if split == "test" else [f"data_batch_{i}" for i in range(1, 6)]
    images, labels = [], []
    for name in names:
        path = root / name
        if not path.is_file():
            raise DataError(f"CIFAR-10: {path} not found (expected the python version: data_batch_1..5, "
                            f"test_batch)")
        try:
            with open(path, "rb") as f:
                batch = load_data_pickle(f, encoding="bytes")  # never runs code a crafted file names
            data = np.asarray(batch[b"data"], np.uint8)
            lab = np.asarray(batch[b"labels"], np.int64)
        except (pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError) as exc:
            raise DataError(f"CIFAR-10: {path} is not a CIFAR-10 python batch ({exc!r})") from exc
        if data.ndim != 2 or data.shape[1] != 3072 or lab.shape != (data.shape[0],):
            raise DataError(f"CIFAR-10: {path}: expected data (n, 3072) and n labels, got {data.shape}, "
                            f"{lab.shape}")
        images.append(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
        labels.append(lab)
    rgb, y = np.concatenate(images), np.concatenate(labels)
    if split != "test":
        cut = int(round(0.9 * len(y)))
        rgb, y = (rgb[:cut], y[:cut]) if split == "train" else (rgb[cut:], y[cut:])
    idx = random_subset(len(y), num_examples, seed)
    if idx is not None:
        rgb, y = rgb[idx], y[idx]
    x, mask = pixels_to_tokens(_rgb_to_grey(rgb))
    return to_data(x, mask, y, num_classes=10, vocab_size=257, name="CIFAR10-grey",
                   meta={"task": "image", "split": split, "source": str(root), "standin": None})


def _fashion_mnist_root(progress: bool) -> Path:
    return fetch_debian_package("dataset-fashion-mnist", progress=progress) / "usr/share/datasets/fashion-mnist"


def load_fashion_mnist(split: str, *, num_examples: int | None = None, seed: int = 0, progress: bool = True
                       ) -> SequenceData:
    """Stand-in for LRA Image: Fashion-MNIST (Debian ``dataset-fashion-mnist``), 28×28 padded with 2 black
    pixels on each side to 32×32, flattened to 1024 tokens (grey + 1). Train is the first 54000 training
    images, val the last 6000 (LRA's 90/10 rule), test the 10000 test images.
    """
    check_split(split)
    root = _fashion_mnist_root(progress)
    prefix = "t10k" if split == "test" else "train"
    images = read_idx(root / f"{prefix}-images-idx3-ubyte.gz", 2051)
    labels = read_idx(root / f"{prefix}-labels-idx1-ubyte.gz", 2049).astype(np.int64)
    if images.shape[0] != labels.shape[0] or images.shape[1:] != (28, 28):
        raise DataError(f"Fashion-MNIST {prefix}: images {images.shape} and labels {labels.shape} do not match")
    if split != "test":
        cut = int(round(0.9 * len(labels)))
        images, labels = (images[:cut], labels[:cut]) if split == "train" else (images[cut:], labels[cut:])
    idx = random_subset(len(labels), num_examples, seed)
    if idx is not None:
        images, labels = images[idx], labels[idx]
    x, mask = pixels_to_tokens(np.pad(images, ((0, 0), (2, 2), (2, 2))))
    return to_data(x, mask, labels, num_classes=10, vocab_size=257, name="FashionMNIST-32",
                   meta={"task": "image", "split": split, "source": str(root),
                         "standin": "Fashion-MNIST (grey, padded to 32x32) instead of grey CIFAR-10"})



def load(split: str, *, seq_len: int | None, data_dir: str | Path | None, num_examples: int | None, seed: int,
         progress: bool, **options) -> SequenceData:
    """One split for :func:`~primal_attention.data.lra.load_lra`: CIFAR-10 in ``data_dir``, or Fashion-MNIST when
    ``data_dir`` is None. ``seq_len`` must be None or 1024."""
    common = {"num_examples": num_examples, "seed": seed}
    data = (load_cifar10_dir(data_dir, split, **common, **options) if data_dir is not None
            else load_fashion_mnist(split, progress=progress, **common, **options))
    return check_fixed_seq_len("image", data, seq_len)


def fetch(progress: bool) -> Path:
    """Fetch the stand-in (Debian ``dataset-fashion-mnist``); returns the folder of its IDX files."""
    return _fashion_mnist_root(progress)
