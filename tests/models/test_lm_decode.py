"""CausalLM decoding: step-by-step and prefill + steps equal the full forward (float64, <= 1e-9)."""

from __future__ import annotations

import pytest
import torch

import primal_attention as pa
from primal_attention.layers.cache import DecodeCache, KVBuffer
from primal_attention.layers.primal import PrimalState
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
        cache = None
        for t in range(tokens.shape[1]):
            logits, cache = model.step(tokens[:, t], cache)
            torch.testing.assert_close(logits, full[:, t], rtol=0, atol=1e-9)
        # prefill over the first 17 tokens, then steps; then the forward with the cache, 4 tokens at a time
        logits, cache = model.prefill(tokens[:, :17])
        torch.testing.assert_close(logits, full[:, :17], rtol=0, atol=1e-9)
        branch = cache.copy()
        for t in range(17, 30):
            logits, same = model.step(tokens[:, t], cache)
            assert same is cache and cache.length == t + 1  # updated in place
            torch.testing.assert_close(logits, full[:, t], rtol=0, atol=1e-9)
        for start in range(17, 30, 4):
            chunk = model(tokens[:, start:start + 4], cache=branch)
            torch.testing.assert_close(chunk, full[:, start:start + 4], rtol=0, atol=1e-9)
    kinds = [type(layer.attn).__name__ for layer in cache.layers]
    assert kinds == ["KVBuffer" if a == "softmax" else "PrimalState" for a in PATTERNS[kind]]


def test_primal_state_does_not_grow_with_the_context() -> None:
    model = lm(PATTERNS["all-primal"])
    with torch.no_grad():
        _, short = model.prefill(torch.randint(0, 23, (1, 3)))
        _, long = model.prefill(torch.randint(0, 23, (1, 35)))
        model.step(torch.tensor([1]), short)
        model.step(torch.tensor([1]), long)
    assert [s.attn.total.shape for s in short.layers] == [s.attn.total.shape for s in long.layers]
    assert short.nbytes() == long.nbytes() > 0  # the sums and the decoding constants, counted


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
    with pytest.raises(TypeError, match="expected a DecodeCache"):
        model.step(torch.zeros(2, dtype=torch.int64), ("not", "a state"))
    with pytest.raises(TypeError, match="expected a DecodeCache"):
        model(torch.zeros(2, 1, dtype=torch.int64), cache=[])
    attn = pa.SoftmaxAttention(16, 2, causal=True)
    with pytest.raises(TypeError, match="expected state to be a KVCache"):
        attn.step(torch.randn(2, 16), (torch.zeros(1),))
    _, cache = attn.step(torch.randn(2, 16))
    assert isinstance(cache, KVCache)
    with pytest.raises(ValueError, match="a state of another layer or batch"):
        attn.step(torch.randn(3, 16), cache)
    with pytest.raises(TypeError, match="block 0's LinearAttention has no incremental decoding"):
        pa.TransformerStack(["linear"], 16, 2, 32, causal=True).eval()(torch.randn(2, 1, 16), cache=DecodeCache())


def test_decoding_needs_eval_mode_and_a_cache_of_this_layer() -> None:
    model = lm(PATTERNS["hybrid"]).train()
    with pytest.raises(RuntimeError, match=r"CausalLM.step: decoding runs without dropout; call model.eval\(\)"):
        model.step(torch.zeros(2, dtype=torch.int64))
    with pytest.raises(RuntimeError, match="CausalLM.prefill: decoding runs without dropout"):
        model.prefill(torch.zeros(2, 3, dtype=torch.int64))
    with pytest.raises(RuntimeError, match="TransformerBlock: decoding runs without dropout"):
        model.decoder(torch.zeros(2, 1, 16, dtype=torch.float64), cache=DecodeCache())
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


def test_step_validates_its_cache_and_ids_as_forward_does() -> None:
    model = lm(PATTERNS["hybrid"])
    tokens = torch.randint(0, 23, (2, 4), generator=torch.Generator().manual_seed(4))

    def error(tokens_t, cache, kind=ValueError) -> str:
        with pytest.raises(kind) as caught:
            model.step(tokens_t, cache)
        return str(caught.value)

    with torch.no_grad():
        _, cache = model.prefill(tokens)
        assert "CausalLM.step: token ids must be in [0, 23), got [0, 23]" in error(torch.tensor([0, 23]), cache)
        assert "got [-1, 3]" in error(torch.tensor([-1, 3]), cache)
        _, full = model.prefill(torch.randint(0, 23, (2, 40)))
        assert "expected 1..0 tokens after 40 positions (max_seq_len 40)" in error(tokens[:, 0], full)
        _, other = lm(PATTERNS["hybrid"]).prefill(tokens)
        assert "started by another model" in error(tokens[:, 0], other)
        assert "a state of another layer or batch" in error(torch.tensor([1, 2, 3]), cache)  # batch 3, cache of 2
        logits, cache = model.step(tokens[:, 0], cache)  # the cache it made is accepted
        assert cache.length == 5 and logits.shape == (2, 23)


