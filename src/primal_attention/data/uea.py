"""The UEA multivariate time-series classification archive, prepared as in the authors' pipeline.

Each dataset is a pair of ``.ts`` files, ``<Name>_TRAIN.ts`` and ``<Name>_TEST.ts``, read with aeon's
reader. Series of different lengths are zero-padded at the end to one length shared by both splits
(the longest series of the dataset, or ``max_len``), since a model is built for one
``max_seq_len``. Missing values (``NaN``/``?``) are interpolated linearly within each channel of each
series, constant beyond the first and last observation, as the authors' loader does.

Normalisation follows the mvts-transformer ``Normalizer`` the authors' code uses ("standardization" by
default): per-channel statistics over every real time step of the TRAIN split (padding excluded),
``(x - mean) / (std + eps)`` with the sample std (ddof 1) and ``eps`` the float64 machine epsilon;
the test split uses the train statistics; padding stays exactly 0. (The Time-Series-Library copy of
that loader normalises each split with its own statistics; passing ``normalize=stats`` of the test
split reproduces that if ever needed.)

Where a dataset is found, in order:

1. ``data_dir`` if given (the archive layout ``data_dir/<Name>/<Name>_TRAIN.ts``, or the two files
   directly in ``data_dir``); nothing else is searched then;
2. the files bundled in the aeon wheel (JapaneseVowels and BasicMotions are the UEA multivariate
   ones; the rest are univariate UCR problems, which load too, with one channel);
3. earlier downloads under :func:`~primal_attention.data.cache.cache_dir` ``("uea")``;
4. with ``download=True`` only: aeon's downloader, into ``data_dir`` or that cache.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from primal_attention.data.base import DataError, SequenceData
from primal_attention.data.cache import cache_dir


class UEAInfo(NamedTuple):
    """Published size of a UEA dataset (Bagnall et al. 2018): examples per split, channels,
    longest series, classes."""

    train: int
    test: int
    channels: int
    max_len: int
    classes: int


UEA_PAPER_DATASETS: dict[str, UEAInfo] = {
    "EthanolConcentration": UEAInfo(261, 263, 3, 1751, 4),
    "FaceDetection": UEAInfo(5890, 3524, 144, 62, 2),
    "Handwriting": UEAInfo(150, 850, 3, 152, 26),
    "Heartbeat": UEAInfo(204, 205, 61, 405, 2),
    "JapaneseVowels": UEAInfo(270, 370, 12, 29, 9),
    "PEMS-SF": UEAInfo(267, 173, 963, 144, 7),
    "SelfRegulationSCP1": UEAInfo(268, 293, 6, 896, 2),
    "SelfRegulationSCP2": UEAInfo(200, 180, 7, 1152, 2),
    "SpokenArabicDigits": UEAInfo(6599, 2199, 13, 93, 10),
    "UWaveGestureLibrary": UEAInfo(120, 320, 3, 315, 8),
}
"""The ten UEA datasets of the paper's Table 1, keyed by their archive names, in the paper's order.
The sizes are the published ones; JapaneseVowels, the one bundled here, is checked against its files."""

NORMALIZE_METHODS = ("standard", "minmax", "none")

# mvts-transformer's Normalizer adds np.finfo(float).eps to the denominator.
_EPS = float(np.finfo(np.float64).eps)


# ----------------------------------------------------------------------------------------------
# padding and normalisation (shared with the other continuous-feature loaders)


def pad_sequences(
    series: Sequence[np.ndarray], max_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero-pad (or cut) variable-length series at the end to one length.

    Args:
        series: ``M`` arrays of shape ``(L_i, C)``.
        max_len: output length ``N``; series longer than it keep their first ``N`` steps.

    Returns:
        ``x: (M, N, C)`` float64 and ``mask: (M, N)`` bool, True = real time step.
    """
    if max_len < 1:
        raise ValueError(f"expected max_len >= 1, got {max_len}")
    channels = series[0].shape[1] if len(series) else 0
    x = torch.zeros(len(series), max_len, channels, dtype=torch.float64)
    mask = torch.zeros(len(series), max_len, dtype=torch.bool)
    for i, s in enumerate(series):
        n = min(s.shape[0], max_len)
        x[i, :n] = torch.from_numpy(np.ascontiguousarray(s[:n], dtype=np.float64))
        mask[i, :n] = True
    return x, mask


