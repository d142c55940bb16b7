"""Collect D4RL-style datasets here: SAC (stable-baselines3) on a gymnasium MuJoCo environment.

D4RL's MuJoCo datasets were made by training a SAC agent, stopping a copy when it reached about a
third of the expert's return (the *medium* policy) and training on to an *expert*; ``medium``
holds rollouts of the medium policy, ``medium-replay`` the agent's replay buffer up to the point
it reached medium, ``medium-expert`` medium plus expert rollouts. :func:`collect_rl` does the same:

1. SAC trains in chunks of ``chunk`` steps. After each chunk the agent, its replay buffer and
   ``progress.json`` are saved (the progress file last, atomically: it is the commit point), and
   the policy is evaluated on ``eval_episodes`` episodes. Every chunk starts from the saved files
   with its RNGs seeded from (seed, chunk index) and a fresh episode, so an interrupted collection
   resumed from its last chunk gives the same files as an uninterrupted one.
2. The first policy whose evaluation reaches ``medium_fraction`` × D4RL's expert reference return
   becomes the medium policy, and the replay buffer up to then the ``medium-replay`` dataset
   (episodes cut at chunk boundaries end with a timeout). If none does within
   ``medium_max_steps``, the best policy so far becomes the medium one (the card says so).
3. Training continues to ``expert_steps`` in all; the last policy is the expert one.
4. ``transitions`` steps of rollouts of each policy (stochastic actions, as D4RL) give ``medium``
   (rolled out as soon as the medium policy is fixed, so it can be used while SAC goes on) and the
   expert rollouts; ``medium-expert`` is both.

Files (never in the repository): ``cache_dir("rl")/<env>-<dataset>-seed<k>.npz`` with D4RL's fields
(observations, actions, rewards, terminals, timeouts, next_observations), the agent's files in
``cache_dir("rl", "<env>-seed<k>")``, and the dataset card ``<env>-seed<k>-card.json`` beside the data.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from primal_attention.data.base import DataError
from primal_attention.data.cache import cache_dir
from primal_attention.data.fetch import say
from primal_attention.data.rl import D4RL_SCORES, ENVS, env_key

__all__ = ["CollectConfig", "collect_rl"]


#: the largest collection seed: SAC's seed is seed · 100 003 + chunk, and stable-baselines3 hands it to
#: numpy, which takes seeds below 2**32.
MAX_SEED = 40_000


@dataclass
class CollectConfig:
    """A collection: environment, seed and the CPU budget (SAC steps, rollout transitions)."""

    env: str
    seed: int = 0
    medium_fraction: float = 1 / 3
    medium_max_steps: int = 300_000
    expert_steps: int = 1_000_000
    chunk: int = 10_000
    learning_starts: int = 10_000
    eval_episodes: int = 5
    transitions: int = 1_000_000
    rollout_envs: int = 10
    threads: int = 1

    def check(self) -> None:
        env_key(self.env)
        ints = {k: getattr(self, k) for k in ("medium_max_steps", "expert_steps", "chunk", "eval_episodes",
                                               "transitions", "rollout_envs", "threads")}
        bad = [f"{k} must be >= 1, got {v}" for k, v in ints.items() if v < 1]
        if self.learning_starts < 0:
            bad.append(f"learning_starts must be >= 0, got {self.learning_starts}")
        if not 0 <= self.medium_fraction <= 1.5:
            bad.append(f"medium_fraction must be in [0, 1.5], got {self.medium_fraction}")
        if not 0 <= self.seed <= MAX_SEED:
            bad.append(f"seed must be in [0, {MAX_SEED}], got {self.seed}")
        if bad:  # the CLI's options are these names with dashes (--learning-starts)
            raise ValueError(f"collect-rl: {'; '.join(bad)}")
        if self.medium_max_steps > self.expert_steps:
            raise ValueError(f"collect-rl: medium_max_steps {self.medium_max_steps} exceeds expert_steps {self.expert_steps}")


def _atomic(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def _dataset_path(env: str, dataset: str, seed: int) -> Path:
    return cache_dir("rl") / f"{env}-{dataset}-seed{seed}.npz"


def _save_npz(path: Path, data: dict[str, np.ndarray]) -> None:
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            np.savez(f, **data)

    _atomic(path, write)


def _episode_returns(data: dict[str, np.ndarray]) -> list[float]:
    from primal_attention.data.rl import episodes

    return [float(data["rewards"][a:b].sum()) for a, b in episodes(data["terminals"], data["timeouts"])]


def _stats(data: dict[str, np.ndarray], env: str) -> dict[str, Any]:
    from primal_attention.data.rl import normalized_score

    r = np.array(_episode_returns(data))
    return {"transitions": int(len(data["rewards"])), "episodes": int(len(r)), "return_mean": float(r.mean()),
            "return_std": float(r.std()), "return_min": float(r.min()), "return_max": float(r.max()),
            "score_mean": normalized_score(env, float(r.mean()))}


def _sac(env_name: str, cfg: CollectConfig, folder: Path, chunk_index: int):
    """The agent at the start of chunk ``chunk_index``: new, or loaded with its replay buffer."""
    import gymnasium as gym
    from stable_baselines3 import SAC

    env = gym.make(ENVS[env_name])
    seed = cfg.seed * 100_003 + chunk_index
    if chunk_index == 0:
        model = SAC("MlpPolicy", env, seed=seed, learning_starts=cfg.learning_starts, verbose=0, device="cpu")
    else:
        model = load_sac(folder / f"sac-{chunk_index}.zip", env)
        _load_replay(model, folder / f"replay-{chunk_index}.npz")
        model.set_random_seed(seed)
    model.env.seed(seed)
    return model


#: the records an SB3 agent's zip pickles besides arrays: its training frequency and learning-rate schedule.
_SB3_RECORDS = frozenset({("collections", "deque"),
                          ("stable_baselines3.common.type_aliases", "TrainFreq"),
                          ("stable_baselines3.common.type_aliases", "TrainFrequencyUnit"),
                          ("stable_baselines3.common.utils", "FloatSchedule"),
                          ("stable_baselines3.common.utils", "ConstantSchedule")})


def load_sac(path: Path, env: Any):
    """An SB3 SAC agent from its zip without running code the zip names: SB3 cloudpickles some of its
    fields, so those are given here (the spaces from ``env``, the policy and buffer classes) or read as
    plain data (:func:`~primal_attention.data.safe_pickle.load_data_pickle`); its weights load with
    ``torch.load(weights_only=True)`` inside SB3. A crafted zip is a :class:`DataError`."""
    import base64
    import zipfile

    from stable_baselines3 import SAC
    from stable_baselines3.common.buffers import ReplayBuffer
    from stable_baselines3.sac.policies import SACPolicy

    from primal_attention.data.safe_pickle import load_data_pickle

    try:
        with zipfile.ZipFile(path) as z:
            fields = json.loads(z.read("data"))
        custom: dict[str, Any] = {"observation_space": env.observation_space, "action_space": env.action_space,
                                  "policy_class": SACPolicy, "replay_buffer_class": ReplayBuffer}
        for key, value in fields.items():
            if key not in custom and isinstance(value, dict) and ":serialized:" in value:
                custom[key] = load_data_pickle(base64.b64decode(value[":serialized:"].encode()), extra=_SB3_RECORDS)
        return SAC.load(path, env=env, device="cpu", custom_objects=custom)
    except (OSError, KeyError, ValueError, zipfile.BadZipFile, pickle.UnpicklingError, EOFError) as err:
        raise DataError(f"collect-rl: {path} is not an agent this collector saved ({err})") from err


def _save_replay(model: Any, path: Path) -> None:
    """The SAC replay buffer as arrays (no pickle): what it holds, its position and whether it is full."""
    buf = model.replay_buffer
    arrays = {k: getattr(buf, k) for k in REPLAY_ARRAYS}
    with open(path, "wb") as fh:
        np.savez(fh, pos=np.int64(buf.pos), full=np.bool_(buf.full), **arrays)


def _load_replay(model: Any, path: Path) -> None:
    """Fill the SAC replay buffer from :func:`_save_replay`'s arrays (shapes checked)."""
    buf = model.replay_buffer
    try:
        with np.load(path, allow_pickle=False) as z:
            for k in REPLAY_ARRAYS:
                if z[k].shape != getattr(buf, k).shape:
                    raise ValueError(f"{k} of shape {z[k].shape}, expected {getattr(buf, k).shape}")
                getattr(buf, k)[...] = z[k]
            buf.pos, buf.full = int(z["pos"]), bool(z["full"])
    except (OSError, KeyError, ValueError) as err:
        raise DataError(f"collect-rl: {path} is not a replay buffer this collector saved ({err})") from err


