"""Causal language model: token embedding, causal Transformer stack, tied output head.

The paper's WikiText-103 setting makes only the last layer primal (causal family), e.g.
``CausalLMConfig(vocab_size=V, attention=["softmax"] * 5 + ["primal"])``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from primal_attention.layers.primal import PrimalAttention, PrimalState
from primal_attention.layers.softmax import KVCache
from primal_attention.models.transformer import Activation, StackConfig
from primal_attention.models.dropout import Dropout


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


class LMDecodePlan(NamedTuple):
    """The decoding constants of a :class:`CausalLM` (:meth:`CausalLM.decode_plan`): the stack's fused
    plan (None: a block without the fused step) and a (D, V) contiguous copy of the tied head."""

    blocks: list[Any] | None
    head_t: Tensor
    #: ``id`` of the model it was built from: a state carried to another model rebuilds it.
    model_id: int = 0


class LMState(NamedTuple):
    """Decoding state of a :class:`CausalLM`: the next position and one state per block (a primal
    layer's O(1) :class:`~primal_attention.layers.primal.PrimalState`, a softmax layer's KV cache).

    ``plan``: the decoding constants (:meth:`CausalLM.decode_plan`), built at the sequence's first step
    without gradients and carried from step to step (None until then). Like the running sums and KV
    caches, they belong to the weights the sequence started with: after changing the parameters,
    start a new state (or prefill again).
    """

    position: int
    layers: list[Any]
    plan: LMDecodePlan | None = None


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
        self.decoder = c.stack(causal=True, max_seq_len=c.max_seq_len, norm_first=c.norm_first, activation=c.activation)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """x: (B, N) int64 tokens, mask: (B, N) bool or None -> logits (B, N, vocab_size)."""
        self._check_tokens(x, "CausalLM")
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
            self._check_state(state, tokens_t.shape[0])
        return self._step(tokens_t, state)

    def _check_state(self, state: LMState, batch: int) -> None:
        if not isinstance(state, LMState):
            raise TypeError(f"CausalLM.step: expected an LMState (or None to start), got {type(state).__name__}")
        position = state.position
        if isinstance(position, bool) or not isinstance(position, int) or position < 0:
            raise ValueError(f"CausalLM.step: expected state.position to be an int >= 0, got {position!r}")
        if position >= self.config.max_seq_len:
            raise ValueError(f"CausalLM.step: position {position} is past max_seq_len {self.config.max_seq_len}")
        if not isinstance(state.layers, (list, tuple)):
            raise TypeError(f"CausalLM.step: expected state.layers to be a list, got {type(state.layers).__name__}")
        blocks = self.decoder.blocks
        if len(state.layers) != len(blocks):
            raise ValueError(f"CausalLM.step: expected {len(blocks)} layer states, got {len(state.layers)}")
        for i, (layer, block) in enumerate(zip(state.layers, blocks)):
            want = PrimalState if isinstance(block.attn, PrimalAttention) else KVCache
            if not isinstance(layer, want):
                raise TypeError(f"CausalLM.step: block {i} ({type(block.attn).__name__}) expects a {want.__name__}, got "
                                f"{type(layer).__name__} (a state of another model, or swapped layers?)")
            if isinstance(layer, PrimalState):
                if not (isinstance(layer.total, Tensor) and isinstance(layer.count, Tensor)) or layer.total.dim() != 2 \
                        or layer.total.shape[0] != batch or layer.total.shape[1] != 2 * self.config.dim \
                        or tuple(layer.count.shape) != (batch,):
                    raise ValueError(f"CausalLM.step: block {i}'s PrimalState does not fit batch {batch} and width "
                                     f"{self.config.dim}")
                if batch and float(layer.count.max()) > position:
                    raise ValueError(f"CausalLM.step: state.position is {position} but block {i} has summed "
                                     f"{float(layer.count.max()):.0f} tokens (a state of another sequence, or an edited one?)")
            # A KV cache holds one entry per token so far: its length is the position (read from
            # the shape, so no wait for the device).
            elif isinstance(layer.k, Tensor) and layer.k.dim() == 4 and layer.k.shape[2] != position:
                raise ValueError(f"CausalLM.step: state.position is {position} but block {i}'s KV cache holds "
                                 f"{layer.k.shape[2]} tokens (a state of another sequence, or an edited one?)")

    def _step(self, tokens_t: Tensor, state: LMState | None) -> tuple[Tensor, LMState]:
        """:meth:`step` without its checks (for callers whose tokens and states are their own). Without
        gradients the state carries the decoding plan (:meth:`decode_plan`, built at its first such
        step): every block takes its fused step (:meth:`TransformerStack.step`) and the logits come
        from a contiguous copy of the head."""
        position = 0 if state is None else state.position
        weight = self.embed.weight
        h = torch.add(self.pos[position], F.embedding(tokens_t, weight), alpha=self.embed_scale)
        layers = None if state is None else state.layers
        if torch.is_grad_enabled():
            h, layers = self.decoder.step(h, layers)
            return h @ weight.T, LMState(position + 1, layers)
        plan = self._plan_for(state)
        h, layers = self.decoder.step(h, layers, plans=plan.blocks)
        return h @ plan.head_t, LMState(position + 1, layers, plan)

    def _plan_for(self, state: LMState | None) -> LMDecodePlan:
        """The state's decoding plan when it was built from this model, else a new one."""
        plan = None if state is None else state.plan
        return plan if plan is not None and plan.model_id == id(self) else self.decode_plan()

    def decode_plan(self) -> LMDecodePlan:
        """The decoding constants for one decoding loop whose weights do not change: the stack's fused
        plan (:meth:`TransformerStack.decode_plan`) and a (D, V) contiguous copy of the tied head (a
        one-row matmul reads it faster than ``embed.weight.T``); no gradient."""
        with torch.no_grad():
            return LMDecodePlan(self.decoder.decode_plan(), self.embed.weight.detach().t().contiguous(), id(self))

    def prefill(self, prompt: Tensor, mask: Tensor | None = None, *, chunk_size: int | None = None,
                logits: Literal["all", "last"] = "all") -> tuple[Tensor, LMState]:
        """The prompt (B, N0) int64 through the model -> its logits and the decoding state after it.

        chunk_size: feed the prompt ``chunk_size`` tokens at a time, each chunk after the state of the
        previous ones (the blocks' ``extend``); None: one chunk. The results equal the one-chunk
        prefill; with ``logits="last"`` an all-primal model's peak memory then depends on the chunk,
        not on N0 (softmax layers still keep N0 keys and values).
        logits: "all" -> (B, N0, V), the eval-mode forward's; "last" -> (B, V), those of each row's last
        real token (what decoding continues from) without forming the others.
        mask (B, N0) bool marks the real tokens (True); the primal states sum only those, while a KV
        cache keeps every position (a decoding session masks the padding: :meth:`generate` with
        ``lengths``)."""
        self._check_eval("prefill")
        self._check_tokens(prompt, "CausalLM.prefill")
        if logits not in ("all", "last"):
            raise ValueError(f"CausalLM.prefill: logits must be 'all' or 'last', got {logits!r}")
        batch, n0 = prompt.shape
        if mask is not None and (mask.dtype != torch.bool or tuple(mask.shape) != (batch, n0)):
            raise ValueError(f"CausalLM.prefill: expected mask ({batch}, {n0}) bool, got {tuple(mask.shape)} {mask.dtype}")
        chunk = n0 if chunk_size is None else chunk_size
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise ValueError(f"CausalLM.prefill: chunk_size must be an int >= 1 or None, got {chunk_size!r}")
        weight = self.embed.weight
        if mask is None:
            last_index = torch.full((batch,), n0 - 1, device=prompt.device)
        else:
            positions = torch.arange(n0, device=prompt.device).expand(batch, n0)
            last_index = torch.where(mask, positions, 0).amax(dim=1)
        states, outs, last = None, [], None
        for start in range(0, n0, chunk):
            end = min(n0, start + chunk)
            h = self.embed(prompt[:, start:end]) * self.embed_scale + self.pos[start:end]
            past_mask = None if mask is None or start == 0 else mask[:, :start]
            h, states = self.decoder.extend(h, states, None if mask is None else mask[:, start:end], past_mask)
            if logits == "all":
                outs.append(h @ weight.T)
                continue
            inside = (last_index >= start) & (last_index < end)  # rows whose last real token is in this chunk
            rows = h[torch.arange(batch, device=h.device), (last_index - start).clamp(0, end - start - 1)]
            last = rows if last is None else torch.where(inside[:, None], rows, last)
        out = torch.cat(outs, dim=1) if logits == "all" else last @ weight.T
        return out, LMState(n0, states)

    def _check_tokens(self, x: Tensor, where: str) -> None:
        """One clear error for tokens that are not (B, N) int64 ids in the vocabulary within max_seq_len."""
        if not isinstance(x, Tensor) or x.dim() != 2 or x.dtype != torch.int64:
            raise ValueError(f"{where}: expected int64 tokens (B, N), got "
                             f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__} "
                             f"{x.dtype if isinstance(x, Tensor) else ''}".rstrip())
        if not 0 < x.shape[1] <= self.config.max_seq_len:
            raise ValueError(f"{where}: expected 1..{self.config.max_seq_len} tokens, got {x.shape[1]}")
        if x.numel() and (int(x.min()) < 0 or int(x.max()) >= self.config.vocab_size):
            raise ValueError(f"{where}: token ids must be in [0, {self.config.vocab_size}), got "
                             f"[{int(x.min())}, {int(x.max())}]")

    def decode_session(self, state: LMState | None, batch: int, capacity: int, *,
                       lengths: Tensor | None = None) -> LMDecodeSession:
        """A preallocated, in-place decoding loop for ``capacity`` more tokens after ``state`` (None:
        empty): ``session.step(tokens_t)`` -> logits, as :meth:`step` but without copying a KV cache
        per token. ``lengths`` (B,) int64: the real lengths of right-padded prompts (see :meth:`generate`).
        Eval mode, under no_grad / inference_mode."""
        self._check_eval("decode_session")
        return LMDecodeSession(self, state, batch, capacity, lengths)

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
        decoding runs a preallocated :meth:`decode_session` (primal sums and key / value buffers
        updated in place). Nothing of it stays on the model afterwards.
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
            next_logits, state = self.prefill(prompt, mask, chunk_size=prefill_chunk_size, logits="last")
            session = self.decode_session(state, batch, max_new_tokens, lengths=lengths)
            new = []
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
                new.append(token)
                if i + 1 < max_new_tokens:
                    next_logits = session.step(token)
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


