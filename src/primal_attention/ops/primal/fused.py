"""The fast path of Primal-Attention and its KSVD objective.

The math is :mod:`primal_attention.ops.primal.reference`; this module computes the same numbers with fewer
passes over memory (docs/method.md §4, efficiency note):

* The score tensors e, r (B, H, N, s) are never formed. Per sample and head the map
  ``q̂ ↦ e ↦ mix ↦ out_proj`` is linear, so it folds into one (2D, D) matrix ``A`` per sample
  (static for causal layers) and the layer after the q/k projection is one matmul ``[q̂ | k̂] @ A``.
* The KSVD terms need only the (d, d) Gram matrices of q̂ and k̂ per head:
  ``Σ_i ‖λ ⊙ e_i‖² = Σ_s λ_s² w_sᵀ (Σ_i q̂_i q̂_iᵀ) w_s``.
* For long sequences (the folded path) everything that touches N rows — q/k projection, the
  normalisation, the Gram matrices and the folded matmul — runs in one :class:`torch.autograd.Function`
  (:class:`~primal_attention.ops.primal.folded.FoldedPrimal`) with a hand-written backward. It walks the rows in chunks of about
  :data:`CHUNK_ROWS` so that each chunk's intermediates stay in cache instead of making a dozen
  passes over (B, N, 2D) tensors in main memory, keeps only ``[q̂ | k̂]`` and the inverse norms for
  backward, and returns the Gram matrices as a small second output, so the KSVD gradient arrives in
  the same backward. Under autocast the matmuls run in the autocast dtype and the Gram matrices are
  accumulated in float32.
* On CUDA, with Triton installed, the same row loop runs as two Triton kernels
  (:mod:`primal_attention.ops.primal.triton_folded`; the ``kernel`` argument chooses, see
  :mod:`primal_attention.ops.primal.kernel`).
* Short sequences (N < 16·D, e.g. UEA) and active dropout keep the per-head path
  (:func:`mix_and_project`), where folding ``out_proj`` costs more than it saves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from primal_attention.ops.primal.folded import CHUNK_ROWS, FoldedPrimal, folded_infer
from primal_attention.ops.primal.kernel import Kernel, resolve_kernel
from primal_attention.ops.primal.reference import PrimalWeights, norm_eps, uniform_sample_index
from primal_attention.ops.segments import segment_starts


class PrimalCache(NamedTuple):
    """What a forward keeps for the KSVD objective.

    features: (B, N, 2D) ``[q̂ | k̂]`` (head h of q̂ in channels h*d .. (h+1)*d - 1), kept when the
    Gram matrices were not formed in the forward (per-head path, or a no-grad forward on CUDA),
    else None;
    proj: (B or 1, 2, H, d, s), ``[W_{e|X}, W_{r|X}]`` (causal: the static W_e, W_r);
    token_weight: (B, N) float, 1 for tokens in the KSVD means, or None for all tokens;
    gram: (B, 2, H, d, d) float32/64 token-weighted Gram matrices of q̂ and k̂ per head, or None;
    seq_len: N (the token count of the means when token_weight is None).
    """

    features: Tensor | None
    proj: Tensor
    token_weight: Tensor | None
    gram: Tensor | None = None
    seq_len: int = 0
    #: the inference path (no gradients): neither features nor Gram were kept, only what recomputes
    #: the features on demand (:func:`materialize_features`): (x or the projected [q | k], unused,
    #: projected, heads, compute dtype).
    inputs: tuple | None = None


def valid_sample_index(mask: Tensor, num_samples: int) -> Tensor:
    """Vectorised :func:`primal_attention.ops.primal.reference.valid_sample_index`: (B, n) int64."""
    count = mask.sum(dim=1)  # (B,)
    # Stable sort of "is padding" puts each sample's real positions first, in order.
    order = torch.argsort((~mask).to(torch.uint8), dim=1, stable=True)
    rank = torch.zeros(mask.shape[0], num_samples, dtype=torch.int64, device=mask.device)
    for length in count.unique().tolist():  # one integer linspace per distinct length
        if length > 0:
            rank[count == length] = uniform_sample_index(length, num_samples, mask.device)
    index = order.gather(1, rank)
    return torch.where(count[:, None] > 0, index, torch.zeros_like(index))


def _restart(cumulative: Tensor, starts: Tensor) -> Tensor:
    """Inclusive cumulative sums (B, N, C) restarted at each document: minus the sum before its start."""
    before = (starts - 1).clamp_min(0)[:, :, None].expand(-1, -1, cumulative.shape[-1])
    base = cumulative.gather(1, before)
    return cumulative - base.masked_fill((starts == 0)[:, :, None], 0.0)


def _causal_prefix_mean(qk: Tensor, real: Tensor | None, prefix: tuple[Tensor, Tensor] | None = None,
                        segments: Tensor | None = None) -> Tensor:
    """Mean over real tokens up to each position: qk (B, N, C), real (B, N) float or None.

    prefix: ``(total (B, C), count (B,))``, the sums of the tokens before these N (a chunk after a
    decoding state, :class:`~primal_attention.ops.primal.decode.PrimalState`), or None for none.
    segments: (B, N) document ids of packed rows: each position's mean covers its own document only.
    """
    seq_len = qk.shape[1]
    # Sums in float32 at least: under fp16 autocast a cumsum over 20 000 tokens overflows 65 504.
    acc = torch.promote_types(qk.dtype, torch.float32)
    if real is None and segments is None:
        total = torch.cumsum(qk.to(acc), dim=1)
        count = torch.arange(1, seq_len + 1, device=qk.device, dtype=acc)[None, :, None]
    else:
        w = torch.ones_like(qk[:, :, :1], dtype=acc) if real is None else real[:, :, None].to(acc)
        total, count = torch.cumsum(qk.to(acc) * w, dim=1), torch.cumsum(w, dim=1)
        if segments is not None:
            starts = segment_starts(segments)
            total, count = _restart(total, starts), _restart(count, starts)
            return (total / count.clamp_min(1.0)).to(qk.dtype)
    if prefix is not None:
        total = total + prefix[0][:, None, :].to(acc)
        count = count + prefix[1][:, None, None].to(acc)
    if real is None and prefix is None:
        return (total / count).to(qk.dtype)
    return (total / count.clamp_min(1.0)).to(qk.dtype)


def materialize_features(cache: PrimalCache, weights: PrimalWeights) -> PrimalCache:
    """The cache of an inference-path forward with its features recomputed from what it recorded
    (no gradient, the forward's compute dtype), as the training path would have kept them: the q/k
    projection of x with the current weights (non-causal) or the recorded [q | k] (causal prefix
    mean, qk_transform), then F.normalize. Other caches are returned as they are."""
    if cache.inputs is None or cache.features is not None or cache.gram is not None:
        return cache
    source, _, projected, heads, dtype = cache.inputs
    batch, seq_len = source.shape[:2]
    with torch.no_grad(), torch.autocast(source.device.type, enabled=False):
        if projected:  # [q | k] after the causal prefix mean / qk_transform, as the row loop read it
            qk = source.to(dtype)
        else:
            qk_weight, qk_bias = weights.qk()
            qk = F.linear(source.to(dtype), qk_weight.to(dtype), None if qk_bias is None else qk_bias.to(dtype))
        width = qk.shape[-1]
        features = F.normalize(qk.reshape(batch, seq_len, 2 * heads, width // (2 * heads)), p=2.0, dim=-1,
                               eps=norm_eps(dtype))
    return cache._replace(features=features.view(batch, seq_len, width), inputs=None)


def _autocast_dtype(device_type: str) -> torch.dtype | None:
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


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
    chunk_rows: int | None = None,
    qk_transform: Callable[[Tensor], Tensor] | None = None,
    kernel: Kernel = "auto",
    prefix: tuple[Tensor, Tensor] | None = None,
    segments: Tensor | None = None,
) -> tuple[Tensor, PrimalCache]:
    """Fast Primal-Attention forward; same arguments and output as the reference.

    Args:
        x: (B, N, D). mask: (B, N) bool or None. dropout_p: dropout on the mixed per-head output
            (before out_proj); when it is active the output projection cannot be folded and a
            per-head path is taken. fold_out: fold out_proj into the per-sample map (None: when
            N ≥ 16·D, where it measured faster). chunk_rows: rows per chunk of the folded path
            (default :data:`CHUNK_ROWS`). qk_transform: maps the projections ``[q | k]``
            (B, N, 2D) to a tensor of the same shape, token by token, before the (causal prefix
            mean and the) feature map, e.g. a rotary position embedding; None: identity.
            kernel: the folded path's row loop, :data:`~primal_attention.ops.primal.kernel.Kernel`
            ("auto", "torch", "triton"; see :func:`~primal_attention.ops.primal.kernel.resolve_kernel`).
        prefix: causal only: ``(total (B, 2D), count (B,))``, the running sums of the real tokens
            before x (a chunk of a longer sequence, after its decoding state); None: x starts it.
        segments: causal only: (B, N) document ids of packed rows (each document one run of equal
            ids); each position's prefix mean then restarts at its document's first token, so a
            packed row gives its documents' own outputs. Takes the unfolded path.

    Returns:
        out (B, N, D) and the :class:`PrimalCache` for the KSVD objective.
    """
    batch, seq_len, dim = x.shape
    d = dim // heads
    if causal and mask is not None:
        # a causal layer never reads a padding token (prefix sums leave it out, its row is the bias):
        # zeroed, a NaN / inf there cannot reach a real row through 0 · NaN
        x = x.masked_fill(~mask[:, :, None], 0.0)
    real = None if mask is None else mask.to(x.dtype)
    token_weight = real if (real is not None and sampling == "valid") else None

    qk_weight, qk_bias = weights.qk()

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

    if segments is not None and (not causal or prefix is not None):
        raise ValueError("primal_attention: segments (packed documents) need a causal layer and no prefix")
    if fold_out is None:
        fold_out = seq_len >= 16 * dim
    fold_out = fold_out and not (training and dropout_p > 0.0) and segments is None
    if fold_out:
        return _folded(x, weights, proj, qk_weight, qk_bias, heads=heads, causal=causal, real=real,
                       token_weight=token_weight, chunk_rows=chunk_rows or CHUNK_ROWS, qk_transform=qk_transform,
                       kernel=kernel, prefix=prefix)

    qk = F.linear(x, qk_weight, qk_bias)  # (B, N, 2D)
    if qk_transform is not None:
        qk = qk_transform(qk)
    if causal:
        qk = _causal_prefix_mean(qk, real, prefix, segments)
    features = F.normalize(qk.view(batch, seq_len, 2 * heads, d), p=2.0, dim=-1, eps=norm_eps(qk.dtype))
    features = features.view(batch, seq_len, 2 * dim)
    out = mix_and_project(features, proj, weights, heads=heads, real=real, dropout_p=dropout_p, training=training)
    return out, PrimalCache(features, proj, token_weight, None, seq_len)


def fold_matrix(proj: Tensor, weights: PrimalWeights, heads: int) -> Tensor:
    """The per-sample (2D, D) map ``[q̂ | k̂] ↦ out_proj(merge(mix([e; r])))`` without biases."""
    dim = weights.out_weight.shape[0]
    d = dim // heads
    s = weights.lam.shape[-1]
    mix = weights.mix_weight.view(d, 2, s).permute(1, 0, 2)  # (2, d, s): C_e, C_r
    out_w = weights.out_weight.view(dim, heads, d)  # out_w[o, h, e] = W_o[o, h*d + e]
    head_map = torch.einsum("bghcs,ges->bghce", proj, mix)  # (B|1, 2, H, d, d)
    return torch.einsum("bghce,ohe->bghco", head_map, out_w).reshape(-1, 2 * dim, dim)


def _folded(
    x: Tensor,
    weights: PrimalWeights,
    proj: Tensor,
    qk_weight: Tensor,
    qk_bias: Tensor | None,
    *,
    heads: int,
    causal: bool,
    real: Tensor | None,
    token_weight: Tensor | None,
    chunk_rows: int,
    qk_transform: Callable[[Tensor], Tensor] | None = None,
    kernel: Kernel = "auto",
    prefix: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, PrimalCache]:
    dim = x.shape[-1]
    d = dim // heads
    fold = fold_matrix(proj, weights, heads)
    cbias = None
    if weights.mix_bias is not None:
        cbias = torch.einsum("e,ohe->o", weights.mix_bias, weights.out_weight.view(dim, heads, d))
    obias = weights.out_bias
    wqk, bqk, inp = qk_weight, qk_bias, x
    if causal or qk_transform is not None:
        # The projection leaves the fused row loop: the prefix mean or the transform sits between
        # it and the feature map.
        inp = F.linear(x, qk_weight, qk_bias)
        if qk_transform is not None:
            inp = qk_transform(inp).contiguous()
        if causal:
            inp = _causal_prefix_mean(inp, real, prefix)
        wqk = bqk = None
    dtype = _autocast_dtype(x.device.type)
    if dtype is not None:
        # Matmuls in the autocast dtype, like F.linear under autocast; the Gram stays float32.
        inp, fold = inp.to(dtype), fold.to(dtype)
        wqk = None if wqk is None else wqk.to(dtype)
        bqk = None if bqk is None else bqk.to(dtype)
        cbias = None if cbias is None else cbias.to(dtype)
        obias = None if obias is None else obias.to(dtype)
        real = None if real is None else real.to(dtype)
    need_gram = torch.is_grad_enabled()
    args = (inp, wqk, bqk, fold, cbias, obias, real, token_weight, 2 * heads, need_gram, chunk_rows)
    triton = fold.dtype != torch.float64 and resolve_kernel(kernel, x.device) == "triton"
    if not need_gram and not triton:
        # Inference: only what the output needs; the KSVD features are recomputed on demand.
        with torch.autocast(x.device.type, enabled=False):
            out = folded_infer(inp, wqk, bqk, fold, cbias, obias, real, 2 * heads, chunk_rows)
        # What the features are recomputed from: x (the q/k projection follows), or, where the
        # projection already left the row loop (causal prefix mean, qk_transform), [q | k] itself.
        inputs = (x, None, False, heads, fold.dtype) if wqk is not None else (inp, None, True, heads, fold.dtype)
        return out, PrimalCache(None, proj, token_weight, None, x.shape[1], inputs)
    with torch.autocast(x.device.type, enabled=False):
        if triton:  # the kernels compute in float32
            from primal_attention.ops.primal.triton_folded import TritonFoldedPrimal

            out, second = TritonFoldedPrimal.apply(*args, norm_eps(fold.dtype))
        else:
            out, second = FoldedPrimal.apply(*args)
    if need_gram:
        gram = second.view(x.shape[0], 2, heads, d, d)
        return out, PrimalCache(None, proj, token_weight, gram, x.shape[1])
    return out, PrimalCache(second, proj, token_weight, None, x.shape[1])


def mix_and_project(
    features: Tensor,
    proj: Tensor,
    weights: PrimalWeights,
    *,
    heads: int,
    real: Tensor | None = None,
    dropout_p: float = 0.0,
    training: bool = False,
) -> Tensor:
    """Scores, mix and output projection from the features, head by head: (B, N, 2D) -> (B, N, D).

    proj: (B or 1, 2, H, d, s); real: (B, N) float padding weights or None. Each head applies its
    (2d, d) map ``[q̂ | k̂] ↦ mix([e; r])``, padding rows are zeroed, dropout (when training) and
    out_proj follow. The per-head path of short sequences, active dropout and :meth:`step`; long
    sequences take the folded path (:class:`~primal_attention.ops.primal.folded.FoldedPrimal`).
    """
    batch, seq_len, two_dim = features.shape
    dim = two_dim // 2
    d = dim // heads
    s = weights.lam.shape[-1]
    mix = weights.mix_weight.view(d, 2, s).permute(1, 0, 2)  # (2, d, s): C_e, C_r
    head_map = torch.einsum("bghcs,ges->bghce", proj, mix)  # (B|1, 2, H, d, d)
    f = features.view(batch, seq_len, 2, heads, d)
    mixed = torch.einsum("bnghc,bghce->bnhe", f, head_map.expand(batch, -1, -1, -1, -1))
    if weights.mix_bias is not None:
        mixed = mixed + weights.mix_bias
    if real is not None:  # a fill, not a product: a padding row is 0 (then out_proj's bias) even if it held NaN
        mixed = mixed.masked_fill(real[:, :, None, None] == 0, 0.0)
    if training and dropout_p > 0.0:
        mixed = F.dropout(mixed, p=dropout_p, training=True)
    return F.linear(mixed.reshape(batch, seq_len, dim), weights.out_weight, weights.out_bias)


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

    Same definition as :func:`primal_attention.ops.primal.reference.ksvd_objective`; lam is the effective Λ
    (H, s), we / wr the learned parameters. Always computed in float32 (or float64 if the cache is),
    autocast off. Returns a scalar for reduction="batch" and (B,) for "sample".
    """
    if cache.inputs is not None and cache.features is None and cache.gram is None:
        raise ValueError("ksvd_objective: this cache comes from an inference forward (no gradients) and kept no "
                         "features; recompute them with materialize_features(cache, weights) (the layer's "
                         "ksvd_objective does)")
    features, proj, token_weight, gram, seq_len = cache[:5]
    with torch.autocast(device_type=proj.device.type, enabled=False):
        if gram is None:
            compute_dtype = torch.promote_types(features.dtype, torch.float32)
            batch, seq_len, _ = features.shape
            heads = lam.shape[0]
            d = proj.shape[-2]
            f = features.to(compute_dtype).view(batch, seq_len, 2, heads, d)
            fw = f if token_weight is None else f * token_weight.to(compute_dtype)[:, :, None, None, None]
            gram = torch.einsum("bnghc,bnghe->bghce", fw, f)  # (B, 2, H, d, d)
        else:
            compute_dtype = gram.dtype
            batch = gram.shape[0]
        heads, s = lam.shape
        p = proj.to(compute_dtype)
        quad = (p * (gram @ p)).sum(dim=-2)  # (B, 2, H, s): Σ_i (w_sᵀ f_i)²
        lam = lam.to(compute_dtype)
        if token_weight is None:
            count = torch.full((batch,), float(seq_len), dtype=compute_dtype, device=proj.device)
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
