"""Input checks shared by every attention layer: one clear error instead of a failure deep in torch."""

from __future__ import annotations

import torch
from torch import Tensor


def check_input(
    x: Tensor,
    mask: Tensor | None,
    embed_dim: int,
    *,
    check_finite: bool = False,
    name: str = "attention",
) -> None:
    """Raise a ValueError naming what was expected when x (B, N, D) or mask (B, N) bool is off."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected x to be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 3 or x.shape[-1] != embed_dim:
        raise ValueError(f"{name}: expected x of shape (B, N, {embed_dim}), got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"{name}: expected a floating-point x, got {x.dtype}")
    if x.shape[1] == 0:
        raise ValueError(f"{name}: expected at least one token, got x of shape {tuple(x.shape)}")
    if mask is not None:
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
            raise ValueError(f"{name}: expected mask of dtype torch.bool (True = real token), got {got}")
        if mask.shape != x.shape[:2]:
            raise ValueError(
                f"{name}: expected mask of shape {tuple(x.shape[:2])} (B, N), got {tuple(mask.shape)}"
            )
    if check_finite and not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name}: x contains NaN or Inf")


def resolve_mask(mask: Tensor | None, attn_mask: Tensor | None, name: str) -> Tensor | None:
    """Accept timm's ``attn_mask`` keyword as a (B, N) key-padding mask."""
    if attn_mask is None:
        return mask
    if mask is not None:
        raise ValueError(f"{name}: pass either mask or attn_mask, not both")
    if attn_mask.dim() != 2:
        raise ValueError(
            f"{name}: attn_mask must be a (B, N) bool padding mask (True = real token); "
            f"pairwise (B, H, N, N) masks are not expressible by this layer, got {tuple(attn_mask.shape)}"
        )
    return attn_mask


def check_heads(embed_dim: int, num_heads: int, name: str) -> None:
    """Raise a ValueError unless embed_dim and num_heads are positive and H divides D."""
    if embed_dim <= 0 or num_heads <= 0:
        raise ValueError(f"{name}: embed_dim and num_heads must be positive, got {embed_dim}, {num_heads}")
    if embed_dim % num_heads:
        raise ValueError(f"{name}: num_heads ({num_heads}) must divide embed_dim ({embed_dim})")
