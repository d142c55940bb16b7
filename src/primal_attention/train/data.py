"""Datasets and models for an experiment config: the train / validation / test splits and the classifier."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any, NamedTuple

from primal_attention.data.base import SequenceData
from primal_attention.data.splits import stratified_split
from primal_attention.models.classifier import ClassifierConfig, SequenceClassifier
from primal_attention.models.decision import DecisionTransformer, DecisionTransformerConfig
from primal_attention.models.lm import CausalLM, CausalLMConfig
from primal_attention.models.transformer import hybrid_pattern
from primal_attention.models.vision import VisionTransformer, ViTConfig
from torch import nn
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
    if cfg.family == "vision":
        return _load_images(cfg)
    raise ConfigError(f"data.family must be uea, fsdd, lra, vision, lm or rl, got {cfg.family!r}")


#: data.name of the lm family.
LM_DATASETS = ("corpora", "text_files")
#: data.options of the lm family.
LM_OPTIONS = ("vocab_size", "max_tokens")


def lm_options(cfg: DataConfig) -> dict[str, Any]:
    """``vocab_size`` (default 4096) and ``max_tokens`` (default None) of an lm data section, checked."""
    unknown = sorted(set(cfg.options) - set(LM_OPTIONS))
    if unknown:
        raise ConfigError(f"data.options: unknown for data.family lm: {', '.join(unknown)}; expected {', '.join(LM_OPTIONS)}")
    vocab, cap = cfg.options.get("vocab_size", 4096), cfg.options.get("max_tokens")
    if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 257:
        raise ConfigError(f"data.options.vocab_size must be an integer >= 257 (256 bytes and <|endoftext|>), got {vocab!r}")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 2):
        raise ConfigError(f"data.options.max_tokens must be an integer >= 2 or null, got {cap!r}")
    return {"vocab_size": vocab, "max_tokens": cap}


def _load_lm(cfg: DataConfig, split: str):
    from primal_attention.data import lm

    kw = dict(block_len=cfg.seq_len, progress=True, **lm_options(cfg))
    if cfg.name == "corpora":
        return lm.load_lm(split, **kw)
    if cfg.name == "text_files":
        if cfg.data_dir is None:
            raise ConfigError("data.name=text_files needs data.data_dir (train.txt / valid.txt / test.txt, or wiki.*.tokens)")
        return lm.load_lm_files(cfg.data_dir, split, **kw)
    raise ConfigError(f"data.name: LM dataset must be one of {', '.join(LM_DATASETS)}, got {cfg.name!r}")


#: data.options of the rl family, with their defaults (target_return None: the authors' first target).
RL_OPTIONS = {"target_return": None, "eval_episodes": 10, "collection_seed": 0, "max_ep_len": 1000}
#: first env seed of the validation and test rollouts (apart from any seed of the collection).
ROLLOUT_SEEDS = {"val": 10_000, "test": 20_000}


def rl_options(cfg: DataConfig) -> dict[str, Any]:
    """The rl data options with their defaults, checked."""
    from primal_attention.data.rl import TARGET_RETURNS, dataset_name

    unknown = sorted(set(cfg.options) - set(RL_OPTIONS))
    if unknown:
        raise ConfigError(f"data.options: unknown for data.family rl: {', '.join(unknown)}; expected {', '.join(RL_OPTIONS)}")
    try:
        env, _ = dataset_name(cfg.name)
    except ValueError as err:
        raise ConfigError(f"data.name: {err}") from err
    out = {**RL_OPTIONS, **cfg.options}
    for key in ("eval_episodes", "max_ep_len"):
        if isinstance(out[key], bool) or not isinstance(out[key], int) or out[key] < 1:
            raise ConfigError(f"data.options.{key} must be a positive integer, got {out[key]!r}")
    if out["target_return"] is None:
        out["target_return"] = TARGET_RETURNS[env][0]
    if isinstance(out["target_return"], bool) or not isinstance(out["target_return"], (int, float)):
        raise ConfigError(f"data.options.target_return must be a number, got {out['target_return']!r}")
    return out


def _load_rl(cfg: ExperimentConfig) -> Splits:
    """Training segments of the dataset, and rollouts in the environment as validation and test."""
    from primal_attention.data.rl import RLData, dataset_file, load_transitions
    from primal_attention.train.rollout import RolloutSet

    d = cfg.data
    if d.max_examples is not None or d.max_test_examples is not None:
        raise ConfigError("data.max_examples does not apply to data.family rl")
    o = rl_options(d)
    path = dataset_file(d.name, d.data_dir, o["collection_seed"])
    train = RLData.from_transitions(load_transitions(path, env=d.name), env=d.name, context=d.seq_len, max_ep_len=o["max_ep_len"],
                                    name=d.name, meta={"source": str(path)})
    make = lambda split: RolloutSet(train.env, float(o["target_return"]), o["eval_episodes"], ROLLOUT_SEEDS[split],  # noqa: E731
                                    train.state_mean, train.state_std, d.seq_len, o["max_ep_len"])
    return Splits(train, make("val") if cfg.train.protocol == "holdout" else None, make("test"))


#: data.name of the vision family -> its loader.
IMAGE_DATASETS = ("fashion_mnist", "digits", "image_folder")
#: data.options of the vision family that are augmentation settings, not loader arguments.
AUGMENT_OPTIONS = ("crop_padding", "flip")


def _load_images(cfg: DataConfig):
    from primal_attention.data import vision

    options = {k: v for k, v in cfg.options.items() if k not in AUGMENT_OPTIONS}
    if cfg.name == "fashion_mnist":
        return tuple(vision.load_fashion_mnist_images(split, **options) for split in ("train", "test"))
    if cfg.name == "digits":
        return tuple(vision.load_digits_images(split, **options) for split in ("train", "test"))
    if cfg.name == "image_folder":
        if cfg.data_dir is None:
            raise ConfigError("data.name=image_folder needs data.data_dir (a folder with train/ and test/ class folders)")
        return tuple(vision.load_image_folder(cfg.data_dir, split, **options) for split in ("train", "test"))
    raise ConfigError(f"data.name: vision dataset must be one of {', '.join(IMAGE_DATASETS)}, got {cfg.name!r}")


def train_batch(cfg: ExperimentConfig, data, index, step: int):
    """The training batch at ``index`` for optimiser step ``step``: images get the augmentation of
    ``data.options`` (random crop after padding, horizontal flip) drawn from a generator seeded by
    (seed, step), so a resumed run sees exactly the same batches."""
    import torch

    batch = data.batch(index)
    if cfg.data.family != "vision":
        return batch
    from primal_attention.data.vision import augment

    options = {k: cfg.data.options[k] for k in AUGMENT_OPTIONS if k in cfg.data.options}
    if options.get("crop_padding", 4) == 0 and not options.get("flip", True):
        return batch
    generator = torch.Generator().manual_seed(cfg.train.seed * 1_000_003 + step)
    batch.x = augment(batch.x, generator=generator, **options)
    return batch


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
    validation split and is not trained on. Language models have a validation split of their own
    (held-out works), used under holdout.
    """
    if cfg.data.family == "rl":
        return _load_rl(cfg)
    if cfg.data.family == "lm":  # validation and test are held-out works / files: no split of TRAIN
        if cfg.data.max_examples is not None or cfg.data.max_test_examples is not None:
            raise ConfigError("data.max_examples does not apply to data.family lm; cap the streams with data.options.max_tokens")
        train, val, test = (_load_lm(cfg.data, s) for s in ("train", "val", "test"))
        return Splits(train, val if cfg.train.protocol == "holdout" else None, test)
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


