"""`primal data collect-rl` on a tiny budget (valid D4RL-format files, a card, resumable with the same
result), then `primal train` of DT and Primal.+DT on what it collected, with rollouts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from primal_attention.data.rl import FIELDS, load_transitions

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--medium-max-steps", "200", "--chunk", "100", "--learning-starts", "50", "--eval-episodes", "1",
        "--transitions", "300", "--medium-fraction", "0"]


def cli(*args: str, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PRIMAL_ATTENTION_CACHE": str(cache)}
    return subprocess.run([sys.executable, "-m", "primal_attention.cli", *args], capture_output=True, text=True,
                          env=env, timeout=600)


@pytest.fixture(scope="module")
def collected(tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("cache")
    proc = cli("data", "collect-rl", "hopper", "--expert-steps", "300", *TINY, cache=cache)
    assert proc.returncode == 0, proc.stderr
    assert "medium policy at 100 SAC steps" in proc.stdout
    return cache


def test_collection_writes_d4rl_files_and_a_card(collected) -> None:
    folder = collected / "rl"
    card = json.loads((folder / "hopper-seed0-card.json").read_text())
    assert card["sac"]["steps"] == 300 and card["medium_policy"]["steps"] == 100 and card["medium_policy"]["reached"]
    assert [e["steps"] for e in card["sac"]["evals"]] == [100, 200, 300]
    sizes = {}
    for name in ("medium", "medium-replay", "medium-expert", "expert"):
        data = load_transitions(folder / f"hopper-{name}-seed0.npz")
        sizes[name] = len(data["rewards"])
        assert data["observations"].shape[1] == 11 and data["actions"].shape[1] == 3
        assert np.abs(data["actions"]).max() <= 1
        assert data["terminals"][-1] or data["timeouts"][-1]  # the last episode is closed
        assert card["datasets"][name]["transitions"] == sizes[name]
    assert sizes == {"medium": 300, "medium-replay": 100, "medium-expert": 600, "expert": 300}
    me = np.load(folder / "hopper-medium-expert-seed0.npz")
    m = np.load(folder / "hopper-medium-seed0.npz")
    assert set(me.files) >= set(FIELDS) and np.array_equal(me["observations"][:300], m["observations"])
    assert (folder / "hopper-seed0" / "medium_policy.zip").is_file() and (folder / "hopper-seed0" / "expert_policy.zip").is_file()


def test_a_resumed_collection_gives_the_same_files(collected, tmp_path) -> None:
    first = cli("data", "collect-rl", "hopper", "--expert-steps", "200", *TINY, cache=tmp_path)
    assert first.returncode == 0, first.stderr
    again = cli("data", "collect-rl", "hopper", "--expert-steps", "300", *TINY, cache=tmp_path)
    assert again.returncode == 0, again.stderr
    for name in ("medium-replay", "medium", "expert", "medium-expert"):
        a = np.load(tmp_path / "rl" / f"hopper-{name}-seed0.npz")
        b = np.load(collected / "rl" / f"hopper-{name}-seed0.npz")
        for k in FIELDS:
            assert np.array_equal(a[k], b[k]), (name, k)
    changed = cli("data", "collect-rl", "hopper", "--expert-steps", "300", *TINY[:-1], "0.5", cache=tmp_path)
    assert changed.returncode == 2 and "collected with other settings (medium_fraction)" in changed.stderr


def test_collect_rl_bad_input() -> None:
    proc = cli("data", "collect-rl", "ant", cache=Path("/nonexistent-cache"))
    assert proc.returncode == 2 and "unknown environment 'ant'" in proc.stderr and "Traceback" not in proc.stderr


SMALL = ["--set", "train.steps=6", "--set", "train.eval_every=3", "--set", "optim.warmup_steps=2", "--set",
         "data.options.eval_episodes=2", "--set", "data.options.max_ep_len=40", "--set", "model.dim=16", "--set",
         "model.ffn_dim=32", "--set", "model.attention_options.primal.rank=4", "--set", "train.batch_size=8",
         "--set", "train.progress=false", "--set", "data.seq_len=5"]


@pytest.mark.parametrize("model", ["dt", "primal+"])
def test_train_dt_with_rollouts_on_the_collected_data(collected, tmp_path, model) -> None:
    out = tmp_path / "run"
    proc = cli("train", str(ROOT / "configs" / "rl" / f"hopper-medium_{model}.yaml"), "--out", str(out), *SMALL,
               cache=collected)
    assert proc.returncode == 0, proc.stderr
    m = json.loads((out / "seed_0" / "metrics.json").read_text())
    assert m["protocol"] == "holdout" and 0 < m["test_length"] <= 40 and np.isfinite(m["test_score"])
    assert m["best_val_score"] >= m["final_val_score"] and m["best_test_score"] >= m["test_score"] - 1e-9
    assert bool(m["ksvd_j_final"]) == (model == "primal+")
    ev = cli("eval", str(out), cache=collected)
    assert ev.returncode == 0, ev.stderr
    assert json.loads(ev.stdout)["seed_0"]["test"]["score"] == pytest.approx(m["test_score"], rel=1e-6)


@pytest.mark.parametrize(("extra", "message"), [
    (["data.name=hopper-random"], "unknown RL dataset"),
    (["data.options.episodes=3"], "unknown for data.family rl"),
    (["data.options.eval_episodes=0"], "eval_episodes must be a positive integer"),
    (["data.options.eval_episodes=10001"], "would share environment seeds"),
    (["data.seq_len=null"], "the context K in steps"),
    (["data.seq_len=100000"], "exceeds an episode"),
    (["data.options.target_return=.nan"], "target_return must be a finite number"),
    (["data.options.collection_seed=7"], "collect it with `primal data collect-rl ENV`"),
])
def test_bad_rl_configs_are_one_line_errors(collected, tmp_path, extra, message) -> None:
    sets = [x for e in extra for x in ("--set", e)]
    proc = cli("train", str(ROOT / "configs" / "rl" / "hopper-medium_primal+.yaml"), "--out", str(tmp_path / "x"),
               *SMALL, *sets, cache=collected)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_collect_rl_names_the_bad_option_and_an_unusable_cache(tmp_path, monkeypatch, capsys) -> None:
    from primal_attention.cli import main

    monkeypatch.setenv("PRIMAL_ATTENTION_CACHE", str(tmp_path / "cache"))
    assert main(["data", "collect-rl", "hopper", "--learning-starts", "-5"]) == 2
    err = capsys.readouterr().err
    assert "learning_starts must be >= 0, got -5" in err and "medium_fraction" not in err
    assert main(["data", "collect-rl", "hopper", "--seed", str(2**40)]) == 2
    assert "seed must be in [0, 40000], got 1099511627776" in capsys.readouterr().err
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("PRIMAL_ATTENTION_CACHE", str(tmp_path / "file"))
    assert main(["data", "collect-rl", "hopper", *TINY, "--expert-steps", "300"]) == 2
    err = capsys.readouterr().err
    assert "cannot use the cache folder" in err and "set PRIMAL_ATTENTION_CACHE to a writable folder" in err
    assert len(err.strip().splitlines()) == 1


class _Payload:
    def __reduce__(self):
        return (os.system, ("touch payload-ran",))


def test_a_crafted_agent_or_replay_file_in_the_cache_runs_no_code(tmp_path, monkeypatch) -> None:
    import base64
    import pickle
    import zipfile

    import gymnasium as gym

    from primal_attention.data.base import DataError
    from primal_attention.data.rl_collect import load_sac

    monkeypatch.chdir(tmp_path)
    fields = {"_last_obs": {":type:": "x", ":serialized:": base64.b64encode(pickle.dumps(_Payload())).decode()}}
    with zipfile.ZipFile(tmp_path / "sac-1.zip", "w") as z:
        z.writestr("data", json.dumps(fields))
    with pytest.raises(DataError, match="refused to load (posix|os|nt).system"):
        load_sac(tmp_path / "sac-1.zip", gym.make("Hopper-v5"))
    assert not (tmp_path / "payload-ran").exists()


def test_the_collector_keeps_no_pickle(collected) -> None:
    assert not list((collected / "rl").glob("**/*.pkl"))


def test_ridge_fit_recovers_a_linear_map_and_shrinks_all_but_the_bias() -> None:
    import torch

    from primal_attention.train.trivial import ridge_fit

    g = torch.Generator().manual_seed(0)
    x = torch.randn(500, 4, generator=g)
    w = torch.randn(4, 2, generator=g)
    y = x @ w + torch.tensor([0.5, -1.0])
    fit = ridge_fit(x, y, 1e-8)
    assert np.allclose(fit[:4], w.numpy(), atol=1e-6) and np.allclose(fit[4], [0.5, -1.0], atol=1e-6)
    heavy = ridge_fit(x, y, 1e9)  # the weights go to 0; the bias becomes the mean of y
    assert np.abs(heavy[:4]).max() < 1e-4 and np.allclose(heavy[4], y.mean(0).numpy(), atol=1e-3)


def test_rl_baselines_are_the_behaviour_policy_and_a_linear_policy_rolled_out(collected) -> None:
    proc = cli("baselines", str(ROOT / "configs" / "rl" / "hopper-medium_dt.yaml"), "--set", "data.options.eval_episodes=2",
               "--set", "data.options.max_ep_len=40", cache=collected)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["seed_0"]
    assert set(rows) == {"behaviour", "linear"}
    assert "chosen on 2 validation rollouts" in rows["linear"]["what"] and rows["linear"]["choice"] in rows["linear"]["tried"]
    assert all(np.isfinite(rows["linear"][k]) for k in ("val_score", "test_score"))
