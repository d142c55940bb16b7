"""Load a trained run (or a config) back: the one sequence behind ``primal eval`` and ``primal spectrum``;
:func:`load_lm_run` (a language model and its tokenizer, no data) is behind ``primal generate``.

find the run -> its config -> the data splits -> the device -> the model -> its weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from primal_attention.train.checkpoint import CheckpointError, find_run, load_run_weights
from primal_attention.train.config import ExperimentConfig
from primal_attention.train.load import load_config
from primal_attention.train.data import Splits, build_model, build_splits
from primal_attention.train.families import get_family
from primal_attention.train.trainer import check_trained_config, resolve_device

if TYPE_CHECKING:
    from primal_attention.data.lm import BPETokenizer


@dataclass
class LoadedRun:
    """A run ready to evaluate or analyse.

    source: the path given; weights: "best" (holdout selection), "model" (last) or "init" (a
    config, freshly initialised with ``train.seed``); checkpoint: the checkpoint directory or None.
    """

    cfg: ExperimentConfig
    splits: Splits
    model: nn.Module
    device: torch.device
    source: Path
    weights: str
    checkpoint: Path | None


def load_run(path: str | Path, *, overrides: list[str] | None = None, last: bool = False) -> LoadedRun:
    """Resolve ``path``: a run directory (config.yaml + checkpoints/, its latest checkpoint), a
    ``ckpt-*`` directory (its run two levels up), or a YAML config (a model initialised with
    ``train.seed``, no training). ``overrides`` (KEY=VALUE) apply to a config only. Holdout runs
    load their selected best weights unless ``last``.

    Raises:
        CheckpointError: nothing loadable at ``path``, weights that do not fit the config, or a
            config.yaml whose model differs from the one the checkpoint was trained with.
        ConfigError, DataError: from the config and the data it names.
    """
    path = Path(path)
    if path.is_file() and path.suffix in (".yaml", ".yml"):
        cfg = load_config(path, overrides)
        ckpt = None
    else:
        if overrides:
            raise CheckpointError("--set applies to a config file, not to a trained run (its config is fixed)")
        try:
            run_dir, ckpt = find_run(path)
        except CheckpointError as err:
            if path.is_dir():
                raise
            raise CheckpointError(f"{err}, and {path} is not a .yaml config") from err
        cfg = load_config(run_dir / "config.yaml")
        check_trained_config(ckpt, cfg, run_dir / "config.yaml")
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    splits = build_splits(cfg)
    device = resolve_device(cfg.train.device)
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg, splits.train).to(device)
    if ckpt is None:
        return LoadedRun(cfg, splits, model, device, path, "init", None)
    which = load_run_weights(model, ckpt, last=last)
    return LoadedRun(cfg, splits, model, device, path, which, ckpt)


@dataclass
class LoadedLM:
    """A trained language model with its tokenizer, ready to generate (no data is loaded)."""

    cfg: ExperimentConfig
    model: nn.Module
    tokenizer: "BPETokenizer"
    device: torch.device
    weights: str
    checkpoint: Path


def load_lm_run(path: str | Path, *, last: bool = False) -> LoadedLM:
    """A run of ``data.family: lm`` (run directory or ``ckpt-*`` directory) with the tokenizer saved
    beside its config (``tokenizer.json``); the val-selected weights unless ``last``, eval mode.

    Raises:
        CheckpointError: no run at ``path``, not a language model, or no tokenizer.json.
    """
    from primal_attention.data.base import DataError
    from primal_attention.data.lm import BPETokenizer
    from primal_attention.train.families.lm import LMStandIn

    run_dir, ckpt = find_run(Path(path))
    cfg = load_config(run_dir / "config.yaml")
    check_trained_config(ckpt, cfg, run_dir / "config.yaml")
    if not get_family(cfg.data.family).generates:
        raise CheckpointError(f"{run_dir} is a run of data.family {cfg.data.family}, not a language model (lm)")
    tok_path = run_dir / "tokenizer.json"
    if not tok_path.is_file():
        raise CheckpointError(f"{run_dir} has no tokenizer.json (it is written when training starts)")
    try:
        tokenizer = BPETokenizer.load(tok_path)
    except DataError as err:
        raise CheckpointError(str(err)) from err
    device = resolve_device(cfg.train.device)
    model = build_model(cfg, LMStandIn(vocab_size=tokenizer.vocab_size, block_len=cfg.data.seq_len)).to(device)
    which = load_run_weights(model, ckpt, last=last)
    return LoadedLM(cfg, model.eval(), tokenizer, device, which, ckpt)
