"""O(1) decoding of a causal primal layer: the running sums, one step, the fused step and its plan.

A causal layer's output at position t depends on the prefix only through Σ_{i≤t} [q_i | k_i] over
the real tokens and their count (docs/method.md §3), so decoding keeps a :class:`PrimalState` of
(B, 2D) + (B,) numbers whatever the context length. :func:`prefill` builds it from a prefix,
:func:`step` advances it by one token with the layer's weights, and :func:`fused_step` does the same
in the fewest tensor operations from a :class:`PrimalDecodePlan` (:func:`build_plan`: the weights
concatenated and W_e, W_r, mix and out_proj folded into one (2D, D) matrix, built once per decoding
loop). The module :class:`~primal_attention.layers.primal.PrimalAttention` checks its input and
calls these.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from primal_attention.ops.primal.fused import fold_matrix, mix_and_project
from primal_attention.ops.primal.reference import EPS, PrimalWeights


class PrimalDecodePlan(NamedTuple):
    """The fused decoding step of a causal :class:`~primal_attention.layers.primal.PrimalAttention` (:func:`build_plan`).

    qk_t: (D, 2D) ``[W_q; W_k]ᵀ``; qk_bias: (2D,) or None; fold: (2D, D), the map
    ``[q̂ | k̂] ↦ out_proj(merge(mix([e; r])))`` with the static W_e, W_r folded in; bias: (D,) the mix
    bias through out_proj plus out_proj's bias, or None; groups: 2H; head_dim: d. Constants: built
    under no_grad, so a step with it carries no gradient.
    """

    qk_t: Tensor
    qk_bias: Tensor | None
    fold: Tensor
    bias: Tensor | None
    groups: int
    head_dim: int


def fused_step(plan: PrimalDecodePlan, x: Tensor, total: Tensor, count: Tensor, *, inplace: bool = False,
               residual: Tensor | None = None, qk: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """One unpadded decoding step from a plan, in the fewest tensor operations.

    x: (B, D); total: (B, 2D); count: (B, 1) (a view of the state's (B,) count). Returns
    ``(out (B, D), total', count')``: with ``inplace`` total and count are advanced in place (the
    preallocated state of a decoding session), else new tensors. ``residual`` (B, D) is added to out
    (the block's skip connection, one operation fewer). Features are ``total / max(‖total‖, eps·count)``
    per head, i.e. ``F.normalize`` of the prefix mean without forming it. ``qk`` (B, 2D): x's
    ``[q | k]`` when the caller has it already (a layer that projects q, k and v in one matmul).
    """
    if qk is None:
        qk = torch.mm(x, plan.qk_t) if plan.qk_bias is None else torch.addmm(plan.qk_bias, x, plan.qk_t)
    if inplace:
        total = total.add_(qk)
        count = count.add_(1.0)
    else:
        total = total + qk
        count = count + 1.0
    batch = x.shape[0]
    mean = total.div(count).view(batch, plan.groups, plan.head_dim)
    norm = torch.linalg.vector_norm(mean, dim=-1, keepdim=True).clamp_min_(EPS)
    features = mean.div_(norm).view(batch, -1)
    if residual is not None:
        out = torch.addmm(residual, features, plan.fold)
        if plan.bias is not None:
            out.add_(plan.bias)
    elif plan.bias is not None:
        out = torch.addmm(plan.bias, features, plan.fold)
    else:
        out = torch.mm(features, plan.fold)
    return out, total, count


class PrimalState(NamedTuple):
    """Incremental state of a causal :class:`~primal_attention.layers.primal.PrimalAttention`.

    total: (B, 2D) sum of [q | k] over the real tokens so far; count: (B,) their number. Both in
    float32, or the parameters' dtype if wider (also under autocast). :meth:`~primal_attention.layers.primal.PrimalAttention.step`
    checks that a state is this layer's: a TypeError for anything but a PrimalState, a ValueError
    for another batch size, width, dtype or device.
    """

    total: Tensor
    count: Tensor


def accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """The running sums' dtype: float32, or the parameters' dtype if wider (also under autocast and
    for a bf16 / fp16 layer: in bf16 the count stops at 256)."""
    return torch.promote_types(dtype, torch.float32)


def build_plan(weights: PrimalWeights, heads: int) -> PrimalDecodePlan:
    """The constants of :func:`fused_step` from the current weights (rearranged copies, except the
    output bias without a mix bias, which is the parameter itself), for one decoding loop."""
    with torch.no_grad():
        dim = weights.out_weight.shape[0]
        d = dim // heads
        qk_weight, qk_bias = weights.qk()
        fold = fold_matrix(torch.stack([weights.we, weights.wr])[None], weights, heads)[0].contiguous()
        bias = weights.out_bias
        if weights.mix_bias is not None:
            cb = torch.einsum("e,ohe->o", weights.mix_bias, weights.out_weight.view(dim, heads, d))
            bias = cb if bias is None else cb + bias
        return PrimalDecodePlan(qk_weight.t().contiguous(), qk_bias, fold, bias, 2 * heads, d)


def step(weights: PrimalWeights, heads: int, x_t: Tensor, state: PrimalState, mask_t: Tensor | None = None,
         qk_transform: Callable[[Tensor], Tensor] | None = None) -> tuple[Tensor, PrimalState]:
    """One token with the weights: x_t (B, D), mask_t (B,) bool or None -> (out (B, 1, D), new state).

    A padding step (mask_t False) leaves the state and gives out_proj's bias, as the full forward.
    The sums in the state's dtype; the rest in x_t's compute dtype (the autocast dtype under autocast).
    """
    batch = x_t.shape[0]
    acc = state.total.dtype
    if mask_t is not None:
        x_t = x_t.masked_fill(~mask_t[:, None], 0.0)  # a padding step is never read (NaN included)
    qk_weight, qk_bias = weights.qk()
    qk = F.linear(x_t, qk_weight, qk_bias)  # (B, 2D), in the autocast dtype under autocast
    if qk_transform is not None:
        qk = qk_transform(qk[:, None])[:, 0]
    real = torch.ones(batch, dtype=acc, device=qk.device) if mask_t is None else mask_t.to(acc)
    total = state.total + qk.to(acc) * real[:, None]
    count = state.count + real
    width = qk.shape[-1]
    mean = (total / count.clamp_min(1.0)[:, None]).view(batch, 1, 2 * heads, width // (2 * heads))
    features = F.normalize(mean, p=2.0, dim=-1, eps=EPS).view(batch, 1, width)
    features, real_c = features.to(qk.dtype), real.to(qk.dtype)
    proj = torch.stack([weights.we, weights.wr])[None]
    out = mix_and_project(features, proj, weights, heads=heads, real=real_c[:, None])
    return out, PrimalState(total, count)


def prefill(weights: PrimalWeights, x: Tensor, mask: Tensor | None = None,
            qk_transform: Callable[[Tensor], Tensor] | None = None) -> PrimalState:
    """The state after the whole prefix x (B, N, D): Σ [q | k] over the real tokens (mask (B, N) bool,
    None: all real) and their count."""
    if mask is not None:
        x = x.masked_fill(~mask[:, :, None], 0.0)  # padding is never read (NaN included)
    qk_weight, qk_bias = weights.qk()
    qk = F.linear(x, qk_weight, qk_bias)
    if qk_transform is not None:
        qk = qk_transform(qk)
    return chunk_sums(qk, mask, accumulator_dtype(weights.q_weight.dtype))


def chunk_sums(qk: Tensor, mask: Tensor | None, acc: torch.dtype) -> PrimalState:
    """The state of a chunk from its projections ``[q | k]`` (B, N, 2D): their sum over the real tokens
    (mask (B, N) bool, None: all real) and the count, in the accumulator dtype ``acc``."""
    if mask is None:
        total = qk.to(acc).sum(dim=1)
        return PrimalState(total, torch.full((qk.shape[0],), float(qk.shape[1]), dtype=acc, device=qk.device))
    real = mask.to(acc)
    return PrimalState((qk.to(acc) * real[:, :, None]).sum(dim=1), real.sum(dim=1))
