"""Canonical softmax attention, with the interface every attention layer here shares.

Built as ``Cls(embed_dim, num_heads, *, max_seq_len=None, dropout=0.0, bias=True, causal=False,
**options)`` and called as ``forward(x, mask=None)`` with x: (B, N, D) and mask: (B, N) bool,
True = real token. Padding output rows equal ``out_proj.bias``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from primal_attention.layers.cache import KVBuffer, LayerCache
from primal_attention.layers.checks import check_heads, check_input, check_segments, resolve_mask
from primal_attention.layers.registry import register_attention


class KVCache(NamedTuple):
    """Decoding state of a causal softmax layer: keys and values so far, (B, H, T, d) each."""

    k: Tensor
    v: Tensor


class SoftmaxDecodePlan(NamedTuple):
    """The fused decoding step of a causal softmax layer (:meth:`SoftmaxAttention.decode_plan`):
    qkv_t (D, 3D) ``[W_q; W_k; W_v]ᵀ``, qkv_bias (3D,) or None, out_t (D, D), out_bias (D,) or None."""

    qkv_t: Tensor
    qkv_bias: Tensor | None
    out_t: Tensor
    out_bias: Tensor | None
    heads: int
    head_dim: int


def fused_qkv(plan: SoftmaxDecodePlan, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v of one token x (B, D), each (B, H, 1, d), from one matmul (views of its output)."""
    qkv = torch.mm(x, plan.qkv_t) if plan.qkv_bias is None else torch.addmm(plan.qkv_bias, x, plan.qkv_t)
    return qkv.view(x.shape[0], 3, plan.heads, 1, plan.head_dim).unbind(1)


def fused_out(plan: SoftmaxDecodePlan, y: Tensor, residual: Tensor | None) -> Tensor:
    """out_proj of the attention output y (B, H, 1, d), plus ``residual`` (B, D) when given."""
    y = y.reshape(y.shape[0], -1)
    if residual is not None:
        out = torch.addmm(residual, y, plan.out_t)
        return out if plan.out_bias is None else out.add_(plan.out_bias)
    return torch.mm(y, plan.out_t) if plan.out_bias is None else torch.addmm(plan.out_bias, y, plan.out_t)