def _fit_stats(x: torch.Tensor, mask: torch.Tensor, method: str) -> dict[str, Any] | None:
    if method not in NORMALIZE_METHODS:
        raise ValueError(f"expected normalize in {NORMALIZE_METHODS} or a stats dict, got {method!r}")
    if method == "none":
        return None
    steps = x[mask].double()  # (real steps, C)
    if steps.shape[0] == 0:
        raise DataError("cannot fit normalisation statistics on a split with no time steps")
    if method == "standard":
        std = steps.std(dim=0, correction=1) if steps.shape[0] > 1 else torch.zeros(steps.shape[1])
        return {"method": "standard", "mean": steps.mean(dim=0).tolist(), "std": std.tolist()}
    return {"method": "minmax", "min": steps.amin(dim=0).tolist(), "max": steps.amax(dim=0).tolist()}


def _apply_stats(x: torch.Tensor, mask: torch.Tensor, stats: dict[str, Any] | None) -> torch.Tensor:
    if stats is None:
        return x
    channels = x.shape[-1]
    method = stats.get("method")
    keys = {"standard": ("mean", "std"), "minmax": ("min", "max")}.get(method)
    if keys is None:
        raise DataError(f"normalisation stats: expected method 'standard' or 'minmax', got {method!r}")
    try:
        a, b = (torch.as_tensor(stats[k], dtype=torch.float64) for k in keys)
    except KeyError as e:
        raise DataError(f"normalisation stats for {method!r} need keys {keys}, missing {e}") from None
    if a.shape != (channels,) or b.shape != (channels,):
        raise DataError(
            f"normalisation stats: expected {keys} for {channels} channels, got "
            f"{tuple(a.shape)} and {tuple(b.shape)}"
        )
    scale = b + _EPS if method == "standard" else (b - a) + _EPS
    out = (x.double() - a) / scale
    return out * mask.unsqueeze(-1)


def fit_normalization(data: SequenceData, method: str = "standard") -> dict[str, Any] | None:
    """Per-channel statistics over the real time steps of ``data`` (``None`` for ``"none"``).

    ``"standard"`` gives ``{"method", "mean", "std"}`` (sample std, ddof 1), ``"minmax"`` gives
    ``{"method", "min", "max"}``; values are plain lists of floats, so the dict can go in a config or
    a checkpoint.
    """
    return _fit_stats(data.x, data.mask, method)


def apply_normalization(data: SequenceData, stats: dict[str, Any] | None) -> SequenceData:
    """``data`` normalised with ``stats`` from :func:`fit_normalization`; padding stays 0.

    This is how the holdout protocol avoids fitting on its validation part: load with
    ``normalize="none"``, carve the split, fit on the kept part, apply to all three.
    """
    x = _apply_stats(data.x, data.mask, stats).to(torch.float32)
    return dataclasses.replace(data, x=x, meta={**data.meta, "norm_stats": stats})


def normalize_pair(
    normalize: str | dict[str, Any],
    train: tuple[torch.Tensor, torch.Tensor],
    test: tuple[torch.Tensor, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any] | None]:
    """Both splits' ``(x, mask)`` normalised with statistics fitted on ``train`` (or the given
    stats dict): ``(x_train, x_test, stats)``, x as float32."""
    stats = normalize if isinstance(normalize, dict) else _fit_stats(*train, normalize)
    return (
        _apply_stats(*train, stats).to(torch.float32),
        _apply_stats(*test, stats).to(torch.float32),
        stats,
    )


# ----------------------------------------------------------------------------------------------
# reading .ts files


def _fill_missing(series: np.ndarray, path: Path, case: int) -> np.ndarray:
    """Linear interpolation over NaNs in each channel, the nearest value beyond the ends."""
    missing = np.isnan(series)
    if not missing.any():
        return series
    steps = np.arange(series.shape[0])
    for c in np.flatnonzero(missing.any(axis=0)):
        gap = missing[:, c]
        if gap.all():
            raise DataError(f"{path}: case {case}, channel {c} has no observed values")
        series[gap, c] = np.interp(steps[gap], steps[~gap], series[~gap, c])
    return series


