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


def percent_cell(values: Sequence[float]) -> str:
    """``mean ± sample std (n=k)`` of fractions, in percent; ``–`` when empty."""
    if not values:
        return "–"
    pct = [100 * v for v in values]
    sd = statistics.stdev(pct) if len(pct) > 1 else 0.0
    return f"{statistics.mean(pct):.1f} ± {sd:.1f} (n={len(pct)})"
