"""PrimalTrainer: HF's Trainer with η · KSVD added to the training loss, a few CPU steps."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
    settings = {"max_steps": 3, "per_device_train_batch_size": 2, "learning_rate": 1e-2, **kw}
    return TrainingArguments(output_dir=str(tmp_path), logging_steps=1, report_to=[], use_cpu=True, save_strategy="no",
                             disable_tqdm=True, dataloader_num_workers=0, **settings)


def test_compute_loss_is_task_loss_plus_eta_ksvd(tmp_path):
    model = tiny_gpt2().train()
    trainer = hf.PrimalTrainer(model=model, args=arguments(tmp_path), ksvd_eta=0.5)
    batch = {k: torch.stack([row[k] for row in dataset()[:2]]) for k in ("input_ids", "labels", "attention_mask")}
    got = trainer.compute_loss(model, dict(batch))
    with pa.ksvd_terms(model) as terms:
        task = model(**batch).loss
    want = task + 0.5 * terms.loss()  # the term of this second forward only
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
        assert all(h["ksvd_loss"] > 0 for h in logged)  # J² of a model that is not at a KSVD solution


def test_bad_trainer_options(tmp_path):
    with pytest.raises(ValueError, match="ksvd_eta must be >= 0"):
        hf.PrimalTrainer(model=tiny_gpt2(), args=arguments(tmp_path), ksvd_eta=-1.0)
    with pytest.raises(ValueError, match="ksvd_reduction"):
        hf.PrimalTrainer(model=tiny_gpt2(), args=arguments(tmp_path), ksvd_eta=0.1, ksvd_reduction="mean")


def test_ddp_find_unused_parameters_true_is_refused(tmp_path):
    with pytest.raises(ValueError, match="ddp_find_unused_parameters=True"):
        hf.PrimalTrainer(model=tiny_gpt2(), args=arguments(tmp_path, ddp_find_unused_parameters=True), ksvd_eta=0.1)


@pytest.mark.slow
def test_ddp_two_gloo_processes_equal_one(tmp_path):
    """torchrun --nproc_per_node 2 (gloo, 2 rows each) takes the same step as one process on the 4 rows."""
    script = Path(__file__).with_name("ddp_train.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    single = subprocess.run([sys.executable, str(script), str(one), "4"], capture_output=True, text=True, env=env,
                            timeout=300)
    assert single.returncode == 0, single.stderr[-3000:]
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          str(script), str(two), "2"], capture_output=True, text=True, env=env, timeout=300)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert (one / "world_size").read_text() == "1" and (two / "world_size").read_text() == "2"
    a, b = torch.load(one / "weights.pt"), torch.load(two / "weights.pt")
    for k in a["final"]:
        torch.testing.assert_close(a["final"][k], b["final"][k], rtol=1e-5, atol=1e-6, msg=k)
    lam = [k for k in a["final"] if k.endswith("primal.lam")]
    assert lam and all(not torch.equal(a["initial"][k], a["final"][k]) for k in lam)  # Λ learns from the KSVD term


def _one_step(tmp_path, per_device: int, accumulation: int) -> dict[str, torch.Tensor]:
    model = tiny_gpt2()
    args = arguments(tmp_path, max_steps=1, per_device_train_batch_size=per_device,
                     gradient_accumulation_steps=accumulation, optim="sgd", learning_rate=0.05)
    trainer = hf.PrimalTrainer(model=model, args=args, train_dataset=dataset(2), ksvd_eta=0.5,
                               ksvd_reduction="sample")
    trainer.train()
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def test_gradient_accumulation_scales_the_ksvd_term_like_the_task_loss(tmp_path):
    """Two micro-batches of one row accumulate to the step of one batch of both rows, Λ included."""
    whole = _one_step(tmp_path / "whole", per_device=2, accumulation=1)
    accumulated = _one_step(tmp_path / "accumulated", per_device=1, accumulation=2)
    lam = [k for k in whole if k.endswith("primal.lam")]
    assert lam
    for k in whole:
        torch.testing.assert_close(accumulated[k], whole[k], rtol=1e-5, atol=1e-6, msg=k)


def test_the_plain_trainer_with_the_loss_func_trains_lambda_and_matches_primal_trainer(tmp_path) -> None:
    from transformers import Trainer

    model = tiny_gpt2().train()
    primal = next(m.primal for m in model.modules() if isinstance(m, hf.PrimalSelfAttention))
    lam = primal.lam.detach().clone()
    loss_func = hf.KSVDLossFunc(model, eta=0.5)
    batch = {k: torch.stack([row[k] for row in dataset()[:2]]) for k in ("input_ids", "labels", "attention_mask")}
    plain = Trainer(model=model, args=arguments(tmp_path / "plain"), compute_loss_func=loss_func)
    got = plain.compute_loss(model, dict(batch))
    want = hf.PrimalTrainer(model=model, args=arguments(tmp_path / "sub"), ksvd_eta=0.5).compute_loss(model, dict(batch))
    torch.testing.assert_close(got, want)
    assert loss_func.pop_logged() > 0
    trainer = Trainer(model=model, args=arguments(tmp_path / "run"), train_dataset=dataset(), compute_loss_func=loss_func)
    trainer.train()
    assert not torch.equal(primal.lam.detach(), lam)  # Λ enters only the KSVD term: it trained
    loss_func.close()


def test_a_plain_trainer_without_the_term_warns_once(tmp_path) -> None:
    from transformers import Trainer

    model = tiny_gpt2().train()
    with pytest.warns(UserWarning, match="training without their KSVD term") as caught:
        Trainer(model=model, args=arguments(tmp_path), train_dataset=dataset()).train()
    assert sum("KSVD term" in str(w.message) for w in caught) == 1
    with pytest.raises(ValueError, match="no language-model loss_function"):
        hf.KSVDLossFunc(torch.nn.Linear(2, 2), eta=0.1)
