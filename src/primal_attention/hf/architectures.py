"""The Hugging Face architectures that :func:`primal_attention.hf.primalize` knows, registered once.

An architecture says which module is a layer's self-attention, how the model's config maps to
:class:`~primal_attention.PrimalAttention` options (width, heads, dropout, bias, causal, RoPE) and
which weights of the replaced module map onto the primal layer. Adding an architecture is one subclass of
:class:`Architecture` and one ``@register_architecture`` line; nothing else asks which architecture a model is.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from transformers import PretrainedConfig

#: HF's ``apply_rotary_pos_emb(q, k, cos, sin)`` of an architecture: q, k (B, H, N, d) -> rotated q, k.
RotaryFn = Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]


@dataclass
class Projections:
    """The replaced layer's weights in ``nn.Linear`` convention (out, in): q, k (D, D), out (D, D).

    out is None where the model keeps its own output projection outside the replaced module
    (BERT, RoBERTa): the primal ``out_proj`` then starts as the identity.
    """

    q_weight: Tensor
    q_bias: Tensor | None
    k_weight: Tensor
    k_bias: Tensor | None
    out_weight: Tensor | None
    out_bias: Tensor | None
    #: the value projection (D, D), copied into a window + primal layer's ``v_proj`` (None: not copied).
    v_weight: Tensor | None = None
    v_bias: Tensor | None = None


@dataclass
class LayerSettings:
    """What the config fixes for a primal layer, and the defaults the user may override."""

    embed_dim: int
    num_heads: int
    causal: bool
    defaults: dict[str, Any]
    #: dropout after the output projection, inside the replaced module (GPT-2's ``resid_dropout``).
    resid_dropout: float = 0.0
    rotary: RotaryFn | None = None


class Architecture(ABC):
    """One HF model architecture. Subclasses set the class attributes and implement the two methods."""

    #: ``config.model_type`` values this architecture handles.
    model_types: tuple[str, ...] = ()
    #: whether the architecture is a decoder whose causal-LM head ``primal train`` can build (model.hf).
    causal_lm: bool = False
    #: module and class name of the self-attention the architecture replaces.
    module: str = ""
    attention_class: str = ""

    def attention_type(self) -> type[nn.Module]:
        return getattr(importlib.import_module(self.module), self.attention_class)

    def is_self_attention(self, module: nn.Module) -> bool:
        """True for the self-attention modules to replace (not cross-attention)."""
        return isinstance(module, self.attention_type())

    @abstractmethod
    def settings(self, config: PretrainedConfig, attention: nn.Module, layer: int) -> LayerSettings:
        """Width, heads, causality, RoPE and option defaults of layer ``layer``'s primal replacement."""

    @abstractmethod
    def projections(self, attention: nn.Module, config: PretrainedConfig) -> Projections:
        """The replaced module's q, k and output projections, in ``nn.Linear`` convention."""


ARCHITECTURES: dict[str, Architecture] = {}
#: a saved primal model's ``model_type`` is this prefix + its architecture's (``primal_gpt2``).
PRIMAL_TYPE_PREFIX = "primal_"


def register_architecture(name: str) -> Callable[[type[Architecture]], type[Architecture]]:
    """Class decorator: make a :class:`Architecture` known to :func:`primalize` under ``name``."""

    def add(cls: type[Architecture]) -> type[Architecture]:
        ARCHITECTURES[name] = cls()
        return cls

    return add


def supported_model_types() -> list[str]:
    return sorted(t for architecture in ARCHITECTURES.values() for t in architecture.model_types)


def architecture_of(config: PretrainedConfig) -> Architecture:
    """The architecture of a model's config (a primal config's ``primal_<type>`` counts as ``<type>``), or a
    ValueError that lists the supported model types."""
    model_type = getattr(config, "model_type", None)
    if isinstance(model_type, str):
        model_type = model_type.removeprefix(PRIMAL_TYPE_PREFIX)
    for architecture in ARCHITECTURES.values():
        if model_type in architecture.model_types:
            return architecture
    raise ValueError(
        f"primalize: unsupported architecture {model_type!r} ({type(config).__name__}); supported model types: "
        f"{', '.join(supported_model_types())}"
    )


