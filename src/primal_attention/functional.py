"""Fast kernels of Primal-Attention and its KSVD objective.

The math is :mod:`primal_attention.reference`; this module computes the same numbers with fewer
passes over memory (docs/method.md §4, efficiency note):

* The score tensors e, r (B, H, N, s) are never formed. Per sample and head the map
  ``q̂ ↦ e ↦ mix ↦ out_proj`` is linear, so it folds into one (2D, D) matrix ``A`` per sample
  (static for causal layers) and the layer after the q/k projection is one matmul ``[q̂ | k̂] @ A``.
* The KSVD terms need only the (d, d) Gram matrices of q̂ and k̂ per head:
  ``Σ_i ‖λ ⊙ e_i‖² = Σ_s λ_s² w_sᵀ (Σ_i q̂_i q̂_iᵀ) w_s``.
* For long sequences (the folded path) everything that touches N rows — q/k projection, the
  normalisation, the Gram matrices and the folded matmul — runs in one :class:`torch.autograd.Function`
  (:class:`_FoldedPrimal`) with a hand-written backward. It walks the rows in chunks of about
  :data:`CHUNK_ROWS` so that each chunk's intermediates stay in cache instead of making a dozen
  passes over (B, N, 2D) tensors in main memory, keeps only ``[q̂ | k̂]`` and the inverse norms for
  backward, and returns the Gram matrices as a small second output, so the KSVD gradient arrives in
  the same backward. Under autocast the matmuls run in the autocast dtype and the Gram matrices are
  accumulated in float32.
* On CUDA, with Triton installed, the same row loop runs as two Triton kernels
  (:mod:`primal_attention.kernels.triton_folded`; ``PRIMAL_ATTENTION_KERNEL`` chooses).
* Short sequences (N < 16·D, e.g. UEA) and active dropout keep the per-head path
  (:func:`mix_and_project`), where folding ``out_proj`` costs more than it saves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from primal_attention.kernels import kernel_choice
from primal_attention.reference import EPS, PrimalWeights, uniform_sample_index

#: rows per chunk of the folded path: 2048 rows of [q̂ | k̂] at D 64 are 1 MiB in float32, so a
#: chunk's temporaries fit the 2 MiB L2 cache of the machine this was tuned on (measured in
#: ``primal bench``; 1024–4096 are within noise of each other, unchunked is slower).
CHUNK_ROWS = 2048


def _features_into(f2: Tensor, x2: Tensor, wqk_t: Tensor | None, bqk: Tensor | None, inv: Tensor, d: int,
                   eps: float) -> None:
    """The cosine features [q̂ | k̂] of rows ``x2`` (rows, D) into ``f2`` (rows, groups·d): the projection
    (or ``x2`` itself when it already is the projection), then each d-wide group over its norm; ``inv``
    (rows, groups) receives the reciprocal norms."""
    if wqk_t is None:
        f2.copy_(x2)
    elif bqk is None:
        torch.mm(x2, wqk_t, out=f2)
    else:
        torch.addmm(bqk, x2, wqk_t, out=f2)
    fg = f2.view(f2.shape[0], -1, d)
    torch.linalg.vector_norm(fg, dim=-1, out=inv)
    inv.clamp_min_(eps).reciprocal_()
    fg.mul_(inv[:, :, None])


def _write_rows(o2: Tensor, f2: Tensor, fold: Tensor, b0: int, b1: int, shared: bool, width: int,
                bias: Tensor | None, cbias: Tensor | None, obias: Tensor | None, real: Tensor | None) -> None:
    """Output rows of samples b0..b1 into ``o2`` (rows, out): the features ``f2`` (rows, width) times the
    folded per-sample maps (one shared map, or one per sample), plus the bias; with a padding mask
    (``real``: (rows, 1), 1 = real token) padding rows keep only the output projection's bias."""
    nb, out_dim = b1 - b0, o2.shape[-1]
    if shared or nb == 1:
        a2 = fold[0] if shared else fold[b0]
        if bias is not None:
            torch.addmm(bias, f2, a2, out=o2)
        else:
            torch.mm(f2, a2, out=o2)
    else:
        oc, fc = o2.view(nb, -1, out_dim), f2.view(nb, -1, width)
        if bias is not None:
            torch.baddbmm(bias, fc, fold[b0:b1], out=oc)
        else:
            torch.bmm(fc, fold[b0:b1], out=oc)
    if real is not None:
        if cbias is not None:
            o2.add_(cbias)
        o2.mul_(real)
        if obias is not None:
            o2.add_(obias)


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


