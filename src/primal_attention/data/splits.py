"""Deterministic, class-stratified holdout splits.

The paper's UEA protocol selects the model on the test set; the honest protocol carves a validation
set out of TRAIN instead. :func:`stratified_split` is that carving step, shared by every dataset that
needs one (it is also how the Free Spoken Digit stand-in gets its train/test split).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch


def stratified_split(
    y: torch.Tensor | np.ndarray | Sequence[int], fraction: float, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split example indices into a kept part and a held-out part, class by class.

    For each class with ``n_c`` examples, ``round(fraction * n_c)`` of them (rounding half up) go to
    the held-out part, chosen by a permutation drawn from ``numpy.random.default_rng(seed)``; classes
    are visited in sorted order, so the result depends only on ``y``, ``fraction`` and ``seed``. When
    ``fraction > 0`` every class with at least two examples keeps at least one example on each side,
    even where rounding would empty one side; a class with a single example stays in the kept part.

    Args:
        y: ``(M,)`` integer class labels.
        fraction: share of each class to hold out, ``0 <= fraction < 1``.
        seed: seed of the permutation.

    Returns:
        ``(keep_idx, held_idx)``: disjoint, ascending ``int64`` index tensors covering ``range(M)``.
    """
    labels = torch.as_tensor(y).detach().cpu().numpy()
    if labels.ndim != 1:
        raise ValueError(f"expected y of shape (M,), got {tuple(labels.shape)}")
    if labels.size and not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"expected integer class labels, got dtype {labels.dtype}")
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"expected 0 <= fraction < 1, got {fraction}")

    rng = np.random.default_rng(seed)
    held: list[np.ndarray] = []
    for cls in np.unique(labels):
        members = np.flatnonzero(labels == cls)
        n = members.size
        n_held = math.floor(fraction * n + 0.5)
        if fraction > 0 and n >= 2:
            n_held = min(max(n_held, 1), n - 1)
        elif n < 2:
            n_held = 0
        held.append(rng.permutation(members)[:n_held])

    held_idx = np.sort(np.concatenate(held)) if held else np.zeros(0, dtype=np.int64)
    keep = np.ones(labels.size, dtype=bool)
    keep[held_idx] = False
    return (
        torch.from_numpy(np.flatnonzero(keep).astype(np.int64)),
        torch.from_numpy(held_idx.astype(np.int64)),
    )
