"""Decoding state of primal layers inside a Hugging Face ``Cache``.

A causal primal layer needs, per sequence, only the running sum of ``[q | k]`` over the real tokens
seen so far and their count (docs/method.md §3, :class:`~primal_attention.PrimalState`): 2D + 1
numbers whatever the context length. :class:`PrimalCacheLayer` holds that state in one slot of an
HF :class:`~transformers.Cache` (``DynamicCache``), so ``model.generate(use_cache=True)`` works
unchanged while softmax layers of the same model keep their growing key/value layers.

Why not ``transformers.cache_utils.LinearAttentionLayer``: it is not a ``CacheLayerMixin``, and
HF's mask helpers ask the first attention-cache layer for the mask sizes, which raises for a cache
made only of linear-attention layers (an all-primal model). :class:`PrimalCacheLayer` is a
``CacheLayerMixin`` that reports its token count, so the cache of an all-primal model works with
the mask and position code of every supported model.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicLayer, EncoderDecoderCache

from primal_attention.layers.cache import nbytes_of
from primal_attention.layers.window import WindowDecodePlan, WindowState
from primal_attention.ops.primal.decode import PrimalDecodePlan, PrimalState


class PrimalCacheLayer(CacheLayerMixin):
    """One primal layer's O(1) decoding state: ``PrimalState(total (B, 2D), count (B,))`` (a window +
    primal layer's ``WindowState``: those sums and a ring of the last w keys and values) and the
    number of positions seen (padding included, as HF counts positions).

    Key/value updates are refused (they belong to softmax layers). Beam search reordering and batch
    expansion are supported; cropping (assisted / speculative decoding) is not: running sums cannot
    be rolled back.
    """

    is_compileable = False
    is_croppable = False
    is_sliding = False
    supports_early_init = False

    def __init__(self) -> None:
        super().__init__()
        self.state: PrimalState | WindowState | None = None
        self.plan: PrimalDecodePlan | WindowDecodePlan | None = None  # the layer's fused decoding constants, set at the first step
        self.seen_tokens = 0
        self.device: torch.device | None = None
        #: every self-attention of the model is primal: the mask HF builds from this slot need only cover the
        #: new tokens (a primal layer reads their padding, nothing of the past), not every position seen
        self.query_only_mask = False

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        raise TypeError("PrimalCacheLayer holds a primal layer's running sums, not keys and values")

    def update(self, key_states: Tensor, value_states: Tensor, *args: object, **kwargs: object) -> tuple[Tensor, Tensor]:
        raise TypeError(
            "PrimalCacheLayer holds a primal layer's running sums; key/value updates belong to softmax layers "
            "(is a softmax attention using a primal layer's index?)"
        )

    def update_state(self, state: PrimalState | WindowState, new_tokens: int) -> None:
        """Store the state after ``new_tokens`` more positions."""
        self.state = state
        self.seen_tokens += new_tokens
        self.device = state.total.device
        self.is_initialized = True

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """(kv_length, kv_offset) of the mask HF builds from this layer: every position seen plus the new ones,
        or, in a model whose layers are all primal, the new ones only (offset by the positions seen), so that
        a decoding step's mask is O(1), not O(N)."""
        if self.query_only_mask:
            return query_length, self.seen_tokens
        return self.seen_tokens + query_length, 0

    def get_seq_length(self) -> int:
        return self.seen_tokens

    def get_max_length(self) -> int:
        return -1

    def nbytes(self) -> int:
        """Bytes held: the running sums and, once decoding has started, the layer's fused step plan
        (rearranged weight copies, 4·D² numbers: constant in the context length, but not free)."""
        return nbytes_of(self.state) + nbytes_of(self.plan)

    def reset(self) -> None:
        self.state = None
        self.plan = None
        self.seen_tokens = 0
        self.is_initialized = False

    def _map(self, fn: Callable[[Tensor], Tensor]) -> None:
        if self.state is not None:
            self.state = type(self.state)(*(fn(t) if isinstance(t, Tensor) else t for t in self.state))

    def offload(self) -> None:
        self._map(lambda t: t.to("cpu", non_blocking=True))

    def prefetch(self) -> None:
        if self.device is not None:
            self._map(lambda t: t.to(self.device, non_blocking=True))

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._map(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: Tensor) -> None:
        self._map(lambda t: t[indices])

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove != 0:
            raise RuntimeError(
                "PrimalCacheLayer: a primal layer keeps running sums and cannot be cropped "
                "(assisted / speculative decoding is not supported with primal layers)"
            )


def primal_cache_layer(cache: Cache, layer_idx: int) -> PrimalCacheLayer:
    """The :class:`PrimalCacheLayer` at ``layer_idx`` of an HF cache, put there on first use.

    A ``DynamicCache`` (built by ``generate`` or by the model) starts with an empty ``DynamicLayer``
    in every slot, or with no slots yet; the first call of the primal layer replaces its slot.
    """
    if isinstance(cache, EncoderDecoderCache):
        cache = cache.self_attention_cache
    if not isinstance(cache, Cache):
        raise TypeError(f"primal layer {layer_idx}: expected a transformers Cache, got {type(cache).__name__}")
    while len(cache.layers) <= layer_idx:
        make = cache.layer_class_to_replicate or DynamicLayer
        cache.layers.append(make())
    layer = cache.layers[layer_idx]
    if isinstance(layer, PrimalCacheLayer):
        return layer
    if type(layer) is DynamicLayer and not layer.is_initialized:
        layer = PrimalCacheLayer()
        cache.layers[layer_idx] = layer
        return layer
    raise TypeError(
        f"primal layer {layer_idx}: its cache slot holds a {type(layer).__name__}; primal layers decode with a "
        "DynamicCache (the default of generate), not static or quantized caches"
    )


def cache_nbytes(cache: Cache) -> int:
    """Bytes of every tensor an HF cache holds: keys and values of softmax layers, running sums and
    decode plans of primal ones."""
    if isinstance(cache, EncoderDecoderCache):
        return cache_nbytes(cache.self_attention_cache) + cache_nbytes(cache.cross_attention_cache)
    total = 0
    for layer in cache.layers:
        if isinstance(layer, PrimalCacheLayer):
            total += layer.nbytes()
            continue
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, Tensor):
                total += t.numel() * t.element_size()
    return total
