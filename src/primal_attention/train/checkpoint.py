"""Atomic checkpoints: weights as safetensors, optimiser / scheduler / RNG / loop state beside them.

A checkpoint is a directory ``ckpt-<step>/`` written under a temporary name, flushed to disk
(fsync of its files and of the directory) and renamed into place; the file ``latest`` (replaced
atomically) names the newest complete one. Older checkpoints are removed only after their successor
is durable, and the newest ``keep`` (default 2) stay. A run killed at any moment leaves the previous
or the new checkpoint, never a half-written one; a damaged ``latest`` falls back to the newest
checkpoint that reads, and a directory with checkpoints none of which reads is an error, never a
silent restart.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn


class CheckpointError(ValueError):
    """A checkpoint or run directory is missing, unreadable, or does not fit the model."""


def _fsync(path: Path) -> None:
    """Flush a file or a directory entry to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    _fsync(tmp)
    os.replace(tmp, path)
    _fsync(path.parent)


def state_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """A state dict safetensors can hold: contiguous CPU tensors, no shared storage."""
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in model.state_dict().items()}


def save_checkpoint(
    directory: Path,
    step: int,
    model: nn.Module,
    state: dict[str, Any],
    best: dict[str, torch.Tensor] | None = None,
    keep: int = 2,
) -> Path:
    """Write ``directory/ckpt-<step>`` durably and point ``latest`` at it; then keep the newest ``keep``."""
    if keep < 1:
        raise ValueError(f"save_checkpoint: keep must be >= 1, got {keep}")
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
    for f in tmp.iterdir():
        _fsync(f)
    _fsync(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync(directory)
    _write_text_atomic(directory / "latest", final.name)
    for old in sorted(directory.glob("ckpt-*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _problem(ckpt: Path) -> str | None:
    """Why a checkpoint directory does not load, or None when all its files are there and read."""
    try:
        load_checkpoint(ckpt)
    except CheckpointError as err:
        return str(err)
    return None


def latest_checkpoint(directory: Path) -> Path | None:
    """The newest complete checkpoint in ``directory``, or None when it holds none.

    ``latest`` names it; when that pointer is missing or names a checkpoint that does not read, the
    newest ``ckpt-*`` that reads is used instead. CheckpointError when checkpoints exist but none
    of them reads (resuming must not silently restart from step 0).
    """
    pointer = directory / "latest"
    if pointer.is_file():
        named = directory / pointer.read_text(errors="replace").strip()
        if named.name.startswith("ckpt-") and named.parent == directory and _problem(named) is None:
            return named
    found = sorted(directory.glob("ckpt-*"), reverse=True) if directory.is_dir() else []
    problems = []
    for ckpt in found:
        problem = _problem(ckpt)
        if problem is None:
            return ckpt
        problems.append(problem)
    if found:
        raise CheckpointError(f"none of the checkpoints in {directory} reads: {'; '.join(problems)}")
    return None


def read_weights(file: Path) -> dict[str, torch.Tensor]:
    """The tensors of a ``.safetensors`` file; CheckpointError when it is absent or corrupt."""
    if not file.is_file():
        raise CheckpointError(f"{file} does not exist")
    try:
        return load_file(str(file))
    except Exception as err:  # safetensors raises its own (Rust) error types
        raise CheckpointError(f"{file} is not a readable safetensors file ({err})") from err


def load_weights(model: nn.Module, file: Path) -> None:
    """Load the safetensors ``file`` into ``model`` (see :func:`fit_weights`)."""
    fit_weights(model, read_weights(file), file)


def load_run_weights(model: nn.Module, ckpt: Path, *, last: bool = False) -> str:
    """Load a checkpoint directory's weights into ``model``: the selected best weights (holdout runs
    keep them) unless ``last``, else the latest. Returns which: ``"best"`` or ``"model"``."""
    which = "best" if (ckpt / "best.safetensors").is_file() and not last else "model"
    load_weights(model, ckpt / f"{which}.safetensors")
    return which


def _first(items: list[str], k: int) -> str:
    return f"{items[:k]}{' ...' if len(items) > k else ''}"


def fit_weights(model: nn.Module, weights: dict[str, torch.Tensor], source: Path) -> None:
    """``model.load_state_dict(weights)``; CheckpointError names missing / unexpected / mis-shaped
    tensors (a checkpoint of another config) instead of torch's error."""
    own = model.state_dict()
    missing = sorted(set(own) - set(weights))
    unexpected = sorted(set(weights) - set(own))
    shapes = [f"{k}: file {tuple(weights[k].shape)} vs model {tuple(v.shape)}"
              for k, v in own.items() if k in weights and weights[k].shape != v.shape]
    problems = [f"{label} {_first(items, k)}" for label, items, k in
                (("missing", missing, 5), ("unexpected", unexpected, 5), ("shape mismatch", shapes, 3)) if items]
    if problems:
        raise CheckpointError(f"{source} does not fit the model built from the config: {'; '.join(problems)}")
    model.load_state_dict(weights)


def load_checkpoint(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, torch.Tensor] | None]:
    """(model weights, loop state, best weights or None) of a checkpoint directory.

    Raises CheckpointError when a file is missing or corrupt."""
    weights = read_weights(path / "model.safetensors")
    try:
        state = torch.load(path / "state.pt", weights_only=False)
    except Exception as err:  # pickle / zip errors of a truncated or foreign file
        raise CheckpointError(f"{path / 'state.pt'} is not a readable checkpoint state ({err})") from err
    best = read_weights(path / "best.safetensors") if (path / "best.safetensors").is_file() else None
    return weights, state, best


def find_run(path: Path) -> tuple[Path, Path]:
    """(run directory, checkpoint directory) for a run directory (its latest checkpoint) or a
    ``ckpt-*`` directory (its run two levels up). CheckpointError when neither is found."""
    if not path.exists():
        raise CheckpointError(f"{path} does not exist")
    run_dir = path if (path / "config.yaml").is_file() else path.parent.parent
    if not (run_dir / "config.yaml").is_file():
        raise CheckpointError(f"no config.yaml in {path} or {run_dir}")
    ckpt = path if (path / "model.safetensors").is_file() else latest_checkpoint(run_dir / "checkpoints")
    if ckpt is None:
        raise CheckpointError(f"no checkpoint found under {path}")
    return run_dir, ckpt
