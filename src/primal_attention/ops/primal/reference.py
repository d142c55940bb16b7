"""The reference math of Primal-Attention, written straight from docs/method.md §2–§4.

Slow, readable, float64-friendly. Nothing here is optimised: every score is materialised, every
einsum names its axes. The fast path in :mod:`primal_attention.ops.primal.fused` is held to this module by
the tests (outputs and gradients) on random shapes, masks and dtypes.

Notation: B batch, N tokens, D width, H heads, d = D / H, s rank, n sampled tokens.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

EPS = 1e-12  # as F.normalize


def norm_eps(dtype: torch.dtype) -> float:
    """F.normalize's eps, raised to the smallest normal number of dtype: in float16 ``1e-12`` is 0,
    so an all-zero row (the prefix mean of leading padding) would give 0/0 = NaN. Equal to
    :data:`EPS` in float32, float64 and bfloat16."""
    return max(EPS, torch.finfo(dtype).tiny)


class PrimalWeights(NamedTuple):
    """Parameters of one layer, named after the math.

    q_weight, k_weight, out_weight: (D, D); q_bias, k_bias, out_bias: (D,) or None;
    we, wr: (H, n, s) non-causal or (H, d, s) causal; lam: (H, s) (the effective Λ);
    mix_weight: (d, 2s); mix_bias: (d,) or None.
    """

    q_weight: Tensor
    q_bias: Tensor | None
    k_weight: Tensor
    k_bias: Tensor | None
    we: Tensor
    wr: Tensor
    lam: Tensor
    mix_weight: Tensor
    mix_bias: Tensor | None
    out_weight: Tensor
    out_bias: Tensor | None

    def qk(self) -> tuple[Tensor, Tensor | None]:
        """The q and k projections as one: ``[W_q; W_k]`` (2D, D) and ``[b_q; b_k]`` (2D,) or None."""
        weight = torch.cat([self.q_weight, self.k_weight], dim=0)
        return weight, None if self.q_bias is None else torch.cat([self.q_bias, self.k_bias], dim=0)


class PrimalTrace(NamedTuple):
    """Everything the reference forward computes.

    out: (B, N, D); escore, rscore: (B, H, N, s); we_x, wr_x: (B, H, d, s) — the data-dependent
    projections W_{e|X}, W_{r|X} (causal: the static W_e, W_r broadcast over B);
    token_weight: (B, N) — 1 for the tokens that enter the KSVD means, 0 otherwise;
    q_hat, k_hat: (B, H, N, d) — the feature maps Φ_q, Φ_k (causal: of the prefix means).
    """

    out: Tensor
    escore: Tensor
    rscore: Tensor
    we_x: Tensor
    wr_x: Tensor
    token_weight: Tensor
    q_hat: Tensor
    k_hat: Tensor


def uniform_sample_index(seq_len: int, num_samples: int, device: torch.device | None = None) -> Tensor:
    """``linspace(0, N-1, n)`` on integers: (n,) int64. First and last token always included; positions
    repeat when n > N.

    Computed exactly as the authors' code does (``torch.linspace(..., dtype=int)``), so the picks match
    theirs bit for bit (a float32 linspace truncated to int differs for some (N, n), e.g. (106, 96)).
    """
    return torch.linspace(0, seq_len - 1, num_samples, dtype=torch.int64, device=device)


def valid_sample_index(mask: Tensor, num_samples: int) -> Tensor:
    """Per sample, n positions spread over its real tokens: (B, n) int64.

    The picks of sample b are its real tokens at :func:`uniform_sample_index` (L_b, n), L_b its number
    of real tokens, so a full mask picks exactly what ``mask=None`` picks. A fully padded sample picks
    position 0 (its terms are masked anyway).
    """
    picks = []
    for b in range(mask.shape[0]):
        real = torch.nonzero(mask[b], as_tuple=False).flatten()
        if real.numel() == 0:
            picks.append(torch.zeros(num_samples, dtype=torch.long, device=mask.device))
            continue
        picks.append(real[uniform_sample_index(real.numel(), num_samples, mask.device)])
    return torch.stack(picks)


def _linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    y = torch.einsum("...i,oi->...o", x, weight)
    return y if bias is None else y + bias


def _split_heads(t: Tensor, heads: int) -> Tensor:
    """(B, N, D) -> (B, H, N, d), head h owning channels h*d .. (h+1)*d - 1."""
    b, n, dim = t.shape
    return t.reshape(b, n, heads, dim // heads).permute(0, 2, 1, 3)


def _prefix_mean(t: Tensor, weight: Tensor) -> Tensor:
    """Causal mean over the real tokens up to t: (B, H, N, d), weight (B, N)."""
    w = weight[:, None, :, None]
    total = torch.cumsum(t * w, dim=2)
    count = torch.cumsum(w, dim=2).clamp_min(1.0)
    return total / count


def primal_attention(
    x: Tensor,
    weights: PrimalWeights,
    *,
    heads: int,
    causal: bool = False,
    mask: Tensor | None = None,
    sampling: str = "uniform",
) -> PrimalTrace:
    """Reference Primal-Attention forward.

    Args:
        x: (B, N, D) module input.
        weights: the layer's parameters, see :class:`PrimalWeights`.
        heads: H.
        causal: prefix-mean feature map with static W_e, W_r (docs/method.md §3) instead of sampled
            data-dependent projections (§2).
        mask: (B, N) bool, True = real token, or None.
        sampling: "uniform" (authors: positions over all N, padding included in the KSVD means) or
            "valid" (positions over each sample's real tokens, padding out of the KSVD means).
            Causal layers ignore the sampling positions but follow the same rule for the means.
    """
    batch, seq_len, dim = x.shape
    d = dim // heads
    real = torch.ones(batch, seq_len, dtype=x.dtype, device=x.device) if mask is None else mask.to(x.dtype)

    q = _split_heads(_linear(x, weights.q_weight, weights.q_bias), heads)
    k = _split_heads(_linear(x, weights.k_weight, weights.k_bias), heads)

    if causal:
        q = _prefix_mean(q, real)
        k = _prefix_mean(k, real)
        we_x = weights.we.expand(batch, *weights.we.shape)
        wr_x = weights.wr.expand(batch, *weights.wr.shape)
    else:
        n = weights.we.shape[1]
        if sampling == "uniform" or mask is None:
            index = uniform_sample_index(seq_len, n, x.device).expand(batch, n)
        else:
            index = valid_sample_index(mask, n)
        x_sampled = torch.stack([x[b, index[b]] for b in range(batch)])  # (B, n, D)
        x_tilde = x_sampled.reshape(batch, n, heads, d)  # contiguous channel chunks per head
        we_x = torch.einsum("bmhc,hms->bhcs", x_tilde, weights.we)
        wr_x = torch.einsum("bmhc,hms->bhcs", x_tilde, weights.wr)

    q_hat = F.normalize(q, p=2.0, dim=-1, eps=EPS)
    k_hat = F.normalize(k, p=2.0, dim=-1, eps=EPS)
    escore = torch.einsum("bhnc,bhcs->bhns", q_hat, we_x)
    rscore = torch.einsum("bhnc,bhcs->bhns", k_hat, wr_x)

    mixed = _linear(torch.cat([escore, rscore], dim=-1), weights.mix_weight, weights.mix_bias)
    if mask is not None:
        mixed = mixed * real[:, None, :, None]
    merged = mixed.permute(0, 2, 1, 3).reshape(batch, seq_len, dim)
    out = _linear(merged, weights.out_weight, weights.out_bias)

    token_weight = real if (mask is not None and sampling == "valid") else torch.ones_like(real)
    return PrimalTrace(out, escore, rscore, we_x, wr_x, token_weight, q_hat, k_hat)


def ksvd_objective(
    trace: PrimalTrace,
    weights: PrimalWeights,
    *,
    reduction: str = "batch",
    form: str = "authors",
) -> Tensor:
    """Reference KSVD objective J of one layer (docs/method.md §4).

    form="authors" (default, reproduces the published numbers):
        J = ½·mean_{h,i} ‖λ_h ⊙ e_{h,i}‖² + ½·mean_{h,i} ‖λ_h ⊙ r_{h,i}‖² − Tr(mean_h W_e[h]ᵀ W_r[h])
        on the learned parameters W_e, W_r.
    form="paper" (the paper's objective, per head, summed over heads):
        J = Σ_h [½ Σ_i e_iᵀ Λ_h e_i + ½ Σ_j r_jᵀ Λ_h r_j − Tr(W_{e|X}[h]ᵀ W_{r|X}[h])].

    reduction="batch": one scalar; "authors" takes the means over B too, "paper" averages the
    per-sample J over B. reduction="sample": (B,), one J per sample.
    Tokens with token_weight 0 (padding under sampling="valid") are left out of the means / sums;
    a sample without tokens contributes 0 to the score terms.
    """
    lam = weights.lam[None, :, None, :]  # (1, H, 1, s)
    w = trace.token_weight[:, None, :]  # (B, 1, N)
    heads = weights.lam.shape[0]
    if form == "authors":
        e_sq = torch.einsum("bhns->bhn", (lam * trace.escore) ** 2)
        r_sq = torch.einsum("bhns->bhn", (lam * trace.rscore) ** 2)
        tr = torch.einsum("hms,hms->", weights.we, weights.wr) / heads
        if reduction == "batch":
            count = (w.sum() * heads).clamp_min(1.0)
            return 0.5 * (e_sq * w).sum() / count + 0.5 * (r_sq * w).sum() / count - tr
        count = (w.sum(dim=(1, 2)) * heads).clamp_min(1.0)
        return 0.5 * (e_sq * w).sum(dim=(1, 2)) / count + 0.5 * (r_sq * w).sum(dim=(1, 2)) / count - tr
    if form == "paper":
        e_q = torch.einsum("bhns,bhns->bhn", lam * trace.escore, trace.escore)
        r_q = torch.einsum("bhns,bhns->bhn", lam * trace.rscore, trace.rscore)
        tr = torch.einsum("bhcs,bhcs->b", trace.we_x, trace.wr_x)
        per_sample = 0.5 * (e_q * w).sum(dim=(1, 2)) + 0.5 * (r_q * w).sum(dim=(1, 2)) - tr
        return per_sample.mean() if reduction == "batch" else per_sample
    raise ValueError(f"form must be 'authors' or 'paper', got {form!r}")
