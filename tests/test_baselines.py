"""Efficient-attention baselines: each against its exact formula, plus the shared layer contract.

Reference formulas are written out here as plain O(N²) tensors (float64 where it helps), so each
fast path is held to the math of its paper.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
import torch.nn.functional as F

from primal_attention.layers import attention_class
from primal_attention.baselines import (
    BASELINES,
    LinformerAttention,
    NystromAttention,
    PerformerAttention,
    ReformerAttention,
)
from primal_attention.baselines.linear import elu_feature_map, linear_attention
from primal_attention.baselines.nystrom import iterative_pinv, nystrom_attention
from primal_attention.baselines.performer import favor_features, orthogonal_gaussian_features
from primal_attention.baselines.reformer import SELF_LOGIT, lsh_attention, lsh_buckets
from primal_attention.models.transformer import TransformerStack

D, H = 16, 2
D_H = D // H

# Small settings that still exercise each method's approximate path at N = 40..80.
SMALL = {
    "nystrom": dict(num_landmarks=8, conv_kernel_size=5),
    "linformer": dict(k=12),
    "performer": dict(num_features=32),
    "reformer": dict(bucket_size=4, chunk_size=8),
    "linear": dict(),
}
CAUSAL = [name for name, cls in BASELINES.items() if cls.supports_causal]


def make(name: str, *, causal: bool = False, max_seq_len: int = 96, **kw) -> torch.nn.Module:
    torch.manual_seed(0)
    return BASELINES[name](D, H, max_seq_len=max_seq_len, causal=causal, **{**SMALL[name], **kw})


def run(layer: torch.nn.Module, x: torch.Tensor, mask: torch.Tensor | None = None, **kw) -> torch.Tensor:
    torch.manual_seed(123)  # Reformer draws its rotations per forward pass
    return layer(x, mask, **kw)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def right_padding(b: int, n: int, lengths: list[int]) -> torch.Tensor:
    return torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]


def softmax_attention(q, k, v, key_mask=None, causal=False, exclude_self=False):
    """Explicit softmax(q kᵀ/√d) v with masks; q, k, v: (B, H, N, d)."""
    n = q.shape[2]
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    bad = torch.zeros(q.shape[0], 1, n, n, dtype=torch.bool)
    if key_mask is not None:
        bad = bad | ~key_mask[:, None, None, :]
    if causal:
        bad = bad | torch.ones(n, n, dtype=torch.bool).triu(1)
    logits = logits.masked_fill(bad, torch.finfo(logits.dtype).min)
    if exclude_self:
        logits = logits.masked_fill(torch.eye(n, dtype=torch.bool), SELF_LOGIT)
    return logits.softmax(-1) @ v


# --------------------------------------------------------------------------------------------
# The layer contract, for every baseline
# --------------------------------------------------------------------------------------------


def test_registry_names_and_table3_defaults():
    assert set(BASELINES) == {"nystrom", "linformer", "performer", "reformer", "linear"}
    assert NystromAttention(64, 2).num_landmarks == 64
    assert NystromAttention(64, 2).pinv_iterations == 6
    assert NystromAttention(64, 2).conv_kernel_size == 33
    assert LinformerAttention(64, 2, max_seq_len=1024).k == 256
    assert PerformerAttention(64, 2).features.shape == (256, 32)
    reformer = ReformerAttention(64, 2)
    assert (reformer.n_hashes, reformer.bucket_size, reformer.chunk_size) == (2, 32, 64)
    assert reformer.num_buckets(4096) == 128  # ≈ 2N / chunk, as HF picks it


VARIANTS = [(name, False) for name in BASELINES] + [(name, True) for name in CAUSAL]


@pytest.mark.parametrize(("name", "causal"), VARIANTS)
def test_shapes_finite_and_gradients_reach_every_parameter(name, causal):
    layer = make(name, causal=causal)
    x = torch.randn(3, 50, D, requires_grad=True)
    mask = right_padding(3, 50, [50, 37, 9])
    y = run(layer, x, mask)
    assert y.shape == (3, 50, D) and y.dtype == torch.float32
    assert torch.isfinite(y).all()
    y.square().sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad[mask].abs().sum() > 0
    for pname, p in layer.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname
        assert p.grad.abs().sum() > 0, pname
    names = {n.split(".")[0] for n, _ in layer.named_parameters()}
    assert {"q_proj", "v_proj", "out_proj"} <= names
    assert ("k_proj" in names) == (name != "reformer")


@pytest.mark.parametrize("name", list(BASELINES))
def test_bf16_autocast_is_finite_and_close_to_float32(name):
    layer = make(name)
    x = torch.randn(2, 48, D)
    mask = right_padding(2, 48, [48, 30])
    ref = run(layer, x, mask)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = run(layer, x, mask)
    assert y.dtype == torch.bfloat16
    assert torch.isfinite(y).all()
    assert rel(y.float(), ref) < 0.05


@pytest.mark.parametrize(("name", "causal"), VARIANTS)
def test_padding_content_does_not_change_real_outputs(name, causal):
    layer = make(name, causal=causal)
    torch.manual_seed(1)
    x = torch.randn(3, 45, D)
    mask = right_padding(3, 45, [45, 31, 12])
    mask[1, 5] = False  # a hole inside the sequence, too
    y = run(layer, x, mask)
    x2 = torch.where(mask[..., None], x, 100.0 * torch.randn_like(x))
    y2 = run(layer, x2, mask)
    torch.testing.assert_close(y2[mask], y[mask], rtol=1e-5, atol=1e-5)
    # padding rows are zero before out_proj, hence its bias afterwards
    torch.testing.assert_close(y[~mask], layer.out_proj.bias.expand(int((~mask).sum()), D))


@pytest.mark.parametrize("name", ["linear", "performer"])
@pytest.mark.parametrize("causal", [False, True])
def test_right_padding_equals_the_unpadded_sequence(name, causal):
    # Exact for the methods whose padding keys drop out of every sum.
    layer = make(name, causal=causal)
    x = torch.randn(2, 40, D)
    mask = right_padding(2, 40, [40, 23])
    y = run(layer, x, mask)
    torch.testing.assert_close(y[1, :23], run(layer, x[1:, :23])[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["linear", "performer"])
def test_causal_outputs_do_not_depend_on_future_tokens(name):
    layer = make(name, causal=True).double()
    x = torch.randn(2, 60, D, dtype=torch.float64)
    t = 27
    y = run(layer, x)
    x2 = x.clone()
    x2[:, t + 1 :] = 5.0 * torch.randn_like(x2[:, t + 1 :])
    y2 = run(layer, x2)
    torch.testing.assert_close(y2[:, : t + 1], y[:, : t + 1], rtol=1e-10, atol=1e-10)
    assert not torch.allclose(y2[:, t + 1 :], y[:, t + 1 :])


@pytest.mark.parametrize("name", ["nystrom", "linformer"])
def test_methods_without_causal_form_refuse_it(name):
    with pytest.raises(ValueError, match=f"causal=True is unsupported for {name}"):
        BASELINES[name](D, H, max_seq_len=64, causal=True)


@pytest.mark.parametrize("name", list(BASELINES))
def test_bad_inputs_raise_clear_errors(name):
    layer = make(name)
    with pytest.raises(ValueError, match=r"expected x of shape \(B, N, 16\), got \(10, 16\)"):
        layer(torch.randn(10, D))
    with pytest.raises(ValueError, match=r"expected x of shape \(B, N, 16\), got \(2, 10, 8\)"):
        layer(torch.randn(2, 10, 8))
    with pytest.raises(ValueError, match=r"expected mask of shape \(2, 10\) \(B, N\), got \(2, 9\)"):
        layer(torch.randn(2, 10, D), torch.ones(2, 9, dtype=torch.bool))
    with pytest.raises(ValueError, match="expected mask of dtype torch.bool"):
        layer(torch.randn(2, 10, D), torch.ones(2, 10))
    with pytest.raises(ValueError, match="exceeds max_seq_len=96"):
        layer(torch.randn(1, 97, D))
    with pytest.raises(ValueError, match=r"num_heads \(4\) must divide embed_dim \(10\)"):
        BASELINES[name](10, 4, max_seq_len=96)


@pytest.mark.parametrize("name", list(BASELINES))
def test_registered_by_name_and_usable_in_a_transformer_stack(name):
    assert attention_class(name) is BASELINES[name]
    torch.manual_seed(0)
    options = {name: SMALL[name]}
    stack = TransformerStack([name, "softmax"], D, H, 32, max_seq_len=64, attention_options=options)
    x = torch.randn(2, 40, D)
    mask = right_padding(2, 40, [40, 25])
    y = run(stack, x, mask)
    assert y.shape == (2, 40, D) and torch.isfinite(y).all()
    layer = stack.blocks[0].attn
    assert isinstance(layer, BASELINES[name])
    # timm's keyword for the same (B, N) padding mask
    torch.testing.assert_close(run(layer, x, attn_mask=mask), run(layer, x, mask))


def test_fully_masked_sequences_give_finite_bias_rows():
    for name in BASELINES:
        layer = make(name)
        y = run(layer, torch.randn(2, 30, D), torch.zeros(2, 30, dtype=torch.bool))
        torch.testing.assert_close(y, layer.out_proj.bias.expand(2, 30, D), msg=name)


# --------------------------------------------------------------------------------------------
# Linear attention
# --------------------------------------------------------------------------------------------


def explicit_linear_attention(q, k, v, key_mask=None, causal=False, eps=1e-6):
    a = elu_feature_map(q) @ elu_feature_map(k).transpose(-1, -2)
    n = q.shape[2]
    if key_mask is not None:
        a = a * key_mask[:, None, None, :]
    if causal:
        a = a * torch.ones(n, n).tril()
    return (a @ v) / (a.sum(-1, keepdim=True) + eps)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", [1, 63, 64, 130])  # around the chunk length 64
def test_linear_attention_equals_explicit_quadratic_formula(causal, n):
    q, k, v = torch.randn(3, 2, 3, n, 5, dtype=torch.float64).unbind(0)
    key_mask = torch.rand(2, n) > 0.3
    key_mask[:, 0] = True
    phi_k = elu_feature_map(k).masked_fill(~key_mask[:, None, :, None], 0.0)
    out = linear_attention(elu_feature_map(q), phi_k, v, causal=causal)
    torch.testing.assert_close(out, explicit_linear_attention(q, k, v, key_mask, causal))


@settings(max_examples=40, deadline=None)
@given(
    b=st.integers(1, 2),
    n=st.integers(1, 90),
    f=st.integers(1, 6),
    d_v=st.integers(1, 4),
    chunk=st.sampled_from([1, 7, 16, 64]),
    causal=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_linear_attention_matches_formula_on_random_shapes_and_masks(b, n, f, d_v, chunk, causal, seed):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, b, 2, n, f, generator=g, dtype=torch.float64).unbind(0)
    v = torch.randn(b, 2, n, d_v, generator=g, dtype=torch.float64)
    key_mask = torch.rand(b, n, generator=g) > 0.4
    phi_k = elu_feature_map(k).masked_fill(~key_mask[:, None, :, None], 0.0)
    out = linear_attention(elu_feature_map(q), phi_k, v, causal=causal, chunk_size=chunk)
    torch.testing.assert_close(out, explicit_linear_attention(q, k, v, key_mask, causal))


def test_linear_attention_module_is_projections_around_the_formula():
    layer = make("linear", causal=True)
    x = torch.randn(2, 20, D)
    q, k, v = (p(x).view(2, 20, H, D_H).transpose(1, 2) for p in (layer.q_proj, layer.k_proj, layer.v_proj))
    o = explicit_linear_attention(q, k, v, causal=True).transpose(1, 2).reshape(2, 20, D)
    torch.testing.assert_close(layer(x), layer.out_proj(o), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------------------
# Performer
# --------------------------------------------------------------------------------------------


def test_orthogonal_features_are_orthogonal_within_blocks():
    w = orthogonal_gaussian_features(20, 8, generator=torch.Generator().manual_seed(0))
    assert w.shape == (20, 8)
    for block in (w[:8], w[8:16], w[16:]):
        gram = block @ block.T
        torch.testing.assert_close(gram, torch.diag(torch.diagonal(gram)), atol=1e-4, rtol=0)


def test_favor_features_estimate_the_softmax_kernel_without_bias():
    g = torch.Generator().manual_seed(0)
    x = 0.4 * torch.randn(1, 1, 6, 4, generator=g, dtype=torch.float64)
    y = 0.4 * torch.randn(1, 1, 6, 4, generator=g, dtype=torch.float64)
    w = orthogonal_gaussian_features(100_000, 4, generator=g).double()
    # Without the stabilising shifts (here exp cannot overflow), φ(x)ᵀφ(y) estimates exp(xᵀy).
    phi = lambda t: torch.exp(t @ w.T - 0.5 * (t * t).sum(-1, keepdim=True)) / math.sqrt(w.shape[0])
    terms = phi(x)[..., :, None, :] * phi(y)[..., None, :, :] * w.shape[0]  # one sample per feature
    estimate = phi(x) @ phi(y).transpose(-1, -2)
    torch.testing.assert_close(estimate, terms.mean(-1))
    standard_error = terms.std(-1) / math.sqrt(w.shape[0])
    assert ((estimate - torch.exp(x @ y.transpose(-1, -2))).abs() < 4 * standard_error).all()
    # The shifts change every entry by one factor per query row (queries) / per head (keys).
    shifted = favor_features(x, w, is_query=True) @ favor_features(y, w, is_query=False).transpose(-1, -2)
    ratio = shifted / estimate
    torch.testing.assert_close(ratio, ratio[..., :1].expand_as(ratio))


@pytest.mark.parametrize("causal", [False, True])
def test_performer_core_equals_explicit_formula_with_its_features(causal):
    layer = make("performer", causal=causal).double()
    q, k, v = torch.randn(3, 2, H, 70, D_H, dtype=torch.float64).unbind(0)
    key_mask = right_padding(2, 70, [70, 50])
    w, s = layer.features, D_H**-0.25
    phi_q = torch.exp(s * q @ w.T - 0.5 * s * s * (q * q).sum(-1, keepdim=True))
    phi_k = torch.exp(s * k @ w.T - 0.5 * s * s * (k * k).sum(-1, keepdim=True))
    a = (phi_q @ phi_k.transpose(-1, -2)) * key_mask[:, None, None, :]
    if causal:
        a = a * torch.ones(70, 70, dtype=torch.float64).tril()
    expected = (a @ v) / a.sum(-1, keepdim=True)
    torch.testing.assert_close(layer._attend(q, k, v, key_mask), expected)


def test_performer_with_many_features_approximates_softmax_attention():
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 2, 2, 128, 16, generator=g, dtype=torch.float64).unbind(0)
    q, k = 0.5 * q, 0.5 * k  # at unit scale 256..16k features are all poor (variance ~ e^‖q+k‖²)
    exact = softmax_attention(q, k, v)
    uniform_error = rel(v.mean(2, keepdim=True).expand_as(exact), exact)
    errors = []
    for m in (256, 8192):
        w = orthogonal_gaussian_features(m, 16, generator=g).double()
        phi_q = favor_features(q * 16**-0.25, w, is_query=True)
        phi_k = favor_features(k * 16**-0.25, w, is_query=False)
        errors.append(rel(linear_attention(phi_q, phi_k, v, eps=1e-300), exact))
    # The error falls like 1/√m (observed 0.17 -> 0.03, uniform weights 0.24).
    assert errors[1] < min(0.06, uniform_error / 4), (errors, uniform_error)
    assert errors[1] < errors[0] / 3


def test_performer_features_are_fixed_until_redrawn():
    layer = make("performer")
    x = torch.randn(2, 30, D)
    y = layer(x)
    torch.testing.assert_close(layer(x), y, rtol=0, atol=0)
    before = layer.features.clone()
    layer.redraw_features(torch.Generator().manual_seed(7))
    assert not torch.equal(layer.features, before)
    assert not torch.allclose(layer(x), y)
    again = orthogonal_gaussian_features(32, D_H, generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(layer.features, again, rtol=0, atol=0)
    assert "features" in layer.state_dict()


# --------------------------------------------------------------------------------------------
# Linformer
# --------------------------------------------------------------------------------------------


def test_linformer_with_identity_projection_at_k_equal_n_is_softmax_attention():
    layer = LinformerAttention(D, H, max_seq_len=24, k=24).double()
    with torch.no_grad():
        layer.proj_k.copy_(torch.eye(24))
        layer.proj_v.copy_(torch.eye(24))
    q, k, v = torch.randn(3, 2, H, 24, D_H, dtype=torch.float64).unbind(0)
    torch.testing.assert_close(layer._attend(q, k, v, None), softmax_attention(q, k, v))


@pytest.mark.parametrize("share_kv", [False, True])
def test_linformer_short_sequences_use_the_first_columns(share_kv):
    layer = LinformerAttention(D, H, max_seq_len=40, k=8, share_kv=share_kv).double()
    q, k, v = torch.randn(3, 2, H, 25, D_H, dtype=torch.float64).unbind(0)
    key_mask = right_padding(2, 25, [25, 17])
    e = layer.proj_k[:, :25]
    f = e if share_kv else layer.proj_v[:, :25]
    keep = key_mask[:, None, :, None]
    k_low, v_low = e @ (k * keep), f @ (v * keep)
    expected = torch.softmax(q @ k_low.transpose(-1, -2) / math.sqrt(D_H), -1) @ v_low
    torch.testing.assert_close(layer._attend(q, k, v, key_mask), expected)
    assert (layer.proj_v is None) == share_kv


def test_linformer_needs_max_seq_len():
    with pytest.raises(ValueError, match="LinformerAttention needs max_seq_len"):
        LinformerAttention(D, H)


# --------------------------------------------------------------------------------------------
# Nyström
# --------------------------------------------------------------------------------------------


def test_iterative_pinv_converges_to_the_pseudo_inverse():
    a = torch.softmax(torch.randn(3, 10, 10, dtype=torch.float64), -1)
    torch.testing.assert_close(iterative_pinv(a, 30), torch.linalg.pinv(a), rtol=1e-6, atol=1e-8)
    # six iterations (the default) already invert a well-conditioned matrix closely
    b = torch.eye(10, dtype=torch.float64) + 0.05 * torch.rand(10, 10, dtype=torch.float64)
    b = b / b.sum(-1, keepdim=True)
    assert rel(iterative_pinv(b), torch.linalg.inv(b)) < 1e-6


def test_nystrom_with_one_landmark_per_token_approximates_softmax_attention():
    q, k, v = torch.randn(3, 2, 2, 64, 16, dtype=torch.float64).unbind(0)
    exact = softmax_attention(q, k, v)
    # with the exact pseudo-inverse (enough iterations) S(qkᵀ) S⁺ S v = S v
    torch.testing.assert_close(nystrom_attention(q, k, v, num_landmarks=64, pinv_iterations=30), exact)
    # the paper's six iterations: close (observed 4 %), far better than uniform weights (> 60 %)
    assert rel(nystrom_attention(q, k, v, num_landmarks=64), exact) < 0.08


def explicit_nystrom(q, k, v, key_mask, m, iterations):
    """Per sample: landmarks as masked segment means, empty segments dropped, then the formula."""
    b, h, n, d = q.shape
    seg = math.ceil(n / m)
    out = torch.zeros_like(q)
    for i in range(b):
        real = key_mask[i]
        qs, ks = q[i] * d**-0.25 * real[:, None], k[i] * d**-0.25 * real[:, None]
        segments = [torch.arange(j * seg, min((j + 1) * seg, n)) for j in range(m)]
        segments = [s[real[s]] for s in segments if s.numel() and real[s].any()]
        q_l = torch.stack([qs[:, s].mean(1) for s in segments], 1)
        k_l = torch.stack([ks[:, s].mean(1) for s in segments], 1)
        k1 = torch.softmax(qs @ k_l.transpose(-1, -2), -1)
        k2 = torch.softmax(q_l @ k_l.transpose(-1, -2), -1)
        k3 = torch.softmax((q_l @ ks.transpose(-1, -2)).masked_fill(~real, -math.inf), -1)
        out[i] = k1 @ iterative_pinv(k2, iterations) @ (k3 @ (v[i] * real[:, None]))
    return out


@pytest.mark.parametrize("n", [48, 53])  # a multiple of the landmarks and not
def test_nystrom_masked_landmarks_equal_dropping_empty_segments(n):
    q, k, v = torch.randn(3, 3, 2, n, 8, dtype=torch.float64).unbind(0)
    key_mask = right_padding(3, n, [n, 30, 5])
    key_mask[0, 7:9] = False
    got = nystrom_attention(q, k, v, num_landmarks=8, key_mask=key_mask)
    expected = explicit_nystrom(q, k, v, key_mask, 8, 6)
    real_rows = key_mask[:, None, :].expand(-1, 2, -1)  # (B, H, N)
    torch.testing.assert_close(got[real_rows], expected[real_rows])


def test_nystrom_module_adds_the_depthwise_value_convolution():
    layer = make("nystrom").double()
    q, k, v = torch.randn(3, 2, H, 40, D_H, dtype=torch.float64).unbind(0)
    key_mask = right_padding(2, 40, [40, 33])
    vm = v * key_mask[:, None, :, None]
    w = layer.conv.weight[:, 0, :, 0]  # (H, 5): one kernel per head along the sequence
    vp = F.pad(vm, (0, 0, 2, 2))
    conv = sum(w[None, :, t, None, None] * vp[:, :, t : t + 40] for t in range(5))
    core = nystrom_attention(q, k, v, num_landmarks=8, key_mask=key_mask)
    torch.testing.assert_close(layer._attend(q, k, v, key_mask), core + conv)
    # a sequence no longer than the landmark count gets exact softmax attention
    q8, k8, v8 = q[:, :, :8], k[:, :, :8], v[:, :, :8]
    torch.testing.assert_close(layer._attend(q8, k8, v8, None), softmax_attention(q8, k8, v8) + layer.conv(v8))


def test_nystrom_rejects_even_conv_kernels():
    with pytest.raises(ValueError, match="conv_kernel_size must be a positive odd integer"):
        NystromAttention(D, H, conv_kernel_size=32)
    assert NystromAttention(D, H, conv_kernel_size=None).conv is None


# --------------------------------------------------------------------------------------------
# Reformer
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_reformer_single_chunk_is_shared_qk_softmax_without_self(causal):
    qk, v = torch.randn(2, 2, H, 40, D_H, dtype=torch.float64).unbind(0)
    key_mask = right_padding(2, 40, [40, 29])
    rotations = torch.randn(D_H, 2, 1, dtype=torch.float64)
    got = lsh_attention(qk, v, rotations, key_mask=key_mask, chunk_size=64, causal=causal)
    expected = softmax_attention(qk, F.normalize(qk, dim=-1), v, key_mask, causal, exclude_self=True)
    keep = key_mask[:, None, :, None].expand_as(got)
    torch.testing.assert_close(got[keep], expected[keep])
    # and the module with one chunk covering the sequence does the same
    layer = ReformerAttention(D, H, chunk_size=64, causal=causal).double()
    torch.testing.assert_close(layer._attend(qk, qk, v, key_mask)[keep], expected[keep])


def explicit_lsh(qk, v, rotations, key_mask, chunk, causal):
    """LSH attention as one masked N×N softmax per round.

    Round r puts token j in global chunk G[r, j] (rounds laid end to end, sorted by bucket then
    position). A query in chunk c sees the tokens of chunks c and c − 1 (cyclically), counted with
    multiplicity: at a round boundary chunk c − 1 belongs to the other round and may hold a token
    that chunk c holds too.
    """
    b, h, n, d = qk.shape
    n_hashes = rotations.shape[1]
    n_chunks = n_hashes * n // chunk
    buckets = lsh_buckets(qk, rotations, key_mask)  # (B, H, R, N)
    order = torch.argsort(buckets * n + torch.arange(n), dim=-1)
    slot = torch.empty_like(order).scatter_(-1, order, torch.arange(n).expand_as(order))
    g = slot // chunk + torch.arange(n_hashes)[:, None] * (n // chunk)  # (B, H, R, N)
    logits = qk @ F.normalize(qk, dim=-1).transpose(-1, -2) / math.sqrt(d)
    neg = torch.finfo(logits.dtype).min
    outs, lses = [], []
    for r in range(n_hashes):
        c = g[:, :, r, :, None, None]  # query's chunk (B, H, N_i, 1, 1)
        gj = g.transpose(2, 3)[:, :, None]  # every round's chunk of key j (B, H, 1, N_j, R)
        count = (gj == c).sum(-1) + (gj == (c - 1) % n_chunks).sum(-1)
        lr = logits + torch.log(count.to(logits.dtype))
        bad = (count == 0) | ~key_mask[:, None, None, :]
        if causal:
            bad = bad | torch.ones(n, n, dtype=torch.bool).triu(1)
        lr = lr.masked_fill(bad, neg)
        eye = torch.eye(n, dtype=torch.bool)
        lr = torch.where(eye, SELF_LOGIT + torch.log(count.to(logits.dtype)), lr)
        lses.append(lr.logsumexp(-1))
        outs.append(lr.softmax(-1) @ v)
    w = torch.stack(lses, 2).softmax(2)
    return (torch.stack(outs, 2) * w[..., None]).sum(2)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", [32, 29])  # a multiple of the chunk length and not
def test_reformer_chunked_buckets_equal_explicit_neighbourhood_softmax(causal, n):
    g = torch.Generator().manual_seed(0)
    qk, v = torch.randn(2, 2, H, n, D_H, generator=g, dtype=torch.float64).unbind(0)
    key_mask = right_padding(2, n, [n, 20])
    key_mask[0, 3] = False
    rotations = torch.randn(D_H, 2, 2, generator=g, dtype=torch.float64)
    got = lsh_attention(qk, v, rotations, key_mask=key_mask, chunk_size=8, causal=causal)
    # lsh_attention pads to a multiple of the chunk length with masked tokens; so does the reference
    pad = (-n) % 8
    expected = explicit_lsh(
        F.pad(qk, (0, 0, 0, pad)), F.pad(v, (0, 0, 0, pad)), rotations, F.pad(key_mask, (0, pad)), 8, causal
    )[:, :, :n]
    keep = key_mask[:, None, :, None].expand_as(got)
    torch.testing.assert_close(got[keep], expected[keep])
    # the neighbourhood really is local: far from full attention
    full = softmax_attention(qk, F.normalize(qk, dim=-1), v, key_mask, causal, exclude_self=True)
    assert rel(got[keep], full[keep]) > 0.05


def test_reformer_causal_reads_no_future_value_but_its_chunks_depend_on_future_hashes():
    g = torch.Generator().manual_seed(0)
    qk, v = torch.randn(2, 1, H, 64, D_H, generator=g, dtype=torch.float64).unbind(0)
    rotations = torch.randn(D_H, 2, 4, generator=g, dtype=torch.float64)
    t = 30
    y = lsh_attention(qk, v, rotations, chunk_size=8, causal=True)
    v2 = v.clone()
    v2[:, :, t + 1 :] = torch.randn_like(v2[:, :, t + 1 :])
    y2 = lsh_attention(qk, v2, rotations, chunk_size=8, causal=True)
    torch.testing.assert_close(y2[:, :, : t + 1], y[:, :, : t + 1])
    # Changing future *queries/keys* re-sorts the buckets, which changes which past keys share a
    # chunk with a past query: documented, inherent to chunked LSH (trax, HF, lucidrains alike).
    qk2 = qk.clone()
    qk2[:, :, t + 1 :] = torch.randn_like(qk2[:, :, t + 1 :])
    y2 = lsh_attention(qk2, v, rotations, chunk_size=8, causal=True)
    assert not torch.allclose(y2[:, :, : t + 1], y[:, :, : t + 1])


def test_reformer_padding_tokens_sort_after_real_ones():
    qk = torch.randn(1, 1, 10, 4)
    key_mask = right_padding(1, 10, [6])
    buckets = lsh_buckets(qk, torch.randn(4, 2, 3), key_mask)
    assert (buckets[..., 6:] == 6).all() and (buckets[..., :6] < 6).all()


def test_reformer_has_no_key_projection():
    layer = ReformerAttention(D, H)
    assert layer.k_proj is None
    assert "k_proj.weight" not in layer.state_dict()
