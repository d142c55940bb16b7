"""The :class:`Family` interface and its registry (see :mod:`primal_attention.train.families`)."""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from pathlib import Path
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import torch
from torch import nn

from primal_attention.data.base import Batch
from primal_attention.models.transformer import hybrid_pattern
from primal_attention.train.config import ConfigError, ExperimentConfig
from primal_attention.train.tasks import Task


class Splits(NamedTuple):
    """train is what the optimiser sees; val is None under the authors' protocol."""

    train: Any
    val: Any | None
    test: Any


_REGISTRY: dict[str, Family] = {}


def register_family(name: str) -> Callable[[type[Family]], type[Family]]:
    """Class decorator: make the family available to configs as ``data.family: <name>`` (one instance
    of the class, its :attr:`~Family.name` set to ``name``), as ``register_attention`` and
    ``hf.register_architecture`` do for attention kinds and HF architectures."""

    def add(cls: type[Family]) -> type[Family]:
        if name in _REGISTRY and type(_REGISTRY[name]) is not cls:
            raise ValueError(f"data family {name!r} is already registered to {type(_REGISTRY[name]).__name__}")
        family = cls()
        family.name = name
        _REGISTRY[name] = family
        return cls

    return add


def registered() -> dict[str, Family]:
    return _REGISTRY


class Family(ABC):
    """One kind of experiment. Subclasses set :attr:`model_section` and :attr:`task`, implement
    :meth:`load`, :meth:`build_model` and :meth:`stand_in` (the rest has defaults), and are registered
    with ``@register_family(name)``, which sets :attr:`name`."""

    #: the ``data.family`` the family is registered as.
    name: str = ""
    #: the dataclass of the config's ``model:`` section.
    model_section: ClassVar[type]
    task: ClassVar[Task]
    #: metrics (keys of a run's summary) that ``primal train`` prints at the end.
    summary_metrics: ClassVar[tuple[str, ...]] = ("best_test_acc", "final_test_acc", "test_acc", "best_val_acc")
    #: whether runs of this family can be continued as text (``primal generate``).
    generates: ClassVar[bool] = False
    #: ``primal data fetch``: whether this family takes every dataset name no other family claims (UEA).
    fetches_the_rest: ClassVar[bool] = False

    def check(self, cfg: ExperimentConfig) -> None:
        """ConfigError for what is wrong in ``cfg.data`` before anything is loaded (names, options)."""

    @abstractmethod
    def load(self, cfg: ExperimentConfig) -> Splits:
        """The data of ``cfg.data``, cut for ``cfg.train.protocol``."""

    @abstractmethod
    def build_model(self, cfg: ExperimentConfig, data: Any) -> nn.Module:
        """The model of ``cfg.model`` sized for ``data`` (the training split, or :meth:`stand_in`)."""

    @abstractmethod
    def stand_in(self, cfg: ExperimentConfig) -> Any:
        """An object with the sizes :meth:`build_model` reads from the data, known without loading it
        (so a whole config can be checked on the meta device)."""

    def train_batch(self, cfg: ExperimentConfig, data: Any, index: torch.Tensor, step: int) -> Batch:
        """The training batch at ``index`` for optimiser step ``step``."""
        return data.batch(index)

    def fetch(self, name: str, *, data_dir: str | None = None, vocab_size: int = 4096) -> str | None:
        """``primal data fetch NAME``: fetch / generate and cache dataset ``name`` if it is this family's,
        and say where it is (None: not this family's dataset). Raises DataError / ValueError."""
        return None

    def prepare_run(self, splits: Splits, out: Path) -> None:
        """Write what a run folder needs besides weights and metrics (e.g. a tokenizer); rank 0 only."""

    def trivial_baselines(self, cfg: ExperimentConfig, splits: Splits) -> dict[str, dict[str, Any]]:
        """Trivial baselines on ``splits`` (see :mod:`primal_attention.train.trivial`)."""
        return {}


def attention_pattern(cfg: ExperimentConfig) -> list[str]:
    """The per-layer attention names of ``cfg.model``: its explicit ``attention`` list or its kind."""
    m = cfg.model
    if m.attention is not None:
        if len(m.attention) != m.layers:
            raise ConfigError(f"model.attention has {len(m.attention)} entries but model.layers is {m.layers}")
        return list(m.attention)
    return hybrid_pattern(m.layers, m.kind)


def model_fields(section: Any) -> dict[str, Any]:
    """The model-config fields of a ``model:`` section (everything but kind, layers, attention)."""
    values = dataclasses.asdict(section)
    for key in ("kind", "layers", "attention"):
        values.pop(key)
    return values


def check_loader_options(options: dict[str, Any], loader: Any, family: str, *, set_here: tuple[str, ...] = (),
                         extra: tuple[str, ...] = ()) -> None:
    """ConfigError naming any ``data.options`` key that ``loader`` takes no keyword for (``set_here``: the
    keywords the family passes itself; ``extra``: options the family reads besides the loader's)."""
    import inspect

    params = inspect.signature(loader).parameters
    allowed = sorted({name for name, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY} - set(set_here)
                     | set(extra))
    unknown = sorted(set(options) - set(allowed))
    if unknown:
            raise ConfigError(f"data.options: unknown for data.family {family}: {', '.join(unknown)}; "
                          f"expected {', '.join(allowed) or 'none'}")

