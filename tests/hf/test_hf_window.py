"""primalize(window=w): the local-window + primal layer inside Hugging Face models."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from transformers import DynamicCache  # noqa: E402

import primal_attention as pa  # noqa: E402
from primal_attention import hf  # noqa: E402
from primal_attention.layers.window import WindowState  # noqa: E402
from test_hf import BUILD, TOKENS, V, tokens  # noqa: E402

RANK = {"rank": 4, "rank_multi": 2}


def windowed(name: str, *, window: int, gate: float = 0.0, layers="all", seed: int = 0):
    torch.manual_seed(seed)
    original = BUILD[name]().double().eval()
    model = BUILD[name]().double().eval()
    model.load_state_dict(original.state_dict())
    hf.primalize(model, layers=layers, window=window, gate_init=gate, **RANK)
    return original, model.eval()


def _logits(model, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask)
    return out.logits


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
def test_with_the_gate_open_and_a_window_over_the_whole_input_the_model_is_the_original(name) -> None:
    original, model = windowed(name, window=64, gate=60.0)
    assert all(isinstance(m.primal, pa.WindowPrimalAttention) for m in model.modules()
               if isinstance(m, hf.PrimalSelfAttention))
    ids = tokens(2, 9)
    mask = torch.ones_like(ids)
    mask[1, -3:] = 0
    got, want = _logits(model, ids, mask), _logits(original, ids, mask)
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], rtol=0, atol=1e-9)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_generate_with_a_window_cache_equals_the_full_forward_and_its_state_is_constant(name) -> None:
    _, model = windowed(name, window=3)
    prompt = tokens(2, 5)
    mask = torch.ones_like(prompt)
    prompt[0, :2] = TOKENS["pad_token_id"]
    mask[0, :2] = 0
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=mask, max_new_tokens=7, do_sample=False, use_cache=True,
                             return_dict_in_generate=True, output_logits=True)
    seq = out.sequences
    full_mask = torch.cat([mask, torch.ones(2, 7, dtype=mask.dtype)], dim=1)
    positions = (full_mask.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        full = model(seq, attention_mask=full_mask, position_ids=positions).logits
    torch.testing.assert_close(torch.stack(out.logits, 1), full[:, 4:-1].float(), rtol=0, atol=1e-6)

    sizes = []
    for n in (4, 40):
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            model(input_ids=tokens(1, n), cache=cache, use_cache=True)
        assert all(isinstance(layer.state, WindowState) for layer in cache.layers)
        sizes.append(hf.cache_nbytes(cache))
    assert sizes[0] == sizes[1]


def test_the_fused_decode_plan_gives_the_same_tokens_and_is_counted() -> None:
    torch.manual_seed(0)
    model = BUILD["gpt2"]().double().eval()
    hf.primalize(model, layers="all", window=3, decode_plan=True, **RANK)
    prompt = tokens(2, 5)
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=6, do_sample=False, use_cache=True, return_dict_in_generate=True,
                             output_logits=True)
        full = model(out.sequences).logits
    torch.testing.assert_close(torch.stack(out.logits, 1), full[:, 4:-1].float(), rtol=0, atol=1e-6)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=prompt, cache=cache, use_cache=True)
        before = hf.cache_nbytes(cache)
        model(input_ids=prompt[:, :1], cache=cache, use_cache=True)  # one token: the plans are built and kept
    assert all(layer.plan is not None for layer in cache.layers)
    assert hf.cache_nbytes(cache) > before


def test_a_padding_free_packed_batch_equals_its_documents_alone() -> None:
    _, model = windowed("llama", window=2)
    docs = [tokens(1, n, seed=n)[0] for n in (4, 6, 3)]
    ids = torch.cat(docs)[None]
    positions = torch.cat([torch.arange(len(d)) for d in docs])[None]
    with torch.no_grad():
        got = model(input_ids=ids, position_ids=positions, use_cache=False).logits[0]
        want = torch.cat([model(input_ids=d[None], use_cache=False).logits[0] for d in docs])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-9)


def test_flash_attention_cu_seqlens_mark_the_documents_of_a_packed_row(monkeypatch) -> None:
    from primal_attention.ops.segments import segments_from_cu_seqlens

    assert segments_from_cu_seqlens(torch.tensor([0, 2, 5, 6]), 6).tolist() == [[0, 0, 1, 1, 1, 2]]
    with pytest.raises(ValueError, match="must rise from 0"):
        segments_from_cu_seqlens(torch.tensor([0, 4, 3]), 3)
    _, model = windowed("llama", window=2)
    docs = [tokens(1, n, seed=n)[0] for n in (4, 6, 3)]
    ids = torch.cat(docs)[None]
    positions = torch.cat([torch.arange(len(d)) for d in docs])[None]
    cu = torch.tensor([0, 4, 10, 13], dtype=torch.int32)
    monkeypatch.setattr(hf.attention, "packed_segments", lambda *args: None)  # the documents from cu_seqlens only
    with torch.no_grad():  # position ids give RoPE its restarts; cu_seq_lens_q alone marks the documents
        got = model(input_ids=ids, position_ids=positions, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=6,
                    max_length_k=6, use_cache=False).logits[0]
        want = torch.cat([model(input_ids=d[None], use_cache=False).logits[0] for d in docs])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-9)


def test_save_and_load_keep_the_window_layers(tmp_path) -> None:
    from transformers import GPT2LMHeadModel

    _, model = windowed("gpt2", window=5, gate=1.5, layers=[1])
    model.save_pretrained(tmp_path)
    loaded = hf.from_pretrained(GPT2LMHeadModel, tmp_path)
    layer = [m.primal for m in loaded.modules() if isinstance(m, hf.PrimalSelfAttention)]
    assert len(layer) == 1 and isinstance(layer[0], pa.WindowPrimalAttention) and layer[0].window == 5
    ids = tokens(2, 8)
    torch.testing.assert_close(_logits(loaded, ids), _logits(model, ids), rtol=0, atol=1e-9)


def test_window_options_are_checked_at_primalize() -> None:
    with pytest.raises(ValueError, match="gate_init belongs to window layers"):
        hf.primalize(BUILD["gpt2"](), gate_init=1.0)
    with pytest.raises(ValueError, match="window must be a positive int"):
        hf.primalize(BUILD["gpt2"](), window=0)
    assert V > 0


def test_beam_search_reorders_the_window_ring_with_the_sums() -> None:
    _, model = windowed("llama", window=3)
    prompt = tokens(2, 5)
    model.generation_config.eos_token_id = None
    kw = {"max_new_tokens": 6, "num_beams": 3, "do_sample": False}
    with torch.no_grad():
        cached = model.generate(prompt, use_cache=True, **kw)
        uncached = model.generate(prompt, use_cache=False, **kw)
    assert torch.equal(cached, uncached)
