"""The attentions the benchmark compares, by name, with the settings of the paper's Table 3.

Each entry names a registered attention (or, ``authors``, the authors' own code given by path:
:mod:`primal_attention.bench.authors`) (see :data:`primal_attention.layers.registry`) and the
constructor options the benchmark gives it. The efficient baselines live in
:mod:`primal_attention.baselines`; they are imported lazily, and an entry whose attention cannot be
imported or is not registered is reported as unavailable instead of failing the run.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class MethodSpec:
    """One line of the benchmark: ``attention`` is the registry name, ``options`` its constructor options."""

    name: str
    label: str
    attention: str
    options: dict[str, Any] = field(default_factory=dict)
    module: str | None = None  # imported before use (registers the attention)
    primal: bool = False  # has a KSVD term (added to the loss as in training)
    external: bool = False  # not one of our layers: built by primal_attention.bench.authors


#: rank 20, n = 200 (rank_multi 10): the ListOps settings of the authors (docs/method.md §5).
PRIMAL_OPTIONS: dict[str, Any] = {"rank": 20, "rank_multi": 10}

METHODS: dict[str, MethodSpec] = {
    m.name: m
    for m in (
        MethodSpec("primal", "primal", "primal", dict(PRIMAL_OPTIONS), primal=True),
        MethodSpec("primal_reference", "primal (reference)", "primal", {**PRIMAL_OPTIONS, "impl": "reference"}, primal=True),
        MethodSpec("window_primal", "window 128 + primal", "window_primal", {**PRIMAL_OPTIONS, "window": 128}, primal=True),
        MethodSpec("softmax", "softmax (SDPA)", "softmax"),
        MethodSpec("softmax_materialized", "softmax (N×N)", "softmax_materialized"),
        MethodSpec("nystrom", "Nyström (64)", "nystrom", {"num_landmarks": 64}, "primal_attention.baselines"),
        MethodSpec("linformer", "Linformer (256)", "linformer", {"k": 256}, "primal_attention.baselines"),
        MethodSpec("performer", "Performer (256)", "performer", {"num_features": 256}, "primal_attention.baselines"),
        MethodSpec("reformer", "Reformer (2)", "reformer", {"n_hashes": 2}, "primal_attention.baselines"),
        MethodSpec("linear", "linear (elu+1)", "linear", {}, "primal_attention.baselines"),
        MethodSpec("authors", "authors' PrimalFormer", "primal", dict(PRIMAL_OPTIONS), primal=True, external=True),
    )
}

#: the reference method of every ratio and crossover.
BASELINE = "softmax"


def availability(name: str) -> str | None:
    """None if ``name`` can be built here, else why not (unknown name, import error, not registered)."""
    if name not in METHODS:
        return f"unknown method {name!r}; known: {', '.join(METHODS)}"
    spec = METHODS[name]
    if spec.external:
        from primal_attention.bench.authors import unavailable_reason

        return unavailable_reason()
    if spec.module is not None:
        try:
            importlib.import_module(spec.module)
        except Exception as err:  # noqa: BLE001 - any import failure makes the method unavailable
            return f"cannot import {spec.module}: {type(err).__name__}: {err}"
    from primal_attention.layers import attention_class

    try:
        attention_class(spec.attention)
    except ValueError:
        return f"attention {spec.attention!r} is not registered (yet)"
    return None
