"""Offline-RL trajectories in D4RL's format, cut into Decision Transformer segments.

A dataset is a flat sequence of transitions with D4RL's fields: ``observations`` (T, S),
``actions`` (T, A), ``rewards`` (T,), ``terminals`` (T,) and ``timeouts`` (T,) (an episode ends after
a terminal or a timeout). Two file kinds load: the ``.npz`` files that ``primal data collect-rl``
writes (see :mod:`primal_attention.data.rl_collect`) and real D4RL ``.hdf5`` files, when a user has
them (``h5py`` needed).

:class:`RLData` is what the trainer consumes: every timestep of every trajectory starts one
segment of K steps (so a uniform draw over its items picks trajectories in proportion to their
length, as the DT's sampler); a segment that runs past its episode's end is padded on the right
and masked. States are normalised with the dataset's mean / std, returns-to-go (undiscounted) are
divided by :data:`RETURN_SCALE`, timesteps are capped at ``max_ep_len - 1``.
"""

from __future__ import annotations

import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from primal_attention.data.base import Batch, DataError

__all__ = ["D4RL_SCORES", "DATASETS", "ENVS", "ENV_SIZES", "RETURN_SCALE", "TARGET_RETURNS", "RLData", "dataset_file", "dataset_name",
           "env_key", "episodes", "load_transitions", "normalized_score", "returns_to_go"]

#: D4RL's reference returns (random, expert) per environment, from its ``infos.py``.
D4RL_SCORES = {"hopper": (-20.272305, 3234.3), "halfcheetah": (-280.178953, 12135.0), "walker2d": (1.629008, 4592.3)}
#: our environment name -> the gymnasium environment (same observation and action sizes as D4RL's).
ENVS = {"hopper": "Hopper-v5", "halfcheetah": "HalfCheetah-v5", "walker2d": "Walker2d-v5"}
#: (observation size, action size) of those environments, D4RL's too: a dataset must match them.
ENV_SIZES = {"hopper": (11, 3), "halfcheetah": (17, 6), "walker2d": (17, 6)}
#: the three D4RL datasets per environment of the paper's Table 4.
DATASETS = ("medium", "medium-replay", "medium-expert")
#: the authors' evaluation targets (the first is the default), per environment.
TARGET_RETURNS = {"hopper": (3600.0, 1800.0), "halfcheetah": (12000.0, 6000.0), "walker2d": (5000.0, 2500.0)}
#: returns-to-go are divided by this (the authors' ``scale``).
RETURN_SCALE = 1000.0
FIELDS = ("observations", "actions", "rewards", "terminals", "timeouts")


def env_key(env: str) -> str:
    """``hopper`` from ``hopper``, ``Hopper-v5`` or ``hopper-medium-v2``; a clear error otherwise."""
    key = env.lower().replace("_", "-").split("-")[0]
    if key not in D4RL_SCORES:
        raise ValueError(f"unknown environment {env!r}; expected one of {', '.join(D4RL_SCORES)}")
    return key


def normalized_score(env: str, total_return: float) -> float:
    """D4RL's normalised score: 100 · (return − random) / (expert − random), for an episode's return."""
    random, expert = D4RL_SCORES[env_key(env)]
    return 100.0 * (float(total_return) - random) / (expert - random)


