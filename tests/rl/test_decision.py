"""Decision Transformer: incremental decoding equals the forward, padding is exact, bad input is a clear
error; rollouts in the real environment (incremental and windowed agree)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import primal_attention as pa
from primal_attention.train.rollout import RolloutSet, rollout

PATTERNS = {"dt": ["softmax"] * 3, "primal+": ["softmax", "softmax", "primal"], "all-primal": ["primal"] * 3}


def dt(pattern, context=6, state_dim=5, act_dim=2) -> pa.DecisionTransformer:
    torch.manual_seed(0)
    cfg = pa.DecisionTransformerConfig(state_dim, act_dim, context=context, max_ep_len=100, dim=16, num_heads=2,
                                       ffn_dim=32, attention=pattern, attention_options={"primal": {"rank": 4}})
    return pa.DecisionTransformer(cfg).double().eval()


def inputs(b=3, k=6, s=5, a=2, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, k, s, generator=g, dtype=torch.float64), torch.randn(b, k, a, generator=g, dtype=torch.float64),
            torch.randn(b, k, 1, generator=g, dtype=torch.float64), torch.randint(0, 100, (b, k), generator=g))


@pytest.mark.parametrize("kind", list(PATTERNS))
def test_push_equals_the_forward_and_right_padding_is_exact(kind) -> None:
    model = dt(PATTERNS[kind])
    s, a, r, t = inputs()
    with torch.no_grad():
        full = model(s, actions=a, returns_to_go=r, timesteps=t)
        state = None
        for k in range(6):
            _, state = model.push("return", r[:, k], t[:, k], state)
            pred, state = model.push("state", s[:, k], t[:, k], state)
            torch.testing.assert_close(pred, full[:, k], rtol=0, atol=1e-9)
            _, state = model.push("action", a[:, k], t[:, k], state)
        assert state.length == 18 and all(layer.attn_plan is not None for layer in state.layers)  # built at the first push
        mask = torch.ones(3, 6, dtype=torch.bool)
        mask[0, 4:] = False
        padded = model(s, mask, actions=a, returns_to_go=r, timesteps=t)
        short = model(s[:1, :4], actions=a[:1, :4], returns_to_go=r[:1, :4], timesteps=t[:1, :4])
        torch.testing.assert_close(padded[0, :4], short[0], rtol=0, atol=1e-9)
    assert full.abs().max() <= 1  # tanh head


def test_bad_input_is_a_clear_error() -> None:
    model = dt(PATTERNS["primal+"])
    s, a, r, t = inputs()
    with pytest.raises(ValueError, match=r"expected states \(B, K, 5\)"):
        model(s[..., :4], actions=a, returns_to_go=r, timesteps=t)
    with pytest.raises(ValueError, match="expected 1..6 steps"):
        model(torch.cat([s, s], 1), actions=torch.cat([a, a], 1), returns_to_go=torch.cat([r, r], 1), timesteps=torch.cat([t, t], 1))
    with pytest.raises(ValueError, match="expected actions"):
        model(s, actions=a[..., :1], returns_to_go=r, timesteps=t)
    with pytest.raises(ValueError, match="timesteps must be int64"):
        model(s, actions=a, returns_to_go=r, timesteps=t.float())
    with pytest.raises(ValueError, match="must be a return token"):
        model.push("state", s[:, 0], t[:, 0])
    model.train()
    with pytest.raises(RuntimeError, match="call model.eval"):
        model.push("return", r[:, 0], t[:, 0])
    with pytest.raises(ValueError, match="must be positive"):
        pa.DecisionTransformer(pa.DecisionTransformerConfig(0, 2))


@pytest.mark.parametrize("kind", ["primal+", "all-primal"])
def test_rollouts_decode_incrementally_as_the_windowed_forward(kind) -> None:
    model = dt(PATTERNS[kind], context=8, state_dim=11, act_dim=3)
    rs = RolloutSet("hopper", 3600.0, 2, 5, np.zeros(11), np.ones(11), context=8, max_ep_len=30)
    fast = rollout(model, rs, torch.device("cpu"))
    rs.incremental = False
    slow = rollout(model, rs, torch.device("cpu"))
    assert fast["length"] == slow["length"] and 0 < fast["length"] <= 30
    assert fast["return"] == pytest.approx(slow["return"], rel=1e-9)
    assert fast["score"] == pytest.approx(pa_score(fast["return"]), rel=1e-9)


def pa_score(ret: float) -> float:
    from primal_attention.data.rl import normalized_score

    return normalized_score("hopper", ret)
