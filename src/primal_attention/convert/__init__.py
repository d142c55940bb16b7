"""Convert a trained softmax model to Primal-Attention (docs/convert.md).

    from primal_attention.convert import ConvertOptions, convert_run, convert_hf
    report = convert_run("runs/lm/seed_0", "runs/lm_converted",
                         ConvertOptions(layers="all", transfer_steps=300, finetune_steps=300))
    report = convert_hf(GPT2LMHeadModel.from_pretrained(d), token_blocks, "runs/gpt2_primal",
                        ConvertOptions(layers="last", primal={"rank": 16}, transfer_steps=200))

A run's converted model is a run folder (``primal eval`` / ``primal generate`` take it); an HF model's
is ``out/model`` (``primal_attention.hf.from_pretrained(ModelClass, out / "model")``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from primal_attention.convert.pipeline import Conversion, ConvertOptions, Interrupted
from primal_attention.convert.subjects import ConvertError, HFSubject, RunSubject, Subject, resolve_layers
from primal_attention.convert.transfer import layer_errors, relative_mse


def convert_run(run: str | Path, out: str | Path, options: ConvertOptions) -> dict[str, Any]:
    """Convert a trained run of ``primal train`` (a seed's folder or a ``ckpt-*`` folder) into ``out``;
    returns the report (also ``out/report.json``). Re-running continues an interrupted conversion."""
    return Conversion(RunSubject(run), out, options).run()


def convert_hf(model, train_ids, out: str | Path, options: ConvertOptions, val_ids=None,
               source: str = "model object") -> dict[str, Any]:
    """Convert an HF causal LM, trained on the int64 token blocks ``train_ids`` (M, N), into ``out``
    (the model in ``out/model``). ``val_ids`` default to the last tenth of ``train_ids``."""
    return Conversion(HFSubject(model, train_ids, val_ids, source=source), out, options).run()


__all__ = ["Conversion", "ConvertError", "ConvertOptions", "HFSubject", "Interrupted", "RunSubject", "Subject",
           "convert_hf", "convert_run", "layer_errors", "relative_mse", "resolve_layers"]
