"""Decoding state passed through a model's forward, as Hugging Face passes its ``Cache``.

A :class:`DecodeCache` holds one :class:`LayerCache` per block. A block hands its ``LayerCache`` to
its attention and its feed-forward, and each module reads and writes only its own named fields:

* ``attn``: the attention's state after the tokens so far: a causal primal layer's O(1) running
  sums (:class:`~primal_attention.ops.primal.decode.PrimalState`, whatever the context length) or a
  softmax layer's keys and values (:class:`KVBuffer`);
* ``attn_plan`` / ``ffn_plan``: the decoding constants a module builds from its weights at its first
  step without gradients (its matrices in the layout a one-row step reads fastest), kept for the
  decoding loop. They belong to the weights the sequence started with: after changing the
  parameters, start a new cache.

The cache itself keeps what the whole stack shares: the number of positions so far (``length``)
and, where rows continue at positions of their own (after right-padded prompts), each row's next
position (``next_position``), from which a model with learned positions places its next tokens. Everything in it is O(1) in the context
length except a softmax layer's keys and values.

Shapes: B the batch, T the tokens of a chunk, H heads of width d, L positions so far.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn


class KVBuffer:
    """Keys and values of a causal softmax layer, (B, H, L, d) each, in buffers filled column by
    column (no copy of the cache per token): they grow to ``capacity`` columns when one is given,
    else by doubling. ``real`` (B, L) bool marks the real columns once a padded chunk arrived
    (None: all real). Under autograd the buffers are concatenated instead (differentiable)."""

    def __init__(self, capacity: int | None = None) -> None:
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self.real: Tensor | None = None
        self.length = 0
        self.capacity = capacity

    @property
    def keys(self) -> Tensor | None:
        """(B, H, L, d) the keys so far (a view of the buffer), or None before the first chunk."""
        return None if self.k is None else self.k[:, :, : self.length]

    @property
    def values(self) -> Tensor | None:
        return None if self.v is None else self.v[:, :, : self.length]

    def past_mask(self) -> Tensor | None:
        """(B, L) bool: which of the L columns so far are real, or None when all are."""
        return None if self.real is None else self.real[:, : self.length]

    def append(self, k: Tensor, v: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Add T columns: k, v (B, H, T, d), mask (B, T) bool or None (all real) -> all keys and values
        so far, (B, H, L + T, d) each."""
        batch, _, steps, _ = k.shape
        end = self.length + steps
        if torch.is_grad_enabled() and (k.requires_grad or v.requires_grad):
            # under autograd: new tensors, so that the graph reaches the earlier keys
            self.k = k if self.k is None else torch.cat([self.keys, k], dim=2)
            self.v = v if self.v is None else torch.cat([self.values, v], dim=2)
        else:
            if self.k is None:
                columns = max(end, self.capacity or 0)
                self.k = k.new_empty(batch, k.shape[1], columns, k.shape[3])
                self.v = v.new_empty(batch, v.shape[1], columns, v.shape[3])
            elif end > self.k.shape[2]:
                self.k, self.v = self._grow(self.k, end), self._grow(self.v, end)
            self.k.narrow(2, self.length, steps).copy_(k)  # narrow: a cheaper call than slicing, per token
            self.v.narrow(2, self.length, steps).copy_(v)
        if mask is None and self.real is None:
            self.length = end
            return self.k.narrow(2, 0, end), self.v.narrow(2, 0, end)
        if mask is not None and self.real is None and not bool(mask.all()):
            self.real = torch.ones(batch, self.k.shape[2], dtype=torch.bool, device=k.device)
        if self.real is not None:
            if self.real.shape[1] < self.k.shape[2]:
                grown = torch.ones(batch, self.k.shape[2], dtype=torch.bool, device=k.device)
                grown[:, : self.length].copy_(self.real[:, : self.length])
                self.real = grown
            self.real[:, self.length:end] = True if mask is None else mask
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def _grow(self, buffer: Tensor, needed: int) -> Tensor:
        columns = max(needed, 2 * buffer.shape[2])
        grown = buffer.new_empty(buffer.shape[0], buffer.shape[1], columns, buffer.shape[3])
        grown[:, :, : self.length].copy_(buffer[:, :, : self.length])
        return grown

    def nbytes(self) -> int:
        """Bytes of the buffers (their whole capacity) and of the mask."""
        return sum(t.numel() * t.element_size() for t in (self.k, self.v, self.real) if t is not None)


@dataclass(eq=False)
class LayerCache:
    """One block's part of a :class:`DecodeCache`; each field is written by one module only."""

    #: the attention's state: ``PrimalState`` (causal primal) or :class:`KVBuffer` (softmax); None: empty.
    attn: Any = None
    #: the attention's decoding constants (``decode_plan()``), built at its first step without gradients.
    attn_plan: Any = None
    #: the feed-forward's decoding constants (``FeedForward.decode_plan()``).
    ffn_plan: Any = None
    #: the block's own decoding constants (``TransformerBlock.decode_plan()``: its norms, its modules' steps).
    block_plan: Any = None
    #: the positions expected in all (from :class:`DecodeCache`): a softmax layer allocates its buffers once.
    capacity: int | None = None

    def nbytes(self) -> int:
        """Bytes of every tensor held (state and constants)."""
        return (nbytes_of(self.attn) + nbytes_of(self.attn_plan) + nbytes_of(self.ffn_plan)
                + nbytes_of(self.block_plan))


