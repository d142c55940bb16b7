"""The KSVD regulariser over a model without a scope: the terms the primal layers keep themselves.

Outside a :func:`~primal_attention.ksvd.terms.ksvd_terms` scope each
:class:`~primal_attention.layers.primal.PrimalAttention` forward run with gradients records its
KSVD term on the layer; :func:`ksvd_loss` consumes all of them since its previous call. Total
training loss = task + η · ksvd_loss(model) (docs/method.md §4). The scope is the explicit form of
the same loss (nothing kept on the layers); this is the convenience.
"""

from __future__ import annotations

from torch import Tensor, nn

from primal_attention.ksvd.terms import NO_TERMS, mean_square, primal_layers, zero_for


def ksvd_objectives(model: nn.Module, reduction: str = "batch", form: str = "authors") -> dict[str, Tensor]:
    """Signed J of every primal layer's latest forward outside a scope, keyed by layer name (nothing
    is consumed). reduction="batch": scalars; "sample": (B,) each. See ``PrimalAttention.ksvd_objective``;
    a layer called twice reports its last call here (``ksvd_terms(...).objectives()`` reports each).
    """
    return {name: layer.ksvd_objective(reduction, form) for name, layer in primal_layers(model)}


def ksvd_loss(model: nn.Module, reduction: str = "batch", form: str = "authors") -> Tensor:
    """Mean of J² over every primal forward recorded since the previous call, differentiable.

    A forward is recorded when it runs with gradients enabled outside a ``ksvd_terms`` scope; a layer
    called twice (the two towers of a retrieval model, a shared layer) contributes twice, and the
    recorded terms are cleared. reduction="batch" (LRA, vision): J over the whole batch, squared once
    per forward. reduction="sample" (time series, RL, LM): one J per sample, squared, averaged over the
    batch. A model without primal layers gives a zero that needs no gradient.

    Raises:
        RuntimeError: the model has primal layers but none ran with gradients since the previous
            call (a forward under ``no_grad``, reentrant activation checkpointing, or forwards inside
            a ``ksvd_terms`` scope, whose terms are the scope's), or every recorded term is stale: a
            term is dropped once an optimiser's ``step()`` updated the layer, ``load_state_dict``
            loaded it, or a backward pass ran through its forward (its graph is spent and the weights
            may have been changed by hand), so call ``ksvd_loss`` before ``backward``.
    """
    layers = primal_layers(model)
    if not layers:
        return zero_for(model)
    pairs = [(layer, term) for _, layer in layers for term in layer.pop_ksvd_terms()]
    if not pairs:
        scoped = " (this model's layers are inside a ksvd_terms scope: use terms.loss())" \
            if any(layer._sinks for _, layer in layers) else ""
        raise RuntimeError(f"ksvd_loss: {NO_TERMS}{scoped}; terms are dropped once an optimiser step or a backward "
                           "pass has run through their forward, so call ksvd_loss before backward")
    return mean_square(pairs, reduction, form)