def test_an_all_primal_cache_validates_every_layer_state() -> None:
    model = lm(PATTERNS["all-primal"])
    tokens = torch.randint(0, 23, (2, 4), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        _, cache = model.prefill(tokens)
        for layer, message, kind in ((0, "a state of another layer or batch", ValueError),
                                     (2, "expected state to be a PrimalState", TypeError)):
            bad = cache.copy()
            s = bad.layers[layer].attn
            bad.layers[layer].attn = PrimalState(s.total[:1], s.count[:1]) if kind is ValueError else KVCache(s.total, s.count)
            with pytest.raises(kind, match=message):
                model.step(tokens[:, 0], bad)
        model.step(tokens[:, 0], cache)  # the untouched one still works


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
def test_the_token_path_equals_the_modules_forward_with_the_cache(kind, blocks) -> None:
    """One token without gradients (each block's fused decode_token) equals the same token through the
    modules' forward with the cache (with gradients: extend), and both equal the full forward."""
    model = lm(PATTERNS[kind], **blocks)
    tokens = torch.randint(0, 23, (3, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = model(tokens)
        _, fast = model.prefill(tokens[:, :5])
    slow = fast.copy()
    for t in range(5, 12):
        with torch.no_grad():
            a, _ = model.step(tokens[:, t], fast)
        with torch.enable_grad():
            b = model(tokens[:, t:t + 1], cache=slow)[:, 0]
        assert b.requires_grad
        torch.testing.assert_close(a, b.detach(), rtol=0, atol=1e-12)
        torch.testing.assert_close(a, full[:, t], rtol=0, atol=1e-9)
    for x, y in zip(fast.layers, slow.layers):
        if isinstance(x.attn, KVBuffer):
            torch.testing.assert_close(x.attn.keys, y.attn.keys.detach(), rtol=0, atol=1e-12)
        else:
            torch.testing.assert_close(x.attn.total, y.attn.total.detach(), rtol=0, atol=1e-12)
    assert all(layer.attn_plan is not None for layer in fast.layers)  # built at the first token without grad


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


def test_a_new_cache_sees_new_weights() -> None:
    """The decoding constants live in the cache: a cache started after the parameters changed decodes
    with the new ones."""
    model = lm(PATTERNS["hybrid"])
    tokens = torch.randint(0, 23, (2, 6), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        cache = None
        for t in range(3):
            _, cache = model.step(tokens[:, t], cache)
        assert all(layer.attn_plan is not None and layer.ffn_plan is not None for layer in cache.layers)
        for p in model.parameters():
            p.mul_(1.05)
        _, fresh = model.prefill(tokens[:, :3])
        assert all(layer.attn_plan is None for layer in fresh.layers)  # a prefill builds no constants
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


def test_the_feed_forward_loads_checkpoints_of_the_sequential_layout() -> None:
    model = lm(PATTERNS["hybrid"])
    state = {k.replace("ffn.fc1.", "ffn.0.").replace("ffn.fc2.", "ffn.3."): v for k, v in model.state_dict().items()}
    assert "decoder.blocks.0.ffn.0.weight" in state
    other = lm(PATTERNS["hybrid"])
    torch.nn.init.zeros_(other.decoder.blocks[0].ffn.fc1.weight)
    other.load_state_dict(state)
    assert torch.equal(other.decoder.blocks[0].ffn.fc1.weight, model.decoder.blocks[0].ffn.fc1.weight)


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
    assert state.length == last_state.length == 30
    for a, b in zip(state.layers, one_state.layers):
        if isinstance(a.attn, KVBuffer):
            for x, y in ((a.attn.keys, b.attn.keys), (a.attn.values, b.attn.values), (a.attn.past_mask(), b.attn.past_mask())):
                torch.testing.assert_close(x, y, rtol=0, atol=1e-9)
        else:
            for x, y in zip(a.attn, b.attn):
                torch.testing.assert_close(x, y, rtol=0, atol=1e-9)
    # decoding continues identically after a chunked prefill, row 1 after its last real token (20)
    assert state.next_position.tolist() == [30, 21, 30]
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
                          ({"mask": torch.ones(2, 9, dtype=torch.bool)}, r"expected mask \(2, 10\) bool"),
                          ({"capacity": 9}, "capacity must be an int >= the prompt length 10")):
        with pytest.raises(ValueError, match=match):
            model.prefill(tokens, **kwargs)
    with pytest.raises(ValueError, match="expected int64 tokens"):
        model.prefill(tokens.float())
    with pytest.raises(RuntimeError, match="call model.eval"):
        model.train().prefill(tokens)
