"""Swap Primal-Attention into a Hugging Face model, and load such a model back from disk."""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn
from transformers import AutoConfig, PreTrainedModel

from primal_attention.hf.attention import OUTPUT_ATTENTIONS_ERROR, PrimalSelfAttention
from primal_attention.hf.architectures import Architecture, architecture_of, copy_projections
from primal_attention.hf.primal_config import mark_primal
from primal_attention.layers.primal import PrimalAttention, is_collected
from primal_attention.layers.window import WindowPrimalAttention

#: the config attribute (and config.json key) that records every primalize call of a model.
CONFIG_KEY = "primal_attention"
INITS = ("from_softmax", "random")
#: PEFT's ``modules_to_save`` for a primalized model: each primal layer (``PrimalSelfAttention.primal``:
#: Λ, W_e, W_r and its projections), which has no pretrained counterpart and trains whole beside the
#: adapters: ``LoraConfig(target_modules=[...], modules_to_save=hf.PEFT_MODULES_TO_SAVE)``.
PEFT_MODULES_TO_SAVE = ["primal"]
#: options fixed by the model's config, not by the caller.
_FIXED = ("embed_dim", "num_heads", "causal")
#: the options of a local-window + primal layer (:class:`~primal_attention.WindowPrimalAttention`):
#: ``window=w`` makes every chosen layer one; ``gate_init`` needs it.
_WINDOW_OPTIONS = ("window", "gate_init")

M = TypeVar("M", bound=PreTrainedModel)


def _attention_slots(model: nn.Module, architecture: Architecture) -> list[tuple[str, nn.Module]]:
    """(qualified name, module) of every layer's self-attention, in layer order (primal or not)."""
    return [(name, m) for name, m in model.named_modules()
            if isinstance(m, PrimalSelfAttention) or architecture.is_self_attention(m)]


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


def _primal_option_names() -> list[str]:
    """The keyword options of PrimalAttention a caller may give (not those the config fixes)."""
    import inspect

    params = inspect.signature(PrimalAttention.__init__).parameters
    return sorted([k for k, p in params.items() if k not in ("self", "embed_dim", "num_heads", *_FIXED)
                   and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)] + list(_WINDOW_OPTIONS))


def _resolved_options(options: dict[str, Any]) -> dict[str, Any]:
    """Every PrimalAttention option a layer was built with: the given ones and today's defaults (JSON values)."""
    import inspect

    params = inspect.signature(PrimalAttention.__init__).parameters
    out = {k: params[k].default for k in _primal_option_names() if k in params}
    if options.get("window") is not None:
        out["gate_init"] = inspect.signature(WindowPrimalAttention.__init__).parameters["gate_init"].default
    out.update(options)
    return {k: v for k, v in out.items() if v is None or isinstance(v, (bool, int, float, str))}


def _refuse_output_attentions(module: nn.Module, args: tuple, kwargs: dict) -> None:
    """Forward pre-hook: a clear error instead of an ``attentions`` output that silently skips primal layers."""
    if kwargs.get("output_attentions") or getattr(module.config, "output_attentions", False):
        raise ValueError(OUTPUT_ATTENTIONS_ERROR)


#: the message of a training forward whose primal layers' KSVD terms no collector takes.
NO_KSVD_WARNING = ("primal_attention.hf: primal layers are training without their KSVD term (no ksvd_terms collector "
                   "is open: a plain transformers.Trainer?); pass compute_loss_func=hf.KSVDLossFunc(model, eta) to the "
                   "Trainer, use hf.PrimalTrainer, or collect with primal_attention.ksvd_terms(model)")


def _warn_without_ksvd(module: nn.Module, args: tuple, kwargs: dict) -> None:
    """Forward pre-hook: warn once per model when it trains with gradients and no collector takes its terms."""
    if getattr(module, "_primal_ksvd_warned", False) or not (module.training and torch.is_grad_enabled()):
        return
    layers = [m for m in module.modules() if isinstance(m, PrimalAttention)]
    if layers and not any(is_collected(layer) for layer in layers):
        warnings.warn(NO_KSVD_WARNING, UserWarning, stacklevel=3)
        module._primal_ksvd_warned = True


