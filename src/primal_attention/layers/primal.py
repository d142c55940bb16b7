"""Primal-Attention, the module: parameters, input checks and KSVD term bookkeeping over the op.

The op lives in :mod:`primal_attention.ops.primal`: the math in ``reference`` (docs/method.md
§2–§3), the fast path in ``fused`` (with the ``folded`` / ``triton_folded`` row loops) and O(1)
decoding in ``decode``. The module keeps no tensor between calls: each forward sends its KSVD term
to the innermost open :func:`primal_attention.ksvd_terms` collector that holds the layer, or drops it
(docs/method.md §4).
"""

from __future__ import annotations

import inspect
import warnings
import weakref
from collections.abc import Callable
from typing import Any, Literal, Protocol, get_args

import torch
from torch import Tensor, nn
from torch.utils.module_tracker import ModuleTracker

from primal_attention.layers.cache import LayerCache
from primal_attention.layers.checks import check_dtype, check_heads, check_input, check_segments, resolve_mask
from primal_attention.layers.registry import register_attention
from primal_attention.ops.primal import decode, fused, reference
from primal_attention.ops.primal.decode import PrimalDecodePlan, PrimalState, fused_step
from primal_attention.ops.primal.kernel import Kernel, check_kernel
from primal_attention.ops.primal.reference import PrimalWeights

#: "fast": :mod:`primal_attention.ops.primal.fused`; "reference": the readable math.
Impl = Literal["fast", "reference"]
IMPLS: tuple[str, ...] = get_args(Impl)

#: what one forward keeps for its KSVD objective: the fast path's cache or the reference trace.
KSVDTerm = fused.PrimalCache | reference.PrimalTrace

#: an optional per-token map of the projections ``[q | k]`` (B, N, 2D) -> (B, N, 2D), e.g. a
#: rotary position embedding (see ``PrimalAttention.forward``).
QKTransform = Callable[[Tensor], Tensor]


class TermSink(Protocol):
    """A collector of KSVD terms (:class:`primal_attention.KSVDTerms`): while open, the forwards of the
    layers it ``holds`` send it their terms."""

    def holds(self, layer: PrimalAttention) -> bool: ...

    def add(self, layer: PrimalAttention, term: KSVDTerm, grad: bool) -> None: ...


#: answers "is autograd running a backward pass now?" through a public API (``is_bw``; the tracker
#: need not be entered): the forward that activation checkpointing recomputes inside backward
#: records nothing.
_BACKWARD = ModuleTracker()
if not isinstance(inspect.getattr_static(ModuleTracker, "is_bw", None), property):  # pragma: no cover
    warnings.warn("primal_attention: this torch's ModuleTracker.is_bw is not the property that reads the autograd "
                  "engine, so the forward that activation checkpointing recomputes during backward would record its "
                  "KSVD term again; upgrade torch (>= 2.4)", RuntimeWarning, stacklevel=2)

#: the open collectors, oldest first, held weakly: a collector that its owner drops without closing
#: it closes itself when collected. The layers keep nothing; a forward asks this list.
_OPEN_SINKS: list[weakref.ref[TermSink]] = []


def open_sink(sink: TermSink) -> None:
    """Start sending the KSVD terms of the layers ``sink`` holds to it (innermost: the latest opened)."""
    _OPEN_SINKS.append(weakref.ref(sink))


def close_sink(sink: TermSink) -> None:
    """Stop sending terms to ``sink`` (a sink not open: nothing happens)."""
    _OPEN_SINKS[:] = [ref for ref in _OPEN_SINKS if ref() is not None and ref() is not sink]


def is_collected(layer: PrimalAttention) -> bool:
    """Whether an open :func:`primal_attention.ksvd_terms` collector would take ``layer``'s KSVD term now."""
    return _sink_for(layer) is not None


