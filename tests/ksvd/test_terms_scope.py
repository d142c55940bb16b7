"""pa.ksvd_terms: the explicit scope of KSVD terms, and the public hooks that keep held terms fresh."""

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
                              attention=["primal", "primal"], attention_options={"primal": {"rank": 3}}, dual=True)
    return pa.SequenceClassifier(cfg).double()


def tokens(seed: int) -> torch.Tensor:
    return torch.randint(1, 11, (3, 24), generator=torch.Generator().manual_seed(seed))


def nothing_kept(model: torch.nn.Module) -> bool:
    return all(layer._terms == [] and layer._last is None and layer._sinks == [] for _, layer in pa.primal_layers(model))


def test_scope_loss_equals_ksvd_loss_and_keeps_nothing_on_the_layers() -> None:
    model, x, x2 = dual_model(), tokens(1), tokens(2)
    model(x, None, x2, None)
    expected = pa.ksvd_loss(model, "sample")
    for _, layer in pa.primal_layers(model):
        layer.clear_cache()
    with pa.ksvd_terms(model) as terms:
        model(x, None, x2, None)
        assert len(terms) == 4  # two layers, two towers
        loss = terms.loss("sample")
    torch.testing.assert_close(loss, expected)
    assert loss.requires_grad and nothing_kept(model)
    assert terms.objectives() == {}  # consumed by loss()


def test_objectives_report_every_call_of_a_layer() -> None:
    torch.manual_seed(0)
    layer = pa.PrimalAttention(8, 2, rank=3, num_samples=5).double()
    a, b = torch.randn(2, 7, 8, dtype=torch.float64), torch.randn(2, 7, 8, dtype=torch.float64)
    layer(a)
    ja = layer.ksvd_objective()
    layer(b)
    jb = layer.ksvd_objective()
    layer.clear_cache()
    with pa.ksvd_terms(layer) as terms:
        layer(a)
        layer(b)
    got = terms.objectives()
    assert list(got) == ["", "#2"]
    torch.testing.assert_close(torch.stack(list(got.values())), torch.stack([ja, jb]))
    with pytest.raises(RuntimeError, match="inside one, the terms are the scope's"):
        layer.ksvd_objective()  # the latest forward ran in the scope: nothing stale is reported


def test_inference_forwards_are_kept_only_when_asked() -> None:
    torch.manual_seed(0)
    layer = pa.PrimalAttention(8, 2, rank=3, num_samples=5)
    x = torch.randn(2, 7, 8)
    layer(x)
    expected = layer.ksvd_objective().detach()
    with torch.no_grad(), pa.ksvd_terms(layer) as plain, pa.ksvd_terms(layer, inference=True) as kept:
        layer(x)
    assert len(plain) == 0 and len(kept) == 1  # the innermost scope took it
    torch.testing.assert_close(kept.objectives()[""], expected)
    with pytest.raises(RuntimeError, match="no primal forward with gradients"):
        kept.loss()


def test_checkpoint_recomputation_records_nothing_in_a_scope() -> None:
    torch.manual_seed(0)
    model = pa.TransformerStack(["primal", "primal"], 16, 2, 32,
                                attention_options={"primal": {"rank": 3, "num_samples": 6}}).double()
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    grads = []
    for use_checkpoint in (False, True):
        model.zero_grad()
        with pa.ksvd_terms(model) as terms:
            h = x
            for block in model.blocks:
                h = checkpoint(block, h, use_reentrant=False) if use_checkpoint else block(h)
            loss = model.norm(h).square().mean() + 0.5 * terms.loss()
            loss.backward()
            assert len(terms) == 0  # backward's recomputation sent nothing
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


def test_scope_under_torch_compile() -> None:
    torch.manual_seed(0)
    layer = pa.PrimalAttention(8, 2, rank=3, num_samples=5)
    x = torch.randn(2, 7, 8)
    layer(x)
    expected = pa.ksvd_loss(layer)
    compiled = torch.compile(layer, backend="eager")
    with pa.ksvd_terms(layer) as terms:
        compiled(x)
        torch.testing.assert_close(terms.loss(), expected)
    assert nothing_kept(layer)


def test_scope_through_ddp() -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29519")
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        model = dual_model()
        net = torch.nn.parallel.DistributedDataParallel(model)
        x, x2 = tokens(1), tokens(2)
        model(x, None, x2, None)
        expected = pa.ksvd_loss(model)
        with pa.ksvd_terms(net) as terms:
            logits = net(x, None, x2, None)
            loss = terms.loss()
        torch.testing.assert_close(loss, expected)
        (logits.sum() + loss).backward()
        assert all(p.grad is not None for p in model.parameters())
    finally:
        dist.destroy_process_group()


