"""Primal-Attention: self-attention through asymmetric kernel SVD in the primal (NeurIPS 2023).

The public API is small::

    from primal_attention import PrimalAttention, ksvd_terms
    attn = PrimalAttention(embed_dim=64, num_heads=2, rank=20)
    y = attn(x, mask)                  # x (B, N, 64), mask (B, N) bool
    with ksvd_terms(model) as terms:   # every primal forward in here: its KSVD term
        loss = task_loss(model(x), y) + eta * terms.loss()
    # (or, without a scope: loss = task_loss + eta * ksvd_loss(model))
    sol = layer_ksvd(attn, x, mask)    # the exact KSVD solution of its kernel (docs/method.md §7)
"""

from primal_attention.layers import (
    MaterializedSoftmaxAttention,
    PrimalAttention,
    PrimalState,
    SoftmaxAttention,
    attention_names,
    build_attention,
    register_attention,
)
from primal_attention.ksvd import (
    KSVDTerms,
    ksvd_distances,
    ksvd_loss,
    ksvd_objectives,
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
    "attention_names",
    "build_attention",
    "deit_small",
    "deit_tiny",
    "hybrid_pattern",
    "ksvd_distances",
    "ksvd_loss",
    "ksvd_objectives",
    "ksvd_terms",
    "layer_ksvd",
    "primal_layers",
    "register_attention",
    "vit_cpu",
]
