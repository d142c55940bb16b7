"""Swap Primal-Attention into a Hugging Face model, and load such a model back from disk."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn
from transformers import AutoConfig, PreTrainedModel

from primal_attention.hf.attention import OUTPUT_ATTENTIONS_ERROR, PrimalSelfAttention
from primal_attention.hf.families import Family, copy_projections, family_of
from primal_attention.layers.primal import PrimalAttention

#: the config attribute (and config.json key) that records every primalize call of a model.
CONFIG_KEY = "primal_attention"
INITS = ("from_softmax", "random")
#: options fixed by the model's config, not by the caller.
_FIXED = ("embed_dim", "num_heads", "causal")

M = TypeVar("M", bound=PreTrainedModel)


def _attention_slots(model: nn.Module, family: Family) -> list[tuple[str, nn.Module]]:
    """(qualified name, module) of every layer's self-attention, in layer order (primal or not)."""
    return [(name, m) for name, m in model.named_modules()
            if isinstance(m, PrimalSelfAttention) or family.is_self_attention(m)]


def _resolve_layers(layers: str | int | Sequence[int], count: int) -> list[int]:
    if layers == "all":
        return list(range(count))
    if layers == "last":
        return [count - 1]
    if isinstance(layers, str):
        raise ValueError(f"primalize: layers must be 'last', 'all' or a list of ints, got {layers!r}")
    chosen = [layers] if isinstance(layers, int) else list(layers)
    if not chosen:
        raise ValueError("primalize: layers is empty")
    out = []
    for i in chosen:
        if not isinstance(i, int) or isinstance(i, bool):
            raise ValueError(f"primalize: layer indices must be ints, got {i!r}")
        if not -count <= i < count:
            raise ValueError(f"primalize: layer index {i} is out of range for a model with {count} layers "
                             f"(valid: {-count}..{count - 1})")
        out.append(i % count)
    if len(set(out)) != len(out):
        raise ValueError(f"primalize: layer indices {chosen} name a layer twice")
    return sorted(out)


def _refuse_output_attentions(module: nn.Module, args: tuple, kwargs: dict) -> None:
    """Forward pre-hook: a clear error instead of an ``attentions`` output that silently skips primal layers."""
    if kwargs.get("output_attentions") or getattr(module.config, "output_attentions", False):
        raise ValueError(OUTPUT_ATTENTIONS_ERROR)


def _install_hooks(model: PreTrainedModel) -> None:
    for module in {id(m): m for m in (model, model.base_model)}.values():
        if not getattr(module, "_primal_attention_hook", False):
            module.register_forward_pre_hook(_refuse_output_attentions, with_kwargs=True)
            module._primal_attention_hook = True