def _install_hooks(model: PreTrainedModel) -> None:
    for module in {id(m): m for m in (model, model.base_model)}.values():
        if not getattr(module, "_primal_attention_hook", False):
            module.register_forward_pre_hook(_refuse_output_attentions, with_kwargs=True)
            module._primal_attention_hook = True
    if not getattr(model, "_primal_ksvd_hook", False):
        model.register_forward_pre_hook(_warn_without_ksvd, with_kwargs=True)
        model._primal_ksvd_hook = True


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
            ``dropout``, ``max_seq_len``). ``window=w`` (and optionally ``gate_init``) makes each
            chosen layer a :class:`~primal_attention.WindowPrimalAttention`: softmax over the w nearest
            tokens beside the primal term, gated per head; ``from_softmax`` then also copies the value
            projection into the window, so with the gate open and N ≤ w it is the layer it replaced. Width, heads and causality come from the config; decoders get
            the causal variant. Defaults: dropout (the config's attention dropout), bias (the query
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
    allowed = _primal_option_names()
    unknown = sorted(set(primal_options) - set(allowed))
    if unknown:
        raise ValueError(f"primalize: unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; expected "
                         f"one of {', '.join(allowed)}")
    window = primal_options.get("window")
    if window is None and "gate_init" in primal_options:
        raise ValueError("primalize: gate_init belongs to window layers; give window=w too")
    config = model.config
    architecture = architecture_of(config)
    slots = _attention_slots(model, architecture)
    count = int(config.num_hidden_layers)
    if len(slots) != count:
        raise ValueError(f"primalize: found {len(slots)} self-attention modules for num_hidden_layers={count}")
    chosen = _resolve_layers(layers, count)
    already = {i for i, (_, module) in enumerate(slots) if isinstance(module, PrimalSelfAttention)}
    for i in chosen:
        if i in already:
            raise ValueError(f"primalize: layer {i} is already primal")

    resolved: dict[str, dict[str, Any]] = {}
    for i in chosen:
        name, old = slots[i]
        settings = architecture.settings(config, old, i)
        options = {**settings.defaults, **primal_options}
        if settings.rotary is not None and options.get("impl") == "reference":
            raise ValueError("primalize: impl='reference' has no qk_transform, and this model applies RoPE; "
                             "use impl='fast' (the default)")
        resolved[str(i)] = _resolved_options(options)
        if options.get("window") is None:
            options.pop("window", None)
            options.pop("gate_init", None)
            primal = PrimalAttention(settings.embed_dim, settings.num_heads, causal=settings.causal, **options)
        else:
            primal = WindowPrimalAttention(settings.embed_dim, settings.num_heads, causal=settings.causal, **options)
        weight = next(old.parameters())
        primal.to(device=weight.device, dtype=weight.dtype)
        if init == "from_softmax":
            copy_projections(architecture.projections(old, config), primal)
        layer_idx = getattr(old, "layer_idx", None)
        wrapper = PrimalSelfAttention(primal, layer_idx=i if layer_idx is None else int(layer_idx),
                                      rotary=settings.rotary, resid_dropout=settings.resid_dropout,
                                      decode_plan=decode_plan)
        wrapper.train(old.training)
        parent_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_name), attr, wrapper)

    wrappers = [m for _, m in _attention_slots(model, architecture) if isinstance(m, PrimalSelfAttention)]
    for wrapper in wrappers:
        wrapper.model_all_primal = len(wrappers) == count
    records = _live_records(list(getattr(config, CONFIG_KEY, None) or []), already)
    records.append({"layers": chosen, "options": dict(primal_options), "resolved": resolved,
                    **({"decode_plan": True} if decode_plan else {})})
    setattr(config, CONFIG_KEY, records)
    mark_primal(config)
    _install_hooks(model)
    return model


def _check_records(records: list[Any], where: str) -> None:
    for i, record in enumerate(records):
        if not isinstance(record, dict) or not isinstance(record.get("layers"), list) \
                or not isinstance(record.get("options", {}), dict):
            raise ValueError(f"{where}: record {i} of '{CONFIG_KEY}' is malformed "
                             f"(expected {{'layers': [...], 'options': {{...}}}}), got {record!r}")


def replay_records(model: PreTrainedModel) -> None:
    """Primalize ``model`` (``init="random"``) as its config's record says; the record stays as it came.

    What :func:`from_pretrained` and the Auto classes' primal model classes run before loading weights.
    """
    records = primal_settings(model.config)
    _check_records(records, f"{type(model).__name__}: its config")
    setattr(model.config, CONFIG_KEY, [])
    for record in records:
        plan = bool(record.get("decode_plan", False))
        resolved = record.get("resolved")
        if isinstance(resolved, dict) and resolved:  # every option as built: today's defaults do not matter
            for layer, options in resolved.items():
                primalize(model, layers=[int(layer)], init="random", decode_plan=plan, **options)
        else:
            primalize(model, layers=record["layers"], init="random", decode_plan=plan, **record.get("options", {}))
    setattr(model.config, CONFIG_KEY, records)  # the calls as they were recorded, saved again as they came


def _live_records(records: list[Any], primal_layers: set[int]) -> list[dict[str, Any]]:
    """The records' layers that are primal in the model now (a config copied from a primal checkpoint onto
    a softmax model records layers the model does not have)."""
    live = []
    for record in records:
        if not isinstance(record, dict) or not isinstance(record.get("layers"), list):
            continue
        layers = [i for i in record["layers"] if isinstance(i, int) and i in primal_layers]
        if not layers:
            continue
        kept = {**record, "layers": layers}
        if isinstance(record.get("resolved"), dict):
            kept["resolved"] = {k: v for k, v in record["resolved"].items() if k.lstrip("-").isdigit()
                                and int(k) in primal_layers}
        live.append(kept)
    return live


def primal_settings(model_or_config: PreTrainedModel | Any) -> list[dict[str, Any]]:
    """Every primalize call recorded on a model or config: [{"layers": [...], "options": {...}}, ...]."""
    config = getattr(model_or_config, "config", model_or_config)
    return list(getattr(config, CONFIG_KEY, None) or [])


