"""Fast kernels of Primal-Attention and its KSVD objective.

The math is :mod:`primal_attention.reference`; this module computes the same numbers with fewer
passes over memory (DESIGN.md §4, efficiency note):

* q and k come out of one matmul, are normalised per head in place of a (B, H, N, d) copy, and are
  kept side by side as the feature matrix ``[q̂ | k̂]`` of shape (B, N, 2D).
* The score tensors e, r (B, H, N, s) are never formed. Per sample and head the map
  ``q̂ ↦ e ↦ mix ↦ out_proj`` is linear, so it folds into one (2D, D) matrix ``A`` per sample
  (static for causal layers) and the whole layer after the q/k projection is one matmul
  ``[q̂ | k̂] @ A``.
* The KSVD terms need only the (d, d) Gram matrices of q̂ and k̂ per head:
  ``Σ_i ‖λ ⊙ e_i‖² = Σ_s λ_s² w_sᵀ (Σ_i q̂_i q̂_iᵀ) w_s``. They are computed lazily from what the
  forward keeps anyway, so a forward that is not followed by a KSVD loss costs nothing extra.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from primal_attention.reference import EPS, PrimalWeights, uniform_sample_index


class PrimalCache(NamedTuple):
    """What a forward keeps for the KSVD objective.

    features: (B, N, 2D), ``[q̂ | k̂]`` with head h of q̂ in channels h*d .. (h+1)*d - 1;
    proj: (B or 1, 2, H, d, s), ``[W_{e|X}, W_{r|X}]`` (causal: the static W_e, W_r);
    token_weight: (B, N) float, 1 for tokens in the KSVD means, or None for all tokens.
    """

    features: Tensor
    proj: Tensor
    token_weight: Tensor | None


def valid_sample_index(mask: Tensor, num_samples: int) -> Tensor:
    """Vectorised :func:`primal_attention.reference.valid_sample_index`: (B, n) int64."""
    seq_len = mask.shape[1]
    count = mask.sum(dim=1)  # (B,)
    # Stable sort of "is padding" puts each sample's real positions first, in order.
    order = torch.argsort((~mask).to(torch.uint8), dim=1, stable=True)
    j = torch.arange(num_samples, device=mask.device)
    rank = (j[None, :] * (count[:, None] - 1).clamp_min(0)) // max(num_samples - 1, 1)
    index = order.gather(1, rank.clamp_max(seq_len - 1))
    return torch.where(count[:, None] > 0, index, torch.zeros_like(index))


def _causal_prefix_mean(qk: Tensor, real: Tensor | None) -> Tensor:
    """Mean over real tokens up to each position: qk (B, N, C), real (B, N) float or None."""
    seq_len = qk.shape[1]
    if real is None:
        count = torch.arange(1, seq_len + 1, device=qk.device, dtype=qk.dtype)[None, :, None]
        return torch.cumsum(qk, dim=1) / count
    w = real[:, :, None].to(qk.dtype)
    return torch.cumsum(qk * w, dim=1) / torch.cumsum(w, dim=1).clamp_min(1.0)


def primal_attention(
    x: Tensor,
    weights: PrimalWeights,
    *,
    heads: int,
    causal: bool = False,
    mask: Tensor | None = None,
    sampling: str = "uniform",
    dropout_p: float = 0.0,
    training: bool = False,
    fold_out: bool | None = None,
) -> tuple[Tensor, PrimalCache]:
    """Fast Primal-Attention forward; same arguments and output as the reference.

    Args:
        x: (B, N, D). mask: (B, N) bool or None. dropout_p: dropout on the mixed per-head output
            (before out_proj); when it is active the output projection cannot be folded and a
            per-head path is taken. fold_out: fold out_proj into the per-sample map (None: when
            N ≥ 16·D, where it measured faster).

    Returns:
        out (B, N, D) and the :class:`PrimalCache` for the KSVD objective.
    """
    batch, seq_len, dim = x.shape
    d = dim // heads
    s = weights.lam.shape[-1]
    real = None if mask is None else mask.to(x.dtype)

    qk_weight = torch.cat([weights.q_weight, weights.k_weight], dim=0)
    qk_bias = None if weights.q_bias is None else torch.cat([weights.q_bias, weights.k_bias], dim=0)
    qk = F.linear(x, qk_weight, qk_bias)  # (B, N, 2D)
    if causal:
        qk = _causal_prefix_mean(qk, real)
    features = F.normalize(qk.view(batch, seq_len, 2 * heads, d), p=2.0, dim=-1, eps=EPS)
    features = features.view(batch, seq_len, 2 * dim)

    w_er = torch.stack([weights.we, weights.wr])  # (2, H, n or d, s)
    if causal:
        proj = w_er[None]  # (1, 2, H, d, s)
    else:
        n = weights.we.shape[1]
        if mask is None or sampling == "uniform":
            x_sampled = x[:, uniform_sample_index(seq_len, n, x.device)]
        else:
            index = valid_sample_index(mask, n)
            x_sampled = x.gather(1, index[:, :, None].expand(batch, n, dim))
        x_tilde = x_sampled.view(batch, n, heads, d)
        proj = torch.einsum("bmhc,ghms->bghcs", x_tilde, w_er)  # (B, 2, H, d, s)

    out = mix_and_project(
        features, proj, weights, heads=heads, real=real, dropout_p=dropout_p, training=training, fold_out=fold_out
    )
    token_weight = real if (real is not None and sampling == "valid") else None
    return out, PrimalCache(features, proj, token_weight)


def mix_and_project(
    features: Tensor,
    proj: Tensor,
    weights: PrimalWeights,
    *,
    heads: int,
    real: Tensor | None = None,
    dropout_p: float = 0.0,
    training: bool = False,
    fold_out: bool | None = None,
) -> Tensor:
    """Scores, mix and output projection from the features: (B, N, 2D) -> (B, N, D).

    proj: (B or 1, 2, H, d, s); real: (B, N) float padding weights or None. For long sequences and
    without active dropout the whole map folds into one (2D, D) matrix per sample (DESIGN.md §4,
    efficiency note); otherwise each head applies its (2d, d) map and out_proj follows.
    """
    batch, seq_len, two_dim = features.shape
    dim = two_dim // 2
    d = dim // heads
    s = weights.lam.shape[-1]
    mix = weights.mix_weight.view(d, 2, s).permute(1, 0, 2)  # (2, d, s): C_e, C_r
    head_map = torch.einsum("bghcs,ges->bghce", proj, mix)  # (B|1, 2, H, d, d)

    # Folding out_proj costs 2·d·D² per sample to build and saves one (B, N, D) pass: it pays only
    # for long sequences relative to the width (measured: 3x slower at N 29, D 512; 1.5x faster at
    # N 4096, D 64).
    if fold_out is None:
        fold_out = seq_len >= 16 * dim
    fold_out = fold_out and not (training and dropout_p > 0.0)
    if not fold_out:
        f = features.view(batch, seq_len, 2, heads, d)
        mixed = torch.einsum("bnghc,bghce->bnhe", f, head_map.expand(batch, -1, -1, -1, -1))
        if weights.mix_bias is not None:
            mixed = mixed + weights.mix_bias
        if real is not None:
            mixed = mixed * real[:, :, None, None]
        if training and dropout_p > 0.0:
            mixed = F.dropout(mixed, p=dropout_p, training=True)
        return F.linear(mixed.reshape(batch, seq_len, dim), weights.out_weight, weights.out_bias)

    out_w = weights.out_weight.view(dim, heads, d)  # out_w[o, h, e] = W_o[o, h*d + e]
    fold = torch.einsum("bghce,ohe->bghco", head_map, out_w).reshape(-1, 2 * dim, dim)
    out = features @ fold if fold.shape[0] == batch else features @ fold[0]
    # Under autocast the matmul gives bf16/fp16; keep the elementwise tail in that dtype.
    if weights.mix_bias is not None:
        out = out + torch.einsum("e,ohe->o", weights.mix_bias, out_w).to(out.dtype)
    if real is not None:
        out = out * real[:, :, None].to(out.dtype)
    if weights.out_bias is not None:
        out = out + weights.out_bias.to(out.dtype)
    return out


def ksvd_objective(
    cache: PrimalCache,
    lam: Tensor,
    we: Tensor,
    wr: Tensor,
    *,
    reduction: str = "batch",
    form: str = "authors",
) -> Tensor:
    """KSVD objective J from a forward's cache, without forming the score tensors.

    Same definition as :func:`primal_attention.reference.ksvd_objective`; lam is the effective Λ
    (H, s), we / wr the learned parameters. Always computed in float32 (or float64 if the cache is),
    autocast off. Returns a scalar for reduction="batch" and (B,) for "sample".
    """
    features, proj, token_weight = cache
    compute_dtype = torch.promote_types(features.dtype, torch.float32)
    with torch.autocast(device_type=features.device.type, enabled=False):
        batch, seq_len, _ = features.shape
        heads, s = lam.shape
        d = proj.shape[-2]
        f = features.to(compute_dtype).view(batch, seq_len, 2, heads, d)
        fw = f if token_weight is None else f * token_weight.to(compute_dtype)[:, :, None, None, None]
        gram = torch.einsum("bnghc,bnghe->bghce", fw, f)  # (B, 2, H, d, d)
        p = proj.to(compute_dtype)
        quad = (p * (gram @ p)).sum(dim=-2)  # (B, 2, H, s): Σ_i (w_sᵀ f_i)²
        lam = lam.to(compute_dtype)
        if token_weight is None:
            count = torch.full((batch,), float(seq_len), dtype=compute_dtype, device=features.device)
        else:
            count = token_weight.to(compute_dtype).sum(dim=1)

        if form == "authors":
            trace = (we.to(compute_dtype) * wr.to(compute_dtype)).sum() / heads
            score = 0.5 * (quad * lam.square()).sum(dim=(1, 2, 3))  # (B,)
            if reduction == "batch":
                return score.sum() / (count.sum() * heads).clamp_min(1.0) - trace
            return score / (count * heads).clamp_min(1.0) - trace
        if form == "paper":
            trace = (p[:, 0] * p[:, 1]).sum(dim=(1, 2, 3))  # (B or 1,)
            per_sample = 0.5 * (quad * lam).sum(dim=(1, 2, 3)) - trace
            return per_sample.mean() if reduction == "batch" else per_sample
    raise ValueError(f"form must be 'authors' or 'paper', got {form!r}")
