"""gradcheck in float64, torch.compile(fullgraph=True) on CPU, bf16 autocast."""

from __future__ import annotations

import pytest
import torch

from primal_attention import PrimalAttention, SoftmaxAttention, ksvd_terms


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sampling", ["uniform", "valid"])
def test_gradcheck_fast_path(causal, sampling) -> None:
    torch.manual_seed(0)
    layer = PrimalAttention(6, 2, 3, num_samples=4, causal=causal, sampling=sampling).double()
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    x = torch.randn(2, 5, 6, dtype=torch.float64, requires_grad=True)

    def f(x, we, lam):
        layer.we.data, layer.lam.data = we, lam  # route the parameters through gradcheck
        with ksvd_terms(layer) as terms:
            out = layer(x, mask)
        return out, terms.objective("sample")

    we = layer.we.detach().clone().requires_grad_(True)
    lam = layer.lam.detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: f(x, layer.we, layer.lam), (x,))
    assert torch.autograd.gradcheck(lambda x: _functional(layer, x, mask), (x,))
    del we, lam


def _functional(layer, x, mask):
    with ksvd_terms(layer) as terms:
        out = layer(x, mask)
    return out.sum(dim=-1), terms.objective("batch")


def test_gradcheck_parameters() -> None:
    from primal_attention.ops.primal import fused

    torch.manual_seed(0)
    layer = PrimalAttention(6, 2, 3, num_samples=4).double()
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    names = ["we", "wr", "lam", "mix_weight", "q_weight"]

    def f(we, wr, lam, mix_weight, q_weight):
        w = layer.weights()._replace(we=we, wr=wr, lam=lam, mix_weight=mix_weight, q_weight=q_weight)
        out, cache = fused.primal_attention(x, w, heads=2)
        return out, fused.ksvd_objective(cache, lam, we, wr)

    w = layer.weights()
    params = tuple(getattr(w, n).detach().clone().requires_grad_(True) for n in names)
    assert torch.autograd.gradcheck(f, params)


@pytest.mark.slow
@pytest.mark.parametrize("seq_len", [12, 300], ids=["per-head path", "folded path"])
def test_compile_fullgraph_cpu(seq_len) -> None:
    torch.manual_seed(0)
    layer = PrimalAttention(16, 2, 4, num_samples=6)
    x = torch.randn(2, seq_len, 16)
    mask = torch.ones(2, seq_len, dtype=torch.bool)
    mask[1, 8:] = False

    terms = ksvd_terms(layer)  # a handle, open around the compiled calls

    def step(x, mask):
        out = layer(x, mask)
        return out, terms.loss("batch")

    compiled = torch.compile(step, fullgraph=True)
    out_c, j_c = compiled(x, mask)
    out_e, j_e = step(x, mask)
    torch.testing.assert_close(out_c, out_e, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(j_c, j_e, rtol=1e-5, atol=1e-6)
    terms.close()


@pytest.mark.parametrize("cls,kw", [(PrimalAttention, {"rank": 4}), (SoftmaxAttention, {})])
@pytest.mark.parametrize("causal", [False, True])
def test_bf16_autocast_forward_backward_finite(cls, kw, causal) -> None:
    torch.manual_seed(0)
    layer = cls(32, 4, causal=causal, **kw)
    x = torch.randn(2, 50, 32, requires_grad=True)
    mask = torch.ones(2, 50, dtype=torch.bool)
    mask[1, 30:] = False
    with torch.autocast("cpu", dtype=torch.bfloat16), ksvd_terms(layer) as terms:
        out = layer(x, mask)
        loss = out.float().square().mean()
        if cls is PrimalAttention:
            loss = loss + terms.loss()
    loss.backward()
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters())


def test_bf16_weights_forward_close_to_float32() -> None:
    torch.manual_seed(0)
    layer = PrimalAttention(32, 4, 4)
    x = torch.randn(2, 50, 32)
    ref = layer(x)
    out = layer.to(torch.bfloat16)(x.bfloat16())
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, rtol=0.05, atol=0.05)