def build_model(cfg: ExperimentConfig, data) -> nn.Module:
    """The model of ``cfg.model`` sized for ``data``: a :class:`SequenceClassifier` (classes, input
    width, sequence length) or, for images, a :class:`VisionTransformer` (classes, size, channels)."""
    if cfg.data.family == "rl":
        return DecisionTransformer(DecisionTransformerConfig(
            state_dim=data.state_dim, act_dim=data.act_dim, context=cfg.data.seq_len, max_ep_len=data.max_ep_len,
            attention=attention_pattern(cfg), **architecture(cfg.model)))
    if cfg.data.family == "lm":
        return CausalLM(CausalLMConfig(vocab_size=data.vocab_size, max_seq_len=data.block_len,
                                       attention=attention_pattern(cfg), **architecture(cfg.model)))
    if cfg.data.family == "vision":
        return VisionTransformer(ViTConfig(num_classes=data.num_classes, image_size=data.image_size,
                                           in_channels=data.in_channels, attention=attention_pattern(cfg),
                                           **architecture(cfg.model)))
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
    if cfg.data.family == "lm" and cfg.data.name not in LM_DATASETS:
        raise ConfigError(f"data.name: LM dataset must be one of {', '.join(LM_DATASETS)}, got {cfg.data.name!r}")
    if cfg.data.family == "vision" and cfg.data.name not in IMAGE_DATASETS:
        raise ConfigError(f"data.name: vision dataset must be one of {', '.join(IMAGE_DATASETS)}, got {cfg.data.name!r}")
    tokens = cfg.data.family == "lra"
    size = cfg.data.options.get("image_size") or {"fashion_mnist": 28, "digits": 8}.get(cfg.data.name, 224)
    stand_in = SimpleNamespace(
        num_classes=2, seq_len=cfg.data.seq_len or 16, vocab_size=2 if tokens else None,
        num_features=None if tokens else 1, x2=True if cfg.data.name == "retrieval" else None,
        image_size=size, in_channels=1 if cfg.data.name in ("fashion_mnist", "digits") else 3,
        block_len=cfg.data.seq_len or 16,
    )
    if cfg.data.family == "lm":
        stand_in.vocab_size = lm_options(cfg.data)["vocab_size"]
    if cfg.data.family == "rl":
        from primal_attention.data.rl import ENV_SIZES, dataset_name

        stand_in.max_ep_len = rl_options(cfg.data)["max_ep_len"]
        stand_in.state_dim, stand_in.act_dim = ENV_SIZES[dataset_name(cfg.data.name)[0]]
    try:
        with torch.device("meta"):
            build_model(cfg, stand_in)
    except ConfigError:
        raise
    except (TypeError, ValueError) as err:
        raise ConfigError(f"model: {err}") from err
