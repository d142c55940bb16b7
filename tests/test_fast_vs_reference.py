"""The fast path equals the readable reference math: outputs, KSVD terms and gradients."""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from primal_attention import PrimalAttention
import primal_attention as pa
from primal_attention.ops.primal import fused, reference


def random_mask(batch: int, seq_len: int, gen: torch.Generator, kind: str) -> torch.Tensor | None:
    if kind == "none":
        return None
    lengths = torch.randint(1, seq_len + 1, (batch,), generator=gen)
    pos = torch.arange(seq_len)[None, :]
    if kind == "right":
        return pos < lengths[:, None]
    if kind == "left":
        return pos >= (seq_len - lengths[:, None])
    mask = torch.rand(batch, seq_len, generator=gen) > 0.4  # holes anywhere
    mask[:, 0] = True
    return mask


def randomise(layer: PrimalAttention, gen: torch.Generator) -> None:
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.5)


def run(layer: PrimalAttention, x: torch.Tensor, mask, fused: bool, reduction: str, form: str):
    layer.impl = "fast" if fused else "reference"
    layer.zero_grad()
    x = x.clone().requires_grad_(True)
    with pa.ksvd_terms(layer) as terms:
        out = layer(x, mask)
    j = terms.objective(reduction, form)
    loss = (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum() + j.square().sum()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in layer.named_parameters()}
    return out.detach(), j.detach(), x.grad, grads


@settings(max_examples=40, deadline=None)
@example(batch=1, seq_len=1, heads=1, head_dim=1, rank=8, num_samples=28, causal=False, mask_kind="none",
         sampling="uniform", reduction="batch", form="authors", positive_lambda=True, bias=False, seed=339)
@given(
    batch=st.integers(1, 3),
    seq_len=st.integers(1, 24),
    heads=st.sampled_from([1, 2, 3]),
    head_dim=st.sampled_from([1, 4, 6]),
    rank=st.integers(1, 9),
    num_samples=st.integers(1, 30),
    causal=st.booleans(),
    mask_kind=st.sampled_from(["none", "right", "left", "holes"]),
    sampling=st.sampled_from(["uniform", "valid"]),
    reduction=st.sampled_from(["batch", "sample"]),
    form=st.sampled_from(["authors", "paper"]),
    positive_lambda=st.booleans(),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_fast_equals_reference_float64(
    batch, seq_len, heads, head_dim, rank, num_samples, causal, mask_kind, sampling, reduction, form,
    positive_lambda, bias, seed,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    dim = heads * head_dim
    layer = PrimalAttention(
        dim, heads, rank, num_samples=num_samples, causal=causal, sampling=sampling,
        positive_lambda=positive_lambda, bias=bias,
    ).double()
    randomise(layer, gen)
    x = torch.randn(batch, seq_len, dim, generator=gen, dtype=torch.float64)
    mask = random_mask(batch, seq_len, gen, mask_kind)

    fast = run(layer, x, mask, True, reduction, form)
    ref = run(layer, x, mask, False, reduction, form)
    for a, b in zip(fast[:3], ref[:3]):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
    # A gradient that is exactly 0 in one path (one token: q's) is a float64 rounding residual in the other,
    # of the order of eps times the largest gradient of the loss (1e-9 at gradients of 6e3: the example below):
    # the absolute tolerance scales with that largest gradient.
    scale = max(g.abs().max().item() for g in ref[3].values())
    for name in fast[3]:
        torch.testing.assert_close(fast[3][name], ref[3][name], rtol=1e-9, atol=max(1e-9, 1e-12 * scale), msg=name)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-5), (torch.float64, 1e-10)])
