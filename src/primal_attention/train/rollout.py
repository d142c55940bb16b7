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


class _Episodes:
    """The ``rs.episodes`` environments of one evaluation, stepped side by side: each is reset with its env
    seed (``rs.seed + i``) and stepped until it terminates or is truncated; returns and lengths accumulate.
    A context manager: the environments are closed on leaving, errors included."""

    def __init__(self, rs: RolloutSet) -> None:
        self.rs = rs
        self.envs = [make_env(rs.env) for _ in range(rs.episodes)]
        self.returns = np.zeros(rs.episodes)
        self.lengths = np.zeros(rs.episodes, dtype=np.int64)
        self.done = np.zeros(rs.episodes, dtype=bool)

    def __enter__(self) -> "_Episodes":
        return self

    def __exit__(self, *exc) -> None:
        for env in self.envs:
            env.close()

    def reset(self) -> np.ndarray:
        """The first observations (E, S), raw."""
        return np.stack([env.reset(seed=self.rs.seed + i)[0] for i, env in enumerate(self.envs)])

    def step(self, act: np.ndarray) -> list[tuple[int, np.ndarray, float]]:
        """Step every running episode ``i`` with ``act[i]`` (E, A); ``(i, observation, reward)`` of each one
        stepped (finished episodes are skipped)."""
        stepped = []
        for i, env in enumerate(self.envs):
            if self.done[i]:
                continue
            obs, reward, terminated, truncated, _ = env.step(act[i])
            self.returns[i] += reward
            self.lengths[i] += 1
            self.done[i] = terminated or truncated
            stepped.append((i, obs, float(reward)))
        return stepped

    def summary(self) -> dict[str, float]:
        """Mean and std of the episodes' D4RL-normalised scores and raw returns, and the mean length."""
        scores = np.array([normalized_score(self.rs.env, r) for r in self.returns])
        std_of = lambda v: float(np.std(v, ddof=1)) if len(v) > 1 else math.nan  # noqa: E731
        return {"score": float(scores.mean()), "score_std": std_of(scores), "return": float(self.returns.mean()),
                "return_std": std_of(self.returns), "length": float(self.lengths.mean())}


def _rollout(model: nn.Module, rs: RolloutSet, device: torch.device) -> dict[str, float]:
    e, k, horizon = rs.episodes, rs.context, rs.max_ep_len
    p = next(model.parameters())
    mean = torch.as_tensor(rs.state_mean, dtype=p.dtype, device=device)
    std = torch.as_tensor(rs.state_std, dtype=p.dtype, device=device)
    normalise = lambda obs: (torch.as_tensor(obs, dtype=p.dtype, device=device) - mean) / std  # noqa: E731
    s_dim, a_dim = model.config.state_dim, model.config.act_dim
    states = torch.zeros(e, horizon, s_dim, dtype=p.dtype, device=device)
    actions = torch.zeros(e, horizon, a_dim, dtype=p.dtype, device=device)
    rtg = torch.zeros(e, horizon, 1, dtype=p.dtype, device=device)
    times = torch.arange(horizon, device=device).expand(e, horizon)
    with _Episodes(rs) as episodes:
        states[:, 0] = normalise(episodes.reset())
        rtg[:, 0] = rs.target_return / RETURN_SCALE
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
            for i, obs, reward in episodes.step(pred.float().cpu().numpy()):
                if t + 1 < horizon:
                    states[i, t + 1] = normalise(obs)
                    rtg[i, t + 1] = rtg[i, t] - reward / RETURN_SCALE
            if episodes.done.all():
                break
        return episodes.summary()


def policy_rollout(policy: Callable[[np.ndarray], np.ndarray], rs: RolloutSet) -> dict[str, float]:
    """Run the episodes of ``rs`` with a memoryless ``policy``: normalised states (E, S) -> actions (E, A),
    clipped to the action space; the same env seeds, horizon and scores as :func:`rollout` (a baseline's
    rollouts are comparable with a model's)."""
    with _Episodes(rs) as episodes:
        space = episodes.envs[0].action_space
        obs = episodes.reset()
        for _ in range(rs.max_ep_len):
            act = np.clip(policy((obs - rs.state_mean) / rs.state_std), space.low, space.high)
            for i, ob, _reward in episodes.step(act):
                obs[i] = ob
            if episodes.done.all():
                break
        return episodes.summary()
