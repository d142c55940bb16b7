"""Reformer LSH attention (Kitaev et al., ICLR 2020), shared-QK, chunked inside sorted buckets.

Per head, queries and keys share one projection (keys are the unit-normalised queries,
k_j = q_j/‖q_j‖), logits q_i·k_j/√d_h. Each of ``n_hashes`` rounds:

1. hash every token with a random rotation R ∈ R^{d_h×b/2}: bucket = argmax([qR ; −qR]), b buckets;
2. sort the tokens by (bucket, position) and cut the sorted order into chunks of C tokens;
3. each query attends to the keys of its own chunk and of the chunk before it ("look one back");
   attention to itself is allowed only when nothing else is (its logit is −5·10⁴, as in the
   Reformer code), padding keys and — when causal — later positions are masked.

The rounds are merged with weights softmax_r(logsumexp of round r's logits), i.e. as one softmax
over the union of attended keys (a key met in several rounds counts several times, as in trax and
HF). With a single chunk covering the whole sequence this is exact shared-QK softmax attention
without self-attention.

Settings (Table 3 / the LRA code behind it, which wraps HF's ``LSHSelfAttention``): 2 hashes, chunk
length C = 64 (HF's ``lsh_attn_chunk_length``) and ≈ 2N/C buckets, i.e. about ``bucket_size`` = 32
tokens per bucket; here b = 2·⌈N'/(2·bucket_size)⌉ (even, at least 2) for the padded length N', HF
rounds it to a power of two. Sequences are padded at the end to a multiple of C; padding tokens are
hashed to an extra bucket that sorts after all real ones, so they take no place among real tokens
and their content cannot change any real token's output. Rotations are drawn afresh on every forward
pass from torch's global generator, as in the paper (seed torch for a reproducible pass).
The core runs in float32 under autocast. ``dropout`` acts on the attention weights inside chunks.

Causal: keys after the query are masked, so no later token's value is read; but which earlier keys
share a chunk with a query depends on the buckets — hence the content — of later tokens too (as in
trax, HF and lucidrains), so the output at t is not a function of tokens ≤ t alone. Keep that in
mind for language-model comparisons; linear attention and Performer are strictly causal.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from primal_attention.layers.registry import register_attention
from primal_attention.baselines._base import BaselineAttention, float32_core, upcast

__all__ = ["ReformerAttention", "lsh_attention", "lsh_buckets"]

#: logit of attention to oneself: below any real logit, above every masked one.
SELF_LOGIT = -5e4


def lsh_buckets(qk: Tensor, rotations: Tensor, real: Tensor) -> Tensor:
    """Angular LSH buckets.

    Args:
        qk: (B, H, N, d); rotations: (d, n_hashes, b/2); real: (B, N) bool, True = real token.

    Returns: (B, H, n_hashes, N) int64 in [0, b); padding tokens get bucket b.
    """
    rotated = torch.einsum("bhnd,dri->bhrni", qk, rotations)
    buckets = torch.cat([rotated, -rotated], dim=-1).argmax(-1)
    n_buckets = 2 * rotations.shape[-1]
    return buckets.masked_fill(~real[:, None, None, :], n_buckets)


def lsh_attention(
    qk: Tensor,
    v: Tensor,
    rotations: Tensor,
    *,
    key_mask: Tensor | None = None,
    chunk_size: int = 64,
    causal: bool = False,
    dropout: float = 0.0,
    training: bool = False,
) -> Tensor:
    """Shared-QK LSH attention.

    Args:
        qk: (B, H, N, d) shared queries/keys (unnormalised); v: (B, H, N, d_v).
        rotations: (d, n_hashes, b/2) random rotations, b even.
        key_mask: (B, N) bool, True = real token.
        chunk_size: C, tokens per chunk of the sorted order.
        causal: mask keys at later positions.
        dropout, training: dropout on the attention weights.

    Returns: (B, H, N, d_v).
    """
    b, h, n, d = qk.shape
    d_v = v.shape[-1]
    n_hashes = rotations.shape[1]
    n_buckets = 2 * rotations.shape[2]
    real = torch.ones(b, n, dtype=torch.bool, device=qk.device) if key_mask is None else key_mask
    pad = (-n) % chunk_size
    if pad:
        qk, v = F.pad(qk, (0, 0, 0, pad)), F.pad(v, (0, 0, 0, pad))
        real = F.pad(real, (0, pad), value=False)
    n_pad = n + pad

    with torch.no_grad():
        buckets = lsh_buckets(qk, rotations, real)  # (B, H, R, N')
        rounds = torch.arange(n_hashes, device=qk.device)[:, None]
        positions = torch.arange(n_pad, device=qk.device)
        # Unique sort keys: round, then bucket, then position.
        sort_key = ((rounds * (n_buckets + 1) + buckets) * n_pad + positions).flatten(2)
        order = sort_key.argsort(-1)  # sorted slot -> (round, position) element
        undo = torch.empty_like(order).scatter_(-1, order, torch.arange(order.shape[-1], device=qk.device).expand_as(order))
        token = order % n_pad  # (B, H, R*N')

    n_chunks = n_hashes * n_pad // chunk_size
    s_qk = qk.gather(2, token[..., None].expand(-1, -1, -1, d)).view(b, h, n_chunks, chunk_size, d)
    s_v = v.gather(2, token[..., None].expand(-1, -1, -1, d_v)).view(b, h, n_chunks, chunk_size, d_v)
    q_pos = token.view(b, h, n_chunks, chunk_size)
    q_real = real.gather(1, token.flatten(1)).view(b, h, n_chunks, chunk_size)

    def look_one_back(t: Tensor) -> Tensor:
        return torch.cat([t, t.roll(1, dims=2)], dim=3)

    keys = look_one_back(F.normalize(s_qk, dim=-1))
    values = look_one_back(s_v)
    k_pos = look_one_back(q_pos)
    k_real = look_one_back(q_real)

    logits = (s_qk @ keys.transpose(-1, -2)) * d**-0.5  # (B, H, chunks, C, 2C)
    invalid = ~k_real[..., None, :]
    if causal:
        invalid = invalid | (k_pos[..., None, :] > q_pos[..., :, None])
    logits = logits.masked_fill(invalid, torch.finfo(logits.dtype).min)
    logits = logits.masked_fill(k_pos[..., None, :] == q_pos[..., :, None], SELF_LOGIT)
    lse = logits.logsumexp(-1, keepdim=True)
    weights = logits.softmax(-1)
    if dropout > 0:
        weights = F.dropout(weights, dropout, training)
    s_out = (weights @ values).view(b, h, n_hashes * n_pad, d_v)

    out = s_out.gather(2, undo[..., None].expand(-1, -1, -1, d_v)).view(b, h, n_hashes, n_pad, d_v)
    round_lse = lse.view(b, h, n_hashes * n_pad).gather(2, undo).view(b, h, n_hashes, n_pad)
    out = (out * round_lse.softmax(2)[..., None]).sum(2)
    return out[:, :, :n]


@register_attention("reformer")
class ReformerAttention(BaselineAttention):
    """Reformer attention: shared-QK, angular LSH with ``n_hashes`` rounds, chunked buckets.

    Non-causal and causal (masked, not prefix-only: see the module docstring). Shared QK:
    ``q_proj`` is the query-key projection and ``k_proj`` is None.

    Args (beyond :class:`BaselineAttention`):
        bucket_size: average number of tokens per bucket, default 32 (number of buckets
            b = 2·⌈N'/(2·bucket_size)⌉ for the padded length N').
        n_hashes: hashing rounds, default 2 (Table 3).
        chunk_size: tokens per chunk of the sorted order, default 2·bucket_size = 64.
    """

    supports_causal = True
    shared_qk = True
    method = "reformer"

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        bucket_size: int = 32,
        n_hashes: int = 2,
        chunk_size: int | None = None,
        **common: Any,
    ) -> None:
        super().__init__(embed_dim, num_heads, **common)
        chunk_size = 2 * bucket_size if chunk_size is None else chunk_size
        if bucket_size <= 0 or n_hashes <= 0 or chunk_size <= 0:
            raise ValueError(
                "ReformerAttention: bucket_size, n_hashes and chunk_size must be positive, got "
                f"bucket_size={bucket_size}, n_hashes={n_hashes}, chunk_size={chunk_size}"
            )
        self.bucket_size = bucket_size
        self.n_hashes = n_hashes
        self.chunk_size = chunk_size

    def num_buckets(self, seq_len: int) -> int:
        """Number of buckets b used for a sequence of ``seq_len`` tokens."""
        padded = math.ceil(seq_len / self.chunk_size) * self.chunk_size
        return max(2, 2 * math.ceil(padded / (2 * self.bucket_size)))

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        with float32_core(q.device.type):
            q, v = upcast(q, v)
            rotations = torch.randn(
                self.head_dim, self.n_hashes, self.num_buckets(q.shape[2]) // 2, dtype=q.dtype, device=q.device
            )
            return lsh_attention(
                q,
                v,
                rotations,
                key_mask=mask,
                chunk_size=self.chunk_size,
                causal=self.causal,
                dropout=self.dropout,
                training=self.training,
            )

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, bucket_size={self.bucket_size}, n_hashes={self.n_hashes}, "
            f"chunk_size={self.chunk_size}"
        )
