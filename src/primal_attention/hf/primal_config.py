"""The primal variant of an HF architecture's config: what :func:`~primal_attention.hf.primalize` makes a
model's config, so that it saves as (and HF's Auto classes load) a primal model.

A subclass of the architecture's config with ``model_type`` ``primal_<type>`` and no field of its own;
its ``config.json`` also carries ``"attn_implementation": "primal_attention"``, which no attention
function answers to, so that the architecture's own class refuses it (:mod:`primal_attention.hf.auto`).
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

from primal_attention.hf.architectures import PRIMAL_TYPE_PREFIX

#: what a saved primal config.json holds under ``attn_implementation`` (no attention function has this
#: name, so a non-primal class refuses to build from it).
ATTN_MARKER = "primal_attention"

_PRIMAL_CONFIGS: dict[type[PretrainedConfig], type[PretrainedConfig]] = {}


def primal_config_class(base: type[PretrainedConfig]) -> type[PretrainedConfig]:
    """The primal variant of an architecture's config class (made once, then the same class)."""
    if base.model_type.startswith(PRIMAL_TYPE_PREFIX):
        return base
    found = _PRIMAL_CONFIGS.get(base)
    if found is not None:
        return found

    def __init__(self: PretrainedConfig, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("attn_implementation") == ATTN_MARKER:
            kwargs.pop("attn_implementation")  # the marker, not an implementation: the default one serves
        base.__init__(self, *args, **kwargs)

    def to_dict(self: PretrainedConfig) -> dict[str, Any]:
        out = base.to_dict(self)
        out["attn_implementation"] = ATTN_MARKER
        return out

    cls = type(f"Primal{base.__name__}", (base,), {
        "model_type": PRIMAL_TYPE_PREFIX + base.model_type, "__init__": __init__, "to_dict": to_dict,
        "__module__": __name__, "__doc__": f"{base.__name__} of a model with primal layers (its record in "
                                         "``primal_attention``); every field is the base config's."})
    _PRIMAL_CONFIGS[base] = cls
    globals()[cls.__name__] = cls  # pickle finds it by module and name (a deep copy, torch.save, a worker)
    return cls


def mark_primal(config: PretrainedConfig) -> None:
    """Make ``config`` (in place) the primal variant of its class, so that it saves as one."""
    config.__class__ = primal_config_class(type(config))