@register_attention("softmax")
class SoftmaxAttention(nn.Module):
    """Canonical multi-head softmax attention, ``softmax(q kᵀ / √d) v``.

    ``fused=True`` runs PyTorch's ``scaled_dot_product_attention`` (flash / memory-efficient kernels
    where available, no N×N matrix kept); ``fused=False`` materialises the N×N attention matrix,
    as the classic implementation and the paper's Transformer baseline do.

    Shapes: forward x (B, N, D), mask (B, N) bool (True = real token) -> (B, N, D). Padding keys get
    no weight; padding output rows are zeroed before out_proj (they equal ``out_proj.bias``).
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        max_seq_len: int | None = None,
        causal: bool = False,
        bias: bool = True,
        dropout: float = 0.0,
        fused: bool = True,
        check_finite: bool = False,
    ) -> None:
        super().__init__()
        check_heads(embed_dim, num_heads, type(self).__name__)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"{type(self).__name__}: dropout must be in [0, 1), got {dropout}")
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.causal = causal
        self.dropout = dropout
        self.fused = fused
        self.check_finite = check_finite
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)

    def keep_mask(self, mask: Tensor | None, seq_len: int, device: torch.device) -> Tensor | None:
        """Boolean "may attend" mask broadcastable to (B, H, N, N), or None for is_causal / no mask.

        Every query keeps at least one key (itself), so no row is empty and no NaN appears; the
        rows where that matters are padding and are zeroed afterwards.
        """
        if mask is None:
            if not self.causal:
                return None
            return torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()
        keep = mask[:, None, None, :]  # (B, 1, 1, N)
        if self.causal:
            tril = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()
            return (keep & tril) | torch.eye(seq_len, dtype=torch.bool, device=device)
        # A fully padded sample attends everywhere (its rows are zeroed anyway).
        return keep | ~mask.any(dim=1)[:, None, None, None]

    def forward(self, x: Tensor, mask: Tensor | None = None, *, attn_mask: Tensor | None = None,
                cache: LayerCache | None = None, segments: Tensor | None = None) -> Tensor:
        """x: (B, N, D); mask (or timm's attn_mask): (B, N) bool, True = real token -> (B, N, D).

        cache: causal layers, decoding (:class:`~primal_attention.layers.cache.LayerCache`): x is the
        next chunk after the keys and values in ``cache.attn`` (a :class:`KVBuffer`; None: x starts
        the sequence), which x's are appended to; rows equal the forward over the whole sequence.
        A decoding loop's one-token step is :meth:`decode_token`.
        segments: causal layers, packed rows: (B, N) integer document ids (each document one run of
        equal ids); a query attends to the keys of its own document only."""
        name = type(self).__name__
        mask = resolve_mask(mask, attn_mask, name)
        if segments is not None:
            check_segments(segments, x, self.causal, name)
            if cache is not None:
                raise ValueError(f"{name}: segments need no decoding cache")
        if cache is not None:
            return self._forward_cached(x, mask, cache)
        check_input(x, mask, self.embed_dim, check_finite=self.check_finite, name=name, dtype=self.q_proj.weight.dtype)
        batch, seq_len, dim = x.shape

        def heads(t: Tensor) -> Tensor:
            return t.view(batch, seq_len, self.num_heads, self.head_dim).transpose(1, 2)

        x_kv, tainted = self._finite_tokens(x, mask)
        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x_kv)), heads(self.v_proj(x_kv))
        p = self.dropout if self.training else 0.0
        plain_causal = mask is None and segments is None and self.causal
        keep = None if plain_causal and self.fused else self.keep_mask(mask, seq_len, x.device)
        if segments is not None:  # the causal mask within each document (a query always keeps itself)
            keep = keep & (segments[:, None, :, None] == segments[:, None, None, :])
        if self.fused:
            if plain_causal:
                y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
            else:
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=p)
        else:
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
            if keep is not None:
                scores = scores.masked_fill(~keep, float("-inf"))
            y = F.dropout(scores.softmax(dim=-1), p=p, training=p > 0) @ v
        if tainted is not None:
            y = y.masked_fill(tainted[:, None, :, None], float("nan"))
        y = y.transpose(1, 2).reshape(batch, seq_len, dim)
        if mask is not None:  # a fill, not a product: a padding row stays out_proj.bias even if it was NaN
            y = y.masked_fill(~mask[:, :, None], 0.0)
        return self.out_proj(y)

    def decode_plan(self) -> SoftmaxDecodePlan:
        """The constants of the fused decoding step, for one decoding loop whose weights do not change
        (rearranged copies of the projections; the output bias is a view). Causal only."""
        if not self.causal:
            raise RuntimeError(f"{type(self).__name__}: only causal layers decode incrementally")
        with torch.no_grad():
            qkv_t = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight], dim=0).t().contiguous()
            bias = None
            if self.q_proj.bias is not None:
                bias = torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias], dim=0)
            out_b = None if self.out_proj.bias is None else self.out_proj.bias.detach()
            return SoftmaxDecodePlan(qkv_t, bias, self.out_proj.weight.detach().t().contiguous(), out_b,
                                     self.num_heads, self.head_dim)

    def _finite_tokens(self, x: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """x (B, N, D) for the keys and values, with the tokens that hold NaN / inf zeroed, and
        ``tainted`` (B, N), the rows that attend to such a token; (x, None) when every row attends
        to every token (nothing to keep apart).

        A masked-out (future or padding) key gets weight exactly 0, yet 0 · NaN is NaN in the
        product with v (and NaN + -inf is NaN in a kernel that adds the mask), so one bad token
        would turn every earlier row NaN. Zeroed, it cannot; the rows that do attend to it are set
        back to NaN, so every row is what the unfused math gives it and NaN still surfaces.
        """
        if mask is None and not self.causal:
            return x, None
        # A token's sum is non-finite iff one of its values is: one reduction instead of isfinite's
        # several passes; the float32 (or wider) sum cannot overflow for values attention can take.
        bad = ~torch.isfinite(x.sum(-1, dtype=torch.promote_types(x.dtype, torch.float32)))  # (B, N)
        # On the CPU reading the flag costs no wait, so the copy is made only when a token is bad;
        # on an accelerator (and under torch.compile, where it would break the graph) it is not read.
        if x.device.type == "cpu" and not torch.compiler.is_compiling() and not bool(bad.any()):
            return x, None
        x = x.masked_fill(bad[..., None], 0.0)
        if mask is not None:
            bad = bad & mask  # padding is never attended to
        return x, (bad.cumsum(-1) > 0 if self.causal else bad.any(-1, keepdim=True))

    def prefill_state(self, x: Tensor) -> KVCache:
        """The decoding state after the whole prefix x (B, N, D): its keys and values (no padding)."""
        if not self.causal:
            raise RuntimeError(f"{type(self).__name__}: only causal layers decode incrementally")
        batch, seq_len, _ = x.shape
        k = self.k_proj(x).view(batch, seq_len, self.num_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, seq_len, self.num_heads, self.head_dim).transpose(1, 2)
        return KVCache(k, v)

    def extend(self, x: Tensor, state: KVCache | None = None, mask: Tensor | None = None,
               past_mask: Tensor | None = None) -> tuple[Tensor, KVCache]:
        """The next chunk of a causal sequence after ``state``: x (B, T, D) -> (out (B, T, D), cache after it).

        Rows equal those of the causal :meth:`forward` on the whole sequence so far. state: the keys
        and values of the P tokens before x (None: x starts the sequence); mask (B, T) bool: the
        chunk's real tokens; past_mask (B, P) bool: which cached positions are real (None: all).
        Padding keys get no weight and padding rows equal ``out_proj.bias``, as in :meth:`forward`.
        """
        name = f"{type(self).__name__}.extend"
        self._check_chunk(x, mask, name)
        q, k, v = self._qkv(x)
        past = 0
        if state is not None:
            self._check_cache(state, x.shape[0], k)
            past = state.k.shape[2]
            k, v = torch.cat([state.k, k], dim=2), torch.cat([state.v, v], dim=2)
        return self._attend(q, k, v, past, mask, past_mask, name), KVCache(k, v)

    def _check_chunk(self, x: Tensor, mask: Tensor | None, name: str) -> None:
        if not self.causal:
            raise RuntimeError(f"{name}: only causal layers decode incrementally")
        check_input(x, mask, self.embed_dim, check_finite=self.check_finite, name=name, dtype=self.q_proj.weight.dtype)

    def _qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v of x (B, T, D), each (B, H, T, d)."""
        batch, n, _ = x.shape

        def heads(t: Tensor) -> Tensor:
            return t.view(batch, n, self.num_heads, self.head_dim).transpose(1, 2)

        return heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, past: int, mask: Tensor | None, past_mask: Tensor | None,
                name: str) -> Tensor:
        """The output of T queries q (B, H, T, d) over the P + T keys and values k, v (the last T the
        queries' own): causal within the chunk, padding keys (mask, past_mask) left out -> (B, T, D)."""
        batch, _, n, _ = q.shape
        if past_mask is not None and tuple(past_mask.shape) != (batch, past):
            raise ValueError(f"{name}: expected past_mask of shape ({batch}, {past}), got {tuple(past_mask.shape)}")
        p = self.dropout if self.training else 0.0
        if past == 0 and mask is None:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        else:
            keep = torch.ones(n, past + n, dtype=torch.bool, device=q.device).tril(diagonal=past)[None, None]
            if mask is not None or past_mask is not None:
                real = torch.cat([past_mask if past_mask is not None else q.new_ones(batch, past, dtype=torch.bool),
                                  mask if mask is not None else q.new_ones(batch, n, dtype=torch.bool)], dim=1)
                own = torch.zeros(n, past + n, dtype=torch.bool, device=q.device)
                own[:, past:] = torch.eye(n, dtype=torch.bool, device=q.device)  # no empty row (a padding one)
                keep = (keep & real[:, None, None, :]) | own
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=p)
        y = y.transpose(1, 2).reshape(batch, n, self.embed_dim)
        if mask is not None:
            y = y.masked_fill(~mask[:, :, None], 0.0)
        return self.out_proj(y)

    def decode_token(self, x: Tensor, cache: LayerCache, residual: Tensor | None = None) -> Tensor:
        """One token of a decoding loop: x (B, D) -> (B, D) (plus ``residual`` when given), its key and
        value written into the cache's :class:`KVBuffer` (no copy of the cache), projections from the
        plan built at the first call (``cache.attn_plan``). The same numbers as :meth:`forward` with the
        cache; for eval mode without gradients, float32 / float64 (the caller checks)."""
        buffer = cache.attn
        if buffer is None:
            if not self.causal:
                raise RuntimeError(f"{type(self).__name__}.decode_token: only causal layers decode incrementally")
            buffer = cache.attn = KVBuffer(cache.capacity)
        plan = cache.attn_plan
        if plan is None:
            plan = cache.attn_plan = self.decode_plan()
        q, k, v = fused_qkv(plan, x)
        if buffer.k is not None and (type(buffer) is not KVBuffer or buffer.k.shape[0] != x.shape[0]
                                     or buffer.k.dtype != x.dtype):
            self._check_cache(KVCache(buffer.keys, buffer.values) if isinstance(buffer, KVBuffer) else buffer,
                              x.shape[0], k)
        keys, values = buffer.append(k, v)
        real = buffer.past_mask()  # with this token's column
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=None if real is None else real[:, None, None, :])
        return fused_out(plan, y, residual)

    def _forward_cached(self, x: Tensor, mask: Tensor | None, cache: LayerCache) -> Tensor:
        """:meth:`forward` with a decoding cache: x (B, T, D) -> (B, T, D); its keys and values appended."""
        name = type(self).__name__
        buffer = cache.attn
        if buffer is None:
            buffer = cache.attn = KVBuffer(cache.capacity)
        elif not isinstance(buffer, KVBuffer):
            raise TypeError(f"{name}: expected the cache's attention state to be a KVBuffer, got "
                            f"{type(buffer).__name__} (a cache of another model?)")
        self._check_chunk(x, mask, name)
        q, k, v = self._qkv(x)
        if buffer.k is not None:
            self._check_cache(KVCache(buffer.keys, buffer.values), x.shape[0], k)
        past, past_mask = buffer.length, buffer.past_mask()
        keys, values = buffer.append(k, v, mask)
        return self._attend(q, keys, values, past, mask, past_mask, name)

    def step(self, x_t: Tensor, state: KVCache | None = None) -> tuple[Tensor, KVCache]:
        """Incremental decoding for causal layers with a KV cache: x_t (B, D) or (B, 1, D).

        Returns out_t with x_t's shape (equal to row t of the causal forward on the prefix) and the
        cache extended by this token: O(t) time and memory per token.
        """
        name = type(self).__name__
        if not self.causal:
            raise RuntimeError(f"{name}.step: only causal layers decode incrementally")
        token_axis = x_t.dim() == 3
        x = x_t if token_axis else x_t[:, None]
        if x.dim() != 3 or x.shape[1] != 1 or x.shape[-1] != self.embed_dim:
            raise ValueError(f"{name}.step: expected x_t of shape (B, {self.embed_dim}), got {tuple(x_t.shape)}")
        batch = x.shape[0]

        def heads(t: Tensor) -> Tensor:
            return t.view(batch, 1, self.num_heads, self.head_dim).transpose(1, 2)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        if state is not None:
            self._check_cache(state, batch, k)
            k, v = torch.cat([state.k, k], dim=2), torch.cat([state.v, v], dim=2)
        y = F.scaled_dot_product_attention(q, k, v)  # the new token attends to every cached one
        out = self.out_proj(y.transpose(1, 2).reshape(batch, 1, self.embed_dim))
        return (out if token_axis else out[:, 0]), KVCache(k, v)

    def _check_cache(self, state: Any, batch: int, k_t: Tensor) -> None:
        """One clear error for a state that is not this layer's (another layer, batch, type or dtype)."""
        name = type(self).__name__
        if not isinstance(state, KVCache) or not all(isinstance(t, Tensor) for t in state):
            raise TypeError(f"{name}.step: expected state to be a KVCache of tensors (or None to start), "
                            f"got {type(state).__name__}")
        k, v = state
        want = (batch, self.num_heads, self.head_dim)
        if k.dim() != 4 or v.shape != k.shape or (k.shape[0], k.shape[1], k.shape[3]) != want:
            raise ValueError(f"{name}.step: expected a cache of k and v of shape ({batch}, {self.num_heads}, T, "
                             f"{self.head_dim}), got {tuple(k.shape)} and {tuple(v.shape)} "
                             "(a state of another layer or batch?)")
        if not (k.dtype == v.dtype == k_t.dtype) or not (k.device == v.device == k_t.device):
            raise ValueError(f"{name}.step: expected a cache of dtype {k_t.dtype} on {k_t.device}, got "
                             f"{k.dtype} on {k.device}")


@register_attention("softmax_materialized")
class MaterializedSoftmaxAttention(SoftmaxAttention):
    """:class:`SoftmaxAttention` that forms the N×N matrix (the paper's Transformer baseline)."""

    def __init__(self, embed_dim: int, num_heads: int, **options: Any) -> None:
        if options.pop("fused", False):
            raise ValueError("MaterializedSoftmaxAttention is never fused; use SoftmaxAttention")
        super().__init__(embed_dim, num_heads, fused=False, **options)
