"""Capture the attention layers of a model and rebuild, in float64, the matrices they stand for.

Neither layer keeps an N×N matrix (softmax runs SDPA, primal never forms one), so a forward
pre-hook records each layer's input x and padding mask, and the matrices are recomputed from the
layer's own parameters with the layer's own masking semantics:

* softmax layers (:class:`~primal_attention.attention.SoftmaxAttention` and subclasses):
  A = softmax(q kᵀ / √d_h) with the keys :meth:`SoftmaxAttention._keep` allows, and the cosine
  kernel q̂ k̂ᵀ of the same q, k;
* primal layers (:class:`~primal_attention.attention.PrimalAttention`): the kernel K = q̂ k̂ᵀ of the
  feature maps and the scores E, R from :func:`primal_attention.reference.primal_attention` (the
  documented math, not the fast path's cache), with the layer's ``causal`` and ``sampling``.

Every matrix comes per sample and head, (B, H, rows, cols), with the rows and columns of padding
tokens set to 0 (see :func:`primal_attention.analysis.spectrum.masked_svdvals` for why that is the
same as removing them).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from primal_attention import reference
from primal_attention.attention import PrimalAttention, SoftmaxAttention
from primal_attention.reference import PrimalWeights


@dataclass
class LayerInput:
    """What a forward pre-hook saw: x (B, N, D) and the padding mask (B, N) bool (True = real)."""

    x: Tensor
    mask: Tensor


def attention_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, layer) for every softmax or primal attention layer, in module order."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, (SoftmaxAttention, PrimalAttention))]


@contextmanager
def capture_inputs(model: nn.Module) -> Iterator[dict[str, LayerInput]]:
    """Record each attention layer's input during the forwards inside the ``with`` block.

    Yields a dict name -> :class:`LayerInput`, filled as the model runs; a layer called more than
    once per forward (the two towers of a dual-input model) keeps its latest call. The hooks are
    removed on exit.
    """
    seen: dict[str, LayerInput] = {}
    handles = []

    def hook_for(name: str):
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            x = args[0] if args else kwargs["x"]
            mask = args[1] if len(args) > 1 else kwargs.get("mask", kwargs.get("attn_mask"))
            if mask is None:
                mask = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
            seen[name] = LayerInput(x.detach(), mask.detach())

        return hook

    for name, layer in attention_layers(model):
        handles.append(layer.register_forward_pre_hook(hook_for(name), with_kwargs=True))
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


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
        layer: the layer (its q_proj, k_proj, num_heads, causal flag and ``_keep`` rule are used).
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
    keep = layer._keep(mask, x.shape[1], x.device)
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    pair = _pair_mask(mask)
    kernel = F.normalize(q, dim=-1, eps=reference.EPS) @ F.normalize(k, dim=-1, eps=reference.EPS).transpose(-2, -1)
    return {"attention": scores.softmax(-1) * pair, "kernel": kernel * pair}


def primal_weights_f64(layer: PrimalAttention) -> PrimalWeights:
    """The layer's parameters (:meth:`PrimalAttention.weights`) detached, in float64."""
    return PrimalWeights(*[_f64(w) for w in layer.weights()])


def primal_features(layer: PrimalAttention, x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, reference.PrimalTrace]:
    """Φ_q = q̂, Φ_k = k̂ (B, H, N, d) and the reference trace of a primal layer, all float64.

    q̂ and k̂ are ``F.normalize`` of the head-split projections (of their prefix means over the real
    tokens for causal layers, DESIGN.md §3), exactly the feature maps inside
    :func:`primal_attention.reference.primal_attention`, whose trace gives E, R, W_{e|X}, W_{r|X}.
    """
    x = x.to(torch.float64)
    w = primal_weights_f64(layer)
    trace = reference.primal_attention(x, w, heads=layer.num_heads, causal=layer.causal, mask=mask,
                                       sampling=layer.sampling)
    q = _heads(F.linear(x, w.q_weight, w.q_bias), layer.num_heads)
    k = _heads(F.linear(x, w.k_weight, w.k_bias), layer.num_heads)
    if layer.causal:
        real = mask.to(torch.float64)
        q, k = reference._prefix_mean(q, real), reference._prefix_mean(k, real)
    return F.normalize(q, dim=-1, eps=reference.EPS), F.normalize(k, dim=-1, eps=reference.EPS), trace


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