#: the arrays of an SB3 ReplayBuffer (one environment, no memory optimisation).
REPLAY_ARRAYS = ("observations", "next_observations", "actions", "rewards", "dones", "timeouts")


def _policy_actions(model, obs: np.ndarray) -> np.ndarray:
    """Stochastic actions of the SAC policy for a batch of observations (B, S) -> (B, A)."""
    actions, _ = model.predict(obs, deterministic=False)
    return actions


def _rollouts(model, env_name: str, n_transitions: int, n_envs: int, seed: int) -> dict[str, np.ndarray]:
    """``n_transitions`` steps of the policy in ``n_envs`` environments in lockstep (whole episodes,
    the last one cut with a timeout), in episode order."""
    import gymnasium as gym
    import torch

    torch.manual_seed(seed)
    envs = [gym.make(ENVS[env_name]) for _ in range(n_envs)]
    episode = 0
    obs = []
    for env in envs:
        o, _ = env.reset(seed=seed + episode)
        episode += 1
        obs.append(o)
    current: list[dict[str, list]] = [{k: [] for k in ("o", "a", "r", "d", "t", "n")} for _ in envs]
    done_eps: list[dict[str, list]] = []
    total = 0
    while total < n_transitions:
        acts = _policy_actions(model, np.stack(obs))
        for i, env in enumerate(envs):
            o2, r, term, trunc, _ = env.step(acts[i])
            c = current[i]
            c["o"].append(obs[i]); c["a"].append(acts[i]); c["r"].append(r)
            c["d"].append(term); c["t"].append(trunc and not term); c["n"].append(o2)
            total += 1
            if term or trunc:
                done_eps.append(c)
                current[i] = {k: [] for k in c}
                o2, _ = env.reset(seed=seed + episode)
                episode += 1
            obs[i] = o2
    for c in current:  # unfinished episodes: cut with a timeout
        if c["o"]:
            c["t"][-1] = True
            done_eps.append(c)
    for env in envs:
        env.close()
    cat = lambda k, dt: np.concatenate([np.asarray(c[k], dt) for c in done_eps])[:n_transitions]  # noqa: E731
    data = {"observations": cat("o", np.float32), "actions": cat("a", np.float32), "rewards": cat("r", np.float32),
            "terminals": cat("d", bool), "timeouts": cat("t", bool), "next_observations": cat("n", np.float32)}
    if not (data["terminals"][-1] or data["timeouts"][-1]):
        data["timeouts"][-1] = True
    return data


