"""LRA Pathfinder: the release layout ``pathfinder32/curv_*/`` of PNGs and metadata
(:func:`load_pathfinder_dir`), images generated with LRA Pathfinder-32's parameters by
:mod:`~primal_attention.data.lra.pathfinder_gen` (:func:`load_pathfinder`, cached), and :func:`load` /
:func:`fetch`, which :func:`~primal_attention.data.lra.load_lra` and :func:`~primal_attention.data.lra.fetch_lra`
dispatch to.

Sequences are the flattened 32×32 image, ``(M, 1024)``; tokens: grey level + 1 (257 ids); 2 classes
(1 = the markers are joined by one contour).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from primal_attention.data.base import DataError, SequenceData
from primal_attention.data.cache import cache_dir
from primal_attention.data.fetch import say
from primal_attention.data.lra import pathfinder_gen
from primal_attention.data.lra.common import (
    SPLITS,
    VAL_SEED,
    cache_path,
    check_fixed_seq_len,
    check_split,
    example_count,
    file_key,
    load_npz,
    pixels_to_tokens,
    random_subset,
    save_npz,
    to_data,
)

__all__ = ["PATHFINDER_SPLIT_SIZES", "load_pathfinder", "load_pathfinder_dir", "load", "fetch"]

PATHFINDER_SPLIT_SIZES = {"train": 160_000, "val": 20_000, "test": 20_000}
"""LRA's Pathfinder-32 sizes (200k images per difficulty, split 80/10/10)."""


def _contour_length(difficulty: str | int) -> int:
    if isinstance(difficulty, int):
        return difficulty
    if difficulty in pathfinder_gen.DIFFICULTIES:
        return pathfinder_gen.DIFFICULTIES[difficulty]
    by_folder = {v: k for k, v in pathfinder_gen.LRA_FOLDERS.items()}
    if difficulty in by_folder:
        return by_folder[difficulty]
    raise ValueError(f"difficulty must be one of {sorted(pathfinder_gen.DIFFICULTIES)}, an LRA folder name "
                     f"{sorted(by_folder)} or a contour length, got {difficulty!r}")


def load_pathfinder(split: str, *, difficulty: str | int = "hard", num_examples: int | None = None,
                    seed: int = 0, progress: bool = True, **config) -> SequenceData:
    """Generated Pathfinder (see :mod:`~primal_attention.data.lra.pathfinder_gen`), cached.

    ``difficulty``: ``"easy"``/``"intermediate"``/``"hard"`` (contour length 6/9/14; LRA reports hard), an
    LRA folder name, or a contour length. Further ``config`` keywords go to ``PathfinderConfig``. Each
    split is an independent random stream (``(seed, split)``); default sizes are LRA's 160k/20k/20k.
    """
    check_split(split)
    cfg = pathfinder_gen.PathfinderConfig(contour_length=_contour_length(difficulty), **config)
    n = example_count(split, num_examples, PATHFINDER_SPLIT_SIZES)
    images, labels = _pathfinder_images(split, n, seed, cfg, progress)
    x, mask = pixels_to_tokens(images)
    folder = pathfinder_gen.LRA_FOLDERS.get(cfg.contour_length, f"curv_contour_length_{cfg.contour_length}")
    return to_data(x, mask, labels, num_classes=2, vocab_size=257, name=f"Pathfinder{cfg.image_size}-{folder}",
                   meta={"task": "pathfinder", "split": split, "source": "generated", "config": cfg.key(),
                         "seed": seed,
                         "standin": "generated here with LRA Pathfinder-32's parameters; not LRA's images "
                                    "(another rasteriser, contours kept strictly apart)"})


def _pathfinder_images(split: str, n: int, seed: int, cfg: pathfinder_gen.PathfinderConfig, progress: bool
                       ) -> tuple[np.ndarray, np.ndarray]:
    """The first ``n`` images and labels of the split's stream, from the cache when it holds enough."""
    stream = (seed, SPLITS.index(split))
    params = {"kind": "pathfinder", "version": 1, "config": cfg.key(), "seed": list(stream)}
    path = cache_path("pathfinder", params)
    arrays = load_npz(path, params)
    if arrays is not None and arrays["labels"].size >= n:
        return arrays["images"][:n], arrays["labels"][:n]
    say(progress, f"generating {n} Pathfinder images ({split}, contour length {cfg.contour_length})")
    images, labels = pathfinder_gen.generate_pathfinder(n, seed=stream, config=cfg, progress=progress)
    save_npz(path, params, images=images, labels=labels)
    return images, labels


def _read_metadata(path: Path) -> list[list[str]]:
    """Rows of a Pathfinder metadata file: LRA's release stores text lines under a ``.npy`` name; the
    generator script writes a real ``.npy`` string array. Both are accepted."""
    raw = path.read_bytes()
    if raw.startswith(b"\x93NUMPY"):
        try:
            arr = np.load(path, allow_pickle=False)
        except ValueError as exc:
            raise DataError(f"{path}: unreadable numpy metadata ({exc})") from exc
        return [[str(v) for v in row] for row in np.atleast_2d(arr)]
    try:
        return [line.split() for line in raw.decode("utf-8").splitlines() if line.strip()]
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: metadata is neither text nor a numpy array") from exc