def primalize(
    model: M,
    layers: str | int | Sequence[int] = "last",
    init: str = "from_softmax",
    *,
    decode_plan: bool = False,
    **primal_options: Any,
) -> M:
    """Replace, in place, the self-attention of the chosen layers of an HF model with Primal-Attention.

    Args:
        model: a GPT-2, Llama, Qwen2, BERT, RoBERTa or ViT model of transformers 5.x (any head).
        layers: "last", "all", or layer indices (negative counts from the end).
        init: "from_softmax" copies the replaced layer's query/key projections and output
            projection (GPT-2's fused ``c_attn`` split; grouped key heads repeated; BERT/RoBERTa keep
            their output dense, so the primal ``out_proj`` starts as the identity); "random" keeps
            PrimalAttention's own init. The value projection has no counterpart and is dropped.
        primal_options: :class:`~primal_attention.PrimalAttention` keyword options (``rank``,
            ``rank_multi``, ``num_samples``, ``sampling``, ``positive_lambda``, ``impl``, ``bias``,
            ``dropout``, ``max_seq_len``). Width, heads and causality come from the config; decoders get
            the causal family. Defaults: dropout (the config's attention dropout), bias (the query
            projection's), ``sampling="valid"`` (padding never enters the sampled tokens of encoders
            nor the KSVD terms) and, for encoders, ``max_seq_len`` from the config.
        decode_plan: decoders only: keep each primal layer's fused step constants (4·D² numbers per
            layer, counted by :func:`~primal_attention.hf.cache_nbytes`) in the cache while generating.
            Off by default: inside HF ``generate`` it gained 1.2× tokens/s at GPT-2-small shape
            (docs/results/decode_memory.md) for 108 MiB of cache.

    Returns:
        the same model, with ``model.config.primal_attention`` recording the call (saved by
        ``save_pretrained``; :func:`from_pretrained` replays it).

    Raises:
        ValueError: unsupported architecture (the message lists the supported ones), a layer index
            out of range or already primal, an unknown init or option.
    """
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"primalize: expected a transformers PreTrainedModel, got {type(model).__name__}")
    if init not in INITS:
        raise ValueError(f"primalize: init must be one of {INITS}, got {init!r}")
    fixed = [k for k in _FIXED if k in primal_options]
    if fixed:
        raise ValueError(f"primalize: {fixed} come from the model's config and cannot be set")
    config = model.config
    family = family_of(config)
    slots = _attention_slots(model, family)
    count = int(config.num_hidden_layers)
    if len(slots) != count:
        raise ValueError(f"primalize: found {len(slots)} self-attention modules for num_hidden_layers={count}")
    chosen = _resolve_layers(layers, count)
    for i in chosen:
        if isinstance(slots[i][1], PrimalSelfAttention):
            raise ValueError(f"primalize: layer {i} is already primal")

    for i in chosen:
        name, old = slots[i]
        settings = family.settings(config, old, i)
        options = {**settings.defaults, **primal_options}
        primal = PrimalAttention(settings.embed_dim, settings.num_heads, causal=settings.causal, **options)
        weight = next(old.parameters())
        primal.to(device=weight.device, dtype=weight.dtype)
        if init == "from_softmax":
            copy_projections(family.projections(old, config), primal)
        layer_idx = getattr(old, "layer_idx", None)
        wrapper = PrimalSelfAttention(primal, layer_idx=i if layer_idx is None else int(layer_idx),
                                      rotary=settings.rotary, resid_dropout=settings.resid_dropout,
                                      decode_plan=decode_plan)
        wrapper.train(old.training)
        parent_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_name), attr, wrapper)

    records = list(getattr(config, CONFIG_KEY, None) or [])
    records.append({"layers": chosen, "options": dict(primal_options), **({"decode_plan": True} if decode_plan else {})})
    setattr(config, CONFIG_KEY, records)
    _install_hooks(model)
    return model


def primal_settings(model_or_config: PreTrainedModel | Any) -> list[dict[str, Any]]:
    """Every primalize call recorded on a model or config: [{"layers": [...], "options": {...}}, ...]."""
    config = getattr(model_or_config, "config", model_or_config)
    return list(getattr(config, CONFIG_KEY, None) or [])


def _load_weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    single = path / "model.safetensors"
    if single.is_file():
        return load_file(single)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        state: dict[str, torch.Tensor] = {}
        for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
            state.update(load_file(path / shard))
        return state
    raise FileNotFoundError(f"from_pretrained: no model.safetensors (or its index) in {path}")


def from_pretrained(model_class: type[M], path: str | Path, **config_overrides: Any) -> M:
    """Rebuild a model saved with ``save_pretrained`` after :func:`primalize`, weights included.

    Builds ``model_class`` from the saved config, replays the recorded primalize calls and loads
    the saved weights (in their saved dtype), then returns the model in eval mode, as HF's
    ``from_pretrained`` does. ``model_class.from_pretrained`` itself would rebuild softmax layers
    and drop the primal weights.

    Raises:
        ValueError: the saved config records no primalize call, or the weights do not match.
    """
    path = Path(path)
    config = AutoConfig.from_pretrained(path, **config_overrides)
    records = primal_settings(config)
    if not records:
        raise ValueError(f"from_pretrained: {path} holds no primal model (no '{CONFIG_KEY}' in config.json); "
                         "load it with the model class's own from_pretrained")
    setattr(config, CONFIG_KEY, [])
    state = _load_weights(path)
    dtype = next((t.dtype for t in state.values() if t.is_floating_point()), None)
    model = model_class(config)
    for record in records:
        primalize(model, layers=record["layers"], init="random", decode_plan=bool(record.get("decode_plan", False)),
                  **record["options"])
    if dtype is not None:
        model.to(dtype)
    missing, unexpected = model.load_state_dict(state, strict=False)
    # Tied parameters (an LM head sharing the input embedding) are saved once, under one name.
    names_of: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(p), []).append(name)
    loaded = set(state)
    untied = [k for k in missing
              if not any(alias in loaded for alias in names_of.get(id(_get(model, k)), []))]
    if untied or unexpected:
        raise ValueError(f"from_pretrained: weights in {path} do not match the primal model: missing {untied}, "
                         f"unexpected {list(unexpected)}")
    return model.eval()


def _get(model: nn.Module, name: str) -> Any:
    module_name, _, attr = name.rpartition(".")
    return getattr(model.get_submodule(module_name), attr)