def _norm_eps(dtype: torch.dtype) -> float:
    """F.normalize's eps, raised to the smallest normal number of dtype: in float16 ``1e-12`` is 0,
    so an all-zero row (the prefix mean of leading padding) would give 0/0 = NaN. Equal to
    :data:`EPS` in float32, float64 and bfloat16."""
    return max(EPS, torch.finfo(dtype).tiny)


def valid_sample_index(mask: Tensor, num_samples: int) -> Tensor:
    """Vectorised :func:`primal_attention.reference.valid_sample_index`: (B, n) int64."""
    count = mask.sum(dim=1)  # (B,)
    # Stable sort of "is padding" puts each sample's real positions first, in order.
    order = torch.argsort((~mask).to(torch.uint8), dim=1, stable=True)
    rank = torch.zeros(mask.shape[0], num_samples, dtype=torch.int64, device=mask.device)
    for length in count.unique().tolist():  # one integer linspace per distinct length
        if length > 0:
            rank[count == length] = uniform_sample_index(length, num_samples, mask.device)
    index = order.gather(1, rank)
    return torch.where(count[:, None] > 0, index, torch.zeros_like(index))


def _causal_prefix_mean(qk: Tensor, real: Tensor | None) -> Tensor:
    """Mean over real tokens up to each position: qk (B, N, C), real (B, N) float or None."""
    seq_len = qk.shape[1]
    # Sums in float32 at least: under fp16 autocast a cumsum over 20 000 tokens overflows 65 504.
    acc = torch.promote_types(qk.dtype, torch.float32)
    if real is None:
        count = torch.arange(1, seq_len + 1, device=qk.device, dtype=acc)[None, :, None]
        return (torch.cumsum(qk.to(acc), dim=1) / count).to(qk.dtype)
    w = real[:, :, None].to(acc)
    return (torch.cumsum(qk.to(acc) * w, dim=1) / torch.cumsum(w, dim=1).clamp_min(1.0)).to(qk.dtype)