def _heads(config: PretrainedConfig) -> tuple[int, int]:
    dim, heads = int(config.hidden_size), int(config.num_attention_heads)
    head_dim = getattr(config, "head_dim", None)
    if head_dim is not None and head_dim * heads != dim:
        raise ValueError(
            f"primalize: the primal layer needs head_dim * num_attention_heads == hidden_size, got "
            f"{head_dim} * {heads} != {dim}"
        )
    return dim, heads


def _rotary(module_name: str) -> RotaryFn:
    return importlib.import_module(module_name).apply_rotary_pos_emb


@register_architecture("gpt2")
class GPT2Architecture(Architecture):
    """GPT-2: ``GPT2Attention`` with a fused ``c_attn`` Conv1D (x @ W, W of shape (D, 3D))."""

    model_types = ("gpt2",)
    causal_lm = True
    module = "transformers.models.gpt2.modeling_gpt2"
    attention_class = "GPT2Attention"

    def is_self_attention(self, module: nn.Module) -> bool:
        return super().is_self_attention(module) and not module.is_cross_attention

    def settings(self, config: PretrainedConfig, attention: nn.Module, layer: int) -> LayerSettings:
        dim, heads = _heads(config)
        return LayerSettings(dim, heads, causal=True, resid_dropout=float(config.resid_pdrop),
                             defaults={"dropout": float(config.attn_pdrop), "bias": True, "sampling": "valid"})

    def projections(self, attention: nn.Module, config: PretrainedConfig) -> Projections:
        dim = attention.embed_dim
        w, b = attention.c_attn.weight, attention.c_attn.bias  # (D, 3D), (3D,): columns q | k | v
        return Projections(w[:, :dim].T, b[:dim], w[:, dim:2 * dim].T, b[dim:2 * dim],
                           attention.c_proj.weight.T, attention.c_proj.bias, w[:, 2 * dim:].T, b[2 * dim:])


class _RotaryDecoder(Architecture):
    """Llama-style decoders: q/k/v/o Linear layers, RoPE on q and k, grouped key/value heads."""

    causal_lm = True

    def settings(self, config: PretrainedConfig, attention: nn.Module, layer: int) -> LayerSettings:
        dim, heads = _heads(config)
        return LayerSettings(dim, heads, causal=True, rotary=_rotary(self.module),
                             defaults={"dropout": float(config.attention_dropout),
                                       "bias": attention.q_proj.bias is not None, "sampling": "valid"})

    def projections(self, attention: nn.Module, config: PretrainedConfig) -> Projections:
        groups = config.num_attention_heads // config.num_key_value_heads
        head_dim = attention.head_dim

        def expand(t: Tensor | None) -> Tensor | None:
            # Key/value head j serves query heads j*groups .. (j+1)*groups - 1 (HF's repeat_kv).
            if t is None or groups == 1:
                return t
            return t.view(config.num_key_value_heads, head_dim, *t.shape[1:]).repeat_interleave(groups, dim=0) \
                .reshape(-1, *t.shape[1:])

        return Projections(attention.q_proj.weight, attention.q_proj.bias, expand(attention.k_proj.weight),
                           expand(attention.k_proj.bias), attention.o_proj.weight, attention.o_proj.bias,
                           expand(attention.v_proj.weight), expand(attention.v_proj.bias))


@register_architecture("llama")
class LlamaArchitecture(_RotaryDecoder):
    model_types = ("llama",)
    module = "transformers.models.llama.modeling_llama"
    attention_class = "LlamaAttention"


@register_architecture("qwen2")
class Qwen2Architecture(_RotaryDecoder):
    """Qwen2: Llama's layout with q/k/v biases and optional sliding-window layers (not supported)."""

    model_types = ("qwen2",)
    module = "transformers.models.qwen2.modeling_qwen2"
    attention_class = "Qwen2Attention"

    def settings(self, config: PretrainedConfig, attention: nn.Module, layer: int) -> LayerSettings:
        kind = (getattr(config, "layer_types", None) or ["full_attention"] * (layer + 1))[layer]
        if kind != "full_attention":
            raise ValueError(f"primalize: layer {layer} of this Qwen2 model is {kind!r}; only full-attention "
                             "layers can be made primal (the primal layer has no sliding window)")
        return super().settings(config, attention, layer)


