"""pa.ksvd_terms: the one way to collect KSVD terms (a ``with`` scope or a handle); the layers keep nothing."""

from __future__ import annotations

import copy
import gc
import io
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from torch.utils.checkpoint import checkpoint

import primal_attention as pa


def dual_model(attention=("primal", "primal")) -> pa.SequenceClassifier:
    torch.manual_seed(0)
    cfg = pa.ClassifierConfig(num_classes=2, max_seq_len=24, vocab_size=11, dim=16, num_heads=2, ffn_dim=32,
                              attention=list(attention), attention_options={"primal": {"rank": 3}}, dual=True)
    return pa.SequenceClassifier(cfg).double()


def tokens(seed: int) -> torch.Tensor:
    return torch.randint(1, 11, (3, 24), generator=torch.Generator().manual_seed(seed))


def held_tensors(model: torch.nn.Module) -> list[str]:
    """Every tensor a module of ``model`` refers to besides its parameters and buffers (in its attributes
    and the containers in them)."""
    found = []

    def walk(value, where, depth=0):
        if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
            found.append(where)
        elif depth < 3 and isinstance(value, (list, tuple, set)):
            for i, v in enumerate(value):
                walk(v, f"{where}[{i}]", depth + 1)
        elif depth < 3 and isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{where}[{k!r}]", depth + 1)

    for name, module in model.named_modules():
        for key, value in vars(module).items():
            if key not in ("_parameters", "_buffers", "_modules"):
                walk(value, f"{name}.{key}")
    return found


def test_the_layer_keeps_no_tensor_after_any_forward() -> None:
    model = dual_model()
    x, x2 = tokens(1), tokens(2)
    model(x, None, x2, None)  # with gradients, outside any collector
    with torch.no_grad():
        model(x, None, x2, None)
    with pa.ksvd_terms(model) as terms:
        model(x, None, x2, None).sum().backward()
    assert len(terms) == 4 and held_tensors(model) == []


def test_two_towers_give_the_mean_of_both_towers() -> None:
    m, x, x2 = dual_model(("softmax", "primal")), tokens(1), tokens(2)
    with pa.ksvd_terms(m) as terms:
        m.encode(x)
        first = terms.loss()
        m.encode(x2)
        second = terms.loss()
        assert not torch.allclose(first, second)
        m(x, None, x2, None)
        torch.testing.assert_close(terms.loss(), (first + second) / 2)


def test_a_layer_called_twice_counts_twice_and_objectives_name_each_call() -> None:
    torch.manual_seed(0)
    layer = pa.PrimalAttention(8, 2, rank=3, num_samples=5).double()
    a, b = torch.randn(2, 7, 8, dtype=torch.float64), torch.randn(2, 7, 8, dtype=torch.float64)
    with pa.ksvd_terms(layer) as terms:
        layer(a)
        ja = terms.objective()
        layer(b)
        js = terms.objectives()
        assert list(js) == ["", "#2"]
        with pytest.raises(RuntimeError, match="exactly one kept forward, got 2"):
            terms.objective()
        torch.testing.assert_close(terms.loss(), (ja**2 + js["#2"] ** 2) / 2)
        assert len(terms) == 0  # consumed


def test_inference_forwards_are_kept_only_when_asked() -> None:
    torch.manual_seed(0)
    layer = pa.PrimalAttention(8, 2, rank=3, num_samples=5)
    x = torch.randn(2, 7, 8)
    with pa.ksvd_terms(layer) as terms:
        layer(x)
        expected = terms.objective().detach()
    with torch.no_grad(), pa.ksvd_terms(layer) as plain, pa.ksvd_terms(layer, inference=True) as kept:
        layer(x)
    assert len(plain) == 0 and len(kept) == 1  # the innermost collector took it
    torch.testing.assert_close(kept.objective(), expected)
    with pytest.raises(RuntimeError, match="no primal forward with gradients"):
        kept.loss()


def test_a_handle_collects_until_it_is_closed() -> None:
    """The form for loops that cannot be wrapped in `with` (a Trainer's compute_loss)."""
    torch.manual_seed(0)
    layer = pa.PrimalAttention(8, 2, rank=3, num_samples=5)
    x = torch.randn(2, 7, 8)
    terms = pa.ksvd_terms(layer)
    assert terms.is_open
    layer(x)
    layer(x)
    assert len(terms) == 2
    terms.close()
    assert not terms.is_open
    layer(x)
    assert len(terms) == 2  # closed: later forwards are not collected
    assert terms.loss().requires_grad
    terms.close()  # closing twice is harmless


