"""The data and the model of an experiment config, through its data family
(:mod:`primal_attention.train.families`): the splits, the model, the training batches, and the check
that a whole config can be built before anything is loaded."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from primal_attention.data.base import Batch
from primal_attention.train.config import ConfigError, ExperimentConfig
from primal_attention.train.families import Splits, get_family
from primal_attention.train.families.base import attention_pattern, model_fields

__all__ = ["Splits", "attention_pattern", "build_model", "build_splits", "check_buildable", "model_fields", "train_batch"]


def build_splits(cfg: ExperimentConfig) -> Splits:
    """The data of ``cfg.data`` cut for ``cfg.train.protocol`` (holdout: a stratified ``val_fraction`` of
    TRAIN, seeded by the run's seed, validates; language models have held-out works of their own)."""
    family = get_family(cfg.data.family)
    family.check(cfg)
    return family.load(cfg)


def build_model(cfg: ExperimentConfig, data: Any) -> nn.Module:
    """The model of ``cfg.model`` sized for ``data`` (a training split, or the family's stand-in)."""
    return get_family(cfg.data.family).build_model(cfg, data)


def train_batch(cfg: ExperimentConfig, data: Any, index: torch.Tensor, step: int) -> Batch:
    """The training batch at ``index`` for optimiser step ``step`` (images: augmented per step)."""
    return get_family(cfg.data.family).train_batch(cfg, data, index, step)


def check_buildable(cfg: ExperimentConfig) -> None:
    """ConfigError (one line) for anything in ``cfg`` that would fail only later: the device, the data
    section as far as it is known in advance, and the model, built on the meta device (no memory, no
    data) with the family's stand-in sizes for what the data decides."""
    name = cfg.train.device
    if name != "auto":
        try:
            device = torch.device(name)
        except RuntimeError as err:
            raise ConfigError(f"train.device: {name!r} is not a device ({err})") from err
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"train.device={name} but CUDA is not available here; use train.device=cpu or auto")
    family = get_family(cfg.data.family)
    family.check(cfg)
    try:
        with torch.device("meta"):
            family.build_model(cfg, family.stand_in(cfg))
    except ConfigError:
        raise
    except (TypeError, ValueError) as err:
        raise ConfigError(f"model: {err}") from err
