"""PrimalAttention's qk_transform hook (how HF models' RoPE reaches the layer): fast paths agree,
step() and prefill_state() agree with forward. Needs torch only."""

from __future__ import annotations

import pytest
import torch

from primal_attention import PrimalAttention
from primal_attention.ops.primal import fused


def position_transform(start: int, n: int):
    """A per-token map of [q | k] (B, n, 2D) that depends on the absolute positions start..start+n-1."""
    angle = torch.arange(start, start + n, dtype=torch.float64)[None, :, None] * 0.3

    def transform(qk: torch.Tensor) -> torch.Tensor:
        a = angle.to(qk.dtype)
        return qk * torch.cos(a) + qk.roll(1, dims=-1) * torch.sin(a)

    return transform


@pytest.mark.parametrize("causal", [True, False])
def test_folded_and_per_head_paths_agree_with_a_transform(causal):
    torch.manual_seed(0)
    layer = PrimalAttention(8, 2, rank=3, num_samples=5, causal=causal).double()
    x = torch.randn(2, 12, 8, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, 9:] = False
    results = []
    for fold in (True, False):
        out, _ = fused.primal_attention(x, layer.weights(), heads=2, causal=causal, mask=mask, sampling="valid",
                                             fold_out=fold, qk_transform=position_transform(0, 12))
        grads = torch.autograd.grad(out.square().sum(), [x, layer.q_proj.weight, layer.we])
        results.append((out, grads))
    (a, ga), (b, gb) = results
    torch.testing.assert_close(a, b)
    for u, v in zip(ga, gb):
        torch.testing.assert_close(u, v)
    plain, _ = fused.primal_attention(x, layer.weights(), heads=2, causal=causal, mask=mask, sampling="valid")
    assert not torch.allclose(a, plain)


def test_step_and_prefill_state_follow_forward_with_a_transform():
    torch.manual_seed(0)
    layer = PrimalAttention(8, 2, rank=3, causal=True).double().eval()
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[0, :2] = False  # left padding
    full = layer(x, mask, qk_transform=position_transform(0, 7))
    state = layer.prefill_state(x[:, :4], mask[:, :4], qk_transform=position_transform(0, 4))
    for t in range(4, 7):
        out, state = layer.step(x[:, t], state, mask[:, t], qk_transform=position_transform(t, 1))
        torch.testing.assert_close(out[mask[:, t]], full[:, t][mask[:, t]])
    stepped = None
    for t in range(7):
        _, stepped = layer.step(x[:, t], stepped, mask[:, t], qk_transform=position_transform(t, 1))
    whole = layer.prefill_state(x, mask, qk_transform=position_transform(0, 7))
    torch.testing.assert_close(whole.total, stepped.total)
    torch.testing.assert_close(whole.count, stepped.count)
    assert whole.count.tolist() == [5.0, 7.0]


def test_reference_path_refuses_a_transform():
    layer = PrimalAttention(8, 2, rank=3, causal=True, impl="reference")
    with pytest.raises(ValueError, match="qk_transform needs impl='fast'"):
        layer(torch.randn(1, 3, 8), qk_transform=position_transform(0, 3))