def test_ksvd_loss_inside_a_scope_says_where_the_terms_went() -> None:
    model = dual_model()
    with pa.ksvd_terms(model):
        model.encode(tokens(1))
        with pytest.raises(RuntimeError, match="inside a ksvd_terms scope: use terms.loss"):
            pa.ksvd_loss(model)


def test_model_without_primal_layers_gives_a_zero() -> None:
    model = pa.TransformerStack(["softmax"], 8, 2, 16)
    with pa.ksvd_terms(model) as terms:
        model(torch.randn(2, 5, 8))
        loss = terms.loss()
    assert loss.item() == 0.0 and not loss.requires_grad


def test_another_optimisers_step_leaves_held_terms_fresh() -> None:
    """A GAN-like loop: a second model's optimiser steps between this layer's forward and its loss."""
    torch.manual_seed(0)
    layer, other = pa.PrimalAttention(8, 2, rank=3, num_samples=5), torch.nn.Linear(3, 3)
    opt_other = torch.optim.SGD(other.parameters(), lr=0.1)
    layer(torch.randn(2, 7, 8))
    j = layer.ksvd_objective()
    other(torch.randn(4, 3)).sum().backward()
    opt_other.step()
    torch.testing.assert_close(pa.ksvd_loss(layer), j**2)


def test_load_state_dict_makes_held_terms_stale() -> None:
    torch.manual_seed(0)
    model = pa.TransformerStack(["primal"], 8, 2, 16, attention_options={"primal": {"rank": 3, "num_samples": 5}})
    model(torch.randn(2, 7, 8))
    model.load_state_dict({k: v * 1.5 for k, v in model.state_dict().items()})
    with pytest.raises(RuntimeError, match="no primal forward"):
        pa.ksvd_loss(model)


def test_hand_written_updates_leave_at_most_one_step_of_terms() -> None:
    """No optimiser hook sees `p -= lr * grad`: the backward through a forward makes its term stale."""
    torch.manual_seed(0)
    layer = pa.PrimalAttention(8, 2, rank=3, num_samples=5)
    x = torch.randn(2, 7, 8)
    for _ in range(4):
        layer(x).square().mean().backward()
        with torch.no_grad():
            for p in layer.parameters():
                if p.grad is not None:  # Λ enters only the KSVD term
                    p.sub_(0.1 * p.grad)
        layer.zero_grad()
    layer(x)
    assert len(layer._terms) == 1
    j = layer.ksvd_objective()
    torch.testing.assert_close(pa.ksvd_loss(layer), j**2)  # the fresh forward only, on the new weights
    layer(x).sum().backward()
    with pytest.raises(RuntimeError, match="call ksvd_loss before backward"):
        pa.ksvd_loss(layer)


def test_copies_and_pickles_carry_no_terms_and_no_scope() -> None:
    import copy
    import io

    model = pa.TransformerStack(["primal"], 8, 2, 16, attention_options={"primal": {"rank": 3, "num_samples": 5}})
    x = torch.randn(2, 7, 8)
    with pa.ksvd_terms(model) as terms:
        model(x)
        snapshot = copy.deepcopy(model)  # e.g. an EMA or best-weights copy inside a training step
        buffer = io.BytesIO()
        torch.save(model, buffer)
    assert len(terms) == 1
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    for copy_ in (snapshot, loaded):
        assert nothing_kept(copy_)
        copy_(x)
        assert pa.ksvd_loss(copy_).requires_grad  # its own forwards, on its own layers
    model(x)
    copy.deepcopy(model)  # held terms (non-leaf tensors) do not block a deep copy either


def test_a_compiled_forwards_term_is_kept_beside_eager_ones() -> None:
    torch.manual_seed(0)
    layer = pa.PrimalAttention(8, 2, rank=3, num_samples=5)
    x = torch.randn(2, 7, 8)
    compiled = torch.compile(layer, backend="eager")
    compiled(x)
    layer(x)
    assert len(layer._terms) == 2
    assert len(layer.pop_ksvd_terms()) == 2


def test_something_that_is_not_a_module_is_one_clear_error() -> None:
    with pytest.raises(TypeError, match="expected a torch.nn.Module .* got Tensor"):
        with pa.ksvd_terms(torch.zeros(3)):
            pass
    with pytest.raises(TypeError, match="expected a torch.nn.Module .* got dict"):
        pa.ksvd_loss({})
