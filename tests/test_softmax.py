"""Softmax attention: fused SDPA equals the materialised N×N path and torch's own MHA."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from primal_attention import MaterializedSoftmaxAttention, SoftmaxAttention


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padding", [False, True])
def test_fused_equals_materialised(causal, padding) -> None:
    torch.manual_seed(0)
    fused = SoftmaxAttention(24, 3, causal=causal).double()
    plain = MaterializedSoftmaxAttention(24, 3, causal=causal).double()
    plain.load_state_dict(fused.state_dict())
    x = torch.randn(3, 17, 24, dtype=torch.float64)
    mask = (torch.arange(17)[None] < torch.tensor([[17], [9], [1]])) if padding else None
    torch.testing.assert_close(fused(x, mask), plain(x, mask))


def test_matches_torch_multihead_attention() -> None:
    torch.manual_seed(0)
    ours = SoftmaxAttention(16, 2).double()
    mha = nn.MultiheadAttention(16, 2, batch_first=True).double()
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
        mha.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        mha.out_proj.weight.copy_(ours.out_proj.weight)
        mha.out_proj.bias.copy_(ours.out_proj.bias)
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    mask = torch.arange(11)[None] < torch.tensor([[11], [6]])
    expected, _ = mha(x, x, x, key_padding_mask=~mask, need_weights=False)
    out = ours(x, mask)
    torch.testing.assert_close(out[mask], expected[mask])


def test_padding_content_does_not_leak() -> None:
    torch.manual_seed(0)
    layer = SoftmaxAttention(16, 2)
    x = torch.randn(2, 10, 16)
    mask = torch.arange(10)[None] < torch.tensor([[10], [4]])
    a = layer(x, mask)
    x2 = x.clone()
    x2[1, 4:] = 1e3
    torch.testing.assert_close(layer(x2, mask)[mask], a[mask])


def test_materialised_cannot_be_fused() -> None:
    with pytest.raises(ValueError, match="never fused"):
        MaterializedSoftmaxAttention(16, 2, fused=True)


def test_dtype_mismatch_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="expected x of dtype torch.float32"):
        SoftmaxAttention(16, 2)(torch.randn(2, 5, 16, dtype=torch.float64))


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layer_cls", [SoftmaxAttention, MaterializedSoftmaxAttention], ids=["sdpa", "explicit"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_a_non_finite_later_token_leaves_earlier_rows_finite(layer_cls, bad, device) -> None:
    torch.manual_seed(0)
    layer = layer_cls(16, 2, causal=True).to(device)
    x = torch.randn(2, 9, 16, device=device)
    clean = layer(x)
    x[0, 5, 3] = bad  # token 5 of sample 0
    out = layer(x)
    torch.testing.assert_close(out[0, :5], clean[0, :5])  # rows before it: as without it
    assert torch.isnan(out[0, 5:]).all()  # rows that attend to it: NaN, as the plain math gives
    torch.testing.assert_close(out[1], clean[1])  # the other sample is untouched
    # with padding: earlier rows finite, the padding rows still out_proj.bias
    mask = torch.ones(2, 9, dtype=torch.bool, device=device)
    mask[0, 7:] = False
    out = layer(x, mask)
    assert torch.isfinite(out[0, :5]).all() and torch.isnan(out[0, 5:7]).all()
    torch.testing.assert_close(out[0, 7:], layer.out_proj.bias.expand(2, 16))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layer_cls", [SoftmaxAttention, MaterializedSoftmaxAttention], ids=["sdpa", "explicit"])
@pytest.mark.parametrize("causal", [False, True])
def test_a_non_finite_padding_token_changes_nothing(layer_cls, causal, device) -> None:
    torch.manual_seed(0)
    layer = layer_cls(16, 2, causal=causal).to(device)
    x = torch.randn(2, 9, 16, device=device)
    mask = torch.arange(9, device=device)[None] < torch.tensor([[9], [6]], device=device)
    clean = layer(x, mask)
    x[1, 7] = float("nan")  # a padding token of sample 1
    out = layer(x, mask)
    torch.testing.assert_close(out, clean)  # real rows and padding rows (out_proj.bias) alike


def test_the_path_that_never_reads_the_flag_gives_the_same_rows(monkeypatch) -> None:
    """Accelerators and torch.compile always zero and re-taint (no wait on the device): on the CPU
    that path is taken by pretending to compile, and must equal the one that reads the flag."""
    torch.manual_seed(0)
    layer = SoftmaxAttention(16, 2, causal=True)
    x = torch.randn(2, 9, 16)
    mask = torch.arange(9)[None] < torch.tensor([[9], [6]])
    for bad in (None, (0, 5)):
        if bad is not None:
            x[bad[0], bad[1], 0] = float("nan")
        read = layer(x, mask), layer(x)
        with monkeypatch.context() as m:
            m.setattr(torch.compiler, "is_compiling", lambda: True)
            unread = layer(x, mask), layer(x)
        for a, b in zip(read, unread):
            torch.testing.assert_close(a, b, equal_nan=True)
