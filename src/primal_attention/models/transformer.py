"""Transformer blocks whose attention is chosen per layer by name.

``attention=["softmax", "primal"]`` is Primal.+Trans. (only the last layer primal);
``["primal", "primal"]`` is PrimalFormer. Options per attention kind come in one mapping,
e.g. ``attention_options={"primal": {"rank": 20, "rank_multi": 10}}``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from primal_attention.layers.primal import PrimalAttention
from primal_attention.ops.primal.decode import PrimalState, fused_step
from primal_attention.layers.registry import build_attention
from primal_attention.layers.softmax import KVCache, SoftmaxAttention, fused_out, fused_qkv
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

    def extend(self, x: Tensor, state: Any = None, mask: Tensor | None = None,
               past_mask: Tensor | None = None) -> tuple[Tensor, Any]:
        """The next chunk of a causal sequence through the block: x (B, T, D) -> (B, T, D) and the
        attention's state after it (see ``extend`` of the attention layers). Eval mode only, as :meth:`step`."""
        if not hasattr(self.attn, "extend"):
            raise TypeError(f"TransformerBlock.extend: {type(self.attn).__name__} has no incremental decoding")
        if self.training:
            raise RuntimeError("TransformerBlock.extend: decoding runs without dropout; call .eval() first")
        if self.norm_first:
            a, state = self.attn.extend(self.norm1(x), state, mask, past_mask)
            x = x + a
            return x + self.ffn(self.norm2(x)), state
        a, state = self.attn.extend(x, state, mask, past_mask)
        x = self.norm1(x + a)
        return self.norm2(x + self.ffn(x)), state

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

    def extend(self, x: Tensor, states: list[Any] | None = None, mask: Tensor | None = None,
               past_mask: Tensor | None = None) -> tuple[Tensor, list[Any]]:
        """The next chunk of a causal sequence through every block: x (B, T, D) -> (B, T, D) and the
        per-block states after it (None: x starts the sequence). mask (B, T) / past_mask (B, P) bool:
        real tokens of the chunk / of the P positions before it. Rows equal the eval-mode forward's."""
        states = [None] * len(self.blocks) if states is None else states
        if len(states) != len(self.blocks):
            raise ValueError(f"TransformerStack.extend: expected {len(self.blocks)} block states, got {len(states)}")
        new = []
        for block, state in zip(self.blocks, states):
            x, state = block.extend(x, state, mask, past_mask)
            new.append(state)
        return self.norm(x), new

    def decode_plan(self) -> list[BlockPlan] | None:
        """The fused decoding plan of every block, or None where a block cannot take it (an attention
        other than causal primal / softmax, or training mode). For one decoding loop whose weights do
        not change: it holds rearranged copies of the matmul weights and views of the LayerNorm
        parameters and biases, so a parameter changed in place afterwards is seen in part (build a
        new plan instead)."""
        plans: list[BlockPlan] | None = []
        for block in self.blocks:
            attn = block.attn
            ok = (not block.training and getattr(attn, "causal", False)
                  and isinstance(attn, (PrimalAttention, SoftmaxAttention))
                  and isinstance(block.ffn[1], (nn.GELU, nn.ReLU))
                  and getattr(block.ffn[1], "approximate", "none") == "none")
            if not ok:
                plans = None
                break
            fc1, fc2 = block.ffn[0], block.ffn[3]
            plans.append(BlockPlan(
                isinstance(attn, PrimalAttention), attn.decode_plan(), block.norm_first,
                (_detached(block.norm1.weight), _detached(block.norm1.bias), block.norm1.eps),
                (_detached(block.norm2.weight), _detached(block.norm2.bias), block.norm2.eps),
                # (in, out) contiguous copies: a one-row matmul reads them about 1.5-2x faster than
                # the (out, in) weights (measured at batch 1, D 128, 1 thread)
                fc1.weight.detach().t().contiguous(), _detached(fc1.bias), fc2.weight.detach().t().contiguous(),
                _detached(fc2.bias), isinstance(block.ffn[1], nn.ReLU)))
        return plans

    def _fused_ok(self, x_t: Tensor) -> bool:
        dtype = self.blocks[0].norm1.weight.dtype
        return (not torch.is_grad_enabled() and x_t.dim() == 2 and x_t.dtype == dtype
                and dtype in (torch.float32, torch.float64) and not torch.is_autocast_enabled(x_t.device.type))

    def decode_session(self, states: list[Any] | None, batch: int, capacity: int, *,
                       key_mask: Tensor | None = None, dtype: torch.dtype | None = None,
                       device: torch.device | None = None, plans: list[BlockPlan] | None = None) -> DecodeSession:
        """A :class:`DecodeSession` from per-block states (None: empty) for ``capacity`` more tokens,
        with ``plans`` (:meth:`decode_plan`, built here when None).

        Raises a RuntimeError in training mode or under autograd, a TypeError for a block without the
        fused step (see :meth:`decode_plan`)."""
        if self.training:
            raise RuntimeError("TransformerStack.decode_session: decoding runs without dropout; call .eval() first")
        if torch.is_grad_enabled():
            raise RuntimeError("TransformerStack.decode_session: run it under torch.no_grad() / inference_mode()")
        plans = self.decode_plan() if plans is None else plans
        if plans is None:
            raise TypeError("TransformerStack.decode_session: every block needs a causal primal or softmax attention "
                            "and a GELU / ReLU feed-forward")
        p = self.blocks[0].norm1.weight
        states = [None] * len(self.blocks) if states is None else list(states)
        if len(states) != len(self.blocks):
            raise ValueError(f"TransformerStack.decode_session: expected {len(self.blocks)} block states, got {len(states)}")
        return DecodeSession(self, plans, states, batch, capacity, key_mask, dtype or p.dtype, device or p.device)

    def _fused_step(self, plans: list[BlockPlan], x: Tensor, states: list[Any]) -> tuple[Tensor, list[Any]] | None:
        """The fused step without touching the given states (new tensors); None where a state does not
        fit (the caller then takes the checked path, which says why)."""
        batch = x.shape[0]
        new = []
        for bp, st in zip(plans, states):
            h = _layer_norm(x, bp.ln1) if bp.norm_first else x
            if bp.primal:
                if st is None:
                    total = x.new_zeros(batch, bp.attn.qk_t.shape[1])
                    count = x.new_zeros(batch, 1)
                elif (type(st) is PrimalState and isinstance(st.total, Tensor) and isinstance(st.count, Tensor)
                      and st.total.shape == (batch, bp.attn.qk_t.shape[1]) and st.count.shape == (batch,)
                      and st.total.dtype == st.count.dtype == x.dtype):
                    total, count = st.total, st.count[:, None]
                else:
                    return None
                x, total, count = fused_step(bp.attn, h, total, count, residual=x)
                new.append(PrimalState(total, count[:, 0]))
            else:
                q, k, v = fused_qkv(bp.attn, h)
                if st is not None:
                    if not (type(st) is KVCache and isinstance(st.k, Tensor) and isinstance(st.v, Tensor)
                            and st.k.dim() == 4 and st.k.shape == st.v.shape and st.k.shape[0] == batch
                            and st.k.shape[1] == bp.attn.heads and st.k.shape[3] == bp.attn.head_dim
                            and st.k.dtype == st.v.dtype == x.dtype):
                        return None
                    k, v = torch.cat([st.k, k], dim=2), torch.cat([st.v, v], dim=2)
                x = fused_out(bp.attn, F.scaled_dot_product_attention(q, k, v), x)
                new.append(KVCache(k, v))
            if not bp.norm_first:
                x = _layer_norm(x, bp.ln1)
            x = _fused_ffn(bp, x)
        return x, new

    def step(self, x_t: Tensor, states: list[Any] | None = None, *,
             plans: list[BlockPlan] | None = None) -> tuple[Tensor, list[Any]]:
        """One token through every block: x_t (B, D) -> (B, D) and the per-block states (None to start).

        With ``plans`` (:meth:`decode_plan`, built once per decoding loop), without gradients
        (no_grad / inference_mode), in eval mode and float32 / float64, every block takes its fused
        step (a handful of tensor operations per block, no module calls, no per-layer re-validation
        beyond the state's shape); otherwise each block's own step (which reads the parameters)."""
        states = [None] * len(self.blocks) if states is None else states
        if len(states) != len(self.blocks):
            raise ValueError(f"TransformerStack.step: expected {len(self.blocks)} block states, got {len(states)}")
        if plans is not None and len(plans) != len(self.blocks):
            raise ValueError(f"TransformerStack.step: expected a plan per block ({len(self.blocks)}), got {len(plans)}")
        if plans is not None and self._fused_ok(x_t) and not any(b.training for b in self.blocks):
            done = self._fused_step(plans, x_t, states)
            if done is not None:
                x_t, new = done
                return self.norm(x_t), new
        new = []
        for block, state in zip(self.blocks, states):
            x_t, state = block.step(x_t, state)
            new.append(state)
        return self.norm(x_t), new


