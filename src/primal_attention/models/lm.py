"""Causal language model: token embedding, causal Transformer stack, tied output head.

The paper's WikiText-103 setting makes only the last layer primal (causal family), e.g.
``CausalLMConfig(vocab_size=V, attention=["softmax"] * 5 + ["primal"])``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

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


class CausalLM(nn.Module):
    """forward(tokens (B, N) int64, mask=None) -> logits (B, N, vocab_size); loss() gives the NLL."""

    def __init__(self, config: CausalLMConfig) -> None:
        super().__init__()
        c = config
        self.config = c
        self.embed = nn.Embedding(c.vocab_size, c.dim)
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
        )

    def forward(self, tokens: Tensor, mask: Tensor | None = None) -> Tensor:
        if tokens.dim() != 2 or tokens.dtype != torch.int64:
            raise ValueError(f"CausalLM: expected int64 tokens (B, N), got {tuple(tokens.shape)} {tokens.dtype}")
        if not 0 < tokens.shape[1] <= self.config.max_seq_len:
            raise ValueError(f"CausalLM: expected 1..{self.config.max_seq_len} tokens, got {tokens.shape[1]}")
        h = self.drop(self.embed(tokens) + self.pos[: tokens.shape[1]])
        h = self.decoder(h, mask)
        return h @ self.embed.weight.T

    def loss(self, tokens: Tensor, reduction: str = "mean") -> Tensor:
        """Next-token NLL of tokens[:, 1:] given tokens[:, :-1]."""
        logits = self(tokens[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1), reduction=reduction)
