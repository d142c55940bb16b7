"""Pathfinder generator: shapes, balance, determinism, and that the label is what the pixels say."""

from collections import deque

import numpy as np
import pytest

from primal_attention.data.lra.pathfinder_gen import DIFFICULTIES, PathfinderConfig, generate_pathfinder


def _component(on: np.ndarray, start: tuple[int, int]) -> np.ndarray:
    """8-connected flood fill of the True pixels of ``on`` from ``start``."""
    seen = np.zeros_like(on)
    seen[start] = True
    queue = deque([start])
    h, w = on.shape
    while queue:
        y, x = queue.popleft()
        for dy in (-1, 0, 1):
            for dx in (-1, 0, 1):
                yy, xx = y + dy, x + dx
                if 0 <= yy < h and 0 <= xx < w and on[yy, xx] and not seen[yy, xx]:
                    seen[yy, xx] = True
                    queue.append((yy, xx))
    return seen


def _n_components(on: np.ndarray) -> int:
    left, n = on.copy(), 0
    while left.any():
        start = tuple(int(v) for v in np.argwhere(left)[0])
        left &= ~_component(on, start)
        n += 1
    return n


@pytest.fixture(scope="module")
def hard():
    return generate_pathfinder(512, seed=0, return_markers=True)


def test_shapes_dtypes_and_exact_balance(hard):
    images, labels, markers = hard
    assert images.shape == (512, 32, 32) and images.dtype == np.uint8
    assert labels.shape == (512,) and labels.dtype == np.int64 and set(labels.tolist()) == {0, 1}
    assert labels.sum() == 256  # each block of 512 is exactly balanced
    assert markers.shape == (512, 2, 2)
    assert images.max() == 255 and images.min() == 0
    assert 0.1 < (images > 0).mean() < 0.5


def test_deterministic_by_seed_and_prefix_stable():
    cfg = PathfinderConfig(contour_length=4, num_distractors=2)
    a, ya = generate_pathfinder(40, seed=7, config=cfg)
    b, yb = generate_pathfinder(40, seed=7, config=cfg)
    c, _ = generate_pathfinder(40, seed=8, config=cfg)
    assert np.array_equal(a, b) and np.array_equal(ya, yb)
    assert not np.array_equal(a, c)
    d, yd = generate_pathfinder(600, seed=7, config=cfg)  # two blocks; the first 40 are the same images
    assert np.array_equal(d[:40], a) and np.array_equal(yd[:40], ya)
    e, _ = generate_pathfinder(40, seed=(7, 1), config=cfg)  # a split-specific stream
    assert not np.array_equal(a, e)


@pytest.mark.parametrize("difficulty", ["easy", "hard"])
def test_label_is_connectivity_of_solid_contours(difficulty):
    """With solid contours (paddle_margin=0) positives join the markers by lit pixels, negatives do not."""
    cfg = PathfinderConfig(contour_length=DIFFICULTIES[difficulty], paddle_margin=0.0)
    images, labels, markers = generate_pathfinder(160, seed=1, config=cfg, return_markers=True)
    for img, label, (origin, terminal) in zip(images, labels, markers):
        a = tuple(np.floor(origin).astype(int))
        b = tuple(np.floor(terminal).astype(int))
        on = img > 0
        assert on[a] and on[b] and img[a] == 255 and img[b] == 255  # marker centres are drawn
        assert bool(_component(on, a)[b]) == bool(label)


def test_default_contours_are_dashed_and_apart(hard):
    images, labels, markers = hard
    # Contours never touch, dashed or not: no lit path joins the markers of a negative.
    for img, label, (origin, terminal) in zip(images[:200], labels, markers):
        if label == 0:
            a, b = tuple(np.floor(origin).astype(int)), tuple(np.floor(terminal).astype(int))
            assert not _component(img > 0, a)[b]
    # Dashes: bright cores with dim gaps, so the bright pixels of a contour fall apart into pieces.
    solid, _ = generate_pathfinder(20, seed=0, config=PathfinderConfig(paddle_margin=0.0))
    dashed_parts = np.mean([_n_components(im > 128) for im in images[:20]])
    solid_parts = np.mean([_n_components(im > 128) for im in solid])
    assert dashed_parts > 2 * solid_parts


def test_markers_sit_on_lit_pixels_in_default_images(hard):
    images, _, markers = hard
    idx = np.floor(markers).astype(int)
    rows = np.arange(len(images))
    assert (images[rows, idx[:, 0, 0], idx[:, 0, 1]] == 255).all()
    assert (images[rows, idx[:, 1, 0], idx[:, 1, 1]] == 255).all()
    # The two markers of a positive are the two ends of one long contour, never the same point.
    assert (np.linalg.norm(markers[:, 0] - markers[:, 1], axis=1) > 2).all()


def test_difficulty_lengthens_the_targets(hard):
    easy, _ = generate_pathfinder(100, seed=0, config=PathfinderConfig(contour_length=6))
    # Same total distractor length (20 paddles), longer targets: more lit pixels.
    assert (hard[0][:100] > 0).mean() > (easy > 0).mean() * 1.1


def test_other_image_sizes_and_counts():
    images, labels = generate_pathfinder(3, seed=0, config=PathfinderConfig(image_size=48, contour_length=9))
    assert images.shape == (3, 48, 48) and labels.shape == (3,)
    images, labels = generate_pathfinder(0)
    assert images.shape == (0, 32, 32) and labels.shape == (0,)


def test_invalid_configs():
    with pytest.raises(ValueError):
        PathfinderConfig(image_size=8)
    with pytest.raises(ValueError):
        PathfinderConfig(paddle_margin=-1)
    with pytest.raises(ValueError):
        PathfinderConfig(continuity=0)
    with pytest.raises(ValueError):
        generate_pathfinder(-1)
    with pytest.raises(RuntimeError, match="do not fit"):
        generate_pathfinder(1, config=PathfinderConfig(image_size=16, contour_length=30, max_redraws=1))
