"""Image data: the container, IDX files, ImageFolder trees, sklearn digits, augmentation, and Fashion-MNIST
when its Debian package is already in the cache (never fetched here)."""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest
import torch

from primal_attention.data.base import Batch, DataError
from primal_attention.data.cache import cache_dir
from primal_attention.data.idx import read_idx
from primal_attention.data.vision import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    ImageData,
    augment,
    load_digits_images,
    load_fashion_mnist_images,
    load_image_folder,
)

# ------------------------------------------------------------------------------------------- container

def test_image_data_subset_and_batch():
    data = ImageData(torch.randn(5, 3, 4, 4), torch.arange(5), 5, "toy", {"mean": (0.5,)})
    assert (len(data), data.in_channels, data.image_size) == (5, 3, 4)
    index = torch.tensor([4, 1])
    part = data.subset(index)
    assert torch.equal(part.x, data.x[index]) and part.y.tolist() == [4, 1] and part.meta == data.meta
    batch = data.batch(index)
    assert isinstance(batch, Batch) and batch.mask is None and list(batch.inputs) == ["x"]
    with pytest.raises(DataError, match=r"expected float images of shape \(M, C, S, S\)"):
        ImageData(torch.zeros(5, 4, 4), torch.arange(5), 5)
    with pytest.raises(DataError, match=r"expected y of shape \(5,\) int64"):
        ImageData(torch.zeros(5, 1, 4, 4), torch.arange(4), 5)


# ------------------------------------------------------------------------------------------------- IDX

def _write_idx(path, magic, array, *, truncate=0):
    header = struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as f:
        f.write((header + array.astype(np.uint8).tobytes())[: -truncate or None])


def test_read_idx(tmp_path):
    images = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    _write_idx(tmp_path / "images.gz", 2051, images)
    _write_idx(tmp_path / "labels.gz", 2049, np.array([7, 3]))
    out = read_idx(tmp_path / "images.gz", 2051)
    assert out.dtype == np.uint8 and np.array_equal(out, images)
    assert read_idx(str(tmp_path / "labels.gz"), 2049).tolist() == [7, 3]
    with pytest.raises(DataError, match="not an IDX file with magic 2049 \\(found 2051\\)"):
        read_idx(tmp_path / "images.gz", 2049)
    _write_idx(tmp_path / "short.gz", 2051, images, truncate=5)
    with pytest.raises(DataError, match=r"header says \(2, 3, 4\), found 19 values"):
        read_idx(tmp_path / "short.gz", 2051)
    (tmp_path / "plain.gz").write_bytes(b"not gzip at all")
    with pytest.raises(DataError, match="not a readable gzip file"):
        read_idx(tmp_path / "plain.gz", 2051)


# ---------------------------------------------------------------------------------------- ImageFolder

def _write_png(path, size, colour):
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path)


def test_image_folder(tmp_path):
    root = tmp_path / "tiny"
    _write_png(root / "train" / "zebra" / "a.png", (12, 6), (255, 0, 0))  # wide: resized to 8 x 4, centre-cropped
    _write_png(root / "train" / "zebra" / "b.PNG", (4, 4), (255, 0, 0))
    _write_png(root / "train" / "ant" / "c.png", (5, 9), (0, 0, 255))
    (root / "train" / "ant" / "notes.txt").write_text("not an image")
    data = load_image_folder(root, "train", image_size=4)
    assert data.x.shape == (3, 3, 4, 4) and data.x.dtype == torch.float32
    assert data.y.tolist() == [0, 1, 1] and data.meta["classes"] == ["ant", "zebra"] and data.num_classes == 2
    mean, std = torch.tensor(IMAGENET_MEAN)[:, None, None], torch.tensor(IMAGENET_STD)[:, None, None]
    red = (torch.tensor([1.0, 0.0, 0.0])[:, None, None] - mean) / std
    assert torch.allclose(data.x[1], red.expand(3, 4, 4), atol=1e-5)
    assert torch.allclose(data.x[0, 2], (1 - mean[2]) / std[2], atol=1e-5)  # blue channel
    grey = load_image_folder(root, "train", image_size=4, num_examples=2, seed=1, mean=(0.5,) * 3, std=(0.5,) * 3)
    assert len(grey) == 2 and set(grey.x.unique().tolist()) <= {-1.0, 1.0}
    assert torch.equal(grey.y, load_image_folder(root, "train", image_size=4, num_examples=2, seed=1).y)


def test_image_folder_errors(tmp_path):
    with pytest.raises(DataError, match="no such folder"):
        load_image_folder(tmp_path, "train", image_size=4)
    (tmp_path / "train").mkdir()
    with pytest.raises(DataError, match="no class folders"):
        load_image_folder(tmp_path, "train", image_size=4)
    _write_png(tmp_path / "train" / "cat" / "a.png", (4, 4), (0, 0, 0))
    (tmp_path / "train" / "dog").mkdir()
    with pytest.raises(DataError, match=r"no images .* in class folders \['dog'\]"):
        load_image_folder(tmp_path, "train", image_size=4)
    (tmp_path / "train" / "dog" / "broken.jpg").write_bytes(b"\xff\xd8 truncated")
    with pytest.raises(DataError, match="broken.jpg: not a readable image"):
        load_image_folder(tmp_path, "train", image_size=4)


# --------------------------------------------------------------------------------------------- digits