def test_fast_equals_reference_at_paper_scale(dtype, tol) -> None:
    """LRA-like sizes (rank 20, n 200, N 512) with right padding, both dtypes."""
    torch.manual_seed(0)
    layer = PrimalAttention(64, 2, 20, rank_multi=10).to(dtype)
    x = torch.randn(3, 512, 64, dtype=dtype)
    mask = torch.arange(512)[None, :] < torch.tensor([[512], [300], [17]])
    fast = run(layer, x, mask, True, "batch", "authors")
    ref = run(layer, x, mask, False, "batch", "authors")
    for a, b in zip(fast[:3], ref[:3]):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def test_valid_sample_index_matches_reference() -> None:
    gen = torch.Generator().manual_seed(3)
    for _ in range(20):
        mask = torch.rand(4, 37, generator=gen) > 0.5
        mask[0] = False  # fully padded sample
        for n in (1, 2, 5, 40, 100):
            assert torch.equal(fused.valid_sample_index(mask, n), reference.valid_sample_index(mask, n))


def test_valid_sampling_picks_only_real_tokens() -> None:
    mask = torch.zeros(2, 50, dtype=torch.bool)
    mask[0, :10] = True
    mask[1, 20:45] = True
    index = fused.valid_sample_index(mask, 7)
    assert bool(mask.gather(1, index).all())
    assert index[0].tolist()[0] == 0 and index[0].tolist()[-1] == 9  # first and last real token
    assert index[1].tolist()[0] == 20 and index[1].tolist()[-1] == 44


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("fold_out", [True, False])
def test_both_output_branches_match_reference(causal, fold_out) -> None:
    """Folded (long sequences) and per-head (short sequences, dropout) branches, forced both ways."""
    torch.manual_seed(1)
    layer = PrimalAttention(12, 3, 4, num_samples=5, causal=causal).double()
    x = torch.randn(2, 9, 12, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 6:] = False
    w = layer.weights()
    out, _ = fused.primal_attention(x, w, heads=3, mask=mask, causal=causal, fold_out=fold_out)
    ref = reference.primal_attention(x, w, heads=3, mask=mask, causal=causal).out
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    g1 = torch.autograd.grad(out.square().sum(), [x, layer.we, layer.mix.weight])
    g2 = torch.autograd.grad(ref.square().sum(), [x, layer.we, layer.mix.weight])
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    # the dropout branch with a negligible p is the per-head branch
    drop, _ = fused.primal_attention(x, w, heads=3, mask=mask, causal=causal, dropout_p=1e-300, training=True)
    torch.testing.assert_close(drop, ref, rtol=1e-10, atol=1e-10)


def test_dropout_is_active_in_training_only() -> None:
    torch.manual_seed(2)
    layer = PrimalAttention(16, 2, 4, num_samples=6, dropout=0.5)
    x = torch.randn(2, 10, 16)
    layer.train()
    assert not torch.allclose(layer(x), layer(x))
    layer.eval()
    torch.testing.assert_close(layer(x), layer(x))
    layer.impl = "reference"
    layer.train()
    with pytest.raises(ValueError, match="no dropout"):
        layer(x)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sampling", ["uniform", "valid"])
