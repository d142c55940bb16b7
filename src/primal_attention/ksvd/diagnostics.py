"""How close a primal layer is to a KSVD solution (docs/method.md §1, §4).

The KSVD problem of one head, with Φ_q = q̂, Φ_k = k̂ (N×d) the sample's feature matrices, E, R
(N×s) its projection scores and Λ = diag(λ), is stationary (KKT) exactly when

    W_e = Φ_kᵀ R Λ   and   W_r = Φ_qᵀ E Λ,

which makes the columns of EΛ, RΛ singular vectors of K = Φ_q Φ_kᵀ with singular values Λ⁻¹, and
J = 0. For a primal layer W_e, W_r are the data-dependent projections W_{e|X}, W_{r|X} (d×s) of
that sample (the static ones for causal layers). :func:`stationarity_residuals` measures

    res_e = ‖W_e − Φ_kᵀ R Λ‖_F / ‖W_e‖_F,   res_r = ‖W_r − Φ_qᵀ E Λ‖_F / ‖W_r‖_F

per sample and head over the sample's real tokens (0 = exact KKT point), and, with
``rescale=True``, the same after the best common factor c ≥ 0 on Λ (c Λ for both conditions),
because the authors' objective (means over tokens, Λ squared) fixes Λ only up to such a scale.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor, nn

from primal_attention.ops.primal import reference
from primal_attention.ksvd.terms import ksvd_terms, primal_layers
from primal_attention.layers.inputs import record_inputs
from primal_attention.layers.primal import PrimalAttention

if TYPE_CHECKING:
    from primal_attention.data.base import Batch


class KKTResiduals(NamedTuple):
    """res_e, res_r: (B, H) relative residuals; scale: (B, H) the factor c applied to Λ (1 unless
    ``rescale``)."""

    res_e: Tensor
    res_r: Tensor
    scale: Tensor


def stationarity_residuals(
    phi_q: Tensor,
    phi_k: Tensor,
    escore: Tensor,
    rscore: Tensor,
    we_x: Tensor,
    wr_x: Tensor,
    lam: Tensor,
    weight: Tensor | None = None,
    *,
    rescale: bool = False,
) -> KKTResiduals:
    """Relative KKT residuals of the KSVD problem, per sample and head.

    Args:
        phi_q, phi_k: (B, H, N, d) feature matrices q̂, k̂. escore, rscore: (B, H, N, s) E, R.
        we_x, wr_x: (B, H, d, s) W_{e|X}, W_{r|X}. lam: (H, s) Λ.
        weight: (B, N), 1 = real token, 0 = padding (left out of Φ_kᵀR and Φ_qᵀE), or None.
        rescale: replace Λ by c·Λ with the c ≥ 0 that minimises
            ‖W_e − c F_e‖² + ‖W_r − c F_r‖² (F_e = Φ_kᵀRΛ, F_r = Φ_qᵀEΛ), i.e.
            c = max(0, (⟨W_e, F_e⟩ + ⟨W_r, F_r⟩) / (‖F_e‖² + ‖F_r‖²)).

    Returns:
        :class:`KKTResiduals`; a residual is the plain norm of the difference where ‖W‖ = 0.
    """
    if weight is not None:
        w = weight.to(phi_q.dtype)[:, None, :, None]
        phi_q, phi_k = phi_q * w, phi_k * w
    lam = lam[None, :, None, :].to(phi_q.dtype)
    fit_e = torch.einsum("bhnc,bhns->bhcs", phi_k, rscore) * lam  # Φ_kᵀ R Λ
    fit_r = torch.einsum("bhnc,bhns->bhcs", phi_q, escore) * lam  # Φ_qᵀ E Λ
    if rescale:
        num = (we_x * fit_e).sum(dim=(-2, -1)) + (wr_x * fit_r).sum(dim=(-2, -1))
        den = fit_e.square().sum(dim=(-2, -1)) + fit_r.square().sum(dim=(-2, -1))
        scale = torch.where(den > 0, num / den.clamp_min(torch.finfo(den.dtype).tiny), torch.zeros_like(num))
        scale = scale.clamp_min(0.0)
    else:
        scale = torch.ones(fit_e.shape[:2], dtype=fit_e.dtype, device=fit_e.device)

    def rel(w_: Tensor, fit: Tensor) -> Tensor:
        num = torch.linalg.matrix_norm(w_ - scale[..., None, None] * fit)
        den = torch.linalg.matrix_norm(w_)
        return torch.where(den > 0, num / den.clamp_min(torch.finfo(den.dtype).tiny), num)

    return KKTResiduals(rel(we_x, fit_e), rel(wr_x, fit_r), scale)


@torch.no_grad()
def ksvd_diagnostics(model: nn.Module, batch: Batch, *, per_head: bool = True) -> dict[str, float]:
    """KSVD state of every primal layer on one batch, as a flat dict of floats.

    Runs one forward of ``batch`` (``model(**batch.inputs)``) in eval mode without gradients, and
    restores the training mode. Keys, for
    a primal layer named ``L``:

    * ``L.J_authors``, ``L.J_paper``: signed J (docs/method.md §4, the authors' and the paper's form)
      of the layer's forward, through a :func:`~primal_attention.ksvd.terms.ksvd_terms` scope (nothing
      is left on the layers); ``L.J_authors_rms``: √(mean_b J_b²) of the authors' per-sample J, what
      the "sample" reduction squares. A layer called more than once (two towers) reports every call:
      ``L#2.J_authors``, ... (the keys below are of its latest call);
    * ``L.lam_mean``, ``L.lam_abs_mean``, ``L.lam_min``, ``L.lam_max``: of Λ = ``layer.lambdas``;
    * ``L.res_we``, ``L.res_wr``: :func:`stationarity_residuals` (float64, the sample's real
      tokens, through :func:`primal_attention.ops.primal.reference.primal_attention` on the captured layer
      input), mean over samples and heads; ``L.res_we_scaled``, ``L.res_wr_scaled``, ``L.kkt_scale``:
      the same with the best common scale c on Λ, and the mean c;
    * with ``per_head``: ``L.res_we.h{h}``, ``L.res_wr.h{h}`` (mean over samples).
    """
    layers = primal_layers(model)
    if not layers:
        return {}
    was = model.training
    model.eval()
    out: dict[str, float] = {}
    try:
        with record_inputs(layers, model) as seen, ksvd_terms(model, inference=True) as terms:
            model(**batch.inputs)
            for key, j in terms.objectives("batch", "authors").items():
                out[f"{key}.J_authors"] = float(j)
            for key, j in terms.objectives("batch", "paper").items():
                out[f"{key}.J_paper"] = float(j)
            for key, j in terms.objectives("sample", "authors").items():
                out[f"{key}.J_authors_rms"] = float(j.square().mean().sqrt())
            for name, layer in layers:
                lam = layer.lambdas.detach().to(torch.float64)
                out[f"{name}.lam_mean"] = float(lam.mean())
                out[f"{name}.lam_abs_mean"] = float(lam.abs().mean())
                out[f"{name}.lam_min"] = float(lam.min())
                out[f"{name}.lam_max"] = float(lam.max())
                inp = seen[name]
                t = reference_trace(layer, inp.x, inp.mask)
                args = (t.q_hat, t.k_hat, t.escore, t.rscore, t.we_x, t.wr_x, lam, inp.mask)
                plain = stationarity_residuals(*args)
                scaled = stationarity_residuals(*args, rescale=True)
                out[f"{name}.res_we"] = float(plain.res_e.mean())
                out[f"{name}.res_wr"] = float(plain.res_r.mean())
                out[f"{name}.res_we_scaled"] = float(scaled.res_e.mean())
                out[f"{name}.res_wr_scaled"] = float(scaled.res_r.mean())
                out[f"{name}.kkt_scale"] = float(scaled.scale.mean())
                if per_head:
                    for h in range(plain.res_e.shape[1]):
                        out[f"{name}.res_we.h{h}"] = float(plain.res_e[:, h].mean())
                        out[f"{name}.res_wr.h{h}"] = float(plain.res_r[:, h].mean())
    finally:
        model.train(was)
    return out


def reference_trace(layer: PrimalAttention, x: Tensor, mask: Tensor) -> reference.PrimalTrace:
    """The reference forward of a primal layer on its recorded input, float64 throughout."""
    weights = reference.PrimalWeights(*[None if w is None else w.detach().to(torch.float64) for w in layer.weights()])
    return reference.primal_attention(x.to(torch.float64), weights, heads=layer.num_heads, causal=layer.causal,
                                      mask=mask, sampling=layer.sampling)
