"""A Hugging Face causal LM as this package's trainer and ``primal generate`` use a :class:`~primal_attention.CausalLM`.

``primal train`` with ``model.hf`` (``data.family: lm``) builds one with :func:`build_hf_lm`: the
architecture from its config (random weights, no download), primalized in the layers ``kind`` names,
wrapped in :class:`HFCausalLM` so that the trainer's language-model task, KSVD term, checkpoints,
resume and DDP apply unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from transformers import CONFIG_MAPPING, AutoConfig, AutoModelForCausalLM, DynamicCache, PreTrainedModel

from primal_attention.hf.architectures import ARCHITECTURES
from primal_attention.hf.primalize import primalize
from primal_attention.models.lm import check_sampling, sample_token

#: the config fields ``build_hf_lm`` sets from the project's ``model:`` section and the data (HF's
#: generic names, which each supported architecture maps onto its own).
SET_FROM_MODEL = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size", "max_position_embeddings")
#: the layers ``primalize`` replaces for each model kind.
KIND_LAYERS: dict[str, str | list[int] | None] = {"primalformer": "all", "primal+": [-1], "transformer": None}


def causal_model_types() -> list[str]:
    """The HF model types :func:`build_hf_lm` builds: the supported families with causal attention."""
    return sorted(t for a in ARCHITECTURES.values() if a.causal_lm for t in a.model_types)


@dataclass(frozen=True)
class LMShape:
    """What the trainer and ``primal generate`` read of a language model's config."""

    vocab_size: int
    max_seq_len: int


class HFCausalLM(nn.Module):
    """An HF causal LM (``self.model``) with :class:`~primal_attention.CausalLM`'s calling convention:
    ``forward(x (B, N) int64, mask (B, N) bool | None) -> logits (B, N, V)`` and ``generate``."""

    def __init__(self, model: PreTrainedModel, max_seq_len: int) -> None:
        super().__init__()
        self.model = model
        self.config = LMShape(int(model.config.vocab_size), int(max_seq_len))

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        if x.dim() != 2 or x.dtype != torch.int64:
            raise ValueError(f"HFCausalLM: expected int64 tokens (B, N), got {tuple(x.shape)} {x.dtype}")
        if x.shape[1] > self.config.max_seq_len:
            raise ValueError(f"HFCausalLM: {x.shape[1]} tokens exceed the context of {self.config.max_seq_len}")
        attention_mask = None if mask is None else mask.to(torch.long)
        return self.model(input_ids=x, attention_mask=attention_mask, use_cache=False).logits

    @torch.no_grad()
    def generate(self, prompt: Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 generator: torch.Generator | None = None) -> Tensor:
        """Sample a continuation: prompt (B, N0) int64 -> (B, N0 + max_new_tokens), through HF's cache
        (primal layers keep their O(1) state in it), sampled as :meth:`CausalLM.generate` samples."""
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
            raise ValueError(f"HFCausalLM.generate: max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        if prompt.dim() != 2 or prompt.shape[1] == 0:
            raise ValueError(f"HFCausalLM.generate: expected an int64 prompt (B, N0 >= 1), got {tuple(prompt.shape)}")
        if prompt.shape[1] + max_new_tokens > self.config.max_seq_len:
            raise ValueError(f"HFCausalLM.generate: prompt length {prompt.shape[1]} + {max_new_tokens} new tokens "
                             f"exceeds the context of {self.config.max_seq_len}")
        check_sampling("HFCausalLM.generate", temperature, top_k)
        was = self.training
        self.eval()
        try:
            cache = DynamicCache(config=self.model.config)
            logits = self.model(input_ids=prompt, past_key_values=cache, use_cache=True).logits[:, -1]
            out = [prompt]
            for i in range(max_new_tokens):
                token = sample_token(logits, temperature, top_k, generator)
                out.append(token[:, None])
                if i + 1 < max_new_tokens:
                    logits = self.model(input_ids=token[:, None], past_key_values=cache, use_cache=True).logits[:, -1]
            return torch.cat(out, dim=1)
        finally:
            self.train(was)


def build_hf_lm(architecture: str, config: dict[str, Any], *, kind: str, layers: int, dim: int, num_heads: int,
                ffn_dim: int, vocab_size: int, max_seq_len: int, primal_options: dict[str, Any]) -> HFCausalLM:
    """An HF causal LM of ``architecture`` built from its config, primalized as ``kind`` says.

    Raises:
        ValueError: an architecture that is not a supported causal LM, ``config`` setting a field that
            comes from the ``model:`` section or the data, or a field the architecture's config rejects.
    """
    supported = causal_model_types()
    if architecture not in supported:
        raise ValueError(f"model.hf.architecture must be one of {', '.join(supported)}, got {architecture!r}")
    if kind not in KIND_LAYERS:
        raise ValueError(f"model.kind must be one of {', '.join(KIND_LAYERS)} with model.hf, got {kind!r}")
    config_class = CONFIG_MAPPING[architecture]
    own_names = {getattr(config_class, "attribute_map", {}).get(n, n) for n in SET_FROM_MODEL}  # GPT-2's n_layer, ...
    fixed = sorted(set(config) & (set(SET_FROM_MODEL) | own_names))
    if fixed:
        raise ValueError(f"model.hf.config: {', '.join(fixed)} come from model.layers / dim / num_heads and the data; "
                         "set them there")
    values: dict[str, Any] = dict(zip(SET_FROM_MODEL, (layers, dim, num_heads, vocab_size, max_seq_len), strict=True))
    defaults = config_class()  # which names this architecture's config has
    known = set(defaults.to_dict()) | set(getattr(config_class, "attribute_map", {}))
    unknown = sorted(set(config) - known)
    if unknown:
        raise ValueError(f"model.hf.config: {', '.join(unknown)} {'is not a field' if len(unknown) == 1 else 'are not fields'} "
                         f"of {config_class.__name__}")
    width = "intermediate_size" if hasattr(defaults, "intermediate_size") else "n_inner"
    if width not in config:
        values[width] = ffn_dim
    if hasattr(defaults, "num_key_value_heads") and "num_key_value_heads" not in config:
        values["num_key_value_heads"] = num_heads
    if hasattr(defaults, "head_dim") and "head_dim" not in config:
        values["head_dim"] = dim // num_heads
    try:
        hf_config = AutoConfig.for_model(architecture, **values, **config)
    except (TypeError, ValueError) as err:
        raise ValueError(f"model.hf.config: {err}") from None
    model = AutoModelForCausalLM.from_config(hf_config)
    chosen = KIND_LAYERS[kind]
    if chosen is not None:
        primalize(model, layers=chosen, **primal_options)
    return HFCausalLM(model, max_seq_len)