def _sink_for(layer: PrimalAttention) -> TermSink | None:
    """The innermost open collector that holds ``layer``, or None."""
    for ref in reversed(_OPEN_SINKS):
        sink = ref()
        if sink is not None and sink.holds(layer):
            return sink
    return None


@register_attention("primal")
class PrimalAttention(nn.Module):
    r"""Primal-Attention (Chen et al., NeurIPS 2023): attention as the primal of asymmetric KSVD.

    For each head, with cosine feature maps :math:`\hat q = q/\|q\|`, :math:`\hat k = k/\|k\|`:

    .. math::
        e_i = W_{e|X}^\top \hat q_i,\quad r_i = W_{r|X}^\top \hat k_i,\quad
        \mathrm{out}_i = W_o\,\mathrm{merge}_h\big(C\,[e_i; r_i] + c\big) + b_o

    Non-causal layers build :math:`W_{e|X} = \tilde X^\top W_e` from n tokens of the input sampled at
    ``linspace(0, N-1, n)``; causal layers use static :math:`W_e, W_r` and a prefix mean of q, k
    before the feature map. Cost is O(N·d·s) per head; no N×N matrix is formed.

    Args:
        embed_dim: D. num_heads: H (must divide D). rank: s.
        rank_multi: m; n = s·m sampled tokens unless ``num_samples`` is given.
        num_samples: n, overriding s·m. max_seq_len: caps n when known.
        causal: prefix-mean family with static projections (decoder / RL).
        bias: biases of q_proj, k_proj, mix, out_proj.
        dropout: dropout on the mixed per-head output, before out_proj.
        sampling: "uniform" (authors: positions over all N, padding included in the KSVD means) or
            "valid" (positions over each sample's real tokens, padding kept out of the KSVD terms).
            Causal layers have no sampling; there the option only decides the KSVD means.
        positive_lambda: parametrise Λ = exp(log_lam) (> 0) instead of the authors' free ``lam``.
        impl: "fast" (default, :mod:`primal_attention.ops.primal.fused`) or "reference" (the
            readable math of :mod:`primal_attention.ops.primal.reference`, for checks and timing;
            no dropout).
        kernel: the fast path's row loop for long sequences: "auto" (default: Triton on CUDA when
            installed), "torch" or "triton" (:mod:`primal_attention.ops.primal.kernel`; the
            environment variable ``PRIMAL_ATTENTION_KERNEL`` overrides it).
        check_finite: raise on NaN / Inf input (a device sync per call; off by default).

    Dtypes: x must have the parameters' dtype, except under autocast (``torch.is_autocast_enabled``
    for x's device type), where mixed dtypes are the point: a float64 x into a float32 layer is
    ``ValueError: PrimalAttention: expected x of dtype torch.float32 (the layer's parameters), got
    torch.float64; convert with layer.double() or x.float()``. Under autocast (and for a bf16 /
    fp16 layer) the causal prefix sums and the ``total`` / ``count`` of the :meth:`step` state are
    accumulated in float32 (or the parameters' dtype if wider); outputs are in the autocast dtype.

    Double backward (``create_graph=True`` then a second grad, e.g. gradient penalties) works on
    ``impl="reference"`` and on the per-head fast path (N < 16·D); the folded fast path (N ≥ 16·D,
    hand-written backward) raises ``RuntimeError: PrimalAttention: the folded fast path (N >= 16·D)
    has no double backward; ...`` — use ``impl="reference"`` there.

    Shapes:
        forward: x (B, N, D), mask (B, N) bool (True = real token) or None -> (B, N, D).
        Padding rows of the mixed per-head output are zeroed before out_proj, so the output rows
        at padding equal ``out_proj.bias``. A fully padded sample gives exactly that in every row
        and contributes nothing to the KSVD terms under sampling="valid" (finite under "uniform").

    Causal padding: padded tokens are left out of the prefix means (so left padding is safe) and
    of the incremental state of :meth:`step`.

    KSVD terms: the layer keeps no tensor between calls. While a :func:`primal_attention.ksvd_terms`
    collector that holds the layer is open, every forward sends it what its objective J needs
    (``terms.loss()``, ``terms.objectives()``, ``terms.objective()``); otherwise the term is dropped
    with the forward. Forwards without gradients are kept only by a collector opened with
    ``inference=True``; the recomputation that activation checkpointing runs during backward sends
    nothing.

    Parameter names (``q_proj``, ``k_proj``, ``we``, ``wr``, ``lam``, ``mix``, ``out_proj``) follow
    docs/method.md so weights from other implementations load with ``load_state_dict``.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        rank: int = 20,
        *,
        rank_multi: int = 10,
        num_samples: int | None = None,
        max_seq_len: int | None = None,
        causal: bool = False,
        bias: bool = True,
        dropout: float = 0.0,
        sampling: Literal["uniform", "valid"] = "uniform",
        positive_lambda: bool = False,
        impl: Impl = "fast",
        kernel: Kernel = "auto",
        check_finite: bool = False,
    ) -> None:
        super().__init__()
        check_heads(embed_dim, num_heads, "PrimalAttention")
        if impl not in IMPLS:
            raise ValueError(f"PrimalAttention: impl must be one of {IMPLS}, got {impl!r}")
        check_kernel(kernel, "PrimalAttention: kernel")
        if not isinstance(rank, int) or rank <= 0:
            raise ValueError(f"PrimalAttention: rank must be a positive int, got {rank!r}")
        if not isinstance(rank_multi, int) or rank_multi <= 0:
            raise ValueError(f"PrimalAttention: rank_multi must be a positive int, got {rank_multi!r}")
        if num_samples is not None and (not isinstance(num_samples, int) or num_samples <= 0):
            raise ValueError(f"PrimalAttention: num_samples must be a positive int, got {num_samples!r}")
        if max_seq_len is not None and (not isinstance(max_seq_len, int) or max_seq_len <= 0):
            raise ValueError(f"PrimalAttention: max_seq_len must be a positive int, got {max_seq_len!r}")
        if sampling not in ("uniform", "valid"):
            raise ValueError(f"PrimalAttention: sampling must be 'uniform' or 'valid', got {sampling!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"PrimalAttention: dropout must be in [0, 1), got {dropout}")

        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.rank = rank
        self.causal = causal
        self.sampling = sampling
        self.dropout = dropout
        self.positive_lambda = positive_lambda
        self.impl = impl
        self.kernel = kernel
        self.check_finite = check_finite
        if causal:
            self.num_samples = None
            rows = self.head_dim
        else:
            n = num_samples if num_samples is not None else rank * rank_multi
            self.num_samples = min(n, max_seq_len) if max_seq_len is not None else n
            rows = self.num_samples

        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.we = nn.Parameter(torch.empty(num_heads, rows, rank))
        self.wr = nn.Parameter(torch.empty(num_heads, rows, rank))
        if positive_lambda:
            self.log_lam = nn.Parameter(torch.empty(num_heads, rank))
        else:
            self.lam = nn.Parameter(torch.empty(num_heads, rank))
        self.mix = nn.Linear(2 * rank, self.head_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Authors' init: orthogonal W_e, W_r on the 3-D tensor, Λ ~ U[0, 1); Linear defaults."""
        nn.init.orthogonal_(self.we)
        nn.init.orthogonal_(self.wr)
        if self.positive_lambda:
            with torch.no_grad():
                self.log_lam.copy_(torch.rand_like(self.log_lam).clamp_min(1e-3).log())
        else:
            nn.init.uniform_(self.lam, 0.0, 1.0)
        for layer in (self.q_proj, self.k_proj, self.mix, self.out_proj):
            layer.reset_parameters()

    @classmethod
    def timm(cls, rank: int = 20, **options: Any) -> Callable[..., PrimalAttention]:
        """A factory usable as timm's ``attn_layer=``: takes timm's keyword arguments.

        ``qkv_bias`` / ``proj_bias`` map to ``bias``, ``attn_drop`` to ``dropout``; timm options
        without a counterpart here (``qk_norm``, ``scale_norm``, ``norm_layer``, ``proj_drop``)
        must keep their no-op defaults, else a ValueError says which.
        """

        def make(dim: int, num_heads: int = 8, **timm_kwargs: Any) -> PrimalAttention:
            kw = dict(options)
            bias = timm_kwargs.pop("qkv_bias", None)
            proj_bias = timm_kwargs.pop("proj_bias", None)
            if bias is not None or proj_bias is not None:
                kw.setdefault("bias", bool(bias if bias is not None else proj_bias))
            kw.setdefault("dropout", float(timm_kwargs.pop("attn_drop", 0.0)))
            unsupported = {
                k: v
                for k, v in timm_kwargs.items()
                if not (k == "norm_layer" or (k in ("qk_norm", "scale_norm") and not v) or (k == "proj_drop" and not v))
            }
            if unsupported:
                raise ValueError(f"PrimalAttention.timm: unsupported timm options {unsupported}")
            return cls(dim, num_heads, rank, **kw)

        return make

    @property
    def lambdas(self) -> Tensor:
        """The effective Λ: (H, s)."""
        return self.log_lam.exp() if self.positive_lambda else self.lam

    def weights(self) -> PrimalWeights:
        """The parameters as the math names them (see :class:`primal_attention.ops.primal.reference.PrimalWeights`)."""
        return PrimalWeights(
            self.q_proj.weight,
            self.q_proj.bias,
            self.k_proj.weight,
            self.k_proj.bias,
            self.we,
            self.wr,
            self.lambdas,
            self.mix.weight,
            self.mix.bias,
            self.out_proj.weight,
            self.out_proj.bias,
        )

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

        qk_transform: applied to the projections ``[q | k]`` (B, N, 2D) token by token, before the
        causal prefix mean and the feature map (e.g. a rotary position embedding for these N
        positions); returns the same shape. None (default): the layer as in docs/method.md.
        Only with ``impl="fast"``.
        cache: causal layers, decoding (:class:`~primal_attention.layers.cache.LayerCache`): x is the
        next chunk after the tokens whose running sums ``cache.attn`` holds (None: x starts the
        sequence); the rows equal those of the forward over the whole sequence, and ``cache.attn``
        becomes the sums after x. One token without gradients takes the fused step (:meth:`step`
        with the plan kept in ``cache.attn_plan``), updating the sums in place.
        segments: causal layers, packed rows: (B, N) integer document ids, each document one run of
        equal ids; every position's prefix mean restarts at its document's first token, so each
        document's rows equal the forward over that document alone. ``impl="fast"``, no cache.
        """
        if segments is not None:
            check_segments(segments, x, self.causal, "PrimalAttention")
            if cache is not None or self.impl != "fast":
                raise ValueError("PrimalAttention: segments need impl='fast' and no decoding cache")
        if cache is not None:
            return self._forward_cached(x, resolve_mask(mask, attn_mask, "PrimalAttention"), cache, qk_transform)
        mask = resolve_mask(mask, attn_mask, "PrimalAttention")
        check_input(x, mask, self.embed_dim, check_finite=self.check_finite, name="PrimalAttention",
                    dtype=self.q_proj.weight.dtype)
        if self.impl == "fast":
            out, cache = fused.primal_attention(
                x,
                self.weights(),
                heads=self.num_heads,
                causal=self.causal,
                mask=mask,
                sampling=self.sampling,
                dropout_p=self.dropout,
                training=self.training,
                qk_transform=qk_transform,
                kernel=self.kernel,
                segments=segments,
            )
            self._record(cache)
            return out
        if qk_transform is not None:
            raise ValueError("PrimalAttention: qk_transform needs impl='fast'; the reference path has none")
        if self.training and self.dropout > 0.0:
            raise ValueError("PrimalAttention: the reference path (impl='reference') has no dropout")
        trace = reference.primal_attention(
            x, self.weights(), heads=self.num_heads, causal=self.causal, mask=mask, sampling=self.sampling
        )
        self._record(trace)
        return trace.out

    def _forward_cached(self, x: Tensor, mask: Tensor | None, cache: LayerCache,
                        qk_transform: QKTransform | None) -> Tensor:
        """:meth:`forward` with a decoding cache: x (B, T, D) -> (B, T, D); cache.attn advanced."""
        if not self.causal:
            raise RuntimeError("PrimalAttention: only causal layers decode incrementally (a cache was given)")
        out, cache.attn = self.extend(x, cache.attn, mask, qk_transform=qk_transform)
        return out

    def decode_token(self, x: Tensor, cache: LayerCache, residual: Tensor | None = None) -> Tensor:
        """One token of a decoding loop: x (B, D) -> (B, D) (plus ``residual`` when given), the running
        sums in ``cache.attn`` advanced in place by the fused step (:func:`fused_step`, with the plan
        built at the first call and kept in ``cache.attn_plan``). The same numbers as :meth:`forward`
        with the cache; for eval mode without gradients, float32 / float64 (the caller checks)."""
        state = cache.attn
        if state is None:
            if not self.causal:
                raise RuntimeError("PrimalAttention.decode_token: only causal layers decode incrementally")
            batch = x.shape[0]
            state = cache.attn = PrimalState(x.new_zeros(batch, 2 * self.embed_dim), x.new_zeros(batch))
        elif type(state) is not PrimalState or state.total.shape[0] != x.shape[0] or state.total.dtype != x.dtype:
            self._check_state(state, x.shape[0], x.dtype, x.device, "PrimalAttention.decode_token")  # says why
        plan = cache.attn_plan
        if plan is None:
            plan = cache.attn_plan = self.decode_plan()
        return fused_step(plan, x, state.total, state.count.unsqueeze(1), inplace=True, residual=residual)[0]

    def _record(self, term: KSVDTerm) -> None:
        """Send a forward's KSVD term to the innermost open collector that holds this layer, if any."""
        sink = _sink_for(self)
        if sink is None:
            return
        if not torch.compiler.is_compiling() and _BACKWARD.is_bw:
            return  # the forward that activation checkpointing recomputes inside backward
        sink.add(self, term, torch.is_grad_enabled())

    def term_objective(self, term: KSVDTerm, reduction: str = "batch", form: str = "authors") -> Tensor:
        """Signed KSVD objective J of one forward's ``term`` (differentiable; a collector calls this).

        reduction: "batch" -> scalar; "sample" -> (B,). form: "authors" (default; Λ squared, means
        over heads and tokens, trace on the learned W_e, W_r) or "paper" (Λ, sums, trace on W_{e|X}).
        See docs/method.md §4. Computed in float32 with autocast off.
        """
        if reduction not in ("batch", "sample"):
            raise ValueError(f"reduction must be 'batch' or 'sample', got {reduction!r}")
        if isinstance(term, reference.PrimalTrace):
            return reference.ksvd_objective(term, self.weights(), reduction=reduction, form=form)
        full = self.complete_term(term)
        return fused.ksvd_objective(full, self.lambdas, self.we, self.wr, reduction=reduction, form=form)

    def complete_term(self, term: KSVDTerm) -> KSVDTerm:
        """``term`` ready for its J: an inference forward kept only its input, whose features are
        recomputed here (current weights); any other term as it is. Keep the result to reuse it."""
        if isinstance(term, fused.PrimalCache) and term.inputs is not None:
            return fused.materialize_features(term, self.weights())
        return term

    def step(
        self,
        x_t: Tensor,
        state: PrimalState | None = None,
        mask_t: Tensor | None = None,
        *,
        qk_transform: QKTransform | None = None,
        plan: PrimalDecodePlan | None = None,
    ) -> tuple[Tensor, PrimalState]:
        """Incremental decoding for causal layers: O(1) time and memory per token.

        Args:
            x_t: (B, D) (or (B, 1, D)) the next token's input.
            state: the running sums returned by the previous call, or None to start.
            mask_t: (B,) bool, False where this step is padding for a sample: its state is not
                advanced and its output is ``out_proj.bias``, as in the full forward.
            qk_transform: as in :meth:`forward`, called on ``[q_t | k_t]`` of shape (B, 1, 2D)
                (for this token's position).
            plan: :meth:`decode_plan`, built once for a decoding loop whose weights do not change:
                the step then takes the fused path (:func:`fused_step`) where it can (no mask_t, no
                qk_transform, no gradients, float32 / float64). None: the step reads the parameters.

        Returns:
            out_t with x_t's shape, and the new state. Equal to row t of ``forward`` on the prefix.
        """
        if not self.causal:
            raise RuntimeError("PrimalAttention.step: only causal layers decode incrementally")
        token_axis = x_t.dim() == 3
        if token_axis:
            if x_t.shape[1] != 1:
                raise ValueError(f"PrimalAttention.step: expected one token (B, 1, D), got {tuple(x_t.shape)}")
            x_t = x_t[:, 0]
        if x_t.dim() != 2 or x_t.shape[-1] != self.embed_dim:
            raise ValueError(f"PrimalAttention.step: expected x_t of shape (B, {self.embed_dim}), got {tuple(x_t.shape)}")
        batch = x_t.shape[0]
        if mask_t is not None and (mask_t.dtype != torch.bool or mask_t.shape != (batch,)):
            raise ValueError(f"PrimalAttention.step: expected mask_t of shape ({batch},) bool, got {tuple(mask_t.shape)} {mask_t.dtype}")
        check_dtype(x_t, self.q_proj.weight.dtype, "PrimalAttention.step", "x_t")
        acc = decode.accumulator_dtype(self.q_proj.weight.dtype)
        if state is None:
            state = PrimalState(torch.zeros(batch, 2 * self.embed_dim, dtype=acc, device=x_t.device),
                                torch.zeros(batch, dtype=acc, device=x_t.device))
        self._check_state(state, batch, acc, x_t.device)
        if plan is not None and mask_t is None and qk_transform is None and self.fused_step_ok(x_t):
            out, total, count = fused_step(plan, x_t, state.total, state.count[:, None])
            return (out[:, None] if token_axis else out), PrimalState(total, count[:, 0])
        out, state = decode.step(self.weights(), self.num_heads, x_t, state, mask_t, qk_transform)
        return (out if token_axis else out[:, 0]), state

    def decode_plan(self) -> PrimalDecodePlan:
        """The constants of the fused decoding step (:func:`~primal_attention.ops.primal.decode.fused_step`)
        from the current parameters (rearranged copies), for one decoding loop whose weights do not change.
        Causal layers only."""
        if not self.causal:
            raise RuntimeError("PrimalAttention.decode_plan: only causal layers decode incrementally")
        return decode.build_plan(self.weights(), self.num_heads)

    def fused_step_ok(self, x: Tensor) -> bool:
        """Whether :meth:`step` may take the fused path for x: no gradients wanted, no autocast, a
        float32 / float64 layer (the running sums then have the parameters' dtype)."""
        dtype = self.q_proj.weight.dtype
        return (not torch.is_grad_enabled() and dtype in (torch.float32, torch.float64) and x.dtype == dtype
                and not torch.is_autocast_enabled(x.device.type))

    def _check_state(self, state: Any, batch: int, dtype: torch.dtype, device: torch.device,
                     where: str = "PrimalAttention.step") -> None:
        """One clear error for a state that is not this layer's (another layer, batch or type)."""
        if not isinstance(state, PrimalState):
            raise TypeError(f"{where}: expected state to be a PrimalState (or None to start), "
                            f"got {type(state).__name__}")
        if not (isinstance(state.total, Tensor) and isinstance(state.count, Tensor)):
            raise TypeError(f"{where}: expected a PrimalState of tensors, got total "
                            f"{type(state.total).__name__} and count {type(state.count).__name__}")
        want = (batch, 2 * self.embed_dim)
        if tuple(state.total.shape) != want or tuple(state.count.shape) != (batch,):
            raise ValueError(f"{where}: expected a state with total {want} and count ({batch},), got "
                             f"total {tuple(state.total.shape)} and count {tuple(state.count.shape)} "
                             "(a state of another layer or batch?)")
        same_device = state.total.device == state.count.device == device
        if not same_device or not (state.total.dtype == state.count.dtype == dtype):
            raise ValueError(f"{where}: expected a state of dtype {dtype} on {device}, got "
                             f"total {state.total.dtype} on {state.total.device} and count {state.count.dtype} "
                             f"on {state.count.device}")

    def extend(
        self,
        x: Tensor,
        state: PrimalState | None = None,
        mask: Tensor | None = None,
        past_mask: Tensor | None = None,
        *,
        qk_transform: QKTransform | None = None,
    ) -> tuple[Tensor, PrimalState]:
        """The next chunk of a causal sequence after ``state``: x (B, T, D) -> (out (B, T, D), state after it).

        Rows equal those of :meth:`forward` on the whole sequence so far (the chunk's prefix means start
        from the state's sums), so a prompt fed in chunks (``prefill`` of a long context) needs memory
        for one chunk, not for the prompt. state: the :class:`PrimalState` of the tokens before x (None:
        x starts the sequence); mask (B, T) bool: real tokens (padding is left out of the sums and its
        rows equal ``out_proj.bias``); past_mask: accepted for the shared signature of causal layers and
        not needed (the state's sums already leave earlier padding out); qk_transform: as in
        :meth:`forward`, for these T positions. The forward's KSVD term goes to an open collector as :meth:`forward`'s does.
        """
        if not self.causal:
            raise RuntimeError("PrimalAttention.extend: only causal layers decode incrementally")
        check_input(x, mask, self.embed_dim, check_finite=self.check_finite, name="PrimalAttention.extend",
                    dtype=self.q_proj.weight.dtype)
        acc = decode.accumulator_dtype(self.q_proj.weight.dtype)
        if state is not None:
            self._check_state(state, x.shape[0], acc, x.device, "PrimalAttention.extend")
        weights = self.weights()
        out, cache = fused.primal_attention(
            x, weights, heads=self.num_heads, causal=True, mask=mask, sampling=self.sampling,
            dropout_p=self.dropout, training=self.training, qk_transform=qk_transform, kernel=self.kernel,
            prefix=None if state is None else (state.total, state.count),
        )
        self._record(cache)
        chunk = decode.prefill(weights, x, mask, qk_transform)
        if state is not None:
            chunk = PrimalState(state.total + chunk.total, state.count + chunk.count)
        return out, chunk

    def prefill_state(
        self, x: Tensor, mask: Tensor | None = None, *, qk_transform: QKTransform | None = None
    ) -> PrimalState:
        """The :meth:`step` state after the whole prefix x (B, N, D): Σ [q | k] over real tokens and their count.

        mask: (B, N) bool (True = real token) or None (all real); qk_transform: as in :meth:`forward`.
        """
        if not self.causal:
            raise RuntimeError("PrimalAttention.prefill_state: only causal layers decode incrementally")
        return decode.prefill(self.weights(), x, mask, qk_transform)

    def extra_repr(self) -> str:
        n = f", num_samples={self.num_samples}" if not self.causal else ""
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, rank={self.rank}{n}, "
            f"causal={self.causal}, sampling={self.sampling!r}, positive_lambda={self.positive_lambda}"
        )
