"""KSVD terms, the one way to collect them: an object the user owns that keeps every primal forward's J.

    with pa.ksvd_terms(model) as terms:
        loss = task_loss(model(x), y) + eta * terms.loss()
    loss.backward()

While the collector is open each :class:`~primal_attention.layers.primal.PrimalAttention` of
``model`` sends its forward's term (the fast path's cache or the reference trace) to it; the layers
keep nothing, so no tensor outlives the step (and a forward outside any collector leaves nothing
behind). Forwards with gradients are loss terms; the recomputation that activation checkpointing runs
inside backward records nothing; forwards without gradients are kept only with ``inference=True``
(for their J: diagnostics, a run's final J). Works through DDP wrappers, ``torch.compile`` and foreign
models (any module holding primal layers). The same object is a handle (``terms.close()``) for loops
that cannot be wrapped in ``with`` (docs/method.md §4).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from primal_attention.layers.primal import KSVDTerm, PrimalAttention, close_sink, open_sink

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
    """A collector of the KSVD terms of the primal forwards of ``model`` while it is open.

    Made open by :func:`ksvd_terms`; use it as a context manager (closed at the end of the ``with``
    block) or as a handle, closed explicitly with :meth:`close` (a loop that cannot be wrapped in
    ``with``, such as a Trainer's ``compute_loss``); a collector its owner drops is closed when it
    is garbage-collected. ``loss()`` consumes the terms with gradients; ``objectives()`` and
    ``objective()`` read every kept term. The object stays readable after it is closed.
    """

    def __init__(self, model: nn.Module, *, inference: bool = False) -> None:
        layers = primal_layers(model)
        self._model = model
        self._names = {id(layer): name for name, layer in layers}
        self._inference = inference
        self._terms: list[tuple[PrimalAttention, KSVDTerm, bool]] = []
        self._open = False

    def open(self) -> KSVDTerms:
        """Start collecting (a collector opened later that holds the same layer takes its terms first)."""
        if not self._open:
            open_sink(self)
            self._open = True
        return self

    def close(self) -> None:
        """Stop collecting; the terms kept so far stay readable (:meth:`clear` frees them)."""
        if self._open:
            close_sink(self)
            self._open = False

    @property
    def is_open(self) -> bool:
        return self._open

    def __enter__(self) -> KSVDTerms:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def holds(self, layer: PrimalAttention) -> bool:
        """Whether ``layer`` is one of the model's primal layers."""
        return id(layer) in self._names

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
            RuntimeError: the model has primal layers but none ran with gradients while the
                collector was open since the previous call.
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
        reduction "batch": scalars; "sample": (B,). A collector over a lone layer names it ``""``."""
        out: dict[str, Tensor] = {}
        calls: dict[int, int] = {}
        for i, (layer, term, grad) in enumerate(self._terms):
            calls[id(layer)] = calls.get(id(layer), 0) + 1
            name = self._names[id(layer)] + (f"#{calls[id(layer)]}" if calls[id(layer)] > 1 else "")
            term = layer.complete_term(term)  # an inference forward's features, recomputed once
            self._terms[i] = (layer, term, grad)
            out[name] = layer.term_objective(term, reduction, form)
        return out

    def objective(self, reduction: str = "batch", form: str = "authors") -> Tensor:
        """Signed J of the one kept forward (a single layer called once: ``with ksvd_terms(layer) as t:
        layer(x); t.objective()``); a RuntimeError when the collector kept none or several."""
        if len(self._terms) != 1:
            raise RuntimeError(f"KSVDTerms.objective: expected exactly one kept forward, got {len(self._terms)} "
                               "(use objectives() for several; forwards without gradients need inference=True)")
        return next(iter(self.objectives(reduction, form).values()))

    def clear(self) -> None:
        """Drop every kept term."""
        self._terms = []


def ksvd_terms(model: nn.Module, *, inference: bool = False) -> KSVDTerms:
    """An open :class:`KSVDTerms` collector: the primal forwards of the layers in ``model`` send it their
    KSVD terms until it is closed. The layers themselves keep nothing.

        with ksvd_terms(model) as terms:          # closed at the end of the block
            loss = task_loss(model(x), y) + eta * terms.loss()

        terms = ksvd_terms(model)                 # a handle: closed explicitly
        ...; loss = loss + eta * terms.loss(); ...
        terms.close()

    inference: also keep the forwards run without gradients (their J is recomputed from the kept
    input when asked for). Collectors nest: a layer sends to the innermost open collector holding it.
    """
    return KSVDTerms(model, inference=inference).open()
