"""Attention layers with one interface, chosen by name.

* :mod:`~primal_attention.layers.registry`: names -> classes, imported on first use;
* :mod:`~primal_attention.layers.checks`: the input checks every layer shares;
* :mod:`~primal_attention.layers.primal`: :class:`PrimalAttention` and its decoding state;
* :mod:`~primal_attention.layers.softmax`: canonical softmax attention (SDPA or materialised);
* :mod:`~primal_attention.layers.window`: a local softmax window beside the primal term, gated per head;
* :mod:`~primal_attention.layers.cache`: the decoding cache passed through a model's forward.

Every layer is built as ``Cls(embed_dim, num_heads, *, max_seq_len=None, dropout=0.0, bias=True,
causal=False, **its_own_options)`` and called as ``forward(x, mask=None)`` with x: (B, N, D) and
mask: (B, N) bool, True = real token. Output rows at padding positions carry no information.
"""

from primal_attention.layers.cache import DecodeCache, KVBuffer, LayerCache
from primal_attention.layers.checks import check_heads, check_input, resolve_mask
from primal_attention.layers.primal import PrimalAttention, PrimalState
from primal_attention.layers.registry import attention_class, attention_names, build_attention, register_attention
from primal_attention.layers.softmax import MaterializedSoftmaxAttention, SoftmaxAttention
from primal_attention.layers.window import WindowPrimalAttention, WindowState

__all__ = [
    "DecodeCache",
    "KVBuffer",
    "LayerCache",
    "MaterializedSoftmaxAttention",
    "PrimalAttention",
    "PrimalState",
    "SoftmaxAttention",
    "WindowPrimalAttention",
    "WindowState",
    "attention_class",
    "attention_names",
    "build_attention",
    "check_heads",
    "check_input",
    "register_attention",
    "resolve_mask",
]
