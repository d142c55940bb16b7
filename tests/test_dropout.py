"""The models' dropout: torch.nn.Dropout's distribution (to 1/32768 in p), unbiased, reproducible."""

from __future__ import annotations

import pytest
import torch

from primal_attention.models.dropout import Dropout, dropout, realised_probability


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_drop_rate_and_scale(p: float) -> None:
    torch.manual_seed(0)
    x = torch.ones(400, 1000)
    y = dropout(x, p)
    dropped = (y == 0).double().mean().item()
    q = realised_probability(p)
    # 4e5 Bernoulli draws: the standard error of the rate is below 8e-4.
    assert abs(dropped - q) < 4e-3
    kept = y[y != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 1 / (1 - q)))
    assert abs(y.mean().item() - 1.0) < 2e-2


def test_every_lane_is_uniform() -> None:
    # the four 15-bit lanes of each 64-bit word must all be unbiased (the word's top bit is constant)
    torch.manual_seed(1)
    y = dropout(torch.ones(200_000, 4), 0.5)
    rates = (y == 0).double().mean(dim=0)
    assert torch.all((rates - 0.5).abs() < 6e-3), rates


def test_backward_uses_the_same_mask() -> None:
    torch.manual_seed(2)
    x = torch.randn(64, 33, requires_grad=True)
    y = dropout(x, 0.3)
    y.sum().backward()
    scale = 1 / (1 - realised_probability(0.3))
    torch.testing.assert_close(x.grad, (y != 0).float() * scale)


def test_reproducible_from_seed_and_identity_in_eval() -> None:
    x = torch.randn(10, 70)
    torch.manual_seed(3)
    a = dropout(x, 0.2)
    torch.manual_seed(3)
    b = dropout(x, 0.2)
    assert torch.equal(a, b)
    layer = Dropout(0.2).eval()
    assert torch.equal(layer(x), x)
    assert torch.equal(dropout(x, 0.0), x)
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))


def test_odd_sizes_and_bf16() -> None:
    torch.manual_seed(4)
    for shape in [(1,), (3,), (5, 7), (0, 4)]:
        assert dropout(torch.ones(shape), 0.5).shape == shape
    y = dropout(torch.ones(1000, dtype=torch.bfloat16), 0.5)
    assert y.dtype == torch.bfloat16 and set(y.unique().tolist()) <= {0.0, 2.0}


def test_bad_probability() -> None:
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        Dropout(1.5)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        dropout(torch.ones(3), -0.1)
