"""The KSVD regulariser over a model: one collector for every primal layer's J.

Each :class:`~primal_attention.attention.PrimalAttention` keeps what its last forward needs for its
own objective J; :func:`ksvd_loss` gathers them. Total training loss = task + η · ksvd_loss(model).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from primal_attention.attention import PrimalAttention


def primal_layers(model: nn.Module) -> list[tuple[str, PrimalAttention]]:
    """(qualified name, layer) for every primal attention layer in ``model``, in module order."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, PrimalAttention)]


def ksvd_objectives(model: nn.Module, reduction: str = "batch", form: str = "authors") -> dict[str, Tensor]:
    """Signed J of every primal layer's last forward, keyed by layer name.

    reduction="batch": scalars; "sample": (B,) each. See ``PrimalAttention.ksvd_objective``.
    """
    return {name: layer.ksvd_objective(reduction, form) for name, layer in primal_layers(model)}


def ksvd_loss(model: nn.Module, reduction: str = "batch", form: str = "authors") -> Tensor:
    """Mean over the model's primal layers of J² (DESIGN.md §4), differentiable.

    reduction="batch" (LRA, vision): J over the whole batch, squared once per layer.
    reduction="sample" (time series, RL, LM): one J per sample, squared, averaged over the batch.
    A model without primal layers gives a zero that needs no gradient.
    """
    js = list(ksvd_objectives(model, reduction, form).values())
    if not js:
        p = next(model.parameters(), None)
        return torch.zeros((), device=None if p is None else p.device)
    return torch.stack([j.square().mean() for j in js]).mean()
