"""ksvd_loss consumes every primal forward run with gradients since its previous call."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from torch.utils.checkpoint import checkpoint

import primal_attention as pa


def dual_model() -> pa.SequenceClassifier:
    torch.manual_seed(0)
    cfg = pa.ClassifierConfig(num_classes=2, max_seq_len=24, vocab_size=11, dim=16, num_heads=2, ffn_dim=32,
                              attention=["softmax", "primal"], attention_options={"primal": {"rank": 3}}, dual=True)
    return pa.SequenceClassifier(cfg).double()


def tokens(seed: int) -> torch.Tensor:
    return torch.randint(1, 11, (3, 24), generator=torch.Generator().manual_seed(seed))


def test_two_towers_give_the_mean_of_both_towers() -> None:
    m, x, x2 = dual_model(), tokens(1), tokens(2)
    m.encode(x)
    first = pa.ksvd_loss(m)
    m.encode(x2)
    second = pa.ksvd_loss(m)
    assert not torch.allclose(first, second)
    m(x, None, x2, None)
    torch.testing.assert_close(pa.ksvd_loss(m), (first + second) / 2)
    # the loss depends on the first document too (it used to see the second tower alone)
    m(x, None, x2, None)
    loss = pa.ksvd_loss(m)
    m((x % 10) + 1, None, x2, None)
    assert not torch.allclose(pa.ksvd_loss(m), loss)


def test_a_layer_called_twice_counts_twice() -> None:
    torch.manual_seed(0)
    layer = pa.PrimalAttention(8, 2, rank=3, num_samples=5).double()
    a, b = torch.randn(2, 7, 8, dtype=torch.float64), torch.randn(2, 7, 8, dtype=torch.float64)
    layer(a)
    ja = layer.ksvd_objective()
    layer(b)
    jb = layer.ksvd_objective()
    torch.testing.assert_close(pa.ksvd_loss(layer), (ja**2 + jb**2) / 2)
    layer(a)
    layer(a)
    torch.testing.assert_close(pa.ksvd_loss(layer), ja**2)


def test_no_grad_and_inference_mode_record_nothing() -> None:
    torch.manual_seed(0)
    layer = pa.PrimalAttention(8, 2, rank=3, num_samples=5)
    x = torch.randn(2, 7, 8)
    with torch.no_grad():
        for _ in range(5):
            layer(x)
    with torch.inference_mode():
        layer(x)
    assert layer._terms == []
    assert layer.ksvd_objective().shape == ()  # the latest forward is still there
    with pytest.raises(RuntimeError, match="no primal forward with gradients"):
        pa.ksvd_loss(layer)


def test_terms_from_before_an_optimiser_step_are_dropped() -> None:
    torch.manual_seed(0)
    layer = pa.PrimalAttention(8, 2, rank=3, num_samples=5)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    x = torch.randn(2, 7, 8)
    for _ in range(4):  # a loop that never calls ksvd_loss (eta = 0) keeps at most one step's terms
        opt.zero_grad()
        layer(x).square().mean().backward()
        opt.step()
        assert len(layer._terms) == 1
    layer(x)
    assert len(layer._terms) == 1
    j = layer.ksvd_objective()
    torch.testing.assert_close(pa.ksvd_loss(layer), j**2)
    layer(x)
    opt.zero_grad()
    layer(x).sum().backward()
    opt.step()
    with pytest.raises(RuntimeError, match="no primal forward"):
        pa.ksvd_loss(layer)  # the recorded terms predate the step: stale, dropped


def stack_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return pa.TransformerStack(["primal", "primal"], 16, 2, 32, attention_options={"primal": {"rank": 3, "num_samples": 6}}).double()


def loss_and_grads(model: torch.nn.Module, x: torch.Tensor, use_checkpoint: bool) -> tuple[torch.Tensor, list]:
    model.zero_grad()
    h = x
    for block in model.blocks:
        h = checkpoint(block, h, use_reentrant=False) if use_checkpoint else block(h)
    loss = model.norm(h).square().mean() + 0.5 * pa.ksvd_loss(model)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def test_activation_checkpointing_neither_double_counts_nor_leaks() -> None:
    model = stack_model()
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    plain_loss, plain_grads = loss_and_grads(model, x, use_checkpoint=False)
    ckpt_loss, ckpt_grads = loss_and_grads(model, x, use_checkpoint=True)
    torch.testing.assert_close(ckpt_loss, plain_loss)
    for a, b in zip(ckpt_grads, plain_grads):
        torch.testing.assert_close(a, b)
    assert all(layer._terms == [] for _, layer in pa.primal_layers(model))  # recomputation recorded nothing


def test_reentrant_checkpointing_is_a_clear_error() -> None:
    model = stack_model()
    h = torch.randn(2, 12, 16, dtype=torch.float64, requires_grad=True)
    for block in model.blocks:
        h = checkpoint(block, h, use_reentrant=True)
    with pytest.raises(RuntimeError, match="use_reentrant=False"):
        pa.ksvd_loss(model)


def test_through_ddp() -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        model = dual_model()
        net = torch.nn.parallel.DistributedDataParallel(model)
        x, x2 = tokens(1), tokens(2)
        model.encode(x)
        expected = pa.ksvd_loss(model)
        model.encode(x2)
        expected = (expected + pa.ksvd_loss(model)) / 2
        logits = net(x, None, x2, None)
        loss = pa.ksvd_loss(net)
        torch.testing.assert_close(loss, expected)
        (logits.sum() + loss).backward()
        assert all(p.grad is not None for p in model.parameters())
    finally:
        dist.destroy_process_group()


def test_under_torch_compile() -> None:
    torch.manual_seed(0)
    layer = pa.PrimalAttention(8, 2, rank=3, num_samples=5)
    x = torch.randn(2, 7, 8)
    eager = layer(x)
    expected = pa.ksvd_loss(layer)
    compiled = torch.compile(layer, backend="eager")
    torch.testing.assert_close(compiled(x), eager)
    compiled(x)
    torch.testing.assert_close(pa.ksvd_loss(layer), expected)
