"""The local-window + primal layer: its band, its two limits, exact O(1)-memory decoding, packed rows."""

from __future__ import annotations

import math

import pytest
import torch

import primal_attention as pa
from primal_attention.layers.window import WindowState
from primal_attention.ops.local import band_attention

D, H = 16, 2


def layer(window: int, causal: bool, gate: float = 0.3, seed: int = 0, **options) -> pa.WindowPrimalAttention:
    torch.manual_seed(seed)
    return pa.WindowPrimalAttention(D, H, 4, window=window, causal=causal, gate_init=gate, **options).double().eval()


def dense_band(q, k, v, left, right, past=0, key_real=None, segments=None):
    """The band as a dense masked softmax (the definition band_attention must equal)."""
    steps, keys = q.shape[2], k.shape[2]
    i = torch.arange(steps)[:, None] + past
    j = torch.arange(keys)[None, :]
    keep = ((j >= i - left) & (j <= i + right))[None, None].expand(q.shape[0], 1, steps, keys)
    if key_real is not None:
        keep = keep & key_real[:, None, None, :]
    if segments is not None:
        keep = keep & (segments[:, None, past:, None] == segments[:, None, None, :])
    keep = keep | (j == i)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return scores.masked_fill(~keep, float("-inf")).softmax(-1) @ v


@pytest.mark.parametrize("left,right,past,steps", [(0, 0, 0, 5), (3, 0, 0, 13), (4, 4, 0, 13), (7, 0, 7, 9),
                                                   (2, 0, 5, 1), (40, 0, 0, 11), (5, 5, 0, 3), (6, 0, 2, 17)])