def _load_file(file: Path) -> dict[str, torch.Tensor]:
    """One safetensors file; a truncated or foreign file is a ValueError naming it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(file)
    except (SafetensorError, OSError) as err:
        raise ValueError(f"from_pretrained: {file} is not a readable safetensors file ({err})") from None


def _load_weights(path: Path) -> dict[str, torch.Tensor]:
    single = path / "model.safetensors"
    if single.is_file():
        return _load_file(single)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        state: dict[str, torch.Tensor] = {}
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"from_pretrained: {index} is not a safetensors index ({err})") from None
        root = path.resolve()
        for shard in shards:
            file = (path / str(shard)).resolve()
            if root not in file.parents:  # an index naming ../ or an absolute path
                raise ValueError(f"from_pretrained: {index} names a shard outside {path}: {shard!r}")
            state.update(_load_file(file))
        return state
    raise FileNotFoundError(f"from_pretrained: no model.safetensors (or its index) in {path}")


def from_pretrained(model_class: type[M], path: str | Path, *, dtype: torch.dtype | str | None = None,
                    torch_dtype: torch.dtype | str | None = None, device_map: Any = None,
                    **config_overrides: Any) -> M:
    """Rebuild a model saved with ``save_pretrained`` after :func:`primalize`, weights included.

    Builds ``model_class`` from the saved config, replays the recorded primalize calls and loads
    the saved weights, then returns the model in eval mode, as HF's ``from_pretrained`` does.
    ``model_class.from_pretrained`` itself would rebuild softmax layers and drop the primal weights.

    dtype (or HF's older name ``torch_dtype``): the weights' dtype, a ``torch.dtype``, its name
    (``"bfloat16"``) or ``"auto"`` (the saved dtype; also the default). device_map: a device (``"cpu"``,
    ``"cuda:0"``, a ``torch.device``) or ``{"": device}``, where the whole model goes; per-module maps
    are refused (a primal model is placed whole). Other keywords override config fields.

    Raises:
        ValueError: the saved config records no primalize call, the weights do not match, an unknown
            dtype or a per-module device_map; TypeError: ``model_class`` is not a transformers model class.
    """
    if not (isinstance(model_class, type) and issubclass(model_class, PreTrainedModel)):
        raise TypeError(f"from_pretrained: expected a transformers model class (e.g. GPT2LMHeadModel), got {model_class!r}")
    if dtype is not None and torch_dtype is not None and dtype != torch_dtype:
        raise ValueError(f"from_pretrained: dtype={dtype!r} and torch_dtype={torch_dtype!r} disagree; give one")
    wanted = _resolve_dtype(dtype if dtype is not None else torch_dtype)
    device = _resolve_device(device_map)
    path = Path(path)
    config = AutoConfig.from_pretrained(path, **config_overrides)
    records = primal_settings(config)
    if not records:
        raise ValueError(f"from_pretrained: {path} holds no primal model (no '{CONFIG_KEY}' in config.json); "
                         "load it with the model class's own from_pretrained")
    architecture_config_class = getattr(model_class, "config_class", None)
    if architecture_config_class is not None and not isinstance(config, architecture_config_class):
        raise TypeError(f"from_pretrained: {path} holds a {type(config).__name__} model, not one of "
                        f"{model_class.__name__} ({architecture_config_class.__name__})")
    _check_records(records, f"from_pretrained: {path}/config.json")
    state = _load_weights(path)
    saved = next((t.dtype for t in state.values() if t.is_floating_point()), None)
    model = model_class(config)
    if not any(isinstance(m, PrimalSelfAttention) for m in model.modules()):  # the primal classes replay themselves
        replay_records(model)
    target = wanted if wanted is not None else saved
    if target is not None:
        model.to(target)
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
    if device is not None:
        model.to(device)
    return model.eval()


def _resolve_dtype(value: torch.dtype | str | None) -> torch.dtype | None:
    """None / "auto" -> None (the saved dtype); a torch.dtype or its name -> that dtype."""
    if value is None or value == "auto":
        return None
    if isinstance(value, torch.dtype):
        return value
    found = getattr(torch, str(value), None)
    if not isinstance(found, torch.dtype) or not found.is_floating_point:
        raise ValueError(f"from_pretrained: dtype must be a floating torch.dtype, its name or 'auto', got {value!r}")
    return found


def _resolve_device(device_map: Any) -> torch.device | None:
    """A whole-model device from ``device_map`` ("cpu", "cuda:0", a device, an int, {"": device}), or None."""
    if device_map is None:
        return None
    if isinstance(device_map, dict):
        if set(device_map) != {""}:
            raise ValueError("from_pretrained: a per-module device_map is not supported for primal models; give one "
                             "device (e.g. device_map='cuda:0' or {'': 0})")
        device_map = device_map[""]
    if device_map == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device_map)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"from_pretrained: device_map {device_map!r} is not a device ({err})") from None


def _get(model: nn.Module, name: str) -> Any:
    module_name, _, attr = name.rpartition(".")
    return getattr(model.get_submodule(module_name), attr)
