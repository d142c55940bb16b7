"""Causal layers: no information from the future, and O(1) incremental decoding equal to forward."""

from __future__ import annotations

import pytest
import torch

from primal_attention import PrimalAttention, SoftmaxAttention


def make(cls, **kw):
    torch.manual_seed(0)
    if cls is PrimalAttention:
        return PrimalAttention(16, 2, 5, causal=True, **kw).double()
    return SoftmaxAttention(16, 2, causal=True, **kw).double()


@pytest.mark.parametrize("cls", [PrimalAttention, SoftmaxAttention])
@pytest.mark.parametrize("padding", ["none", "right", "left"])
def test_future_tokens_do_not_change_the_past(cls, padding) -> None:
    layer = make(cls)
    x = torch.randn(3, 20, 16, dtype=torch.float64)
    mask = None
    if padding == "right":
        mask = torch.arange(20)[None, :] < torch.tensor([[20], [12], [5]])
    elif padding == "left":
        mask = torch.arange(20)[None, :] >= torch.tensor([[0], [8], [15]])
    base = layer(x, mask)
    for t in (0, 7, 18):
        x2 = x.clone()
        x2[:, t + 1 :] = torch.randn_like(x2[:, t + 1 :]) * 10
        out = layer(x2, mask)
        torch.testing.assert_close(out[:, : t + 1], base[:, : t + 1], rtol=1e-12, atol=1e-12)


def test_left_padding_is_ignored_by_real_tokens() -> None:
    """With left padding, real tokens see the same output whatever the padding holds."""
    layer = make(PrimalAttention)
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    mask = torch.arange(12)[None, :] >= torch.tensor([[0], [4]])
    a = layer(x, mask)
    x2 = x.clone()
    x2[1, :4] = 100.0
    b = layer(x2, mask)
    torch.testing.assert_close(a[mask], b[mask])
    # and the real suffix of sample 1 equals running it alone without padding
    alone = layer(x[1:, 4:])
    torch.testing.assert_close(a[1, 4:], alone[0])


@pytest.mark.parametrize("padding", [False, True])
def test_step_equals_forward(padding) -> None:
    layer = make(PrimalAttention)
    x = torch.randn(3, 15, 16, dtype=torch.float64)
    mask = None
    if padding:
        mask = torch.ones(3, 15, dtype=torch.bool)
        mask[1, :5] = False  # left padding
        mask[2, 10:] = False  # right padding
    full = layer(x, mask)
    state = None
    outs = []
    for t in range(15):
        out_t, state = layer.step(x[:, t], state, None if mask is None else mask[:, t])
        outs.append(out_t)
        assert state.total.shape == (3, 32) and state.count.shape == (3,)  # O(1) in t
    torch.testing.assert_close(torch.stack(outs, dim=1), full, rtol=1e-10, atol=1e-10)


def test_step_accepts_token_axis_and_float32() -> None:
    layer = PrimalAttention(16, 2, 5, causal=True)
    x = torch.randn(2, 6, 16)
    full = layer(x)
    state = None
    for t in range(6):
        out_t, state = layer.step(x[:, t : t + 1], state)
        assert out_t.shape == (2, 1, 16)
        torch.testing.assert_close(out_t[:, 0], full[:, t], rtol=1e-5, atol=1e-6)


def test_step_errors() -> None:
    with pytest.raises(RuntimeError, match="only causal"):
        PrimalAttention(16, 2, 4).step(torch.randn(2, 16))
    layer = PrimalAttention(16, 2, 4, causal=True)
    with pytest.raises(ValueError, match=r"\(B, 16\)"):
        layer.step(torch.randn(2, 8))
    with pytest.raises(ValueError, match="one token"):
        layer.step(torch.randn(2, 3, 16))
    with pytest.raises(ValueError, match="mask_t"):
        layer.step(torch.randn(2, 16), mask_t=torch.ones(2))
