"""Causal language model: token embedding, causal Transformer stack, tied output head.

The paper's WikiText-103 setting makes only the last layer primal (causal family), e.g.
``CausalLMConfig(vocab_size=V, attention=["softmax"] * 5 + ["primal"])``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from primal_attention.layers.inputs import record_inputs
from primal_attention.layers.softmax import KVCache
from primal_attention.models.transformer import TransformerStack
from primal_attention.models.dropout import Dropout


@dataclass
class CausalLMConfig:
    """Everything that defines a :class:`CausalLM`."""

    vocab_size: int
    max_seq_len: int = 512
    dim: int = 512
    num_heads: int = 8
    ffn_dim: int = 2048
    attention: list[str] = field(default_factory=lambda: ["softmax"] * 5 + ["primal"])
    attention_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    dropout: float = 0.1
    #: pre-norm blocks with a final LayerNorm (True) or post-norm (False, fairseq's transformer_lm).
    norm_first: bool = True
    #: FFN activation: "gelu" or "relu" (fairseq's transformer_lm).
    activation: str = "gelu"


class LMState(NamedTuple):
    """Decoding state of a :class:`CausalLM`: the next position and one state per block (a primal
    layer's O(1) :class:`~primal_attention.layers.primal.PrimalState`, a softmax layer's KV cache)."""

    position: int
    layers: list[Any]


class CausalLM(nn.Module):
    """forward(tokens (B, N) int64, mask=None) -> logits (B, N, vocab_size); loss() gives the NLL.

    Decoding: :meth:`prefill` (one forward over a prompt, returning the state), :meth:`step` (one
    token) and :meth:`generate`. They equal the eval-mode forward at every position: prefill and
    step raise a RuntimeError in training mode (call ``model.eval()``); generate switches to eval
    and back. Positions are learned up to ``max_seq_len``, so decoding stops there.
    """

    def __init__(self, config: CausalLMConfig) -> None:
        super().__init__()
        c = config
        self.config = c
        # Tied input / output embedding, initialised N(0, 1/D) and scaled by sqrt(D) on input (as
        # fairseq's transformer_lm), so the initial logits have unit scale: loss ≈ ln(vocab_size).
        self.embed = nn.Embedding(c.vocab_size, c.dim)
        nn.init.normal_(self.embed.weight, std=c.dim ** -0.5)
        self.embed_scale = c.dim ** 0.5
        self.pos = nn.Parameter(torch.zeros(c.max_seq_len, c.dim))
        nn.init.normal_(self.pos, std=0.02)
        self.drop = Dropout(c.dropout)
        self.decoder = TransformerStack(
            c.attention,
            c.dim,
            c.num_heads,
            c.ffn_dim,
            dropout=c.dropout,
            causal=True,
            max_seq_len=c.max_seq_len,
            attention_options=c.attention_options,
            norm_first=c.norm_first,
            activation=c.activation,
        )

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """x: (B, N) int64 tokens, mask: (B, N) bool or None -> logits (B, N, vocab_size)."""
        if x.dim() != 2 or x.dtype != torch.int64:
            raise ValueError(f"CausalLM: expected int64 tokens (B, N), got {tuple(x.shape)} {x.dtype}")
        if not 0 < x.shape[1] <= self.config.max_seq_len:
            raise ValueError(f"CausalLM: expected 1..{self.config.max_seq_len} tokens, got {x.shape[1]}")
        if x.numel() and (int(x.min()) < 0 or int(x.max()) >= self.config.vocab_size):
            raise ValueError(f"CausalLM: token ids must be in [0, {self.config.vocab_size}), got "
                             f"[{int(x.min())}, {int(x.max())}]")
        h = self.drop(self.embed(x) * self.embed_scale + self.pos[: x.shape[1]])
        h = self.decoder(h, mask)
        return h @ self.embed.weight.T

    def loss(self, tokens: Tensor, reduction: str = "mean") -> Tensor:
        """Next-token NLL of tokens[:, 1:] given tokens[:, :-1]."""
        logits = self(tokens[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1), reduction=reduction)

    def step(self, tokens_t: Tensor, state: LMState | None = None) -> tuple[Tensor, LMState]:
        """tokens_t (B,) int64, the state (None to start) -> logits (B, V) for the next token, new state.

        Checked as :meth:`forward` checks its input: ids in the vocabulary, and a state whose position
        is an int in [0, max_seq_len) that agrees with the length of its KV caches.
        """
        if tokens_t.dim() != 1 or tokens_t.dtype != torch.int64:
            raise ValueError(f"CausalLM.step: expected int64 tokens (B,), got {tuple(tokens_t.shape)} {tokens_t.dtype}")
        self._check_eval("step")
        if tokens_t.numel():
            low, high = torch.stack(torch.aminmax(tokens_t)).tolist()  # one transfer from the device
            if low < 0 or high >= self.config.vocab_size:
                raise ValueError(f"CausalLM.step: token ids must be in [0, {self.config.vocab_size}), got [{low}, {high}]")
        if state is not None:
            self._check_state(state)
        return self._step(tokens_t, state)

    def _check_state(self, state: LMState) -> None:
        if not isinstance(state, LMState):
            raise TypeError(f"CausalLM.step: expected an LMState (or None to start), got {type(state).__name__}")
        position = state.position
        if isinstance(position, bool) or not isinstance(position, int) or position < 0:
            raise ValueError(f"CausalLM.step: expected state.position to be an int >= 0, got {position!r}")
        if position >= self.config.max_seq_len:
            raise ValueError(f"CausalLM.step: position {position} is past max_seq_len {self.config.max_seq_len}")
        if not isinstance(state.layers, (list, tuple)):
            raise TypeError(f"CausalLM.step: expected state.layers to be a list, got {type(state.layers).__name__}")
        for i, layer in enumerate(state.layers):
            # A KV cache holds one entry per token so far: its length is the position (read from
            # the shape, so no wait for the device). A primal state has no such length to compare.
            if isinstance(layer, KVCache) and isinstance(layer.k, Tensor) and layer.k.dim() == 4 \
                    and layer.k.shape[2] != position:
                raise ValueError(f"CausalLM.step: state.position is {position} but block {i}'s KV cache holds "
                                 f"{layer.k.shape[2]} tokens (a state of another sequence, or an edited one?)")

    def _step(self, tokens_t: Tensor, state: LMState | None) -> tuple[Tensor, LMState]:
        """:meth:`step` without its checks, for :meth:`generate`, whose tokens and states are its own."""
        position = 0 if state is None else state.position
        h = self.embed(tokens_t) * self.embed_scale + self.pos[position]
        h, layers = self.decoder.step(h, None if state is None else state.layers)
        return h @ self.embed.weight.T, LMState(position + 1, layers)

    def prefill(self, prompt: Tensor) -> tuple[Tensor, LMState]:
        """One forward over prompt (B, N0) int64 -> logits (B, N0, V) and the state after it."""
        self._check_eval("prefill")
        attentions = [(str(i), block.attn) for i, block in enumerate(self.decoder.blocks)]
        missing = [type(a).__name__ for _, a in attentions if not hasattr(a, "prefill_state")]
        if missing:
            raise TypeError(f"CausalLM.prefill: {missing[0]} has no incremental decoding")
        with record_inputs(attentions) as seen:
            logits = self(prompt)
        layers = [attn.prefill_state(seen[name].x) for name, attn in attentions]
        return logits, LMState(prompt.shape[1], layers)

    def _check_eval(self, method: str) -> None:
        if self.training:
            raise RuntimeError(f"CausalLM.{method}: decoding runs without dropout; call model.eval() first")

    @torch.no_grad()
    def generate(self, prompt: Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 generator: torch.Generator | None = None) -> Tensor:
        """Sample a continuation: prompt (B, N0) int64 -> (B, N0 + max_new_tokens).

        temperature 0 is greedy decoding, and a tiny positive one tends to it (never to NaN); top_k
        keeps the k most likely tokens before sampling. The model must be in eval mode (no dropout);
        it is put there and restored.
        """
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
            raise ValueError(f"CausalLM.generate: max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        if prompt.dim() != 2:
            raise ValueError(f"CausalLM.generate: expected an int64 prompt (B, N0), got {tuple(prompt.shape)}")
        if prompt.shape[1] + max_new_tokens > self.config.max_seq_len:
            raise ValueError(f"CausalLM.generate: prompt length {prompt.shape[1]} + {max_new_tokens} new tokens "
                             f"exceeds max_seq_len {self.config.max_seq_len}")
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
                or not (math.isfinite(temperature) and temperature >= 0):
            raise ValueError(f"CausalLM.generate: temperature must be a finite number >= 0, got {temperature!r}")
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k <= 0):
            raise ValueError(f"CausalLM.generate: top_k must be an int > 0 or None, got {top_k!r}")
        was = self.training
        self.eval()
        try:
            logits, state = self.prefill(prompt)
            out, next_logits = [prompt], logits[:, -1]
            for i in range(max_new_tokens):
                if temperature == 0:
                    token = next_logits.argmax(-1)
                else:
                    # Shifted so the largest logit is 0 and divided by at least the dtype's smallest
                    # normal number: a tiny temperature sends the others to -inf, never inf - inf = NaN.
                    shifted = next_logits - next_logits.amax(-1, keepdim=True)
                    scaled = shifted / max(temperature, torch.finfo(shifted.dtype).tiny)
                    if top_k is not None:
                        kth = scaled.topk(min(top_k, scaled.shape[-1]), dim=-1).values[:, -1:]
                        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
                    token = torch.multinomial(scaled.softmax(-1), 1, generator=generator)[:, 0]
                out.append(token[:, None])
                if i + 1 < max_new_tokens:
                    next_logits, state = self._step(token, state)
            return torch.cat(out, dim=1)
        finally:
            self.train(was)
