"""Numerics and library errors: integer sample positions, full masks, autocast sums, dtypes, states, double backward."""

from __future__ import annotations

import re

import pytest
import torch

import primal_attention as pa
from primal_attention import functional, reference


def test_sample_positions_are_the_authors_integer_linspace() -> None:
    for n in (1, 2, 5, 96, 250, 512):
        for seq_len in range(1, 4097):
            expected = torch.linspace(0, seq_len - 1, n, dtype=torch.int64)
            assert torch.equal(reference.uniform_sample_index(seq_len, n), expected), (seq_len, n)
    for seq_len in (106, 1024, 4096):
        for n in range(1, 513):
            assert torch.equal(reference.uniform_sample_index(seq_len, n),
                               torch.linspace(0, seq_len - 1, n, dtype=torch.int64)), (seq_len, n)
    # the pair where a float32 linspace truncated to int disagrees
    assert not torch.equal(torch.linspace(0, 105, 96).long(), reference.uniform_sample_index(106, 96))


@pytest.mark.parametrize("seq_len,n", [(8, 50), (8, 3), (13, 13), (40, 7)])
def test_valid_sampling_with_a_full_mask_equals_no_mask(seq_len, n) -> None:
    torch.manual_seed(0)
    layer = pa.PrimalAttention(8, 2, rank=3, num_samples=n, sampling="valid").double()
    x = torch.randn(3, seq_len, 8, dtype=torch.float64)
    full = torch.ones(3, seq_len, dtype=torch.bool)
    torch.testing.assert_close(layer(x, full), layer(x), rtol=0, atol=1e-12)
    assert torch.equal(functional.valid_sample_index(full, n), reference.valid_sample_index(full, n))
    mask = torch.arange(seq_len)[None] < torch.tensor([[seq_len], [seq_len // 2 + 1], [1]])
    assert torch.equal(functional.valid_sample_index(mask, n), reference.valid_sample_index(mask, n))


def test_step_keeps_float32_sums_under_bf16_autocast() -> None:
    torch.manual_seed(0)
    layer = pa.PrimalAttention(8, 2, rank=3, causal=True).eval()
    x = torch.randn(1, 3000, 8)
    with torch.no_grad():
        full = layer(x)
        state, worst = None, 0.0
        with torch.autocast("cpu", dtype=torch.bfloat16):
            for t in range(3000):
                out, state = layer.step(x[:, t], state)
                worst = max(worst, float((out.float() - full[:, t]).abs().max()))
    assert state.count.dtype == torch.float32 and int(state.count) == 3000
    assert worst < 2e-2, worst


def test_causal_prefix_sums_do_not_overflow_under_fp16() -> None:
    torch.manual_seed(0)
    qk = (torch.randn(1, 4000, 4) + 30.0).to(torch.float16)  # a cumsum in fp16 passes 65 504 here
    assert not torch.isfinite(torch.cumsum(qk, dim=1)).all()
    mean = functional._causal_prefix_mean(qk, None)
    assert mean.dtype == torch.float16 and torch.isfinite(mean).all()
    torch.testing.assert_close(mean.float(), functional._causal_prefix_mean(qk.float(), None), rtol=2e-3, atol=2e-2)


def test_dtype_mismatch_is_one_clear_error() -> None:
    layer = pa.PrimalAttention(8, 2, rank=3, num_samples=4)
    with pytest.raises(ValueError, match=re.escape("expected x of dtype torch.float32 (the layer's parameters), got torch.float64")):
        layer(torch.randn(2, 5, 8, dtype=torch.float64))
    causal = pa.PrimalAttention(8, 2, rank=3, causal=True)
    with pytest.raises(ValueError, match="expected x_t of dtype torch.float32"):
        causal.step(torch.randn(2, 8, dtype=torch.float64))


def test_step_validates_its_state() -> None:
    layer = pa.PrimalAttention(8, 2, rank=3, causal=True)
    _, state = layer.step(torch.randn(2, 8))
    with pytest.raises(TypeError, match="expected state to be a PrimalState"):
        layer.step(torch.randn(2, 8), tuple(state[:1]))
    with pytest.raises(ValueError, match="a state of another layer or batch"):
        layer.step(torch.randn(3, 8), state)
    _, other = pa.PrimalAttention(16, 2, rank=3, causal=True).step(torch.randn(2, 16))
    with pytest.raises(ValueError, match=r"expected a state with total \(2, 16\)"):
        layer.step(torch.randn(2, 8), other)


def test_double_backward() -> None:
    torch.manual_seed(0)
    layer = pa.PrimalAttention(8, 2, rank=3, num_samples=4).double()
    x = torch.randn(2, 12, 8, dtype=torch.float64, requires_grad=True)
    second = {}
    for impl in ("reference", "fast"):  # N 12 < 16·D: the fast path is the per-head one
        layer.impl = impl
        (g,) = torch.autograd.grad(layer(x).square().sum(), x, create_graph=True)
        (second[impl],) = torch.autograd.grad(g.square().sum(), x)
    torch.testing.assert_close(second["fast"], second["reference"])
    folded = pa.PrimalAttention(4, 2, rank=3, num_samples=4)
    x = torch.randn(1, 64, 4, requires_grad=True)  # N >= 16·D: the folded path
    with pytest.raises(RuntimeError, match="no double backward; for gradients of gradients use impl='reference'"):
        torch.autograd.grad(folded(x).square().sum(), x, create_graph=True)
    (g,) = torch.autograd.grad(folded(x).square().sum(), x)  # a plain backward is fine
    assert torch.isfinite(g).all()
