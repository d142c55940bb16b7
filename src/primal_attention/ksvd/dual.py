"""The exact KSVD solution of a primal layer's kernel, and how far a layer is from it (docs/method.md §7).

For one sample and head, with Φ_q = q̂, Φ_k = k̂ (N×d_h, the layer's feature maps over the sample's real
tokens) and the asymmetric kernel K = Φ_q Φ_kᵀ (N×N) with SVD K = U Σ Vᵀ, the top-s singular pairs give
the KSVD stationary point (docs/method.md §4, §7)

    H_e = U_s,  H_r = V_s,  Λ = Σ_s⁻¹,  W_e = Φ_kᵀ V_s,  W_r = Φ_qᵀ U_s  (d_h×s),
    E = Φ_q W_e = U_s Σ_s,  R = Φ_k W_r = V_s Σ_s.

For the data-dependent (non-causal) family W_e, W_r are what the layer's per-sample W_{e|X} = X̃ᵀ W_e,
W_{r|X} = X̃ᵀ W_r should be; for the causal family the static W_e, W_r themselves.

* :func:`solve_ksvd` (feature matrices) and :func:`layer_ksvd` (a layer and its input) return a
  :class:`KSVDSolution`; :func:`solution_state` turns one sample's solution into parameters a layer
  can load, and :func:`dual_output` computes a layer's output through K and the dual variables;
* :func:`paper_objective`: the paper's J of any projections; :func:`principal_angles`;
* :func:`ksvd_distances` (one layer) and :func:`model_ksvd_distances` (every primal layer of a model):
  principal angles between the learned and the optimal score spaces, the energy of K the learned
  spaces capture, the Ky Fan objective, J and the stationarity residuals.

Everything is float64. Padding tokens are removed: their rows of Φ_q, Φ_k are set to 0, which only adds
zero singular values, and the singular vectors of the non-zero ones are 0 there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from primal_attention.ops.primal import reference
from primal_attention.data.base import Batch
from primal_attention.ksvd.diagnostics import reference_trace, stationarity_residuals
from primal_attention.ksvd.terms import primal_layers
from primal_attention.layers.checks import check_input
from primal_attention.layers.inputs import record_inputs
from primal_attention.layers.primal import PrimalAttention

#: how the SVD of K is computed: "factored" from QR factors of Φ_q, Φ_k (O(N·d_h²), the default) or
#: "dense" on the N×N matrix itself (O(N³), the definition); the two agree to float64 rounding.
METHODS = ("factored", "dense")
F64 = torch.float64


@dataclass(frozen=True)
class KSVDSolution:
    """The rank-s KSVD solution of a layer's kernel, per sample and head, float64.

    Shapes (B samples, H heads, N tokens, d = d_h, s rank, k = min(N, d)):

    * ``sigma``: (B, H, s) the top-s singular values of K, descending; ``lam`` = 1 / sigma is Λ;
    * ``u``, ``v``: (B, H, N, s) left / right singular vectors, the dual variables H_e, H_r; unit norm,
      0 at padding rows, each pair signed so that the largest |entry| of u is positive;
    * ``we``, ``wr``: (B, H, d, s) the primal projections the dual implies, Φ_kᵀ V_s and Φ_qᵀ U_s;
    * ``spectrum``: (B, H, k) every singular value of K (zeros past its rank);
    * ``phi_q``, ``phi_k``: (B, H, N, d) the feature maps q̂, k̂, 0 at padding rows;
    * ``mask``: (B, N) bool, True = real token.
    """

    sigma: Tensor
    u: Tensor
    v: Tensor
    we: Tensor
    wr: Tensor
    spectrum: Tensor
    phi_q: Tensor
    phi_k: Tensor
    mask: Tensor

    @property
    def rank(self) -> int:
        """s, the number of singular pairs kept."""
        return self.sigma.shape[-1]

    @property
    def lam(self) -> Tensor:
        """Λ = Σ_s⁻¹: (B, H, s)."""
        return 1.0 / self.sigma

    @property
    def escore(self) -> Tensor:
        """E = Φ_q W_e = U_s Σ_s: (B, H, N, s)."""
        return self.u * self.sigma[..., None, :]

    @property
    def rscore(self) -> Tensor:
        """R = Φ_k W_r = V_s Σ_s: (B, H, N, s)."""
        return self.v * self.sigma[..., None, :]

    def kernel(self) -> Tensor:
        """K = Φ_q Φ_kᵀ: (B, H, N, N), 0 at padding rows and columns."""
        return self.phi_q @ self.phi_k.transpose(-2, -1)


# ------------------------------------------------------------------------------------------ solver


def _check_method(method: str, name: str) -> None:
    if method not in METHODS:
        raise ValueError(f"{name}: method must be one of {METHODS}, got {method!r}")


def _check_rank(rank: object, name: str) -> None:
    if not isinstance(rank, int) or isinstance(rank, bool) or rank <= 0:
        raise ValueError(f"{name}: expected a positive int rank s, got {rank!r}")


def _check_layer(layer: object, name: str) -> None:
    if not isinstance(layer, PrimalAttention):
        raise TypeError(f"{name}: expected a PrimalAttention layer, got {type(layer).__name__}")


def _full_svd(phi_q: Tensor, phi_k: Tensor, method: str) -> tuple[Tensor, Tensor, Tensor]:
    """U (..., N, k), σ (..., k) descending, V (..., N, k) of K = Φ_q Φ_kᵀ, k = min(N, d)."""
    k = min(phi_q.shape[-2], phi_q.shape[-1])
    if method == "dense":
        u, sv, vh = torch.linalg.svd(phi_q @ phi_k.transpose(-2, -1))
        return u[..., :k], sv[..., :k], vh.transpose(-2, -1)[..., :k]
    # K = Q_q (R_q R_kᵀ) Q_kᵀ with orthonormal Q: the SVD of the k×k middle factor is K's.
    qq, rq = torch.linalg.qr(phi_q)
    qk, rk = torch.linalg.qr(phi_k)
    um, sv, vmh = torch.linalg.svd(rq @ rk.transpose(-2, -1))
    return qq @ um, sv, qk @ vmh.transpose(-2, -1)


def kernel_rank(spectrum: Tensor, tokens: int, width: int) -> Tensor:
    """Numerical rank of K from its singular values (..., k): the number of σ_i > σ_1·max(N, d)·eps
    (the rule of ``torch.linalg.matrix_rank``); (...) int64, 0 for K = 0."""
    tol = spectrum[..., :1] * max(tokens, width) * torch.finfo(spectrum.dtype).eps
    return ((spectrum > tol) & (spectrum > 0)).sum(-1)


def _solution(phi_q: Tensor, phi_k: Tensor, u: Tensor, sv: Tensor, v: Tensor, rank: int, mask: Tensor) -> KSVDSolution:
    u, v, sigma = u[..., :rank], v[..., :rank], sv[..., :rank]
    peak = u.abs().argmax(dim=-2, keepdim=True)
    sign = torch.where(torch.gather(u, -2, peak) < 0, -1.0, 1.0).to(u.dtype)
    u, v = u * sign, v * sign
    we = phi_k.transpose(-2, -1) @ v
    wr = phi_q.transpose(-2, -1) @ u
    return KSVDSolution(sigma, u, v, we, wr, sv, phi_q, phi_k, mask)


def solve_ksvd(
    phi_q: Tensor,
    phi_k: Tensor,
    rank: int,
    *,
    mask: Tensor | None = None,
    method: str = "factored",
) -> KSVDSolution:
    """The rank-s KSVD solution of K = Φ_q Φ_kᵀ for every sample and head (docs/method.md §7).

    Args:
        phi_q, phi_k: (B, H, N, d) feature matrices, one token per row.
        rank: s, the number of singular pairs; at most the numerical rank of every K (≤ min(L, d),
            L the real tokens of a sample).
        mask: (B, N) bool, True = real token; padding rows are set to 0 (removed), or None.
        method: "factored" (QR of Φ_q, Φ_k, then the SVD of a min(N, d)² matrix) or "dense" (SVD of
            the N×N K); the same numbers to float64 rounding.

    Raises:
        ValueError: shapes off, or s larger than the rank of some kernel (the message names the sample
            and head; Λ = Σ⁻¹ needs s non-zero singular values).
    """
    name = "solve_ksvd"
    _check_method(method, name)
    _check_rank(rank, name)
    if not (isinstance(phi_q, Tensor) and isinstance(phi_k, Tensor)):
        raise TypeError(f"{name}: expected phi_q and phi_k to be tensors, got {type(phi_q).__name__} and "
                        f"{type(phi_k).__name__}")
    if phi_q.dim() != 4 or phi_q.shape != phi_k.shape:
        raise ValueError(f"{name}: expected phi_q and phi_k of one shape (B, H, N, d), got "
                         f"{tuple(phi_q.shape)} and {tuple(phi_k.shape)}")
    batch, _, tokens, width = phi_q.shape
    if mask is None:
        mask = torch.ones(batch, tokens, dtype=torch.bool, device=phi_q.device)
    elif not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.shape != (batch, tokens):
        got = f"{tuple(mask.shape)} {mask.dtype}" if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"{name}: expected mask of shape ({batch}, {tokens}) bool, got {got}")
    real = mask[:, None, :, None].to(F64)
    phi_q, phi_k = phi_q.to(F64) * real, phi_k.to(F64) * real
    u, sv, v = _full_svd(phi_q, phi_k, method)
    available = kernel_rank(sv, tokens, width)
    short = (available < rank).nonzero()
    if short.numel():
        b, h = (int(i) for i in short[0])
        raise ValueError(f"{name}: rank s = {rank} exceeds the rank {int(available[b, h])} of the kernel of "
                         f"sample {b}, head {h} ({int(mask[b].sum())} real tokens, d_h = {width})")
    return _solution(phi_q, phi_k, u, sv, v, rank, mask)


@torch.no_grad()
def layer_features(layer: PrimalAttention, x: Tensor, mask: Tensor | None = None) -> reference.PrimalTrace:
    """The layer's reference forward on x in float64 (docs/method.md §2–§3): its ``q_hat``, ``k_hat``
    (B, H, N, d) are Φ_q, Φ_k exactly as the layer computes them (causal: of the prefix means)."""
    _check_layer(layer, "layer_features")
    check_input(x, mask, layer.embed_dim, name="layer_features")
    return reference_trace(layer, x.detach(), mask)


def layer_ksvd(
    layer: PrimalAttention,
    x: Tensor,
    mask: Tensor | None = None,
    *,
    rank: int | None = None,
    method: str = "factored",
) -> KSVDSolution:
    """The exact KSVD solution of a primal layer's kernel on input x, per sample and head.

    Args:
        layer: a :class:`PrimalAttention` (either family; its sampling option does not matter, only Φ).
        x: (B, N, D) the layer's input. mask: (B, N) bool, True = real token, or None (all real).
        rank: s; default the layer's rank.
        method: see :func:`solve_ksvd`.

    Example::

        sol = layer_ksvd(attn, x, mask)            # sol.sigma (B, H, s), sol.we (B, H, d_h, s)
    """
    trace = layer_features(layer, x, mask)
    full = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device) if mask is None else mask
    return solve_ksvd(trace.q_hat, trace.k_hat, layer.rank if rank is None else rank, mask=full, method=method)


def paper_objective(phi_q: Tensor, phi_k: Tensor, we: Tensor, wr: Tensor, lam: Tensor) -> Tensor:
    """The paper's J = ½ Σ_i e_iᵀΛe_i + ½ Σ_j r_jᵀΛr_j − Tr(W_eᵀW_r), e = W_eᵀφ_q, r = W_rᵀφ_k, per matrix.

    Args:
        phi_q, phi_k: (..., N, d) (padding rows 0). we, wr: (..., d, s). lam: (..., s) Λ's diagonal.

    Returns:
        (...) J.
    """
    e, r = phi_q @ we, phi_k @ wr
    lam = lam[..., None, :]
    return 0.5 * (lam * e.square()).sum((-2, -1)) + 0.5 * (lam * r.square()).sum((-2, -1)) - (we * wr).sum((-2, -1))


def _f64(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.detach().to(F64)


@torch.no_grad()
def dual_output(layer: PrimalAttention, solution: KSVDSolution) -> Tensor:
    """The layer's output computed in the dual: scores E = K H_r, R = Kᵀ H_e from the N×N kernel and the
    solution's dual variables, then the layer's own ``mix`` and ``out_proj`` (docs/method.md §2 step 5).

    Equals ``layer(x, mask)`` for a layer whose W_e, W_r, Λ are the solution's (:func:`solution_state`).

    Returns:
        (B, N, D) float64.
    """
    _check_layer(layer, "dual_output")
    if solution.rank != layer.rank:
        raise ValueError(f"dual_output: expected a solution of the layer's rank {layer.rank}, got rank {solution.rank}")
    kernel = solution.kernel()
    escore = kernel @ solution.v
    rscore = kernel.transpose(-2, -1) @ solution.u
    mixed = F.linear(torch.cat([escore, rscore], dim=-1), _f64(layer.mix.weight), _f64(layer.mix.bias))
    mixed = mixed * solution.mask[:, None, :, None].to(F64)
    batch, heads, tokens, width = mixed.shape
    merged = mixed.permute(0, 2, 1, 3).reshape(batch, tokens, heads * width)
    return F.linear(merged, _f64(layer.out_proj.weight), _f64(layer.out_proj.bias))


def sampled_tokens(layer: PrimalAttention, x: Tensor, mask: Tensor | None = None) -> Tensor:
    """X̃ of a non-causal layer (docs/method.md §2 step 3): (B, H, n, d), the sampled rows of x split
    into heads, so that W_{e|X}[b, h] = X̃[b, h]ᵀ W_e[h]."""
    _check_layer(layer, "sampled_tokens")
    if layer.causal:
        raise ValueError("sampled_tokens: a causal layer samples no tokens (its W_e, W_r are static)")
    check_input(x, mask, layer.embed_dim, name="sampled_tokens")
    batch, tokens, _ = x.shape
    n = layer.num_samples
    if layer.sampling == "uniform" or mask is None:
        index = reference.uniform_sample_index(tokens, n, x.device).expand(batch, n)
    else:
        index = reference.valid_sample_index(mask, n)
    picked = torch.stack([x[b, index[b]] for b in range(batch)])
    return picked.reshape(batch, n, layer.num_heads, layer.head_dim).permute(0, 2, 1, 3)


@torch.no_grad()
def solution_state(layer: PrimalAttention, x: Tensor, mask: Tensor | None = None, *,
                   method: str = "factored") -> dict[str, Tensor]:
    """Parameters that put ``layer`` at the KSVD solution of its kernel on one sample x (1, N, D).

    Causal layers: W_e, W_r := the optimal Φ_kᵀV_s, Φ_qᵀU_s. Non-causal layers: the minimum-norm
    W_e[h] (n×s) with X̃_hᵀ W_e[h] = Φ_kᵀV_s (likewise W_r), so that W_{e|X} is the optimum. Λ := Σ_s⁻¹
    (``lam``, or ``log_lam`` with ``positive_lambda``). Load with ``layer.load_state_dict(state,
    strict=False)``; the feature maps do not depend on these parameters, so the solution stays the same.

    Returns:
        {"we": (H, n or d, s), "wr": same, "lam" or "log_lam": (H, s)} in the layer's dtype.

    Raises:
        ValueError: more than one sample, or (non-causal) sampled tokens that span fewer than d_h
            directions of a head, so that no W_e reaches the optimum.
    """
    _check_layer(layer, "solution_state")
    if not isinstance(x, Tensor) or x.dim() != 3 or x.shape[0] != 1:
        got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"solution_state: expected one sample, x of shape (1, N, {layer.embed_dim}), got {got}")
    sol = layer_ksvd(layer, x, mask, method=method)
    we, wr = sol.we[0], sol.wr[0]
    if not layer.causal:
        xt = sampled_tokens(layer, x.detach().to(F64), mask)[0].transpose(-2, -1)  # (H, d, n)
        pinv = torch.linalg.pinv(xt)
        for target in (we, wr):
            miss = torch.linalg.matrix_norm(xt @ (pinv @ target) - target) / torch.linalg.matrix_norm(target)
            if bool((miss > 1e-8).any()):
                h = int((miss > 1e-8).nonzero()[0])
                rank = int(torch.linalg.matrix_rank(xt[h]))
                raise ValueError(f"solution_state: the {layer.num_samples} sampled tokens of head {h} span {rank} < "
                                 f"d_h = {layer.head_dim} directions; no W_e gives the optimal W_e|X")
        we, wr = pinv @ we, pinv @ wr
    dtype = layer.we.dtype
    lam_name, lam = ("log_lam", sol.lam[0].log()) if layer.positive_lambda else ("lam", sol.lam[0])
    return {"we": we.to(dtype), "wr": wr.to(dtype), lam_name: lam.to(dtype)}


# --------------------------------------------------------------------------------------- distances


def _orth(a: Tensor) -> Tensor:
    """An orthonormal basis (n, r) of the column span of a (n, p), r its numerical rank."""
    u, sv, _ = torch.linalg.svd(a, full_matrices=False)
    if sv.numel() == 0:
        return u[:, :0]
    keep = sv > sv[0] * max(a.shape) * torch.finfo(a.dtype).eps
    return u[:, : int(keep.sum())]


def principal_angles(a: Tensor, b: Tensor) -> Tensor:
    """Principal angles (radians, ascending) between the column spans of a (n, p) and b (n, q).

    min(rank a, rank b) angles; 0 where the spans share a direction, π/2 where they are orthogonal,
    so all 0 means the smaller span lies inside the larger. Small angles come from the sines (the
    singular values of (I − P_a)Q_b), which keeps them accurate to ~1e-16 instead of ~1e-8.
    """
    qa, qb = _orth(a.to(F64)), _orth(b.to(F64))
    if qa.shape[1] < qb.shape[1]:
        qa, qb = qb, qa
    cross = qa.transpose(0, 1) @ qb
    cos = torch.linalg.svdvals(cross).clamp(0.0, 1.0)
    sin = torch.linalg.svdvals(qb - qa @ cross).clamp(0.0, 1.0).flip(0)
    return torch.where(cos.square() > 0.5, torch.arcsin(sin), torch.arccos(cos))


@dataclass(frozen=True)
class KSVDDistances:
    """How far one primal layer is from the KSVD solution of its kernel, per sample and head.

    Every field is a (B, H) float64 tensor on the CPU, NaN where undefined (a sample without real tokens, a zero
    score matrix). s_b = min(s, rank of sample b's kernels) singular pairs are the target.

    * ``solution_rank``: s_b; ``kernel_rank``: the numerical rank of K;
    * ``angle_e_max``, ``angle_e_mean`` (degrees): principal angles between span(E) of the learned
      scores and span(U_{s_b}), the optimal E = UΣ; ``angle_r_*``: span(R) against span(V_{s_b});
      ``angle_we_*``, ``angle_wr_*``: span(W_{e|X}) against span(Φ_kᵀV_{s_b}) in feature space,
      span(W_{r|X}) against span(Φ_qᵀU_{s_b});
    * ``captured_optimal``: Σ_{i≤s_b} σ_i² / Σ σ_i², the share of ‖K‖²_F a rank-s KSVD captures;
      ``captured_learned``: ‖Q_Eᵀ K Q_R‖²_F / ‖K‖²_F with Q_E, Q_R orthonormal bases of span(E),
      span(R) — the share the learned score spaces capture (≤ captured_optimal);
    * ``objective_ratio``: ‖Q_Eᵀ K Q_R‖_* / Σ_{i≤s_b} σ_i, the Ky Fan objective max Tr(H_eᵀ K H_r) over
      orthonormal H_e, H_r inside the learned spaces against its optimum (1 at the solution);
    * ``j_learned``: the paper's J of the learned W_{e|X}, W_{r|X}, Λ; ``j_optimal``: of the solution
      (0 up to rounding);
    * ``res_e``, ``res_r`` and ``res_e_scaled``, ``res_r_scaled``: the stationarity residuals of the
      learned layer (:func:`primal_attention.ksvd.stationarity_residuals`, plain and rescaled).
    """

    solution_rank: Tensor
    kernel_rank: Tensor
    angle_e_max: Tensor
    angle_e_mean: Tensor
    angle_r_max: Tensor
    angle_r_mean: Tensor
    angle_we_max: Tensor
    angle_we_mean: Tensor
    angle_wr_max: Tensor
    angle_wr_mean: Tensor
    captured_optimal: Tensor
    captured_learned: Tensor
    objective_ratio: Tensor
    j_learned: Tensor
    j_optimal: Tensor
    res_e: Tensor
    res_r: Tensor
    res_e_scaled: Tensor
    res_r_scaled: Tensor

    def summary(self) -> dict[str, float]:
        """Mean of every field over samples and heads (NaN entries left out): field name -> float."""
        return {f.name: float(getattr(self, f.name).to(F64).nanmean()) for f in fields(self)}


def _angles(a: Tensor, b: Tensor) -> tuple[float, float]:
    """(max, mean) principal angle in degrees, NaN when a span is empty."""
    theta = principal_angles(a, b)
    if theta.numel() == 0:
        return math.nan, math.nan
    return math.degrees(float(theta.max())), math.degrees(float(theta.mean()))


@torch.no_grad()
def ksvd_distances(
    layer: PrimalAttention,
    x: Tensor,
    mask: Tensor | None = None,
    *,
    rank: int | None = None,
    method: str = "factored",
) -> KSVDDistances:
    """Distances of a primal layer, as it is, to the exact KSVD solution of its kernel on x.

    Args:
        layer: the (trained) :class:`PrimalAttention`. x: (B, N, D) its input; mask: (B, N) bool or None.
        rank: s of the target solution; default the layer's rank. Per sample it is capped at the
            kernel's rank (short sequences: L < s), see :class:`KSVDDistances`.
        method: see :func:`solve_ksvd`.

    The learned side: the layer's W_{e|X}, W_{r|X} (causal: W_e, W_r), its scores E, R and its Λ,
    from the float64 reference forward, over each sample's real tokens.
    """
    name = "ksvd_distances"
    _check_method(method, name)
    trace = layer_features(layer, x, mask)
    s = layer.rank if rank is None else rank
    _check_rank(s, name)
    batch, heads, tokens, width = trace.q_hat.shape
    mask = torch.ones(batch, tokens, dtype=torch.bool, device=x.device) if mask is None else mask
    lam = layer.lambdas.detach().to(F64)
    plain = stationarity_residuals(trace.q_hat, trace.k_hat, trace.escore, trace.rscore, trace.we_x, trace.wr_x,
                                   lam, mask)
    scaled = stationarity_residuals(trace.q_hat, trace.k_hat, trace.escore, trace.rscore, trace.we_x, trace.wr_x,
                                    lam, mask, rescale=True)
    keys = [f.name for f in fields(KSVDDistances) if not f.name.startswith("res_")]
    out = {k: torch.full((batch, heads), math.nan, dtype=F64) for k in keys}
    for b in range(batch):
        real = mask[b]
        if not bool(real.any()):
            continue
        phi_q, phi_k = trace.q_hat[b][:, real], trace.k_hat[b][:, real]  # (H, L, d)
        u, sv, v = _full_svd(phi_q, phi_k, method)
        ranks = kernel_rank(sv, int(real.sum()), width)
        s_b = min(s, int(ranks.min()))
        out["kernel_rank"][b] = ranks.to(F64)
        out["solution_rank"][b] = float(s_b)
        if s_b == 0:
            continue
        sol = _solution(phi_q, phi_k, u, sv, v, s_b, real)
        energy = sv.square()
        kernel = phi_q @ phi_k.transpose(-2, -1)
        out["captured_optimal"][b] = energy[:, :s_b].sum(-1) / energy.sum(-1)
        out["j_optimal"][b] = paper_objective(phi_q, phi_k, sol.we, sol.wr, sol.lam)
        escore, rscore = trace.escore[b][:, real], trace.rscore[b][:, real]
        out["j_learned"][b] = paper_objective(phi_q, phi_k, trace.we_x[b], trace.wr_x[b], lam)
        for h in range(heads):
            pairs = {"e": (escore[h], sol.u[h]), "r": (rscore[h], sol.v[h]),
                     "we": (trace.we_x[b, h], sol.we[h]), "wr": (trace.wr_x[b, h], sol.wr[h])}
            for key, (learned, optimal) in pairs.items():
                out[f"angle_{key}_max"][b, h], out[f"angle_{key}_mean"][b, h] = _angles(learned, optimal)
            qe, qr = _orth(escore[h]), _orth(rscore[h])
            if qe.shape[1] and qr.shape[1]:
                inner = qe.transpose(0, 1) @ kernel[h] @ qr
                out["captured_learned"][b, h] = inner.square().sum() / energy[h].sum()
                out["objective_ratio"][b, h] = torch.linalg.matrix_norm(inner, "nuc") / sv[h, :s_b].sum()
    return KSVDDistances(**out, res_e=plain.res_e.cpu(), res_r=plain.res_r.cpu(), res_e_scaled=scaled.res_e.cpu(),
                         res_r_scaled=scaled.res_r.cpu())


@torch.no_grad()
def model_ksvd_distances(model: nn.Module, batch: Batch, *, method: str = "factored") -> dict[str, dict[str, float]]:
    """:func:`ksvd_distances` of every primal layer of ``model`` on one batch, summarised.

    Runs ``model(**batch.inputs)`` once in eval mode without gradients (the training mode is restored),
    records each primal layer's input, and returns layer name -> :meth:`KSVDDistances.summary`
    (means over samples and heads). A model without primal layers gives {}.
    """
    layers = primal_layers(model)
    if not layers:
        return {}
    was = model.training
    model.eval()
    try:
        with record_inputs(layers, model) as seen:
            model(**batch.inputs)
            return {name: ksvd_distances(layer, seen[name].x, seen[name].mask, method=method).summary()
                    for name, layer in layers}
    finally:
        model.train(was)