def test_band_attention_equals_the_dense_masked_softmax(left, right, past, steps) -> None:
    g = torch.Generator().manual_seed(left * 100 + steps)
    q = torch.randn(2, 3, steps, 4, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 3, past + steps, 4, generator=g, dtype=torch.float64) for _ in range(2))
    real = torch.rand(2, past + steps, generator=g) > 0.3
    segments = torch.cat([torch.zeros(2, (past + steps) // 2), torch.ones(2, past + steps - (past + steps) // 2)], 1).long()
    for key_real, seg in ((None, None), (real, None), (None, segments), (real, segments)):
        got = band_attention(q, k, v, left=left, right=right, past=past, key_real=key_real, segments=seg)
        torch.testing.assert_close(got, dense_band(q, k, v, left, right, past, key_real, seg), rtol=0, atol=1e-12)
    for block in (1, 2, 5):  # the blocking is an implementation detail
        torch.testing.assert_close(band_attention(q, k, v, left=left, right=right, past=past, block=block),
                                   dense_band(q, k, v, left, right, past), rtol=0, atol=1e-12)


@pytest.mark.parametrize("causal", [True, False])
def test_gate_closed_is_the_primal_layer_and_open_with_a_wide_window_is_softmax(causal) -> None:
    x = torch.randn(2, 11, D, dtype=torch.float64)
    mask = torch.ones(2, 11, dtype=torch.bool)
    mask[1, :3 if causal else 8] = False  # left padding for the causal layer, right padding otherwise
    closed = layer(4, causal, gate=-80.0)
    primal = pa.PrimalAttention(D, H, 4, causal=causal).double().eval()
    primal.load_state_dict(closed.primal.state_dict())
    torch.testing.assert_close(closed(x, mask), primal(x, mask), rtol=0, atol=1e-12)

    wide = layer(64, causal, gate=80.0)
    softmax = pa.SoftmaxAttention(D, H, causal=causal).double().eval()
    with torch.no_grad():
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            getattr(softmax, name).load_state_dict(getattr(wide, name).state_dict())
    got, want = wide(x, mask), softmax(x, mask)
    torch.testing.assert_close(got[mask], want[mask], rtol=0, atol=1e-12)
    torch.testing.assert_close(got[~mask], wide.out_proj.bias.expand_as(got[~mask]), rtol=0, atol=1e-12)


def test_the_gate_mixes_per_head() -> None:
    x = torch.randn(1, 9, D, dtype=torch.float64)
    mixed = layer(3, True)
    with torch.no_grad():
        mixed.gate.copy_(torch.tensor([80.0, -80.0]))
    q, k, v, _ = mixed._qkv(x, None, None)
    window = band_attention(q, k, v, left=2)  # (1, H, N, d)
    # head 0 is the window alone, head 1 the primal alone: compare before out_proj through its inverse
    y = torch.linalg.solve(mixed.out_proj.weight, (mixed(x) - mixed.out_proj.bias)[0].T).T  # (N, D)
    torch.testing.assert_close(y[:, : D // H], window[0, 0], rtol=0, atol=1e-9)
    assert not torch.allclose(y[:, D // H :], window[0, 1])


def test_step_chunks_and_the_fused_token_equal_the_forward() -> None:
    model = layer(5, True)
    x = torch.randn(3, 23, D, dtype=torch.float64)
    mask = torch.ones(3, 23, dtype=torch.bool)
    mask[2, :4] = False  # left padding
    full = model(x, mask)
    with torch.no_grad():
        state, rows = None, []
        for t in range(23):
            out, state = model.step(x[:, t], state, mask[:, t])
            rows.append(out)
        torch.testing.assert_close(torch.stack(rows, 1), full, rtol=0, atol=1e-9)
        plan, state, rows = model.decode_plan(), None, []
        for t in range(23):
            out, state = model.step(x[:1, t], state, plan=plan)
            rows.append(out)
        torch.testing.assert_close(torch.stack(rows, 1), model(x[:1]), rtol=0, atol=1e-9)
        outs, state = [], None
        for lo, hi in ((0, 2), (2, 3), (3, 11), (11, 23)):
            out, state = model.extend(x[:, lo:hi], state, mask[:, lo:hi])
            outs.append(out)
        torch.testing.assert_close(torch.cat(outs, 1), full, rtol=0, atol=1e-9)


def test_a_causal_lm_with_window_layers_decodes_exactly_in_constant_memory() -> None:
    torch.manual_seed(0)
    cfg = pa.CausalLMConfig(vocab_size=19, max_seq_len=300, dim=D, num_heads=H, ffn_dim=32, dropout=0.0,
                            attention=["window_primal", "softmax", "window_primal"],
                            attention_options={"window_primal": {"window": 4, "rank": 4}})
    model = pa.CausalLM(cfg).double().eval()
    tokens = torch.randint(0, 19, (2, 30))
    with torch.no_grad():
        full = model(tokens)
        _, cache = model.prefill(tokens[:, :7])
        steps = [model.step(tokens[:, t], cache)[0] for t in range(7, 30)]
    torch.testing.assert_close(torch.stack(steps, 1), full[:, 7:], rtol=0, atol=1e-9)

    all_window = pa.CausalLM(pa.CausalLMConfig(vocab_size=19, max_seq_len=300, dim=D, num_heads=H, ffn_dim=32,
                                               dropout=0.0, attention=["window_primal"] * 2,
                                               attention_options={"window_primal": {"window": 4, "rank": 4}}))
    all_window = all_window.eval()
    sizes = {}
    with torch.no_grad():
        for n in (10, 250):
            _, cache = all_window.prefill(torch.randint(0, 19, (1, n)))
            all_window.step(torch.tensor([3]), cache)
            sizes[n] = sum(t.nbytes for layer in cache.layers for t in layer.attn if isinstance(t, torch.Tensor))
    # per layer (float32): a ring of 4 keys and 4 values per head, Σ[q | k] (2D), the count, 4 "real" flags
    assert sizes[10] == sizes[250] == 2 * (2 * H * 4 * (D // H) * 4 + 2 * D * 4 + 4 + 4)


def test_packed_rows_equal_their_documents_run_alone() -> None:
    torch.manual_seed(1)
    cfg = pa.CausalLMConfig(vocab_size=23, max_seq_len=40, dim=D, num_heads=H, ffn_dim=32, dropout=0.0,
                            attention=["window_primal", "window_primal"],
                            attention_options={"window_primal": {"window": 3, "rank": 4}})
    model = pa.CausalLM(cfg).double().eval()
    lengths = [5, 9, 2]
    docs = [torch.randint(0, 23, (n,)) for n in lengths]
    segments = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])[None]
    with torch.no_grad():
        got = model(torch.cat(docs)[None], segments=segments)[0]
        want = torch.cat([model(d[None])[0] for d in docs])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-9)


def test_training_sends_the_primal_branchs_ksvd_term_and_trains_the_gate() -> None:
    torch.manual_seed(2)
    stack = pa.TransformerStack(["window_primal", "softmax"], D, H, 32, causal=True,
                                attention_options={"window_primal": {"window": 4, "rank": 4}})
    x = torch.randn(2, 10, D)
    with pa.ksvd_terms(stack) as terms:
        out = stack(x)
        assert len(terms) == 1  # one forward of the window layer's primal branch
        ksvd = terms.loss()
    assert torch.isfinite(ksvd) and ksvd.requires_grad
    (out.pow(2).mean() + 0.1 * ksvd).backward()
    window = stack.blocks[0].attn
    assert window.gate.grad is not None and window.gate.grad.abs().sum() > 0
    assert window.v_proj.weight.grad.abs().sum() > 0 and window.primal.we.grad.abs().sum() > 0


def test_bad_options_states_and_inputs_are_one_line_errors() -> None:
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="window must be a positive int"):
            pa.WindowPrimalAttention(D, H, window=bad)
    with pytest.raises(ValueError, match="gate_init must be a finite number"):
        pa.WindowPrimalAttention(D, H, gate_init=float("nan"))
    with pytest.raises(ValueError, match="unknown option windw; expected window, gate_init"):
        pa.WindowPrimalAttention(D, H, windw=4)
    with pytest.raises(ValueError, match="rank must be a positive int"):
        pa.WindowPrimalAttention(D, H, rank=0)
    model = layer(4, True)
    with pytest.raises(ValueError, match=r"expected x of shape \(B, N, 16\)"):
        model(torch.randn(2, 5, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="expected x of dtype torch.float64"):
        model(torch.randn(2, 5, D))
    _, state = model.extend(torch.randn(2, 5, D, dtype=torch.float64))
    with pytest.raises(ValueError, match="does not fit the layer and batch 3"):
        model.step(torch.randn(3, D, dtype=torch.float64), state)
    with pytest.raises(TypeError, match="expected state to be a WindowState"):
        model.step(torch.randn(2, D, dtype=torch.float64), pa.PrimalState(torch.zeros(2, 2 * D), torch.zeros(2)))
    with pytest.raises(ValueError, match="does not fit the layer"):
        layer(6, True).step(torch.randn(2, D, dtype=torch.float64), state)
    with pytest.raises(RuntimeError, match="only causal layers decode"):
        layer(4, False).step(torch.randn(2, D, dtype=torch.float64))
    with pytest.raises(ValueError, match="segments .* need a causal layer"):
        layer(4, False)(torch.randn(1, 4, D, dtype=torch.float64), segments=torch.zeros(1, 4, dtype=torch.long))
    assert isinstance(state, WindowState) and state.seen == 5


def test_the_primal_branch_is_seen_by_the_analysis_tools() -> None:
    from primal_attention.analysis.capture import capture_inputs

    stack = pa.TransformerStack(["window_primal", "softmax"], D, H, 32, causal=True,
                                attention_options={"window_primal": {"window": 4, "rank": 4}})
    x = torch.randn(2, 7, D)
    with capture_inputs(stack) as seen:
        stack(x)
    assert sorted(seen) == ["blocks.0.attn.primal", "blocks.1.attn"]
    torch.testing.assert_close(seen["blocks.0.attn.primal"].x, stack.blocks[0].norm1(x))


@pytest.mark.parametrize("causal", [True, False])
def test_the_reference_primal_branch_gives_the_fast_paths_numbers(causal) -> None:
    fast = layer(3, causal, gate=0.4)
    ref = pa.WindowPrimalAttention(D, H, 4, window=3, causal=causal, gate_init=0.4, impl="reference").double().eval()
    ref.load_state_dict(fast.state_dict())
    x = torch.randn(2, 9, D, dtype=torch.float64)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 6:] = False
    torch.testing.assert_close(ref(x, mask), fast(x, mask), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="need impl='fast'"):
        ref(x, qk_transform=lambda qk: qk)


def test_decoding_under_bfloat16_autocast_keeps_the_ring_in_the_parameters_dtype() -> None:
    torch.manual_seed(0)
    cfg = pa.CausalLMConfig(vocab_size=19, max_seq_len=64, dim=D, num_heads=H, ffn_dim=32, dropout=0.0,
                            attention=["window_primal"] * 2, attention_options={"window_primal": {"window": 4, "rank": 4}})
    model = pa.CausalLM(cfg).eval()
    tokens = torch.randint(0, 19, (2, 20))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        full = model(tokens)
        _, cache = model.prefill(tokens[:, :7])
        steps = [model.step(tokens[:, t], cache)[0] for t in range(7, 20)]
    assert all(layer.attn.keys.dtype == torch.float32 for layer in cache.layers)
    torch.testing.assert_close(torch.stack(steps, 1).float(), full[:, 7:].float(), rtol=0, atol=2e-2)