def test_digits_split_and_normalisation():
    train, test = load_digits_images("train"), load_digits_images("test")
    assert len(train) + len(test) == 1797 and abs(len(test) / 1797 - 0.25) < 0.01
    assert train.x.shape[1:] == (1, 8, 8) and train.num_classes == 10
    assert torch.bincount(test.y, minlength=10).min() >= 40  # stratified
    assert abs(train.x.mean().item()) < 1e-5 and abs(train.x.std().item() - 1) < 1e-3
    assert test.meta["mean"] == train.meta["mean"]  # test normalised with the train statistics
    assert torch.equal(load_digits_images("test").x, test.x)
    with pytest.raises(ValueError, match="split must be one of"):
        load_digits_images("val")


# ----------------------------------------------------------------------------------------- augment

def _augment_loop(x, top, left, mirror, p):
    """The slow per-image definition: pad, crop at (top, left), mirror."""
    padded = torch.nn.functional.pad(x, (p, p, p, p))
    h, w = x.shape[-2:]
    out = [padded[i, :, t:t + h, l:l + w] for i, (t, l) in enumerate(zip(top.tolist(), left.tolist()))]
    return torch.stack([o.flip(-1) if m else o for o, m in zip(out, mirror.tolist())])


def test_augment_is_the_padded_crop_and_flip():
    x = torch.randn(16, 2, 5, 6)
    out = augment(x, generator=torch.Generator().manual_seed(3), crop_padding=2)
    assert out.shape == x.shape
    assert torch.equal(out, augment(x, generator=torch.Generator().manual_seed(3), crop_padding=2))
    assert not torch.equal(out, augment(x, generator=torch.Generator().manual_seed(4), crop_padding=2))
    g = torch.Generator().manual_seed(3)  # the same draws, in the documented order
    top, left = torch.randint(0, 5, (16,), generator=g), torch.randint(0, 5, (16,), generator=g)
    mirror = torch.rand(16, generator=g) < 0.5
    assert torch.equal(out, _augment_loop(x, top, left, mirror, 2))


def test_augment_flips_really_flip():
    x = torch.randn(32, 3, 4, 4)
    out = augment(x, generator=torch.Generator().manual_seed(0), crop_padding=0)
    flipped = (out == x.flip(-1)).flatten(1).all(1)
    same = (out == x).flatten(1).all(1)
    assert (flipped ^ same).all() and 5 < flipped.sum() < 27
    assert torch.equal(augment(x, generator=torch.Generator(), crop_padding=0, flip=False), x)


@pytest.mark.parametrize("kwargs, message", [
    (dict(x=torch.zeros(2, 4, 4)), r"expected float images of shape \(B, C, H, W\), got \(2, 4, 4\)"),
    (dict(x=torch.zeros(2, 1, 4, 4, dtype=torch.uint8)), "expected float images"),
    (dict(generator=0), "expected a torch.Generator"),
    (dict(crop_padding=-1), "crop_padding must be an int >= 0"),
])
def test_augment_bad_inputs(kwargs, message):
    args = {"x": torch.zeros(2, 1, 4, 4), "generator": torch.Generator(), **kwargs}
    with pytest.raises(DataError, match=message):
        augment(args.pop("x"), **args)


# -------------------------------------------------------------------------------------- Fashion-MNIST

def test_fashion_mnist_when_cached():
    if not (cache_dir("debian") / "dataset-fashion-mnist" / ".complete").is_file():
        pytest.skip("dataset-fashion-mnist is not in the cache (fetch it with load_fashion_mnist_images)")
    test = load_fashion_mnist_images("test", num_examples=300, progress=False)
    assert test.x.shape == (300, 1, 28, 28) and test.name == "FashionMNIST" and test.y.max() <= 9
    assert abs(test.meta["mean"][0] - 0.286) < 1e-3 and abs(test.meta["std"][0] - 0.353) < 1e-3
    assert torch.equal(test.y, load_fashion_mnist_images("test", num_examples=300, progress=False).y)


def test_image_folder_classes_are_numbered_by_train_in_every_split(tmp_path):
    for name, colour in (("ant", (0, 0, 255)), ("bee", (0, 255, 0)), ("cat", (255, 0, 0))):
        _write_png(tmp_path / "train" / name / "a.png", (4, 4), colour)
    for name, colour in (("ant", (0, 0, 255)), ("cat", (255, 0, 0))):  # test/ lacks bee
        _write_png(tmp_path / "test" / name / "b.png", (4, 4), colour)
    test = load_image_folder(tmp_path, "test", image_size=4)
    assert test.y.tolist() == [0, 2] and test.num_classes == 3 and test.meta["classes"] == ["ant", "bee", "cat"]
    _write_png(tmp_path / "test" / "dog" / "c.png", (4, 4), (9, 9, 9))
    with pytest.raises(DataError, match=r"class folders \['dog'\] are not in .*train \(labels are numbered by the train/ classes"):
        load_image_folder(tmp_path, "test", image_size=4)


def test_a_decompression_bomb_is_one_line_naming_the_file(tmp_path, monkeypatch):
    from PIL import Image

    _write_png(tmp_path / "train" / "cat" / "huge.png", (8, 8), (0, 0, 0))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 10)  # 64 pixels > twice the limit: PIL raises
    with pytest.raises(DataError) as caught:
        load_image_folder(tmp_path, "train", image_size=4)
    assert "huge.png: not read: Image size (64 pixels) exceeds limit" in str(caught.value)
