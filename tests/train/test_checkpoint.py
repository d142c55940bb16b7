"""Checkpoints: atomic layout, and clear errors for missing, corrupt or mismatched files."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from primal_attention.train.checkpoint import (
    CheckpointError,
    find_run,
    latest_checkpoint,
    load_checkpoint,
    load_weights,
    read_weights,
    save_checkpoint,
)


def test_round_trip_and_latest(tmp_path) -> None:
    model = nn.Linear(3, 2)
    for step in (5, 10, 15):
        save_checkpoint(tmp_path, step, model, {"step": step}, best={"w": torch.ones(2)})
    ckpt = latest_checkpoint(tmp_path)
    assert ckpt is not None and ckpt.name == "ckpt-00000015"
    assert sorted(p.name for p in tmp_path.glob("ckpt-*")) == ["ckpt-00000010", "ckpt-00000015"]  # keep=2
    save_checkpoint(tmp_path, 20, model, {"step": 20}, best={"w": torch.ones(2)}, keep=1)
    assert sorted(p.name for p in tmp_path.glob("ckpt-*")) == ["ckpt-00000020"]
    ckpt = latest_checkpoint(tmp_path)
    weights, state, best = load_checkpoint(ckpt)
    assert state == {"step": 20} and torch.equal(best["w"], torch.ones(2))
    other = nn.Linear(3, 2)
    load_weights(other, ckpt / "model.safetensors")
    assert torch.equal(other.weight, model.weight) and torch.equal(weights["bias"], model.bias.detach())


def test_missing_and_corrupt_files_are_named(tmp_path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        read_weights(tmp_path / "nope.safetensors")
    ckpt = save_checkpoint(tmp_path, 1, nn.Linear(3, 2), {"step": 1})
    state = ckpt / "state.pt"
    state.write_bytes(state.read_bytes()[:20])
    with pytest.raises(CheckpointError, match="state.pt is not a readable checkpoint state"):
        load_checkpoint(ckpt)
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:30])
    with pytest.raises(CheckpointError, match="model.safetensors is not a readable safetensors file"):
        load_checkpoint(ckpt)


def test_weights_of_another_model_are_refused(tmp_path) -> None:
    ckpt = save_checkpoint(tmp_path, 1, nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 2)), {})
    with pytest.raises(CheckpointError, match=r"shape mismatch \['0.weight: file \(2, 3\) vs model \(4, 3\)"):
        load_weights(nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2)), ckpt / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"unexpected \['1.bias', '1.weight'\]"):
        load_weights(nn.Sequential(nn.Linear(3, 2)), ckpt / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"missing \['2.bias', '2.weight'\]"):
        load_weights(nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 2), nn.Linear(2, 2)), ckpt / "model.safetensors")


def test_find_run(tmp_path) -> None:
    with pytest.raises(CheckpointError, match="no config.yaml"):
        find_run(tmp_path)
    (tmp_path / "config.yaml").write_text("name: x\n")
    with pytest.raises(CheckpointError, match="no checkpoint found"):
        find_run(tmp_path)
    ckpt = save_checkpoint(tmp_path / "checkpoints", 3, nn.Linear(1, 1), {})
    assert find_run(tmp_path) == (tmp_path, ckpt)
    assert find_run(ckpt) == (tmp_path, ckpt)


def test_a_bad_latest_falls_back_to_the_newest_readable_checkpoint(tmp_path) -> None:
    model = nn.Linear(3, 2)
    for step in (1, 2):
        save_checkpoint(tmp_path, step, model, {"step": step})
    (tmp_path / "latest").write_text("ckpt-99999999")
    assert latest_checkpoint(tmp_path).name == "ckpt-00000002"
    (tmp_path / "ckpt-00000002" / "state.pt").write_bytes(b"garbage")
    assert latest_checkpoint(tmp_path).name == "ckpt-00000001"
    (tmp_path / "ckpt-00000001" / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match="none of the checkpoints"):
        latest_checkpoint(tmp_path)
    assert latest_checkpoint(tmp_path / "nothing") is None
