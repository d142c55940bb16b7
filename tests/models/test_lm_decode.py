"""CausalLM decoding: step-by-step and prefill + steps equal the full forward (float64, <= 1e-9)."""

from __future__ import annotations

import pytest
import torch

import primal_attention as pa
from primal_attention.layers.softmax import KVCache

PATTERNS = {"softmax": ["softmax"] * 3, "hybrid": ["softmax", "softmax", "primal"], "all-primal": ["primal"] * 3}


def lm(pattern: list[str], **blocks) -> pa.CausalLM:
    torch.manual_seed(0)
    cfg = pa.CausalLMConfig(vocab_size=23, max_seq_len=40, dim=16, num_heads=2, ffn_dim=32, attention=pattern,
                            attention_options={"primal": {"rank": 4}}, dropout=0.1, **blocks)
    return pa.CausalLM(cfg).double().eval()


@pytest.mark.parametrize("blocks", [{}, {"norm_first": False, "activation": "relu"}], ids=["prenorm", "postnorm-relu"])
@pytest.mark.parametrize("kind", list(PATTERNS))
def test_step_by_step_equals_the_full_forward(kind, blocks) -> None:
    model = lm(PATTERNS[kind], **blocks)
    tokens = torch.randint(0, 23, (3, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(tokens)
        state = None
        for t in range(tokens.shape[1]):
            logits, state = model.step(tokens[:, t], state)
            torch.testing.assert_close(logits, full[:, t], rtol=0, atol=1e-9)
        # prefill over the first 17 tokens, then steps
        logits, state = model.prefill(tokens[:, :17])
        torch.testing.assert_close(logits, full[:, :17], rtol=0, atol=1e-9)
        for t in range(17, 30):
            logits, state = model.step(tokens[:, t], state)
            torch.testing.assert_close(logits, full[:, t], rtol=0, atol=1e-9)
    sizes = [type(s).__name__ for s in state.layers]
    assert sizes == ["KVCache" if a == "softmax" else "PrimalState" for a in PATTERNS[kind]]


def test_primal_state_does_not_grow_with_the_context() -> None:
    model = lm(PATTERNS["all-primal"])
    with torch.no_grad():
        _, short = model.prefill(torch.randint(0, 23, (1, 3)))
        _, long = model.prefill(torch.randint(0, 23, (1, 35)))
    assert [s.total.shape for s in short.layers] == [s.total.shape for s in long.layers]


def test_generate_is_greedy_at_temperature_zero_and_seeded_otherwise() -> None:
    model = lm(PATTERNS["hybrid"])
    prompt = torch.randint(0, 23, (2, 5), generator=torch.Generator().manual_seed(2))
    greedy = model.generate(prompt, 6, temperature=0)
    assert greedy.shape == (2, 11) and torch.equal(greedy[:, :5], prompt)
    with torch.no_grad():
        for t in range(5, 11):  # each greedy token is the argmax of the full forward on what came before
            assert torch.equal(greedy[:, t], model(greedy[:, :t])[:, -1].argmax(-1))
    a = model.generate(prompt, 6, top_k=5, generator=torch.Generator().manual_seed(3))
    b = model.generate(prompt, 6, top_k=5, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)


def test_bad_decoding_input_is_a_clear_error() -> None:
    model = lm(PATTERNS["hybrid"])
    with pytest.raises(ValueError, match="exceeds max_seq_len 40"):
        model.generate(torch.zeros(1, 35, dtype=torch.int64), 10)
    with pytest.raises(ValueError, match=r"expected int64 tokens \(B,\)"):
        model.step(torch.zeros(2, 1, dtype=torch.int64))
    with pytest.raises(TypeError, match="expected an LMState"):
        model.step(torch.zeros(2, dtype=torch.int64), ("not", "a state"))
    attn = pa.SoftmaxAttention(16, 2, causal=True)
    with pytest.raises(TypeError, match="expected state to be a KVCache"):
        attn.step(torch.randn(2, 16), (torch.zeros(1),))
    _, cache = attn.step(torch.randn(2, 16))
    assert isinstance(cache, KVCache)
    with pytest.raises(ValueError, match="a state of another layer or batch"):
        attn.step(torch.randn(3, 16), cache)
    with pytest.raises(TypeError, match="has no incremental decoding"):
        pa.TransformerStack(["linear"], 16, 2, 32, causal=True).blocks[0].step(torch.randn(2, 16))


def test_decoding_needs_eval_mode_and_a_cache_of_this_layer() -> None:
    model = lm(PATTERNS["hybrid"]).train()
    with pytest.raises(RuntimeError, match=r"CausalLM.step: decoding runs without dropout; call model.eval\(\)"):
        model.step(torch.zeros(2, dtype=torch.int64))
    with pytest.raises(RuntimeError, match="CausalLM.prefill: decoding runs without dropout"):
        model.prefill(torch.zeros(2, 3, dtype=torch.int64))
    with pytest.raises(RuntimeError, match="TransformerBlock.step: decoding runs without dropout"):
        model.decoder.blocks[0].step(torch.zeros(2, 16, dtype=torch.float64))
    assert model.generate(torch.zeros(2, 3, dtype=torch.int64), 2, temperature=0).shape == (2, 5)
    assert model.training  # generate restores the mode
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 0"):
        model.generate(torch.zeros(2, 3, dtype=torch.int64), 2.5)
    attn = pa.SoftmaxAttention(16, 2, causal=True)
    _, cache = attn.step(torch.randn(2, 16))
    _, cache = attn.step(torch.randn(2, 1, 16), cache)
    assert cache.k.shape == cache.v.shape == (2, 2, 2, 8)  # (B, H, T, d): one entry per step
    with pytest.raises(ValueError, match=r"got \(2, 2, 2, 8\) and \(2, 2, 1, 8\)"):
        attn.step(torch.randn(2, 16), KVCache(cache.k, cache.v[:, :, :1]))
    with pytest.raises(ValueError, match="expected a cache of dtype torch.float32"):
        attn.step(torch.randn(2, 16), KVCache(cache.k.double(), cache.v.double()))


def test_step_validates_its_state_and_ids_as_forward_does() -> None:
    from primal_attention.models.lm import LMState

    model = lm(PATTERNS["hybrid"])
    tokens = torch.randint(0, 23, (2, 4), generator=torch.Generator().manual_seed(4))

    def error(tokens_t, state) -> str:
        with pytest.raises(ValueError) as caught:
            model.step(tokens_t, state)
        return str(caught.value)

    with torch.no_grad():
        _, state = model.prefill(tokens)
        assert "CausalLM.step: token ids must be in [0, 23), got [0, 23]" in error(torch.tensor([0, 23]), state)
        assert "got [-1, 3]" in error(torch.tensor([-1, 3]), state)
        assert "expected state.position to be an int >= 0, got -1" in error(tokens[:, 0], LMState(-1, state.layers))
        assert "state.position is 7 but block 0's KV cache holds 4 tokens" in error(tokens[:, 0], LMState(7, state.layers))
        assert "is past max_seq_len 40" in error(tokens[:, 0], LMState(40, state.layers))
        logits, state = model.step(tokens[:, 0], state)  # the state it made is accepted
        assert state.position == 5 and logits.shape == (2, 23)


def test_an_all_primal_step_validates_every_layer_state() -> None:
    from primal_attention.models.lm import LMState

    model = lm(PATTERNS["all-primal"])
    tokens = torch.randint(0, 23, (2, 4), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        _, state = model.prefill(tokens)
        other = lm(PATTERNS["hybrid"])
        _, hybrid = other.prefill(tokens)
        cases = [(LMState(2, state.layers), ValueError, "position is 2 but block 0 has summed 4 tokens"),
                 (LMState(4, [None] * 3), TypeError, r"block 0 \(PrimalAttention\) expects a PrimalState, got NoneType"),
                 (LMState(4, state.layers[:2]), ValueError, "expected 3 layer states, got 2"),
                 (LMState(4, hybrid.layers), TypeError, "expects a PrimalState, got KVCache"),
                 (LMState(4, [s._replace(total=s.total[:1], count=s.count[:1]) for s in state.layers]), ValueError,
                  "does not fit batch 2")]
        for bad, kind, message in cases:
            with pytest.raises(kind, match=message):
                model.step(tokens[:, 0], bad)
        swapped = LMState(4, state.layers[::-1])  # same shapes: accepted, as any state of this model would be
        model.step(tokens[:, 0], swapped)


def test_generate_validates_temperature_and_top_k() -> None:
    model = lm(PATTERNS["hybrid"])
    prompt = torch.randint(0, 23, (2, 5), generator=torch.Generator().manual_seed(2))
    with pytest.raises(ValueError, match="temperature must be a finite number >= 0, got nan"):
        model.generate(prompt, 3, temperature=float("nan"))
    with pytest.raises(ValueError, match="temperature must be a finite number >= 0, got inf"):
        model.generate(prompt, 3, temperature=float("inf"))
    with pytest.raises(ValueError, match="top_k must be an int > 0 or None, got 2.5"):
        model.generate(prompt, 3, top_k=2.5)
    # A temperature so small that logits / temperature overflow: greedy in the limit, not NaN.
    greedy = model.generate(prompt, 4, temperature=0)
    assert torch.equal(model.float().generate(prompt, 4, temperature=1e-45), model.float().generate(prompt, 4, temperature=0))
    assert torch.equal(model.double().generate(prompt, 4, temperature=1e-320), greedy)


@pytest.mark.parametrize("blocks", [{}, {"norm_first": False, "activation": "relu"}], ids=["prenorm", "postnorm-relu"])
@pytest.mark.parametrize("kind", list(PATTERNS))
def test_fused_step_and_session_equal_the_checked_step(kind, blocks) -> None:
    """The fused step (no grad) and the in-place session equal each block's own step (with grad)."""
    model = lm(PATTERNS[kind], **blocks)
    tokens = torch.randint(0, 23, (3, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        _, state = model.prefill(tokens[:, :5])
        session = model.decode_session(state, 3, 7)
    slow = state
    for t in range(5, 12):
        with torch.no_grad():
            fast, state = model.step(tokens[:, t], state)
            from_session = session.step(tokens[:, t])
        with torch.enable_grad():  # the checked per-block path
            ref, slow = model.step(tokens[:, t], slow)
        torch.testing.assert_close(fast, ref.detach(), rtol=0, atol=1e-12)
        torch.testing.assert_close(from_session, ref.detach(), rtol=0, atol=1e-12)
    states = session.session.states()
    for a, b in zip(states, state.layers):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y.detach(), rtol=0, atol=1e-12)


def test_fused_plan_follows_parameter_updates() -> None:
    model = lm(PATTERNS["hybrid"])
    tok = torch.tensor([1, 2, 3])
    with torch.no_grad():
        before, _ = model.step(tok)
        for p in model.parameters():
            p.mul_(1.1)
        after, _ = model.step(tok)
        full = model(tok[:, None])[:, 0]
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, full, rtol=0, atol=1e-9)


def test_a_new_state_sees_new_weights() -> None:
    """The decoding constants travel in the state (no cache keyed on tensor internals); a state or a
    prefill started after the parameters changed decodes with the new ones."""
    model = lm(PATTERNS["hybrid"])
    tokens = torch.randint(0, 23, (2, 6), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        state = None
        for t in range(3):
            _, state = model.step(tokens[:, t], state)
        assert state.plan is not None and state.plan.blocks is not None
        for p in model.parameters():
            p.mul_(1.05)
        _, fresh = model.prefill(tokens[:, :3])
        assert fresh.plan is None
        other = lm(PATTERNS["hybrid"])  # a state carried to another model decodes with that model's weights
        with_plan = fresh._replace(plan=model.decode_plan())
        logits, _ = other.step(tokens[:, 3], with_plan._replace(layers=other.prefill(tokens[:, :3])[1].layers))
        torch.testing.assert_close(logits, other(tokens[:, :4])[:, 3], rtol=0, atol=1e-9)
        new, _ = model.step(tokens[:, 3], fresh)
        torch.testing.assert_close(new, model(tokens)[:, 3], rtol=0, atol=1e-9)


def test_layer_step_with_a_plan_equals_the_unfused_step() -> None:
    torch.manual_seed(0)
    layer = pa.PrimalAttention(16, 2, rank=4, causal=True).double().eval()
    x = torch.randn(3, 5, 16, dtype=torch.float64)
    with torch.no_grad():
        plan, fused, plain = layer.decode_plan(), None, None
        for t in range(5):
            a, fused = layer.step(x[:, t], fused, plan=plan)
            b, plain = layer.step(x[:, t], plain)
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
            torch.testing.assert_close(a, layer(x[:, : t + 1])[:, t], rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", list(PATTERNS))
def test_batched_generation_with_lengths_equals_one_prompt_at_a_time(kind) -> None:
    model = lm(PATTERNS[kind])
    prompt = torch.randint(1, 23, (3, 7), generator=torch.Generator().manual_seed(5))
    lengths = torch.tensor([7, 3, 5])
    out = model.generate(prompt, 6, temperature=0, lengths=lengths, pad_id=0)
    assert out.shape == (3, 13)
    for b in range(3):
        n = int(lengths[b])
        alone = model.generate(prompt[b : b + 1, :n], 6, temperature=0)
        assert torch.equal(out[b, : n + 6], alone[0])
        assert bool((out[b, n + 6 :] == 0).all())
    with pytest.raises(ValueError, match="lengths must be in"):
        model.generate(prompt, 2, lengths=torch.tensor([0, 3, 5]))


def test_a_plan_list_of_the_wrong_length_is_an_error() -> None:
    model = lm(PATTERNS["hybrid"])
    with torch.no_grad():
        plans = model.decoder.decode_plan()
        with pytest.raises(ValueError, match="expected a plan per block"):
            model.decoder.step(torch.zeros(1, 16, dtype=torch.float64), None, plans=plans[:2])


@pytest.mark.parametrize("blocks", [{}, {"norm_first": False, "activation": "relu"}], ids=["prenorm", "postnorm-relu"])
@pytest.mark.parametrize("kind", list(PATTERNS))
@pytest.mark.parametrize("chunk", [1, 4, 7, 30])
def test_chunked_prefill_equals_one_chunk_and_the_forward(kind, blocks, chunk) -> None:
    model = lm(PATTERNS[kind], **blocks)
    tokens = torch.randint(0, 23, (3, 30), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(3, 30, dtype=torch.bool)
    mask[1, 21:] = False  # right padding
    mask[2, :5] = False  # left padding
    with torch.no_grad():
        full = model(tokens, mask)
        one, one_state = model.prefill(tokens, mask)
        chunked, state = model.prefill(tokens, mask, chunk_size=chunk)
        last, last_state = model.prefill(tokens, mask, chunk_size=chunk, logits="last")
    torch.testing.assert_close(chunked[mask], full[mask], rtol=0, atol=1e-9)
    torch.testing.assert_close(chunked[mask], one[mask], rtol=0, atol=1e-9)
    torch.testing.assert_close(last, full[torch.arange(3), torch.tensor([29, 20, 29])], rtol=0, atol=1e-9)
    assert state.position == last_state.position == 30
    for a, b in zip(state.layers, one_state.layers):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, rtol=0, atol=1e-9)
    # decoding continues identically after a chunked prefill
    with torch.no_grad():
        nxt = torch.randint(0, 23, (3,), generator=torch.Generator().manual_seed(3))
        torch.testing.assert_close(model.step(nxt, state)[0], model.step(nxt, one_state)[0], rtol=0, atol=1e-9)


def test_chunked_generate_equals_one_chunk_and_leaves_nothing_on_the_model() -> None:
    model = lm(PATTERNS["all-primal"])
    prompt = torch.randint(0, 23, (2, 25), generator=torch.Generator().manual_seed(4))
    lengths = torch.tensor([25, 18])
    one = model.generate(prompt, 8, temperature=0, lengths=lengths)
    for chunk in (1, 6):
        torch.testing.assert_close(model.generate(prompt, 8, temperature=0, lengths=lengths, prefill_chunk_size=chunk),
                                   one, rtol=0, atol=0)
    held = [(name, key) for name, m in model.named_modules() for key, v in vars(m).items()
            if key not in ("_parameters", "_buffers", "_modules") and isinstance(v, torch.Tensor)]
    assert held == []


def test_chunked_prefill_bad_arguments_are_one_line_errors() -> None:
    model = lm(PATTERNS["hybrid"])
    tokens = torch.randint(0, 23, (2, 10))
    for kwargs, match in (({"chunk_size": 0}, "chunk_size must be an int >= 1 or None"),
                          ({"chunk_size": 2.5}, "chunk_size must be an int >= 1 or None"),
                          ({"logits": "first"}, "logits must be 'all' or 'last'"),
                          ({"mask": torch.ones(2, 9, dtype=torch.bool)}, r"expected mask \(2, 10\) bool")):
        with pytest.raises(ValueError, match=match):
            model.prefill(tokens, **kwargs)
    with pytest.raises(ValueError, match="expected int64 tokens"):
        model.prefill(tokens.float())
    with pytest.raises(RuntimeError, match="call model.eval"):
        model.train().prefill(tokens)
