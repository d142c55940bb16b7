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


def segments_from_cu_seqlens(cu_seqlens: Tensor, length: int) -> Tensor:
    """Document ids (1, length) of one packed row from its cumulative document lengths ``cu_seqlens``
    (k + 1,) int (``[0, n_1, n_1 + n_2, ..., length]``, flash-attention's ``cu_seqlens``)."""
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2 or int(cu_seqlens[0]) != 0 or int(cu_seqlens[-1]) != length \
            or bool((cu_seqlens[1:] < cu_seqlens[:-1]).any()):
        raise ValueError(f"cu_seqlens must rise from 0 to the row's {length} tokens, got {cu_seqlens.tolist()}")
    positions = torch.arange(length, device=cu_seqlens.device)
    return torch.searchsorted(cu_seqlens[1:].to(positions.dtype), positions, right=True)[None]
