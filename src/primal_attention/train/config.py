"""Experiment configs: YAML mapped onto typed dataclasses, strictly.

Unknown keys, wrong types and bad values give one clear :class:`ConfigError` naming the key.
``--set a.b=value`` overrides parse ``value`` as YAML (so ``--set train.epochs=5`` is an int).
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from primal_attention.models.classifier import ClassifierConfig
from primal_attention.models.decision import DecisionTransformerConfig
from primal_attention.models.lm import CausalLMConfig
from primal_attention.models.vision import ViTConfig


class ConfigError(ValueError):
    """A config file or override is invalid."""


@dataclass
class DataConfig:
    """Which dataset and how to cut it.

    family: "uea" (a UEA archive dataset), "fsdd" (Free Spoken Digit MFCCs), "lra" (a Long Range
    Arena task), "vision" (images: fashion_mnist, digits, or image_folder with ``data_dir``), "lm"
    (language modelling: ``corpora``, the Shakespeare / Milton / Bible stand-in, or ``text_files``,
    train / valid / test text files in ``data_dir`` such as WikiText-103's ``wiki.*.tokens``), "rl"
    (offline RL, ``<env>-<dataset>`` such as ``hopper-medium``: the file ``primal data collect-rl``
    collected, or ``data_dir`` with that dataset's npz / D4RL HDF5 file).
    name: the dataset or task name. data_dir: user-provided files (UEA ``.ts`` archive, LRA release
    files, an ImageFolder tree), else what is bundled or generated here. val_fraction: the stratified
    validation split carved from TRAIN under the holdout protocol. max_examples: cap on TRAIN (a
    fixed random subset; None = all); max_test_examples: cap on TEST (None = max_examples). For
    generated LRA tasks these are the numbers of examples generated. seq_len: sequence length (LRA).
    options: loader-specific extras (lm: ``vocab_size`` of the byte-level BPE, default 4096;
    ``max_tokens``, a cap on each split's token stream for quick runs; rl: ``target_return`` (default
    the authors' first target), ``eval_episodes`` (10), ``collection_seed`` (0), ``max_ep_len``
    (1000)). For lm, seq_len is the context L of the training blocks and the model; for rl, the
    context K of the Decision Transformer (in steps).
    """

    family: str = "uea"
    name: str = "JapaneseVowels"
    data_dir: str | None = None
    val_fraction: float = 0.2
    max_examples: int | None = None
    max_test_examples: int | None = None
    seq_len: int | None = None
    options: dict[str, Any] = field(default_factory=dict)


#: fields of a model's config that come from the data (or from kind / layers), not from the YAML.
DATA_DERIVED = {"num_classes", "max_seq_len", "vocab_size", "num_features", "dual", "attention"}


def model_section(name: str, model_config: type, doc: str, derived: frozenset[str] = frozenset(),
                  extra: tuple[tuple[str, Any, Any], ...] = ()) -> type:
    """The ``model:`` section for a model config dataclass: ``kind``, ``layers`` and an optional
    explicit ``attention`` list, then every architecture field of ``model_config`` with its own
    default (one place holds each default), less the fields the data fixes, then ``extra`` fields
    (name, type, field) of the section itself."""
    hints = typing.get_type_hints(model_config)
    own = [
        (f.name, hints[f.name], field(default=f.default) if f.default is not dataclasses.MISSING
         else field(default_factory=f.default_factory))
        for f in dataclasses.fields(model_config) if f.name not in DATA_DERIVED | derived
    ]
    section = dataclasses.make_dataclass(
        name,
        [("kind", Literal["transformer", "primalformer", "primal+"], field(default="primalformer")), ("layers", int, field(default=2)),
         ("attention", list[str] | None, field(default=None)), *own, *extra],
    )
    section.__module__, section.__doc__ = __name__, doc
    return section


ModelConfig = model_section("ModelConfig", ClassifierConfig, """The classifier (UEA, FSDD, LRA).

kind: "transformer", "primalformer" or "primal+" (last layer primal) over ``layers`` layers, or an
explicit per-layer ``attention`` list of registered names. attention_options: constructor options
per attention name, e.g. ``{"primal": {"rank": 40, "rank_multi": 5}}``. The other fields and their
defaults are those of :class:`primal_attention.ClassifierConfig`.""")


VisionModelConfig = model_section("VisionModelConfig", ViTConfig, """The vision transformer (``data.family: vision``).

kind / layers / attention as for :class:`ModelConfig` (``primal+``: only the last block primal);
the other fields and their defaults are those of :class:`primal_attention.ViTConfig` (patch_size,
dim, num_heads, ffn_dim, attention_options, dropout, attention_dropout, drop_path, qkv_bias).
Image size and channels come from the data.""", derived=frozenset({"image_size", "in_channels"}))

@dataclass
class HFModelConfig:
    """``model.hf`` of ``data.family: lm``: a Hugging Face causal LM built from its config (random
    weights, nothing downloaded) instead of this package's :class:`~primal_attention.CausalLM`.

    architecture: an HF ``model_type`` that ``primal_attention.hf.primalize`` supports as a causal LM
    (gpt2, llama, qwen2). config: further fields of that architecture's config, in HF's names (e.g.
    ``{n_inner: 512}``, ``{rms_norm_eps: 1e-6}``). From the rest of ``model:``: ``layers``, ``dim``,
    ``num_heads`` and ``ffn_dim`` set the HF config's layer count, width, heads and feed-forward width
    (``config`` may not set them again), ``kind`` which layers ``primalize`` makes primal (all,
    the last, none), and ``attention_options["primal"]`` their options; the vocabulary and context
    come from the data. The trainer adds the KSVD term, checkpoints, resumes and runs DDP as for
    its own models; ``primal generate`` samples from the run."""

    architecture: str = "gpt2"
    config: dict[str, Any] = field(default_factory=dict)


LMModelConfig = model_section("LMModelConfig", CausalLMConfig, """The causal language model (``data.family: lm``).

kind / layers / attention as for :class:`ModelConfig` (``primal+``: only the last layer primal, the
paper's WikiText-103 model); the other fields and their defaults are those of
:class:`primal_attention.CausalLMConfig` (dim, num_heads, ffn_dim, attention_options, dropout).
Vocabulary and context come from the data. ``hf`` (:class:`HFModelConfig`): train a Hugging Face
architecture instead.""", extra=(("hf", HFModelConfig | None, field(default=None)),))

RLModelConfig = model_section("RLModelConfig", DecisionTransformerConfig, """The Decision Transformer (``data.family: rl``).

kind / layers / attention as for :class:`ModelConfig` (``primal+``: the last layer causal primal, the
paper's Primal.+DT); the other fields and their defaults are those of
:class:`primal_attention.DecisionTransformerConfig` (dim, num_heads, ffn_dim, attention_options,
dropout, activation, action_tanh). State / action sizes, the context and the episode length come
from the data.""", derived=frozenset({"state_dim", "act_dim", "context", "max_ep_len"}))


#: the ``model:`` section of any family (each family names its own: train/families).
ModelSection = ModelConfig | VisionModelConfig | LMModelConfig | RLModelConfig


@dataclass
class OptimConfig:
    """Optimiser and schedule. name: radam | adam | adamw. schedule: constant | linear | cosine
    (one-cycle: linear warmup over ``warmup_steps``, then linear or cosine decay to 0) | inverse_sqrt
    (linear warmup, then lr · sqrt(warmup_steps / step), fairseq's)."""

    name: Literal["radam", "adam", "adamw"] = "radam"
    lr: float = 1e-3
    weight_decay: float = 0.0
    eps: float = 1e-8
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    schedule: Literal["constant", "linear", "cosine", "inverse_sqrt"] = "constant"
    warmup_steps: int = 0
    clip_norm: float | None = 4.0


@dataclass
class TrainConfig:
    """The loop. Give ``epochs`` (UEA) or ``steps`` (LRA); evaluation every ``eval_every`` epochs
    (or every ``eval_every`` steps when training by steps). eta: weight of the KSVD loss.
    protocol: "authors" (test every evaluation, best reported) or "holdout" (validation split of
    TRAIN selects the evaluation point; TEST evaluated once with those weights)."""

    epochs: int | None = 100
    steps: int | None = None
    batch_size: int = 16
    eval_every: int = 1
    eval_batch_size: int = 64
    eta: float = 0.0
    ksvd_reduction: Literal["batch", "sample"] = "sample"
    #: "mean": task loss (a mean) + η·KSVD. "summed": η·KSVD is added to the batch's summed task loss
    #: and the total divided by its targets, as the authors' LM criterion (fairseq) does: η then
    #: weighs 1 / (targets per batch) of what it weighs under "mean".
    ksvd_weighting: Literal["mean", "summed"] = "mean"
    ksvd_form: Literal["authors", "paper"] = "authors"
    #: every k-th evaluation (0: never) also log each primal layer's distances to the exact KSVD
    #: solution of its kernel (docs/method.md §7) on the diagnostics batch, as ksvd_distance/* columns.
    ksvd_distances_every: int = 0
    protocol: Literal["authors", "holdout"] = "authors"
    #: holdout protocol: also evaluate TEST at every evaluation, so a run reports the authors'
    #: best-on-test figure beside the validation-selected one (selection still uses validation only).
    track_test: bool = False
    seed: int = 0
    device: str = "auto"
    threads: int | None = None
    #: CPU: keep freed memory mapped for reuse (primal_attention.allocator; no page faults per step).
    #: Process-wide and left on after training: the process keeps its peak resident memory.
    retain_freed_memory: bool = True
    progress: bool = True
    #: checkpoints kept per run (the newest ones; an older one goes only once its successor is on disk).
    keep_checkpoints: int = 2


#: a run name becomes a folder under runs/: no separators, no "..", no hidden names.
_SAFE_NAME = re.compile(r"[A-Za-z0-9_+-][A-Za-z0-9._+-]{0,127}")
_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?|mps")


@dataclass
class ExperimentConfig:
    """One experiment: name, data, model, optimiser, loop."""

    name: str = "experiment"
    data: DataConfig = field(default_factory=DataConfig)
    #: :class:`ModelConfig` (classifier) or, for ``data.family: vision``, :class:`VisionModelConfig`.
    model: ModelSection = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def validate(self) -> None:
        """Raise ConfigError for values no run could use."""
        checks = [
            (0.0 < self.data.val_fraction < 1.0, "data.val_fraction must be in (0, 1)"),
            (self.model.kind in ("transformer", "primalformer", "primal+"), "model.kind must be transformer, primalformer or primal+"),
            (self.model.layers > 0, "model.layers must be positive"),
            (self.optim.name in ("radam", "adam", "adamw"), "optim.name must be radam, adam or adamw"),
            (self.optim.schedule in ("constant", "linear", "cosine", "inverse_sqrt"),
             "optim.schedule must be constant, linear, cosine or inverse_sqrt"),
            (self.optim.lr > 0, "optim.lr must be positive"),
            (len(self.optim.betas) == 2, "optim.betas must have two values"),
            ((self.train.epochs is None) != (self.train.steps is None), "give exactly one of train.epochs and train.steps"),
            ((self.train.epochs is None or self.train.epochs > 0) and (self.train.steps is None or self.train.steps > 0),
             "train.epochs / train.steps must be positive"),
            (self.train.batch_size > 0 and self.train.eval_batch_size > 0, "batch sizes must be positive"),
            (self.train.eval_every > 0, "train.eval_every must be positive"),
            (self.train.keep_checkpoints > 0, "train.keep_checkpoints must be positive"),
            (self.train.eta >= 0, "train.eta must be >= 0"),
            (self.train.ksvd_reduction in ("batch", "sample"), "train.ksvd_reduction must be batch or sample"),
            (self.train.ksvd_weighting in ("mean", "summed"), "train.ksvd_weighting must be mean or summed"),
            (self.train.ksvd_form in ("authors", "paper"), "train.ksvd_form must be authors or paper"),
            (self.train.ksvd_distances_every >= 0, "train.ksvd_distances_every must be >= 0"),
            (self.train.protocol in ("authors", "holdout"), "train.protocol must be authors or holdout"),
            (_SAFE_NAME.fullmatch(self.name) is not None,
             f"name must be a plain folder name (letters, digits, '._+-', not starting with '.'), got {self.name!r}"),
            (self.optim.clip_norm is None or (math.isfinite(self.optim.clip_norm) and self.optim.clip_norm > 0),
             "optim.clip_norm must be a finite number > 0, or null for no clipping"),
            (math.isfinite(self.optim.lr), "optim.lr must be finite"),
            (self.optim.eps > 0 and math.isfinite(self.optim.eps), "optim.eps must be a finite number > 0"),
            (self.optim.weight_decay >= 0 and math.isfinite(self.optim.weight_decay), "optim.weight_decay must be >= 0"),
            (all(0 <= b < 1 for b in self.optim.betas), "optim.betas must be in [0, 1)"),
            (self.optim.warmup_steps >= 0, "optim.warmup_steps must be >= 0"),
            (self.train.threads is None or self.train.threads > 0, "train.threads must be a positive int, or null for torch's default"),
            (math.isfinite(self.train.eta), "train.eta must be finite"),
            (self.data.max_examples is None or self.data.max_examples > 0, "data.max_examples must be > 0, or null for all"),
            (self.data.max_test_examples is None or self.data.max_test_examples > 0,
             "data.max_test_examples must be > 0, or null"),
            (self.data.seq_len is None or self.data.seq_len > 0, "data.seq_len must be > 0, or null"),
            (_DEVICE.fullmatch(self.train.device) is not None,
             f"train.device must be auto, cpu, cuda or cuda:N, got {self.train.device!r}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)


def _convert(value: Any, tp: Any, key: str) -> Any:
    """Check / convert a YAML value to the annotated type, naming the key on failure."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _convert(value, args[0], key)
    if origin is typing.Literal:
        choices = typing.get_args(tp)
        if value not in choices or isinstance(value, bool) != isinstance(choices[0], bool):
            raise ConfigError(f"{key}: expected one of {', '.join(map(str, choices))}, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__}")
        return _build(tp, value, key)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        (inner,) = typing.get_args(tp) or (Any,)
        return [_convert(v, inner, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 3e-4 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{key}: unsupported type {tp}")


def _build(cls: type, values: dict[str, Any], prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        where = f" in {prefix}" if prefix else ""
        raise ConfigError(f"unknown key{'s' if len(unknown) > 1 else ''}{where}: {', '.join(unknown)}; expected one of {', '.join(sorted(names))}")
    kwargs = {k: _convert(v, hints[k], f"{prefix}.{k}" if prefix else k) for k, v in values.items()}
    return cls(**kwargs)


def config_to_dict(cfg: ExperimentConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def dump_config(cfg: ExperimentConfig, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
