"""The KSVD regulariser over a model: every primal forward's J, collected.

Each :class:`~primal_attention.layers.primal.PrimalAttention` forward run with gradients records
its KSVD term; :func:`ksvd_loss` consumes all of them since its previous call. Total training loss
= task + η · ksvd_loss(model) (docs/method.md §4).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from primal_attention.layers.primal import PrimalAttention


def primal_layers(model: nn.Module) -> list[tuple[str, PrimalAttention]]:
    """(qualified name, layer) for every primal attention layer in ``model``, in module order."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, PrimalAttention)]


def ksvd_objectives(model: nn.Module, reduction: str = "batch", form: str = "authors") -> dict[str, Tensor]:
    """Signed J of every primal layer's latest forward, keyed by layer name (nothing is consumed).

    reduction="batch": scalars; "sample": (B,) each. See ``PrimalAttention.ksvd_objective``.
    """
    return {name: layer.ksvd_objective(reduction, form) for name, layer in primal_layers(model)}


def ksvd_loss(model: nn.Module, reduction: str = "batch", form: str = "authors") -> Tensor:
    """Mean of J² over every primal forward recorded since the previous call, differentiable.

    A forward is recorded when it runs with gradients enabled; a layer called twice (the two towers
    of a retrieval model, a shared layer) contributes twice, and the recorded terms are cleared.
    reduction="batch" (LRA, vision): J over the whole batch, squared once per forward.
    reduction="sample" (time series, RL, LM): one J per sample, squared, averaged over the batch.
    A model without primal layers gives a zero that needs no gradient.

    Raises:
        RuntimeError: the model has primal layers but none ran with gradients since the previous
            call (a forward under ``no_grad``, or reentrant activation checkpointing).
    """
    layers = primal_layers(model)
    if not layers:
        p = next(model.parameters(), None)
        return torch.zeros((), device=None if p is None else p.device)
    squares = [
        layer.term_objective(term, reduction, form).square().mean()
        for _, layer in layers
        for term in layer.pop_ksvd_terms()
    ]
    if not squares:
        raise RuntimeError(
            "ksvd_loss: no primal forward with gradients since the previous call; run the model's "
            "forward with gradients enabled first (reentrant checkpointing records nothing: use "
            "torch.utils.checkpoint with use_reentrant=False)"
        )
    return torch.stack(squares).mean()
