"""RL data: D4RL's score constants, episodes and returns-to-go, segment sampling with padding and masks,
file loading and its errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from primal_attention.data.base import DataError
from primal_attention.data.rl import (
    RETURN_SCALE,
    RLData,
    dataset_file,
    dataset_name,
    episodes,
    load_transitions,
    normalized_score,
    returns_to_go,
)


def toy(lengths=(5, 3, 4), s=3, a=2, seed=0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = sum(lengths)
    terminals, timeouts = np.zeros(n, bool), np.zeros(n, bool)
    ends = np.cumsum(lengths) - 1
    terminals[ends[0]] = True
    timeouts[ends[1]] = True  # the last episode is an unterminated tail
    return {"observations": rng.normal(size=(n, s)).astype(np.float32), "actions": rng.uniform(-1, 1, (n, a)).astype(np.float32),
            "rewards": np.arange(n, dtype=np.float32), "terminals": terminals, "timeouts": timeouts}


def test_normalized_score_uses_d4rl_reference_returns() -> None:
    assert normalized_score("hopper", -20.272305) == pytest.approx(0.0)
    assert normalized_score("Hopper-v5", 3234.3) == pytest.approx(100.0)
    assert normalized_score("halfcheetah-medium-v2", (12135.0 - 280.178953) / 2) == pytest.approx(50.0, abs=1e-9)
    assert normalized_score("walker2d", 4592.3) == pytest.approx(100.0)
    with pytest.raises(ValueError, match="unknown environment"):
        normalized_score("ant", 1.0)


def test_episodes_and_returns_to_go() -> None:
    d = toy()
    assert episodes(d["terminals"], d["timeouts"]) == [(0, 5), (5, 8), (8, 12)]
    np.testing.assert_allclose(returns_to_go([1.0, 2.0, 3.0]), [6.0, 5.0, 3.0])
    np.testing.assert_allclose(returns_to_go([1.0, 2.0, 3.0], gamma=0.5), [1 + 0.5 * (2 + 0.5 * 3), 2 + 1.5, 3.0])


def test_segments_are_right_padded_and_masked_at_episode_ends() -> None:
    d = toy()
    data = RLData.from_transitions(d, env="hopper", context=4, max_ep_len=3)
    assert len(data) == 12 and data.state_dim == 3 and data.act_dim == 2
    b = data.batch(torch.tensor([0, 3, 6, 11]))
    assert b.x.shape == (4, 4, 3) and b.extra["actions"].shape == (4, 4, 2) and b.extra["returns_to_go"].shape == (4, 4, 1)
    assert b.mask.tolist() == [[True] * 4, [True, True, False, False], [True, True, False, False], [True, False, False, False]]
    assert (b.x[~b.mask] == 0).all() and (b.y[~b.mask] == 0).all() and (b.extra["timesteps"][~b.mask] == 0).all()
    # returns-to-go within the first episode (rewards 0..4), scaled
    torch.testing.assert_close(b.extra["returns_to_go"][0, :, 0], torch.tensor([10.0, 10.0, 9.0, 7.0]) / RETURN_SCALE)
    assert b.extra["timesteps"][0].tolist() == [0, 1, 2, 2]  # capped at max_ep_len - 1
    assert b.extra["timesteps"][2, :2].tolist() == [1, 2]  # step 6 is the second of the episode starting at 5
    mean = d["observations"].mean(0)
    std = d["observations"].std(0) + 1e-6
    torch.testing.assert_close(b.x[0, 0], torch.from_numpy((d["observations"][0] - mean) / std))
    assert torch.equal(b.y, b.extra["actions"])


def test_dataset_names_and_files(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PRIMAL_ATTENTION_CACHE", str(tmp_path / "cache"))
    assert dataset_name("hopper-medium-replay") == ("hopper", "medium-replay")
    assert dataset_name("walker2d_medium_expert-v2") == ("walker2d", "medium-expert")
    with pytest.raises(ValueError, match="unknown RL dataset"):
        dataset_name("hopper-random")
    assert dataset_file("hopper-medium", None, 3).name == "hopper-medium-seed3.npz"
    with pytest.raises(DataError, match="expected one of hopper-medium.npz, hopper_medium-v2.hdf5"):
        dataset_file("hopper-medium", tmp_path)
    np.savez(tmp_path / "hopper-medium.npz", **toy())
    assert load_transitions(dataset_file("hopper-medium", tmp_path))["rewards"].shape == (12,)


def test_bad_files_are_clear_errors(tmp_path) -> None:
    with pytest.raises(DataError, match="no RL dataset at .*collect it with `primal data collect-rl ENV`"):
        load_transitions(tmp_path / "nope.npz")
    d = toy()
    np.savez(tmp_path / "short.npz", **{k: v for k, v in d.items() if k != "timeouts"})
    with pytest.raises(DataError, match="missing timeouts"):
        load_transitions(tmp_path / "short.npz")
    d["rewards"][2] = np.nan
    np.savez(tmp_path / "nan.npz", **d)
    with pytest.raises(DataError, match="rewards holds NaN or inf"):
        load_transitions(tmp_path / "nan.npz")
    d = toy()
    d["actions"] = d["actions"][:-1]
    np.savez(tmp_path / "ragged.npz", **d)
    with pytest.raises(DataError, match="different lengths"):
        load_transitions(tmp_path / "ragged.npz")
    (tmp_path / "junk.npz").write_text("not a zip")
    with pytest.raises(DataError, match="not a readable .npz"):
        load_transitions(tmp_path / "junk.npz")


def test_a_dataset_is_checked_against_its_environment_at_load(tmp_path) -> None:
    d = toy(s=11, a=3)  # hopper's sizes
    np.savez(tmp_path / "hopper.npz", **d)
    assert load_transitions(tmp_path / "hopper.npz", env="hopper-medium")["observations"].shape == (12, 11)
    with pytest.raises(DataError) as caught:  # hopper's data named as walker2d's: fails at load, not at the first rollout
        load_transitions(tmp_path / "hopper.npz", env="walker2d-medium")
    assert "expected observations of size 17 and actions of size 6 for walker2d, got 11 and 3" in str(caught.value)
    flat = dict(d, rewards=d["rewards"][:, None])
    np.savez(tmp_path / "rank.npz", **flat)
    with pytest.raises(DataError) as caught:
        load_transitions(tmp_path / "rank.npz", env="hopper")
    assert "rewards / terminals / timeouts (T,), got rewards (12, 1)" in str(caught.value)
    np.savez(tmp_path / "text.npz", **dict(d, actions=d["actions"].astype(str)))
    with pytest.raises(DataError, match="expected numeric fields .* got actions <U"):
        load_transitions(tmp_path / "text.npz", env="hopper")
    np.savez(tmp_path / "flags.npz", **dict(d, terminals=d["terminals"].astype(np.int64) * 2))
    with pytest.raises(DataError, match="expected terminals of 0 / 1"):
        load_transitions(tmp_path / "flags.npz", env="hopper")


def test_a_truncated_npz_is_one_line_naming_the_file(tmp_path) -> None:
    np.savez(tmp_path / "hopper.npz", **toy())
    whole = (tmp_path / "hopper.npz").read_bytes()
    (tmp_path / "hopper.npz").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(DataError) as caught:
        load_transitions(tmp_path / "hopper.npz")
    assert "hopper.npz: not a readable .npz file (BadZipFile" in str(caught.value)
