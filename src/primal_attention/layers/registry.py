"""Attention modules by name: ``build_attention("primal", 64, 2, rank=20)``.

The built-in layers and the baselines are listed in :data:`BUILTIN` with the module that defines
them; a module is imported the first time one of its names is asked for, so ``import
primal_attention`` does not import every baseline. Third-party layers join with
:func:`register_attention`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from torch import nn

#: built-in name -> the module whose import registers it.
BUILTIN: dict[str, str] = {
    "primal": "primal_attention.layers.primal",
    "window_primal": "primal_attention.layers.window",
    "softmax": "primal_attention.layers.softmax",
    "softmax_materialized": "primal_attention.layers.softmax",
    "nystrom": "primal_attention.baselines.nystrom",
    "linformer": "primal_attention.baselines.linformer",
    "performer": "primal_attention.baselines.performer",
    "reformer": "primal_attention.baselines.reformer",
    "linear": "primal_attention.baselines.linear",
}

_REGISTERED: dict[str, type[nn.Module]] = {}


def register_attention(name: str) -> Callable[[type[nn.Module]], type[nn.Module]]:
    """Class decorator: make an attention module available to :func:`build_attention` as ``name``."""

    def add(cls: type[nn.Module]) -> type[nn.Module]:
        if name in _REGISTERED and _REGISTERED[name] is not cls:
            raise ValueError(f"attention {name!r} is already registered to {_REGISTERED[name].__name__}")
        _REGISTERED[name] = cls
        return cls

    return add


def attention_names() -> list[str]:
    """Every name :func:`build_attention` accepts (built-in and registered), sorted."""
    return sorted(set(BUILTIN) | set(_REGISTERED))


def attention_class(name: str) -> type[nn.Module]:
    """The class registered as ``name``, importing its built-in module on first use."""
    if name not in _REGISTERED and name in BUILTIN:
        importlib.import_module(BUILTIN[name])
    if name not in _REGISTERED:
        raise ValueError(f"unknown attention {name!r}; available: {', '.join(attention_names())}")
    return _REGISTERED[name]


def build_attention(name: str, embed_dim: int, num_heads: int, **options: Any) -> nn.Module:
    """Construct the attention registered as ``name`` (see :func:`attention_names`)."""
    return attention_class(name)(embed_dim, num_heads, **options)
