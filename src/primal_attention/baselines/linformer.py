"""Linformer (Wang et al., 2020): softmax attention over keys and values projected along the sequence.

With learned E, F ∈ R^{k×N_max} (one pair per layer, shared by the heads — the paper's "headwise
sharing"; ``share_kv=True`` also ties F = E),

    out = softmax(q (E k)ᵀ / √d_h) (F v),       E k, F v ∈ R^{k×d_h} per head.

A sequence shorter than ``max_seq_len`` uses the first N columns of E and F (as lucidrains'
``linformer`` does); a longer one is an error. E and F are initialised Xavier-uniform with gain
1/√2, as in the Linformer authors' fairseq code. (The LRA code behind the paper's baseline numbers
draws them N(0, 0.02²) and shares one E across all layers and between keys and values.)

Padding: padding keys and values are zeroed before the projection, which is all the method allows —
the projection mixes tokens, so a padding position still adds zero keys (logit 0, value 0) to the
softmax; with no padding the layer is exact Linformer. Table 3 setting: k = 256. Non-causal only.
``dropout`` acts on the N×k attention weights.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from primal_attention.layers.registry import register_attention
from primal_attention.baselines._base import BaselineAttention

__all__ = ["LinformerAttention"]


@register_attention("linformer")
class LinformerAttention(BaselineAttention):
    """Linformer attention with sequence-axis projections E (keys) and F (values).

    Args (beyond :class:`BaselineAttention`):
        max_seq_len: required, the width N_max of E and F.
        k: projected length, default 256 (Table 3).
        share_kv: use one projection for keys and values.

    Parameters: ``proj_k`` (k, max_seq_len) and, unless ``share_kv``, ``proj_v`` (k, max_seq_len).
    """

    method = "linformer"

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        k: int = 256,
        share_kv: bool = False,
        **common: Any,
    ) -> None:
        max_seq_len = common.get("max_seq_len")
        if max_seq_len is None:
            raise ValueError(
                "LinformerAttention needs max_seq_len: its projections E, F map the sequence axis "
                "(max_seq_len) to k"
            )
        super().__init__(embed_dim, num_heads, **common)
        if k <= 0:
            raise ValueError(f"LinformerAttention: k must be positive, got {k}")
        self.k = k
        self.share_kv = share_kv
        self.proj_k = nn.Parameter(torch.empty(k, max_seq_len))
        self.proj_v = None if share_kv else nn.Parameter(torch.empty(k, max_seq_len))
        self.reset_projections()

    @torch.no_grad()
    def reset_projections(self) -> None:
        for p in (self.proj_k, self.proj_v):
            if p is not None:
                nn.init.xavier_uniform_(p, gain=1 / math.sqrt(2))

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        n = q.shape[2]
        e = self.proj_k[:, :n]
        f = e if self.proj_v is None else self.proj_v[:, :n]
        if mask is not None:
            k = k.masked_fill(~mask[:, None, :, None], 0.0)
            v = v.masked_fill(~mask[:, None, :, None], 0.0)
        k_low = torch.einsum("jn,bhnd->bhjd", e, k)
        v_low = torch.einsum("jn,bhnd->bhjd", f, v)
        weights = ((q @ k_low.transpose(-1, -2)) * self.head_dim**-0.5).softmax(-1)
        return self._drop(weights) @ v_low

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, k={self.k}, share_kv={self.share_kv}"
