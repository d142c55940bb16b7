"""Primal checkpoints through HF's own loading path: Auto classes, pipeline, the plain class refusing."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from transformers import (  # noqa: E402
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForImageClassification,
    AutoModelForMaskedLM,
    BertForMaskedLM,
    GPT2LMHeadModel,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    pipeline,
)

from primal_attention import hf  # noqa: E402
from test_hf import V, build, primal_wrappers, tokens  # noqa: E402

AUTO = {"gpt2": AutoModelForCausalLM, "llama": AutoModelForCausalLM, "qwen2": AutoModelForCausalLM,
        "bert": AutoModelForMaskedLM, "roberta": AutoModelForMaskedLM, "vit": AutoModelForImageClassification}


def _inputs(name: str) -> torch.Tensor:
    if name == "vit":
        return torch.randn(2, 3, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    return tokens(2, 7)


def _same(a: torch.Tensor, b: torch.Tensor) -> None:
    """Equal up to float64 rounding: HF loads safetensors zero-copy, so a loaded weight can sit at an address BLAS
    treats differently from the saved model's (another kernel, the last bit of a sum changed); the same weights
    copied to fresh memory give bit-equal outputs."""
    torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def _logits(model, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(x).logits


@pytest.mark.parametrize("name,layers", [("gpt2", "all"), ("gpt2", [-1]), ("llama", "all"), ("qwen2", [0]),
                                         ("bert", [0]), ("roberta", "all"), ("vit", "all")])
def test_auto_classes_load_the_primal_model_with_its_logits(tmp_path, name, layers):
    model = build(name, double=True, layers=layers)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == f"primal_{name}" and saved["attn_implementation"] == "primal_attention"
    loaded = AUTO[name].from_pretrained(tmp_path)
    assert type(loaded).__name__.startswith("Primal") and not loaded.training
    assert len(primal_wrappers(loaded)) == len(primal_wrappers(model))
    assert hf.primal_settings(loaded) == hf.primal_settings(model)
    x = _inputs(name)
    _same(_logits(loaded, x), _logits(model, x))
    assert type(AutoConfig.from_pretrained(tmp_path)).__name__ == f"Primal{type(model.config).__bases__[0].__name__}"


def test_the_base_auto_model_and_dtype_of_a_primal_checkpoint(tmp_path):
    model = build("gpt2", double=True)
    model.save_pretrained(tmp_path)
    base = AutoModel.from_pretrained(tmp_path)
    with torch.no_grad():
        hidden = base(tokens(2, 7)).last_hidden_state
        _same(hidden, model.transformer(tokens(2, 7)).last_hidden_state)
    half = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    assert {p.dtype for w in primal_wrappers(half) for p in w.parameters()} == {torch.bfloat16}


@pytest.mark.parametrize("name,cls", [("gpt2", GPT2LMHeadModel), ("llama", LlamaForCausalLM),
                                      ("bert", BertForMaskedLM)])
def test_the_plain_architecture_class_refuses_a_primal_checkpoint(tmp_path, name, cls):
    build(name, layers=[0]).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match='attn_implementation="primal_attention"'):
        cls.from_pretrained(tmp_path)
    assert torch.equal(_logits(hf.from_pretrained(cls, tmp_path), tokens(2, 5)),
                       _logits(AUTO[name].from_pretrained(tmp_path), tokens(2, 5)))


def test_primalizing_a_loaded_model_updates_its_record(tmp_path):
    build("gpt2", layers=[-1]).save_pretrained(tmp_path / "last")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "last")
    hf.primalize(loaded, layers=[0], rank=3)
    assert [r["layers"] for r in hf.primal_settings(loaded)] == [[1], [0]]
    loaded.save_pretrained(tmp_path / "both")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "both")
    assert torch.equal(_logits(again, tokens(1, 6)), _logits(loaded, tokens(1, 6)))
    # A softmax model built from a primal checkpoint's config: its stale record does not survive primalize.
    softmax = GPT2LMHeadModel(AutoConfig.from_pretrained(tmp_path / "both"))
    assert not primal_wrappers(softmax)
    hf.primalize(softmax, layers="all", rank=4)
    assert [r["layers"] for r in hf.primal_settings(softmax)] == [[0, 1]]
    softmax.save_pretrained(tmp_path / "fresh")
    AutoModelForCausalLM.from_pretrained(tmp_path / "fresh")


def test_a_text_generation_pipeline_runs_the_primal_model(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(V)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="w2"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="w0", eos_token="w1", pad_token="w1",
                                        unk_token="w2")
    model = build("gpt2", double=True)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    generator = pipeline("text-generation", model=str(tmp_path))
    assert type(generator.model).__name__ == "PrimalGPT2LMHeadModel"
    prompt = "w5 w9 w12"
    out = generator(prompt, max_new_tokens=4, do_sample=False, return_tensors=True)[0]["generated_token_ids"]
    with torch.no_grad():
        expected = model.generate(torch.tensor([tokenizer(prompt)["input_ids"]]), max_new_tokens=4, do_sample=False)[0]
    assert list(out) == expected.tolist()


def test_a_loaded_primal_model_pickles(tmp_path):
    import pickle

    build("gpt2", double=True).save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    again = pickle.loads(pickle.dumps(loaded))
    assert type(again) is type(loaded) and type(again.config) is type(loaded.config)
    _same(_logits(again, tokens(1, 5)), _logits(loaded, tokens(1, 5)))