def load_pathfinder_dir(data_dir: str | Path, split: str, *, difficulty: str | int = "hard",
                        num_examples: int | None = None, seed: int = 0, progress: bool = True) -> SequenceData:
    """LRA Pathfinder-32 from the release layout ``<data_dir>/curv_contour_length_14/{metadata/*.npy, imgs/}``
    (``data_dir`` may also be the difficulty folder itself).

    Each metadata row is ``subfolder filename index label ...`` with the image at
    ``<folder>/<subfolder>/<filename>``. Empty image files, which the release contains and LRA filters out,
    are skipped. A fixed permutation splits the examples 80/10/10 into train/val/test (LRA took
    contiguous 80/10/10 slices of its TFDS build). Decoded images are cached, keyed by the metadata
    files.
    """
    check_split(split)
    root = Path(data_dir)
    cl = _contour_length(difficulty)
    folder = root / pathfinder_gen.LRA_FOLDERS.get(cl, f"curv_contour_length_{cl}")
    if not (folder / "metadata").is_dir() and (root / "metadata").is_dir():
        folder = root
    meta_dir = folder / "metadata"
    files = sorted(meta_dir.glob("*.npy"), key=lambda p: (int(p.stem) if p.stem.isdigit() else 1 << 62, p.name))
    if not files:
        raise DataError(f"Pathfinder: no metadata/*.npy in {folder}")
    params = {"kind": "pathfinder_dir", "folder": str(folder.resolve()),
              "metadata": [file_key(p) for p in files]}
    cache = cache_path("pathfinder", params)
    arrays = load_npz(cache, params)
    if arrays is None:
        arrays = _decode_pathfinder(folder, files, progress)
        save_npz(cache, params, **arrays)
    images, labels = arrays["images"], arrays["labels"]
    order = np.random.default_rng(VAL_SEED).permutation(labels.size)
    n_train, n_val = int(0.8 * labels.size), int(0.1 * labels.size)
    part = {"train": order[:n_train], "val": order[n_train:n_train + n_val], "test": order[n_train + n_val:]}
    index = np.sort(part[split])
    sub = random_subset(index.size, num_examples, seed)
    if sub is not None:
        index = index[sub]
    x, mask = pixels_to_tokens(images[index])
    return to_data(x, mask, labels[index], num_classes=2, vocab_size=257,
                   name=f"Pathfinder{images.shape[1]}-{folder.name}",
                   meta={"task": "pathfinder", "split": split, "source": str(folder),
                         "skipped_empty": int(arrays["skipped_empty"]), "standin": None})


def _decode_pathfinder(folder: Path, files: list[Path], progress: bool) -> dict[str, np.ndarray]:
    try:
        from PIL import Image
    except ImportError as exc:
        raise DataError("reading Pathfinder PNGs needs Pillow (pip install pillow)") from exc
    rows = [(p, r) for p in files for r in _read_metadata(p)]
    say(progress, f"decoding {len(rows)} Pathfinder images in {folder}")
    images, labels, skipped = [], [], 0
    for meta_path, row in rows:
        if len(row) < 4:
            raise DataError(f"{meta_path}: metadata row {row} has fewer than 4 fields (subfolder, file, index, label)")
        img_path = folder / row[0] / row[1]
        if not img_path.is_file():
            raise DataError(f"Pathfinder: {img_path} (listed in {meta_path.name}) not found")
        if img_path.stat().st_size == 0:
            skipped += 1
            continue
        try:
            with Image.open(img_path) as im:
                arr = np.asarray(im.convert("L"), np.uint8)
        except OSError as exc:
            raise DataError(f"Pathfinder: {img_path} is not a readable image ({exc})") from exc
        if images and arr.shape != images[0].shape:
            raise DataError(f"Pathfinder: {img_path} is {arr.shape}, others are {images[0].shape}")
        try:
            label = int(float(row[3]))
        except ValueError:
            raise DataError(f"{meta_path}: label {row[3]!r} is not a number") from None
        if label not in (0, 1):
            raise DataError(f"{meta_path}: label must be 0 or 1, got {label}")
        images.append(arr)
        labels.append(label)
    if not images:
        raise DataError(f"Pathfinder: no readable images in {folder}")
    return {"images": np.stack(images), "labels": np.array(labels, np.int64), "skipped_empty": np.array(skipped)}



def load(split: str, *, seq_len: int | None, data_dir: str | Path | None, num_examples: int | None, seed: int,
         progress: bool, **options) -> SequenceData:
    """One split for :func:`~primal_attention.data.lra.load_lra`: the release folder ``data_dir``, or generated
    images when ``data_dir`` is None. ``seq_len`` must be None or the flattened image size (1024)."""
    common = {"num_examples": num_examples, "seed": seed}
    if data_dir is not None:
        data = load_pathfinder_dir(data_dir, split, progress=progress, **common, **options)
    else:
        data = load_pathfinder(split, progress=progress, **common, **options)
    return check_fixed_seq_len("pathfinder", data, seq_len)


def fetch(progress: bool) -> Path:
    """Generate and cache LRA's full default splits (hard, 160k/20k/20k, seed 0); returns the cache folder."""
    cfg = pathfinder_gen.PathfinderConfig()
    for split in SPLITS:
        _pathfinder_images(split, PATHFINDER_SPLIT_SIZES[split], 0, cfg, progress)
    return cache_dir("lra", "pathfinder")
