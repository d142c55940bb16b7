"""Evaluating a Decision Transformer by rollouts in the real environment (gymnasium MuJoCo).

All episodes of an evaluation run side by side as one batch. Each step conditions on the target
return minus the rewards collected so far (divided by the return scale), the normalised states
and the actions taken, over the last ``context`` steps. While the episode is shorter than the
context, the model decodes incrementally (one token at a time through each layer's state: a KV
cache, or a primal layer's O(1) sums), which equals the full forward; after that the window slides
and each step is one forward over it. Scores are D4RL-normalised (:func:`normalized_score`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from primal_attention.data.base import DataError
from primal_attention.data.rl import ENVS, RETURN_SCALE, env_key, normalized_score

__all__ = ["RolloutSet", "make_env", "policy_rollout", "rollout"]


def make_env(env: str):
    """The gymnasium environment of ``env`` (hopper, halfcheetah, walker2d); a clear error without MuJoCo."""
    try:
        import gymnasium as gym
    except ImportError as err:
        raise DataError("RL rollouts need gymnasium with MuJoCo: pip install 'gymnasium[mujoco]'") from err
    return gym.make(ENVS[env_key(env)])


@dataclass
class RolloutSet:
    """An evaluation: ``episodes`` rollouts with env seeds ``seed``, ``seed + 1``, ..., conditioned on
    ``target_return``; states normalised with the training data's ``state_mean`` / ``state_std``."""

    env: str
    target_return: float
    episodes: int
    seed: int
    state_mean: np.ndarray
    state_std: np.ndarray
    context: int
    max_ep_len: int = 1000
    incremental: bool = True

    def __len__(self) -> int:
        return self.episodes


@torch.no_grad()
def rollout(model: nn.Module, rs: RolloutSet, device: torch.device) -> dict[str, float]:
    """Run the episodes of ``rs`` with ``model`` (a :class:`DecisionTransformer`) in eval mode.

    Returns ``score`` (mean D4RL-normalised return), ``score_std``, ``return`` (mean raw return),
    ``return_std`` and ``length`` (mean episode length).
    """
    was_training = model.training
    model.eval()
    try:
        return _rollout(model, rs, device)
    finally:
        model.train(was_training)


def _rollout(model: nn.Module, rs: RolloutSet, device: torch.device) -> dict[str, float]:
    envs = [make_env(rs.env) for _ in range(rs.episodes)]
    e, k, horizon = rs.episodes, rs.context, rs.max_ep_len
    p = next(model.parameters())
    mean = torch.as_tensor(rs.state_mean, dtype=p.dtype, device=device)
    std = torch.as_tensor(rs.state_std, dtype=p.dtype, device=device)
    s_dim, a_dim = model.config.state_dim, model.config.act_dim
    states = torch.zeros(e, horizon, s_dim, dtype=p.dtype, device=device)
    actions = torch.zeros(e, horizon, a_dim, dtype=p.dtype, device=device)
    rtg = torch.zeros(e, horizon, 1, dtype=p.dtype, device=device)
    times = torch.arange(horizon, device=device).expand(e, horizon)
    for i, env in enumerate(envs):
        obs, _ = env.reset(seed=rs.seed + i)
        states[i, 0] = (torch.as_tensor(obs, dtype=p.dtype, device=device) - mean) / std
    rtg[:, 0] = rs.target_return / RETURN_SCALE
    returns, lengths = np.zeros(e), np.zeros(e, dtype=np.int64)
    done = np.zeros(e, dtype=bool)
    state = None
    for t in range(horizon):
        if rs.incremental and t < k:
            _, state = model.push("return", rtg[:, t], times[:, t], state)
            pred, state = model.push("state", states[:, t], times[:, t], state)
        else:
            lo = max(0, t + 1 - k)
            pred = model(states[:, lo:t + 1], actions=actions[:, lo:t + 1], returns_to_go=rtg[:, lo:t + 1],
                         timesteps=times[:, lo:t + 1])[:, -1]
        actions[:, t] = pred
        if rs.incremental and t < k - 1:
            _, state = model.push("action", pred, times[:, t], state)
        act = pred.float().cpu().numpy()
        for i, env in enumerate(envs):
            if done[i]:
                continue
            obs, reward, terminated, truncated, _ = env.step(act[i])
            returns[i] += reward
            lengths[i] += 1
            done[i] = terminated or truncated
            if t + 1 < horizon:
                states[i, t + 1] = (torch.as_tensor(obs, dtype=p.dtype, device=device) - mean) / std
                rtg[i, t + 1] = rtg[i, t] - reward / RETURN_SCALE
        if done.all():
            break
    for env in envs:
        env.close()
    return _summary(rs, returns, lengths)


def _summary(rs: RolloutSet, returns: np.ndarray, lengths: np.ndarray) -> dict[str, float]:
    """Mean and std of the episodes' D4RL-normalised scores and raw returns, and the mean length."""
    scores = np.array([normalized_score(rs.env, r) for r in returns])
    std_of = lambda v: float(np.std(v, ddof=1)) if len(v) > 1 else math.nan  # noqa: E731
    return {"score": float(scores.mean()), "score_std": std_of(scores), "return": float(returns.mean()),
            "return_std": std_of(returns), "length": float(lengths.mean())}


def policy_rollout(policy: Callable[[np.ndarray], np.ndarray], rs: RolloutSet) -> dict[str, float]:
    """Run the episodes of ``rs`` with a memoryless ``policy``: normalised states (E, S) -> actions (E, A),
    clipped to the action space; the same env seeds, horizon and scores as :func:`rollout` (a baseline's
    rollouts are comparable with a model's)."""
    envs = [make_env(rs.env) for _ in range(rs.episodes)]
    low, high = envs[0].action_space.low, envs[0].action_space.high
    obs = np.stack([env.reset(seed=rs.seed + i)[0] for i, env in enumerate(envs)])
    returns, lengths = np.zeros(rs.episodes), np.zeros(rs.episodes, dtype=np.int64)
    done = np.zeros(rs.episodes, dtype=bool)
    for _ in range(rs.max_ep_len):
        act = np.clip(policy((obs - rs.state_mean) / rs.state_std), low, high)
        for i, env in enumerate(envs):
            if done[i]:
                continue
            obs[i], reward, terminated, truncated, _ = env.step(act[i])
            returns[i] += reward
            lengths[i] += 1
            done[i] = terminated or truncated
        if done.all():
            break
    for env in envs:
        env.close()
    return _summary(rs, returns, lengths)
