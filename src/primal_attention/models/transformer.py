"""Transformer blocks whose attention is chosen per layer by name.

``attention=["softmax", "primal"]`` is Primal.+Trans. (only the last layer primal);
``["primal", "primal"]`` is PrimalFormer. Options per attention kind come in one mapping,
e.g. ``attention_options={"primal": {"rank": 20, "rank_multi": 10}}``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor, nn

from primal_attention.layers.registry import build_attention
from primal_attention.models.dropout import Dropout

ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU}
Activation = Literal["gelu", "relu"]


@dataclass(kw_only=True)
class StackConfig:
    """What every model's Transformer stack shares, validated here once: width ``dim``, ``num_heads``,
    ``ffn_dim``, one registered attention name per layer (``attention``; its length is the depth),
    constructor options per attention name (``attention_options``, e.g. ``{"primal": {"rank": 30}}``),
    and ``dropout`` (residual branches and the FFN). The model configs (classifier, ViT, causal LM,
    Decision Transformer) extend it with their own fields and defaults."""

    dim: int = 64
    num_heads: int = 2
    ffn_dim: int = 128
    attention: list[str] = field(default_factory=lambda: ["primal", "primal"])
    attention_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    dropout: float = 0.0

    def __post_init__(self) -> None:
        name = type(self).__name__
        for key in ("dim", "num_heads", "ffn_dim"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}: {key} must be a positive int, got {value!r}")
        if self.dim % self.num_heads:
            raise ValueError(f"{name}: dim {self.dim} is not divisible by num_heads {self.num_heads}")
        if isinstance(self.attention, str) or not self.attention or not all(isinstance(a, str) for a in self.attention):
            raise ValueError(f"{name}: attention must be a non-empty list of names, one per layer, got {self.attention!r}")
        if not isinstance(self.attention_options, dict) or not all(isinstance(v, dict) for v in self.attention_options.values()):
            raise ValueError(f"{name}: attention_options must map attention names to option dicts, "
                             f"got {self.attention_options!r}")
        for key in self._probabilities():
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                raise ValueError(f"{name}: {key} must be in [0, 1), got {value!r}")
        activation = getattr(self, "activation", "gelu")
        if activation not in ACTIVATIONS:
            raise ValueError(f"{name}: activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")

    def _probabilities(self) -> tuple[str, ...]:
        """The fields that are probabilities (a model adds its own)."""
        return tuple(k for k in ("dropout", "attention_dropout", "drop_path") if hasattr(self, k))

    @property
    def depth(self) -> int:
        return len(self.attention)

    def stack(self, **options: Any) -> "TransformerStack":
        """The :class:`TransformerStack` of these fields; ``options`` add the model's own (causal,
        max_seq_len, norm_first, activation, attention_dropout, ...) or replace a shared one."""
        kw: dict[str, Any] = {"dropout": self.dropout, "attention_options": self.attention_options, **options}
        return TransformerStack(self.attention, self.dim, self.num_heads, self.ffn_dim, **kw)


class DropPath(nn.Module):
    """Stochastic depth (Huang et al., 2016) on a residual branch, as timm's ``DropPath``.

    In training each sample's branch output is zeroed with probability p and scaled by 1 / (1 - p)
    otherwise (so E[out] = x); in eval it is the identity. x: (B, ...) -> (B, ...).
    """

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"DropPath: p must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = torch.empty((x.shape[0],) + (1,) * (x.dim() - 1), dtype=x.dtype, device=x.device)
        return x * keep.bernoulli_(1.0 - self.p).div_(1.0 - self.p)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class TransformerBlock(nn.Module):
    """Attention + feed-forward with residuals, pre-norm or post-norm.

    pre-norm:  x = x + path(drop(attn(norm1(x)))); x = x + path(drop(ffn(norm2(x))))
    post-norm: x = norm1(x + path(drop(attn(x)))); x = norm2(x + path(drop(ffn(x))))

    ``path`` is :class:`DropPath` with probability ``drop_path`` (stochastic depth; 0 = identity).

    Shapes: x (B, N, D), mask (B, N) bool or None -> (B, N, D).
    """

    def __init__(
        self,
        attention: nn.Module,
        dim: int,
        ffn_dim: int,
        *,
        dropout: float = 0.0,
        norm_first: bool = True,
        activation: str = "gelu",
        drop_path: float = 0.0,
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.attn = attention
        self.norm_first = norm_first
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.ffn = nn.Sequential(
            nn.Linear(dim, ffn_dim), ACTIVATIONS[activation](), Dropout(dropout), nn.Linear(ffn_dim, dim)
        )
        self.drop = Dropout(dropout)
        self.drop_path = DropPath(drop_path) if drop_path else nn.Identity()

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        if self.norm_first:
            x = x + self.drop_path(self.drop(self.attn(self.norm1(x), mask)))
            return x + self.drop_path(self.drop(self.ffn(self.norm2(x))))
        x = self.norm1(x + self.drop_path(self.drop(self.attn(x, mask))))
        return self.norm2(x + self.drop_path(self.drop(self.ffn(x))))

    def step(self, x_t: Tensor, state: Any = None) -> tuple[Tensor, Any]:
        """One token through the block: x_t (B, D) -> (B, D), state. Eval mode only (no dropout, no
        drop path), so that it equals the eval-mode forward; a RuntimeError in training mode."""
        if not hasattr(self.attn, "step"):
            raise TypeError(f"TransformerBlock.step: {type(self.attn).__name__} has no incremental decoding")
        if self.training:
            raise RuntimeError("TransformerBlock.step: decoding runs without dropout; call .eval() first")
        if self.norm_first:
            a, state = self.attn.step(self.norm1(x_t), state)
            x_t = x_t + a
            return x_t + self.ffn(self.norm2(x_t)), state
        a, state = self.attn.step(x_t, state)
        x_t = self.norm1(x_t + a)
        return self.norm2(x_t + self.ffn(x_t)), state


class TransformerStack(nn.Module):
    """A stack of :class:`TransformerBlock`, one attention kind per layer.

    Args:
        attention: one registered attention name per layer, e.g. ["softmax", "primal"].
        dim, num_heads, ffn_dim: widths. max_seq_len: passed to the attentions (caps primal n).
        causal: every attention causal (decoder stacks).
        attention_options: per attention name, extra constructor options; they override the shared
            ``max_seq_len`` / ``causal`` / ``dropout`` (``{"softmax": {"dropout": 0.1}}``: dropout on the
            softmax probabilities only).
        final_norm: a LayerNorm after the last block (the usual pre-norm ending).
        drop_path: stochastic-depth probability, one for every layer or one per layer (DeiT
            increases it linearly over the blocks, ``torch.linspace(0, rate, depth)``).
    """

    def __init__(
        self,
        attention: Sequence[str],
        dim: int,
        num_heads: int,
        ffn_dim: int,
        *,
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        norm_first: bool = True,
        activation: str = "gelu",
        causal: bool = False,
        max_seq_len: int | None = None,
        attention_options: Mapping[str, Mapping[str, Any]] | None = None,
        final_norm: bool | None = None,
        drop_path: float | Sequence[float] = 0.0,
    ) -> None:
        super().__init__()
        if isinstance(attention, str) or not attention:
            raise ValueError(f"attention must be a non-empty list of names, got {attention!r}")
        paths = [float(drop_path)] * len(attention) if isinstance(drop_path, (int, float)) else list(drop_path)
        if len(paths) != len(attention):
            raise ValueError(f"drop_path: expected one probability per layer ({len(attention)}), got {len(paths)}")
        options = attention_options or {}
        self.attention = list(attention)
        self.blocks = nn.ModuleList(
            TransformerBlock(
                # per-name options win over the shared ones (e.g. dropout on softmax probabilities only)
                build_attention(name, dim, num_heads, **{"max_seq_len": max_seq_len, "causal": causal,
                                                         "dropout": attention_dropout, **dict(options.get(name, {}))}),
                dim,
                ffn_dim,
                dropout=dropout,
                norm_first=norm_first,
                activation=activation,
                drop_path=path,
            )
            for name, path in zip(attention, paths)
        )
        use_final = norm_first if final_norm is None else final_norm
        self.norm = nn.LayerNorm(dim) if use_final else nn.Identity()

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """x (B, N, D), mask (B, N) bool or None -> (B, N, D)."""
        for block in self.blocks:
            x = block(x, mask)
        return self.norm(x)

    def step(self, x_t: Tensor, states: list[Any] | None = None) -> tuple[Tensor, list[Any]]:
        """One token through every block: x_t (B, D) -> (B, D) and the per-block states (None to start)."""
        states = [None] * len(self.blocks) if states is None else states
        if len(states) != len(self.blocks):
            raise ValueError(f"TransformerStack.step: expected {len(self.blocks)} block states, got {len(states)}")
        new = []
        for block, state in zip(self.blocks, states):
            x_t, state = block.step(x_t, state)
            new.append(state)
        return self.norm(x_t), new


def hybrid_pattern(num_layers: int, kind: str, other: str = "softmax") -> list[str]:
    """Attention pattern of a named model family.

    kind: "transformer" (all ``other``), "primalformer" (all primal), "primal+" (last layer primal,
    the paper's Primal.+Trans.).
    """
    if num_layers <= 0:
        raise ValueError(f"num_layers must be positive, got {num_layers}")
    patterns = {
        "transformer": [other] * num_layers,
        "primalformer": ["primal"] * num_layers,
        "primal+": [other] * (num_layers - 1) + ["primal"],
    }
    if kind not in patterns:
        raise ValueError(f"model kind must be one of {sorted(patterns)}, got {kind!r}")
    return patterns[kind]
