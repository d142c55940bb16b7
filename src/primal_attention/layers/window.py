"""Local-window softmax beside Primal-Attention in one layer: exact attention to the nearest tokens,
the primal term for the whole sequence (or prefix), mixed per head by a learned gate.

Per head h, with gate α_h = σ(a_h) and the shared output projection W_o (docs/method.md §9):

    z_i,h = α_h · softmax-window_h(i) + (1 − α_h) · (C [e_i; r_i] + c)_h,    out_i = W_o merge_h(z_i,h) + b_o

The window branch is softmax(q kᵀ/√d) v over the keys within the window (causal: the last
``window`` tokens, the query's own included; otherwise the ``window // 2`` tokens either side),
with the primal layer's own q, k projections and a value projection of its own. The primal
branch is :class:`~primal_attention.PrimalAttention` unchanged (``self.primal``), whose KSVD term is
collected as every primal layer's (docs/method.md §9). Training costs O(N·(w + s)) per head; decoding keeps the
primal running sums and a ring of the last ``window`` keys and values: constant in N.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from primal_attention.layers.cache import LayerCache
from primal_attention.layers.checks import check_input, check_segments, resolve_mask
from primal_attention.layers.primal import PrimalAttention, QKTransform
from primal_attention.layers.registry import register_attention
from primal_attention.ops.local import band_attention
from primal_attention.ops.primal import decode, fused, reference
from primal_attention.ops.primal.decode import PrimalDecodePlan, fused_step
from primal_attention.ops.primal.reference import PrimalWeights


#: the PrimalAttention options a window layer passes on to its primal branch as they are.
_PRIMAL_ONLY = tuple(name for name, param in inspect.signature(PrimalAttention.__init__).parameters.items()
                     if param.kind is param.KEYWORD_ONLY and name not in
                     ("causal", "bias", "dropout", "max_seq_len", "check_finite"))


class WindowState(NamedTuple):
    """Decoding state of a causal :class:`WindowPrimalAttention`, constant in the context length.

    total (B, 2D), count (B,): the primal branch's running sums (as :class:`~primal_attention.PrimalState`).
    keys, values (B, H, w, d): a ring of the last w tokens' keys and values, token t in slot t mod w;
    real (B, w) bool: which slots hold a real token (False: not yet written, or padding); seen: the
    positions so far (padding included).
    """

    total: Tensor
    count: Tensor
    keys: Tensor
    values: Tensor
    real: Tensor
    seen: int


class WindowDecodePlan(NamedTuple):
    """The fused one-token step of :meth:`WindowPrimalAttention.decode_token`: qkv_t (D, 3D)
    ``[W_q; W_k; W_v]ᵀ`` and qkv_bias (3D,) or None (one matmul for both branches), the primal
    branch's plan (its output projection scaled by 1 − α), window_out_t (D, D) ``(W_o diag α)ᵀ``."""

    qkv_t: Tensor
    qkv_bias: Tensor | None
    primal: PrimalDecodePlan
    window_out_t: Tensor
    heads: int
    head_dim: int
    window: int


