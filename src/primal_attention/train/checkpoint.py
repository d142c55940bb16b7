"""Atomic checkpoints: weights as safetensors, optimiser / scheduler / RNG / loop state beside them.

A checkpoint is a directory ``ckpt-<step>/`` written under a temporary name and renamed into place;
the file ``latest`` (replaced atomically) names the newest complete one. A run killed at any moment
leaves either the previous or the new checkpoint, never a half-written one.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def state_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """A state dict safetensors can hold: contiguous CPU tensors, no shared storage."""
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in model.state_dict().items()}


def save_checkpoint(
    directory: Path,
    step: int,
    model: nn.Module,
    state: dict[str, Any],
    best: dict[str, torch.Tensor] | None = None,
    keep: int = 1,
) -> Path:
    """Write ``directory/ckpt-<step>`` atomically and point ``latest`` at it; keep the newest ``keep``."""
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"ckpt-{step:08d}"
    tmp = directory / f".ckpt-{step:08d}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    save_file(state_tensors(model), str(tmp / "model.safetensors"))
    if best is not None:
        save_file(best, str(tmp / "best.safetensors"))
    torch.save(state, tmp / "state.pt")
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _write_text_atomic(directory / "latest", final.name)
    for old in sorted(directory.glob("ckpt-*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(directory: Path) -> Path | None:
    """The newest complete checkpoint in ``directory``, or None."""
    pointer = directory / "latest"
    if not pointer.is_file():
        return None
    path = directory / pointer.read_text().strip()
    return path if (path / "state.pt").is_file() else None


def load_checkpoint(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, torch.Tensor] | None]:
    """(model weights, loop state, best weights or None) of a checkpoint directory."""
    weights = load_file(str(path / "model.safetensors"))
    state = torch.load(path / "state.pt", weights_only=False)
    best = load_file(str(path / "best.safetensors")) if (path / "best.safetensors").is_file() else None
    return weights, state, best
