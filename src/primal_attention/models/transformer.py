"""Transformer blocks whose attention is chosen per layer by name.

``attention=["softmax", "primal"]`` is Primal.+Trans. (only the last layer primal);
``["primal", "primal"]`` is PrimalFormer. Options per attention kind come in one mapping,
e.g. ``attention_options={"primal": {"rank": 20, "rank_multi": 10}}``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from primal_attention.layers.cache import DecodeCache, LayerCache
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


class FeedForwardPlan(NamedTuple):
    """The decoding constants of a :class:`FeedForward` (:meth:`FeedForward.decode_plan`): the two
    weights as (in, out) contiguous copies (a one-row matmul reads them about 1.5-2x faster than the
    (out, in) parameters; measured at batch 1, D 128, one thread) and views of the biases."""

    fc1_t: Tensor
    fc1_bias: Tensor | None
    fc2_t: Tensor
    fc2_bias: Tensor | None
    #: the activation as a function of the (B, F) hidden (the module's own when it is not ReLU / GELU).
    activation: Callable[[Tensor], Tensor]


class FeedForward(nn.Module):
    """The position-wise feed-forward of a block: fc1 -> activation -> dropout -> fc2, x (..., D) -> (..., D).

    A decoding loop's one-token step (:meth:`decode_token`) reads its :meth:`decode_plan` (built once,
    kept in the block's :class:`~primal_attention.layers.cache.LayerCache`).
    Checkpoints written when this was an ``nn.Sequential`` (keys ``0.*`` and ``3.*``) still load.
    """

    def __init__(self, dim: int, ffn_dim: int, activation: str = "gelu", dropout: float = 0.0) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.fc1 = nn.Linear(dim, ffn_dim)
        self.act = ACTIVATIONS[activation]()
        self.drop = Dropout(dropout)
        self.fc2 = nn.Linear(ffn_dim, dim)
        self.register_load_state_dict_pre_hook(_sequential_keys)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.drop(self.act(self.fc1(x))))

    def decode_token(self, x: Tensor, cache: LayerCache, residual: Tensor | None = None) -> Tensor:
        """One token of a decoding loop: x (B, D) -> (B, D), plus ``residual`` (B, D) when given (the
        block's skip connection, one operation fewer). Reads :meth:`decode_plan`, built at the first
        call and kept in ``cache.ffn_plan``. For eval mode without gradients, float32 / float64 (the
        caller, :class:`TransformerStack`, checks)."""
        plan = cache.ffn_plan
        if plan is None:
            plan = cache.ffn_plan = self.decode_plan()
        u = torch.mm(x, plan.fc1_t) if plan.fc1_bias is None else torch.addmm(plan.fc1_bias, x, plan.fc1_t)
        u = plan.activation(u)
        if residual is None:
            return torch.mm(u, plan.fc2_t) if plan.fc2_bias is None else torch.addmm(plan.fc2_bias, u, plan.fc2_t)
        out = torch.addmm(residual, u, plan.fc2_t)
        return out if plan.fc2_bias is None else out.add_(plan.fc2_bias)

    def decode_plan(self) -> FeedForwardPlan:
        """The constants of the one-token step from the current weights (for one decoding loop whose
        weights do not change)."""
        with torch.no_grad():
            act = self.act
            if type(act) is nn.ReLU:
                activation = torch.relu_  # u is the step's own buffer
            elif type(act) is nn.GELU:
                activation = functools.partial(F.gelu, approximate=act.approximate)
            else:
                activation = act
            return FeedForwardPlan(self.fc1.weight.detach().t().contiguous(), self.fc1.bias,
                                   self.fc2.weight.detach().t().contiguous(), self.fc2.bias, activation)


def _sequential_keys(module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    """Rename the keys of a checkpoint from when the feed-forward was ``nn.Sequential`` (0: fc1, 3: fc2)."""
    for old, new in (("0.", "fc1."), ("3.", "fc2.")):
        for name in ("weight", "bias"):
            if prefix + old + name in state_dict and prefix + new + name not in state_dict:
                state_dict[prefix + new + name] = state_dict.pop(prefix + old + name)


class NormPlan(NamedTuple):
    """A LayerNorm's arguments to ``F.layer_norm``, read once for a decoding loop."""

    shape: tuple[int, ...]
    weight: Tensor | None
    bias: Tensor | None
    eps: float


def norm_plan(norm: nn.Module) -> NormPlan | None:
    """The :class:`NormPlan` of a LayerNorm (its parameters themselves), None for the identity."""
    if isinstance(norm, nn.Identity):
        return None
    if not isinstance(norm, nn.LayerNorm):
        raise TypeError(f"decoding: expected a LayerNorm or Identity, got {type(norm).__name__}")
    return NormPlan(tuple(norm.normalized_shape), norm.weight, norm.bias, norm.eps)


class BlockPlan(NamedTuple):
    """What a block's one-token step reads (:meth:`TransformerBlock.decode_plan`), gathered once per
    decoding loop so that a step looks nothing up on the modules: its norms' arguments and its
    attention's and feed-forward's own ``decode_token``."""

    norm_first: bool
    norm1: NormPlan
    norm2: NormPlan
    attn: Callable[..., Tensor]
    ffn: Callable[..., Tensor]


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
        self.ffn = FeedForward(dim, ffn_dim, activation, dropout)
        self.drop = Dropout(dropout)
        self.drop_path = DropPath(drop_path) if drop_path else nn.Identity()

    def forward(self, x: Tensor, mask: Tensor | None = None, *, cache: LayerCache | None = None,
                segments: Tensor | None = None) -> Tensor:
        """x (B, N, D), mask (B, N) -> (B, N, D). cache: decoding (eval mode only, a causal attention):
        x is the next chunk after the tokens in the block's :class:`~primal_attention.layers.cache.LayerCache`,
        which the attention and the feed-forward update (see :class:`TransformerStack`). segments:
        (B, N) document ids of packed rows, passed to the attention (see :class:`TransformerStack`)."""
        if segments is not None:
            if self.norm_first:
                x = x + self.drop_path(self.drop(self.attn(self.norm1(x), mask, segments=segments)))
                return x + self.drop_path(self.drop(self.ffn(self.norm2(x))))
            x = self.norm1(x + self.drop_path(self.drop(self.attn(x, mask, segments=segments))))
            return self.norm2(x + self.drop_path(self.drop(self.ffn(x))))
        if cache is not None:
            if self.training:
                raise RuntimeError("TransformerBlock: decoding runs without dropout; call .eval() first")
            if self.norm_first:
                x = x + self.attn(self.norm1(x), mask, cache=cache)
                return x + self.ffn(self.norm2(x))
            x = self.norm1(x + self.attn(x, mask, cache=cache))
            return self.norm2(x + self.ffn(x))
        if self.norm_first:
            x = x + self.drop_path(self.drop(self.attn(self.norm1(x), mask)))
            return x + self.drop_path(self.drop(self.ffn(self.norm2(x))))
        x = self.norm1(x + self.drop_path(self.drop(self.attn(x, mask))))
        return self.norm2(x + self.drop_path(self.drop(self.ffn(x))))

    def decode_token(self, x: Tensor, cache: LayerCache) -> Tensor:
        """One token of a decoding loop through the block: x (B, D) -> (B, D), its attention's and
        feed-forward's ``decode_token`` updating their parts of ``cache`` (the same numbers as
        :meth:`forward` with the cache). For eval mode without gradients, float32 / float64, an
        attention with ``decode_token``: :class:`TransformerStack` checks before it calls this."""
        p = cache.block_plan
        if p is None:
            p = cache.block_plan = self.decode_plan()
        n1, n2 = p.norm1, p.norm2
        # torch.layer_norm: F.layer_norm without its dispatch checks, on a path of one-row operations
        if p.norm_first:
            x = p.attn(torch.layer_norm(x, n1.shape, n1.weight, n1.bias, n1.eps), cache, x)
            return p.ffn(torch.layer_norm(x, n2.shape, n2.weight, n2.bias, n2.eps), cache, x)
        x = torch.layer_norm(p.attn(x, cache, x), n1.shape, n1.weight, n1.bias, n1.eps)
        return torch.layer_norm(p.ffn(x, cache, x), n2.shape, n2.weight, n2.bias, n2.eps)

    def decode_plan(self) -> BlockPlan:
        """The :class:`BlockPlan` of :meth:`decode_token`, from the block's current modules."""
        return BlockPlan(self.norm_first, norm_plan(self.norm1), norm_plan(self.norm2),
                         self.attn.decode_token, self.ffn.decode_token)


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

    def forward(self, x: Tensor, mask: Tensor | None = None, *, cache: DecodeCache | None = None,
                segments: Tensor | None = None) -> Tensor:
        """x (B, N, D), mask (B, N) bool or None -> (B, N, D).

        segments: packed rows of a causal stack, (B, N) integer document ids (each document one run of
        equal ids): every attention keeps to its own document (a primal layer's prefix mean restarts
        at the document's first token, a softmax layer masks the other documents), so each
        document's rows equal the stack over that document alone. Not with a cache.

        cache: incremental decoding of a causal stack in eval mode
        (:class:`~primal_attention.layers.cache.DecodeCache`; a new one starts a sequence). x is the
        next chunk after the positions already in the cache, each block updates its own part, and
        the rows equal those of the eval-mode forward over the whole sequence so far. A prompt fed
        in chunks needs memory for one chunk plus the states (O(1) per primal layer).
        """
        if segments is not None:
            if cache is not None:
                raise ValueError("TransformerStack: segments (packed documents) are not for decoding with a cache")
            for i, block in enumerate(self.blocks):
                if "segments" not in inspect.signature(type(block.attn).forward).parameters:
                    raise TypeError(f"TransformerStack: block {i}'s {type(block.attn).__name__} takes no segments "
                                    "(packed documents need causal primal or softmax attention)")
            for block in self.blocks:
                x = block(x, mask, segments=segments)
            return self.norm(x)
        if cache is None:
            for block in self.blocks:
                x = block(x, mask)
            return self.norm(x)
        if x.shape[1] == 1 and mask is None and self._token_path(x, cache):
            return self.decode_token(x[:, 0], cache)[:, None]
        if cache.owner is None:
            self.check_decodable("TransformerStack")
        for block, layer in zip(self.blocks, cache.bind(self, x.shape[0], "TransformerStack")):
            x = block(x, mask, cache=layer)
        cache.advance(x.shape[1])
        return self.norm(x)

    def decode_token(self, x: Tensor, cache: DecodeCache) -> Tensor:
        """One token of a decoding loop: x (B, D) after the positions in ``cache`` -> (B, D), the same
        numbers as :meth:`forward` with the cache. In eval mode without gradients or autocast, in the
        float32 / float64 of the parameters the cache began with, every block takes its fused
        ``decode_token`` (no per-module checks or lookups); otherwise the forward."""
        if (cache.owner != id(self) or x.dtype != cache.dtype or self.training or torch.is_grad_enabled()
                or torch.is_autocast_enabled(cache.device_type)):  # one test on the decoding loop's path
            if not self._token_path(x, cache):
                return self.forward(x[:, None], cache=cache)[:, 0]
            cache.bind(self, x.shape[0], "TransformerStack")  # a cache of another model: says so
        for block, layer in zip(self.blocks, cache.layers):
            x = block.decode_token(x, layer)
        cache.advance(1)
        if cache.norm_plan is None:
            cache.norm_plan = (norm_plan(self.norm),)
        n = cache.norm_plan[0]
        return x if n is None else torch.layer_norm(x, n.shape, n.weight, n.bias, n.eps)

    def _token_path(self, x: Tensor, cache: DecodeCache) -> bool:
        """Whether one token x (B, D) or (B, 1, D) may take :meth:`decode_token`'s fused path (see there)."""
        if cache.owner is None:
            self.check_decodable("TransformerStack")
            cache.bind(self, x.shape[0], "TransformerStack")
        return (x.dtype == cache.dtype and not self.training and not torch.is_grad_enabled()
                and not torch.is_autocast_enabled(cache.device_type))

    def check_decodable(self, where: str) -> None:
        """Whether this stack can decode (the first time a cache meets it): a clear error unless every block can decode incrementally: a causal attention with ``extend``
        (a chunk after a cache) and ``decode_token`` (one token)."""
        for i, block in enumerate(self.blocks):
            attn = block.attn
            if not (getattr(attn, "causal", False) and hasattr(attn, "extend") and hasattr(attn, "decode_token")):
                raise TypeError(f"{where}: block {i}'s {type(attn).__name__} has no incremental decoding "
                                "(decoding needs causal primal or softmax attention)")


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
