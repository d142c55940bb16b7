"""Experiment configs: strict YAML → dataclasses, overrides, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from primal_attention.train.config import ConfigError, dump_config
from primal_attention.train.load import config_from_dict, load_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_every_shipped_config_loads() -> None:
    paths = sorted(CONFIGS.rglob("*.yaml"))
    assert paths
    for path in paths:
        load_config(path)


def test_overrides_are_parsed_as_yaml() -> None:
    cfg = config_from_dict({}, ["train.epochs=5", "optim.lr=3e-4", "model.attention_options.primal.rank=7",
                                "data.data_dir=/tmp/x", "optim.clip_norm=null"])
    assert cfg.train.epochs == 5 and cfg.optim.lr == 3e-4
    assert cfg.model.attention_options["primal"]["rank"] == 7
    assert cfg.data.data_dir == "/tmp/x" and cfg.optim.clip_norm is None


@pytest.mark.parametrize("values,match", [
    ({"model": {"foo": 1}}, "unknown key in model: foo"),
    ({"trian": {}}, "unknown key: trian"),
    ({"train": {"epochs": "ten"}}, "train.epochs: expected an integer"),
    ({"train": {"progress": "yes"}}, "train.progress: expected true/false"),
    ({"optim": {"lr": -1.0}}, "optim.lr must be positive"),
    ({"optim": {"name": "sgd"}}, "optim.name"),
    ({"train": {"protocol": "best"}}, "train.protocol"),
    ({"train": {"epochs": 3, "steps": 10}}, "exactly one of train.epochs and train.steps"),
    ({"model": {"attention": "primal"}}, "model.attention: expected a list"),
    ({"data": "uea"}, "data: expected a mapping"),
])
def test_bad_values_are_named(values, match) -> None:
    with pytest.raises(ConfigError, match=match):
        config_from_dict(values)


def test_bad_override_and_missing_file(tmp_path) -> None:
    with pytest.raises(ConfigError, match="key.sub=value"):
        config_from_dict({}, ["train.epochs"])
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_dump_round_trips(tmp_path) -> None:
    cfg = config_from_dict({"name": "x", "train": {"eta": 0.5}})
    dump_config(cfg, tmp_path / "c.yaml")
    assert load_config(tmp_path / "c.yaml") == cfg
