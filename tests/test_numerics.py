"""Numerics and library errors: integer sample positions, full masks, float32 sums under autocast (step
and causal prefix means), dtypes, states, double backward. docs/reliability.md names these tests."""

from __future__ import annotations

import re

import pytest
import torch

import primal_attention as pa
from primal_attention.ops.primal import fused, reference


@pytest.fixture
def one_thread():
    """Thousands of tiny steps: on a shared machine threads only add contention (16 ms vs 0.3 ms a step)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _int_linspace(seq_len: int, n: int) -> torch.Tensor:
    return torch.linspace(0, seq_len - 1, n, dtype=torch.int64)


def test_sample_positions_are_the_authors_integer_linspace() -> None:
    for n in (1, 2, 5, 96, 250, 512):
        for seq_len in range(1, 4097):
            assert torch.equal(reference.uniform_sample_index(seq_len, n), _int_linspace(seq_len, n)), (seq_len, n)
    for seq_len in (1, 3, 106, 1024, 4096):
        for n in range(1, 513):
            assert torch.equal(reference.uniform_sample_index(seq_len, n), _int_linspace(seq_len, n)), (seq_len, n)
    # pairs where a float32 linspace truncated to int disagrees with the authors' integer linspace
    for seq_len, n in ((106, 96), (1024, 250)):
        assert not torch.equal(torch.linspace(0, seq_len - 1, n).long(), reference.uniform_sample_index(seq_len, n))
    # n = 1 picks the first token; n > N repeats positions, still first and last included, in order
    assert reference.uniform_sample_index(10, 1).tolist() == [0]
    picks = reference.uniform_sample_index(3, 7)
    assert picks.tolist() == [0, 0, 0, 1, 1, 1, 2]
    # the fast path samples with the same function
    assert fused.uniform_sample_index is reference.uniform_sample_index


def test_fast_path_samples_the_integer_linspace_rows() -> None:
    torch.manual_seed(0)
    layer = pa.PrimalAttention(8, 2, rank=3, num_samples=96).double()
    x = torch.randn(2, 106, 8, dtype=torch.float64)  # (106, 96): float32 linspace picks other rows
    ref = reference.primal_attention(x, layer.weights(), heads=2).out
    torch.testing.assert_close(layer(x), ref, rtol=1e-10, atol=1e-10)
    _, cache = fused.primal_attention(x, layer.weights(), heads=2)
    rows = x[:, _int_linspace(106, 96)].view(2, 96, 2, 4)
    torch.testing.assert_close(cache.proj[:, 0], torch.einsum("bmhc,hms->bhcs", rows, layer.we))


@pytest.mark.parametrize("seq_len,n", [(8, 50), (8, 3), (13, 13), (40, 7), (106, 96), (5, 1)])
def test_valid_sampling_with_a_full_mask_equals_no_mask(seq_len, n) -> None:
    torch.manual_seed(0)
    layer = pa.PrimalAttention(8, 2, rank=3, num_samples=n, sampling="valid").double()
    x = torch.randn(3, seq_len, 8, dtype=torch.float64)
    full = torch.ones(3, seq_len, dtype=torch.bool)
    for impl in ("fast", "reference"):
        layer.impl = impl
        torch.testing.assert_close(layer(x, full), layer(x), rtol=0, atol=1e-12)
    uniform = reference.uniform_sample_index(seq_len, n).expand(3, n)
    assert torch.equal(fused.valid_sample_index(full, n), uniform)
    assert torch.equal(reference.valid_sample_index(full, n), uniform)
    # ragged: each sample's picks are its real tokens at the integer linspace over its length
    lengths = [seq_len, seq_len // 2 + 1, 1]
    mask = torch.arange(seq_len)[None] < torch.tensor(lengths)[:, None]
    index = fused.valid_sample_index(mask, n)
    assert torch.equal(index, reference.valid_sample_index(mask, n))
    for b, length in enumerate(lengths):
        assert torch.equal(index[b], reference.uniform_sample_index(length, n))


def _steps_under_autocast(dtype: torch.dtype, steps: int = 3000) -> tuple[pa.PrimalState, float]:
    torch.manual_seed(0)
    layer = pa.PrimalAttention(8, 2, rank=3, causal=True).eval()
    x = torch.randn(1, steps, 8)
    outs = []
    with torch.no_grad():
        full = layer(x)
        state = None
        with torch.autocast("cpu", dtype=dtype):
            for t in range(steps):
                out, state = layer.step(x[:, t], state)
                outs.append(out)
    return state, float((torch.stack(outs, dim=1).float() - full).abs().max())


def test_step_keeps_float32_sums_under_bf16_autocast(one_thread) -> None:
    """3000 steps at D 8, H 2. Before, the state was bf16: the count stopped at 256, worst error vs the
    float32 forward 4.9e-2. Now float32: exact count, worst error 2.6e-3."""
    state, err = _steps_under_autocast(torch.bfloat16)
    assert state.total.dtype == state.count.dtype == torch.float32
    assert int(state.count) == 3000
    assert err < 2e-2, err


def test_step_keeps_float32_sums_under_fp16_autocast(one_thread) -> None:
    """CPU autocast supports float16. Before, the fp16 count stopped at 2048 (worst error 1.5e-3; the
    L2-normalised features hide a wrong count); now exact, worst error 4.1e-4."""
    state, err = _steps_under_autocast(torch.float16)
    assert state.total.dtype == state.count.dtype == torch.float32
    assert int(state.count) == 3000
    assert err < 1e-3, err


def test_step_of_a_half_precision_layer_keeps_float32_sums(one_thread) -> None:
    torch.manual_seed(0)
    layer = pa.PrimalAttention(8, 2, rank=3, causal=True).bfloat16()
    x = torch.randn(2, 300, 8).bfloat16()
    mask = torch.ones(2, 300, dtype=torch.bool)
    mask[1, :5] = False
    with torch.no_grad():
        full = layer(x, mask)
        state = None
        for t in range(300):
            out, state = layer.step(x[:, t], state, mask[:, t])
    assert out.dtype == torch.bfloat16 and state.count.dtype == torch.float32
    assert state.count.tolist() == [300.0, 295.0]
    torch.testing.assert_close(out.float(), full[:, -1].float(), rtol=0, atol=5e-2)


def test_causal_prefix_sums_do_not_overflow_under_fp16() -> None:
    torch.manual_seed(0)
    qk = (torch.randn(2, 4000, 4) + 30.0).to(torch.float16)  # a cumsum in fp16 passes 65 504 here
    assert not torch.isfinite(torch.cumsum(qk, dim=1)).all()
    real = torch.ones(2, 4000)
    real[1, :9] = 0.0
    for w in (None, real):
        mean = fused._causal_prefix_mean(qk, w)
        assert mean.dtype == torch.float16 and torch.isfinite(mean).all()
        exact = fused._causal_prefix_mean(qk.double(), None if w is None else w.double())
        torch.testing.assert_close(mean.double(), exact, rtol=2e-3, atol=2e-2)


@pytest.mark.parametrize("fold_out", [True, False])
def test_causal_layer_under_fp16_autocast_is_finite(fold_out) -> None:
    """x offset by 20: the prefix sums of q, k pass 65 504 from t ≈ 1900. Before: 2077 of 4000 rows
    non-finite (and the left-padding rows NaN: eps 1e-12 is 0 in fp16); now all finite, error ≤ 4.3e-4."""
    torch.manual_seed(0)
    layer = pa.PrimalAttention(8, 2, rank=3, causal=True)
    x = (torch.randn(1, 4000, 8) + 20.0).requires_grad_()
    mask = torch.ones(1, 4000, dtype=torch.bool)
    mask[0, :7] = False  # left padding: a prefix mean of exactly 0
    for m in (None, mask):
        with torch.no_grad():
            ref = layer(x, m)
        with torch.autocast("cpu", dtype=torch.float16):
            out, _ = fused.primal_attention(x, layer.weights(), heads=2, causal=True, mask=m, fold_out=fold_out)
        assert out.dtype == torch.float16 and torch.isfinite(out).all()
        torch.testing.assert_close(out.float(), ref, rtol=0, atol=3e-3)
        (g,) = torch.autograd.grad(out.float().square().sum(), x)
        assert torch.isfinite(g).all()


def test_dtype_mismatch_is_one_clear_error() -> None:
    layer = pa.PrimalAttention(8, 2, rank=3, num_samples=4)
    with pytest.raises(ValueError) as info:
        layer(torch.randn(2, 5, 8, dtype=torch.float64))
    message = "PrimalAttention: expected x of dtype torch.float32 (the layer's parameters), got torch.float64"
    assert str(info.value) == message + "; convert with layer.double() or x.float()"
    with pytest.raises(ValueError, match=re.escape("expected x of dtype torch.float64 (the layer's parameters), "
                                                   "got torch.float32; convert with layer.float() or x.double()")):
        pa.PrimalAttention(8, 2, rank=3, num_samples=4).double()(torch.randn(2, 5, 8))
    causal = pa.PrimalAttention(8, 2, rank=3, causal=True)
    with pytest.raises(ValueError, match=re.escape("PrimalAttention.step: expected x_t of dtype torch.float32 (the "
                                                   "layer's parameters), got torch.float64; convert with "
                                                   "layer.double() or x_t.float()")):
        causal.step(torch.randn(2, 8, dtype=torch.float64))
    # under autocast mixed dtypes are legitimate
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer(torch.randn(2, 5, 8).bfloat16()).dtype == torch.bfloat16
        causal.step(torch.randn(2, 8).bfloat16())


def test_step_validates_its_state() -> None:
    layer = pa.PrimalAttention(8, 2, rank=3, causal=True)
    _, state = layer.step(torch.randn(2, 8))
    for bad in (tuple(state), state.total, [state.total, state.count]):
        with pytest.raises(TypeError, match="expected state to be a PrimalState"):
            layer.step(torch.randn(2, 8), bad)
    with pytest.raises(TypeError, match="a PrimalState of tensors"):
        layer.step(torch.randn(2, 8), state._replace(count=2))
    with pytest.raises(ValueError, match=re.escape("expected a state with total (3, 16) and count (3,), got total "
                                                   "(2, 16) and count (2,) (a state of another layer or batch?)")):
        layer.step(torch.randn(3, 8), state)  # another batch size
    _, other = pa.PrimalAttention(16, 2, rank=3, causal=True).step(torch.randn(2, 16))
    with pytest.raises(ValueError, match=r"expected a state with total \(2, 16\) .*got total \(2, 32\)"):
        layer.step(torch.randn(2, 8), other)  # a state of another layer
    with pytest.raises(ValueError, match="expected a state of dtype torch.float32 on cpu, got total torch.float64"):
        layer.step(torch.randn(2, 8), state._replace(total=state.total.double()))
    with pytest.raises(ValueError, match="on meta"):
        layer.step(torch.randn(2, 8), state._replace(count=state.count.to("meta")))
    _, state = layer.step(torch.randn(2, 8), state)  # its own state still works
    assert state.count.tolist() == [2.0, 2.0]


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
    folded.impl = "reference"
    (g,) = torch.autograd.grad(folded(x).square().sum(), x, create_graph=True)
    (gg,) = torch.autograd.grad(g.square().sum(), x)
    assert torch.isfinite(gg).all()