class LMDecodeSession:
    """:meth:`CausalLM.decode_session`: token embedding, a :class:`DecodeSession` of the stack (or, for
    a stack without the fused step, :meth:`CausalLM.step`), tied output head."""

    def __init__(self, model: CausalLM, state: LMState | None, batch: int, capacity: int,
                 lengths: Tensor | None) -> None:
        self.model = model
        position = 0 if state is None else state.position
        if position + capacity > model.config.max_seq_len:
            raise ValueError(f"CausalLM.decode_session: position {position} + {capacity} tokens exceeds max_seq_len "
                             f"{model.config.max_seq_len}")
        p = model.embed.weight
        self.weight, self.scale, self.pos = p, model.embed_scale, model.pos
        plan = None if torch.is_grad_enabled() else model._plan_for(state)
        self.head = p.T if plan is None else plan.head_t
        self.index = None if lengths is None else lengths.clone()  # per-sequence next position
        self.position = position
        self.state = state if plan is None or state is None else state._replace(plan=plan)
        self.session = None
        if plan is not None and p.dtype in (torch.float32, torch.float64) and plan.blocks is not None:
            key_mask = None
            if lengths is not None:
                key_mask = torch.arange(position, device=p.device)[None, :] < lengths[:, None]
            self.session = model.decoder.decode_session(None if state is None else state.layers, batch, capacity,
                                                        key_mask=key_mask, plans=plan.blocks)
        elif lengths is not None:
            raise TypeError("CausalLM.decode_session: per-sequence lengths need the fused step "
                            "(causal primal / softmax blocks, float32 / float64, under no_grad)")

    def step(self, tokens_t: Tensor) -> Tensor:
        """tokens_t (B,) int64 -> logits (B, V) for the next token; the state advances in place."""
        if self.session is None:
            logits, self.state = self.model._step(tokens_t, self.state)
            return logits
        pos = self.pos[self.position] if self.index is None else self.pos[self.index]
        h = torch.add(pos, F.embedding(tokens_t, self.weight), alpha=self.scale)
        self.position += 1
        if self.index is not None:
            self.index.add_(1)
        return self.session.step(h) @ self.head