def _evaluate(model, env_name: str, episodes: int, seed: int) -> float:
    import gymnasium as gym
    import torch

    torch.manual_seed(seed)
    returns = []
    env = gym.make(ENVS[env_name])
    for e in range(episodes):
        o, _ = env.reset(seed=seed + e)
        total, done = 0.0, False
        while not done:
            o, r, term, trunc, _ = env.step(_policy_actions(model, o[None])[0])
            total += r
            done = term or trunc
        returns.append(total)
    env.close()
    return float(np.mean(returns))


def _replay_dataset(model, chunk_ends: list[int]) -> dict[str, np.ndarray]:
    """The replay buffer so far in D4RL's format; episodes cut at chunk boundaries end with a timeout."""
    buf = model.replay_buffer
    n = buf.buffer_size if buf.full else buf.pos
    if buf.full:
        raise DataError("collect-rl: the replay buffer wrapped around; medium-replay would be incomplete")
    dones = buf.dones[:n, 0].astype(bool)
    timeouts = buf.timeouts[:n, 0].astype(bool)
    cut = np.zeros(n, bool)
    for end in chunk_ends:
        if 0 < end <= n:
            cut[end - 1] = True
    cut[n - 1] = True
    terminals = dones & ~timeouts
    return {"observations": buf.observations[:n, 0].astype(np.float32), "actions": buf.actions[:n, 0].astype(np.float32),
            "rewards": buf.rewards[:n, 0].astype(np.float32), "terminals": terminals,
            "timeouts": (timeouts & dones) | (cut & ~terminals),
            "next_observations": buf.next_observations[:n, 0].astype(np.float32)}


