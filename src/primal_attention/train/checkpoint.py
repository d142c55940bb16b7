"""Atomic checkpoints: weights as safetensors, optimiser / scheduler / RNG / loop state beside them.

A checkpoint is a directory ``ckpt-<step>/`` written under a temporary name, flushed to disk
(fsync of its files and of the directory) and renamed into place; the file ``latest`` (replaced
atomically) names the newest complete one. Older checkpoints are removed only after their successor
is durable, and the newest ``keep`` (default 2) stay. A run killed at any moment leaves the previous
or the new checkpoint, never a half-written one; a damaged ``latest`` falls back to the newest
checkpoint that reads, and a directory with checkpoints none of which reads is an error, never a
silent restart.

``state.pt`` is read with ``torch.load(weights_only=True)``: tensors, numbers, strings, lists and dicts
only, so a checkpoint someone sends you cannot run code when it is evaluated or resumed; one that
tries is refused (:class:`UnsafeCheckpointError`) rather than skipped for an older checkpoint. The
resolved config a checkpoint was trained with is stored as JSON in the metadata of its safetensors
files (:func:`checkpoint_config`), so it is read without unpickling anything.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn


class CheckpointError(ValueError):
    """A checkpoint or run directory is missing, unreadable, or does not fit the model."""


class UnsafeCheckpointError(CheckpointError):
    """A ``state.pt`` that names Python objects (functions, classes) to be called on load: it was
    altered or written elsewhere, and unpickling it could run code."""


#: key of the safetensors metadata that holds the config a checkpoint was trained with (JSON).
CONFIG_METADATA = "primal_attention.config"


def _fsync(path: Path) -> None:
    """Flush a file or a directory entry to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text)
        _fsync(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
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
    config: dict[str, Any] | None = None,
) -> Path:
    """Write ``directory/ckpt-<step>`` durably and point ``latest`` at it; then keep the newest ``keep``.

    ``config`` (the resolved experiment config as a nested mapping) is stored in the weights'
    metadata. CheckpointError (one line) when the disk refuses the write: the temporary directory
    is removed and the previous checkpoint, still named by ``latest``, stays as it was."""
    if keep < 1:
        raise ValueError(f"save_checkpoint: keep must be >= 1, got {keep}")
    final = directory / f"ckpt-{step:08d}"
    tmp = directory / f".ckpt-{step:08d}.tmp"
    metadata = None if config is None else {CONFIG_METADATA: json.dumps(config)}
    try:
        directory.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        save_file(state_tensors(model), str(tmp / "model.safetensors"), metadata=metadata)
        if best is not None:
            save_file(best, str(tmp / "best.safetensors"), metadata=metadata)
        torch.save(state, tmp / "state.pt")
        for f in tmp.iterdir():
            _fsync(f)
        _fsync(tmp)
    except BaseException as err:  # also Ctrl-C: never leave a half-written temporary checkpoint
        shutil.rmtree(tmp, ignore_errors=True)
        # torch.save and safetensors report a failed write (disk full, quota, I/O error) as
        # RuntimeError / SafetensorError, often without the OS error: every Exception here is one.
        if isinstance(err, Exception):
            kept = _pointer(directory)
            raise CheckpointError(
                f"cannot write checkpoint {final.name} in {directory} ({_os_reason(err)}); "
                + (f"the previous checkpoint {kept} is intact" if kept else "no earlier checkpoint exists")
            ) from err
        raise
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync(directory)
    try:
        _write_text_atomic(directory / "latest", final.name)
    except OSError as err:  # the new checkpoint is complete; latest_checkpoint finds it without the pointer
        raise CheckpointError(f"wrote {final} but cannot update {directory / 'latest'} ({_os_reason(err)})") from err
    for old in sorted(directory.glob("ckpt-*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


#: how the OS error number appears in the text of torch's and safetensors' (Rust) write errors.
_OS_CODE = re.compile(r"(?:os error|code:|Errno) ?(\d+)")


def _os_reason(err: BaseException) -> str:
    if isinstance(err, OSError) and err.errno is not None:
        return err.strerror or os.strerror(err.errno)
    found = _OS_CODE.search(str(err))
    return os.strerror(int(found.group(1))) if found else f"{_one_line(err)}; is the disk full?"


def _one_line(err: BaseException, limit: int = 200) -> str:
    """The first non-empty line of an exception's text, at most ``limit`` characters."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    text = lines[0] if lines else type(err).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _pointer(directory: Path) -> str | None:
    """The checkpoint ``latest`` names, when it names one that exists."""
    pointer = directory / "latest"
    try:
        name = pointer.read_text(errors="replace").strip() if pointer.is_file() else ""
    except OSError:
        return None
    return name if name.startswith("ckpt-") and (directory / name).is_dir() else None


def _problem(ckpt: Path) -> str | None:
    """Why a checkpoint directory does not load, or None when all its files are there and read.
    A state that would run code is not a problem to step over but an error (UnsafeCheckpointError)."""
    try:
        load_checkpoint(ckpt)
    except UnsafeCheckpointError:
        raise
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
    state = read_state(path / "state.pt")
    best = read_weights(path / "best.safetensors") if (path / "best.safetensors").is_file() else None
    return weights, state, best


def read_state(file: Path) -> dict[str, Any]:
    """The loop state of ``state.pt``, read with ``weights_only=True`` (never runs code).

    Raises:
        UnsafeCheckpointError: the file names a Python object to call (a crafted or foreign pickle).
        CheckpointError: the file is missing, truncated or not a torch file.
    """
    if not file.is_file():
        raise CheckpointError(f"{file} does not exist")
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        # torch's text varies by version; the object it refused follows "GLOBAL" in all of them.
        found = re.search(r"GLOBAL ([\w.]+)", str(err))
        if found:
            raise UnsafeCheckpointError(
                f"refusing to load {file}: it asks to call the Python object {found.group(1)}, which could run "
                "code (a state.pt that primal train writes holds only tensors, numbers, strings, lists and dicts); "
                "do not use this run folder unless you know who altered it") from None
        raise CheckpointError(f"{file} is not a readable checkpoint state ({_weights_only_reason(err)})") from None
    except Exception as err:  # zip / EOF errors of a truncated or foreign file
        raise CheckpointError(f"{file} is not a readable checkpoint state ({_one_line(err)})") from err
    if not isinstance(state, dict):
        raise CheckpointError(f"{file} is not a checkpoint state: expected a dict, got {type(state).__name__}")
    return state


def _weights_only_reason(err: BaseException) -> str:
    """The line of torch's weights-only error that says what was wrong (its other lines are advice)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    useful = [line for line in lines if not line.startswith(("Weights only load failed", "Check the documentation",
                                                             "Please file an issue", "(1)", "(2)"))]
    return _one_line(ValueError(useful[0] if useful else "not a weights-only torch file"))


def checkpoint_config(ckpt: Path) -> dict[str, Any] | None:
    """The config a checkpoint directory was trained with (see :func:`save_checkpoint`), or None for
    a checkpoint written before checkpoints recorded it."""
    file = ckpt / "model.safetensors"
    try:
        with safe_open(str(file), framework="pt") as f:
            meta = f.metadata() or {}
    except Exception as err:  # safetensors raises its own (Rust) error types
        raise CheckpointError(f"{file} is not a readable safetensors file ({_one_line(err)})") from err
    if CONFIG_METADATA not in meta:
        return None
    try:
        config = json.loads(meta[CONFIG_METADATA])
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{file}: the config in its metadata is not valid JSON ({err})") from err
    if not isinstance(config, dict):
        raise CheckpointError(f"{file}: the config in its metadata is not a mapping")
    return config


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
