"""Capture the attention layers of a model and rebuild, in float64, the matrices they stand for.

Neither layer keeps an N×N matrix (softmax runs SDPA, primal never forms one), so a forward
pre-hook records each layer's input x and padding mask, and the matrices are recomputed from the
layer's own parameters with the layer's own masking semantics:

* softmax layers (:class:`~primal_attention.layers.SoftmaxAttention` and subclasses):
  A = softmax(q kᵀ / √d_h) with the keys :meth:`SoftmaxAttention.keep_mask` allows, and the cosine
  kernel q̂ k̂ᵀ of the same q, k;
* primal layers (:class:`~primal_attention.layers.PrimalAttention`): the kernel K = q̂ k̂ᵀ of the
  feature maps and the scores E, R from :func:`primal_attention.ops.primal.reference.primal_attention` (the
  documented math, not the fast path's cache), with the layer's ``causal`` and ``sampling``.

Every matrix comes per sample and head, (B, H, rows, cols), with the rows and columns of padding
tokens set to 0 (see :func:`primal_attention.analysis.spectrum.masked_svdvals` for why that is the
same as removing them).
"""

from __future__ import annotations

import math
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from primal_attention.ops.primal import reference
from primal_attention.layers.inputs import LayerInput, record_inputs
from primal_attention.layers.primal import PrimalAttention
from primal_attention.layers.softmax import SoftmaxAttention
from primal_attention.ksvd.diagnostics import reference_trace


def attention_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, layer) for every softmax or primal attention layer, in module order."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, (SoftmaxAttention, PrimalAttention))]


def capture_inputs(model: nn.Module):
    """Record each attention layer's input during the forwards inside the ``with`` block.

    A context manager yielding name -> :class:`LayerInput` (see
    :func:`primal_attention.layers.inputs.record_inputs`).
    """
    return record_inputs(attention_layers(model), model)


def _f64(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.detach().to(torch.float64)


def _heads(t: Tensor, heads: int) -> Tensor:
    """(B, N, D) -> (B, H, N, d), head h owning channels h*d .. (h+1)*d - 1."""
    b, n, d = t.shape
    return t.reshape(b, n, heads, d // heads).permute(0, 2, 1, 3)


def _pair_mask(mask: Tensor) -> Tensor:
    """(B, 1, N, N) float64: 1 where both the row and the column token are real."""
    return (mask[:, None, :, None] & mask[:, None, None, :]).to(torch.float64)


def softmax_matrices(layer: SoftmaxAttention, x: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """A softmax layer's attention matrix and cosine kernel, float64.

    Args:
        layer: the layer (its q_proj, k_proj, num_heads, causal flag and ``keep_mask`` rule are used).
        x: (B, N, D) its input. mask: (B, N) bool, True = real token.

    Returns:
        ``{"attention": softmax(q kᵀ/√d_h) (B, H, N, N), "kernel": q̂ k̂ᵀ (B, H, N, N)}``, zero at
        padding rows and columns. Each real row of the attention sums to 1 over the real keys it
        may attend to (all of them, or those up to itself when causal).
    """
    x = x.to(torch.float64)
    q = _heads(F.linear(x, _f64(layer.q_proj.weight), _f64(layer.q_proj.bias)), layer.num_heads)
    k = _heads(F.linear(x, _f64(layer.k_proj.weight), _f64(layer.k_proj.bias)), layer.num_heads)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(layer.head_dim)
    keep = layer.keep_mask(mask, x.shape[1], x.device)
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    pair = _pair_mask(mask)
    kernel = F.normalize(q, dim=-1, eps=reference.EPS) @ F.normalize(k, dim=-1, eps=reference.EPS).transpose(-2, -1)
    return {"attention": scores.softmax(-1) * pair, "kernel": kernel * pair}


def primal_features(layer: PrimalAttention, x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, reference.PrimalTrace]:
    """Φ_q = q̂, Φ_k = k̂ (B, H, N, d) and the reference trace of a primal layer, all float64
    (:func:`primal_attention.ksvd.diagnostics.reference_trace`)."""
    trace = reference_trace(layer, x, mask)
    return trace.q_hat, trace.k_hat, trace


def primal_matrices(layer: PrimalAttention, x: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """A primal layer's kernel and score matrices, float64.

    Returns:
        ``{"kernel": K = q̂ k̂ᵀ (B, H, N, N), "scores": [E, R] (B, H, N, 2s)}``, zero at padding
        rows (and, for K, columns).
    """
    q_hat, k_hat, trace = primal_features(layer, x, mask)
    rows = mask[:, None, :, None].to(torch.float64)
    return {
        "kernel": (q_hat @ k_hat.transpose(-2, -1)) * _pair_mask(mask),
        "scores": torch.cat([trace.escore, trace.rscore], dim=-1) * rows,
    }


def layer_matrices(layer: nn.Module, inputs: LayerInput) -> dict[str, Tensor]:
    """Every view of one captured layer: view name -> (B, H, N, N or 2s) float64."""
    if isinstance(layer, PrimalAttention):
        return primal_matrices(layer, inputs.x, inputs.mask)
    if isinstance(layer, SoftmaxAttention):
        return softmax_matrices(layer, inputs.x, inputs.mask)
    raise TypeError(f"expected a SoftmaxAttention or PrimalAttention, got {type(layer).__name__}")
