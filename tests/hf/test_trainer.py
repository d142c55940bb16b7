"""PrimalTrainer: HF's Trainer with η · KSVD added to the training loss, a few CPU steps."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments  # noqa: E402

import primal_attention as pa  # noqa: E402
from primal_attention import hf  # noqa: E402

V = 61


def tiny_gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=V, n_positions=32, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=1, pad_token_id=1)
    return hf.primalize(GPT2LMHeadModel(config), layers=[-1], rank=4)


def dataset(n: int = 8, length: int = 12) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    rows = torch.randint(2, V, (n, length), generator=g)
    return [{"input_ids": r, "labels": r.clone(), "attention_mask": torch.ones_like(r)} for r in rows]


def arguments(tmp_path, **kw) -> TrainingArguments:
    return TrainingArguments(output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=2, logging_steps=1,
                             learning_rate=1e-2, report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True,
                             dataloader_num_workers=0, **kw)


def test_compute_loss_is_task_loss_plus_eta_ksvd(tmp_path):
    model = tiny_gpt2().train()
    trainer = hf.PrimalTrainer(model=model, args=arguments(tmp_path), ksvd_eta=0.5)
    batch = {k: torch.stack([row[k] for row in dataset()[:2]]) for k in ("input_ids", "labels", "attention_mask")}
    got = trainer.compute_loss(model, dict(batch))
    task = model(**batch).loss
    want = task + 0.5 * pa.ksvd_loss(model)  # the term of this second forward only
    torch.testing.assert_close(got, want)
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(trainer.compute_loss(model, dict(batch)), model(**batch).loss)


@pytest.mark.parametrize("eta", [0.0, 0.1])
def test_trainer_steps_train_the_primal_layer_and_log_ksvd(tmp_path, eta):
    model = tiny_gpt2()
    primal = [m for m in model.modules() if isinstance(m, pa.PrimalAttention)][0]
    we = primal.we.detach().clone()
    trainer = hf.PrimalTrainer(model=model, args=arguments(tmp_path), train_dataset=dataset(), ksvd_eta=eta)
    trainer.train()
    assert not torch.equal(primal.we.detach(), we)
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logged) == 3
    assert all(("ksvd_loss" in h) == (eta > 0) for h in logged)
    if eta > 0:
        assert all(h["ksvd_loss"] >= 0 for h in logged)


def test_bad_trainer_options(tmp_path):
    with pytest.raises(ValueError, match="ksvd_eta must be >= 0"):
        hf.PrimalTrainer(model=tiny_gpt2(), args=arguments(tmp_path), ksvd_eta=-1.0)
    with pytest.raises(ValueError, match="ksvd_reduction"):
        hf.PrimalTrainer(model=tiny_gpt2(), args=arguments(tmp_path), ksvd_eta=0.1, ksvd_reduction="mean")