def _read_ts(path: Path) -> tuple[list[np.ndarray], list[str]]:
    """The series of one ``.ts`` file as ``(L_i, C)`` float64 arrays, and their class labels."""
    try:
        from aeon.datasets import load_from_ts_file
    except ImportError as e:
        raise DataError(
            f"reading {path} needs aeon's .ts reader: pip install aeon (extra 'experiments')"
        ) from e
    try:
        X, y, header = load_from_ts_file(str(path), return_meta_data=True)
    except (OSError, ValueError, IndexError) as e:
        raise DataError(f"{path}: not a valid .ts file ({type(e).__name__}: {e})") from e
    if header.get("targetlabel") or not header.get("classlabel"):
        raise DataError(f"{path}: not a classification problem (no @classLabel true ... header)")
    if len(X) == 0:
        raise DataError(f"{path}: no series found (is the @data line missing?)")
    if len(y) != len(X):
        raise DataError(f"{path}: {len(X)} series but {len(y)} labels")
    labels = [str(label) for label in y]
    declared = {str(v) for v in header.get("class_values") or []}
    undeclared = sorted(set(labels) - declared) if declared else []
    if undeclared:
        raise DataError(f"{path}: labels {undeclared} are not declared in @classLabel ({', '.join(sorted(declared))})")
    series = []
    for i, s in enumerate(X):
        a = np.array(s, dtype=np.float64).T
        if np.isinf(a).any():
            step, channel = np.argwhere(np.isinf(a))[0]
            raise DataError(f"{path}: case {i + 1}, channel {channel}, step {step} is infinite "
                            "(missing values are written NaN or ?)")
        series.append(_fill_missing(a, path, i + 1))
    return series, labels


def _class_order(labels: Sequence[str]) -> list[str]:
    """Sorted class names; numeric names sort by value, so "10" comes after "9"."""
    names = sorted(set(labels))
    try:
        return sorted(names, key=float)
    except ValueError:
        return names


# ----------------------------------------------------------------------------------------------
# locating and downloading


def _bundled_root() -> Path | None:
    """aeon's bundled data folder, found without importing aeon."""
    spec = importlib.util.find_spec("aeon")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data"


def bundled_uea_datasets() -> list[str]:
    """Names of the problems whose ``_TRAIN.ts`` and ``_TEST.ts`` ship in the installed aeon wheel."""
    root = _bundled_root()
    if root is None or not root.is_dir():
        return []
    return sorted(
        d.name for d in root.iterdir()
        if (d / f"{d.name}_TRAIN.ts").is_file() and (d / f"{d.name}_TEST.ts").is_file()
    )


def _find_pair(root: Path, name: str) -> tuple[Path, Path] | None:
    for folder in (root / name, root):
        train, test = folder / f"{name}_TRAIN.ts", folder / f"{name}_TEST.ts"
        if train.is_file() != test.is_file():
            have, lack = (train, test) if train.is_file() else (test, train)
            raise DataError(f"UEA {name}: found {have} but not {lack}")
        if train.is_file():
            return train, test
    return None


