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
