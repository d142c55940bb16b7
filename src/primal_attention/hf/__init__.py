"""Primal-Attention inside Hugging Face ``transformers`` models (docs/hf.md).

Needs the ``hf`` extra (``pip install 'primal-attention[hf]'``); ``import primal_attention`` does not.

    from primal_attention import hf
    model = hf.primalize(GPT2LMHeadModel(config), layers=[-1], rank=16)
    trainer = hf.PrimalTrainer(model=model, args=args, train_dataset=ds, ksvd_eta=0.1)
    model.generate(ids, use_cache=True)           # primal layers decode with an O(1) state
    model.save_pretrained(d); AutoModelForCausalLM.from_pretrained(d)   # or hf.from_pretrained(GPT2LMHeadModel, d)
"""

try:
    import transformers  # noqa: F401
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError("primal_attention.hf needs transformers: pip install 'primal-attention[hf]'") from error

from primal_attention.hf.architectures import ARCHITECTURES, Architecture, register_architecture, supported_model_types
from primal_attention.hf.attention import PrimalSelfAttention, padding_mask
from primal_attention.hf.auto import register_auto_classes
from primal_attention.hf.cache import PrimalCacheLayer, cache_nbytes
from primal_attention.hf.primalize import PEFT_MODULES_TO_SAVE, from_pretrained, primal_settings, primalize
from primal_attention.hf.trainer import KSVDLossFunc, PrimalTrainer

register_auto_classes()

__all__ = [
    "ARCHITECTURES",
    "Architecture",
    "KSVDLossFunc",
    "PEFT_MODULES_TO_SAVE",
    "PrimalCacheLayer",
    "PrimalSelfAttention",
    "PrimalTrainer",
    "cache_nbytes",
    "from_pretrained",
    "padding_mask",
    "primal_settings",
    "primalize",
    "register_architecture",
    "supported_model_types",
]