def collect_rl(cfg: CollectConfig, progress: bool = True) -> dict[str, Any]:
    """Run (or continue) the collection of ``cfg``; returns the dataset card (also written as JSON)."""
    try:
        import gymnasium  # noqa: F401
        import stable_baselines3  # noqa: F401
    except ImportError as err:
        raise DataError("collect-rl needs gymnasium[mujoco] and stable-baselines3: "
                        "pip install 'gymnasium[mujoco]' stable-baselines3 (or this package's [rl] extra)") from err
    import torch

    cfg.check()
    env = env_key(cfg.env)
    torch.set_num_threads(cfg.threads)
    folder = cache_dir("rl", f"{env}-seed{cfg.seed}")
    folder.mkdir(parents=True, exist_ok=True)
    progress_file = folder / "progress.json"
    state = json.loads(progress_file.read_text()) if progress_file.is_file() else {
        "config": asdict(cfg), "steps": 0, "chunks": 0, "evals": [], "chunk_ends": [], "medium": None,
        "best": None, "sac_seconds": 0.0}
    frozen = {k: v for k, v in state["config"].items() if k not in ("expert_steps", "transitions", "threads")}
    now = {k: v for k, v in asdict(cfg).items() if k not in ("expert_steps", "transitions", "threads")}
    if frozen != now:
        diff = sorted(k for k in now if frozen.get(k) != now[k])
        raise DataError(f"collect-rl: {folder} was collected with other settings ({', '.join(diff)}); "
                        "use another --seed or delete the folder")
    state["config"].update(expert_steps=cfg.expert_steps, transitions=cfg.transitions)
    target = cfg.medium_fraction * D4RL_SCORES[env][1]
    if state["steps"] > cfg.expert_steps:
        raise DataError(f"collect-rl: {folder} already trained {state['steps']} steps, past --expert-steps {cfg.expert_steps}")

    trained_more = False
    while state["steps"] < cfg.expert_steps:
        trained_more = True
        t0 = time.time()
        model = _sac(env, cfg, folder, state["chunks"])
        n = min(cfg.chunk, cfg.expert_steps - state["steps"])
        model.learn(n, reset_num_timesteps=False)
        state["steps"] += n
        state["chunks"] += 1
        state["chunk_ends"].append(int(model.replay_buffer.pos))
        ret = _evaluate(model, env, cfg.eval_episodes, seed=cfg.seed * 100_003 + 50_000 + state["chunks"])
        state["evals"].append({"steps": state["steps"], "return": ret})
        state["sac_seconds"] += time.time() - t0
        c = state["chunks"]  # this chunk's files; progress.json names them once written
        model.save(folder / f"sac-{c}.zip")
        _save_replay(model, folder / f"replay-{c}.npz")
        if state["medium"] is None:
            if state["best"] is None or ret > state["best"]["return"]:
                shutil.copyfile(folder / f"sac-{c}.zip", folder / "best_policy.zip")
                state["best"] = {"steps": state["steps"], "return": ret}
            reached = ret >= target
            if reached or state["steps"] >= cfg.medium_max_steps:
                chosen = state["steps"] if reached else state["best"]["steps"]
                src = folder / (f"sac-{c}.zip" if reached else "best_policy.zip")
                shutil.copyfile(src, folder / "medium_policy.zip")
                _save_npz(_dataset_path(env, "medium-replay", cfg.seed), _replay_dataset(model, state["chunk_ends"])
                          if reached else _replay_upto(model, state, chosen))
                state["medium"] = {"steps": chosen, "return": state["best"]["return"] if not reached else ret,
                                   "target": target, "reached": bool(reached)}
                _policy_rollouts(cfg, env, folder, "medium", progress)  # usable while SAC goes on to the expert
        _atomic(progress_file, lambda p: p.write_text(json.dumps(state, indent=1)))
        for old in (folder / f"sac-{c - 1}.zip", folder / f"replay-{c - 1}.npz"):
            old.unlink(missing_ok=True)
        say(progress, f"collect-rl {env}: {state['steps']} SAC steps, eval return {ret:.0f} "
                      f"(medium target {target:.0f}{', medium fixed' if state['medium'] else ''}), "
                      f"{time.time() - t0:.0f} s")
    shutil.copyfile(folder / f"sac-{state['chunks']}.zip", folder / "expert_policy.zip")

    card_stats = {}
    me = _dataset_path(env, "medium-expert", cfg.seed)
    for name in ("medium", "expert"):  # rollouts of an older expert, or of another size, are redone
        path = _dataset_path(env, name, cfg.seed)
        if path.is_file() and ((trained_more and name == "expert") or len(np.load(path)["rewards"]) != cfg.transitions):
            path.unlink()
            me.unlink(missing_ok=True)
    for name in ("medium", "expert"):
        _policy_rollouts(cfg, env, folder, name, progress)
    loaded = {name: dict(np.load(_dataset_path(env, name, cfg.seed))) for name in ("medium", "expert", "medium-replay")}
    if not me.is_file():
        _save_npz(me, {k: np.concatenate([loaded["medium"][k], loaded["expert"][k]]) for k in loaded["medium"]})
    loaded["medium-expert"] = dict(np.load(me))
    for name, data in loaded.items():
        card_stats[name] = {"file": str(_dataset_path(env, name, cfg.seed)), **_stats(data, env)}
    card = {"env": env, "gymnasium_env": ENVS[env], "seed": cfg.seed, "config": state["config"],
            "sac": {"library": f"stable-baselines3 {stable_baselines3_version()}", "steps": state["steps"],
                    "cpu_seconds": state["sac_seconds"], "evals": state["evals"]},
            "medium_policy": state["medium"], "expert_policy": {"steps": state["steps"], "return": state["evals"][-1]["return"]},
            "d4rl_reference_returns": dict(zip(("random", "expert"), D4RL_SCORES[env])),
            "policies": {k: str(folder / f"{k}_policy.zip") for k in ("medium", "expert")}, "datasets": card_stats}
    _atomic(cache_dir("rl") / f"{env}-seed{cfg.seed}-card.json", lambda p: p.write_text(json.dumps(card, indent=1)))
    return card


