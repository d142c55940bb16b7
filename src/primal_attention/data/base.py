"""The one container every dataset loader returns.

A dataset is a padded batch of sequences with a mask, stored as tensors: small enough for the
benchmarks we run here to live in memory, and trivially wrapped by a ``TensorDataset``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sys

import torch


class DataError(RuntimeError):
    """A dataset is missing, corrupt, or does not match what was asked for."""


@dataclass
class Batch:
    """One batch as a model consumes it: ``model(**batch.inputs)``, targets in ``y``.

    x: (B, N) int64 tokens, (B, N, C) float features or (B, C, H, W) float images; mask: (B, N)
    bool or None; x2, mask2: the second document of a two-tower task, else None; y: (B,) targets
    (or per-position targets, e.g. (B, L) next tokens, (B, K, A) actions); extra: further named
    model inputs (a Decision Transformer's actions, returns-to-go and timesteps).
    """

    x: torch.Tensor
    y: torch.Tensor
    mask: torch.Tensor | None = None
    x2: torch.Tensor | None = None
    mask2: torch.Tensor | None = None
    extra: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def inputs(self) -> dict[str, torch.Tensor]:
        """The model's keyword arguments: x, whichever of mask, x2, mask2 are present, and extra."""
        names = ("x", "mask", "x2", "mask2")
        return {**{k: getattr(self, k) for k in names if getattr(self, k) is not None}, **self.extra}

    def to(self, device: torch.device | str) -> "Batch":
        """The same batch on ``device`` (non-blocking where the source is pinned)."""
        move = lambda t: None if t is None else t.to(device, non_blocking=True)  # noqa: E731
        return Batch(move(self.x), move(self.y), move(self.mask), move(self.x2), move(self.mask2),
                     {k: move(v) for k, v in self.extra.items()})

    def __len__(self) -> int:
        return self.y.shape[0]


@dataclass
class SequenceData:
    """A labelled set of padded sequences.

    Attributes:
        x: ``(M, N)`` int64 tokens in ``[0, vocab_size)`` or ``(M, N, C)`` float32 features.
        mask: ``(M, N)`` bool, True = real token. Padding positions of ``x`` are 0.
        y: ``(M,)`` int64 labels in ``[0, num_classes)``.
        num_classes: number of classes.
        vocab_size: token vocabulary size (token input) or None (continuous input).
        name: dataset name, e.g. ``"JapaneseVowels"``.
        meta: free-form provenance (source path, normalisation statistics, stand-in notes).
        x2, mask2: a second sequence per example for two-tower tasks (LRA Retrieval), else None.
    """

    x: torch.Tensor
    mask: torch.Tensor
    y: torch.Tensor
    num_classes: int
    vocab_size: int | None = None
    name: str = ""
    meta: dict = field(default_factory=dict)
    x2: torch.Tensor | None = None
    mask2: torch.Tensor | None = None

    def __post_init__(self) -> None:
        m = self.x.shape[0]
        if self.mask.shape != self.x.shape[:2] or self.mask.dtype != torch.bool:
            raise DataError(
                f"{self.name}: expected mask of shape {tuple(self.x.shape[:2])} and dtype bool, "
                f"got {tuple(self.mask.shape)} {self.mask.dtype}"
            )
        if self.y.shape != (m,):
            raise DataError(f"{self.name}: expected y of shape ({m},), got {tuple(self.y.shape)}")
        if (self.x2 is None) != (self.mask2 is None):
            raise DataError(f"{self.name}: x2 and mask2 must be given together")

    def __len__(self) -> int:
        return self.x.shape[0]

    @property
    def seq_len(self) -> int:
        return self.x.shape[1]

    @property
    def num_features(self) -> int | None:
        """Channels of continuous input, None for token input."""
        return self.x.shape[2] if self.x.dim() == 3 else None

    def _subset_meta(self, index: torch.Tensor) -> dict:
        """Per-example metadata (tensors / arrays whose first axis is M) follows the subset; the rest
        (names, statistics, lists) is shared."""
        m = len(self)
        np = sys.modules.get("numpy")  # a torch-only install has no numpy, and then no value is an ndarray
        out = {}
        for key, value in self.meta.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == m:
                out[key] = value[index]
            elif np is not None and isinstance(value, np.ndarray) and value.ndim > 0 and value.shape[0] == m:
                out[key] = value[index.numpy()]
            else:
                out[key] = value
        return out

    def batch(self, index: torch.Tensor) -> Batch:
        """The examples at ``index`` (1-D long tensor) as a :class:`Batch` (on the data's device)."""
        return Batch(
            self.x[index],
            self.y[index],
            self.mask[index],
            None if self.x2 is None else self.x2[index],
            None if self.mask2 is None else self.mask2[index],
        )

    def subset(self, index: torch.Tensor) -> "SequenceData":
        """The examples at ``index`` (a 1-D long tensor), sharing metadata."""
        return SequenceData(
            x=self.x[index],
            mask=self.mask[index],
            y=self.y[index],
            num_classes=self.num_classes,
            vocab_size=self.vocab_size,
            name=self.name,
            meta=self._subset_meta(index),
            x2=None if self.x2 is None else self.x2[index],
            mask2=None if self.mask2 is None else self.mask2[index],
        )
