"""PEFT LoRA on a primalized model: the primal layers train (modules_to_save), the adapter reloads exactly."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from transformers import AutoModelForCausalLM  # noqa: E402

import primal_attention as pa  # noqa: E402
from primal_attention import hf  # noqa: E402
from test_hf import build, tokens  # noqa: E402


def _lora(model):
    config = peft.LoraConfig(r=4, target_modules=["c_fc", "mlp.c_proj"], modules_to_save=hf.PEFT_MODULES_TO_SAVE)
    return peft.get_peft_model(model, config)


def test_lora_with_the_primal_modules_to_save_trains_lambda_and_reloads(tmp_path) -> None:
    build("gpt2", layers="all").save_pretrained(tmp_path / "base")
    model = _lora(AutoModelForCausalLM.from_pretrained(tmp_path / "base")).train()
    trainable = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    assert any(n.endswith(".lam") for n in trainable) and any("lora_A" in n for n in trainable)
    assert not any(n.endswith("c_attn.weight") for n in trainable)  # everything else stays frozen
    opt = torch.optim.AdamW(list(model.parameters()), lr=1e-2)
    ids = tokens(2, 9)
    with pa.ksvd_terms(model) as terms:
        out = model(input_ids=ids, labels=ids)
        assert len(terms) == 2  # both primal layers' terms reach the collector through PEFT's copies
        (out.loss + 0.1 * terms.loss()).backward()
    opt.step()
    moved = {n for n, p in model.named_parameters() if n in trainable and not torch.equal(p, trainable[n])}
    assert {n for n in trainable if n.endswith(".lam")} <= moved
    model.eval()
    with torch.no_grad():
        trained = model(input_ids=ids).logits
    model.save_pretrained(tmp_path / "adapter")
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    reloaded = peft.PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=ids).logits, trained)
        merged = reloaded.merge_and_unload()
        torch.testing.assert_close(merged(input_ids=ids).logits, trained, rtol=1e-5, atol=1e-5)
        generated = merged.generate(ids[:1, :4], max_new_tokens=3, do_sample=False)
    assert generated.shape == (1, 7)


def test_the_ksvd_loss_func_of_a_peft_model_collects_its_primal_copies(tmp_path) -> None:
    model = _lora(build("gpt2", layers=[-1])).train()
    loss_func = hf.KSVDLossFunc(model, eta=0.5)
    ids = tokens(2, 9)
    out = model(input_ids=ids)
    with_term = loss_func(out, ids)
    assert loss_func.pop_logged() > 0
    plain = model.loss_function(out.logits, ids, vocab_size=model.config.vocab_size)
    assert with_term > plain
    loss_func.close()
