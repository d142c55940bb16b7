"""Reading an experiment config: a YAML file or a mapping, plus ``key=value`` overrides, into a validated
:class:`~primal_attention.train.config.ExperimentConfig` whose ``model:`` section is its data family's.

Above both :mod:`primal_attention.train.config` (the config types) and the data families (which own
their ``model:`` section), so that neither imports the other's user.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from primal_attention.train.config import ConfigError, ExperimentConfig, _build
from primal_attention.train.families import get_family


def _apply_override(tree: dict[str, Any], assignment: str) -> None:
    if "=" not in assignment:
        raise ConfigError(f"override {assignment!r} must look like key.sub=value")
    key, raw = assignment.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw != "" else None
        if isinstance(value, str):
            value = _number_or_text(value)
    except yaml.YAMLError as err:
        problem = getattr(err, "problem", None) or type(err).__name__
        raise ConfigError(f"override {assignment!r}: the value is not valid YAML ({problem})") from err
    parts = key.strip().split(".")
    node = tree
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {key}: {p} is not a section")
    node[parts[-1]] = value


def config_from_dict(values: dict[str, Any], overrides: list[str] | None = None) -> ExperimentConfig:
    """Build and validate an ExperimentConfig from a nested mapping plus ``key=value`` overrides."""
    tree = dict(values or {})
    tree = {k: (dict(v) if isinstance(v, dict) else v) for k, v in tree.items()}
    for o in overrides or []:
        _apply_override(tree, o)
    model = tree.pop("model", {})
    cfg = _build(ExperimentConfig, tree)
    section = get_family(cfg.data.family).model_section
    if not isinstance(model, dict):
        raise ConfigError(f"model: expected a mapping, got {type(model).__name__}")
    cfg.model = _build(section, model, "model")
    cfg.validate()
    return cfg


def _number_or_text(text: str) -> Any:
    """YAML 1.1 reads ``1e308`` or ``3e-4`` (no dot) as text: such a value is the number it spells."""
    return float(text) if re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+", text.strip()) else text


def load_config(path: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    """Read a YAML experiment config (see ``configs/``)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"{path}: not valid YAML{where} ({getattr(err, 'problem', None) or type(err).__name__})") from err
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    try:
        return config_from_dict(values, overrides)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from err