def _chunks(batch: int, seq_len: int, rows: int) -> list[tuple[int, int, int, int]]:
    """(b0, b1, r0, r1) blocks covering (B, N): whole samples grouped up to ``rows`` rows, or row
    ranges of one sample. Each block's view ``t[b0:b1, r0:r1]`` of a contiguous (B, N, C) tensor is
    itself contiguous, so every matmul in the loop writes straight into its slice."""
    if seq_len >= rows:
        return [(b, b + 1, r, min(r + rows, seq_len)) for b in range(batch) for r in range(0, seq_len, rows)]
    per = max(1, rows // seq_len)
    return [(b, min(b + per, batch), 0, seq_len) for b in range(0, batch, per)]


def _gram_into(gram_b: Tensor, f: Tensor, fw: Tensor, groups: int) -> None:
    """gram_b (G, d, d) += Σ_i f_{i,g}ᵀ fw_{i,g} for rows f, fw: (R, G·d), one batched GEMM over groups."""
    rows = f.shape[0]
    fg = f.view(rows, groups, -1)
    fwg = fw.view(rows, groups, -1)
    gram_b.baddbmm_(fg.permute(1, 2, 0), fwg.permute(1, 0, 2))


class _FoldedPrimal(torch.autograd.Function):
    """The rows-sized part of the folded layer, with a hand-written backward.

    Forward, per chunk of rows (docs/method.md §2 steps 1, 2, 4, 5 and §4 efficiency note):
        qk = x W_qkᵀ + b_qk                              (skipped when wqk is None: x is qk)
        f = qk / max(‖qk‖_group, eps)                    per group of d channels (F.normalize)
        gram[b, g] += Σ_i w_i f_{i,g} f_{i,g}ᵀ           (only when need_gram)
        out = (f A_b + c) ⊙ real + o                     (without a mask: f A_b + c + o)

    Backward, per chunk, from grad_out and grad_gram (S = grad_gram + grad_gramᵀ):
        gm = grad_out ⊙ real;  dA_b += fᵀ gm;  dc += Σ gm;  do += Σ grad_out
        df = gm A_bᵀ + w ⊙ (f_g S_g)
        dqk = (df − f (f·df)·[‖qk‖ > eps]) / max(‖qk‖, eps)
        dx = dqk W_qk;  dW_qk += dqkᵀ x;  db_qk += Σ dqk

    Saved for backward: x, f (B, N, C) and 1/max(‖qk‖, eps) (B, N, G); nothing else of size N.
    A chunk is one sample's row range (2-D matmuls) or a group of whole short samples (batched).
    """

    @staticmethod
    def forward(
        ctx: Any,
        x: Tensor,
        wqk: Tensor | None,
        bqk: Tensor | None,
        fold: Tensor,
        cbias: Tensor | None,
        obias: Tensor | None,
        real: Tensor | None,
        token_weight: Tensor | None,
        groups: int,
        need_gram: bool,
        chunk_rows: int,
    ) -> tuple[Tensor, Tensor]:
        batch, seq_len, _ = x.shape
        width, out_dim = fold.shape[1], fold.shape[2]
        d = width // groups
        dtype = fold.dtype
        gram_dtype = torch.promote_types(dtype, torch.float32)
        shared = fold.shape[0] == 1
        f = torch.empty(batch, seq_len, width, dtype=dtype, device=x.device)
        rn = torch.empty(batch, seq_len, groups, dtype=dtype, device=x.device)
        out = torch.empty(batch, seq_len, out_dim, dtype=dtype, device=x.device)
        gram = torch.zeros(batch, groups, d, d, dtype=gram_dtype, device=x.device) if need_gram else None
        bias = None
        if real is None:
            bias = cbias if obias is None else (obias if cbias is None else cbias + obias)
        wqk_t = None if wqk is None else wqk.t()
        for b0, b1, r0, r1 in _chunks(batch, seq_len, chunk_rows):
            rows = (b1 - b0) * (r1 - r0)
            f2 = f[b0:b1, r0:r1].view(rows, width)
            x2 = x[b0:b1, r0:r1].reshape(rows, -1)
            _features_into(f2, x2, wqk_t, bqk, rn[b0:b1, r0:r1].view(rows, groups), d, _norm_eps(dtype))

            if gram is not None:
                fgram = f2 if gram_dtype == dtype else f2.to(gram_dtype)
                fw = fgram
                if token_weight is not None:
                    fw = fgram * token_weight[b0:b1, r0:r1].reshape(rows, 1).to(gram_dtype)
                step = r1 - r0
                for i, b in enumerate(range(b0, b1)):
                    sl = slice(i * step, (i + 1) * step)
                    _gram_into(gram[b], fgram[sl], fw[sl], groups)

            _write_rows(out[b0:b1, r0:r1].view(rows, out_dim), f2, fold, b0, b1, shared, width, bias, cbias, obias,
                        None if real is None else real[b0:b1, r0:r1].reshape(rows, 1))

        ctx.save_for_backward(x, wqk, fold, f, rn, real, token_weight)
        ctx.flags = (bqk is not None, cbias is not None, obias is not None, groups, chunk_rows)
        if gram is None:
            ctx.mark_non_differentiable(f)
            return out, f  # no Gram: the caller keeps the features for a later KSVD objective
        return out, gram

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor | None, grad_gram: Tensor | None):
        if torch.is_grad_enabled():
            raise RuntimeError(
                "PrimalAttention: the folded fast path (N >= 16·D) has no double backward; for gradients of "
                "gradients use impl='reference' (or a shorter sequence, which takes the per-head path)"
            )
        x, wqk, fold, f, rn, real, token_weight = ctx.saved_tensors
        has_bqk, has_c, has_o, groups, chunk_rows = ctx.flags
        need = ctx.needs_input_grad
        batch, seq_len, width = f.shape
        out_dim = fold.shape[2]
        d = width // groups
        dtype = f.dtype
        shared = fold.shape[0] == 1
        if grad_out is None:
            grad_out = torch.zeros(batch, seq_len, out_dim, dtype=dtype, device=f.device)
        grad_out = grad_out.to(dtype).contiguous()
        sym = None if grad_gram is None else (grad_gram + grad_gram.transpose(-1, -2)).to(dtype)  # (B, G, d, d)

        dx = torch.empty_like(x) if need[0] else None
        dwqk = torch.zeros_like(wqk) if (wqk is not None and need[1]) else None
        dbqk = torch.zeros(width, dtype=dtype, device=f.device) if (has_bqk and need[2]) else None
        dfold = torch.zeros_like(fold) if need[3] else None
        dc = torch.zeros(out_dim, dtype=dtype, device=f.device) if (has_c and need[4]) else None
        do = torch.zeros(out_dim, dtype=dtype, device=f.device) if (has_o and need[5]) else None
        want_df = need[0] or need[1] or need[2]

        for b0, b1, r0, r1 in _chunks(batch, seq_len, chunk_rows):
            nb, rows, step = b1 - b0, (b1 - b0) * (r1 - r0), r1 - r0
            f2 = f[b0:b1, r0:r1].view(rows, width)
            g2 = grad_out[b0:b1, r0:r1].view(rows, out_dim)
            if do is not None:
                do.add_(g2.sum(dim=0))
            gm = g2 if real is None else g2 * real[b0:b1, r0:r1].reshape(rows, 1)
            if dc is not None:
                dc.add_(gm.sum(dim=0))
            one = shared or nb == 1
            if dfold is not None:
                if one:
                    dfold[0 if shared else b0].addmm_(f2.t(), gm)
                else:
                    dfold[b0:b1].baddbmm_(f2.view(nb, step, width).transpose(1, 2), gm.view(nb, step, out_dim))
            if not want_df:
                continue
            if one:
                df = gm @ (fold[0] if shared else fold[b0]).t()
            else:
                df = torch.bmm(gm.view(nb, step, out_dim), fold[b0:b1].transpose(1, 2)).view(rows, width)
            if sym is not None:
                fw = f2 if token_weight is None else f2 * token_weight[b0:b1, r0:r1].reshape(rows, 1).to(dtype)
                for i, b in enumerate(range(b0, b1)):
                    sl = slice(i * step, (i + 1) * step)
                    term = torch.bmm(fw[sl].view(step, groups, d).transpose(0, 1), sym[b])  # (G, step, d)
                    df[sl].view(step, groups, d).add_(term.transpose(0, 1))
            inv = rn[b0:b1, r0:r1].view(rows, groups)
            fg = f2.view(rows, groups, d)
            dfg = df.view(rows, groups, d)
            # ‖qk‖ ≤ eps: F.normalize divides by the constant eps there, the projection term drops.
            coef = (fg * dfg).sum(dim=-1).mul_(inv).mul_(inv < 1.0 / _norm_eps(dtype))
            dfg.mul_(inv[:, :, None]).sub_(fg * coef[:, :, None])
            if dx is not None:
                xr = dx[b0:b1, r0:r1].view(rows, -1)
                if wqk is None:
                    xr.copy_(df)
                else:
                    torch.mm(df, wqk, out=xr)
            if dwqk is not None:
                dwqk.addmm_(df.t(), x[b0:b1, r0:r1].reshape(rows, -1))
            if dbqk is not None:
                dbqk.add_(df.sum(dim=0))
        return dx, dwqk, dbqk, dfold, dc, do, None, None, None, None, None


