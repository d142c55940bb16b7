"""What every baseline shares: projections, input checks, head split/merge, padding rows.

A baseline subclasses :class:`BaselineAttention` and implements :meth:`BaselineAttention._attend`,
which maps per-head queries, keys and values ``(B, H, N, d_h)`` to per-head outputs of the same
shape. The base class owns the four projections and does everything around that call, so every
method sees the same inputs and returns rows that follow the same padding rule as the primal layer
(padding rows are zero before ``out_proj``, hence equal to its bias afterwards).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor, nn

from primal_attention.layers.checks import check_heads, check_input, resolve_mask


class BaselineAttention(nn.Module):
    """Multi-head self-attention shell that a baseline fills in.

    Args:
        embed_dim: model width D.
        num_heads: number of heads H; D must be divisible by H (head width d_h = D / H).
        max_seq_len: longest sequence the layer accepts. Required by methods whose parameters
            depend on the length (Linformer); the others only check it when it is given.
        dropout: dropout probability; where it acts is stated by each method.
        bias: whether the q/k/v/out projections have a bias.
        causal: token t may only use tokens <= t. Methods without a causal form raise ValueError.
        check_finite: raise on NaN / Inf input (a device sync per call; off by default).

    Shapes: ``x: (B, N, D)``, ``mask: (B, N)`` bool with True at real tokens, output ``(B, N, D)``.

    Subclasses take their own options as keywords and pass these common ones on (``**common``).
    """

    #: whether the method has a causal form; subclasses that do set this to True.
    supports_causal: ClassVar[bool] = False
    #: short name used in error messages and the registry.
    method: ClassVar[str] = "baseline"
    #: one projection for queries and keys (Reformer); then ``k_proj`` is None.
    shared_qk: ClassVar[bool] = False

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        max_seq_len: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
        causal: bool = False,
        check_finite: bool = False,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        check_heads(embed_dim, num_heads, name)
        if max_seq_len is not None and max_seq_len <= 0:
            raise ValueError(f"{name}: max_seq_len must be positive or None, got {max_seq_len}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"{name}: dropout must be in [0, 1), got {dropout}")
        if causal and not self.supports_causal:
            raise ValueError(
                f"{name}: causal=True is unsupported for {self.method} attention: the method has no causal form"
            )
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.max_seq_len = max_seq_len
        self.dropout = dropout
        self.causal = causal
        self.check_finite = check_finite
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = None if self.shared_qk else nn.Linear(embed_dim, embed_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)

    # -- the part a method implements -------------------------------------------------------
    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """q, k, v: (B, H, N, d_h); mask: (B, N) bool or None -> (B, H, N, d_h)."""
        raise NotImplementedError

    def _project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x: (B, N, D) -> q, k, v each (B, H, N, d_h); k is q when ``shared_qk``."""
        q = self._split(self.q_proj(x))
        k = q if self.k_proj is None else self._split(self.k_proj(x))
        return q, k, self._split(self.v_proj(x))

    # -- shared machinery --------------------------------------------------------------------
    def _drop(self, t: Tensor) -> Tensor:
        return nn.functional.dropout(t, self.dropout, self.training) if self.dropout > 0 else t

    def _split(self, t: Tensor) -> Tensor:
        b, n, _ = t.shape
        return t.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)

    def _check_input(self, x: Tensor, mask: Tensor | None) -> None:
        name = type(self).__name__
        check_input(x, mask, self.embed_dim, check_finite=self.check_finite, name=name)
        if self.max_seq_len is not None and x.shape[1] > self.max_seq_len:
            raise ValueError(
                f"{name}: sequence length {x.shape[1]} exceeds max_seq_len={self.max_seq_len}"
            )

    def forward(self, x: Tensor, mask: Tensor | None = None, *, attn_mask: Tensor | None = None) -> Tensor:
        """x: (B, N, D); mask (or timm's attn_mask): (B, N) bool, True = real token -> (B, N, D)."""
        mask = resolve_mask(mask, attn_mask, type(self).__name__)
        self._check_input(x, mask)
        q, k, v = self._project(x)
        out = self._attend(q, k, v, mask)
        b, _, n, _ = out.shape
        out = out.transpose(1, 2).reshape(b, n, self.embed_dim)
        if mask is not None:
            out = out.masked_fill(~mask[..., None], 0.0)
        # Cores that run in float32 hand back float32; the projection follows x (or autocast).
        return self.out_proj(out.to(x.dtype))

    def extra_repr(self) -> str:
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, max_seq_len={self.max_seq_len}, "
            f"dropout={self.dropout}, causal={self.causal}"
        )


def float32_core(device_type: str) -> torch.autocast:
    """Context in which a core runs with autocast off; pair it with :func:`upcast`.

    Used by the cores that are unstable in half precision (iterative pseudo-inverse, exponential
    random features, hash-sorted log-sum-exp); the LRA code the paper's baselines come from runs
    every attention core in float32 the same way.
    """
    return torch.autocast(device_type, enabled=False)


def upcast(*tensors: Tensor) -> tuple[Tensor, ...]:
    """Half/bfloat16 tensors to float32; float32/float64 unchanged."""
    return tuple(t.float() if t.dtype in (torch.float16, torch.bfloat16) else t for t in tensors)
