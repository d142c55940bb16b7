"""Data families: each kind of experiment (``data.family`` of a config) in one place.

A :class:`Family` owns its ``model:`` config section, its config checks, its loader (the train /
validation / test splits), its model builder, its task (loss, metrics, selection), its trivial baselines
and its per-run extras. The trainer, ``load_run``, the sweep and the CLI ask :func:`get_family`; nothing
else compares family names. A new family is one module defining a :class:`Family` subclass, registered
with :func:`register_family` (or listed in :data:`BUILTIN`, which imports its module on first use).
"""

from __future__ import annotations

import importlib

from primal_attention.train.config import ConfigError
from primal_attention.train.families.base import Family, Splits, register_family, registered

__all__ = ["BUILTIN", "Family", "Splits", "family_names", "fetch_dataset", "get_family", "register_family"]

#: built-in family name -> the module whose import registers it.
BUILTIN: dict[str, str] = {
    "uea": "primal_attention.train.families.classification",
    "fsdd": "primal_attention.train.families.classification",
    "lra": "primal_attention.train.families.classification",
    "vision": "primal_attention.train.families.vision",
    "lm": "primal_attention.train.families.lm",
    "rl": "primal_attention.train.families.rl",
}


def family_names() -> list[str]:
    """Every family name a config may give (built-in and registered)."""
    return sorted(set(BUILTIN) | set(registered()))


def get_family(name: str) -> Family:
    """The family registered as ``name``; ConfigError naming the known ones otherwise."""
    if name not in registered() and name in BUILTIN:
        importlib.import_module(BUILTIN[name])
    family = registered().get(name)
    if family is None:
        raise ConfigError(f"data.family must be one of {', '.join(family_names())}, got {name!r}")
    return family


def fetch_dataset(name: str, *, data_dir: str | None = None, vocab_size: int = 4096) -> str:
    """``primal data fetch NAME``: the family that owns dataset ``name`` fetches it (a family that takes
    every other name, UEA's archive, is asked last); what it printed."""
    families = sorted((get_family(f) for f in family_names()), key=lambda f: f.fetches_the_rest)
    for family in families:
        said = family.fetch(name, data_dir=data_dir, vocab_size=vocab_size)
        if said is not None:
            return said
    raise ValueError(f"no data family fetches {name!r}")
