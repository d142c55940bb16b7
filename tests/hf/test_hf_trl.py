"""TRL's SFTTrainer trains a primalized model with its KSVD term through hf.KSVDLossFunc (Λ changes)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402

from primal_attention import hf  # noqa: E402
from test_hf import V, build, primal_wrappers  # noqa: E402


def test_sft_trainer_with_the_ksvd_loss_func_trains_lambda(tmp_path) -> None:
    core = Tokenizer(models.WordLevel({f"w{i}": i for i in range(V)}, unk_token="w2"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="w0", eos_token="w1", pad_token="w1",
                                        unk_token="w2")
    model = build("gpt2").train()
    before = [w.primal.lam.detach().clone() for w in primal_wrappers(model)]
    rows = torch.randint(3, V, (16, 12), generator=torch.Generator().manual_seed(1))
    args = trl.SFTConfig(output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=4, report_to=[],
                         use_cpu=True, save_strategy="no", disable_tqdm=True, logging_steps=1, max_length=16)
    loss_func = hf.KSVDLossFunc(model, eta=0.5, args=args)
    trainer = trl.SFTTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_dict({"input_ids": rows.tolist()}),
                             processing_class=tokenizer, compute_loss_func=loss_func)
    trainer.train()
    assert loss_func.pop_logged() > 0
    after = [w.primal.lam.detach() for w in primal_wrappers(model)]
    assert all(not torch.equal(a, b) for a, b in zip(before, after))  # Λ enters only the KSVD term
    loss_func.close()


def test_sft_trainer_padding_free_batches_reach_the_primal_layers_as_packed_documents(tmp_path, monkeypatch) -> None:
    import primal_attention.hf.attention as attention

    seen: list[bool] = []
    read = attention.packed_segments

    def spy(position_ids, n):
        segments = read(position_ids, n)
        seen.append(segments is not None)
        return segments

    monkeypatch.setattr(attention, "packed_segments", spy)
    core = Tokenizer(models.WordLevel({f"w{i}": i for i in range(V)}, unk_token="w2"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="w0", eos_token="w1", pad_token="w1",
                                        unk_token="w2")
    model = build("gpt2").train()
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(4, 12, (16,), generator=g).tolist()
    rows = {"input_ids": [torch.randint(3, V, (n,), generator=g).tolist() for n in lengths]}
    args = trl.SFTConfig(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4, report_to=[],
                         use_cpu=True, save_strategy="no", disable_tqdm=True, padding_free=True, max_length=None)
    trl.SFTTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_dict(rows), processing_class=tokenizer,
                   compute_loss_func=hf.KSVDLossFunc(model, eta=0.5, args=args)).train()
    assert seen and all(seen)  # every training forward: one row of several documents, read as packed
