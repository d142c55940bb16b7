"""Primal-Attention inside Hugging Face models: primalize, masks, training loss, generate, cache, save/load.

Every model is tiny (2 layers, width 32, vocabulary 97) and built from a config with random weights.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")

from transformers import (  # noqa: E402
    BertConfig,
    BertForMaskedLM,
    DynamicCache,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    RobertaConfig,
    RobertaForMaskedLM,
    T5Config,
    T5ForConditionalGeneration,
    ViTConfig,
    ViTForImageClassification,
)

import primal_attention as pa  # noqa: E402
from primal_attention import hf  # noqa: E402

V = 97
RANK = {"rank": 4, "rank_multi": 2}
TOKENS = {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 1}


def gpt2(**kw):
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=V, n_positions=64, **TOKENS, **kw))


def llama(**kw):
    return LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                                        num_key_value_heads=2, intermediate_size=64, vocab_size=V,
                                        max_position_embeddings=64, **TOKENS, **kw))


def qwen2(**kw):
    return Qwen2ForCausalLM(Qwen2Config(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                                        num_key_value_heads=2, intermediate_size=64, vocab_size=V,
                                        max_position_embeddings=64, **TOKENS, **kw))


def bert(**kw):
    return BertForMaskedLM(BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                                      intermediate_size=64, vocab_size=V, max_position_embeddings=64,
                                      pad_token_id=1, **kw))


def roberta(**kw):
    return RobertaForMaskedLM(RobertaConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                                            intermediate_size=64, vocab_size=V, max_position_embeddings=64,
                                            pad_token_id=1, bos_token_id=0, eos_token_id=2, **kw))


def vit(**kw):
    return ViTForImageClassification(ViTConfig(image_size=8, patch_size=4, num_channels=3, hidden_size=32,
                                               num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                               num_labels=3, **kw))


BUILD = {"gpt2": gpt2, "llama": llama, "qwen2": qwen2, "bert": bert, "roberta": roberta, "vit": vit}
CAUSAL = ["gpt2", "llama", "qwen2"]
TEXT_ENCODERS = ["bert", "roberta"]


def build(name: str, *, seed: int = 0, double: bool = False, layers="all", **kw):
    torch.manual_seed(seed)
    model = hf.primalize(BUILD[name](**kw), layers=layers, **RANK)
    return (model.double() if double else model).eval()


def tokens(batch: int = 2, n: int = 9, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, V, (batch, n), generator=torch.Generator().manual_seed(seed))


def primal_wrappers(model) -> list[hf.PrimalSelfAttention]:
    return [m for m in model.modules() if isinstance(m, hf.PrimalSelfAttention)]


# --- primalize: structure, options, initialisation ----------------------------------------------


def test_import_primal_attention_does_not_import_transformers():
    code = "import sys, primal_attention; assert 'transformers' not in sys.modules, 'transformers imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("name", list(BUILD))
def test_primalize_replaces_chosen_layers_with_config_settings(name):
    torch.manual_seed(0)
    model = hf.primalize(BUILD[name](), layers=[-1], **RANK)
    wrappers = primal_wrappers(model)
    assert len(wrappers) == 1 and wrappers[0].layer_idx == 1
    primal = wrappers[0].primal
    assert (primal.embed_dim, primal.rank) == (32, 4)
    assert primal.num_heads == model.config.num_attention_heads
    assert primal.causal == (name in CAUSAL)
    assert (wrappers[0].rotary is not None) == (name in ("llama", "qwen2"))
    dropout = {"gpt2": "attn_pdrop", "llama": "attention_dropout", "qwen2": "attention_dropout"}.get(
        name, "attention_probs_dropout_prob")
    assert primal.dropout == getattr(model.config, dropout)
    assert primal.sampling == "valid"
    record = model.config.primal_attention
    assert len(record) == 1 and record[0]["layers"] == [1] and record[0]["options"] == RANK
    built = record[0]["resolved"]["1"]  # every option the layer was built with, today's defaults included
    assert built["rank"] == 4 and built["sampling"] == "valid" and built["dropout"] == primal.dropout
    assert built["impl"] == "fast" and built["positive_lambda"] is False
    # the other layer keeps HF's softmax attention
    family = hf.ARCHITECTURES[name]
    assert sum(family.is_self_attention(m) for m in model.modules()) == 1


def _original_projections(name: str, attn, x: torch.Tensor):
    """(q, k, out(x)) of an HF attention module, k expanded to every query head."""
    if name == "gpt2":
        q, k, _ = attn.c_attn(x).split(attn.embed_dim, dim=2)
        return q, k, attn.c_proj(x)
    if name in ("llama", "qwen2"):
        groups = attn.num_key_value_groups
        k = attn.k_proj(x).unflatten(-1, (-1, attn.head_dim)).repeat_interleave(groups, dim=-2).flatten(-2)
        return attn.q_proj(x), k, attn.o_proj(x)
    if name in TEXT_ENCODERS:
        return attn.query(x), attn.key(x), x
    return attn.q_proj(x), attn.k_proj(x), attn.o_proj(x)


@pytest.mark.parametrize("name", list(BUILD))
def test_from_softmax_copies_query_key_and_output_projections(name):
    torch.manual_seed(0)
    model = BUILD[name]()
    family = hf.ARCHITECTURES[name]
    original = [m for m in model.modules() if family.is_self_attention(m)][-1]
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        want = _original_projections(name, original, x)
        hf.primalize(model, layers="last", init="from_softmax", **RANK)
        primal = primal_wrappers(model)[0].primal
        got = (primal.q_proj(x), primal.k_proj(x), primal.out_proj(x))
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w)


def test_random_init_does_not_copy():
    torch.manual_seed(0)
    model = gpt2()
    q = model.transformer.h[1].attn.c_attn.weight[:, :32].T.clone()
    hf.primalize(model, layers=[1], init="random", **RANK)
    assert not torch.allclose(primal_wrappers(model)[0].primal.q_proj.weight, q)


def test_layers_all_and_negative_indices():
    torch.manual_seed(0)
    assert [w.layer_idx for w in primal_wrappers(hf.primalize(llama(), layers="all", **RANK))] == [0, 1]
    assert [w.layer_idx for w in primal_wrappers(hf.primalize(llama(), layers=[-2], **RANK))] == [0]


def test_rotary_transform_matches_hf_rope_layout():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    model = llama()
    pos = torch.arange(6)[None].expand(2, -1)
    x = torch.randn(2, 6, 32)
    cos, sin = model.model.rotary_emb(x, pos)
    q, k = torch.randn(2, 6, 32), torch.randn(2, 6, 32)
    heads = lambda t: t.view(2, 6, 4, 8).transpose(1, 2)  # noqa: E731
    want_q, want_k = apply_rotary_pos_emb(heads(q), heads(k), cos, sin)
    got = hf.attention.rotary_transform(apply_rotary_pos_emb, cos, sin, 4)(torch.cat([q, k], -1))
    merge = lambda t: t.transpose(1, 2).reshape(2, 6, 32)  # noqa: E731
    torch.testing.assert_close(got, torch.cat([merge(want_q), merge(want_k)], -1))


def test_rope_makes_primal_layer_position_dependent():
    model = build("llama", layers="all")
    ids = tokens(1, 6)
    with torch.no_grad():
        a = model(ids, position_ids=torch.arange(6)[None]).logits
        b = model(ids, position_ids=torch.arange(6)[None] + 5).logits
    assert not torch.allclose(a, b)


# --- training: forward / backward with the KSVD loss --------------------------------------------


def _task_loss(name: str, model) -> torch.Tensor:
    if name == "vit":
        pixels = torch.randn(2, 3, 8, 8)
        return model(pixel_values=pixels, labels=torch.tensor([0, 2])).loss
    ids = tokens(2, 9)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    return model(ids, attention_mask=mask, labels=ids).loss


@pytest.mark.parametrize("name", list(BUILD))
def test_forward_backward_with_ksvd_loss(name):
    torch.manual_seed(0)
    model = hf.primalize(BUILD[name](), layers="all", **RANK).train()
    with pa.ksvd_terms(model) as terms:
        loss = _task_loss(name, model) + 0.1 * terms.loss()
    assert torch.isfinite(loss)
    loss.backward()
    for wrapper in primal_wrappers(model):
        for p in (wrapper.primal.we, wrapper.primal.wr, wrapper.primal.lam, wrapper.primal.q_proj.weight):
            assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0
    with pytest.raises(RuntimeError, match="no primal forward"):
        terms.loss()  # consumed


def test_bfloat16_autocast_trains_and_generates():
    torch.manual_seed(0)
    model = hf.primalize(llama(), layers="all", **RANK).train()
    ids = tokens(2, 9)
    with torch.autocast("cpu", dtype=torch.bfloat16), pa.ksvd_terms(model) as terms:
        out = model(ids, labels=ids)
        loss = out.loss + 0.1 * terms.loss()
    loss.backward()
    assert out.logits.dtype == torch.bfloat16 and torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    model.eval()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(ids, use_cache=True)
    state = out.cache.layers[0].state
    assert state.total.dtype == torch.float32  # the running sums stay float32 under autocast


def test_activation_checkpointing_gives_the_same_gradients():
    grads = []
    for checkpointing in (False, True):
        model = build("gpt2", double=True, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0).train()
        if checkpointing:
            model.activation_checkpointing_enable()
        ids = tokens(2, 9)
        with pa.ksvd_terms(model) as terms:
            (model(ids, labels=ids).loss + 0.5 * terms.loss()).backward()
        grads.append({k: p.grad for k, p in model.named_parameters()})
    for k in grads[0]:
        torch.testing.assert_close(grads[1][k], grads[0][k], msg=k)


# --- masks: causality and padding ---------------------------------------------------------------


@pytest.mark.parametrize("name", CAUSAL)
@pytest.mark.parametrize("layers", ["all", "last"])
def test_no_future_leak(name, layers):
    model = build(name, double=True, layers=layers)
    ids = tokens(2, 10)
    changed = ids.clone()
    changed[:, 6:] = (changed[:, 6:] + 7) % (V - 3) + 3
    with torch.no_grad():
        a, b = model(ids).logits, model(changed).logits
    torch.testing.assert_close(a[:, :6], b[:, :6], rtol=0, atol=1e-12)
    assert not torch.allclose(a[:, 6:], b[:, 6:])


def _padded(name: str, side: str) -> tuple[torch.Tensor, torch.Tensor]:
    ids = tokens(3, 10)
    mask = torch.ones_like(ids)
    if side == "left":
        mask[0, :4] = 0
        mask[2, :1] = 0
    else:
        mask[0, 6:] = 0
        mask[2, 9:] = 0
    return ids, mask


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("name,side", [(n, s) for n in CAUSAL for s in ("left", "right")]
                         + [(n, "right") for n in TEXT_ENCODERS])
def test_padding_invariance(name, side, impl):
    """Changing the padded tokens changes nothing at the real positions."""
    model = build(name, double=True, attn_implementation=impl)
    ids, mask = _padded(name, side)
    changed = torch.where(mask.bool(), ids, (ids + 11) % (V - 3) + 3)
    with torch.no_grad():
        a = model(ids, attention_mask=mask).logits
        b = model(changed, attention_mask=mask).logits
    real = mask.bool()
    assert torch.isfinite(a).all()
    torch.testing.assert_close(a[real], b[real], rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
def test_right_padded_batch_equals_each_sample_alone(name):
    model = build(name, double=True)
    ids, mask = _padded(name, "right")
    with torch.no_grad():
        batched = model(ids, attention_mask=mask).logits
        for b in range(ids.shape[0]):
            n = int(mask[b].sum())
            alone = model(ids[b:b + 1, :n]).logits[0]
            torch.testing.assert_close(batched[b, :n], alone, rtol=0, atol=1e-10)


def test_vit_forward_matches_shapes_and_primal_layer_runs():
    model = build("vit")
    with torch.no_grad(), pa.ksvd_terms(model, inference=True) as terms:
        logits = model(pixel_values=torch.randn(2, 3, 8, 8)).logits
    assert logits.shape == (2, 3) and torch.isfinite(logits).all()
    assert len(terms) == len(primal_wrappers(model))  # every primal layer ran once


# --- decoding: generate, cache -------------------------------------------------------------------


def _full_forward_logits(model, sequences: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        return model(sequences, attention_mask=mask, position_ids=positions).logits


@pytest.mark.parametrize("name,layers", [("gpt2", [-1]), ("gpt2", "all"), ("llama", "all"), ("llama", [0]),
                                         ("qwen2", "all")])
@pytest.mark.parametrize("left_pad", [False, True])
def test_greedy_generate_equals_full_forward_at_every_step(name, layers, left_pad):
    model = build(name, double=True, layers=layers)
    prompt = tokens(2, 6)
    mask = torch.ones_like(prompt)
    if left_pad:
        prompt[0, :2] = TOKENS["pad_token_id"]
        mask[0, :2] = 0
    new = 6
    model.generation_config.eos_token_id = None  # always `new` steps, every one the plain argmax
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=mask, max_new_tokens=new, do_sample=False, use_cache=True,
                             return_dict_in_generate=True, output_logits=True)
    seq = out.sequences
    full_mask = torch.cat([mask, torch.ones(2, new, dtype=mask.dtype)], dim=1)
    full = _full_forward_logits(model, seq, full_mask)
    step_logits = torch.stack(out.logits, dim=1)  # (B, new, V); generate hands logits back in float32
    torch.testing.assert_close(step_logits, full[:, prompt.shape[1] - 1:-1].float(), rtol=0, atol=1e-6)
    assert torch.equal(seq[:, prompt.shape[1]:], full[:, prompt.shape[1] - 1:-1].argmax(-1))


def test_cached_multi_token_continuation_equals_full_forward():
    """A second forward with several tokens on top of a cache (the step loop) equals the full forward."""
    model = build("llama", double=True, layers="all")
    ids = tokens(2, 10)
    with torch.no_grad():
        full = model(ids).logits
        first = model(ids[:, :4], use_cache=True)
        second = model(ids[:, 4:], cache=first.cache, use_cache=True)
    torch.testing.assert_close(torch.cat([first.logits, second.logits], 1), full, rtol=0, atol=1e-10)


def test_beam_search_with_cache_equals_without():
    model = build("gpt2", double=True, layers="all")
    prompt = tokens(2, 5)
    model.generation_config.eos_token_id = None
    kw = {"max_new_tokens": 5, "num_beams": 3, "do_sample": False}
    with torch.no_grad():
        cached = model.generate(prompt, use_cache=True, **kw)
        uncached = model.generate(prompt, use_cache=False, **kw)
    assert torch.equal(cached, uncached)


def _cache_after(model, n: int) -> DynamicCache:
    with torch.no_grad():
        return model(tokens(2, n), use_cache=True).cache


def test_all_primal_cache_is_constant_in_context_length():
    model = build("llama", layers="all")
    short, long = _cache_after(model, 4), _cache_after(model, 40)
    assert all(isinstance(layer, hf.PrimalCacheLayer) for layer in long.layers)
    assert hf.cache_nbytes(short) == hf.cache_nbytes(long) == 2 * 2 * (2 * 32 + 1) * 4  # layers · B · (2D + 1) · fp32
    assert long.get_seq_length() == 40
    torch.manual_seed(0)
    softmax = llama().eval()
    assert hf.cache_nbytes(_cache_after(softmax, 40)) == 10 * hf.cache_nbytes(_cache_after(softmax, 4))


@pytest.mark.parametrize("name,layers", [("gpt2", "all"), ("gpt2", [-1]), ("llama", "all")])
def test_chunked_prefill_in_generate_equals_one_chunk(name, layers):
    model = build(name, double=True, layers=layers)
    model.generation_config.eos_token_id = None
    prompt = tokens(2, 23)
    with torch.no_grad():
        one = model.generate(prompt, max_new_tokens=5, do_sample=False, return_dict_in_generate=True, output_logits=True)
        chunked = model.generate(prompt, max_new_tokens=5, do_sample=False, prefill_chunk_size=4,
                                 return_dict_in_generate=True, output_logits=True)
    assert torch.equal(one.sequences, chunked.sequences)
    torch.testing.assert_close(torch.stack(chunked.logits), torch.stack(one.logits), rtol=0, atol=1e-9)


def test_after_generate_an_all_primal_model_holds_the_same_bytes_at_every_context():
    """Nothing that grows with the context stays on the modules or in the cache generate returns."""
    model = build("gpt2", layers="all")
    model.generation_config.eos_token_id = None

    def held(n: int) -> int:
        with torch.no_grad():
            out = model.generate(tokens(1, n), max_new_tokens=3, do_sample=False, prefill_chunk_size=8,
                                 return_dict_in_generate=True)
        on_modules = sum(v.numel() * v.element_size() for m in model.modules() for k, v in vars(m).items()
                         if k not in ("_parameters", "_buffers", "_modules") and isinstance(v, torch.Tensor))
        return on_modules + hf.cache_nbytes(out.past_key_values)

    assert held(6) == held(50) == 2 * 1 * (2 * 32 + 1) * 4  # layers · B · (2D + 1) · fp32: the running sums


def test_an_all_primal_models_masks_cover_only_the_new_tokens():
    """Every layer primal: HF's per-step mask is built over the new tokens (O(1)), not every position seen;
    with a softmax layer beside, over every position (the softmax layer needs it)."""
    for layers, sizes in (("all", (1, 10)), ([-1], (11, 0))):
        model = build("gpt2", layers=layers)
        with torch.no_grad():
            cache = model(tokens(2, 9), use_cache=True).cache
            model(tokens(2, 1), cache=cache, use_cache=True)
        slot = cache.layers[1]
        assert isinstance(slot, hf.PrimalCacheLayer) and slot.get_mask_sizes(1) == sizes  # (kv_length, kv_offset)


def test_the_decode_plan_is_opt_in_and_counted():
    plain, planned = build("gpt2", layers="all"), hf.primalize(gpt2(), layers="all", decode_plan=True, **RANK).eval()
    planned.load_state_dict(plain.state_dict())
    for model in (plain, planned):
        model.generation_config.eos_token_id = None
    with torch.no_grad():
        a = plain.generate(tokens(1, 6), max_new_tokens=4, do_sample=False, return_dict_in_generate=True)
        b = planned.generate(tokens(1, 6), max_new_tokens=4, do_sample=False, return_dict_in_generate=True)
    torch.testing.assert_close(b.sequences, a.sequences)
    sums = 2 * (2 * 32 + 1) * 4
    plan = 2 * 4 * 32 * 32 * 4 + 2 * (2 * 32 + 32) * 4  # per layer: [W_q; W_k]ᵀ and the fold (4·D²), biases
    assert hf.cache_nbytes(a.past_key_values) == sums
    assert hf.cache_nbytes(b.past_key_values) == sums + plan
    assert hf.primal_settings(planned)[0]["decode_plan"] is True


def test_hybrid_cache_keeps_kv_for_softmax_layers():
    cache = _cache_after(build("gpt2", layers=[-1]), 8)
    assert type(cache.layers[0]).__name__ == "DynamicLayer" and cache.layers[0].keys.shape[-2] == 8
    assert isinstance(cache.layers[1], hf.PrimalCacheLayer) and cache.layers[1].get_seq_length() == 8


def test_primal_cache_slot_refuses_key_value_updates_and_crop():
    cache = _cache_after(build("gpt2", layers=[-1]), 4)
    with pytest.raises(TypeError, match="running sums"):
        cache.update(torch.zeros(2, 2, 1, 16), torch.zeros(2, 2, 1, 16), 1)
    with pytest.raises(RuntimeError, match="cannot be cropped"):
        cache.layers[1].crop(-1)


# --- save / load ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name,cls,layers", [("gpt2", GPT2LMHeadModel, [-1]), ("llama", LlamaForCausalLM, "all"),
                                             ("bert", BertForMaskedLM, [0])])
def test_save_load_round_trip(tmp_path, name, cls, layers):
    model = build(name, double=True, layers=layers)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())["primal_attention"]
    assert [{k: r[k] for k in ("layers", "options")} for r in saved] == \
        [{"layers": [1] if layers == [-1] else [0] if layers == [0] else [0, 1], "options": RANK}]
    loaded = hf.from_pretrained(cls, tmp_path)
    assert not loaded.training and next(loaded.parameters()).dtype == torch.float64
    assert hf.primal_settings(loaded) == hf.primal_settings(model)
    ids = tokens(2, 7)
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_from_pretrained_refuses_a_plain_model(tmp_path):
    gpt2().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="holds no primal model"):
        hf.from_pretrained(GPT2LMHeadModel, tmp_path)


# --- bad input -----------------------------------------------------------------------------------


def test_unsupported_architecture_lists_supported_ones():
    t5 = T5ForConditionalGeneration(T5Config(vocab_size=V, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4))
    with pytest.raises(ValueError, match="unsupported architecture 't5'.*bert, gpt2, llama, qwen2, roberta, vit"):
        hf.primalize(t5)


@pytest.mark.parametrize("layers", [[2], [-3], [0, 0], "first", []])
def test_bad_layer_selection(layers):
    with pytest.raises(ValueError, match="out of range|twice|'last', 'all'|empty"):
        hf.primalize(gpt2(), layers=layers)


def test_out_of_range_message_names_the_valid_range():
    with pytest.raises(ValueError, match=r"layer index 5 is out of range for a model with 2 layers \(valid: -2..1\)"):
        hf.primalize(gpt2(), layers=[5])


def test_layer_already_primal_bad_init_and_fixed_options():
    model = hf.primalize(gpt2(), layers=[1], **RANK)
    with pytest.raises(ValueError, match="already primal"):
        hf.primalize(model, layers="all")
    with pytest.raises(ValueError, match="init must be one of"):
        hf.primalize(gpt2(), init="zeros")
    with pytest.raises(ValueError, match="come from the model's config"):
        hf.primalize(gpt2(), num_heads=4)
    with pytest.raises(TypeError, match="PreTrainedModel"):
        hf.primalize(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert", "vit"])
def test_output_attentions_raises(name):
    model = build(name, attn_implementation="eager")  # HF allows output_attentions with eager only
    inputs = {"pixel_values": torch.randn(1, 3, 8, 8)} if name == "vit" else {"input_ids": tokens(1, 5)}
    with pytest.raises(ValueError, match="no N×N attention matrix"):
        model(**inputs, output_attentions=True)
    model.config.output_attentions = True
    with pytest.raises(ValueError, match="no N×N attention matrix"):
        model(**inputs)
    model.config.output_attentions = False
    hidden = model(**inputs, output_hidden_states=True).hidden_states
    assert len(hidden) == 3  # embeddings + 2 layers: other outputs HF records still work


def test_unsupported_configurations():
    with pytest.raises(ValueError, match="is_decoder=True"):
        hf.primalize(bert(is_decoder=True))
    sliding = qwen2(use_sliding_window=True, sliding_window=4, max_window_layers=0)
    with pytest.raises(ValueError, match="sliding_attention"):
        hf.primalize(sliding, layers=[1])


def test_packed_sequence_mask_is_refused():
    model = build("gpt2")
    block = torch.zeros(1, 1, 6, 6, dtype=torch.bool)
    block[..., :3, :3] = True
    block[..., 3:, 3:] = True
    block &= torch.ones(6, 6, dtype=torch.bool).tril()
    with pytest.raises(ValueError, match="not a causal key-padding mask"):
        hf.padding_mask(block, 6, causal=True)
    with pytest.raises(ValueError, match="not a causal key-padding mask"):
        model(tokens(1, 6), attention_mask=block)


def test_meta_masks_are_not_read():
    """Meta tensors (shape tracing, scripts/hf_decode_memory.py) carry no mask values."""
    assert hf.padding_mask(torch.ones(1, 1, 4, 4, dtype=torch.bool, device="meta"), 4, causal=True) is None


@pytest.mark.parametrize("layers", [[-1], "all"])
def test_static_cache_is_refused_with_a_clear_error(layers):
    model = build("gpt2", layers=layers)
    with pytest.raises(TypeError, match="DynamicCache"):
        model.generate(tokens(1, 4), max_new_tokens=2, cache_implementation="static")


def test_from_pretrained_honours_dtype_and_device_and_refuses_bad_folders(tmp_path):
    model = build("gpt2", layers="all")
    model.save_pretrained(tmp_path / "m")
    for kw in ({"dtype": torch.bfloat16}, {"torch_dtype": "bfloat16"}):
        loaded = hf.from_pretrained(GPT2LMHeadModel, tmp_path / "m", **kw)
        assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}
    assert next(hf.from_pretrained(GPT2LMHeadModel, tmp_path / "m", device_map={"": "cpu"}).parameters()).device.type == "cpu"
    with pytest.raises(ValueError, match="per-module device_map"):
        hf.from_pretrained(GPT2LMHeadModel, tmp_path / "m", device_map={"transformer.h.0": "cpu"})
    with pytest.raises(ValueError, match="floating torch.dtype"):
        hf.from_pretrained(GPT2LMHeadModel, tmp_path / "m", dtype="int8")
    with pytest.raises(TypeError, match="not one of BertForMaskedLM"):
        hf.from_pretrained(BertForMaskedLM, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["primal_attention"] = [{"layers": "oops"}]
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps(config))
    (bad / "model.safetensors").write_bytes((tmp_path / "m" / "model.safetensors").read_bytes()[:100])
    with pytest.raises(ValueError, match="record 0 of 'primal_attention' is malformed"):
        hf.from_pretrained(GPT2LMHeadModel, bad)
    (bad / "config.json").write_text((tmp_path / "m" / "config.json").read_text())
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        hf.from_pretrained(GPT2LMHeadModel, bad)
    (bad / "model.safetensors").unlink()
    (bad / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "../m/model.safetensors"}}))
    with pytest.raises(ValueError, match="names a shard outside"):
        hf.from_pretrained(GPT2LMHeadModel, bad)


def test_option_typos_and_rope_with_the_reference_path_fail_at_primalize():
    with pytest.raises(ValueError, match="unknown option rnak; expected one of"):
        hf.primalize(gpt2(), rnak=4)
    with pytest.raises(ValueError, match="impl='reference' has no qk_transform"):
        hf.primalize(llama(), impl="reference", **RANK)


@pytest.mark.parametrize("name,layers", [("gpt2", "all"), ("gpt2", [-1]), ("llama", "all"), ("llama", [0])])
def test_a_padding_free_packed_batch_equals_its_documents_alone(name, layers):
    """TRL-style padding-free batches: one row, position ids restarting at each document, no attention mask."""
    model = build(name, double=True, layers=layers)
    g = torch.Generator().manual_seed(5)
    docs = [torch.randint(3, V, (n,), generator=g) for n in (4, 7, 3)]
    ids = torch.cat(docs)[None]
    positions = torch.cat([torch.arange(len(d)) for d in docs])[None]
    with torch.no_grad():
        got = model(input_ids=ids, position_ids=positions, use_cache=False).logits[0]
        want = torch.cat([model(input_ids=d[None], use_cache=False).logits[0] for d in docs])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-9)
    segments = hf.attention.packed_segments(positions, ids.shape[1])
    assert segments.tolist() == [[0] * 4 + [1] * 7 + [2] * 3]
    assert hf.attention.packed_segments(torch.arange(6)[None], 6) is None  # one document per row: not packed
