"""Resumable result grids: run a config once per (protocol, seed), in this process, and keep its metrics.

The stored metrics (small JSON files, committed under ``docs/results/``) make a grid resumable across
machines and sessions: a seed whose file exists is not run again. The run directory under ``runs/``
(checkpoints, git-ignored) makes an interrupted run continue from its last checkpoint. Scripts keep
only their grids and report writers.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from primal_attention.provenance import shown_path
from primal_attention.train.load import load_config
from primal_attention.train.trainer import run_seeds


def run_stored(config: Path, store: Path, work: Path, seed: int, overrides: Sequence[str] = (), *,
               history_columns: Sequence[str] = (), config_record: dict | None = None) -> dict:
    """Metrics of ``config`` with ``overrides`` for ``seed``, trained only if ``store`` is missing.

    The run lives in ``work/seed_<seed>`` and resumes from its checkpoints; the metrics are written
    to ``store`` with the equivalent ``primal train`` command and the evaluation history
    (:func:`evaluation_history`, keeping also the columns that start with ``history_columns``), and
    ``config_record`` (the resolved config a sweep keys its cells by) when given.
    """
    if store.is_file():
        return json.loads(store.read_text())
    sets = ["train.progress=false", *overrides]
    # the command as run from the working directory (relative where the paths lie below it): committed
    # records carry no path of the machine that made them
    command = ["primal", "train", shown_path(config), "--out", shown_path(work), "--seeds", str(seed), "--resume"]
    for o in sets:
        command += ["--set", o]
    print("$", shlex.join(command), flush=True)
    run_seeds(load_config(config, sets), work, [seed], resume=True)
    metrics = json.loads((work / f"seed_{seed}" / "metrics.json").read_text())
    metrics["command"] = shlex.join(command)
    metrics["history"] = evaluation_history(work / f"seed_{seed}" / "history.csv", history_columns)
    if config_record is not None:
        metrics["config"] = config_record
    store.parent.mkdir(parents=True, exist_ok=True)
    store.write_text(json.dumps(metrics, indent=2))
    return metrics


def rounded(obj: Any) -> Any:
    """Floats (nested in dicts and lists too) to 6 significant digits: stored JSON stays small and diffable."""
    if isinstance(obj, float):
        return float(f"{obj:.6g}")
    if isinstance(obj, dict):
        return {k: rounded(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [rounded(v) for v in obj]
    return obj


def evaluation_history(path: Path, columns: Sequence[str] = ()) -> list[dict]:
    """Every evaluation of a run's ``history.csv``: step, epoch, the train loss and the val / test
    metrics, so that a selection can be re-derived from the store. The KSVD diagnostics are left out
    unless asked for: ``columns`` are further prefixes to keep (e.g. ``("ksvd_distance/",)``)."""
    import csv

    if not path.is_file():
        return []
    prefixes = ("val_", "test_", *columns)
    keep = lambda k: k in ("step", "epoch", "train_loss") or k.startswith(prefixes)  # noqa: E731
    with path.open(newline="") as f:
        return [{k: float(v) for k, v in row.items() if keep(k) and v not in ("", None)} for row in csv.DictReader(f)]


def stored(directory: Path) -> list[dict]:
    """Every stored run (``seed_*.json``) in ``directory``."""
    return [json.loads(p.read_text()) for p in sorted(directory.glob("seed_*.json"))]


def claim(folder: Path, name: str) -> bool:
    """True for the one worker that creates ``folder/name`` (workers sharing a grid each take a cell
    this way; delete the folder to re-claim cells after a crash)."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(folder / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False