def episodes(terminals: np.ndarray, timeouts: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of each episode: one ends after a terminal or a timeout; an unterminated tail
    (a dataset cut mid-episode) is an episode too."""
    ends = np.flatnonzero(np.asarray(terminals, bool) | np.asarray(timeouts, bool)) + 1
    bounds, start = [], 0
    for end in ends.tolist():
        bounds.append((start, end))
        start = end
    if start < len(terminals):
        bounds.append((start, len(terminals)))
    return bounds


def returns_to_go(rewards: np.ndarray, gamma: float = 1.0) -> np.ndarray:
    """rtg_t = Σ_{τ ≥ t} γ^(τ−t) r_τ of one episode's rewards (T,) -> (T,) float64."""
    r = np.asarray(rewards, np.float64)
    out = np.zeros_like(r)
    acc = 0.0
    for t in range(len(r) - 1, -1, -1):
        acc = r[t] + gamma * acc
        out[t] = acc
    return out


def load_transitions(path: str | Path, env: str | None = None) -> dict[str, np.ndarray]:
    """D4RL's fields of an ``.npz`` or ``.hdf5`` file, checked: present, same length, observations
    and actions (T, S) / (T, A) numbers, rewards / terminals / timeouts (T,), finite; with ``env``,
    S and A are those of that environment (:data:`ENV_SIZES`), so a dataset of another environment
    fails here instead of at the first rollout, after training."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"no RL dataset at {path}" + (" (collect it with `primal data collect-rl ENV`)"
                                                      if path.suffix == ".npz" else ""))
    if path.suffix in (".hdf5", ".h5"):
        try:
            import h5py
        except ImportError as err:
            raise DataError(f"{path}: reading D4RL HDF5 files needs h5py (pip install h5py)") from err
        with h5py.File(path, "r") as f:
            missing = [k for k in FIELDS if k not in f]
            if missing:
                raise DataError(f"{path}: not a D4RL file, missing {', '.join(missing)}")
            data = {k: np.asarray(f[k]) for k in FIELDS}
    else:
        try:
            with np.load(path) as f:
                missing = [k for k in FIELDS if k not in f.files]
                if missing:
                    raise DataError(f"{path}: missing {', '.join(missing)} (D4RL's fields: {', '.join(FIELDS)})")
                data = {k: f[k] for k in FIELDS}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as err:  # also a truncated file
            raise DataError(f"{path}: not a readable .npz file ({type(err).__name__}: {err})") from err
    ranks = {"observations": 2, "actions": 2, "rewards": 1, "terminals": 1, "timeouts": 1}
    wrong = [k for k in FIELDS if data[k].ndim != ranks[k]]
    if wrong:
        raise DataError(f"{path}: expected observations (T, S), actions (T, A) and rewards / terminals / timeouts "
                        f"(T,), got {', '.join(f'{k} {data[k].shape}' for k in wrong)}")
    n = len(data["rewards"])
    bad = [k for k in FIELDS if len(data[k]) != n]
    if bad:
        raise DataError(f"{path}: fields of different lengths ({ {k: data[k].shape for k in FIELDS} })")
    if n == 0:
        raise DataError(f"{path}: holds no transitions")
    kinds = {k: data[k].dtype.kind for k in FIELDS}
    not_numbers = [f"{k} {data[k].dtype}" for k in FIELDS if kinds[k] not in "biuf"]
    if not_numbers:
        raise DataError(f"{path}: expected numeric fields (terminals / timeouts bool or 0 / 1), got {', '.join(not_numbers)}")
    flags = [k for k in ("terminals", "timeouts") if kinds[k] != "b" and not np.isin(data[k], (0, 1)).all()]
    if flags:
        raise DataError(f"{path}: expected {' and '.join(flags)} of 0 / 1 (or bool), got other values")
    if env is not None:
        want = ENV_SIZES[env_key(env)]
        got = (data["observations"].shape[1], data["actions"].shape[1])
        if got != want:
            raise DataError(f"{path}: expected observations of size {want[0]} and actions of size {want[1]} for "
                            f"{env_key(env)}, got {got[0]} and {got[1]} (a dataset of another environment?)")
    for k in ("observations", "actions", "rewards"):
        if not np.isfinite(data[k]).all():
            raise DataError(f"{path}: {k} holds NaN or inf")
    return data


@dataclass
class RLData:
    """Trajectory segments of ``context`` steps for a Decision Transformer.

    Built with :meth:`from_transitions`. ``len()`` is the number of timesteps (segment starts);
    :meth:`batch` gives states (B, K, S) normalised as ``x``, ``mask`` (B, K) bool, and in
    ``extra`` actions (B, K, A), returns_to_go (B, K, 1) (scaled) and timesteps (B, K) int64;
    ``y`` is the actions (B, K, A) to predict.
    """

    states: torch.Tensor  # (T, S) normalised
    actions: torch.Tensor  # (T, A)
    rtg: torch.Tensor  # (T,) scaled returns-to-go
    timesteps: torch.Tensor  # (T,) int64, capped
    episode_end: torch.Tensor  # (T,) int64: end of each step's episode
    context: int
    env: str
    state_mean: np.ndarray
    state_std: np.ndarray
    max_ep_len: int = 1000
    name: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_transitions(cls, data: dict[str, np.ndarray], *, env: str, context: int, max_ep_len: int = 1000,
                         name: str = "", meta: dict[str, Any] | None = None) -> "RLData":
        if context < 1:
            raise ValueError(f"context must be positive, got {context}")
        obs = np.asarray(data["observations"], np.float64)
        mean, std = obs.mean(0), obs.std(0) + 1e-6
        bounds = episodes(data["terminals"], data["timeouts"])
        rtg = np.concatenate([returns_to_go(data["rewards"][a:b]) for a, b in bounds])
        steps = np.concatenate([np.arange(b - a) for a, b in bounds])
        ends = np.concatenate([np.full(b - a, b) for a, b in bounds])
        returns = [float(np.sum(data["rewards"][a:b])) for a, b in bounds]
        info = {"transitions": len(obs), "episodes": len(bounds), "return_mean": float(np.mean(returns)),
                "return_max": float(np.max(returns)), **(meta or {})}
        return cls(torch.from_numpy(((obs - mean) / std).astype(np.float32)),
                   torch.from_numpy(np.asarray(data["actions"], np.float32)),
                   torch.from_numpy((rtg / RETURN_SCALE).astype(np.float32)),
                   torch.from_numpy(np.minimum(steps, max_ep_len - 1).astype(np.int64)),
                   torch.from_numpy(ends.astype(np.int64)), context, env_key(env), mean, std, max_ep_len, name, info)

    @property
    def state_dim(self) -> int:
        return self.states.shape[1]

    @property
    def act_dim(self) -> int:
        return self.actions.shape[1]

    def __len__(self) -> int:
        return self.states.shape[0]

    def batch(self, index: torch.Tensor) -> Batch:
        """Segments starting at the timesteps ``index`` (B,), right-padded past their episode's end."""
        index = torch.as_tensor(index, dtype=torch.int64).reshape(-1)
        offsets = torch.arange(self.context)
        pos = index[:, None] + offsets  # (B, K)
        mask = pos < self.episode_end[index][:, None]
        pos = torch.where(mask, pos, index[:, None])  # padding reads a valid row, then is zeroed
        m = mask[..., None]
        actions = self.actions[pos] * m
        extra = {"actions": actions, "returns_to_go": (self.rtg[pos] * mask)[..., None],
                 "timesteps": self.timesteps[pos] * mask}
        return Batch(x=self.states[pos] * m, y=actions, mask=mask, extra=extra)


def dataset_name(name: str) -> tuple[str, str]:
    """``("hopper", "medium-replay")`` from ``hopper-medium-replay`` (or D4RL's ``hopper-medium-replay-v2``)."""
    key = env_key(name)
    rest = name.lower()[len(key) + 1:]
    rest = rest[:-3] if rest.endswith(("-v0", "-v1", "-v2")) else rest
    rest = rest.replace("_", "-")
    if rest not in DATASETS + ("expert",):
        raise ValueError(f"unknown RL dataset {name!r}; expected <env>-<dataset> with env one of "
                         f"{', '.join(D4RL_SCORES)} and dataset one of {', '.join(DATASETS + ('expert',))}")
    return key, rest


def dataset_file(name: str, data_dir: str | Path | None = None, collection_seed: int = 0) -> Path:
    """Where the dataset ``name`` lives: in ``data_dir`` (``<env>-<dataset>.npz``, or D4RL's
    ``<env>_<dataset>-v2.hdf5`` with ``_`` for ``-``), else the collected file in the cache."""
    from primal_attention.data.cache import cache_dir

    env, ds = dataset_name(name)
    if data_dir is None:
        return cache_dir("rl") / f"{env}-{ds}-seed{collection_seed}.npz"
    root = Path(data_dir)
    under = ds.replace("-", "_")
    candidates = [root / f"{env}-{ds}.npz", root / f"{env}_{under}-v2.hdf5", root / f"{env}-{ds}-v2.hdf5",
                  root / f"{env}_{under}.hdf5"]
    for path in candidates:
        if path.is_file():
            return path
    raise DataError(f"no {env}-{ds} dataset in {root}: expected one of {', '.join(p.name for p in candidates)}")