@register_attention("window_primal")
class WindowPrimalAttention(nn.Module):
    r"""Softmax attention over a local window beside Primal-Attention over the whole sequence.

    Args:
        embed_dim: D. num_heads: H. rank: s of the primal branch.
        window: w. Causal layers: each token attends to the last w tokens (itself included);
            others: to the tokens within ``w // 2`` positions either side.
        gate_init: the gate logits' initial value (α = σ(gate_init) on the window branch; 0 gives
            an even mix, a large value starts close to windowed softmax attention).
        causal, bias, dropout, max_seq_len, check_finite: as every layer's; dropout acts on the
            window's probabilities and on the primal branch's mixed output.
        primal_options: the other :class:`~primal_attention.PrimalAttention` options (``rank_multi``,
            ``num_samples``, ``sampling``, ``positive_lambda``, ``impl``, ``kernel``).

    Parameters: ``primal`` (a PrimalAttention: q_proj, k_proj, we, wr, lam, mix, out_proj, the last
    three of which the window shares: q_proj, k_proj and out_proj serve both branches), ``v_proj``
    (the window's values) and ``gate`` (H,).

    Shapes: forward x (B, N, D), mask (B, N) bool (True = real token) -> (B, N, D); padding rows equal
    ``out_proj.bias``, padding keys get no weight. segments (causal, packed rows): (B, N) document ids;
    both branches keep to each token's document.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        rank: int = 20,
        *,
        window: int = 32,
        gate_init: float = 0.0,
        causal: bool = False,
        bias: bool = True,
        dropout: float = 0.0,
        max_seq_len: int | None = None,
        check_finite: bool = False,
        **primal_options: Any,
    ) -> None:
        super().__init__()
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            raise ValueError(f"WindowPrimalAttention: window must be a positive int, got {window!r}")
        if not isinstance(gate_init, (int, float)) or isinstance(gate_init, bool) or not math.isfinite(gate_init):
            raise ValueError(f"WindowPrimalAttention: gate_init must be a finite number, got {gate_init!r}")
        unknown = sorted(set(primal_options) - set(_PRIMAL_ONLY))
        if unknown:
            raise ValueError(f"WindowPrimalAttention: unknown option{'s' if len(unknown) > 1 else ''} "
                             f"{', '.join(unknown)}; expected window, gate_init, rank, causal, bias, dropout, "
                             f"max_seq_len, check_finite or one of {', '.join(_PRIMAL_ONLY)}")
        self.primal = PrimalAttention(embed_dim, num_heads, rank, causal=causal, bias=bias, dropout=dropout,
                                      max_seq_len=max_seq_len, check_finite=check_finite, **primal_options)
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.rank = rank
        self.window = window
        self.causal = causal
        self.dropout = dropout
        self.check_finite = check_finite
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.gate = nn.Parameter(torch.full((num_heads,), float(gate_init)))

    @property
    def q_proj(self) -> nn.Linear:
        return self.primal.q_proj

    @property
    def k_proj(self) -> nn.Linear:
        return self.primal.k_proj

    @property
    def out_proj(self) -> nn.Linear:
        return self.primal.out_proj

    @property
    def alpha(self) -> Tensor:
        """The window branch's share per head, σ(gate): (H,)."""
        return torch.sigmoid(self.gate)

    def band(self) -> tuple[int, int]:
        """(left, right): the keys before and after its own position that a query sees."""
        return (self.window - 1, 0) if self.causal else (self.window // 2, self.window // 2)

    def primal_weights(self) -> PrimalWeights:
        """The primal branch's weights with its output projection scaled per head by 1 − α."""
        weights = self.primal.weights()
        keep = (1.0 - self.alpha).repeat_interleave(self.head_dim)
        return weights._replace(out_weight=weights.out_weight * keep)

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        *,
        attn_mask: Tensor | None = None,
        qk_transform: QKTransform | None = None,
        cache: LayerCache | None = None,
        segments: Tensor | None = None,
    ) -> Tensor:
        """x: (B, N, D); mask (or timm's attn_mask): (B, N) bool, True = real token -> (B, N, D).

        qk_transform: applied to ``[q | k]`` (B, N, 2D) before both branches use them (e.g. RoPE).
        cache: causal layers, decoding: x is the next chunk after the tokens in ``cache.attn`` (a
        :class:`WindowState`; None starts the sequence), which becomes the state after x.
        segments: causal layers, packed rows: (B, N) document ids; each document's rows equal the
        forward over that document alone. Not with a cache.
        """
        name = type(self).__name__
        mask = resolve_mask(mask, attn_mask, name)
        if segments is not None:
            check_segments(segments, x, self.causal, name)
            if cache is not None:
                raise ValueError(f"{name}: segments need no decoding cache")
        if cache is not None:
            if not self.causal:
                raise RuntimeError(f"{name}: only causal layers decode incrementally (a cache was given)")
            out, cache.attn = self.extend(x, cache.attn, mask, qk_transform=qk_transform)
            return out
        check_input(x, mask, self.embed_dim, check_finite=self.check_finite, name=name, dtype=self.q_proj.weight.dtype)
        out = self._primal_out(x, mask, qk_transform, segments, None)
        q, k, v, _ = self._qkv(x, mask, qk_transform)
        left, right = self.band()
        y = band_attention(q, k, v, left=left, right=right, key_real=mask, segments=segments,
                           dropout_p=self.dropout if self.training else 0.0)
        return out + self._window_out(y, mask)

    def _primal_out(self, x: Tensor, mask: Tensor | None, qk_transform: QKTransform | None,
                    segments: Tensor | None, prefix: tuple[Tensor, Tensor] | None) -> Tensor:
        """The primal branch's share of the output (B, N, D), its KSVD term sent as the primal layer's."""
        primal = self.primal
        weights = self.primal_weights()
        if primal.impl == "fast":
            out, term = fused.primal_attention(
                x, weights, heads=self.num_heads, causal=self.causal, mask=mask, sampling=primal.sampling,
                dropout_p=primal.dropout, training=self.training, qk_transform=qk_transform, kernel=primal.kernel,
                prefix=prefix, segments=segments)
            primal._record(term)
            return out
        if qk_transform is not None or segments is not None or prefix is not None:
            raise ValueError(f"{type(self).__name__}: qk_transform, segments and decoding need impl='fast'")
        if self.training and primal.dropout > 0.0:
            raise ValueError(f"{type(self).__name__}: the reference path (impl='reference') has no dropout")
        trace = reference.primal_attention(x, weights, heads=self.num_heads, causal=self.causal, mask=mask,
                                           sampling=primal.sampling)
        primal._record(trace)
        return trace.out

    def _qkv(self, x: Tensor, mask: Tensor | None,
             qk_transform: QKTransform | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The window's q, k, v of x (B, T, D), each (B, H, T, d), and ``[q | k]`` (B, T, 2D) as the primal
        state sums them; padding tokens zeroed first (never read)."""
        batch, steps, dim = x.shape
        if mask is not None:
            x = x.masked_fill(~mask[:, :, None], 0.0)
        qk = torch.cat([self.q_proj(x), self.k_proj(x)], dim=-1)
        if qk_transform is not None:
            qk = qk_transform(qk)
        q, k = qk.split(dim, dim=-1)

        def heads(t: Tensor) -> Tensor:
            return t.reshape(batch, steps, self.num_heads, self.head_dim).transpose(1, 2)

        return heads(q), heads(k), heads(self.v_proj(x)), qk

    def _window_out(self, y: Tensor, mask: Tensor | None) -> Tensor:
        """The window branch's share of the output: W_o merge_h(α_h y_h), y (B, H, T, d) -> (B, T, D)."""
        batch, _, steps, _ = y.shape
        y = (y * self.alpha.to(y.dtype)[:, None, None]).transpose(1, 2).reshape(batch, steps, self.embed_dim)
        if mask is not None:
            y = y.masked_fill(~mask[:, :, None], 0.0)
        return F.linear(y, self.out_proj.weight)

    def empty_state(self, batch: int, device: torch.device | None = None) -> WindowState:
        """The state before any token: zero sums and an empty ring."""
        dtype = self.q_proj.weight.dtype
        device = self.q_proj.weight.device if device is None else device
        acc = decode.accumulator_dtype(dtype)
        ring = torch.zeros(batch, self.num_heads, self.window, self.head_dim, dtype=dtype, device=device)
        return WindowState(torch.zeros(batch, 2 * self.embed_dim, dtype=acc, device=device),
                           torch.zeros(batch, dtype=acc, device=device), ring, ring.clone(),
                           torch.zeros(batch, self.window, dtype=torch.bool, device=device), 0)

    def extend(
        self,
        x: Tensor,
        state: WindowState | None = None,
        mask: Tensor | None = None,
        past_mask: Tensor | None = None,
        *,
        qk_transform: QKTransform | None = None,
    ) -> tuple[Tensor, WindowState]:
        """The next chunk of a causal sequence after ``state``: x (B, T, D) -> (out (B, T, D), state after it).

        Rows equal those of :meth:`forward` on the whole sequence so far. mask (B, T) bool: the chunk's
        real tokens; past_mask: not needed (the state marks its padding) and accepted for the shared
        signature of causal layers; qk_transform: as in :meth:`forward`, for these T positions.
        """
        name = f"{type(self).__name__}.extend"
        if not self.causal:
            raise RuntimeError(f"{name}: only causal layers decode incrementally")
        check_input(x, mask, self.embed_dim, check_finite=self.check_finite, name=name, dtype=self.q_proj.weight.dtype)
        batch, steps, _ = x.shape
        if state is not None:
            self._check_state(state, batch, x.device, name)
        out = self._primal_out(x, mask, qk_transform, None, None if state is None else (state.total, state.count))
        q, k, v, qk = self._qkv(x, mask, qk_transform)
        chunk = decode.chunk_sums(qk, mask, decode.accumulator_dtype(self.q_proj.weight.dtype))  # the window's q, k
        total, count = chunk if state is None else (state.total + chunk.total, state.count + chunk.count)
        real = torch.ones(batch, steps, dtype=torch.bool, device=x.device) if mask is None else mask
        w = self.window
        if state is None:
            past, seen, keys, values, key_real = 0, 0, k, v, real
        else:  # the ring in time order, oldest first (slots not written yet are not real)
            order = (state.seen + torch.arange(w, device=x.device)) % w
            past, seen = w, state.seen
            keys = torch.cat([state.keys[:, :, order].to(k.dtype), k], dim=2)  # under autocast k is narrower
            values = torch.cat([state.values[:, :, order].to(v.dtype), v], dim=2)
            key_real = torch.cat([state.real[:, order], real], dim=1)
        y = band_attention(q, keys, values, left=w - 1, past=past, key_real=key_real,
                           dropout_p=self.dropout if self.training else 0.0)
        out = out + self._window_out(y, mask)
        seen += steps
        short = w - keys.shape[2]  # fewer than w positions so far: the front slots stay empty
        if short > 0:
            keys, values = F.pad(keys, (0, 0, short, 0)), F.pad(values, (0, 0, short, 0))
            key_real = F.pad(key_real, (short, 0), value=False)
        shift = seen % w  # the last w positions, position t in slot t mod w, kept in the parameters' dtype
        ring = [torch.roll(t[..., -w:, :], shift, dims=2).to(self.q_proj.weight.dtype) for t in (keys, values)]
        return out, WindowState(total, count, ring[0], ring[1], torch.roll(key_real[:, -w:], shift, dims=1), seen)

    def step(
        self,
        x_t: Tensor,
        state: WindowState | None = None,
        mask_t: Tensor | None = None,
        *,
        qk_transform: QKTransform | None = None,
        plan: WindowDecodePlan | None = None,
    ) -> tuple[Tensor, WindowState]:
        """One token of a causal sequence: x_t (B, D) or (B, 1, D) -> (out_t of x_t's shape, new state).

        Equal to row t of :meth:`forward` on the prefix. mask_t (B,) bool: False where this step is
        padding. plan (:meth:`decode_plan`): the fused path, where it applies (no mask_t, no
        qk_transform, no gradients, float32 / float64)."""
        name = f"{type(self).__name__}.step"
        if not self.causal:
            raise RuntimeError(f"{name}: only causal layers decode incrementally")
        token_axis = x_t.dim() == 3
        x = x_t[:, 0] if token_axis and x_t.shape[1] == 1 else x_t
        if x.dim() != 2 or x.shape[-1] != self.embed_dim:
            raise ValueError(f"{name}: expected x_t of shape (B, {self.embed_dim}), got {tuple(x_t.shape)}")
        if mask_t is not None and (not isinstance(mask_t, Tensor) or mask_t.dtype != torch.bool
                                   or tuple(mask_t.shape) != (x.shape[0],)):
            raise ValueError(f"{name}: expected mask_t of shape ({x.shape[0]},) bool")
        if plan is not None and mask_t is None and qk_transform is None and self.primal.fused_step_ok(x):
            if state is None:
                state = self.empty_state(x.shape[0], x.device)
            self._check_state(state, x.shape[0], x.device, name)
            out, state = _fused_token(plan, x, state, None, inplace=False)
        else:
            out, state = self.extend(x[:, None], state, None if mask_t is None else mask_t[:, None],
                                     qk_transform=qk_transform)
            out = out[:, 0]
        return (out[:, None] if token_axis else out), state

    def decode_plan(self) -> WindowDecodePlan:
        """The constants of the fused one-token step, for a decoding loop whose weights do not change."""
        if not self.causal:
            raise RuntimeError(f"{type(self).__name__}.decode_plan: only causal layers decode incrementally")
        with torch.no_grad():
            primal_plan = decode.build_plan(self.primal_weights(), self.num_heads)
            qkv_t = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight]).t().contiguous()
            bias = None if self.q_proj.bias is None else torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias])
            window_out_t = (self.out_proj.weight * self.alpha.repeat_interleave(self.head_dim)).t().contiguous()
            return WindowDecodePlan(qkv_t, bias, primal_plan, window_out_t, self.num_heads, self.head_dim, self.window)

    def decode_token(self, x: Tensor, cache: LayerCache, residual: Tensor | None = None) -> Tensor:
        """One token of a decoding loop: x (B, D) -> (B, D) (plus ``residual``), the state in
        ``cache.attn`` advanced in place (plan kept in ``cache.attn_plan``). The same numbers as
        :meth:`forward` with the cache; for eval mode without gradients, float32 / float64."""
        state = cache.attn
        if state is None:
            if not self.causal:
                raise RuntimeError(f"{type(self).__name__}.decode_token: only causal layers decode incrementally")
            state = self.empty_state(x.shape[0], x.device)
        elif type(state) is not WindowState or state.total.shape[0] != x.shape[0] or state.keys.dtype != x.dtype:
            self._check_state(state, x.shape[0], x.device, f"{type(self).__name__}.decode_token")
        plan = cache.attn_plan
        if plan is None:
            plan = cache.attn_plan = self.decode_plan()
        out, cache.attn = _fused_token(plan, x, state, residual, inplace=True)
        return out

    def prefill_state(self, x: Tensor, mask: Tensor | None = None, *,
                      qk_transform: QKTransform | None = None) -> WindowState:
        """The :meth:`step` state after the whole prefix x (B, N, D)."""
        return self.extend(x, None, mask, qk_transform=qk_transform)[1]

    def _check_state(self, state: Any, batch: int, device: torch.device, where: str) -> None:
        """One clear error for a state that is not this layer's (another layer, batch, dtype or type)."""
        if not isinstance(state, WindowState):
            raise TypeError(f"{where}: expected state to be a WindowState (or None to start), got {type(state).__name__}")
        dtype = self.q_proj.weight.dtype
        acc = decode.accumulator_dtype(dtype)
        ring = (batch, self.num_heads, self.window, self.head_dim)
        shapes = (tuple(state.total.shape), tuple(state.count.shape), tuple(state.keys.shape),
                  tuple(state.values.shape), tuple(state.real.shape))
        if shapes != ((batch, 2 * self.embed_dim), (batch,), ring, ring, (batch, self.window)):
            raise ValueError(f"{where}: this state does not fit the layer and batch {batch} (window {self.window}): "
                             f"shapes {shapes} (a state of another layer or batch?)")
        if state.total.dtype != acc or state.keys.dtype != dtype or state.keys.device != device:
            raise ValueError(f"{where}: expected a state of dtype {acc} (sums) / {dtype} (ring) on {device}, got "
                             f"{state.total.dtype} / {state.keys.dtype} on {state.keys.device}")

    def extra_repr(self) -> str:
        return f"window={self.window}, causal={self.causal}"


