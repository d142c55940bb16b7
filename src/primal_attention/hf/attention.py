"""The module that takes the place of an HF self-attention: HF's calling convention around PrimalAttention.

HF (transformers 5.x) calls a layer's attention as ``attn(hidden_states, attention_mask, cache=...,
position_embeddings=..., **kwargs)`` and expects ``(output, attention_weights)`` back. The attention
mask it passes is already prepared for softmax kernels: None (no padding), a (B, 1, Nq, Nk) bool
(True = attend) or additive float mask, or the raw (B, Nk) padding mask for flash-attention.
:func:`padding_mask` turns any of these back into the (B, Nq) key-padding mask a primal layer takes,
and refuses masks that are not "causal and padding" (packed sequences, custom 4-D masks), which a
primal layer cannot express.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from primal_attention.hf.cache import primal_cache_layer
from primal_attention.hf.architectures import RotaryFn
from primal_attention.layers.primal import PrimalAttention, QKTransform
from primal_attention.layers.window import WindowPrimalAttention
from primal_attention.ops.segments import segments_from_cu_seqlens


def packed_segments(position_ids: Any, query_length: int) -> Tensor | None:
    """Document ids (B, N) of a padding-free packed batch (HF / TRL: position ids that restart within a
    row), or None when every row's position ids run on by one (one document per row)."""
    if not isinstance(position_ids, Tensor) or position_ids.dim() != 2 or position_ids.shape[-1] != query_length \
            or query_length < 2 or position_ids.is_meta:
        return None
    restart = position_ids[:, 1:] != position_ids[:, :-1] + 1
    if not bool(restart.any()):
        return None
    return torch.cat([torch.zeros_like(restart[:, :1]), restart], dim=1).long().cumsum(dim=1)


def padding_mask(attention_mask: Any, query_length: int, *, causal: bool,
                 segments: Tensor | None = None) -> Tensor | None:
    """(B, Nq) bool, True = real token, for the Nq newest tokens; None when every token is real.

    attention_mask: what HF passes to attention modules: None, (B, Nk) 0/1 or bool, or
    (B, 1 or H, Nq, Nk) bool (True = attend) / float (0 = attend, very negative = masked).
    Nk ≥ Nq counts cached positions first. Raises ValueError for a 4-D mask that is not the causal
    (decoders) or all-rows-equal (encoders) mask of a key-padding mask; with ``segments`` (the
    document ids of packed rows, :func:`packed_segments`) the causal mask within each document is
    accepted too.
    """
    if attention_mask is None:
        return None
    if not isinstance(attention_mask, Tensor):
        raise TypeError(f"primal layer: expected the attention mask as a tensor, got {type(attention_mask).__name__}; "
                        "use attn_implementation='sdpa' or 'eager'")
    if attention_mask.is_meta:
        return None  # meta tensors (shape tracing, memory estimates) carry no values to read a mask from
    if attention_mask.dim() == 2:
        keys = attention_mask.bool()
    elif attention_mask.dim() == 4:
        if attention_mask.dtype == torch.bool:
            allowed = attention_mask
        else:
            allowed = attention_mask > torch.finfo(attention_mask.dtype).min / 2
        keys = allowed.any(dim=2).any(dim=1)  # (B, Nk): a key some query may attend is a real token
        n_q, n_k = allowed.shape[-2:]
        expected = keys[:, None, None, :].expand(allowed.shape)
        if causal:
            order = torch.ones(n_q, n_k, dtype=torch.bool, device=keys.device).tril(diagonal=n_k - n_q)
            expected = expected & order
        if not torch.equal(allowed, expected) and not (
                segments is not None and n_q == n_k
                and torch.equal(allowed, expected & (segments[:, None, :, None] == segments[:, None, None, :]))):
            raise ValueError(
                "primal layer: the attention mask is not a " + ("causal " if causal else "")
                + "key-padding mask (packed sequences, a sliding window or a custom 4-D mask?); a primal layer "
                "takes only a (B, N) padding mask"
            )
    else:
        raise ValueError(f"primal layer: expected a 2-D or 4-D attention mask, got shape {tuple(attention_mask.shape)}")
    if keys.shape[-1] < query_length:
        raise ValueError(f"primal layer: attention mask covers {keys.shape[-1]} positions, fewer than the "
                         f"{query_length} new tokens")
    real = keys[:, -query_length:]
    return None if bool(real.all()) else real


def rotary_transform(apply: RotaryFn, cos: Tensor, sin: Tensor, heads: int) -> QKTransform:
    """A PrimalAttention ``qk_transform`` applying HF's RoPE to ``[q | k]`` (B, N, 2D), head by head.

    cos, sin: (B or 1, N, d) as HF's rotary embedding returns them for these N positions.
    """

    def transform(qk: Tensor) -> Tensor:
        batch, n, two_dim = qk.shape
        d = two_dim // (2 * heads)
        q, k = qk.view(batch, n, 2, heads, d).transpose(1, 3).unbind(dim=2)  # (B, H, N, d) each
        q, k = apply(q, k, cos, sin)
        return torch.stack([q, k], dim=2).transpose(1, 3).reshape(batch, n, two_dim)

    return transform


