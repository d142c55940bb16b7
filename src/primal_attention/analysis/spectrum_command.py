"""``primal spectrum``: load a run (or a config), analyse its attention spectra on a split, print the
KSVD diagnostics and the component table, and write the JSON and PNGs."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from primal_attention.analysis.spectrum import analyse_spectrum
from primal_attention.analysis.spectrum_report import components_table, ksvd_table, write_spectrum

__all__ = ["spectrum_command"]


def spectrum_command(
    path: str | Path,
    *,
    split: str = "test",
    max_examples: int | None = 200,
    batch_size: int = 16,
    group_size: int = 1,
    out: str | Path | None = None,
    last: bool = False,
    overrides: list[str] | None = None,
    ksvd: bool = False,
) -> int:
    """``primal spectrum``: analyse ``split`` of the target, print the KSVD diagnostics and the
    component table, write JSON + PNGs (default: RUN_DIR/spectrum_<split>, or
    runs/<name>/spectrum_<split>_init for a config). Returns the exit code.

    With ``ksvd``, also the distances of every primal layer to the exact KSVD solution of its kernel
    (:func:`primal_attention.ksvd.model_ksvd_distances`, on the same batch as the diagnostics): under
    ``"ksvd_distances"`` in spectrum.json and as a table on stdout."""
    from primal_attention.data.base import DataError
    from primal_attention.ksvd.diagnostics import ksvd_diagnostics
    from primal_attention.train.checkpoint import CheckpointError
    from primal_attention.train.config import ConfigError
    from primal_attention.train.run import load_run

    try:
        t = load_run(path, overrides=overrides, last=last)
    except (CheckpointError, ConfigError, DataError) as err:
        print(f"primal spectrum: error: {err}", file=sys.stderr)
        return 2
    data = getattr(t.splits, split)
    if data is None:
        print(f"primal spectrum: error: this run has no {split!r} split (protocol {t.cfg.train.protocol})", file=sys.stderr)
        return 2
    result = analyse_spectrum(t.model, data, batch_size=batch_size, max_examples=max_examples, device=t.device,
                              group_size=group_size)
    first = torch.arange(min(len(t.splits.train), t.cfg.train.eval_batch_size))
    diagnostics = ksvd_diagnostics(t.model, t.splits.train.batch(first).to(t.device))
    result.update(source=str(t.source), checkpoint=None if t.checkpoint is None else str(t.checkpoint),
                  weights=t.weights, split=split, name=t.cfg.name, ksvd_diagnostics=diagnostics,
                  ksvd_diagnostics_batch=f"first {len(first)} training examples")
    if ksvd:
        from primal_attention.ksvd.dual import model_ksvd_distances

        result["ksvd_distances"] = model_ksvd_distances(t.model, t.splits.train.batch(first).to(t.device))
    if out is None:
        base = Path("runs") / t.cfg.name if t.checkpoint is None else t.checkpoint.parent.parent
        out = base / (f"spectrum_{split}" + ("_init" if t.checkpoint is None else ""))
    files = write_spectrum(result, out, title=f"{t.cfg.name} ({split})")
    where = t.checkpoint.name if t.checkpoint is not None else "no checkpoint"
    print(f"{t.cfg.name}: {result['examples']} {split} examples, {where}, weights {t.weights}")
    if diagnostics:
        print(f"KSVD diagnostics ({result['ksvd_diagnostics_batch']}, eval mode):")
        for key, value in diagnostics.items():
            print(f"  {key:44s} {value: .4e}")
    print(components_table(result))
    if ksvd:
        print(f"Distances to the exact KSVD solution ({result['ksvd_diagnostics_batch']}, eval mode; "
              "angles between learned and optimal spans, docs/method.md §7):")
        print(ksvd_table(result["ksvd_distances"]) if result["ksvd_distances"] else "  (no primal layers)")
    print("wrote", ", ".join(str(f) for f in files))
    return 0
