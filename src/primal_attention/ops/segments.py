"""Packed rows: several documents in one row, marked by per-token document ids (B, N), each document
one run of equal ids (what HF / TRL padding-free batches express with position ids that restart)."""

from __future__ import annotations

import torch
from torch import Tensor


def segment_starts(segments: Tensor) -> Tensor:
    """For document ids (B, N) that are constant over each document (packed documents, each one run of
    equal ids): the index of the first token of each position's document, (B, N) int64."""
    batch, seq_len = segments.shape
    first = torch.ones_like(segments, dtype=torch.bool)
    first[:, 1:] = segments[:, 1:] != segments[:, :-1]
    index = torch.arange(seq_len, device=segments.device).expand(batch, seq_len)
    return torch.cummax(torch.where(first, index, torch.zeros_like(index)), dim=1).values