class PrimalSelfAttention(nn.Module):
    """A :class:`~primal_attention.PrimalAttention` (or :class:`~primal_attention.WindowPrimalAttention`)
    behind HF's self-attention calling convention.

    forward(hidden_states (B, N, D), attention_mask (see :func:`padding_mask`), cache (HF Cache or
    None), position_embeddings ((cos, sin), each (B, N, d), RoPE models only)) -> (out (B, N, D), None).

    Causal layers with a cache keep their O(1) decoding state in a
    :class:`~primal_attention.hf.cache.PrimalCacheLayer` at ``layer_idx``: a call of several tokens
    (the prompt, or each chunk of a chunked prefill) advances it with ``PrimalAttention.extend``, a
    call of one token with ``PrimalAttention.step`` (with ``decode_plan=True``, its fused plan, built at
    the first such call without gradients, is kept in the slot and counted by ``cache_nbytes``).
    There is no attention matrix: ``output_attentions=True`` raises a ValueError.
    """

    def __init__(self, primal: PrimalAttention | WindowPrimalAttention, *, layer_idx: int, rotary: RotaryFn | None = None,
                 resid_dropout: float = 0.0, decode_plan: bool = False) -> None:
        super().__init__()
        self.primal = primal
        self.layer_idx = layer_idx
        self.rotary = rotary
        self.resid_dropout = nn.Dropout(resid_dropout)
        self.is_causal = primal.causal
        self.decode_plan = decode_plan
        #: set by primalize: every self-attention of the model is primal (the cache's masks may then
        #: cover the new tokens only, see PrimalCacheLayer.get_mask_sizes)
        self.model_all_primal = False

    def forward(
        self,
        hidden_states: Tensor,
        attention_mask: Tensor | None = None,
        cache: Any = None,
        position_embeddings: tuple[Tensor, Tensor] | None = None,
        **kwargs: Any,
    ) -> tuple[Tensor, None]:
        if kwargs.get("output_attentions"):
            raise ValueError(OUTPUT_ATTENTIONS_ERROR)
        if kwargs.get("encoder_hidden_states") is not None:
            raise ValueError("primal layer: cross-attention (encoder_hidden_states) is not supported")
        if cache is None:
            cache = kwargs.get("past_key_values")
        if cache is not None and self.primal.causal:
            primal_cache_layer(cache, self.layer_idx)  # a static / quantized cache: one clear error, before the mask
        x = hidden_states
        n = x.shape[1]
        segments = packed_segments(kwargs.get("position_ids"), n) if self.primal.causal else None
        cu_seqlens = kwargs.get("cu_seq_lens_q")
        if segments is None and self.primal.causal and isinstance(cu_seqlens, Tensor) and x.shape[0] == 1 \
                and cu_seqlens.numel() > 2:  # flash-attention's packed batch: one row, cumulative document lengths
            segments = segments_from_cu_seqlens(cu_seqlens, n)
        real = padding_mask(attention_mask, n, causal=self.primal.causal, segments=segments)
        if segments is not None and real is not None:
            segments = None  # left padding (position ids restarting at the first real token), not packing

        rotary = None
        if self.rotary is not None:
            if position_embeddings is None:
                raise ValueError("primal layer: this model applies RoPE; expected position_embeddings=(cos, sin)")
            rotary = position_embeddings
        if segments is not None:  # a padding-free packed batch (training): each document on its own
            if cache is not None and primal_cache_layer(cache, self.layer_idx).state is not None:
                raise ValueError("primal layer: packed sequences (position ids that restart within a row) cannot "
                                 "continue a decoding cache")
            out = self.primal(x, None, qk_transform=self._transform(rotary, slice(None)), segments=segments)
            return self.resid_dropout(out), None
        if cache is None or not self.primal.causal:
            out = self.primal(x, real, qk_transform=self._transform(rotary, slice(None)))
            return self.resid_dropout(out), None

        slot = primal_cache_layer(cache, self.layer_idx)
        slot.query_only_mask = self.model_all_primal
        transform = self._transform(rotary, slice(None))
        if n == 1 and slot.state is not None:
            if self.decode_plan and slot.plan is None and transform is None and not torch.is_grad_enabled():
                # the fused step's constants, for this generation (the weights do not change during it);
                # a RoPE model's step cannot take the fused path, so it builds none
                slot.plan = self.primal.decode_plan()
            out, state = self.primal.step(x[:, 0], slot.state, None if real is None else real[:, 0],
                                          qk_transform=transform, plan=slot.plan)
            out = out[:, None]
        else:
            # a prompt, or a chunk of one (HF's chunked prefill): every row at once after the state so far
            out, state = self.primal.extend(x, slot.state, real, qk_transform=transform)
        # The cache is for decoding: no gradient flows through it into a later call.
        slot.update_state(type(state)(*(t.detach() if isinstance(t, Tensor) else t for t in state)), n)
        return self.resid_dropout(out), None

    def _transform(self, rotary: tuple[Tensor, Tensor] | None, positions: slice) -> QKTransform | None:
        if rotary is None:
            return None
        cos, sin = rotary
        return rotary_transform(self.rotary, cos[:, positions], sin[:, positions], self.primal.num_heads)

    def extra_repr(self) -> str:
        return f"layer_idx={self.layer_idx}, rope={self.rotary is not None}, decode_plan={self.decode_plan}"


OUTPUT_ATTENTIONS_ERROR = (
    "output_attentions=True is not available with primal layers: Primal-Attention forms no N×N attention "
    "matrix (set output_attentions=False)"
)
