"""Decision Transformer: returns-to-go, states and actions interleaved in one causal stack.

A trajectory segment of K steps becomes 3K tokens (R_1, s_1, a_1, R_2, s_2, a_2, ...): each is a linear
embedding of its value plus an embedding of its timestep, then a LayerNorm; a causal pre-norm stack
(GPT-2 style, final LayerNorm) runs over them, and the output at s_t predicts a_t (tanh). There is no
positional embedding besides the timestep, so a segment padded on the right is exact for its real
steps. The paper's Primal.+DT: 3 layers, D 256, H 4, K 20, the last layer causal primal,
``DecisionTransformerConfig(..., attention=["softmax", "softmax", "primal"])``.

Incremental decoding (:meth:`DecisionTransformer.push`) feeds one token at a time through every
layer's part of one :class:`~primal_attention.layers.cache.DecodeCache` (keys and values, or a primal
layer's O(1) sums); it equals the forward over the tokens so far.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field
from typing import Literal

import torch
from torch import Tensor, nn

from primal_attention.layers.cache import DecodeCache
from primal_attention.models.dropout import Dropout
from primal_attention.models.transformer import Activation, StackConfig

__all__ = ["DecisionTransformer", "DecisionTransformerConfig"]

_KINDS = ("return", "state", "action")


@dataclass
class DecisionTransformerConfig(StackConfig):
    """Everything that defines a :class:`DecisionTransformer`: the sizes of the environment (state_dim,
    act_dim, positional), the stack of :class:`StackConfig` (here D 256, H 4, FFN 1024, two softmax
    layers and one causal primal layer, dropout 0.1) and the Decision Transformer's own fields."""

    state_dim: int
    act_dim: int
    _: KW_ONLY
    context: int = 20
    max_ep_len: int = 1000
    dim: int = 256
    num_heads: int = 4
    ffn_dim: int = 1024
    attention: list[str] = field(default_factory=lambda: ["softmax", "softmax", "primal"])
    dropout: float = 0.1
    activation: Activation = "relu"
    action_tanh: bool = True
    #: "gpt2": every Linear inside the blocks (the primal layer's too) N(0, 0.02) with zero bias — what the
    #: authors' GPT2Model.init_weights does; the embeddings and the action head keep PyTorch's defaults
    #: there too. "torch": PyTorch's defaults everywhere (the previous init).
    block_init: Literal["gpt2", "torch"] = "gpt2"


class DecisionTransformer(nn.Module):
    """forward(x: states (B, K, S), mask (B, K) bool | None, actions (B, K, A), returns_to_go (B, K, 1),
    timesteps (B, K) int64) -> predicted actions (B, K, A), a_t predicted from the tokens up to s_t."""

    def __init__(self, config: DecisionTransformerConfig) -> None:
        super().__init__()
        c = config
        if c.state_dim < 1 or c.act_dim < 1 or c.context < 1 or c.max_ep_len < 1:
            raise ValueError(f"DecisionTransformer: state_dim, act_dim, context and max_ep_len must be positive, got "
                             f"{c.state_dim}, {c.act_dim}, {c.context}, {c.max_ep_len}")
        if c.block_init not in ("gpt2", "torch"):
            raise ValueError(f"DecisionTransformer: block_init must be gpt2 or torch, got {c.block_init!r}")
        self.config = c
        self.embed_timestep = nn.Embedding(c.max_ep_len, c.dim)
        self.embed_return = nn.Linear(1, c.dim)
        self.embed_state = nn.Linear(c.state_dim, c.dim)
        self.embed_action = nn.Linear(c.act_dim, c.dim)
        self.embed_ln = nn.LayerNorm(c.dim)
        self.drop = Dropout(c.dropout)
        self.decoder = c.stack(causal=True, max_seq_len=3 * c.context, activation=c.activation)
        self.predict_action = nn.Sequential(nn.Linear(c.dim, c.act_dim), *([nn.Tanh()] if c.action_tanh else []))
        if c.block_init == "gpt2":
            for module in self.decoder.modules():
                if isinstance(module, nn.Linear):
                    nn.init.normal_(module.weight, std=0.02)
                    if module.bias is not None:
                        nn.init.zeros_(module.bias)

    def _check(self, x: Tensor, actions: Tensor, returns_to_go: Tensor, timesteps: Tensor, mask: Tensor | None) -> None:
        c = self.config
        if x.dim() != 3 or x.shape[-1] != c.state_dim:
            raise ValueError(f"DecisionTransformer: expected states (B, K, {c.state_dim}), got {tuple(x.shape)}")
        b, k = x.shape[:2]
        if not 0 < k <= c.context:
            raise ValueError(f"DecisionTransformer: expected 1..{c.context} steps, got {k}")
        for name, t, shape in (("actions", actions, (b, k, c.act_dim)), ("returns_to_go", returns_to_go, (b, k, 1)),
                               ("timesteps", timesteps, (b, k))):
            if tuple(t.shape) != shape:
                raise ValueError(f"DecisionTransformer: expected {name} {shape}, got {tuple(t.shape)}")
        if timesteps.dtype != torch.int64:
            raise ValueError(f"DecisionTransformer: timesteps must be int64, got {timesteps.dtype}")
        if mask is not None and (mask.shape != (b, k) or mask.dtype != torch.bool):
            raise ValueError(f"DecisionTransformer: expected a bool mask {(b, k)}, got {tuple(mask.shape)} {mask.dtype}")

    def embed(self, kind: str, value: Tensor, timesteps: Tensor) -> Tensor:
        """Token embeddings of one kind ("return", "state", "action"): value (..., F) -> (..., D)."""
        layer = {"return": self.embed_return, "state": self.embed_state, "action": self.embed_action}[kind]
        return self.embed_ln(layer(value) + self.embed_timestep(timesteps.clamp(0, self.config.max_ep_len - 1)))

    def forward(self, x: Tensor, mask: Tensor | None = None, *, actions: Tensor, returns_to_go: Tensor,
                timesteps: Tensor) -> Tensor:
        self._check(x, actions, returns_to_go, timesteps, mask)
        b, k, _ = x.shape
        tokens = torch.stack([self.embed("return", returns_to_go, timesteps), self.embed("state", x, timesteps),
                              self.embed("action", actions, timesteps)], dim=2).reshape(b, 3 * k, -1)
        stacked = None if mask is None else mask.repeat_interleave(3, dim=1)
        h = self.decoder(self.drop(tokens), stacked).reshape(b, k, 3, -1)
        return self.predict_action(h[:, :, 1])

    def push(self, kind: str, value: Tensor, timestep: Tensor, cache: DecodeCache | None = None
             ) -> tuple[Tensor, DecodeCache]:
        """One token through the decoder with its decoding cache: value (B, F), timestep (B,) int64,
        ``cache`` (None: a new rollout) -> (the action predicted from this token (B, A), the cache,
        updated in place). Eval mode only; the tokens must come in the order return, state, action,
        and at most 3 · context of them."""
        if self.training:
            raise RuntimeError("DecisionTransformer.push: decoding runs without dropout; call model.eval() first")
        cache = DecodeCache() if cache is None else cache
        n = cache.length
        if kind != _KINDS[n % 3]:
            raise ValueError(f"DecisionTransformer.push: token {n} must be a {_KINDS[n % 3]} token, got {kind!r}")
        if n >= 3 * self.config.context:
            raise ValueError(f"DecisionTransformer.push: the context of {self.config.context} steps is full")
        h = self.decoder(self.embed(kind, value, timestep)[:, None], cache=cache)[:, 0]
        return self.predict_action(h), cache
