"""The authors' PrimalFormer (their LRA code) as a benchmark method, built from an export of their repository.

It is not a dependency: the user points at a checkout or export of ``yingyichen-cyy/PrimalAttention``
(or its ``PrimalAttention_LRA/PrimalFormer`` folder) with ``primal bench --authors-repo PATH`` or the
environment variable :data:`ENV`; without one the ``authors`` method is reported as unavailable.

The method runs their modules unchanged on the benchmark's workloads, with the settings of their
ListOps script (``primal_cos``, s 20, m 10, η 0.1, ``--trace_no_x``):

* ``layer``: their ``Attention`` on x (B, N, D), loss = mean(out²) + η·J², J the KSVD objective of
  that layer computed the way their ``ModelForSC`` does (e and r scores scaled by diag(Λ) per
  sample, squared norms averaged, minus the trace of W_eᵀ W_r);
* ``train``: their ``ModelForSC`` (embeddings, 2 pre-norm layers, MEAN pooling, MLP head), the mean
  of their per-example loss (cross-entropy + η·KSVD), backward, AdamW (eps 1e-6);
* ``infer``: their model's forward under ``no_grad``.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

#: environment variable naming the authors' repository export (set by ``primal bench --authors-repo``).
ENV = "PRIMAL_AUTHORS_REPO"
#: their model's folder inside the repository.
SUBDIR = Path("PrimalAttention_LRA") / "PrimalFormer"


def authors_dir() -> Path | None:
    """The authors' PrimalFormer folder named by :data:`ENV`, or None when unset."""
    value = os.environ.get(ENV)
    if not value:
        return None
    root = Path(value).expanduser()
    return root / SUBDIR if (root / SUBDIR).is_dir() else root


def unavailable_reason() -> str | None:
    """None if the authors' code can be imported, else why not."""
    folder = authors_dir()
    if folder is None:
        return f"the authors' code is not given: pass --authors-repo PATH (an export of yingyichen-cyy/PrimalAttention) or set {ENV}"
    missing = [n for n in ("model_wrapper.py", "model.py", "attentions/attention.py", "attentions/attention_primal_cos.py")
               if not (folder / n).is_file()]
    if missing:
        return f"{folder} is not the authors' PrimalFormer folder (missing {', '.join(missing)})"
    try:
        _modules(folder)
    except Exception as err:  # noqa: BLE001 - their code failing to import makes the method unavailable
        return f"cannot import the authors' code from {folder}: {type(err).__name__}: {err}"
    return None


def _modules(folder: Path) -> tuple[ModuleType, ModuleType]:
    """Their ``model_wrapper`` and ``attention`` modules (their imports are relative to these folders)."""
    for path in (folder / "attentions", folder):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    return importlib.import_module("model_wrapper"), importlib.import_module("attention")


def model_config(seq_len: int, dim: int, heads: int, vocab_size: int, num_classes: int, eta: float) -> dict:
    """Their config dict for the benchmark's ListOps model (their lra_config + run_tasks settings)."""
    return {
        "mixed_precision": False, "learn_pos_emb": True, "tied_weights": False, "embedding_dim": dim,
        "transformer_dim": dim, "transformer_hidden_dim": 128, "head_dim": dim // heads, "num_head": heads,
        "num_layers": 2, "vocab_size": vocab_size, "max_seq_len": seq_len, "dropout_prob": 0.1,
        "attention_dropout": 0.1, "pooling_mode": "MEAN", "num_classes": num_classes, "attn_type": "primal_cos",
        "attention_grad_checkpointing": False, "low_rank": 20, "rank_multi": 10, "eta": eta, "trace_no_x": True,
    }


def layer_objective(scores: list[torch.Tensor], lam: torch.Tensor) -> torch.Tensor:
    """J of one of their layers from what it returns: scores = [e (B, H, N, s), r (B, H, N, s),
    W_e (H, n, s), W_r (H, n, s), ...], lam (H, s); their wrapper's formula (trace_no_x)."""
    e, r, we, wr = scores[:4]
    diag = torch.diag_embed(lam).unsqueeze(0).repeat(e.shape[0], 1, 1, 1)  # (B, H, s, s), as they form it
    escore = torch.einsum("...nd,...ds->...ns", e, diag).norm(dim=-1, p=2).square().mean() / 2
    rscore = torch.einsum("...nd,...ds->...ns", r, diag).norm(dim=-1, p=2).square().mean() / 2
    trace = torch.einsum("...ps,...pd->...sd", we, wr.type_as(we)).mean(dim=0).trace()
    return escore + rscore - trace


def build(level: str, *, seq_len: int, batch: int, dim: int, heads: int, vocab_size: int, num_classes: int,
          eta: float, device: torch.device, gen: torch.Generator) -> Callable[[], None]:
    """A zero-argument callable running one benchmark call of their code at ``level`` (fp32, eager)."""
    reason = unavailable_reason()
    if reason is not None:
        raise RuntimeError(reason)
    wrapper, attention = _modules(authors_dir())
    config = model_config(seq_len, dim, heads, vocab_size, num_classes, eta)
    mask = torch.ones(batch, seq_len, device=device)
    if level == "layer":
        layer = attention.Attention(config).to(device).train()
        x = torch.randn(batch, seq_len, dim, generator=gen).to(device).requires_grad_(True)

        def layer_step() -> None:
            x.grad = None
            layer.zero_grad(set_to_none=True)
            out, scores, lam = layer(x, mask)
            (out.square().mean() + eta * layer_objective(scores, lam).square()).backward()

        return layer_step
    model = wrapper.ModelForSC(config).to(device)
    tokens = torch.randint(1, vocab_size, (batch, seq_len), generator=gen).to(device)
    labels = torch.randint(0, num_classes, (batch,), generator=gen).to(device)
    if level == "infer":
        model.eval()

        def infer() -> None:
            with torch.no_grad():
                model(tokens, mask, labels)

        return infer
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, eps=1e-6, weight_decay=0.0)

    def train_step() -> None:
        opt.zero_grad(set_to_none=True)
        model(tokens, mask, labels)["loss"].mean().backward()
        opt.step()

    return train_step