@pytest.mark.parametrize("chunk_rows", [5, 64, 4096])
@pytest.mark.parametrize("form,reduction", [("authors", "batch"), ("authors", "sample"), ("paper", "sample")])
def test_folded_chunked_path_matches_reference_with_ksvd(causal, sampling, chunk_rows, form, reduction) -> None:
    """The hand-written-backward folded path (forced, several chunkings: row ranges of one sample and
    groups of whole samples), with padding, KSVD terms and every parameter gradient, in float64."""
    torch.manual_seed(7)
    layer = PrimalAttention(12, 3, 4, num_samples=6, causal=causal, sampling=sampling).double()
    randomise(layer, torch.Generator().manual_seed(3))
    x = torch.randn(3, 23, 12, dtype=torch.float64, requires_grad=True)
    mask = torch.arange(23)[None] < torch.tensor([[23], [15], [2]])
    params = list(layer.parameters())

    def loss_of(out, j):
        weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
        return (out * weights).sum() + j.square().sum()

    w = layer.weights()
    out, cache = fused.primal_attention(x, w, heads=3, causal=causal, mask=mask, sampling=sampling,
                                             fold_out=True, chunk_rows=chunk_rows)
    j = fused.ksvd_objective(cache, layer.lambdas, layer.we, layer.wr, reduction=reduction, form=form)
    fast = torch.autograd.grad(loss_of(out, j), [x, *params])
    trace = reference.primal_attention(x, w, heads=3, causal=causal, mask=mask, sampling=sampling)
    j_ref = reference.ksvd_objective(trace, w, reduction=reduction, form=form)
    torch.testing.assert_close(out, trace.out, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(j, j_ref, rtol=1e-10, atol=1e-10)
    slow = torch.autograd.grad(loss_of(trace.out, j_ref), [x, *params])
    for a, b in zip(fast, slow):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_folded_path_gradcheck() -> None:
    torch.manual_seed(0)
    layer = PrimalAttention(6, 2, 3, num_samples=4).double()
    mask = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    x = torch.randn(2, 7, 6, dtype=torch.float64, requires_grad=True)

    def f(x):
        out, cache = fused.primal_attention(x, layer.weights(), heads=2, mask=mask, fold_out=True, chunk_rows=3)
        return out, fused.ksvd_objective(cache, layer.lambdas, layer.we, layer.wr)

    assert torch.autograd.gradcheck(f, (x,))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask_kind", ["none", "right", "holes"])
@pytest.mark.parametrize("sampling", ["uniform", "valid"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_inference_path_equals_the_training_path_and_keeps_j(causal, mask_kind, sampling, dtype) -> None:
    """Without gradients the folded path keeps nothing of size N for the KSVD objective; its output
    equals the training path's, and J after it (recomputed from the input) equals J after a
    forward with gradients (the trainer's final J and the diagnostics read it this way)."""
    gen = torch.Generator().manual_seed(7)
    layer = PrimalAttention(8, 2, 3, num_samples=5, causal=causal, sampling=sampling).to(dtype)
    randomise(layer, gen)
    x = torch.randn(3, 200, 8, generator=gen, dtype=dtype)  # N >= 16·D: the folded path
    mask = random_mask(3, 200, gen, mask_kind)
    with pa.ksvd_terms(layer) as terms:
        out = layer(x, mask)
    j = {(r, f): terms.objective(r, f).detach() for r in ("batch", "sample") for f in ("authors", "paper")}
    for mode in (torch.no_grad, torch.inference_mode):
        with mode():
            _, cache = fused.primal_attention(x, layer.weights(), heads=2, causal=causal, mask=mask, sampling=sampling)
        assert cache.features is None and cache.gram is None and cache.inputs is not None
        with mode(), pa.ksvd_terms(layer, inference=True) as terms:
            fast = layer(x, mask)
        tol = 1e-12 if dtype == torch.float64 else 1e-6
        torch.testing.assert_close(fast, out.detach(), rtol=tol, atol=tol)
        jtol = 1e-12 if dtype == torch.float64 else 2e-5  # fp32: Gram in the forward vs from the features
        with torch.no_grad():
            for (r, f), want in j.items():
                torch.testing.assert_close(terms.objective(r, f), want, rtol=jtol, atol=jtol)
    with pytest.raises(ValueError, match="inference forward"):
        fused.ksvd_objective(cache, layer.lambdas, layer.we, layer.wr)


@pytest.mark.parametrize("causal", [False, True])
def test_inference_path_with_a_qk_transform_keeps_j(causal) -> None:
    """With a qk_transform (e.g. rotary) the no-grad folded forward records the transformed [q | k]:
    J after it equals J after a forward with gradients."""
    gen = torch.Generator().manual_seed(8)
    layer = PrimalAttention(8, 2, 3, num_samples=5, causal=causal).double()
    randomise(layer, gen)
    x = torch.randn(2, 160, 8, generator=gen, dtype=torch.float64)
    ramp = torch.linspace(0.5, 2.0, 160, dtype=torch.float64)[None, :, None]

    def transform(qk: torch.Tensor) -> torch.Tensor:
        return qk * ramp + 0.1

    with pa.ksvd_terms(layer) as terms:
        out = layer(x, qk_transform=transform)
    want = terms.objective("sample").detach()
    with torch.no_grad(), pa.ksvd_terms(layer, inference=True) as terms:
        fast = layer(x, qk_transform=transform)
        torch.testing.assert_close(fast, out.detach(), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(terms.objective("sample"), want, rtol=1e-12, atol=1e-12)
