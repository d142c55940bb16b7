"""Triton kernels of the folded primal path: one pass over the rows forward, one backward.

Same contract as :class:`primal_attention.ops.primal.folded.FoldedPrimal` (see its docstring for the
math). Per program (one sample b, a block of BLOCK_N rows):

forward:  f = qk / max(‖qk‖_group, eps);  gram[b] += (w ⊙ f)ᵀ f (block-diagonal part);
          out = (f A_b + c) ⊙ real + o
backward: gm = grad_out ⊙ real;  dA_b += fᵀ gm;  dc += Σ gm;  do += Σ grad_out;
          df = gm A_bᵀ + (w ⊙ f) S_b;  dqk = df / ‖qk‖ − f (f·df) / ‖qk‖   (per group)

The q/k projection before and the input gradients after (dx = dqk W, dW = dqkᵀ x) are cuBLAS
matmuls in PyTorch. Per-group reductions are small matmuls with a 0/1 group-indicator matrix, so
every ``tl.dot`` has sides of at least 16; the dots run in IEEE float32 (no TF32), so results match
the PyTorch path to float32 rounding. Reductions over rows (Gram, dA, dc, do) are atomic adds
into float32 buffers.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

#: rows per program.
BLOCK_N = 64


def _pow2(n: int, least: int = 16) -> int:
    return max(least, triton.next_power_of_2(n))


@triton.jit
def _group_indicator(C: tl.constexpr, D_G: tl.constexpr, CP: tl.constexpr, GP: tl.constexpr):
    rc = tl.arange(0, CP)
    rg = tl.arange(0, GP)
    return (((rc[:, None] // D_G) == rg[None, :]) & (rc[:, None] < C)).to(tl.float32)  # (CP, GP)


@triton.jit
def _fwd_kernel(qk_ptr, fold_ptr, cbias_ptr, obias_ptr, real_ptr, tw_ptr, f_ptr, rn_ptr, out_ptr, gram_ptr,
                N, eps,
                C: tl.constexpr, D_G: tl.constexpr, G: tl.constexpr, DOUT: tl.constexpr,
                CP: tl.constexpr, GP: tl.constexpr, DP: tl.constexpr, BLOCK: tl.constexpr,
                SHARED: tl.constexpr, HAS_C: tl.constexpr, HAS_O: tl.constexpr, HAS_REAL: tl.constexpr,
                HAS_TW: tl.constexpr, NEED_GRAM: tl.constexpr):
    b = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    rc = tl.arange(0, CP)
    ro = tl.arange(0, DP)
    rg = tl.arange(0, GP)
    row_ok = rows < N
    c_ok = rc < C
    o_ok = ro < DOUT
    b64 = b.to(tl.int64)
    rows64 = rows.to(tl.int64)

    qk = tl.load(qk_ptr + b64 * N * C + rows64[:, None] * C + rc[None, :], mask=row_ok[:, None] & c_ok[None, :],
                 other=0.0).to(tl.float32)
    ind = _group_indicator(C, D_G, CP, GP)
    norm = tl.sqrt(tl.dot(qk * qk, ind, input_precision="ieee"))  # (BLOCK, GP)
    inv = 1.0 / tl.maximum(norm, eps)
    f = qk * tl.dot(inv, tl.trans(ind), input_precision="ieee")
    tl.store(f_ptr + b64 * N * C + rows64[:, None] * C + rc[None, :], f.to(f_ptr.dtype.element_ty),
             mask=row_ok[:, None] & c_ok[None, :])
    tl.store(rn_ptr + b64 * N * G + rows64[:, None] * G + rg[None, :], inv, mask=row_ok[:, None] & (rg < G)[None, :])

    if NEED_GRAM:
        fw = f
        if HAS_TW:
            fw = f * tl.load(tw_ptr + b64 * N + rows64, mask=row_ok, other=0.0).to(tl.float32)[:, None]
        part = tl.dot(tl.trans(fw), f, input_precision="ieee")  # (CP, CP)
        block = ((rc[:, None] // D_G) == (rc[None, :] // D_G)) & c_ok[:, None] & c_ok[None, :]
        tl.atomic_add(gram_ptr + b64 * C * C + rc[:, None] * C + rc[None, :], part, mask=block)

    fb = 0 if SHARED else b64
    a = tl.load(fold_ptr + fb * C * DOUT + rc[:, None] * DOUT + ro[None, :], mask=c_ok[:, None] & o_ok[None, :],
                other=0.0).to(tl.float32)
    out = tl.dot(f, a, input_precision="ieee")  # (BLOCK, DP)
    if HAS_C:
        out += tl.load(cbias_ptr + ro, mask=o_ok, other=0.0).to(tl.float32)[None, :]
    if HAS_REAL:
        out = out * tl.load(real_ptr + b64 * N + rows64, mask=row_ok, other=0.0).to(tl.float32)[:, None]
    if HAS_O:
        out += tl.load(obias_ptr + ro, mask=o_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + b64 * N * DOUT + rows64[:, None] * DOUT + ro[None, :], out.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & o_ok[None, :])


@triton.jit
def _bwd_kernel(go_ptr, f_ptr, rn_ptr, fold_ptr, real_ptr, tw_ptr, sym_ptr, dqk_ptr, dfold_ptr, dc_ptr, do_ptr,
                N, inv_limit,
                C: tl.constexpr, D_G: tl.constexpr, G: tl.constexpr, DOUT: tl.constexpr,
                CP: tl.constexpr, GP: tl.constexpr, DP: tl.constexpr, BLOCK: tl.constexpr,
                SHARED: tl.constexpr, HAS_REAL: tl.constexpr, HAS_TW: tl.constexpr, HAS_SYM: tl.constexpr,
                NEED_DFOLD: tl.constexpr, NEED_DC: tl.constexpr, NEED_DO: tl.constexpr, NEED_DQK: tl.constexpr):
    b = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    rc = tl.arange(0, CP)
    ro = tl.arange(0, DP)
    rg = tl.arange(0, GP)
    row_ok = rows < N
    c_ok = rc < C
    o_ok = ro < DOUT
    b64 = b.to(tl.int64)
    rows64 = rows.to(tl.int64)
    fb = 0 if SHARED else b64

    g = tl.load(go_ptr + b64 * N * DOUT + rows64[:, None] * DOUT + ro[None, :], mask=row_ok[:, None] & o_ok[None, :],
                other=0.0).to(tl.float32)
    f = tl.load(f_ptr + b64 * N * C + rows64[:, None] * C + rc[None, :], mask=row_ok[:, None] & c_ok[None, :],
                other=0.0).to(tl.float32)
    if NEED_DO:
        tl.atomic_add(do_ptr + ro, tl.sum(g, axis=0), mask=o_ok)
    gm = g
    if HAS_REAL:
        gm = g * tl.load(real_ptr + b64 * N + rows64, mask=row_ok, other=0.0).to(tl.float32)[:, None]
    if NEED_DC:
        tl.atomic_add(dc_ptr + ro, tl.sum(gm, axis=0), mask=o_ok)
    if NEED_DFOLD:
        tl.atomic_add(dfold_ptr + fb * C * DOUT + rc[:, None] * DOUT + ro[None, :],
                      tl.dot(tl.trans(f), gm, input_precision="ieee"), mask=c_ok[:, None] & o_ok[None, :])
    if NEED_DQK:
        a = tl.load(fold_ptr + fb * C * DOUT + rc[:, None] * DOUT + ro[None, :], mask=c_ok[:, None] & o_ok[None, :],
                    other=0.0).to(tl.float32)
        df = tl.dot(gm, tl.trans(a), input_precision="ieee")  # (BLOCK, CP)
        if HAS_SYM:
            fw = f
            if HAS_TW:
                fw = f * tl.load(tw_ptr + b64 * N + rows64, mask=row_ok, other=0.0).to(tl.float32)[:, None]
            s = tl.load(sym_ptr + b64 * C * C + rc[:, None] * C + rc[None, :], mask=c_ok[:, None] & c_ok[None, :],
                        other=0.0)
            df += tl.dot(fw, s, input_precision="ieee")
        ind = _group_indicator(C, D_G, CP, GP)
        inv = tl.load(rn_ptr + b64 * N * G + rows64[:, None] * G + rg[None, :], mask=row_ok[:, None] & (rg < G)[None, :],
                      other=0.0)
        # ‖qk‖ ≤ eps: F.normalize divides by the constant eps there, the projection term drops.
        coef = tl.dot(f * df, ind, input_precision="ieee") * inv * (inv < inv_limit).to(tl.float32)
        dqk = df * tl.dot(inv, tl.trans(ind), input_precision="ieee") - f * tl.dot(coef, tl.trans(ind), input_precision="ieee")
        tl.store(dqk_ptr + b64 * N * C + rows64[:, None] * C + rc[None, :], dqk.to(dqk_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & c_ok[None, :])


def _sizes(width: int, groups: int, out_dim: int) -> dict[str, int]:
    return dict(C=width, D_G=width // groups, G=groups, DOUT=out_dim, CP=_pow2(width), GP=_pow2(groups),
                DP=_pow2(out_dim), BLOCK=BLOCK_N)


class TritonFoldedPrimal(torch.autograd.Function):
    """:class:`primal_attention.ops.primal.folded.FoldedPrimal` with the row loop in Triton kernels.

    Same arguments (``chunk_rows`` is accepted and ignored: a program's block is :data:`BLOCK_N`
    rows) and outputs: ``(out (B, N, D_out), gram (B, G, d, d))`` when ``need_gram``, else
    ``(out, f)`` with the features for a later KSVD objective.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, wqk: Tensor | None, bqk: Tensor | None, fold: Tensor, cbias: Tensor | None,
                obias: Tensor | None, real: Tensor | None, token_weight: Tensor | None, groups: int, need_gram: bool,
                chunk_rows: int, eps: float) -> tuple[Tensor, Tensor]:
        batch, seq_len, _ = x.shape
        width, out_dim = fold.shape[1], fold.shape[2]
        d = width // groups
        dtype = fold.dtype
        qk = (x if wqk is None else F.linear(x, wqk, bqk)).contiguous()
        fold_c = fold.contiguous()
        f = torch.empty(batch, seq_len, width, dtype=dtype, device=x.device)
        rn = torch.empty(batch, seq_len, groups, dtype=torch.float32, device=x.device)
        out = torch.empty(batch, seq_len, out_dim, dtype=dtype, device=x.device)
        gram = torch.zeros(batch, width, width, dtype=torch.float32, device=x.device) if need_gram else None
        dummy = rn
        grid = (batch, triton.cdiv(seq_len, BLOCK_N))
        _fwd_kernel[grid](
            qk, fold_c, dummy if cbias is None else cbias.contiguous(), dummy if obias is None else obias.contiguous(),
            dummy if real is None else real.contiguous(), dummy if token_weight is None else token_weight.contiguous(),
            f, rn, out, dummy if gram is None else gram, seq_len, eps, **_sizes(width, groups, out_dim),
            SHARED=fold.shape[0] == 1, HAS_C=cbias is not None, HAS_O=obias is not None, HAS_REAL=real is not None,
            HAS_TW=token_weight is not None, NEED_GRAM=need_gram,
        )
        ctx.save_for_backward(x, wqk, fold_c, f, rn, real, token_weight)
        ctx.flags = (bqk is not None, cbias is not None, obias is not None, groups, eps)
        if gram is None:
            ctx.mark_non_differentiable(f)
            return out, f
        blocks = gram.view(batch, groups, d, groups, d).diagonal(dim1=1, dim2=3).permute(0, 3, 1, 2)
        gram_dtype = torch.promote_types(dtype, torch.float32)
        return out, blocks.to(gram_dtype).contiguous()

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor | None, grad_gram: Tensor | None):
        if torch.is_grad_enabled():
            raise RuntimeError("PrimalAttention: the Triton folded path has no double backward; use impl='reference'")
        x, wqk, fold, f, rn, real, token_weight = ctx.saved_tensors
        has_bqk, has_c, has_o, groups, eps = ctx.flags
        need = ctx.needs_input_grad
        batch, seq_len, width = f.shape
        out_dim = fold.shape[2]
        d = width // groups
        dtype = f.dtype
        if grad_out is None:
            grad_out = torch.zeros(batch, seq_len, out_dim, dtype=dtype, device=f.device)
        grad_out = grad_out.contiguous()
        sym = None
        if grad_gram is not None:
            s = (grad_gram + grad_gram.transpose(-1, -2)).float()  # (B, G, d, d)
            sym = torch.zeros(batch, groups, d, groups, d, dtype=torch.float32, device=f.device)
            sym.diagonal(dim1=1, dim2=3).copy_(s.permute(0, 2, 3, 1))
            sym = sym.view(batch, width, width)
        want_dqk = need[0] or need[1] or need[2]
        dqk = torch.empty(batch, seq_len, width, dtype=dtype, device=f.device) if want_dqk else None
        dfold = torch.zeros(fold.shape, dtype=torch.float32, device=f.device) if need[3] else None
        dc = torch.zeros(out_dim, dtype=torch.float32, device=f.device) if (has_c and need[4]) else None
        do = torch.zeros(out_dim, dtype=torch.float32, device=f.device) if (has_o and need[5]) else None
        dummy = rn
        grid = (batch, triton.cdiv(seq_len, BLOCK_N))
        _bwd_kernel[grid](
            grad_out, f, rn, fold, dummy if real is None else real.contiguous(),
            dummy if token_weight is None else token_weight.contiguous(), dummy if sym is None else sym,
            dummy if dqk is None else dqk, dummy if dfold is None else dfold, dummy if dc is None else dc,
            dummy if do is None else do, seq_len, 1.0 / eps, **_sizes(width, groups, out_dim),
            SHARED=fold.shape[0] == 1, HAS_REAL=real is not None, HAS_TW=token_weight is not None,
            HAS_SYM=sym is not None, NEED_DFOLD=dfold is not None, NEED_DC=dc is not None, NEED_DO=do is not None,
            NEED_DQK=want_dqk,
        )
        dx = dwqk = dbqk = None
        if want_dqk:
            flat = dqk.view(-1, width)
            if need[0]:
                dx = dqk if wqk is None else (flat @ wqk).view(x.shape)
            if wqk is not None and need[1]:
                dwqk = flat.t() @ x.reshape(-1, x.shape[-1])
            if has_bqk and need[2]:
                dbqk = flat.sum(dim=0)
        cast = lambda t: None if t is None else t.to(dtype)  # noqa: E731
        return dx, dwqk, dbqk, cast(dfold), cast(dc), cast(do), None, None, None, None, None, None
