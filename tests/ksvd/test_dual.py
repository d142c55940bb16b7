"""The KSVD dual solver (docs/method.md §7): the exact solution of a layer's kernel satisfies the KKT
conditions with J = 0, its primal and dual forms agree, and a layer's distances to it."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import primal_attention as pa
from primal_attention.ksvd import (
    dual_output,
    ksvd_distances,
    layer_ksvd,
    model_ksvd_distances,
    paper_objective,
    principal_angles,
    solution_state,
    solve_ksvd,
    stationarity_residuals,
)
from primal_attention.ksvd.dual import kernel_rank

F64 = torch.float64


def features(b: int = 2, h: int = 2, n: int = 12, d: int = 5, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, h, n, d, generator=g, dtype=F64), torch.randn(b, h, n, d, generator=g, dtype=F64)


def ragged_mask(n: int = 12) -> torch.Tensor:
    """Sample 0: all real; sample 1: the last 3 tokens are padding."""
    return torch.stack([torch.ones(n, dtype=torch.bool), torch.arange(n) < n - 3])


def layer(causal: bool = False, *, rank: int = 2, sampling: str = "uniform", positive_lambda: bool = False,
          num_samples: int = 6) -> pa.PrimalAttention:
    """D 8, H 2 (d_h 4), s 2, n 6, float64."""
    torch.manual_seed(1)
    return pa.PrimalAttention(8, 2, rank=rank, num_samples=num_samples, causal=causal, sampling=sampling,
                              positive_lambda=positive_lambda).double()


@pytest.mark.parametrize("method", ["factored", "dense"])
def test_the_solution_satisfies_the_kkt_conditions_and_j_is_zero(method: str) -> None:
    phi_q, phi_k = features()
    mask = ragged_mask()
    sol = solve_ksvd(phi_q, phi_k, 3, mask=mask, method=method)
    assert sol.sigma.shape == (2, 2, 3) and sol.u.shape == (2, 2, 12, 3) and sol.we.shape == (2, 2, 5, 3)
    kernel = sol.kernel()
    lam = sol.lam[..., None, :]
    # Dual: K H_r = H_e Σ, Kᵀ H_e = H_r Σ. Primal KKT: W_e = Φ_kᵀ R Λ, W_r = Φ_qᵀ E Λ.
    torch.testing.assert_close(kernel @ sol.v, sol.u * sol.sigma[..., None, :], atol=1e-12, rtol=0)
    torch.testing.assert_close(kernel.transpose(-2, -1) @ sol.u, sol.v * sol.sigma[..., None, :], atol=1e-12, rtol=0)
    torch.testing.assert_close(sol.we, sol.phi_k.transpose(-2, -1) @ sol.rscore * lam, atol=1e-12, rtol=0)
    torch.testing.assert_close(sol.wr, sol.phi_q.transpose(-2, -1) @ sol.escore * lam, atol=1e-12, rtol=0)
    for b in range(2):  # the package's residuals (one Λ per head) agree
        res = stationarity_residuals(sol.phi_q[b:b + 1], sol.phi_k[b:b + 1], sol.escore[b:b + 1],
                                     sol.rscore[b:b + 1], sol.we[b:b + 1], sol.wr[b:b + 1], sol.lam[b], mask[b:b + 1])
        assert float(res.res_e.max()) < 1e-12 and float(res.res_r.max()) < 1e-12
    # The paper's lemma: each score term is ½ Σ σ_i and the trace is Σ σ_i, so J = 0.
    j = paper_objective(sol.phi_q, sol.phi_k, sol.we, sol.wr, sol.lam)
    assert j.shape == (2, 2) and float(j.abs().max()) <= 1e-10
    torch.testing.assert_close((sol.we * sol.wr).sum((-2, -1)), sol.sigma.sum(-1), atol=1e-10, rtol=0)
    assert float(paper_objective(sol.phi_q, sol.phi_k, sol.we, sol.wr, 1.5 * sol.lam).abs().min()) > 0.1
    # Padding is removed: the singular vectors are 0 there.
    assert float(sol.u[1, :, 9:].abs().max()) < 1e-12 and float(sol.v[1, :, 9:].abs().max()) < 1e-12


def test_primal_scores_of_the_optimal_projections_are_u_sigma_and_v_sigma() -> None:
    phi_q, phi_k = features()
    sol = solve_ksvd(phi_q, phi_k, 4)
    torch.testing.assert_close(phi_q @ sol.we, sol.u * sol.sigma[..., None, :], atol=1e-12, rtol=0)
    torch.testing.assert_close(phi_k @ sol.wr, sol.v * sol.sigma[..., None, :], atol=1e-12, rtol=0)
    # Unit-norm dual variables H_e = EΛ = U, H_r = RΛ = V, orthonormal columns.
    eye = torch.eye(4, dtype=F64).expand(2, 2, 4, 4)
    torch.testing.assert_close(sol.u.transpose(-2, -1) @ sol.u, eye, atol=1e-12, rtol=0)
    torch.testing.assert_close(sol.v.transpose(-2, -1) @ sol.v, eye, atol=1e-12, rtol=0)
    torch.testing.assert_close(sol.escore * sol.lam[..., None, :], sol.u, atol=1e-12, rtol=0)
    assert bool((sol.sigma[..., :-1] >= sol.sigma[..., 1:]).all())
    torch.testing.assert_close(sol.spectrum, torch.linalg.svdvals(sol.kernel())[..., :5], atol=1e-12, rtol=0)


def test_factored_and_dense_svd_give_the_same_solution() -> None:
    phi_q, phi_k = features(n=9, d=6, seed=3)
    mask = ragged_mask(9)
    a = solve_ksvd(phi_q, phi_k, 4, mask=mask, method="factored")
    b = solve_ksvd(phi_q, phi_k, 4, mask=mask, method="dense")
    for name in ("sigma", "spectrum", "u", "v", "we", "wr"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), atol=1e-10, rtol=0, msg=name)


def test_a_rank_r_kernel_has_exactly_r_nonzero_singular_values() -> None:
    g = torch.Generator().manual_seed(4)
    r, n, d = 2, 10, 6
    phi_q = (torch.randn(n, r, generator=g, dtype=F64) @ torch.randn(r, d, generator=g, dtype=F64))[None, None]
    phi_k = torch.randn(1, 1, n, d, generator=g, dtype=F64)
    for method in ("factored", "dense"):
        sol = solve_ksvd(phi_q, phi_k, r, method=method)
        assert int(kernel_rank(sol.spectrum, n, d)) == r
        assert float(sol.spectrum[..., r - 1]) > 1e-3 and float(sol.spectrum[..., r:].max()) < 1e-12
        with pytest.raises(ValueError, match=r"rank s = 3 exceeds the rank 2 of the kernel of sample 0, head 0"):
            solve_ksvd(phi_q, phi_k, r + 1, method=method)
    # Fewer real tokens than s: the kernel of sample 1 has rank 9 < 10 (d = 12).
    full_q, full_k = features(n=12, d=12)
    with pytest.raises(ValueError, match=r"exceeds the rank 9 of the kernel of sample 1, head 0 \(9 real tokens"):
        solve_ksvd(full_q, full_k, 10, mask=ragged_mask())


@pytest.mark.parametrize(
    "causal, masked, sampling, positive",
    [(False, False, "uniform", False), (False, True, "uniform", False), (False, True, "valid", True),
     (True, False, "uniform", False), (True, True, "valid", True)],
)
def test_a_layer_set_to_the_solution_has_equal_primal_and_dual_outputs(causal: bool, masked: bool, sampling: str,
                                                                       positive: bool) -> None:
    attn = layer(causal, sampling=sampling, positive_lambda=positive)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, 10, 8, generator=g, dtype=F64)
    mask = (torch.arange(10) < 7)[None] if masked else None
    state = solution_state(attn, x, mask)
    assert set(state) == {"we", "wr", "log_lam" if positive else "lam"}
    attn.load_state_dict(state, strict=False)
    sol = pa.layer_ksvd(attn, x, mask)  # also exported from the package root
    torch.testing.assert_close(attn.lambdas[None], sol.lam, atol=1e-12, rtol=1e-12)
    with pa.ksvd_terms(attn) as terms:
        primal = attn(x, mask)  # the fast path, no N×N matrix
    torch.testing.assert_close(primal, dual_output(attn, sol), atol=1e-12, rtol=0)
    trace = pa.ksvd.dual.layer_features(attn, x, mask)
    torch.testing.assert_close(trace.we_x, sol.we, atol=1e-12, rtol=0)  # W_{e|X} is the optimum
    if not (masked and sampling == "uniform"):  # there the layer's paper J also sums padding tokens
        assert float(terms.objective("sample", "paper").detach().abs().max()) <= 1e-10
    dist = pa.ksvd_distances(attn, x, mask)
    for key in ("angle_e_max", "angle_r_max", "angle_we_max", "angle_wr_max", "res_e", "res_r", "j_learned"):
        assert abs(float(getattr(dist, key).max())) < 1e-6, key
    torch.testing.assert_close(dist.objective_ratio, torch.ones(1, 2, dtype=F64), atol=1e-12, rtol=0)
    torch.testing.assert_close(dist.captured_learned, dist.captured_optimal, atol=1e-12, rtol=0)


def test_distances_of_a_random_layer_are_positive_and_handle_short_samples() -> None:
    attn = layer(rank=3, sampling="valid")
    g = torch.Generator().manual_seed(6)
    x = torch.randn(3, 10, 8, generator=g, dtype=F64)
    mask = torch.arange(10)[None] < torch.tensor([10, 2, 0])[:, None]  # full, 2 tokens (< s), none
    dist = ksvd_distances(attn, x, mask)
    assert dist.angle_e_max.shape == (3, 2)
    assert dist.solution_rank[:, 0].tolist()[:2] == [3.0, 2.0] and math.isnan(float(dist.solution_rank[2, 0]))
    assert dist.kernel_rank[0].tolist() == [4.0, 4.0]
    assert float(dist.angle_e_max[0].min()) > 1.0 and float(dist.angle_we_mean[0].min()) > 1.0
    assert bool((dist.objective_ratio[0] < 0.999).all())
    assert bool((dist.captured_learned[0] < dist.captured_optimal[0]).all())
    assert float(dist.j_learned[0].abs().min()) > 1e-3 and float(dist.j_optimal[:2].abs().max()) < 1e-10
    # Sample 1 (L = 2 < s = 3): the target is its whole rank-2 kernel, captured fully.
    torch.testing.assert_close(dist.captured_optimal[1], torch.ones(2, dtype=F64), atol=1e-12, rtol=0)
    assert bool(torch.isnan(dist.angle_e_max[2]).all())
    summary = dist.summary()
    assert summary["solution_rank"] == 2.5 and not any(math.isnan(v) for v in summary.values())
    # Same numbers through the dense SVD of K.
    dense = ksvd_distances(attn, x, mask, method="dense")
    for key in ("captured_optimal", "captured_learned", "objective_ratio", "angle_e_mean", "angle_wr_mean"):
        torch.testing.assert_close(getattr(dense, key), getattr(dist, key), atol=1e-8, rtol=0, equal_nan=True)


def test_with_s_at_least_l_only_feature_space_distances_j_and_residuals_are_informative() -> None:
    """docs/method.md §7: s ≥ L makes the target the whole kernel, which any full-rank E already spans."""
    torch.manual_seed(2)
    attn = pa.PrimalAttention(16, 2, rank=12, num_samples=10).double()  # d_h 8, s 12 > L 6
    dist = ksvd_distances(attn, torch.randn(2, 6, 16, dtype=F64))
    assert bool((dist.solution_rank == dist.kernel_rank).all()) and float(dist.kernel_rank.max()) == 6.0
    assert float(dist.angle_e_max.max()) < 1e-6 and float(dist.angle_r_max.max()) < 1e-6
    torch.testing.assert_close(dist.objective_ratio, torch.ones(2, 2, dtype=F64), atol=1e-10, rtol=0)
    assert float(dist.angle_we_mean.min()) > 1.0 and float(dist.res_e_scaled.min()) > 0.1
    assert float(dist.j_learned.abs().min()) > 1e-3


def test_principal_angles_are_accurate_for_small_and_large_angles() -> None:
    e = torch.eye(4, dtype=F64)
    for t in (1e-9, 0.3, math.pi / 2):
        b = (math.cos(t) * e[:, 0] + math.sin(t) * e[:, 2])[:, None]
        theta = principal_angles(e[:, :2], torch.cat([b, e[:, 1:2]], dim=1))
        torch.testing.assert_close(theta, torch.tensor([0.0, t], dtype=F64), atol=1e-15, rtol=1e-9)
    # A smaller span inside a larger one: all angles 0; a zero matrix has no angles.
    assert float(principal_angles(e[:, :3], e[:, 1:2] + e[:, 2:3]).max()) < 1e-15
    assert principal_angles(e[:, :2], torch.zeros(4, 2, dtype=F64)).numel() == 0


def test_model_distances_cover_every_primal_layer(tiny_classifier, ragged_data) -> None:
    model = tiny_classifier(("softmax", "primal", "primal")).double()
    model.train()
    data = ragged_data()
    data.x = data.x.double()
    out = model_ksvd_distances(model, data.batch(torch.arange(len(data))))
    assert model.training
    assert list(out) == ["encoder.blocks.1.attn", "encoder.blocks.2.attn"]
    for summary in out.values():
        assert 0.0 < summary["objective_ratio"] < 1.0 and summary["angle_e_max"] > 0.0
        assert 0.0 < summary["captured_learned"] < summary["captured_optimal"] <= 1.0
    assert model_ksvd_distances(nn.Sequential(nn.Linear(2, 2)), data.batch(torch.arange(2))) == {}


def test_bad_inputs_give_clear_errors() -> None:
    phi_q, phi_k = features()
    with pytest.raises(ValueError, match=r"expected phi_q and phi_k of one shape \(B, H, N, d\), got \(2, 2, 12, 5\) "
                                         r"and \(2, 2, 12, 4\)"):
        solve_ksvd(phi_q, phi_k[..., :4], 2)
    with pytest.raises(ValueError, match=r"of one shape \(B, H, N, d\), got \(12, 5\)"):
        solve_ksvd(phi_q[0, 0], phi_k[0, 0], 2)
    with pytest.raises(ValueError, match=r"expected mask of shape \(2, 12\) bool, got \(2, 11\)"):
        solve_ksvd(phi_q, phi_k, 2, mask=torch.ones(2, 11, dtype=torch.bool))
    for bad in (0, True, 2.0):
        with pytest.raises(ValueError, match="expected a positive int rank s"):
            solve_ksvd(phi_q, phi_k, bad)
    with pytest.raises(ValueError, match=r"method must be one of \('factored', 'dense'\), got 'eig'"):
        solve_ksvd(phi_q, phi_k, 2, method="eig")
    x = torch.randn(1, 10, 8, dtype=F64)
    for module in (nn.Linear(8, 8), pa.SoftmaxAttention(8, 2)):
        with pytest.raises(TypeError, match="layer_features: expected a PrimalAttention layer, got"):
            layer_ksvd(module, x)
        with pytest.raises(TypeError, match="expected a PrimalAttention layer"):
            ksvd_distances(module, x)
    attn = layer()
    with pytest.raises(ValueError, match=r"expected x of shape \(B, N, 8\), got \(1, 10, 6\)"):
        layer_ksvd(attn, x[..., :6])
    with pytest.raises(ValueError, match=r"exceeds the rank 1 of the kernel of sample 0, head 0 \(1 real tokens"):
        layer_ksvd(attn, x, (torch.arange(10) < 1)[None])
    with pytest.raises(ValueError, match=r"solution_state: expected one sample, x of shape \(1, N, 8\), got \(2, 10, 8\)"):
        solution_state(attn, x.expand(2, -1, -1))
    few = layer(num_samples=2)  # 2 sampled tokens cannot span d_h = 4 directions
    with pytest.raises(ValueError, match=r"the 2 sampled tokens of head 0 span 2 < d_h = 4 directions"):
        solution_state(few, x)
    with pytest.raises(ValueError, match="expected a solution of the layer's rank 2, got rank 3"):
        dual_output(attn, layer_ksvd(attn, x, rank=3))