def _policy_rollouts(cfg: CollectConfig, env: str, folder: Path, name: str, progress: bool) -> None:
    """The ``name`` ("medium" or "expert") dataset: rollouts of that policy, unless already on disk."""
    import gymnasium as gym

    path = _dataset_path(env, name, cfg.seed)
    if path.is_file():
        return
    t0 = time.time()
    model = load_sac(folder / f"{name}_policy.zip", gym.make(ENVS[env]))
    offset = {"medium": 1, "expert": 2}[name]
    _save_npz(path, _rollouts(model, env, cfg.transitions, cfg.rollout_envs, seed=cfg.seed * 10_000_019 + offset * 1_000_000))
    say(progress, f"collect-rl {env}: {cfg.transitions} {name} transitions in {time.time() - t0:.0f} s")


def _replay_upto(model, state: dict, steps: int) -> dict[str, np.ndarray]:
    """The replay buffer up to ``steps`` SAC steps (the best policy's point), chunk-cut as above."""
    data = _replay_dataset(model, state["chunk_ends"])
    end = state["chunk_ends"][[e["steps"] for e in state["evals"]].index(steps)]
    return {k: v[:end] for k, v in data.items()}


def stable_baselines3_version() -> str:
    import stable_baselines3

    return stable_baselines3.__version__