def _fused_token(plan: WindowDecodePlan, x: Tensor, state: WindowState, residual: Tensor | None,
                 *, inplace: bool) -> tuple[Tensor, WindowState]:
    """One unpadded token x (B, D) from a plan: (out (B, D) (+ residual), the state after it). With
    ``inplace`` the state's tensors are written in place (a decoding loop's own state)."""
    batch, dim = x.shape
    heads, d, w = plan.heads, plan.head_dim, plan.window
    qkv = torch.mm(x, plan.qkv_t) if plan.qkv_bias is None else torch.addmm(plan.qkv_bias, x, plan.qkv_t)
    count = state.count.unsqueeze(1)
    out, total, count = fused_step(plan.primal, x, state.total, count, inplace=inplace, residual=residual,
                                   qk=qkv[:, : 2 * dim])
    keys, values, real = (state.keys, state.values, state.real) if inplace else \
        (state.keys.clone(), state.values.clone(), state.real.clone())
    slot = state.seen % w
    keys[:, :, slot] = qkv[:, dim : 2 * dim].view(batch, heads, d)
    values[:, :, slot] = qkv[:, 2 * dim :].view(batch, heads, d)
    real[:, slot] = True
    q = qkv[:, :dim].view(batch, heads, 1, d)
    y = F.scaled_dot_product_attention(q, keys, values, attn_mask=real[:, None, None, :])
    out = torch.addmm(out, y.view(batch, dim), plan.window_out_t)
    return out, WindowState(total, count[:, 0], keys, values, real, state.seen + 1)
