"""Nyströmformer (Xiong et al., AAAI 2021): softmax attention through landmark Nyström approximation.

With q, k scaled by d_h^(-1/4) each, m landmarks q̃, k̃ (segment means of the queries and keys)
and S(·) the row softmax,

    out = S(q k̃ᵀ) · pinv(S(q̃ k̃ᵀ)) · S(q̃ kᵀ) · v  +  DConv(v),

where pinv is the iterative Moore–Penrose approximation of the paper (6 iterations of
Z ← ¼ Z (13I − AZ (15I − AZ (7I − AZ))), Razavi et al. 2014) and DConv a depthwise convolution of
the values along the sequence, one kernel per head (kernel 33 in the paper; the authors' LRA config
uses 35 — pass ``conv_kernel_size=35`` for that; ``None`` turns the residual off).

Landmarks: the N tokens are cut into m consecutive segments of ⌈N/m⌉ tokens — when N is not a
multiple of m the sequence is padded at the end with masked tokens, as the reference
implementation (lucidrains' ``nystrom-attention``, which pads at the front) does. A landmark is the
mean over the *real* tokens of its segment; a segment with no real token gives no landmark (its
column is masked in both landmark softmaxes and its row of S(q̃ k̃ᵀ) is set to the identity, which is
exactly the same as leaving it out). The authors' code averages over padding rows too (zeroed, so
they shrink the landmark); a masked mean makes landmarks independent of how much padding a segment
holds. Padding keys are masked in S(q̃ kᵀ) and their values zeroed before the convolution.

Deviations from the authors' code, each a small numerical difference: the pseudo-inverse starts
from Z₀ = Aᵀ / (‖A‖₁‖A‖_∞) computed per matrix, not with one maximum over the whole batch (which
made one sample's output depend on the others in its batch); when N ≤ m (every landmark would be a
single token) exact softmax attention is computed instead, as the authors do when m equals the
sequence length. Table 3 setting: 64 landmarks. The core runs in float32 under autocast (the
pseudo-inverse iteration is not stable in half precision).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from primal_attention.layers.registry import register_attention
from primal_attention.baselines._base import BaselineAttention, float32_core, upcast

__all__ = ["NystromAttention", "iterative_pinv", "nystrom_attention"]


def iterative_pinv(a: Tensor, iterations: int = 6) -> Tensor:
    """Approximate Moore–Penrose inverse of each (m, m) matrix in a (..., m, m) batch."""
    abs_a = a.abs()
    norm = abs_a.sum(-2).amax(-1) * abs_a.sum(-1).amax(-1)
    z = a.transpose(-1, -2) / norm[..., None, None]
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    for _ in range(iterations):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


def nystrom_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    num_landmarks: int,
    key_mask: Tensor | None = None,
    pinv_iterations: int = 6,
) -> Tensor:
    """Nyström approximation of softmax(q kᵀ/√d) v, without the convolution residual.

    Args:
        q, k, v: (B, H, N, d) unscaled queries, keys, values.
        num_landmarks: m; any m >= 1 (m >= N makes every real token its own landmark).
        key_mask: (B, N) bool, True = real token.
        pinv_iterations: iterations of the pseudo-inverse.

    Returns: (B, H, N, d).
    """
    b, h, n, d = q.shape
    m = num_landmarks
    seg = math.ceil(n / m)
    pad = seg * m - n
    real = torch.ones(b, n, dtype=torch.bool, device=q.device) if key_mask is None else key_mask
    if pad:
        q, k, v = (nn.functional.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        real = nn.functional.pad(real, (0, pad), value=False)
    keep = real[:, None, :, None]
    scale = d**-0.25
    q = (q * scale).masked_fill(~keep, 0.0)
    k = (k * scale).masked_fill(~keep, 0.0)
    v = v.masked_fill(~keep, 0.0)

    counts = real.view(b, 1, m, seg).sum(-1).to(q.dtype)  # (B, 1, m)
    q_land = q.view(b, h, m, seg, d).sum(3) / counts.clamp_min(1.0)[..., None]
    k_land = k.view(b, h, m, seg, d).sum(3) / counts.clamp_min(1.0)[..., None]
    has_land = counts > 0  # (B, 1, m)

    neg = torch.finfo(q.dtype).min
    kernel_1 = (q @ k_land.transpose(-1, -2)).masked_fill(~has_land[:, :, None, :], neg).softmax(-1)
    kernel_2 = (q_land @ k_land.transpose(-1, -2)).masked_fill(~has_land[:, :, None, :], neg).softmax(-1)
    eye = torch.eye(m, dtype=q.dtype, device=q.device)
    kernel_2 = torch.where(has_land[..., None], kernel_2, eye)
    kernel_3 = (q_land @ k.transpose(-1, -2)).masked_fill(~real[:, None, None, :], neg).softmax(-1)
    out = (kernel_1 @ iterative_pinv(kernel_2, pinv_iterations)) @ (kernel_3 @ v)
    return out[:, :, :n]


def _masked_softmax_attention(q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None) -> Tensor:
    logits = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if key_mask is not None:
        logits = logits.masked_fill(~key_mask[:, None, None, :], torch.finfo(logits.dtype).min)
        v = v.masked_fill(~key_mask[:, None, :, None], 0.0)
    return logits.softmax(-1) @ v


@register_attention("nystrom")
class NystromAttention(BaselineAttention):
    """Nyströmformer attention: segment-mean landmarks, iterative pseudo-inverse, conv residual.

    Non-causal only. ``dropout`` acts on the per-head outputs.

    Args (beyond :class:`BaselineAttention`):
        num_landmarks: m, default 64 (Table 3).
        pinv_iterations: iterations of the pseudo-inverse, default 6.
        conv_kernel_size: odd kernel length of the depthwise value convolution, default 33
            (paper); ``None`` for no residual.
    """

    method = "nystrom"

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        num_landmarks: int = 64,
        pinv_iterations: int = 6,
        conv_kernel_size: int | None = 33,
        **common: Any,
    ) -> None:
        super().__init__(embed_dim, num_heads, **common)
        if num_landmarks <= 0:
            raise ValueError(f"NystromAttention: num_landmarks must be positive, got {num_landmarks}")
        if pinv_iterations < 0:
            raise ValueError(f"NystromAttention: pinv_iterations must be >= 0, got {pinv_iterations}")
        if conv_kernel_size is not None and (conv_kernel_size <= 0 or conv_kernel_size % 2 == 0):
            raise ValueError(
                f"NystromAttention: conv_kernel_size must be a positive odd integer or None, got {conv_kernel_size}"
            )
        self.num_landmarks = num_landmarks
        self.pinv_iterations = pinv_iterations
        self.conv_kernel_size = conv_kernel_size
        self.conv = (
            nn.Conv2d(
                num_heads,
                num_heads,
                kernel_size=(conv_kernel_size, 1),
                padding=(conv_kernel_size // 2, 0),
                groups=num_heads,
                bias=False,
            )
            if conv_kernel_size is not None
            else None
        )

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        with float32_core(q.device.type):
            q, k, v = upcast(q, k, v)
            if q.shape[2] <= self.num_landmarks:
                out = _masked_softmax_attention(q, k, v, mask)
            else:
                out = nystrom_attention(
                    q, k, v, num_landmarks=self.num_landmarks, key_mask=mask, pinv_iterations=self.pinv_iterations
                )
            if self.conv is not None:
                v_real = v if mask is None else v.masked_fill(~mask[:, None, :, None], 0.0)
                out = out + self.conv(v_real.to(self.conv.weight.dtype)).to(out.dtype)
        return self._drop(out)

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, num_landmarks={self.num_landmarks}, "
            f"pinv_iterations={self.pinv_iterations}, conv_kernel_size={self.conv_kernel_size}"
        )