class BlockPlan(NamedTuple):
    """What the fused decoding step of one :class:`TransformerBlock` reads (views of its parameters
    and its attention's decode plan)."""

    primal: bool
    attn: Any
    norm_first: bool
    ln1: tuple[Any, Any, float]
    ln2: tuple[Any, Any, float]
    fc1_t: Tensor
    fc1_b: Tensor | None
    fc2_t: Tensor
    fc2_b: Tensor | None
    relu: bool


def _detached(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.detach()


def _layer_norm(x: Tensor, ln: tuple[Any, Any, float]) -> Tensor:
    return F.layer_norm(x, (x.shape[-1],), ln[0], ln[1], ln[2])


def _fused_ffn(bp: BlockPlan, x: Tensor) -> Tensor:
    """The block's feed-forward half after its attention: x (B, D) -> (B, D)."""
    h = _layer_norm(x, bp.ln2) if bp.norm_first else x
    u = torch.mm(h, bp.fc1_t) if bp.fc1_b is None else torch.addmm(bp.fc1_b, h, bp.fc1_t)
    u = u.relu_() if bp.relu else F.gelu(u)
    out = torch.addmm(x, u, bp.fc2_t)
    if bp.fc2_b is not None:
        out.add_(bp.fc2_b)
    return out if bp.norm_first else _layer_norm(out, bp.ln2)


class DecodeSession:
    """Incremental decoding of a :class:`TransformerStack` with preallocated, in-place state.

    Built by :meth:`TransformerStack.decode_session` from per-block states (None: empty prefix).
    Primal layers keep their running sums (B, 2D) and counts, advanced in place; softmax layers get
    key / value buffers of (B, H, T0 + capacity, d) filled one column per token (no copy of the
    cache per token, unlike :meth:`SoftmaxAttention.step`'s concatenation). ``key_mask`` (B, T0)
    bool marks the real positions of the prefix (right-padded prompts of different lengths); the
    new tokens are real for every sequence. Runs under no_grad, eval mode, float32 / float64.
    """

    def __init__(self, stack: TransformerStack, plans: list[BlockPlan], states: list[Any], batch: int,
                 capacity: int, key_mask: Tensor | None, dtype: torch.dtype, device: torch.device) -> None:
        self.stack, self.plans, self.batch = stack, plans, batch
        self.layers: list[Any] = []
        prefix = None
        for bp, st in zip(plans, states):
            if bp.primal:
                width = bp.attn.qk_t.shape[1]
                if st is None:
                    total = torch.zeros(batch, width, dtype=dtype, device=device)
                    count = torch.zeros(batch, 1, dtype=dtype, device=device)
                else:
                    total, count = st.total.clone(), st.count[:, None].clone()
                self.layers.append([total, count])
            else:
                heads, d = bp.attn.heads, bp.attn.head_dim
                t0 = 0 if st is None else st.k.shape[2]
                if prefix is not None and t0 != prefix:
                    raise ValueError(f"DecodeSession: softmax caches of different lengths ({prefix} and {t0})")
                prefix = t0
                k = torch.empty(batch, heads, t0 + capacity, d, dtype=dtype, device=device)
                v = torch.empty_like(k)
                if st is not None:
                    k[:, :, :t0].copy_(st.k)
                    v[:, :, :t0].copy_(st.v)
                self.layers.append([k, v])
        self.length = prefix or 0
        self.capacity = self.length + capacity
        self.mask = None
        if key_mask is not None and prefix is not None:
            self.mask = torch.ones(batch, 1, 1, self.capacity, dtype=torch.bool, device=device)
            self.mask[:, 0, 0, : self.length].copy_(key_mask)
        ln = stack.norm
        self.final = (_detached(ln.weight), _detached(ln.bias), ln.eps) if isinstance(ln, nn.LayerNorm) else None

    def step(self, x: Tensor) -> Tensor:
        """One token x (B, D) through every block, state advanced in place -> the final hidden (B, D)."""
        t = self.length
        if t >= self.capacity and any(not bp.primal for bp in self.plans):
            raise ValueError(f"DecodeSession.step: the key / value buffers are full ({self.capacity} positions)")
        mask = None if self.mask is None else self.mask[..., : t + 1]
        for bp, st in zip(self.plans, self.layers):
            h = _layer_norm(x, bp.ln1) if bp.norm_first else x
            if bp.primal:
                x, _, _ = fused_step(bp.attn, h, st[0], st[1], inplace=True, residual=x)
            else:
                q, k, v = fused_qkv(bp.attn, h)
                keys, values = st[0][:, :, : t + 1], st[1][:, :, : t + 1]
                keys[:, :, t:].copy_(k)
                values[:, :, t:].copy_(v)
                x = fused_out(bp.attn, F.scaled_dot_product_attention(q, keys, values, attn_mask=mask), x)
            if not bp.norm_first:
                x = _layer_norm(x, bp.ln1)
            x = _fused_ffn(bp, x)
        self.length = t + 1
        return x if self.final is None else _layer_norm(x, self.final)

    def states(self) -> list[Any]:
        """The per-block states so far, as :meth:`TransformerStack.step` takes them (copies of the
        running sums; views of the filled part of the key / value buffers)."""
        out = []
        for bp, st in zip(self.plans, self.layers):
            if bp.primal:
                out.append(PrimalState(st[0].clone(), st[1][:, 0].clone()))
            else:
                out.append(KVCache(st[0][:, :, : self.length], st[1][:, :, : self.length]))
        return out


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
