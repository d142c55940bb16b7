"""Bad input gets one clear error naming what was expected and what came."""

from __future__ import annotations

import pytest
import torch

from primal_attention import PrimalAttention, SoftmaxAttention, build_attention
import primal_attention as pa


@pytest.mark.parametrize("kwargs,match", [
    (dict(embed_dim=10, num_heads=3), "must divide"),
    (dict(embed_dim=0, num_heads=1), "positive"),
    (dict(embed_dim=8, num_heads=2, rank=0), "rank must be a positive int"),
    (dict(embed_dim=8, num_heads=2, rank=-3), "rank must be a positive int"),
    (dict(embed_dim=8, num_heads=2, rank_multi=0), "rank_multi"),
    (dict(embed_dim=8, num_heads=2, num_samples=0), "num_samples"),
    (dict(embed_dim=8, num_heads=2, max_seq_len=0), "max_seq_len"),
    (dict(embed_dim=8, num_heads=2, sampling="random"), "sampling"),
    (dict(embed_dim=8, num_heads=2, dropout=1.5), "dropout"),
])
def test_bad_construction(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        PrimalAttention(**kwargs)


def test_num_samples_capped_by_max_seq_len() -> None:
    assert PrimalAttention(8, 2, 4, rank_multi=10).num_samples == 40
    assert PrimalAttention(8, 2, 4, rank_multi=10, max_seq_len=29).num_samples == 29
    assert PrimalAttention(8, 2, 4, num_samples=7).we.shape == (2, 7, 4)
    assert PrimalAttention(8, 2, 4, causal=True).we.shape == (2, 4, 4)


@pytest.mark.parametrize("cls", [PrimalAttention, SoftmaxAttention])
def test_bad_forward_input(cls) -> None:
    layer = cls(64, 2)
    with pytest.raises(ValueError, match=r"expected x of shape \(B, N, 64\), got \(4, 128, 32\)"):
        layer(torch.randn(4, 128, 32))
    with pytest.raises(ValueError, match=r"expected x of shape"):
        layer(torch.randn(128, 64))
    with pytest.raises(ValueError, match="at least one token"):
        layer(torch.randn(2, 0, 64))
    with pytest.raises(ValueError, match="floating-point"):
        layer(torch.ones(2, 3, 64, dtype=torch.long))
    with pytest.raises(TypeError, match="torch.Tensor"):
        layer([[0.0] * 64])
    x = torch.randn(2, 5, 64)
    with pytest.raises(ValueError, match=r"mask of shape \(2, 5\)"):
        layer(x, torch.ones(2, 6, dtype=torch.bool))
    with pytest.raises(ValueError, match="dtype torch.bool"):
        layer(x, torch.ones(2, 5))
    with pytest.raises(ValueError, match="either mask or attn_mask"):
        layer(x, torch.ones(2, 5, dtype=torch.bool), attn_mask=torch.ones(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="pairwise"):
        layer(x, attn_mask=torch.ones(2, 1, 5, 5, dtype=torch.bool))


@pytest.mark.parametrize("cls", [PrimalAttention, SoftmaxAttention])
def test_non_finite_input_check_is_optional(cls) -> None:
    x = torch.randn(2, 5, 16)
    x[0, 1, 2] = float("nan")
    assert torch.isnan(cls(16, 2)(x)).any()  # off by default: no sync per call
    with pytest.raises(ValueError, match="NaN or Inf"):
        cls(16, 2, check_finite=True)(x)


@pytest.mark.parametrize("name", ["primal", "softmax", "softmax_materialized"])
@pytest.mark.parametrize("causal", [False, True])
def test_fully_padded_sample_is_finite_and_defined(name, causal) -> None:
    """A sample with no real token: every row equals out_proj.bias; never NaN; no gradient NaN."""
    kw = dict(rank=3, sampling="valid") if name == "primal" else {}
    layer = build_attention(name, 16, 2, causal=causal, **kw)
    x = torch.randn(2, 6, 16, requires_grad=True)
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1] = False
    with pa.ksvd_terms(layer) as terms:
        out = layer(x, mask)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[1], layer.out_proj.bias.expand(6, -1))
    loss = out.sum()
    if name == "primal":
        j = terms.objective("sample")
        assert torch.isfinite(j).all()
        loss = loss + j.square().sum()
    loss.backward()
    assert torch.isfinite(x.grad).all()


def test_unknown_attention_name() -> None:
    with pytest.raises(ValueError, match="unknown attention 'flash'; available: .*primal"):
        build_attention("flash", 16, 2)


def test_check_input_dtype_option() -> None:
    from primal_attention.layers.checks import check_input

    x = torch.randn(2, 3, 4, dtype=torch.float16)
    check_input(x, None, 4, name="SoftmaxAttention")  # no dtype given: no check
    check_input(x, None, 4, name="SoftmaxAttention", dtype=torch.float16)
    expected = (r"^SoftmaxAttention: expected x of dtype torch.bfloat16 \(the layer's parameters\), "
                r"got torch.float16; convert with layer.half\(\) or x.bfloat16\(\)$")
    with pytest.raises(ValueError, match=expected):
        check_input(x, None, 4, name="SoftmaxAttention", dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        check_input(x, None, 4, name="SoftmaxAttention", dtype=torch.float32)
    with pytest.raises(ValueError, match="floating-point"):  # the integer case keeps its own message
        check_input(torch.ones(2, 3, 4, dtype=torch.long), None, 4, dtype=torch.float32)



@pytest.mark.parametrize("seq_len", [12, 200], ids=["per-head path", "folded path"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_non_finite_padding_token_never_reaches_a_real_row_of_a_causal_primal_layer(seq_len, value) -> None:
    torch.manual_seed(0)
    layer = PrimalAttention(8, 2, 3, causal=True).double()
    x = torch.randn(2, seq_len, 8, dtype=torch.float64)
    mask = torch.ones(2, seq_len, dtype=torch.bool)
    mask[0, :3] = False  # left padding
    mask[1, 5] = False  # a hole
    clean = layer(x, mask)
    x[~mask] = value
    dirty = layer(x, mask)
    torch.testing.assert_close(dirty, clean, rtol=0, atol=1e-12)  # every row, padding rows are the bias
    state = layer.prefill_state(x, mask)
    assert torch.isfinite(state.total).all()
    out, state = layer.step(torch.full((2, 8), value, dtype=torch.float64), state, torch.tensor([False, False]))
    assert torch.isfinite(out).all() and torch.isfinite(state.total).all()
