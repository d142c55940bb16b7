"""Linear attention (Katharopoulos et al., ICML 2020, "Transformers are RNNs").

Feature map φ(x) = elu(x) + 1 on queries and keys, then

    out_i = φ(q_i)ᵀ Σ_j φ(k_j) v_jᵀ  /  (φ(q_i)ᵀ Σ_j φ(k_j) + eps)

with the sums over all real tokens j (non-causal) or over j ≤ i (causal, by prefix sums). The
O(N²) form it equals, for reference: A_ij = φ(q_i)ᵀφ(k_j) (zero where j is masked, or j > i when
causal), out = (A v) / (A 1 + eps).

The causal form is computed chunk by chunk (the "chunked" form of flash-linear-attention): inside
a chunk of C tokens the masked C×C product, across chunks a running d_h×d_h state, so memory is
O(N·d_h + (N/C)·d_h²) instead of the O(N·d_h²) of materialised prefix sums.

Note: the LRA code that the paper's Table 3 numbers come from (Nyströmformer's) computes
φ(Q)(φ(K)ᵀV) with φ scaled by d_h^(-1/4) and *without* the normaliser; this module follows the
paper, with the normaliser.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from primal_attention.layers.registry import register_attention
from primal_attention.baselines._base import BaselineAttention

__all__ = ["LinearAttention", "linear_attention", "elu_feature_map"]


def elu_feature_map(x: Tensor) -> Tensor:
    """φ(x) = elu(x) + 1, positive everywhere."""
    return F.elu(x) + 1.0


def _exclusive_cumsum(t: Tensor, dim: int) -> Tensor:
    """Prefix sums that leave out the current element: out[c] = Σ_{c' < c} t[c']."""
    c = t.cumsum(dim)
    return torch.cat([torch.zeros_like(c.narrow(dim, 0, 1)), c.narrow(dim, 0, c.shape[dim] - 1)], dim)


def linear_attention(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    eps: float = 1e-6,
    chunk_size: int = 64,
) -> Tensor:
    """Normalised kernel attention with non-negative features.

    Args:
        phi_q: (B, H, N, F) query features; phi_k: (B, H, N, F) key features (rows of padding keys
            already zero); v: (B, H, N, d_v).
        causal: sum over keys j <= i only.
        eps: added to the normaliser.
        chunk_size: chunk length C of the causal form.

    Returns: (B, H, N, d_v).
    """
    if not causal:
        kv = torch.einsum("bhnf,bhnd->bhfd", phi_k, v)
        num = torch.einsum("bhnf,bhfd->bhnd", phi_q, kv)
        den = torch.einsum("bhnf,bhf->bhn", phi_q, phi_k.sum(2))
        return num / (den[..., None] + eps)

    b, h, n, f = phi_q.shape
    d_v = v.shape[-1]
    pad = (-n) % chunk_size
    if pad:
        # Zero features add nothing to any sum; the padded query rows are dropped below.
        phi_q, phi_k, v = (F.pad(t, (0, 0, 0, pad)) for t in (phi_q, phi_k, v))
    n_chunks = (n + pad) // chunk_size
    cq = phi_q.reshape(b, h, n_chunks, chunk_size, f)
    ck = phi_k.reshape(b, h, n_chunks, chunk_size, f)
    cv = v.reshape(b, h, n_chunks, chunk_size, d_v)
    # Across chunks: the state of all earlier chunks.
    state = _exclusive_cumsum(torch.einsum("bhcnf,bhcnd->bhcfd", ck, cv), dim=2)
    z = _exclusive_cumsum(ck.sum(3), dim=2)
    num = torch.einsum("bhcnf,bhcfd->bhcnd", cq, state)
    den = torch.einsum("bhcnf,bhcf->bhcn", cq, z)
    # Inside a chunk: the lower-triangular (diagonal included) block of the O(N²) form.
    tril = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=phi_q.device).tril()
    a = torch.einsum("bhcif,bhcjf->bhcij", cq, ck).masked_fill(~tril, 0.0)
    num = num + a @ cv
    den = den + a.sum(-1)
    out = num / (den[..., None] + eps)
    return out.reshape(b, h, n_chunks * chunk_size, d_v)[:, :, :n]


@register_attention("linear")
class LinearAttention(BaselineAttention):
    """Linear attention with the elu+1 feature map (Katharopoulos et al., 2020).

    Non-causal and causal (prefix sums). Padding keys get zero features, so they are excluded from
    both sums exactly; with right padding the outputs at real tokens equal those of the unpadded
    sequence. ``dropout`` acts on the per-head outputs (the method has no explicit weights).

    Args (beyond :class:`BaselineAttention`):
        eps: added to the normaliser φ(q)ᵀΣφ(k), default 1e-6 as in the authors' code.
    """

    supports_causal = True
    method = "linear"

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        eps: float = 1e-6,
        **common: Any,
    ) -> None:
        super().__init__(embed_dim, num_heads, **common)
        if eps <= 0:
            raise ValueError(f"LinearAttention: eps must be positive, got {eps}")
        self.eps = eps

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)
        if mask is not None:
            phi_k = phi_k.masked_fill(~mask[:, None, :, None], 0.0)
        return self._drop(linear_attention(phi_q, phi_k, v, causal=self.causal, eps=self.eps))
