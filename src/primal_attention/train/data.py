"""Datasets and models for an experiment config: the train / validation / test splits and the classifier."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any, NamedTuple

from primal_attention.data.base import SequenceData
from primal_attention.data.splits import stratified_split
from primal_attention.models.classifier import ClassifierConfig, SequenceClassifier
from primal_attention.models.transformer import hybrid_pattern
from primal_attention.train.config import ConfigError, DataConfig, ExperimentConfig


class Splits(NamedTuple):
    """train is what the optimiser sees; val is None under the authors' protocol."""

    train: SequenceData
    val: SequenceData | None
    test: SequenceData


def _load_pair(cfg: DataConfig) -> tuple[SequenceData, SequenceData]:
    if cfg.family == "uea":
        from primal_attention.data.uea import load_uea_splits

        return load_uea_splits(cfg.name, data_dir=cfg.data_dir, **cfg.options)
    if cfg.family == "fsdd":
        from primal_attention.data.fsdd import load_fsdd_splits

        return load_fsdd_splits(**cfg.options)
    if cfg.family == "lra":
        from primal_attention.data.lra import load_lra

        kw = dict(seq_len=cfg.seq_len, data_dir=cfg.data_dir, **cfg.options)
        test_cap = cfg.max_test_examples if cfg.max_test_examples is not None else cfg.max_examples
        return (load_lra(cfg.name, "train", num_examples=cfg.max_examples, **kw),
                load_lra(cfg.name, "test", num_examples=test_cap, **kw))
    raise ConfigError(f"data.family must be uea, fsdd or lra, got {cfg.family!r}")


def _cap(data: SequenceData, limit: int | None) -> SequenceData:
    """A fixed random subset of ``limit`` examples (files are often sorted by class), in file order."""
    import torch

    if limit is None or len(data) <= limit:
        return data
    pick = torch.randperm(len(data), generator=torch.Generator().manual_seed(0))[:limit]
    return data.subset(pick.sort().values)


def build_splits(cfg: ExperimentConfig) -> Splits:
    """Load the data of ``cfg.data`` and cut it for ``cfg.train.protocol``.

    holdout: a stratified ``val_fraction`` of TRAIN (seeded by the run's seed) becomes the
    validation split and is not trained on.
    """
    train, test = _load_pair(cfg.data)
    test_cap = cfg.data.max_test_examples if cfg.data.max_test_examples is not None else cfg.data.max_examples
    train, test = _cap(train, cfg.data.max_examples), _cap(test, test_cap)
    if cfg.train.protocol == "holdout":
        keep, held = stratified_split(train.y, cfg.data.val_fraction, seed=cfg.train.seed)
        return Splits(train.subset(keep), train.subset(held), test)
    return Splits(train, None, test)


def attention_pattern(cfg: ExperimentConfig) -> list[str]:
    m = cfg.model
    if m.attention is not None:
        if len(m.attention) != m.layers:
            raise ConfigError(f"model.attention has {len(m.attention)} entries but model.layers is {m.layers}")
        return list(m.attention)
    return hybrid_pattern(m.layers, m.kind)


def architecture(section: Any) -> dict[str, Any]:
    """The model-config fields of a ``model:`` section (everything but kind, layers, attention)."""
    values = dataclasses.asdict(section)
    for key in ("kind", "layers", "attention"):
        values.pop(key)
    return values


def build_model(cfg: ExperimentConfig, data: SequenceData) -> SequenceClassifier:
    """The classifier of ``cfg.model`` sized for ``data`` (classes, input width, sequence length)."""
    return SequenceClassifier(
        ClassifierConfig(
            num_classes=data.num_classes,
            max_seq_len=data.seq_len,
            vocab_size=data.vocab_size,
            num_features=data.num_features if data.vocab_size is None else None,
            attention=attention_pattern(cfg),
            dual=data.x2 is not None,
            **architecture(cfg.model),
        )
    )


def check_buildable(cfg: ExperimentConfig) -> None:
    """ConfigError (one line) for anything in ``cfg`` that would fail only later: the device, the data
    name where it is known in advance, and the model, built on the meta device (no memory, no data)
    with stand-in sizes for what the data decides (classes, length, vocabulary)."""
    import torch

    from primal_attention.data.lra import TASKS

    name = cfg.train.device
    if name != "auto":
        try:
            device = torch.device(name)
        except RuntimeError as err:
            raise ConfigError(f"train.device: {name!r} is not a device ({err})") from err
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"train.device={name} but CUDA is not available here; use train.device=cpu or auto")
    if cfg.data.family == "lra" and cfg.data.name not in TASKS:
        raise ConfigError(f"data.name: LRA task must be one of {', '.join(TASKS)}, got {cfg.data.name!r}")
    tokens = cfg.data.family == "lra"
    stand_in = SimpleNamespace(
        num_classes=2, seq_len=cfg.data.seq_len or 16, vocab_size=2 if tokens else None,
        num_features=None if tokens else 1, x2=True if cfg.data.name == "retrieval" else None,
    )
    try:
        with torch.device("meta"):
            build_model(cfg, stand_in)
    except ConfigError:
        raise
    except (TypeError, ValueError) as err:
        raise ConfigError(f"model: {err}") from err
