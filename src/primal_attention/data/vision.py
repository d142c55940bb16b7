"""Image classification data for the vision models: Fashion-MNIST, ImageFolder trees, sklearn digits.

Every loader returns :class:`ImageData`: normalised float32 images ``(M, C, H, W)`` in memory, so it
suits sets up to a few hundred thousand small images (Fashion-MNIST: 60000 × 1 × 28 × 28 is 188 MB).
:func:`augment` is the training-time augmentation (random crop after zero padding, horizontal flip),
applied per batch with torch ops.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from primal_attention.data.base import Batch, DataError
from primal_attention.data.fetch import fetch_debian_package
from primal_attention.data.idx import read_idx
from primal_attention.data.splits import stratified_split

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "IMAGE_EXTENSIONS",
    "ImageData",
    "augment",
    "load_digits_images",
    "load_fashion_mnist_images",
    "load_image_folder",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: file endings read by :func:`load_image_folder` (case-insensitive), as torchvision's ImageFolder.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
SPLITS = ("train", "test")
FASHION_MNIST_PACKAGE = "dataset-fashion-mnist"


@dataclass
class ImageData:
    """A labelled set of square images.

    Attributes:
        x: ``(M, C, H, W)`` float32, already normalised (H = W).
        y: ``(M,)`` int64 labels in ``[0, num_classes)``.
        num_classes: number of classes.
        name: dataset name, e.g. ``"FashionMNIST"``.
        meta: provenance shared by every subset (source, split, class names, normalisation mean/std).
    """

    x: torch.Tensor
    y: torch.Tensor
    num_classes: int
    name: str = ""
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.x.dim() != 4 or not self.x.is_floating_point() or self.x.shape[2] != self.x.shape[3]:
            raise DataError(f"{self.name}: expected float images of shape (M, C, S, S), got {tuple(self.x.shape)} {self.x.dtype}")
        if self.y.shape != (self.x.shape[0],) or self.y.dtype != torch.int64:
            raise DataError(f"{self.name}: expected y of shape ({self.x.shape[0]},) int64, got {tuple(self.y.shape)} {self.y.dtype}")

    def __len__(self) -> int:
        return self.x.shape[0]

    @property
    def image_size(self) -> int:
        return self.x.shape[-1]

    @property
    def in_channels(self) -> int:
        return self.x.shape[1]

    def subset(self, index: torch.Tensor) -> ImageData:
        """The examples at ``index`` (a 1-D long tensor), sharing metadata."""
        return ImageData(self.x[index], self.y[index], self.num_classes, self.name, dict(self.meta))

    def batch(self, index: torch.Tensor) -> Batch:
        """The examples at ``index`` as a :class:`Batch` (no mask): ``model(**batch.inputs)``."""
        return Batch(self.x[index], self.y[index])


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


def _random_subset(n: int, num_examples: int | None, seed: int) -> np.ndarray | None:
    """Sorted indices of a seeded random subset of ``num_examples`` of ``n``; None for all of them."""
    if num_examples is None or num_examples >= n:
        return None
    if num_examples < 0:
        raise ValueError(f"num_examples must be >= 0, got {num_examples}")
    return np.sort(np.random.default_rng(seed).choice(n, size=num_examples, replace=False))


def _level_stats(levels: np.ndarray, scale: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of ``levels / scale`` for integer levels (M, C, H, W) in [0, scale],
    exactly and without a float copy of the images (a histogram per channel, 1024 images at a time)."""
    values = np.arange(scale + 1) / scale
    means, stds = [], []
    for c in range(levels.shape[1]):
        counts = sum(np.bincount(levels[i:i + 1024, c].ravel(), minlength=scale + 1)
                     for i in range(0, len(levels), 1024))
        mean = float(counts @ values / counts.sum())
        means.append(mean)
        stds.append(float(np.sqrt(counts @ (values - mean) ** 2 / counts.sum())))
    return tuple(means), tuple(stds)


