"""Record what attention layers receive: a forward pre-hook keeps each call's x and padding mask.

Used by the KSVD diagnostics and the spectrum analysis, which recompute a layer's matrices in
float64 from its input instead of trusting what the fast path kept.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass
class LayerInput:
    """What a forward pre-hook saw: x (B, N, D) and the padding mask (B, N) bool (True = real)."""

    x: Tensor
    mask: Tensor


@contextmanager
def record_inputs(layers: Sequence[tuple[str, nn.Module]], model: nn.Module | None = None) -> Iterator[dict[str, LayerInput]]:
    """Record the input of each named layer during the forwards inside the ``with`` block.

    Yields a dict name -> :class:`LayerInput`, filled as the model runs; a layer called more than
    once (the two towers of a dual-input model) keeps its latest call; a missing mask is recorded
    as all True. The hooks are removed on exit. With ``model``: the primal branch of a
    :class:`~primal_attention.WindowPrimalAttention` of the model (which runs that layer's op, not its
    forward) is recorded from the window layer's calls, whose x and mask it receives.
    """
    if model is not None:
        from primal_attention.layers.window import WindowPrimalAttention

        owners = {id(m.primal): m for m in model.modules() if isinstance(m, WindowPrimalAttention)}
        layers = [(name, owners.get(id(layer), layer)) for name, layer in layers]
    seen: dict[str, LayerInput] = {}
    handles = []

    def hook_for(name: str):
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            x = args[0] if args else kwargs["x"]
            mask = args[1] if len(args) > 1 else kwargs.get("mask", kwargs.get("attn_mask"))
            if mask is None:
                mask = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
            seen[name] = LayerInput(x.detach(), mask.detach())

        return hook

    for name, layer in layers:
        handles.append(layer.register_forward_pre_hook(hook_for(name), with_kwargs=True))
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()