@register_architecture("bert")
class BertArchitecture(Architecture):
    """BERT encoders: ``BertSelfAttention`` (query/key/value); the output dense stays in ``BertSelfOutput``."""

    model_types = ("bert",)
    module = "transformers.models.bert.modeling_bert"
    attention_class = "BertSelfAttention"

    def settings(self, config: PretrainedConfig, attention: nn.Module, layer: int) -> LayerSettings:
        if getattr(config, "is_decoder", False):
            raise ValueError(f"primalize: {config.model_type} as a decoder (is_decoder=True) is not supported; "
                             "primal layers replace the self-attention of encoders")
        dim, heads = _heads(config)
        return LayerSettings(dim, heads, causal=False, defaults={
            "dropout": float(config.attention_probs_dropout_prob), "bias": True, "sampling": "valid",
            "max_seq_len": int(config.max_position_embeddings)})

    def projections(self, attention: nn.Module, config: PretrainedConfig) -> Projections:
        return Projections(attention.query.weight, attention.query.bias, attention.key.weight, attention.key.bias,
                           None, None, attention.value.weight, attention.value.bias)


@register_architecture("roberta")
class RobertaArchitecture(BertArchitecture):
    model_types = ("roberta",)
    module = "transformers.models.roberta.modeling_roberta"
    attention_class = "RobertaSelfAttention"


@register_architecture("vit")
class ViTArchitecture(Architecture):
    """ViT: ``ViTAttention`` (q/k/v/o Linear layers), every patch token plus [CLS], no padding."""

    model_types = ("vit",)
    module = "transformers.models.vit.modeling_vit"
    attention_class = "ViTAttention"

    def settings(self, config: PretrainedConfig, attention: nn.Module, layer: int) -> LayerSettings:
        dim, heads = _heads(config)
        tokens = (config.image_size // config.patch_size) ** 2 + 1
        return LayerSettings(dim, heads, causal=False, defaults={
            "dropout": float(config.attention_probs_dropout_prob), "bias": bool(config.qkv_bias),
            "sampling": "valid", "max_seq_len": int(tokens)})

    def projections(self, attention: nn.Module, config: PretrainedConfig) -> Projections:
        return Projections(attention.q_proj.weight, attention.q_proj.bias, attention.k_proj.weight,
                           attention.k_proj.bias, attention.o_proj.weight, attention.o_proj.bias,
                           attention.v_proj.weight, attention.v_proj.bias)


@torch.no_grad()
def copy_projections(source: Projections, primal: nn.Module) -> None:
    """Load q, k and the output projection of the replaced layer into a PrimalAttention (and the value
    projection into a :class:`~primal_attention.WindowPrimalAttention`'s window).

    Biases the source lacks are zeroed; biases the primal layer lacks are dropped. Without a source
    output projection the primal ``out_proj`` becomes the identity.
    """
    pairs = [(primal.q_proj, source.q_weight, source.q_bias), (primal.k_proj, source.k_weight, source.k_bias)]
    if hasattr(primal, "v_proj") and source.v_weight is not None:
        pairs.append((primal.v_proj, source.v_weight, source.v_bias))
    if source.out_weight is None:
        pairs.append((primal.out_proj, torch.eye(primal.embed_dim), None))
    else:
        pairs.append((primal.out_proj, source.out_weight, source.out_bias))
    for linear, weight, bias in pairs:
        if tuple(weight.shape) != tuple(linear.weight.shape):
            raise ValueError(f"primalize: cannot copy a weight of shape {tuple(weight.shape)} into "
                             f"{tuple(linear.weight.shape)}")
        linear.weight.copy_(weight)
        if linear.bias is not None:
            linear.bias.copy_(bias if bias is not None else torch.zeros_like(linear.bias))
