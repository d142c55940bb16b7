"""Efficient-attention baselines that the benchmark compares Primal-Attention against.

Settings of the paper's Table 3 (LRA) are the defaults: Nyström 64 landmarks, Linformer k = 256,
Performer 256 random features, Reformer 2 hashes, linear attention elu + 1.

Every class has the interface of our attention layers and is registered under its name in
:mod:`primal_attention.layers.registry`, which imports this package the first time one of their
names is asked for, so a model picks it per layer like any other attention::

    layer = build_attention("nystrom", 64, 2, max_seq_len=2000)
    y = layer(x, mask)          # x: (B, N, D), mask: (B, N) bool, True = real token -> (B, N, D)

Each owns ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj`` (Reformer shares queries and keys:
``k_proj`` is None), zeroes padding rows before ``out_proj`` and keeps padding keys out as far as
the method allows (see each module). Causal: linear, Performer, Reformer; Nyström and Linformer
raise ValueError for ``causal=True``.

All five are written here from the papers rather than wrapped. The established packages
(lucidrains' nystrom-attention 0.0.14, linformer 0.2.3, performer-pytorch 1.1.4,
reformer-pytorch 1.4.4) install against our torch and run, but none fits as is: their projections
are fused or bias-free and named differently; ``linformer`` ignores a padding mask, performer-pytorch
only zeroes padding *values* (padding keys stay in the normaliser) and imports ``distutils``
(removed in Python 3.12); nystrom-attention, without a mask, treats its own zero padding as tokens;
reformer-pytorch needs N to be a multiple of 2·bucket_size; and two of them pull in a tree of
further packages. Where the method allowed, their results were checked against these modules.
"""

from __future__ import annotations

from primal_attention.baselines._base import BaselineAttention
from primal_attention.baselines.linear import LinearAttention
from primal_attention.baselines.linformer import LinformerAttention
from primal_attention.baselines.nystrom import NystromAttention
from primal_attention.baselines.performer import PerformerAttention
from primal_attention.baselines.reformer import ReformerAttention

#: the baselines alone, name -> class (each also built by name with ``build_attention``).
BASELINES: dict[str, type[BaselineAttention]] = {
    cls.method: cls
    for cls in (NystromAttention, LinformerAttention, PerformerAttention, ReformerAttention, LinearAttention)
}

__all__ = [
    "BASELINES",
    "BaselineAttention",
    "LinearAttention",
    "LinformerAttention",
    "NystromAttention",
    "PerformerAttention",
    "ReformerAttention",
]