def _folded_infer(x: Tensor, wqk: Tensor | None, bqk: Tensor | None, fold: Tensor, cbias: Tensor | None,
                  obias: Tensor | None, real: Tensor | None, groups: int, chunk_rows: int) -> Tensor:
    """The forward of :class:`_FoldedPrimal` for inference: the same chunks and operations, but
    ``[q̂ | k̂]`` and the inverse norms live in one chunk-sized scratch buffer (nothing of size N
    besides the output is written), no Gram matrices, nothing saved, no autograd node."""
    batch, seq_len, _ = x.shape
    width, out_dim = fold.shape[1], fold.shape[2]
    d = width // groups
    dtype = fold.dtype
    shared = fold.shape[0] == 1
    out = torch.empty(batch, seq_len, out_dim, dtype=dtype, device=x.device)
    chunks = _chunks(batch, seq_len, chunk_rows)
    most = max((b1 - b0) * (r1 - r0) for b0, b1, r0, r1 in chunks)
    f_buf = torch.empty(most, width, dtype=dtype, device=x.device)
    inv_buf = torch.empty(most, groups, dtype=dtype, device=x.device)
    bias = None
    if real is None:
        bias = cbias if obias is None else (obias if cbias is None else cbias + obias)
    wqk_t = None if wqk is None else wqk.t()
    eps = _norm_eps(dtype)
    for b0, b1, r0, r1 in chunks:
        rows = (b1 - b0) * (r1 - r0)
        f2 = f_buf[:rows]
        x2 = x[b0:b1, r0:r1].reshape(rows, -1)
        _features_into(f2, x2, wqk_t, bqk, inv_buf[:rows], d, eps)
        _write_rows(out[b0:b1, r0:r1].view(rows, out_dim), f2, fold, b0, b1, shared, width, bias, cbias, obias,
                    None if real is None else real[b0:b1, r0:r1].reshape(rows, 1))
    return out


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
            qk_weight = torch.cat([weights.q_weight, weights.k_weight], dim=0).to(dtype)
            qk_bias = None if weights.q_bias is None else torch.cat([weights.q_bias, weights.k_bias], dim=0).to(dtype)
            qk = F.linear(source.to(dtype), qk_weight, qk_bias)
        width = qk.shape[-1]
        features = F.normalize(qk.reshape(batch, seq_len, 2 * heads, width // (2 * heads)), p=2.0, dim=-1,
                               eps=_norm_eps(dtype))
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

    Returns:
        out (B, N, D) and the :class:`PrimalCache` for the KSVD objective.
    """
    batch, seq_len, dim = x.shape
    d = dim // heads
    real = None if mask is None else mask.to(x.dtype)
    token_weight = real if (real is not None and sampling == "valid") else None

    qk_weight = torch.cat([weights.q_weight, weights.k_weight], dim=0)
    qk_bias = None if weights.q_bias is None else torch.cat([weights.q_bias, weights.k_bias], dim=0)

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

    if fold_out is None:
        fold_out = seq_len >= 16 * dim
    fold_out = fold_out and not (training and dropout_p > 0.0)
    if fold_out:
        return _folded(x, weights, proj, qk_weight, qk_bias, heads=heads, causal=causal, real=real,
                       token_weight=token_weight, chunk_rows=chunk_rows or CHUNK_ROWS, qk_transform=qk_transform)

    qk = F.linear(x, qk_weight, qk_bias)  # (B, N, 2D)
    if qk_transform is not None:
        qk = qk_transform(qk)
    if causal:
        qk = _causal_prefix_mean(qk, real)
    features = F.normalize(qk.view(batch, seq_len, 2 * heads, d), p=2.0, dim=-1, eps=_norm_eps(qk.dtype))
    features = features.view(batch, seq_len, 2 * dim)
    out = mix_and_project(features, proj, weights, heads=heads, real=real, dropout_p=dropout_p, training=training)
    return out, PrimalCache(features, proj, token_weight, None, seq_len)


def _fold_matrix(proj: Tensor, weights: PrimalWeights, heads: int) -> Tensor:
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
) -> tuple[Tensor, PrimalCache]:
    dim = x.shape[-1]
    d = dim // heads
    fold = _fold_matrix(proj, weights, heads)
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
            inp = _causal_prefix_mean(inp, real)
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
    triton = fold.dtype != torch.float64 and kernel_choice(x.device) == "triton"
    if not need_gram and not triton:
        # Inference: only what the output needs; the KSVD features are recomputed on demand.
        with torch.autocast(x.device.type, enabled=False):
            out = _folded_infer(inp, wqk, bqk, fold, cbias, obias, real, 2 * heads, chunk_rows)
        # What the features are recomputed from: x (the q/k projection follows), or, where the
        # projection already left the row loop (causal prefix mean, qk_transform), [q | k] itself.
        inputs = (x, None, False, heads, fold.dtype) if wqk is not None else (inp, None, True, heads, fold.dtype)
        return out, PrimalCache(None, proj, token_weight, None, x.shape[1], inputs)
    with torch.autocast(x.device.type, enabled=False):
        if triton:  # the kernels compute in float32
            from primal_attention.kernels.triton_folded import TritonFoldedPrimal

            out, second = TritonFoldedPrimal.apply(*args, _norm_eps(fold.dtype))
        else:
            out, second = _FoldedPrimal.apply(*args)
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
    sequences take the folded path (:class:`_FoldedPrimal`).
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
    if real is not None:
        mixed = mixed * real[:, :, None, None]
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

    Same definition as :func:`primal_attention.reference.ksvd_objective`; lam is the effective Λ
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
