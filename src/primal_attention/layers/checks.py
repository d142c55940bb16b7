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
    dtype: torch.dtype | None = None,
) -> None:
    """Raise a ValueError naming what was expected when x (B, N, D) or mask (B, N) bool is off.

    dtype: the layer's parameter dtype; when given, x must carry it (see :func:`check_dtype`).
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected x to be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 3 or x.shape[-1] != embed_dim:
        raise ValueError(f"{name}: expected x of shape (B, N, {embed_dim}), got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"{name}: expected a floating-point x, got {x.dtype}")
    if dtype is not None:
        check_dtype(x, dtype, name)
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


#: the Tensor / Module method that converts to each dtype, for the hint of :func:`check_dtype`.
_CONVERT = {torch.float64: "double()", torch.float32: "float()", torch.float16: "half()", torch.bfloat16: "bfloat16()"}


def _autocast_on(device_type: str) -> bool:
    try:
        return torch.is_autocast_enabled(device_type)
    except RuntimeError:  # a device type autocast does not know (e.g. meta): no autocast there
        return False


def check_dtype(x: Tensor, dtype: torch.dtype, name: str, arg: str = "x") -> None:
    """Raise a ValueError unless x has the parameters' dtype; autocast (x's device) allows any mix.

    Without it torch fails deep inside a matmul with "expected scalar type Float but found Double".
    """
    if x.dtype == dtype or _autocast_on(x.device.type):
        return
    to_x = _CONVERT.get(x.dtype, f"to({x.dtype})")
    to_param = _CONVERT.get(dtype, f"to({dtype})")
    raise ValueError(f"{name}: expected {arg} of dtype {dtype} (the layer's parameters), got {x.dtype}; "
                     f"convert with layer.{to_x} or {arg}.{to_param}")


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


def check_segments(segments: Tensor, x: Tensor, causal: bool, name: str) -> None:
    """One-line errors for document ids of packed rows: (B, N) integers on x's device, a causal layer."""
    if not causal:
        raise ValueError(f"{name}: segments (packed documents) need a causal layer")
    if not isinstance(segments, Tensor) or segments.shape != x.shape[:2] or segments.dtype.is_floating_point \
            or segments.dtype == torch.bool:
        got = f"{tuple(segments.shape)} {segments.dtype}" if isinstance(segments, Tensor) else type(segments).__name__
        raise ValueError(f"{name}: expected segments of integer document ids ({x.shape[0]}, {x.shape[1]}), got {got}")
    if segments.device != x.device:
        raise ValueError(f"{name}: segments are on {segments.device}, x on {x.device}")


def check_heads(embed_dim: int, num_heads: int, name: str) -> None:
    """Raise a ValueError unless embed_dim and num_heads are positive and H divides D."""
    if embed_dim <= 0 or num_heads <= 0:
        raise ValueError(f"{name}: embed_dim and num_heads must be positive, got {embed_dim}, {num_heads}")
    if embed_dim % num_heads:
        raise ValueError(f"{name}: num_heads ({num_heads}) must divide embed_dim ({embed_dim})")
