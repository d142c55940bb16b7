"""KSVD diagnostics: stationarity residuals vanish exactly at a KSVD solution, and a model's report."""

from __future__ import annotations

import torch

import primal_attention as pa
from primal_attention.ksvd import diagnostics as dg


def stationary_point(n: int = 12, p: int = 5, s: int = 3):
    """docs/method.md §4: K = Φ_q Φ_kᵀ = U Σ Vᵀ, W_e = Φ_kᵀ V_s, W_r = Φ_qᵀ U_s, Λ = Σ_s⁻¹ (B = H = 1)."""
    torch.manual_seed(0)
    phi_q = torch.randn(n, p, dtype=torch.float64)
    phi_k = torch.randn(n, p, dtype=torch.float64)
    u, sigma, vh = torch.linalg.svd(phi_q @ phi_k.T)
    u, sigma, v = u[:, :s], sigma[:s], vh[:s].T
    we_x, wr_x = phi_k.T @ v, phi_q.T @ u
    e, r = phi_q @ we_x, phi_k @ wr_x
    b = lambda t: t[None, None]  # noqa: E731
    return b(phi_q), b(phi_k), b(e), b(r), b(we_x), b(wr_x), (1 / sigma)[None]


def test_residuals_vanish_at_a_ksvd_stationary_point_and_not_off_it() -> None:
    phi_q, phi_k, e, r, we_x, wr_x, lam = stationary_point()
    res = dg.stationarity_residuals(phi_q, phi_k, e, r, we_x, wr_x, lam)
    assert res.res_e.shape == res.res_r.shape == (1, 1)
    assert float(res.res_e) < 1e-12 and float(res.res_r) < 1e-12 and float(res.scale) == 1.0
    # Off the solution: wrong Λ, wrong scores, wrong projections, a non-singular direction.
    assert float(dg.stationarity_residuals(phi_q, phi_k, e, r, we_x, wr_x, lam * 1.1).res_e) > 0.05
    assert float(dg.stationarity_residuals(phi_q, phi_k, e, r * 1.2, we_x, wr_x, lam).res_e) > 0.1
    noisy = wr_x + 0.1 * torch.randn_like(wr_x)
    assert float(dg.stationarity_residuals(phi_q, phi_k, e, r, we_x, noisy, lam).res_r) > 0.01
    q, _ = torch.linalg.qr(torch.randn(5, 3, dtype=torch.float64))
    we_rot, wr_rot = (phi_k[0, 0].T @ phi_k[0, 0] @ q)[None, None], q[None, None]
    bad = dg.stationarity_residuals(phi_q, phi_k, phi_q @ we_rot, phi_k @ wr_rot, we_rot, wr_rot, lam)
    assert float(bad.res_e) > 0.1 and float(bad.res_r) > 0.1


def test_rescaled_residuals_absorb_only_a_common_scale_of_lambda() -> None:
    phi_q, phi_k, e, r, we_x, wr_x, lam = stationary_point()
    plain = dg.stationarity_residuals(phi_q, phi_k, e, r, we_x, wr_x, 3.0 * lam)
    scaled = dg.stationarity_residuals(phi_q, phi_k, e, r, we_x, wr_x, 3.0 * lam, rescale=True)
    assert float(plain.res_e) > 1.0
    assert float(scaled.res_e) < 1e-12 and float(scaled.res_r) < 1e-12
    torch.testing.assert_close(scaled.scale, torch.full((1, 1), 1 / 3, dtype=torch.float64))
    uneven = lam * torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64)
    assert float(dg.stationarity_residuals(phi_q, phi_k, e, r, we_x, wr_x, uneven, rescale=True).res_e) > 0.05


def test_residuals_ignore_padding_tokens() -> None:
    phi_q, phi_k, e, r, we_x, wr_x, lam = stationary_point()
    pad = lambda t: torch.cat([t, torch.randn(1, 1, 4, t.shape[-1], dtype=t.dtype)], dim=2)  # noqa: E731
    weight = torch.cat([torch.ones(1, 12), torch.zeros(1, 4)], dim=1)
    res = dg.stationarity_residuals(pad(phi_q), pad(phi_k), pad(e), pad(r), we_x, wr_x, lam, weight)
    assert float(res.res_e) < 1e-12 and float(res.res_r) < 1e-12
    assert float(dg.stationarity_residuals(pad(phi_q), pad(phi_k), pad(e), pad(r), we_x, wr_x, lam).res_e) > 1e-3


def test_ksvd_diagnostics_of_a_model(tiny_classifier, ragged_data) -> None:
    model = tiny_classifier(("softmax", "primal", "primal"))
    model.train()
    data = ragged_data()
    diag = dg.ksvd_diagnostics(model, data.batch(torch.arange(len(data))))
    assert model.training  # mode restored
    names = [n for n, _ in pa.primal_layers(model)]
    assert names == ["encoder.blocks.1.attn", "encoder.blocks.2.attn"]
    for name in names:
        for key in ("J_authors", "J_paper", "J_authors_rms", "lam_mean", "lam_abs_mean", "lam_min", "lam_max",
                    "res_we", "res_wr", "res_we_scaled", "res_wr_scaled", "kkt_scale", "res_we.h1", "res_wr.h0"):
            assert isinstance(diag[f"{name}.{key}"], float)
        layer = dict(pa.primal_layers(model))[name]
        assert diag[f"{name}.lam_max"] == float(layer.lambdas.detach().max())
        assert diag[f"{name}.res_we"] > 0.0  # a random model is not at a KSVD solution
        assert diag[f"{name}.res_we_scaled"] <= 1.0 + 1e-12  # c = 0 is always allowed
    assert not any(k.startswith("encoder.blocks.0") for k in diag)
    model.eval()
    with torch.no_grad(), pa.ksvd_terms(model, inference=True) as terms:
        model(data.x, data.mask)
        j = terms.objectives("batch", "paper")
        js = terms.objectives("sample", "authors")
    assert abs(diag[f"{names[0]}.J_paper"] - float(j[names[0]])) < 1e-5 * max(1.0, abs(float(j[names[0]])))
    assert abs(diag[f"{names[1]}.J_authors_rms"] - float(js[names[1]].square().mean().sqrt())) < 1e-6
    # The per-head residuals average to the layer residual (equal heads weights).
    h = [diag[f"{names[0]}.res_we.h{i}"] for i in range(2)]
    assert abs(sum(h) / 2 - diag[f"{names[0]}.res_we"]) < 1e-12
    assert not any(k.endswith(".h0") for k in dg.ksvd_diagnostics(model, data.batch(torch.arange(len(data))), per_head=False))
    assert dg.ksvd_diagnostics(tiny_classifier(("softmax", "softmax")), data.batch(torch.arange(len(data)))) == {}
