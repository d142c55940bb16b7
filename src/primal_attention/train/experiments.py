"""Resumable result grids: run a config once per (protocol, seed), store its metrics for good.

The stored metrics (small JSON files, committed under ``docs/results/``) make a grid resumable across
machines and sessions; the run directory under ``runs/`` (checkpoints, git-ignored) makes an
interrupted run continue from its last checkpoint.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path


def run_stored(config: Path, store: Path, work: Path, seed: int, overrides: Sequence[str] = ()) -> dict:
    """Metrics of ``primal train config --seeds seed --set ...``, run only if ``store`` is missing."""
    if store.is_file():
        return json.loads(store.read_text())
    cmd = [sys.executable, "-m", "primal_attention.cli", "train", str(config), "--out", str(work),
           "--seeds", str(seed), "--resume", "--set", "train.progress=false"]
    for o in overrides:
        cmd += ["--set", o]
    print("$", " ".join(["primal", *cmd[3:]]), flush=True)
    subprocess.run(cmd, check=True)
    metrics = json.loads((work / f"seed_{seed}" / "metrics.json").read_text())
    metrics["command"] = " ".join(["primal", *cmd[3:]])
    store.parent.mkdir(parents=True, exist_ok=True)
    store.write_text(json.dumps(metrics, indent=2))
    return metrics


def stored(directory: Path) -> list[dict]:
    """Every stored run (``seed_*.json``) in ``directory``."""
    return [json.loads(p.read_text()) for p in sorted(directory.glob("seed_*.json"))]


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value) of a non-empty sequence."""
    if not values:
        raise ValueError("mean_std: no values")
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def percent_cell(values: Sequence[float]) -> str:
    """``mean ± sample std (n=k)`` of fractions, in percent; ``–`` when empty."""
    if not values:
        return "–"
    mean, sd = mean_std([100 * v for v in values])
    return f"{mean:.1f} ± {sd:.1f} (n={len(values)})"
