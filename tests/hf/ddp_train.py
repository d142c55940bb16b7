"""One PrimalTrainer step on a tiny primalized GPT-2, for tests/hf/test_hf_trainer.py::test_ddp_*.

python ddp_train.py OUT PER_DEVICE_BATCH   (or under torchrun --nproc_per_node 2): trains one step on
the same 4 rows (the global batch) and, on rank 0, saves every parameter before and after the step
to OUT/weights.pt ({"initial": ..., "final": ...}) and the world size to OUT/world_size.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

from primal_attention import hf

V = 61


def main(out: Path, per_device: int) -> None:
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=V, n_positions=32, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=1, pad_token_id=1)
    model = hf.primalize(GPT2LMHeadModel(config), layers="all", rank=4)
    rows = torch.randint(2, V, (4, 12), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": r, "labels": r.clone()} for r in rows]
    args = TrainingArguments(output_dir=str(out), max_steps=1, per_device_train_batch_size=per_device,
                             learning_rate=0.05, optim="sgd", report_to=[], use_cpu=True, save_strategy="no",
                             disable_tqdm=True, dataloader_num_workers=0)
    initial = {k: v.detach().clone() for k, v in model.named_parameters()}
    trainer = hf.PrimalTrainer(model=model, args=args, train_dataset=data, ksvd_eta=0.5, ksvd_reduction="sample")
    trainer.train()
    if trainer.is_world_process_zero():
        final = {k: v.detach().clone() for k, v in model.named_parameters()}
        torch.save({"initial": initial, "final": final}, out / "weights.pt")
        (out / "world_size").write_text(str(trainer.args.world_size))
    if dist.is_available() and dist.is_initialized():
        # The Trainer starts the gloo group and leaves it open; a rank that exits with it open can abort
        # ("terminate called without an active exception") while the other still writes its files.
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
