"""KSVD terms, explicitly: a scope that collects what every primal forward inside it needs for its J.

    with pa.ksvd_terms(model) as terms:
        loss = task_loss(model(x), y) + eta * terms.loss()
    loss.backward()

Inside the scope each :class:`~primal_attention.layers.primal.PrimalAttention` of ``model`` sends
its forward's term (the fast path's cache or the reference trace) to the scope and keeps nothing on
the module, so no tensor outlives the step. Forwards with gradients are loss terms; the
recomputation that activation checkpointing runs inside backward records nothing; forwards without
gradients are kept only with ``inference=True`` (for their J: diagnostics, a run's final J). Works
through DDP wrappers, ``torch.compile`` and foreign models (any module holding primal layers).
:func:`primal_attention.ksvd_loss` is the same loss without a scope (docs/method.md §4).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from primal_attention.layers.primal import KSVDTerm, PrimalAttention

NO_TERMS = ("no primal forward with gradients since the previous call; run the model's forward with gradients "
            "enabled first (reentrant checkpointing records nothing: use torch.utils.checkpoint with "
            "use_reentrant=False)")


def primal_layers(model: nn.Module) -> list[tuple[str, PrimalAttention]]:
    """(qualified name, layer) for every primal attention layer in ``model``, in module order."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected a torch.nn.Module (the model whose primal layers to collect), got {type(model).__name__}")
    return [(name, m) for name, m in model.named_modules() if isinstance(m, PrimalAttention)]


def mean_square(pairs: list[tuple[PrimalAttention, KSVDTerm]], reduction: str, form: str) -> Tensor:
    """Mean over forwards of J² (``reduction="sample"``: J per sample, squared, batch mean), differentiable."""
    return torch.stack([layer.term_objective(term, reduction, form).square().mean() for layer, term in pairs]).mean()


def zero_for(model: nn.Module) -> Tensor:
    """The loss of a model without primal layers: a zero that needs no gradient, on the model's device."""
    p = next(model.parameters(), None)
    return torch.zeros((), device=None if p is None else p.device)


class KSVDTerms:
    """The KSVD terms of the primal forwards run inside one :func:`ksvd_terms` scope.

    ``loss()`` consumes the terms with gradients; ``objectives()`` reads every kept term. The object
    stays usable after the ``with`` block (its terms are freed with it).
    """

    def __init__(self, model: nn.Module, layers: list[tuple[str, PrimalAttention]], inference: bool) -> None:
        self._model = model
        self._names = {id(layer): name for name, layer in layers}
        self._inference = inference
        self._terms: list[tuple[PrimalAttention, KSVDTerm, bool]] = []

    def add(self, layer: PrimalAttention, term: KSVDTerm, grad: bool) -> None:
        """Called by a layer's forward (grad: whether it ran with gradients enabled)."""
        if grad or self._inference:
            self._terms.append((layer, term, grad))

    def __len__(self) -> int:
        """The number of kept terms (one per forward of one layer)."""
        return len(self._terms)

    def loss(self, reduction: str = "batch", form: str = "authors") -> Tensor:
        """Mean of J² over the forwards with gradients so far, differentiable; they are consumed
        (a second call sees only later forwards). reduction="batch": J over the whole batch, squared
        once per forward; "sample": one J per sample, squared, batch mean. A model without primal
        layers gives a zero that needs no gradient.

        Raises:
            RuntimeError: the model has primal layers but none ran with gradients in the scope since
                the previous call.
        """
        if not self._names:
            return zero_for(self._model)
        pairs = [(layer, term) for layer, term, grad in self._terms if grad]
        self._terms = [t for t in self._terms if not t[2]]
        if not pairs:
            raise RuntimeError(f"ksvd_terms: {NO_TERMS}")
        return mean_square(pairs, reduction, form)

    def objectives(self, reduction: str = "batch", form: str = "authors") -> dict[str, Tensor]:
        """Signed J of every kept forward, in call order, keyed by layer name; a layer's second and
        later calls (two towers, a shared layer) are ``name#2``, ``name#3``, ... Nothing is consumed.
        reduction "batch": scalars; "sample": (B,)."""
        out: dict[str, Tensor] = {}
        calls: dict[int, int] = {}
        for i, (layer, term, grad) in enumerate(self._terms):
            calls[id(layer)] = calls.get(id(layer), 0) + 1
            name = self._names[id(layer)] + (f"#{calls[id(layer)]}" if calls[id(layer)] > 1 else "")
            term = layer.complete_term(term)  # an inference forward's features, recomputed once
            self._terms[i] = (layer, term, grad)
            out[name] = layer.term_objective(term, reduction, form)
        return out

    def clear(self) -> None:
        """Drop every kept term."""
        self._terms = []


@contextmanager
def ksvd_terms(model: nn.Module, *, inference: bool = False) -> Iterator[KSVDTerms]:
    """A scope whose primal forwards (of the layers in ``model``) send their KSVD terms to the yielded
    :class:`KSVDTerms` instead of keeping them on the layers.

    inference: also keep the forwards run without gradients (their J is recomputed from the kept
    input when asked for). Scopes nest: a layer sends to the innermost scope that holds it.
    """
    layers = primal_layers(model)
    terms = KSVDTerms(model, layers, inference)
    for _, layer in layers:
        layer._sinks.append(terms)
    try:
        yield terms
    finally:
        for _, layer in layers:
            layer._sinks.remove(terms)