@dataclass(eq=False)
class DecodeCache:
    """The decoding state of one batch of sequences through a causal :class:`~primal_attention.TransformerStack`
    (and the model around it): pass it to ``forward(..., cache=cache)``, which feeds the next chunk after
    the tokens already in it and updates it in place (``CausalLM.prefill`` / ``step`` / ``generate``
    make and pass one).

    capacity: the total positions expected (prompt + new tokens), so that softmax keys and values are
    allocated once; None: their buffers grow by doubling. Branch a sequence with :meth:`copy`.
    """

    capacity: int | None = None
    layers: list[LayerCache] = field(default_factory=list)
    #: positions so far (columns, padding included).
    length: int = 0
    #: (B,) int64 the position of each row's next token, where rows continue at their own (after a
    #: right-padded prompt, ``CausalLM.prefill`` sets each row's length); None: ``length`` for every row.
    next_position: Tensor | None = None
    #: the model's own decoding constants (a causal LM's output head in the layout a step reads fastest).
    head_plan: Any = None
    #: the stack's final norm for a step, ``(NormPlan or None,)``, read once.
    norm_plan: Any = None
    #: ``id`` of the stack it was started with: a cache is refused by any other.
    owner: int | None = None
    #: the stack's parameter dtype when the cache began, if float32 / float64 for every block and
    #: in training mode for none: one token then takes the fused ``decode_token`` path (None: never).
    dtype: torch.dtype | None = None
    #: the parameters' device type when the cache began ("cpu", "cuda", ...).
    device_type: str = "cpu"

    def bind(self, stack: Any, batch: int, where: str) -> list[LayerCache]:
        """The per-block caches for ``stack``: made at the first chunk, checked after it (same stack, batch)."""
        if self.owner == id(stack) and (self.next_position is None or self.next_position.shape[0] == batch):
            return self.layers  # the decoding loop's case: the layers check their own batch
        blocks = len(stack.blocks)
        if self.owner is None:
            if self.length:
                raise ValueError(f"{where}: this DecodeCache holds {self.length} positions but no layers")
            self.owner = id(stack)
            self.layers = [LayerCache(capacity=self.capacity) for _ in range(blocks)]
            dtypes = {p.dtype for p in stack.parameters()}
            self.device_type = next(stack.parameters()).device.type
            if len(dtypes) == 1 and dtypes <= {torch.float32, torch.float64} and not any(b.training for b in stack.blocks):
                self.dtype = dtypes.pop()
        elif self.owner != id(stack) or len(self.layers) != blocks:
            raise ValueError(f"{where}: this DecodeCache was started by another model; start a new one per model")
        if self.next_position is not None and self.next_position.shape[0] != batch:
            raise ValueError(f"{where}: this DecodeCache holds a batch of {self.next_position.shape[0]} sequences, "
                             f"got {batch}")
        return self.layers

    def positions(self, steps: int, device: torch.device) -> Tensor:
        """The positions of the next ``steps`` tokens: their columns (T,), or (B, T) from each row's
        ``next_position`` once rows continue at their own (see there)."""
        if self.next_position is None:
            return torch.arange(self.length, self.length + steps, device=device)
        return self.next_position[:, None] + torch.arange(steps, device=device)

    def advance(self, steps: int) -> None:
        """Count a chunk of ``steps`` positions as seen."""
        self.length += steps
        if self.next_position is not None:
            self.next_position = self.next_position + steps

    def copy(self) -> DecodeCache:
        """An independent cache at the same point (states cloned; constants shared): to branch a sequence."""
        new = DecodeCache(self.capacity, [], self.length,
                          None if self.next_position is None else self.next_position.clone(),
                          self.head_plan, self.norm_plan, self.owner, self.dtype, self.device_type)
        for layer in self.layers:
            new.layers.append(LayerCache(_clone(layer.attn), layer.attn_plan, layer.ffn_plan, layer.block_plan,
                                         layer.capacity))
        return new

    def plan_nbytes(self) -> int:
        """Bytes of the decoding constants alone (the modules' plans, the head): their rearranged copies of
        the weights; parameters they refer to as they are count 0."""
        return (sum(nbytes_of(layer.attn_plan) + nbytes_of(layer.ffn_plan) + nbytes_of(layer.block_plan)
                    for layer in self.layers)
                + nbytes_of(self.head_plan) + nbytes_of(self.norm_plan))

    def nbytes(self) -> int:
        """Bytes of every tensor the cache holds (states, decoding constants, counts)."""
        return (sum(layer.nbytes() for layer in self.layers) + nbytes_of(self.head_plan) + nbytes_of(self.norm_plan)
                + nbytes_of(self.next_position))


def _clone(state: Any) -> Any:
    if isinstance(state, KVBuffer):
        new = KVBuffer(state.capacity)
        if state.k is not None:
            new.k, new.v = state.k.clone(), state.v.clone()
            new.real = None if state.real is None else state.real.clone()
            new.length = state.length
        return new
    if isinstance(state, tuple):
        return type(state)(*(t.clone() if isinstance(t, Tensor) else t for t in state))
    return state


def nbytes_of(obj: Any) -> int:
    """Bytes of the tensors in obj (a tensor, a KVBuffer, a tuple of them, or None). A parameter that a
    plan refers to as it is (an embedding, a norm's weight, a bias) is the model's memory, not the
    cache's, and counts 0."""
    if obj is None or isinstance(obj, nn.Parameter):
        return 0
    if isinstance(obj, Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, KVBuffer):
        return obj.nbytes()
    if isinstance(obj, tuple):
        return sum(nbytes_of(t) for t in obj)
    return 0
