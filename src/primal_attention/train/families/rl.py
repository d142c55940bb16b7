"""The ``rl`` family: offline RL (D4RL-style datasets, ``<env>-<dataset>``) with a
:class:`~primal_attention.models.decision.DecisionTransformer`, evaluated by rollouts in the environment."""

from __future__ import annotations

from dataclasses import dataclass

import math
from typing import Any

from primal_attention.models.decision import DecisionTransformer, DecisionTransformerConfig
from primal_attention.train.config import ConfigError, DataConfig, ExperimentConfig, RLModelConfig
from primal_attention.train.families.base import Family, Splits, attention_pattern, model_fields, register_family
from primal_attention.train.tasks import ACTION_REGRESSION

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
    gap = ROLLOUT_SEEDS["test"] - ROLLOUT_SEEDS["val"]
    if out["eval_episodes"] > gap:  # env seeds val+i and test+i must stay apart
        raise ConfigError(f"data.options.eval_episodes {out['eval_episodes']} exceeds {gap}: validation and test "
                          "rollouts would share environment seeds")
    if out["target_return"] is None:
        out["target_return"] = TARGET_RETURNS[env][0]
    if isinstance(out["target_return"], bool) or not isinstance(out["target_return"], (int, float)) \
            or not math.isfinite(out["target_return"]):
        raise ConfigError(f"data.options.target_return must be a finite number, got {out['target_return']!r}")
    return out


@dataclass(frozen=True)
class RLStandIn:
    """What a Decision Transformer is built from, without the dataset."""

    state_dim: int
    act_dim: int
    max_ep_len: int


@register_family("rl")
class RLFamily(Family):
    model_section = RLModelConfig
    task = ACTION_REGRESSION
    summary_metrics = ("test_score", "best_test_score", "best_val_score", "final_test_score")

    def check(self, cfg: ExperimentConfig) -> None:
        d = cfg.data
        if not (d.seq_len or 0) > 0:
            raise ConfigError("data.seq_len (the context K in steps) must be a positive integer for data.family rl")
        if d.max_examples is not None or d.max_test_examples is not None:
            raise ConfigError("data.max_examples does not apply to data.family rl")
        options = rl_options(d)
        if d.seq_len > options["max_ep_len"]:  # refused before a (B, 3K, D) batch of a huge K is allocated
            raise ConfigError(f"data.seq_len (the context K) {d.seq_len} exceeds an episode "
                              f"(data.options.max_ep_len {options['max_ep_len']}): no segment is that long")

    def load(self, cfg: ExperimentConfig) -> Splits:
        """Training segments of the dataset, and rollouts in the environment as validation and test."""
        from primal_attention.data.rl import RLData, dataset_file, load_transitions
        from primal_attention.train.rollout import RolloutSet

        d = cfg.data
        o = rl_options(d)
        path = dataset_file(d.name, d.data_dir, o["collection_seed"])
        train = RLData.from_transitions(load_transitions(path, env=d.name), env=d.name, context=d.seq_len,
                                        max_ep_len=o["max_ep_len"], name=d.name, meta={"source": str(path)})
        make = lambda split: RolloutSet(train.env, float(o["target_return"]), o["eval_episodes"], ROLLOUT_SEEDS[split],  # noqa: E731
                                        train.state_mean, train.state_std, d.seq_len, o["max_ep_len"])
        return Splits(train, make("val") if cfg.train.protocol == "holdout" else None, make("test"))

    def build_model(self, cfg: ExperimentConfig, data: Any) -> DecisionTransformer:
        return DecisionTransformer(DecisionTransformerConfig(
            state_dim=data.state_dim, act_dim=data.act_dim, context=cfg.data.seq_len, max_ep_len=data.max_ep_len,
            attention=attention_pattern(cfg), **model_fields(cfg.model)))

    def stand_in(self, cfg: ExperimentConfig) -> RLStandIn:
        from primal_attention.data.rl import ENV_SIZES, dataset_name

        state_dim, act_dim = ENV_SIZES[dataset_name(cfg.data.name)[0]]
        return RLStandIn(state_dim=state_dim, act_dim=act_dim, max_ep_len=rl_options(cfg.data)["max_ep_len"])

    def trivial_baselines(self, cfg: ExperimentConfig, splits: Splits) -> dict[str, dict[str, Any]]:
        from primal_attention.data.rl import normalized_score

        from primal_attention.train.trivial import linear_policy

        score = normalized_score(splits.train.env, splits.train.meta["return_mean"])
        return {"behaviour": {"what": "the dataset's own episodes (mean D4RL-normalised return)",
                              "val_score": score, "test_score": score},
                "linear": linear_policy(splits.train, splits.val, splits.test)}