def _download(name: str, target: Path) -> None:
    """Fetch ``name`` into ``target/<name>/`` with aeon's downloader."""
    try:
        from aeon.datasets import load_classification
    except ImportError as e:
        raise DataError(f"downloading UEA {name} needs aeon: pip install aeon") from e
    try:
        from aeon.datasets.tsc_datasets import tsc_zenodo
    except ImportError:  # older aeon: let its downloader judge the name
        tsc_zenodo = None
    if tsc_zenodo is not None and name not in tsc_zenodo:
        close = difflib.get_close_matches(name, list(tsc_zenodo), n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise DataError(f"UEA {name}: aeon knows no classification dataset of that name.{hint}")
    try:
        load_classification(
            name, extract_path=str(target), load_equal_length=False, load_no_missing=False
        )
    except Exception as e:  # aeon wraps network failures in ValueError; urllib raises OSError
        raise DataError(
            f"UEA {name}: download with aeon into {target} failed ({type(e).__name__}: {e}). "
            f"Without internet, copy {name}_TRAIN.ts and {name}_TEST.ts from the UEA archive "
            f"into {target / name} or pass data_dir=..."
        ) from e


def _locate(name: str, data_dir: str | Path | None, download: bool) -> tuple[Path, Path, str]:
    """``(train_file, test_file, where)`` for ``name``, downloading only if asked to."""
    if data_dir is not None:
        target = Path(data_dir).expanduser()
        roots = [(target, "data_dir")]
    else:
        target = cache_dir("uea")
        bundled = _bundled_root()
        roots = ([(bundled, "aeon-bundled")] if bundled is not None else []) + [(target, "cache")]
    for root, where in roots:
        pair = _find_pair(root, name)
        if pair is not None:
            return (*pair, where)
    if download:
        existed = (target / name).exists()
        try:
            _download(name, target)
        except DataError:
            if not existed:  # leave no empty or half-filled folder behind a failed download
                shutil.rmtree(target / name, ignore_errors=True)
            raise
        pair = _find_pair(target, name)
        if pair is None:
            raise DataError(
                f"UEA {name}: aeon's download finished but {target / name} lacks the .ts files"
            )
        return (*pair, "download")
    searched = ", ".join(str(root) for root, _ in roots)
    bundled_names = ", ".join(bundled_uea_datasets()) or "none (aeon not installed)"
    raise DataError(
        f"UEA dataset {name!r} not found (searched {searched}). Pass data_dir= a folder holding "
        f"{name}/{name}_TRAIN.ts and {name}/{name}_TEST.ts (the UEA archive layout), or "
        f"download=True to fetch it with aeon (needs internet). Bundled with aeon: {bundled_names}."
    )


# ----------------------------------------------------------------------------------------------
# public loaders


def load_uea_splits(
    name: str,
    *,
    data_dir: str | Path | None = None,
    download: bool = False,
    normalize: str | dict[str, Any] = "standard",
    max_len: int | None = None,
) -> tuple[SequenceData, SequenceData]:
    """The TRAIN and TEST splits of a UEA dataset, padded to one length and normalised with TRAIN stats.

    Args:
        name: archive name, e.g. ``"JapaneseVowels"`` (see :data:`UEA_PAPER_DATASETS`).
        data_dir: folder with the archive layout ``<name>/<name>_TRAIN.ts`` (or the files directly).
        download: fetch with aeon when the files are not found locally.
        normalize: ``"standard"`` (default), ``"minmax"`` or ``"none"``, fitted on TRAIN; or a stats
            dict from :func:`fit_normalization` / ``meta["norm_stats"]`` to apply as given.
        max_len: common length ``N``; default the longest series over both splits. Longer series keep
            their first ``N`` steps.

    Returns:
        ``(train, test)``, each with ``x: (M, N, C)`` float32, ``mask: (M, N)``, ``y: (M,)`` indices
        into ``meta["class_names"]`` (the TRAIN labels sorted; aeon lower-cases them). ``meta`` also
        holds ``source`` (the file), ``found_in``, ``split``, ``lengths`` (original series lengths,
        ``(M,)`` int64) and ``norm_stats``.

    Raises:
        DataError: files missing, corrupt, with different channel counts, or a TEST label absent
            from TRAIN.
    """
    train_path, test_path, found_in = _locate(name, data_dir, download)
    train_series, train_labels = _read_ts(train_path)
    test_series, test_labels = _read_ts(test_path)

    channels = {s.shape[1] for s in train_series} | {s.shape[1] for s in test_series}
    if len(channels) != 1:
        raise DataError(
            f"UEA {name}: {train_path} has {train_series[0].shape[1]} channels but "
            f"{test_path} has {test_series[0].shape[1]}"
        )
    class_names = _class_order(train_labels)
    index = {label: i for i, label in enumerate(class_names)}
    unseen = sorted(set(test_labels) - set(index))
    if unseen:
        raise DataError(f"UEA {name}: {test_path} has labels {unseen} that {train_path} lacks")

    n = max_len if max_len is not None else max(s.shape[0] for s in train_series + test_series)
    train_padded, test_padded = pad_sequences(train_series, n), pad_sequences(test_series, n)
    x_train, x_test, stats = normalize_pair(normalize, train_padded, test_padded)

    out = []
    for split, x, mask, series, labels, path in (
        ("train", x_train, train_padded[1], train_series, train_labels, train_path),
        ("test", x_test, test_padded[1], test_series, test_labels, test_path),
    ):
        out.append(
            SequenceData(
                x=x,
                mask=mask,
                y=torch.tensor([index[label] for label in labels], dtype=torch.int64),
                num_classes=len(class_names),
                name=name,
                meta={
                    "source": str(path),
                    "found_in": found_in,
                    "split": split,
                    "class_names": class_names,
                    "lengths": torch.tensor([s.shape[0] for s in series], dtype=torch.int64),
                    "norm_stats": stats,
                },
            )
        )
    return out[0], out[1]


def load_uea(
    name: str,
    split: str,
    *,
    data_dir: str | Path | None = None,
    download: bool = False,
    normalize: str | dict[str, Any] = "standard",
    max_len: int | None = None,
) -> SequenceData:
    """One split (``"train"`` or ``"test"``) of :func:`load_uea_splits` with the same arguments.

    Both files are read either way: the common length and the TRAIN statistics need them.
    """
    which = split.lower()
    if which not in ("train", "test"):
        raise ValueError(f"expected split 'train' or 'test', got {split!r}")
    train, test = load_uea_splits(
        name, data_dir=data_dir, download=download, normalize=normalize, max_len=max_len
    )
    return train if which == "train" else test
