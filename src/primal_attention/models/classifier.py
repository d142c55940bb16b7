"""Sequence classifier: token or continuous-feature input, a Transformer stack, a pooled head.

Covers the paper's two classification settings:

* UEA time series (PrimalFormer / Primal.+Trans.): continuous input, learned positional encoding,
  2 post-norm layers, GELU + dropout, and a linear head on the flattened (masked) sequence —
  ``ClassifierConfig(num_features=C, pooling="flatten", norm_first=False, positional="learned")``.
* LRA: token input, 2 pre-norm layers, mean pooling and an MLP head —
  ``ClassifierConfig(vocab_size=V, pooling="mean", head_hidden=128)``; ``dual=True`` gives the
  two-tower Retrieval head on ``[u, v, u·v, u − v]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from primal_attention.models.transformer import Activation, StackConfig
from primal_attention.models.dropout import Dropout

POSITIONAL = ("learned", "sinusoidal", "none")
POOLING = ("mean", "cls", "flatten")
EMBEDDING_INITS = ("auto", "normal", "torch")


@dataclass(kw_only=True)
class ClassifierConfig(StackConfig):
    """Everything that defines a :class:`SequenceClassifier`: the stack of :class:`StackConfig` (D 64,
    H 2, FFN 128, two primal layers by default) and the classifier's own fields; exactly one of
    vocab_size / num_features."""

    num_classes: int
    max_seq_len: int
    vocab_size: int | None = None
    num_features: int | None = None
    attention_dropout: float = 0.0
    norm_first: bool = True
    activation: Activation = "gelu"
    positional: Literal["learned", "sinusoidal", "none"] = "learned"
    pooling: Literal["mean", "cls", "flatten"] = "mean"
    input_scale: bool = False
    head_hidden: int | None = None
    dual: bool = False
    #: "normal": token embedding and learned positions N(0, 0.02) (the authors' LRA ``Embeddings``);
    #: "torch": PyTorch's defaults for the input layer (an ``nn.Embedding`` is N(0, 1)) and learned
    #: positions U(-0.02, 0.02) (the authors' UEA ``LearnablePositionalEncoding``); "auto": "normal" for
    #: token input, "torch" for continuous input — each the authors' choice for that kind of data.
    embedding_init: Literal["auto", "normal", "torch"] = "auto"

    def __post_init__(self) -> None:
        super().__post_init__()
        if (self.vocab_size is None) == (self.num_features is None):
            raise ValueError("ClassifierConfig: give exactly one of vocab_size (tokens) or num_features (continuous)")
        if self.positional not in POSITIONAL:
            raise ValueError(f"ClassifierConfig: positional must be one of {POSITIONAL}, got {self.positional!r}")
        if self.pooling not in POOLING:
            raise ValueError(f"ClassifierConfig: pooling must be one of {POOLING}, got {self.pooling!r}")
        if self.num_classes < 2:
            raise ValueError(f"ClassifierConfig: num_classes must be >= 2, got {self.num_classes}")
        if self.max_seq_len <= 0:
            raise ValueError(f"ClassifierConfig: max_seq_len must be positive, got {self.max_seq_len}")
        if self.embedding_init not in EMBEDDING_INITS:
            raise ValueError(f"ClassifierConfig: embedding_init must be one of {EMBEDDING_INITS}, got {self.embedding_init!r}")
        if self.dual and self.pooling == "flatten":
            raise ValueError("ClassifierConfig: the dual (retrieval) head needs mean or cls pooling")


def sinusoidal_positions(length: int, dim: int) -> Tensor:
    """Fixed sine/cosine positional encoding (Vaswani et al.): (length, dim)."""
    pos = torch.arange(length, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq)[:, : dim // 2]
    return table


class SequenceClassifier(nn.Module):
    """Embed, encode, pool, classify.

    forward(x, mask=None, x2=None, mask2=None) -> logits (B, num_classes), with x (B, N) int64
    tokens or (B, N, C) float features, mask (B, N) bool (True = real token). N ≤ max_seq_len;
    flatten pooling pads shorter inputs up to max_seq_len. x2 / mask2: the second document of a
    dual (retrieval) model.
    """

    def __init__(self, config: ClassifierConfig) -> None:
        super().__init__()
        c = config
        self.config = c
        if c.vocab_size is not None:
            self.embed = nn.Embedding(c.vocab_size, c.dim)
        else:
            self.embed = nn.Linear(c.num_features, c.dim)
        extra = 1 if c.pooling == "cls" else 0
        length = c.max_seq_len + extra
        normal = c.embedding_init == "normal" or (c.embedding_init == "auto" and c.vocab_size is not None)
        if normal and c.vocab_size is not None:
            nn.init.normal_(self.embed.weight, std=0.02)
        if c.positional == "learned":
            table = torch.empty(length, c.dim)
            self.pos = nn.Parameter(table.normal_(std=0.02) if normal else table.uniform_(-0.02, 0.02))
        elif c.positional == "sinusoidal":
            self.register_buffer("pos", sinusoidal_positions(length, c.dim), persistent=False)
        else:
            self.pos = None
        self.cls = nn.Parameter(torch.zeros(1, 1, c.dim)) if c.pooling == "cls" else None
        self.drop = Dropout(c.dropout)
        self.encoder = c.stack(attention_dropout=c.attention_dropout, norm_first=c.norm_first, activation=c.activation,
                               max_seq_len=length)
        pooled = c.dim * c.max_seq_len if c.pooling == "flatten" else c.dim
        if c.dual:
            pooled *= 4
        if c.head_hidden:
            self.head = nn.Sequential(nn.Linear(pooled, c.head_hidden), nn.ReLU(), nn.Linear(c.head_hidden, c.num_classes))
        else:
            self.head = nn.Linear(pooled, c.num_classes)

    def _check(self, x: Tensor, mask: Tensor | None) -> None:
        c = self.config
        if c.vocab_size is not None:
            if x.dim() != 2 or x.dtype not in (torch.int64, torch.int32):
                raise ValueError(f"SequenceClassifier: expected int64 tokens of shape (B, N), got {tuple(x.shape)} {x.dtype}")
        elif x.dim() != 3 or x.shape[-1] != c.num_features or not x.is_floating_point():
            raise ValueError(
                f"SequenceClassifier: expected float features of shape (B, N, {c.num_features}), got {tuple(x.shape)} {x.dtype}"
            )
        if x.shape[1] == 0 or x.shape[1] > c.max_seq_len:
            raise ValueError(f"SequenceClassifier: expected 1..{c.max_seq_len} tokens, got {x.shape[1]}")
        if mask is not None and (mask.dtype != torch.bool or mask.shape != x.shape[:2]):
            raise ValueError(
                f"SequenceClassifier: expected mask of shape {tuple(x.shape[:2])} bool, got {tuple(mask.shape)} {mask.dtype}"
            )

    def encode(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """Pooled representation: (B, dim) or (B, dim · max_seq_len) for flatten pooling."""
        self._check(x, mask)
        c = self.config
        if c.pooling == "flatten" and x.shape[1] < c.max_seq_len:
            pad = c.max_seq_len - x.shape[1]
            x = F.pad(x, (0, pad) if x.dim() == 2 else (0, 0, 0, pad))
            if mask is None:
                mask = torch.ones(x.shape[0], c.max_seq_len - pad, dtype=torch.bool, device=x.device)
            mask = F.pad(mask, (0, pad), value=False)
        h = self.embed(x)
        if c.input_scale:
            h = h * math.sqrt(c.dim)
        if self.cls is not None:
            h = torch.cat([self.cls.expand(h.shape[0], -1, -1), h], dim=1)
            if mask is not None:
                mask = F.pad(mask, (1, 0), value=True)
        if self.pos is not None:
            h = h + self.pos[: h.shape[1]]
        h = self.encoder(self.drop(h), mask)
        if c.pooling == "cls":
            return h[:, 0]
        if c.pooling == "mean":
            if mask is None:
                return h.mean(dim=1)
            w = mask[:, :, None].to(h.dtype)
            return (h * w).sum(dim=1) / w.sum(dim=1).clamp_min(1.0)
        h = self.drop(F.gelu(h))
        if mask is not None:
            h = h * mask[:, :, None].to(h.dtype)
        return h.reshape(h.shape[0], -1)

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        x2: Tensor | None = None,
        mask2: Tensor | None = None,
    ) -> Tensor:
        u = self.encode(x, mask)
        if self.config.dual:
            if x2 is None:
                raise ValueError("SequenceClassifier: a dual model needs the second document x2")
            v = self.encode(x2, mask2)
            u = torch.cat([u, v, u * v, u - v], dim=-1)
        elif x2 is not None:
            raise ValueError("SequenceClassifier: x2 given to a single-document model")
        return self.head(u)
