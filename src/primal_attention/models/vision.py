"""Vision Transformer (ViT / DeiT) with the attention chosen per block: Primal.+ViT and PrimalViT.

The paper's ImageNet model is DeiT-Small/16 with only the last block primal (Primal.+DeiT-S), every
token sampled (n = 197)::

    cfg = deit_small(num_classes=1000, attention="primal+", attention_options={"primal": {"rank": 96}})
    model = VisionTransformer(cfg)          # model(x) with x (B, 3, 224, 224) -> (B, 1000)

Topology as DeiT / timm: Conv2d patch embedding (kernel = stride = patch), a CLS token, learned
positions, pre-norm blocks with stochastic depth rising linearly over the blocks, a final LayerNorm
and a linear head on the CLS token. Linear and LayerNorm weights start as in DeiT (truncated normal,
std 0.02; zero biases), attention projections included.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from primal_attention.layers.checks import check_dtype
from primal_attention.models.dropout import Dropout
from primal_attention.models.transformer import TransformerStack, hybrid_pattern

__all__ = ["ViTConfig", "VisionTransformer", "deit_small", "deit_tiny", "vit_cpu"]

#: constructor options the model sets itself; attention_options must not repeat them.
_MODEL_SET = {"bias": "qkv_bias", "dropout": "attention_dropout", "max_seq_len": "image_size / patch_size",
              "causal": "(a ViT is never causal)"}


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


@dataclass(kw_only=True)
class ViTConfig:
    """Everything that defines a :class:`VisionTransformer`.

    Data: num_classes, image_size (square images of image_size × image_size), in_channels.
    Architecture: patch_size, dim (D), num_heads (H), ffn_dim, attention (one registered name per
    block; its length is the depth), attention_options (per attention name, e.g.
    ``{"primal": {"rank": 96}}``; a primal block samples every token unless ``num_samples`` is
    given), dropout (after the position embedding, in the MLP and on residual branches),
    attention_dropout, drop_path (stochastic depth of the last block; block i gets
    drop_path · i / (depth − 1)), qkv_bias (the attentions' ``bias``).
    """

    num_classes: int
    image_size: int
    in_channels: int = 3
    patch_size: int = 16
    dim: int = 192
    num_heads: int = 3
    ffn_dim: int = 768
    attention: list[str] = field(default_factory=lambda: ["softmax"] * 12)
    attention_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    dropout: float = 0.0
    attention_dropout: float = 0.0
    drop_path: float = 0.0
    qkv_bias: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.num_classes, int) or self.num_classes < 2:
            raise ValueError(f"ViTConfig: num_classes must be an int >= 2, got {self.num_classes!r}")
        for name in ("image_size", "in_channels", "patch_size", "dim", "num_heads", "ffn_dim"):
            if not _positive_int(getattr(self, name)):
                raise ValueError(f"ViTConfig: {name} must be a positive int, got {getattr(self, name)!r}")
        if self.image_size % self.patch_size:
            raise ValueError(f"ViTConfig: image_size {self.image_size} is not divisible by patch_size {self.patch_size}")
        if self.dim % self.num_heads:
            raise ValueError(f"ViTConfig: dim {self.dim} is not divisible by num_heads {self.num_heads}")
        if isinstance(self.attention, str) or not self.attention or not all(isinstance(a, str) for a in self.attention):
            raise ValueError(f"ViTConfig: attention must be a non-empty list of names, one per block, got {self.attention!r}")
        for name in ("dropout", "attention_dropout", "drop_path"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"ViTConfig: {name} must be in [0, 1), got {getattr(self, name)!r}")
        for kind, options in self.attention_options.items():
            clash = sorted(set(options) & set(_MODEL_SET))
            if clash:
                raise ValueError(f"ViTConfig: attention_options[{kind!r}] sets {clash}; the model sets "
                                 f"them ({', '.join(_MODEL_SET[k] for k in clash)})")

    @property
    def depth(self) -> int:
        return len(self.attention)

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def num_tokens(self) -> int:
        """Patches + the CLS token: the sequence length every block sees."""
        return self.num_patches + 1

    def block_options(self) -> dict[str, dict[str, Any]]:
        """attention_options as built: qkv_bias as ``bias``, primal sampling all tokens by default."""
        out: dict[str, dict[str, Any]] = {}
        for kind in set(self.attention) | set(self.attention_options):
            opts = {"bias": self.qkv_bias, **self.attention_options.get(kind, {})}
            if kind == "primal":
                opts.setdefault("num_samples", self.num_tokens)
            out[kind] = opts
        return out

    def drop_path_rates(self) -> list[float]:
        """Per-block stochastic-depth probabilities, 0 → drop_path linearly (DeiT)."""
        return [self.drop_path * i / max(1, self.depth - 1) for i in range(self.depth)]


def _preset(depth: int, attention: str | Sequence[str] | None, fields: dict[str, Any],
            overrides: dict[str, Any]) -> ViTConfig:
    """A preset's fields, then the caller's overrides. attention: None (all softmax), a model kind
    for :func:`hybrid_pattern` ("transformer", "primal+", "primalformer") or one name per block."""
    if attention is None:
        pattern = hybrid_pattern(depth, "transformer")
    elif isinstance(attention, str):
        pattern = hybrid_pattern(depth, attention)
    else:
        pattern = list(attention)
    return ViTConfig(**{**fields, "attention": pattern, **overrides})


def deit_tiny(num_classes: int = 1000, image_size: int = 224, attention: str | Sequence[str] | None = None,
              **overrides: Any) -> ViTConfig:
    """DeiT-Tiny/16: patch 16, D 192, depth 12, H 3, MLP 768. Arguments as :func:`vit_cpu`."""
    return _preset(12, attention, dict(num_classes=num_classes, image_size=image_size, patch_size=16, dim=192,
                                       num_heads=3, ffn_dim=768), overrides)


def deit_small(num_classes: int = 1000, image_size: int = 224, attention: str | Sequence[str] | None = None,
               **overrides: Any) -> ViTConfig:
    """DeiT-Small/16: patch 16, D 384, depth 12, H 6, MLP 1536 (the paper's ImageNet backbone).
    Arguments as :func:`vit_cpu`."""
    return _preset(12, attention, dict(num_classes=num_classes, image_size=image_size, patch_size=16, dim=384,
                                       num_heads=6, ffn_dim=1536), overrides)


def vit_cpu(num_classes: int = 10, image_size: int = 28, in_channels: int = 1,
            attention: str | Sequence[str] | None = None, **overrides: Any) -> ViTConfig:
    """A ViT small enough to train on one CPU thread (Fashion-MNIST): patch 4 (49 + 1 tokens at 28 × 28),
    D 64, depth 4, H 4, MLP 128.

    ``attention``: None (all softmax), a model kind for :func:`hybrid_pattern` ("transformer",
    "primal+", "primalformer") or one name per block (its length is then the depth).
    ``overrides``: any :class:`ViTConfig` field, replacing the preset's (e.g. ``patch_size=2``).
    """
    return _preset(4, attention, dict(num_classes=num_classes, image_size=image_size, in_channels=in_channels,
                                      patch_size=4, dim=64, num_heads=4, ffn_dim=128), overrides)


def _deit_init(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


class VisionTransformer(nn.Module):
    """Patch embedding, CLS token, learned positions, a pre-norm :class:`TransformerStack`, a linear head.

    forward(x) -> logits (B, num_classes), with x (B, in_channels, image_size, image_size) float
    (normalised images). :meth:`encode` gives the final CLS feature (B, dim).
    """

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        c = config
        self.config = c
        self.patch_embed = nn.Conv2d(c.in_channels, c.dim, kernel_size=c.patch_size, stride=c.patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, c.num_tokens, c.dim))
        self.pos_drop = Dropout(c.dropout)
        self.encoder = TransformerStack(
            c.attention,
            c.dim,
            c.num_heads,
            c.ffn_dim,
            dropout=c.dropout,
            attention_dropout=c.attention_dropout,
            norm_first=True,
            final_norm=True,
            max_seq_len=c.num_tokens,
            attention_options=c.block_options(),
            drop_path=c.drop_path_rates(),
        )
        self.head = nn.Linear(c.dim, c.num_classes)
        self.apply(_deit_init)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)

    def _check(self, x: Tensor) -> None:
        c = self.config
        expected = (c.in_channels, c.image_size, c.image_size)
        if x.dim() != 4 or tuple(x.shape[1:]) != expected or not x.is_floating_point():
            raise ValueError(f"VisionTransformer: expected float images of shape (B, {', '.join(map(str, expected))}), "
                             f"got {tuple(x.shape)} {x.dtype}")
        check_dtype(x, self.patch_embed.weight.dtype, "VisionTransformer")

    def encode(self, x: Tensor) -> Tensor:
        """x (B, C, H, W) -> the CLS token after the final norm: (B, dim)."""
        self._check(x)
        h = self.patch_embed(x).flatten(2).transpose(1, 2)  # (B, num_patches, D), row-major patches
        h = torch.cat([self.cls_token.expand(h.shape[0], -1, -1), h], dim=1) + self.pos_embed
        return self.encoder(self.pos_drop(h))[:, 0]

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.encode(x))