def _normalised(levels: np.ndarray, scale: float, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """(levels / scale - mean) / std per channel, float32: (M, C, H, W) -> (M, C, H, W)."""
    c = levels.shape[1]
    if len(mean) != c or len(std) != c or min(std) <= 0:
        raise DataError(f"expected {c} channel means and {c} positive stds, got mean {tuple(mean)} std {tuple(std)}")
    x = levels.astype(np.float32) / np.float32(scale)
    x -= np.asarray(mean, np.float32)[None, :, None, None]
    x /= np.asarray(std, np.float32)[None, :, None, None]
    return torch.from_numpy(x)


def _image_data(levels: np.ndarray, scale: float, labels: np.ndarray, mean: Sequence[float], std: Sequence[float], *,
                num_classes: int, name: str, meta: dict) -> ImageData:
    """Normalised :class:`ImageData` from integer levels (M, C, H, W); mean / std join ``meta``."""
    y = torch.from_numpy(np.ascontiguousarray(labels, dtype=np.int64))
    return ImageData(_normalised(levels, scale, mean, std), y, num_classes, name,
                     {**meta, "mean": tuple(mean), "std": tuple(std)})


def load_fashion_mnist_images(split: str, *, num_examples: int | None = None, seed: int = 0, progress: bool = True
                              ) -> ImageData:
    """Fashion-MNIST (Debian ``dataset-fashion-mnist``) as (M, 1, 28, 28) images.

    split: "train" (60000 images; carve validation from it) or "test" (10000). Pixels / 255 are
    normalised with the mean and std of all 60000 training images (about 0.286 and 0.353; in
    ``meta``). ``num_examples``: a fixed random subset (seeded by ``seed``).
    """
    _check_split(split)
    root = fetch_debian_package(FASHION_MNIST_PACKAGE, progress=progress) / "usr/share/datasets/fashion-mnist"
    train = read_idx(root / "train-images-idx3-ubyte.gz", 2051)
    mean, std = _level_stats(train[:, None], 255)
    prefix = "t10k" if split == "test" else "train"
    images = train if split == "train" else read_idx(root / f"{prefix}-images-idx3-ubyte.gz", 2051)
    labels = read_idx(root / f"{prefix}-labels-idx1-ubyte.gz", 2049)
    if images.shape[0] != labels.shape[0] or images.shape[1:] != (28, 28):
        raise DataError(f"Fashion-MNIST {prefix}: images {images.shape} and labels {labels.shape} do not match")
    idx = _random_subset(len(labels), num_examples, seed)
    if idx is not None:
        images, labels = images[idx], labels[idx]
    return _image_data(images[:, None], 255, labels, mean, std, num_classes=10, name="FashionMNIST",
                       meta={"split": split, "source": str(root)})


def load_digits_images(split: str, *, test_fraction: float = 0.25, seed: int = 0) -> ImageData:
    """sklearn's 8 × 8 handwritten digits (1797 images, 10 classes) as (M, 1, 8, 8), for fast tests.

    A fixed class-stratified split (``test_fraction`` of each class to "test"); values / 16 are
    normalised with the train split's mean and std.
    """
    from sklearn.datasets import load_digits

    _check_split(split)
    digits = load_digits()
    levels = digits.images.astype(np.int64)[:, None]
    train_idx, test_idx = stratified_split(digits.target, test_fraction, seed)
    mean, std = _level_stats(levels[train_idx.numpy()], 16)
    idx = (train_idx if split == "train" else test_idx).numpy()
    return _image_data(levels[idx], 16, digits.target[idx], mean, std, num_classes=10, name="Digits",
                       meta={"split": split, "source": "sklearn.datasets.load_digits", "test_fraction": test_fraction})


def _read_image(path: Path, size: int) -> np.ndarray:
    """RGB image, shorter side resized to ``size`` (bicubic), centre-cropped: (size, size, 3) uint8."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            img = img.convert("RGB")
            scale = size / min(img.size)
            w, h = (max(size, round(side * scale)) for side in img.size)
            img = img.resize((w, h), Image.Resampling.BICUBIC)
            left, top = (w - size) // 2, (h - size) // 2
            return np.asarray(img.crop((left, top, left + size, top + size)), dtype=np.uint8)
    except Image.DecompressionBombError as exc:  # PIL's guard against images that expand to gigabytes
        raise DataError(f"{path}: not read: {exc} (PIL.Image.MAX_IMAGE_PIXELS sets the limit)") from exc
    except (OSError, UnidentifiedImageError, ValueError) as exc:
        raise DataError(f"{path}: not a readable image ({exc})") from exc


def _class_folders(folder: Path) -> list[str]:
    """The sorted class folder names of an ImageFolder split."""
    if not folder.is_dir():
        raise DataError(f"{folder}: no such folder (expected an ImageFolder tree root/<split>/<class>/<image>)")
    classes = sorted(d.name for d in folder.iterdir() if d.is_dir())
    if not classes:
        raise DataError(f"{folder}: no class folders (expected {folder}/<class>/<image>)")
    return classes


def load_image_folder(root: str | Path, split: str, *, image_size: int, num_examples: int | None = None, seed: int = 0,
                      mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD) -> ImageData:
    """An ImageFolder tree ``root/<split>/<class>/<image>`` (e.g. ImageNet's train / val) as RGB images.

    Classes are the sorted class folder names of ``root/train`` in every split (index = position; in
    ``meta["classes"]``), so a label means the same class in train and test: a class missing from
    test/ is fine, a class folder in test/ that train/ lacks is an error. Images are the files
    ending in :data:`IMAGE_EXTENSIONS`, resized (shorter side to ``image_size``) and centre-cropped,
    then normalised with ``mean`` / ``std`` (ImageNet's by default). ``num_examples``: a fixed
    random subset, chosen before any image is read.

    Raises:
        DataError: the split folder is missing, has no class folders, a class has no images, a
            class is unknown to train/, or an image cannot be read (the message names the file).
    """
    if not isinstance(image_size, int) or image_size <= 0:
        raise ValueError(f"image_size must be a positive int, got {image_size!r}")
    folder = Path(root) / split
    own = _class_folders(folder)
    classes = own if split == "train" else _class_folders(Path(root) / "train")
    unknown = sorted(set(own) - set(classes))
    if unknown:
        raise DataError(f"{folder}: class folders {unknown} are not in {Path(root) / 'train'} "
                        f"(labels are numbered by the train/ classes {classes})")
    files: list[Path] = []
    labels: list[int] = []
    empty = []
    for label, name in enumerate(classes):
        if name not in own:  # a class this split lacks
            continue
        found = sorted(p for p in (folder / name).iterdir() if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
        if not found:
            empty.append(name)
        files += found
        labels += [label] * len(found)
    if empty:
        raise DataError(f"{folder}: no images ({', '.join(IMAGE_EXTENSIONS)}) in class folders {empty}")
    idx = _random_subset(len(files), num_examples, seed)
    chosen = range(len(files)) if idx is None else idx.tolist()
    pixels = np.stack([_read_image(files[i], image_size) for i in chosen]).transpose(0, 3, 1, 2)
    return _image_data(pixels, 255, np.asarray(labels)[list(chosen)], mean, std, num_classes=len(classes),
                       name=Path(root).name, meta={"split": split, "source": str(folder), "classes": classes})


def augment(x: torch.Tensor, *, generator: torch.Generator, crop_padding: int = 4, flip: bool = True) -> torch.Tensor:
    """Random crop after zero padding and random horizontal flip, drawn per image.

    Each image is padded with ``crop_padding`` zeros on every side (zero = the mean colour of
    normalised images), cropped back to H × W at a uniformly drawn offset, and mirrored left-right
    with probability 1/2 when ``flip``. One gather does all of it; the draws come from ``generator``
    only, so the result is fixed by its state. x: (B, C, H, W) float -> (B, C, H, W).
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 4 or not x.is_floating_point():
        raise DataError(f"augment: expected float images of shape (B, C, H, W), got "
                        f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if not isinstance(generator, torch.Generator):
        raise DataError(f"augment: expected a torch.Generator, got {type(generator).__name__}")
    if not isinstance(crop_padding, int) or crop_padding < 0:
        raise DataError(f"augment: crop_padding must be an int >= 0, got {crop_padding!r}")
    b, _, h, w = x.shape
    draw = dict(generator=generator, device=generator.device)
    top = torch.randint(0, 2 * crop_padding + 1, (b,), **draw).to(x.device)
    left = torch.randint(0, 2 * crop_padding + 1, (b,), **draw).to(x.device)
    mirror = (torch.rand(b, **draw) < 0.5).to(x.device) if flip else torch.zeros(b, dtype=torch.bool, device=x.device)
    cols = torch.arange(w, device=x.device)
    cols = torch.where(mirror[:, None], cols.flip(0), cols) + left[:, None]  # (B, W)
    rows = torch.arange(h, device=x.device) + top[:, None]  # (B, H)
    p = crop_padding
    padded = torch.nn.functional.pad(x, (p, p, p, p)).permute(0, 2, 3, 1)  # (B, H + 2p, W + 2p, C)
    out = padded[torch.arange(b, device=x.device)[:, None, None], rows[:, :, None], cols[:, None, :]]  # (B, H, W, C)
    return out.permute(0, 3, 1, 2).contiguous()
