"""Primal checkpoints through HF's own loading path: the Auto classes and ``pipeline``.

:func:`~primal_attention.hf.primalize` marks a model's config as the primal variant of its architecture
(``model_type`` ``primal_gpt2``, ``primal_llama``, ...; a subclass of the architecture's config with no
field of its own). Importing :mod:`primal_attention.hf` registers, for every supported architecture,
that config with ``AutoConfig`` and a primal model class with every ``AutoModel*`` class that knows the
architecture, so ``AutoModelForCausalLM.from_pretrained(d)`` and ``pipeline(task, model=d)`` rebuild the
primal layers from the config's record before HF loads the weights: the logits are the saved model's.

A saved primal config also carries ``"attn_implementation": "primal_attention"``: the architecture's own
class (``GPT2LMHeadModel.from_pretrained(d)``), which would build softmax layers and leave the primal
weights unused, stops at construction on that unknown attention implementation instead.
"""

from __future__ import annotations

from typing import Any

from transformers import CONFIG_MAPPING, AutoConfig, PretrainedConfig, PreTrainedModel
from transformers.models.auto import modeling_auto

from primal_attention.hf.architectures import ARCHITECTURES
from primal_attention.hf.primal_config import primal_config_class
from primal_attention.hf.primalize import replay_records

_PRIMAL_MODELS: dict[type[PreTrainedModel], type[PreTrainedModel]] = {}


def primal_model_class(base: type[PreTrainedModel], config_class: type[PretrainedConfig]) -> type[PreTrainedModel]:
    """``base`` whose constructor replays the config's primalize record after building the model (made
    once per base class: several Auto classes map to the same one)."""
    found = _PRIMAL_MODELS.get(base)
    if found is not None:
        return found

    def __init__(self: PreTrainedModel, config: PretrainedConfig, *args: Any, **kwargs: Any) -> None:
        base.__init__(self, config, *args, **kwargs)
        replay_records(self)

    cls = type(f"Primal{base.__name__}", (base,), {
        "config_class": config_class, "__init__": __init__, "__module__": __name__,
        "__doc__": f"{base.__name__} with the primal layers its config records."})
    _PRIMAL_MODELS[base] = cls
    globals()[cls.__name__] = cls  # pickle finds it by module and name
    return cls


def _auto_classes() -> list[Any]:
    names = (n for n in dir(modeling_auto) if n.startswith("AutoModel"))
    return [c for c in (getattr(modeling_auto, n) for n in names) if getattr(c, "_model_mapping", None) is not None]


def register_auto_classes() -> None:
    """Register every supported architecture's primal config and model classes with HF's Auto classes."""
    autos = _auto_classes()
    for architecture in ARCHITECTURES.values():
        for model_type in architecture.model_types:
            base_config = CONFIG_MAPPING[model_type]
            primal = primal_config_class(base_config)
            if primal.model_type in CONFIG_MAPPING:
                continue
            AutoConfig.register(primal.model_type, primal)
            for auto in autos:
                if base_config in auto._model_mapping:
                    auto.register(primal, primal_model_class(auto._model_mapping[base_config], primal))
