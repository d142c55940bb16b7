"""Primal-Attention: self-attention through asymmetric kernel SVD in the primal (NeurIPS 2023).

The public API is small::

    from primal_attention import PrimalAttention, ksvd_terms
    attn = PrimalAttention(embed_dim=64, num_heads=2, rank=20)
    y = attn(x, mask)                  # x (B, N, 64), mask (B, N) bool
    with ksvd_terms(model) as terms:   # every primal forward in here: its KSVD term
        loss = task_loss(model(x), y) + eta * terms.loss()
    terms = ksvd_terms(model)          # or as a handle, for loops that cannot use `with` ... terms.close()
    sol = layer_ksvd(attn, x, mask)    # the exact KSVD solution of its kernel (docs/method.md §7)
"""

from primal_attention.layers import (
    DecodeCache,
    MaterializedSoftmaxAttention,
    PrimalAttention,
    PrimalState,
    SoftmaxAttention,
    WindowPrimalAttention,
    attention_names,
    build_attention,
    register_attention,
)
from primal_attention.ksvd import (
    KSVDTerms,
    ksvd_distances,
    ksvd_terms,
    layer_ksvd,
    primal_layers,
)
from primal_attention.models.classifier import ClassifierConfig, SequenceClassifier
from primal_attention.models.decision import DecisionTransformer, DecisionTransformerConfig
from primal_attention.models.lm import CausalLM, CausalLMConfig
from primal_attention.models.transformer import TransformerBlock, TransformerStack, hybrid_pattern
from primal_attention.models.vision import VisionTransformer, ViTConfig, deit_small, deit_tiny, vit_cpu

__version__ = "0.1.0"

__all__ = [
    "CausalLM",
    "CausalLMConfig",
    "ClassifierConfig",
    "DecodeCache",
    "DecisionTransformer",
    "DecisionTransformerConfig",
    "KSVDTerms",
    "MaterializedSoftmaxAttention",
    "PrimalAttention",
    "PrimalState",
    "SequenceClassifier",
    "SoftmaxAttention",
    "TransformerBlock",
    "TransformerStack",
    "ViTConfig",
    "VisionTransformer",
    "WindowPrimalAttention",
    "attention_names",
    "build_attention",
    "deit_small",
    "deit_tiny",
    "hybrid_pattern",
    "ksvd_distances",
    "ksvd_terms",
    "layer_ksvd",
    "primal_layers",
    "register_attention",
    "vit_cpu",
]

#: names removed when the layers stopped keeping their KSVD terms, with what replaces them.
_REMOVED = {
    "ksvd_loss": "the layers keep no KSVD terms any more; collect them with `with primal_attention.ksvd_terms(model) "
                 "as terms: ... loss = task + eta * terms.loss()` (or `terms = ksvd_terms(model)` ... `terms.close()`)",
    "ksvd_objectives": "the layers keep no KSVD terms any more; use `with primal_attention.ksvd_terms(model, "
                       "inference=True) as terms: model(x)` then `terms.objectives()`",
}


def __getattr__(name: str) -> object:
    if name in _REMOVED:
        raise AttributeError(f"primal_attention.{name} was removed: {_REMOVED[name]}")
    raise AttributeError(f"module 'primal_attention' has no attribute {name!r}")
