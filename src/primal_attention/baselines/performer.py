"""Performer: FAVOR+ positive orthogonal random features (Choromanski et al., ICLR 2021).

Softmax attention uses the kernel exp(q·k/√d_h) = exp(q'·k') with q' = q/d_h^(1/4), k' = k/d_h^(1/4).
FAVOR+ estimates it without bias by positive random features

    φ(x) = exp(W x − ‖x‖²/2) / √m,   W ∈ R^{m×d_h},   E[φ(q')ᵀφ(k')] = exp(q'·k'),

and attention becomes linear attention with these features (see :mod:`.linear`):
out_i = φ(q_i)ᵀ Σ_j φ(k_j) v_jᵀ / φ(q_i)ᵀ Σ_j φ(k_j).

The rows of W are drawn in blocks of d_h mutually orthogonal directions (QR of a Gaussian matrix,
signs fixed so each block is Haar distributed) and rescaled to the norms of independent Gaussian
vectors, which keeps every row marginally N(0, I) — the "orthogonal random features" of the paper,
as the authors' code (``gaussian_orthogonal_random_matrix``, scaling 0) draws them.

Numerical stabilisation: each exponent is shifted by a constant that cancels in the ratio —
per query its own maximum over features; for keys the maximum over all real keys and features
(non-causal, as the authors' code does), or, when causal, the data-independent bound
max_i ‖w_i‖²/2 ≥ w_i·k − ‖k‖²/2, so that no future token can influence an earlier output. Unlike the
authors' code no ε is added to the features (it would not cancel), the normaliser is only kept
away from zero.

The features are a buffer, drawn once at construction (from torch's global generator) and fixed,
so a forward pass is deterministic; :meth:`PerformerAttention.redraw_features` draws new ones (the
paper redraws them periodically during training; call it from the training loop to do so).
Table 3 setting: 256 features. (The LRA code behind the paper's baseline numbers passes
``kernel_type="relu"`` to ``performer_pytorch.FastAttention`` without ``generalized_attention``,
which leaves it on these softmax features.)
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from primal_attention.layers.registry import register_attention
from primal_attention.baselines._base import BaselineAttention, float32_core, upcast
from primal_attention.baselines.linear import linear_attention

__all__ = ["PerformerAttention", "favor_features", "orthogonal_gaussian_features"]


def orthogonal_gaussian_features(
    num_features: int, dim: int, *, generator: torch.Generator | None = None
) -> Tensor:
    """(num_features, dim) float32 on CPU: blocks of orthogonal rows with chi-distributed norms."""
    n_blocks = math.ceil(num_features / dim)
    q, r = torch.linalg.qr(torch.randn(n_blocks, dim, dim, generator=generator))
    # Sign fix (Mezzadri 2007): makes each q Haar distributed, so every row is isotropic.
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)
    directions = q.transpose(-1, -2).reshape(n_blocks * dim, dim)[:num_features]
    norms = torch.randn(num_features, dim, generator=generator).norm(dim=1)
    return directions * norms[:, None]


def favor_features(
    x: Tensor,
    features: Tensor,
    *,
    is_query: bool,
    key_mask: Tensor | None = None,
    causal: bool = False,
) -> Tensor:
    """Positive random features φ(x) of already scaled inputs, with a stabilising shift.

    Args:
        x: (B, H, N, d) = q / d_h^(1/4) or k / d_h^(1/4).
        features: W, (m, d).
        is_query: shift each row by its own maximum (cancels in the ratio); keys are shifted by one
            constant per (batch, head), see the module docstring.
        key_mask: (B, N) bool, True = real; padding keys get zero features and do not affect the shift.
        causal: keys use the data-independent shift.

    Returns: (B, H, N, m).
    """
    logits = x @ features.T - 0.5 * (x * x).sum(-1, keepdim=True)
    if is_query:
        shift = logits.amax(-1, keepdim=True)
    elif causal:
        shift = 0.5 * (features * features).sum(-1).amax()
    else:
        real = logits if key_mask is None else logits.masked_fill(~key_mask[:, None, :, None], -math.inf)
        shift = real.amax((-1, -2), keepdim=True)
        # A sequence with no real token: any finite shift will do, its keys are zeroed below.
        shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
    # exp(logits − shift) / √m, with the 1/√m folded into the exponent (one pass less).
    phi = torch.exp(logits - (shift.detach() + 0.5 * math.log(features.shape[0])))
    if not is_query and key_mask is not None:
        phi = phi.masked_fill(~key_mask[:, None, :, None], 0.0)
    return phi


@register_attention("performer")
class PerformerAttention(BaselineAttention):
    """Performer (FAVOR+) attention with fixed, redrawable orthogonal random features.

    Non-causal and causal (prefix sums). Padding keys get zero features, so they are excluded
    exactly; with right padding the outputs at real tokens equal those of the unpadded sequence.
    ``dropout`` acts on the per-head outputs. The core runs in float32 under autocast.

    Args (beyond :class:`BaselineAttention`):
        num_features: number m of random features, default 256 (Table 3).
    """

    supports_causal = True
    method = "performer"
    features: Tensor

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        num_features: int = 256,
        **common: Any,
    ) -> None:
        super().__init__(embed_dim, num_heads, **common)
        if num_features <= 0:
            raise ValueError(f"PerformerAttention: num_features must be positive, got {num_features}")
        self.num_features = num_features
        self.register_buffer("features", orthogonal_gaussian_features(num_features, self.head_dim))

    @torch.no_grad()
    def redraw_features(self, generator: torch.Generator | None = None) -> None:
        """Draw new random features in place (CPU ``generator``, or torch's global one)."""
        fresh = orthogonal_gaussian_features(self.num_features, self.head_dim, generator=generator)
        self.features.copy_(fresh)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        with float32_core(q.device.type):
            q, k, v = upcast(q, k, v)
            w = self.features.to(q.dtype)
            scale = self.head_dim**-0.25
            phi_q = favor_features(q * scale, w, is_query=True)
            phi_k = favor_features(k * scale, w, is_query=False, key_mask=mask, causal=self.causal)
            # The shifts make φ small but not zero; the normaliser only needs to stay off zero.
            out = linear_attention(phi_q, phi_k, v, causal=self.causal, eps=torch.finfo(q.dtype).tiny)
        return self._drop(out)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, num_features={self.num_features}"
