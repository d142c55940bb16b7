"""Causal language model: token embedding, causal Transformer stack, tied output head.

The paper's WikiText-103 setting makes only the last layer primal (causal family), e.g.
``CausalLMConfig(vocab_size=V, attention=["softmax"] * 5 + ["primal"])``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from primal_attention.layers.cache import DecodeCache
from primal_attention.layers.checks import check_segments
from primal_attention.models.transformer import Activation, StackConfig
from primal_attention.models.dropout import Dropout
from primal_attention.ops.segments import segment_starts


class TokenPlan(NamedTuple):
    """What a decoding loop's step of a :class:`CausalLM` reads, gathered once (``DecodeCache.head_plan``):
    the tied embedding (V, D) and positions (the parameters), and the head as a (D, V) contiguous copy
    (None under autograd or in a low-precision dtype: ``embed.T`` then)."""

    embed: Tensor
    pos: Tensor
    head_t: Tensor | None


@dataclass(kw_only=True)
class CausalLMConfig(StackConfig):
    """Everything that defines a :class:`CausalLM`: the stack of :class:`StackConfig` (here D 512, H 8,
    FFN 2048, five softmax layers and one causal primal layer, dropout 0.1) and the LM's own fields."""

    vocab_size: int
    max_seq_len: int = 512
    dim: int = 512
    num_heads: int = 8
    ffn_dim: int = 2048
    attention: list[str] = field(default_factory=lambda: ["softmax"] * 5 + ["primal"])
    dropout: float = 0.1
    #: pre-norm blocks with a final LayerNorm (True) or post-norm (False, fairseq's transformer_lm).
    norm_first: bool = True
    #: FFN activation: "gelu" or "relu" (fairseq's transformer_lm).
    activation: Activation = "gelu"

    def __post_init__(self) -> None:
        super().__post_init__()
        for key in ("vocab_size", "max_seq_len"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < (2 if key == "vocab_size" else 1):
                raise ValueError(f"CausalLMConfig: {key} must be a positive int (vocab_size >= 2), got {value!r}")


class CausalLM(nn.Module):
    """forward(tokens (B, N) int64, mask=None) -> logits (B, N, vocab_size); loss() gives the NLL.

    Decoding is the forward with a :class:`~primal_attention.layers.cache.DecodeCache` (one object
    passed down the stack, each module updating its own part): :meth:`prefill` (a prompt, in chunks
    if asked, returning the cache), :meth:`step` (one token) and :meth:`generate`. They equal the
    eval-mode forward at every position: prefill and step raise a RuntimeError in training mode
    (call ``model.eval()``); generate switches to eval and back. Positions are learned up to
    ``max_seq_len``, so decoding stops there.
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
        self.decoder = c.stack(causal=True, max_seq_len=c.max_seq_len, norm_first=c.norm_first, activation=c.activation)

    def forward(self, x: Tensor, mask: Tensor | None = None, *, cache: DecodeCache | None = None,
                segments: Tensor | None = None) -> Tensor:
        """x: (B, N) int64 tokens, mask: (B, N) bool or None -> logits (B, N, vocab_size).

        cache: decoding in eval mode (:class:`~primal_attention.layers.cache.DecodeCache`, updated in
        place; a new one starts a sequence): x is the next chunk after the positions in it, and the
        logits equal those of the forward over the whole sequence so far (a token's position is its
        column, or its row's own after a right-padded prompt: see :meth:`prefill`).
        segments: packed documents, (B, N) integer document ids (each document one run of equal ids):
        positions restart at each document's first token and every layer keeps to its document, so
        each document's logits equal those of the model over that document alone (not with a cache).
        """
        if cache is not None and not isinstance(cache, DecodeCache):
            raise TypeError(f"CausalLM: expected a DecodeCache (or None), got {type(cache).__name__}")
        start = 0 if cache is None else cache.length
        self._check_tokens(x, "CausalLM", start)
        if segments is not None:
            if cache is not None:
                raise ValueError("CausalLM: segments (packed documents) are not for decoding with a cache")
            check_segments(segments, x[..., None], True, "CausalLM")
            steps = torch.arange(x.shape[1], device=x.device).expand_as(x)
            h = self.drop(self.embed(x) * self.embed_scale + self.pos[steps - segment_starts(segments)])
            return self.decoder(h, mask, segments=segments) @ self.embed.weight.T
        if cache is None:
            h = self.drop(self.embed(x) * self.embed_scale + self.pos[: x.shape[1]])
            return self.decoder(h, mask) @ self.embed.weight.T
        self._check_eval("forward with a cache")
        return self._head(self._hidden(x, mask, cache), cache)

    def _hidden(self, x: Tensor, mask: Tensor | None, cache: DecodeCache) -> Tensor:
        """The final hidden states (B, T, D) of the chunk x (B, T) after the cache's positions (unchecked)."""
        steps = x.shape[1]
        if cache.next_position is None:
            pos = self.pos[cache.length: cache.length + steps]
        else:
            pos = self.pos[cache.positions(steps, x.device)]
        h = torch.add(pos, F.embedding(x, self.embed.weight), alpha=self.embed_scale)
        return self.decoder(h, mask, cache=cache)

    def _next_logits(self, tokens_t: Tensor, cache: DecodeCache) -> Tensor:
        """Logits (B, V) after one more token tokens_t (B,) (unchecked): the stack's ``decode_token``
        and the cache's copy of the head, the path of a decoding loop."""
        plan = cache.head_plan
        if plan is None or torch.is_grad_enabled():
            plan = self._token_plan(cache)
        pos = plan.pos.select(0, cache.length) if cache.next_position is None else plan.pos[cache.next_position]
        # index_select is the embedding lookup (F.embedding without its options' overhead)
        h = self.decoder.decode_token(torch.add(pos, plan.embed.index_select(0, tokens_t), alpha=self.embed_scale), cache)
        return torch.mm(h, plan.head_t) if plan.head_t is not None else h @ plan.embed.T

    def _token_plan(self, cache: DecodeCache) -> TokenPlan:
        """The LM's part of a decoding loop's constants (kept in ``cache.head_plan`` without gradients)."""
        weight = self.embed.weight
        if torch.is_grad_enabled() or weight.dtype not in (torch.float32, torch.float64):
            return TokenPlan(weight, self.pos, None)
        cache.head_plan = TokenPlan(weight, self.pos, weight.detach().t().contiguous())
        return cache.head_plan

    def _head(self, h: Tensor, cache: DecodeCache) -> Tensor:
        """Logits of hidden states h (B, T, D); one row without gradients reads the cache's (D, V) copy
        of the tied head (a one-row matmul reads it faster than ``embed.weight.T``)."""
        if h.shape[1] == 1 and not torch.is_grad_enabled():
            plan = cache.head_plan if cache.head_plan is not None else self._token_plan(cache)
            if plan.head_t is not None:
                return torch.mm(h[:, 0], plan.head_t)[:, None]
        return h @ self.embed.weight.T

    def loss(self, tokens: Tensor, reduction: str = "mean") -> Tensor:
        """Next-token NLL of tokens[:, 1:] given tokens[:, :-1]."""
        logits = self(tokens[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1), reduction=reduction)

    def step(self, tokens_t: Tensor, cache: DecodeCache | None = None) -> tuple[Tensor, DecodeCache]:
        """tokens_t (B,) int64 after the positions in ``cache`` (None: a new cache) -> logits (B, V) for
        the next token, and the cache, updated in place (``cache.copy()`` first to branch a sequence)."""
        if not isinstance(tokens_t, Tensor) or tokens_t.dim() != 1:
            raise ValueError(f"CausalLM.step: expected int64 tokens (B,), got "
                             f"{tuple(tokens_t.shape) if isinstance(tokens_t, Tensor) else type(tokens_t).__name__}")
        if cache is not None and not isinstance(cache, DecodeCache):
            raise TypeError(f"CausalLM.step: expected a DecodeCache (or None to start), got {type(cache).__name__}")
        cache = DecodeCache() if cache is None else cache
        if self.training:
            self._check_eval("step")
        if tokens_t.dtype != torch.int64 or cache.length >= self.config.max_seq_len:
            self._check_tokens(tokens_t[:, None], "CausalLM.step", cache.length)  # says why
        if not tokens_t.is_cpu:  # an id out of range would be a device-side assert there
            self._check_tokens(tokens_t[:, None], "CausalLM.step", cache.length)
            return self._next_logits(tokens_t, cache), cache
        try:  # on the CPU the lookup itself refuses an id out of range, before the cache changes
            return self._next_logits(tokens_t, cache), cache
        except IndexError:
            self._check_tokens(tokens_t[:, None], "CausalLM.step", cache.length)
            raise

    def prefill(self, prompt: Tensor, mask: Tensor | None = None, *, chunk_size: int | None = None,
                logits: Literal["all", "last"] = "all", capacity: int | None = None) -> tuple[Tensor, DecodeCache]:
        """The prompt (B, N0) int64 through the model -> its logits and the decoding cache after it.

        chunk_size: feed the prompt ``chunk_size`` tokens at a time, each chunk after the cache of the
        previous ones; None: one chunk. The results equal the one-chunk prefill; with ``logits="last"``
        an all-primal model's peak memory then depends on the chunk, not on N0 (softmax layers still
        keep N0 keys and values).
        logits: "all" -> (B, N0, V), the eval-mode forward's; "last" -> (B, V), those of each row's last
        real token (what decoding continues from) without forming the others.
        mask (B, N0) bool marks the real tokens (True): the primal sums leave the padding out, softmax
        layers keep its columns masked, and decoding continues each row at the position after its
        last real token (a right-padded prompt: at its length, as if it had been alone). capacity: the positions expected in all (prompt + new tokens), so that key /
        value buffers are allocated once (None: they grow by doubling)."""
        self._check_eval("prefill")
        self._check_tokens(prompt, "CausalLM.prefill")
        if logits not in ("all", "last"):
            raise ValueError(f"CausalLM.prefill: logits must be 'all' or 'last', got {logits!r}")
        batch, n0 = prompt.shape
        if mask is not None and (not isinstance(mask, Tensor) or mask.dtype != torch.bool
                                 or tuple(mask.shape) != (batch, n0)):
            raise ValueError(f"CausalLM.prefill: expected mask ({batch}, {n0}) bool, got "
                             f"{tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__} "
                             f"{getattr(mask, 'dtype', '')}".rstrip())
        chunk = n0 if chunk_size is None else chunk_size
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise ValueError(f"CausalLM.prefill: chunk_size must be an int >= 1 or None, got {chunk_size!r}")
        if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < n0):
            raise ValueError(f"CausalLM.prefill: capacity must be an int >= the prompt length {n0}, got {capacity!r}")
        if mask is None:
            last_index = torch.full((batch,), n0 - 1, device=prompt.device)
        else:
            positions = torch.arange(n0, device=prompt.device).expand(batch, n0)
            last_index = torch.where(mask, positions, 0).amax(dim=1)
        cache, outs, last = DecodeCache(capacity), [], None
        for start in range(0, n0, chunk):
            end = min(n0, start + chunk)
            h = self._hidden(prompt[:, start:end], None if mask is None else mask[:, start:end], cache)
            if logits == "all":
                outs.append(h @ self.embed.weight.T)
                continue
            inside = (last_index >= start) & (last_index < end)  # rows whose last real token is in this chunk
            rows = h[torch.arange(batch, device=h.device), (last_index - start).clamp(0, end - start - 1)]
            last = rows if last is None else torch.where(inside[:, None], rows, last)
        out = torch.cat(outs, dim=1) if logits == "all" else last @ self.embed.weight.T
        if mask is not None and bool((last_index != n0 - 1).any()):
            cache.next_position = last_index + 1  # rows continue after their own last real token
        return out, cache

    def _check_tokens(self, x: Tensor, where: str, start: int = 0) -> None:
        """One clear error for tokens that are not (B, N) int64 ids in the vocabulary within max_seq_len
        (counting the ``start`` positions before them)."""
        if not isinstance(x, Tensor) or x.dim() != 2 or x.dtype != torch.int64:
            raise ValueError(f"{where}: expected int64 tokens (B, N), got "
                             f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__} "
                             f"{x.dtype if isinstance(x, Tensor) else ''}".rstrip())
        if not 0 < x.shape[1] <= self.config.max_seq_len - start:
            after = f" after {start} positions" if start else ""
            raise ValueError(f"{where}: expected 1..{self.config.max_seq_len - start} tokens{after} "
                             f"(max_seq_len {self.config.max_seq_len}), got {x.shape[1]}")
        if x.numel():
            low, high = torch.stack(torch.aminmax(x)).tolist()  # one transfer from the device
            if low < 0 or high >= self.config.vocab_size:
                raise ValueError(f"{where}: token ids must be in [0, {self.config.vocab_size}), got [{low}, {high}]")

    def _check_eval(self, method: str) -> None:
        if self.training:
            raise RuntimeError(f"CausalLM.{method}: decoding runs without dropout; call model.eval() first")

    @torch.no_grad()
    def generate(self, prompt: Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 generator: torch.Generator | None = None, lengths: Tensor | None = None, pad_id: int = 0,
                 prefill_chunk_size: int | None = None) -> Tensor:
        """Sample a continuation: prompt (B, N0) int64 -> (B, N0 + max_new_tokens).

        temperature 0 is greedy decoding, and a tiny positive one tends to it (never to NaN); top_k
        keeps the k most likely tokens before sampling. The model must be in eval mode (no dropout);
        it is put there and restored.

        lengths (B,) int64: prompts of different lengths, right-padded to N0; row b of the result is
        ``prompt[b, :lengths[b]]``, its ``max_new_tokens`` new tokens, then ``pad_id``. Each row equals
        generating that prompt alone (batch 1). The prompt goes through :meth:`prefill` in chunks of
        ``prefill_chunk_size`` tokens (None: one chunk), keeping only the last real token's logits;
        each new token then goes through the model's forward with the same
        :class:`~primal_attention.layers.cache.DecodeCache` (primal sums updated in place, key / value
        buffers allocated once). Nothing of it stays on the model afterwards.
        """
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
            raise ValueError(f"CausalLM.generate: max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        if prompt.dim() != 2:
            raise ValueError(f"CausalLM.generate: expected an int64 prompt (B, N0), got {tuple(prompt.shape)}")
        if prompt.shape[1] + max_new_tokens > self.config.max_seq_len:
            raise ValueError(f"CausalLM.generate: prompt length {prompt.shape[1]} + {max_new_tokens} new tokens "
                             f"exceeds max_seq_len {self.config.max_seq_len}")
        check_sampling("CausalLM.generate", temperature, top_k)
        batch, n0 = prompt.shape
        mask = None
        if lengths is not None:
            if lengths.shape != (batch,) or lengths.dtype != torch.int64:
                raise ValueError(f"CausalLM.generate: expected lengths ({batch},) int64, got {tuple(lengths.shape)} "
                                 f"{lengths.dtype}")
            if batch and (int(lengths.min()) < 1 or int(lengths.max()) > n0):
                raise ValueError(f"CausalLM.generate: lengths must be in [1, {n0}], got "
                                 f"[{int(lengths.min())}, {int(lengths.max())}]")
            lengths = lengths.to(prompt.device)
            mask = torch.arange(n0, device=prompt.device)[None, :] < lengths[:, None]
            if bool(mask.all()):
                lengths = mask = None
        was = self.training
        self.eval()
        try:
            next_logits, cache = self.prefill(prompt, mask, chunk_size=prefill_chunk_size, logits="last",
                                              capacity=n0 + max_new_tokens)
            new = []
            for i in range(max_new_tokens):
                token = sample_token(next_logits, temperature, top_k, generator)
                new.append(token)
                if i + 1 < max_new_tokens:
                    next_logits = self._next_logits(token, cache)
            if mask is None:
                return torch.cat([prompt, *(t[:, None] for t in new)], dim=1)
            out = torch.full((batch, n0 + max_new_tokens), pad_id, dtype=prompt.dtype, device=prompt.device)
            out[:, :n0] = torch.where(mask, prompt, torch.full_like(prompt, pad_id))
            if new:
                cols = lengths[:, None] + torch.arange(max_new_tokens, device=prompt.device)[None, :]
                out.scatter_(1, cols, torch.stack(new, dim=1))
            return out
        finally:
            self.train(was)


def check_sampling(where: str, temperature: float, top_k: int | None) -> None:
    """One-line errors for a sampling temperature that is not a finite number >= 0, or a top_k that is
    not a positive int (or None)."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
            or not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"{where}: temperature must be a finite number >= 0, got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k <= 0):
        raise ValueError(f"{where}: top_k must be an int > 0 or None, got {top_k!r}")


def sample_token(logits: Tensor, temperature: float, top_k: int | None = None,
                 generator: torch.Generator | None = None) -> Tensor:
    """The next token (B,) from logits (B, V): greedy at temperature 0, else sampled from the top_k
    (None: all) most likely at that temperature."""
    if temperature == 0:
        return logits.argmax(-1)
    # Shifted so the largest logit is 0 and divided by at least the dtype's smallest normal number: a
    # tiny temperature sends the others to -inf, never inf - inf = NaN.
    shifted = logits - logits.amax(-1, keepdim=True)
    scaled = shifted / max(temperature, torch.finfo(shifted.dtype).tiny)
    if top_k is not None:
        kth = scaled.topk(min(top_k, scaled.shape[-1]), dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    return torch.multinomial(scaled.softmax(-1), 1, generator=generator)[:, 0]
