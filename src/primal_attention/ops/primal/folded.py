"""The folded path's row loop in PyTorch: one pass over the rows forward, one backward.

Everything of the primal layer that touches N rows (the q/k projection, the cosine normalisation,
the Gram matrices of the KSVD term and the per-sample folded map ``[q̂ | k̂] @ A``) runs in one
:class:`torch.autograd.Function` (:class:`FoldedPrimal`) with a hand-written backward, walking the
rows in chunks of about :data:`CHUNK_ROWS` so each chunk's intermediates stay in cache;
:func:`folded_infer` is its forward without autograd for inference. The Triton version of the same
contract is :mod:`primal_attention.ops.primal.triton_folded`; :mod:`primal_attention.ops.primal.fused`
chooses between them (docs/method.md §4, efficiency note).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from primal_attention.ops.primal.reference import norm_eps


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


class FoldedPrimal(torch.autograd.Function):
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
            _features_into(f2, x2, wqk_t, bqk, rn[b0:b1, r0:r1].view(rows, groups), d, norm_eps(dtype))

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
            coef = (fg * dfg).sum(dim=-1).mul_(inv).mul_(inv < 1.0 / norm_eps(dtype))
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


def folded_infer(x: Tensor, wqk: Tensor | None, bqk: Tensor | None, fold: Tensor, cbias: Tensor | None,
                  obias: Tensor | None, real: Tensor | None, groups: int, chunk_rows: int) -> Tensor:
    """The forward of :class:`FoldedPrimal` for inference: the same chunks and operations, but
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
    eps = norm_eps(dtype)
    for b0, b1, r0, r1 in chunks:
        rows = (b1 - b0) * (r1 - r0)
        f2 = f_buf[:rows]
        x2 = x[b0:b1, r0:r1].reshape(rows, -1)
        _features_into(f2, x2, wqk_t, bqk, inv_buf[:rows], d, eps)
        _write_rows(out[b0:b1, r0:r1].view(rows, out_dim), f2, fold, b0, b1, shared, width, bias, cbias, obias,
                    None if real is None else real[b0:b1, r0:r1].reshape(rows, 1))
    return out