def test_a_dropped_handle_closes_itself() -> None:
    layer = pa.PrimalAttention(8, 2, rank=3, num_samples=5)
    pa.ksvd_terms(layer)  # opened and dropped at once
    gc.collect()
    with pa.ksvd_terms(layer) as outer:
        inner = pa.ksvd_terms(layer)
        del inner
        gc.collect()
        layer(torch.randn(2, 7, 8))
    assert len(outer) == 1  # the dropped inner handle no longer takes the term


def test_checkpoint_recomputation_records_nothing() -> None:
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


def test_reentrant_checkpointing_is_a_clear_error() -> None:
    model = pa.TransformerStack(["primal", "primal"], 16, 2, 32, attention_options={"primal": {"rank": 3}}).double()
    h = torch.randn(2, 12, 16, dtype=torch.float64, requires_grad=True)
    with pa.ksvd_terms(model) as terms:
        for block in model.blocks:
            h = checkpoint(block, h, use_reentrant=True)
        with pytest.raises(RuntimeError, match="use_reentrant=False"):
            terms.loss()


def test_under_torch_compile() -> None:
    torch.manual_seed(0)
    layer = pa.PrimalAttention(8, 2, rank=3, num_samples=5)
    x = torch.randn(2, 7, 8)
    with pa.ksvd_terms(layer) as terms:
        eager = layer(x)
        expected = terms.loss()
    compiled = torch.compile(layer, backend="eager")
    with pa.ksvd_terms(layer) as terms:
        torch.testing.assert_close(compiled(x), eager)
        layer(x)
        assert len(terms) == 2  # a compiled forward's term beside an eager one
        torch.testing.assert_close(terms.loss(), expected)
    assert held_tensors(layer) == []


def test_through_ddp() -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29519")
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        model = dual_model()
        net = torch.nn.parallel.DistributedDataParallel(model)
        x, x2 = tokens(1), tokens(2)
        with pa.ksvd_terms(model) as terms:
            model(x, None, x2, None)
            expected = terms.loss()
        with pa.ksvd_terms(net) as terms:
            logits = net(x, None, x2, None)
            loss = terms.loss()
        torch.testing.assert_close(loss, expected)
        (logits.sum() + loss).backward()
        assert all(p.grad is not None for p in model.parameters())
    finally:
        dist.destroy_process_group()


def test_copies_and_pickles_are_plain_modules() -> None:
    model = pa.TransformerStack(["primal"], 8, 2, 16, attention_options={"primal": {"rank": 3, "num_samples": 5}})
    x = torch.randn(2, 7, 8)
    with pa.ksvd_terms(model) as terms:
        model(x)
        snapshot = copy.deepcopy(model)  # e.g. an EMA or best-weights copy inside a training step
        buffer = io.BytesIO()
        torch.save(model, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
        for copy_ in (snapshot, loaded):
            copy_(x)  # a copy's layers are not the collector's: their terms do not reach it
    assert len(terms) == 1
    for copy_ in (snapshot, loaded):
        assert held_tensors(copy_) == []
        with pa.ksvd_terms(copy_) as own:
            copy_(x)
        assert own.loss().requires_grad


def test_model_without_primal_layers_gives_a_zero() -> None:
    model = pa.TransformerStack(["softmax"], 8, 2, 16)
    with pa.ksvd_terms(model) as terms:
        model(torch.randn(2, 5, 8))
        loss = terms.loss()
    assert float(loss) == 0.0 and not loss.requires_grad


def test_removed_names_and_not_a_module_are_one_clear_error() -> None:
    with pytest.raises(TypeError, match="expected a torch.nn.Module .* got Tensor"):
        with pa.ksvd_terms(torch.zeros(3)):
            pass
    for name in ("ksvd_loss", "ksvd_objectives"):
        with pytest.raises(AttributeError, match=f"{name} was removed: .*ksvd_terms"):
            getattr(pa, name)
    assert not hasattr(pa.PrimalAttention(8, 2, 2), "ksvd_objective")


def test_importing_the_package_registers_no_optimiser_hook() -> None:
    code = ("import torch\nfrom torch.optim import optimizer as o\nbefore = (len(o._global_optimizer_post_hooks), "
            "len(o._global_optimizer_pre_hooks))\nimport primal_attention, primal_attention.train.trainer\n"
            "assert (len(o._global_optimizer_post_hooks), len(o._global_optimizer_pre_hooks)) == before, before\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
