"""The KSVD objective: definitions, reductions, options, autocast, no materialisation, KKT."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import primal_attention as pa
from primal_attention.ops.primal import reference
from primal_attention.ops.primal.reference import PrimalTrace, PrimalWeights


def tiny_model(attention=("softmax", "primal", "primal")) -> pa.SequenceClassifier:
    torch.manual_seed(0)
    cfg = pa.ClassifierConfig(num_classes=3, max_seq_len=20, vocab_size=11, dim=16, num_heads=2,
                              ffn_dim=32, attention=list(attention), attention_options={"primal": {"rank": 3}})
    return pa.SequenceClassifier(cfg)


def test_loss_is_mean_of_squares_over_primal_layers() -> None:
    model = tiny_model()
    x = torch.randint(0, 11, (4, 20))
    with pa.ksvd_terms(model) as terms:
        model(x)
        js = terms.objectives()
        assert len(js) == 2 and all(j.dim() == 0 for j in js.values())
        expected = torch.stack([j**2 for j in js.values()]).mean()
        torch.testing.assert_close(terms.loss(), expected)

        model(x)  # loss() consumed the first forward's terms
        per_sample = terms.objectives("sample")
        assert all(j.shape == (4,) for j in per_sample.values())
        expected = torch.stack([(j**2).mean() for j in per_sample.values()]).mean()
        torch.testing.assert_close(terms.loss("sample"), expected)


def test_loss_trains_the_projections() -> None:
    model = tiny_model()
    with pa.ksvd_terms(model) as terms:
        model(torch.randint(0, 11, (4, 20)))
    terms.loss().backward()
    layer = pa.primal_layers(model)[0][1]
    for p in (layer.we, layer.wr, layer.lam, layer.q_proj.weight):
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0


def test_model_without_primal_layers_gives_zero() -> None:
    model = tiny_model(("softmax",))
    with pa.ksvd_terms(model) as terms:
        model(torch.randint(0, 11, (2, 20)))
    loss = terms.loss()
    assert loss.item() == 0.0 and not loss.requires_grad


def test_objective_without_a_forward_or_with_bad_options_is_an_error() -> None:
    layer = pa.PrimalAttention(8, 2, 2)
    with pa.ksvd_terms(layer) as terms:
        with pytest.raises(RuntimeError, match="exactly one kept forward, got 0"):
            terms.objective()
        layer(torch.randn(1, 4, 8))
    with pytest.raises(ValueError, match="reduction"):
        terms.objective("mean")
    with pytest.raises(ValueError, match="form"):
        terms.objective("batch", "other")
    terms.clear()
    with pytest.raises(RuntimeError, match="got 0"):
        terms.objective()


def objective(layer: pa.PrimalAttention, *args, reduction: str = "batch", form: str = "authors") -> torch.Tensor:
    """J of one forward of ``layer`` on ``args``."""
    with pa.ksvd_terms(layer) as terms:
        layer(*args)
    return terms.objective(reduction, form)


def test_batch_reduction_is_token_weighted_mean_of_sample_reduction() -> None:
    """Without padding all samples have N tokens: J_batch = mean_b J_b (authors' form)."""
    layer = pa.PrimalAttention(16, 2, 4, num_samples=6)
    with pa.ksvd_terms(layer) as terms:
        layer(torch.randn(5, 9, 16))
    torch.testing.assert_close(terms.objective("batch"), terms.objective("sample").mean())


def test_positive_lambda_is_exp_parametrised() -> None:
    layer = pa.PrimalAttention(16, 2, 4, positive_lambda=True)
    assert not hasattr(layer, "lam") and layer.log_lam.shape == (2, 4)
    assert bool((layer.lambdas > 0).all())
    with torch.no_grad():
        layer.log_lam.fill_(-50.0)
    j = objective(layer, torch.randn(2, 30, 16))
    trace = (layer.we * layer.wr).sum() / 2
    torch.testing.assert_close(j, -trace)  # score terms vanish with Λ → 0


def test_paper_form_differs_and_uses_w_given_x() -> None:
    torch.manual_seed(0)
    layer = pa.PrimalAttention(16, 2, 4, num_samples=6).double()
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    with pa.ksvd_terms(layer) as terms:
        layer(x)
    authors, paper = terms.objective("sample"), terms.objective("sample", "paper")
    assert not torch.allclose(authors, paper)
    t = reference.primal_attention(x, layer.weights(), heads=2)
    lam = layer.lam
    by_hand = (0.5 * torch.einsum("bhns,hs,bhns->b", t.escore, lam, t.escore)
               + 0.5 * torch.einsum("bhns,hs,bhns->b", t.rscore, lam, t.rscore)
               - torch.einsum("bhcs,bhcs->b", t.we_x, t.wr_x))
    torch.testing.assert_close(paper, by_hand)


def test_valid_sampling_keeps_padding_out_of_the_objective() -> None:
    torch.manual_seed(0)
    layer = pa.PrimalAttention(16, 2, 4, num_samples=5, sampling="valid")
    x = torch.randn(1, 12, 16)
    mask = torch.arange(12)[None] < 7
    j_masked = objective(layer, x, mask, reduction="sample")
    torch.testing.assert_close(j_masked, objective(layer, x[:, :7], reduction="sample"))
    uniform = pa.PrimalAttention(16, 2, 4, num_samples=5)
    uniform.load_state_dict(layer.state_dict())
    assert not torch.allclose(objective(uniform, x, mask, reduction="sample"), j_masked)


def test_objective_is_float32_under_bf16_autocast() -> None:
    model = tiny_model()
    x = torch.randint(0, 11, (4, 20))
    with torch.autocast("cpu", dtype=torch.bfloat16), pa.ksvd_terms(model) as terms:
        logits = model(x)
        loss = terms.loss()
    assert logits.dtype == torch.bfloat16
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    (logits.float().sum() + loss).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


class ShapeRecorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.shapes.append(tuple(t.shape))
        return out


@pytest.mark.parametrize("causal", [False, True])
def test_fast_path_never_forms_the_score_tensors(causal) -> None:
    batch, seq_len, heads, rank = 2, 64, 2, 7
    layer = pa.PrimalAttention(16, heads, rank, num_samples=10, causal=causal)
    x = torch.randn(batch, seq_len, 16, requires_grad=True)
    with ShapeRecorder() as rec, pa.ksvd_terms(layer) as terms:
        out = layer(x)
        (out.sum() + terms.objective() ** 2).backward()
    big = [s for s in rec.shapes if len(s) >= 3 and rank in s and seq_len in s]
    assert not big, f"score-shaped tensors formed: {big}"
    # the readable path does form them, so the recorder can see them
    layer.impl = "reference"
    with ShapeRecorder() as rec:
        layer(x)
    assert (batch, heads, seq_len, rank) in rec.shapes


def test_stationary_point_gives_zero_paper_objective() -> None:
    """docs/method.md §4: at a KSVD solution (singular vectors of K = Φ_q Φ_kᵀ) J = 0 exactly."""
    torch.manual_seed(0)
    n, p, s = 12, 5, 3
    phi_q = torch.randn(n, p, dtype=torch.float64)
    phi_k = torch.randn(n, p, dtype=torch.float64)
    u, sigma, vh = torch.linalg.svd(phi_q @ phi_k.T)
    u, sigma, v = u[:, :s], sigma[:s], vh[:s].T
    we_x, wr_x = phi_k.T @ v, phi_q.T @ u  # W_e = Φ_kᵀ R Λ, W_r = Φ_qᵀ E Λ
    e, r = phi_q @ we_x, phi_k @ wr_x
    torch.testing.assert_close(e, u * sigma)  # E = H_e Σ
    trace = PrimalTrace(None, e[None, None], r[None, None], we_x[None, None], wr_x[None, None],
                        torch.ones(1, n, dtype=torch.float64), phi_q[None, None], phi_k[None, None])
    weights = PrimalWeights(*[None] * 6, (1 / sigma)[None], *[None] * 4)
    j = reference.ksvd_objective(trace, weights, reduction="sample", form="paper")
    torch.testing.assert_close(j, torch.zeros(1, dtype=torch.float64), atol=1e-10, rtol=0)
    off = trace._replace(escore=trace.escore * 1.1)
    assert abs(reference.ksvd_objective(off, weights, reduction="sample", form="paper").item()) > 1e-3
