"""End-to-end training on tiny real data: CLI outputs, protocols, resume after SIGKILL, DDP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from primal_attention.train import load_config
from primal_attention.train.checkpoint import latest_checkpoint, load_checkpoint
from primal_attention.train.load import config_from_dict
from primal_attention.train.trainer import Trainer, make_scheduler

TINY = [
    "data.max_examples=60", "model.dim=16", "model.num_heads=2", "model.ffn_dim=32",
    "model.attention_options.primal.rank=4", "train.batch_size=8", "train.eval_batch_size=128",
    "train.progress=false", "train.threads=1",
]
CONFIG = Path(__file__).resolve().parents[2] / "configs" / "uea" / "JapaneseVowels_primal+.yaml"


def cli(*args: str, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "primal_attention.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def sets(*extra: str) -> list[str]:
    out = []
    for s in [*TINY, *extra]:
        out += ["--set", s]
    return out


def test_train_cli_writes_everything(tmp_path) -> None:
    proc = cli("train", str(CONFIG), "--out", str(tmp_path), "--seeds", "0,1", *sets("train.epochs=2"))
    assert proc.returncode == 0, proc.stderr
    assert "best_test_acc" in proc.stdout
    for seed in (0, 1):
        run = tmp_path / f"seed_{seed}"
        metrics = json.loads((run / "metrics.json").read_text())
        assert metrics["seed"] == seed and metrics["protocol"] == "authors" and metrics["epochs"] == 2
        assert 0 <= metrics["best_test_acc"] <= 1 and metrics["best_test_acc"] >= metrics["final_test_acc"]
        assert set(metrics["ksvd_j_final"]) == {"encoder.blocks.1.attn"}
        assert (run / "config.yaml").is_file() and (run / "history.csv").read_text().count("\n") == 3
        assert list((run / "tensorboard").iterdir())
        assert (run / "checkpoints" / "latest").is_file()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["seeds"] == [0, 1] and summary["best_test_acc"]["n"] == 2

    ev = cli("eval", str(tmp_path / "seed_0"))
    assert ev.returncode == 0, ev.stderr
    result = json.loads(ev.stdout)
    metrics = json.loads((tmp_path / "seed_0" / "metrics.json").read_text())
    assert result["test"]["acc"] == pytest.approx(metrics["final_test_acc"])


def test_holdout_protocol_selects_on_validation(tmp_path) -> None:
    cfg = load_config(CONFIG, [*TINY, "train.epochs=3", "train.protocol=holdout", "data.val_fraction=0.25"])
    metrics = Trainer(cfg, tmp_path).fit()
    assert metrics["protocol"] == "holdout"
    assert {"test_acc", "best_val_acc", "final_val_acc", "best_epoch"} <= set(metrics)
    assert "best_test_acc" not in metrics
    assert metrics["train_examples"] + metrics["val_examples"] == 60
    assert 12 <= metrics["val_examples"] <= 18  # a stratified quarter, rounded per class
    history = (tmp_path / "history.csv").read_text()
    assert "val_acc" in history and "test_acc" not in history  # TEST is not looked at during training


def test_config_errors_exit_cleanly(tmp_path) -> None:
    proc = cli("train", str(CONFIG), "--set", "train.eta=-1")
    assert proc.returncode == 2 and "train.eta must be >= 0" in proc.stderr and "Traceback" not in proc.stderr
    proc = cli("train", str(CONFIG), "--set", "data.name=NoSuchSet", "--out", str(tmp_path))
    assert proc.returncode == 2 and "NoSuchSet" in proc.stderr and "Traceback" not in proc.stderr


def test_schedules() -> None:
    cfg = config_from_dict({"optim": {"schedule": "linear", "warmup_steps": 10}})
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = make_scheduler(cfg, opt, total_steps=110)
    lrs = []
    for _ in range(110):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert lrs[60] == pytest.approx(0.5) and lrs[-1] < 0.02

    cfg = config_from_dict({"optim": {"schedule": "inverse_sqrt", "warmup_steps": 4}})
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = make_scheduler(cfg, opt, total_steps=100)
    lrs = []
    for _ in range(16):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0]) and lrs[15] == pytest.approx(0.5)  # sqrt(4 / 16)


def test_resume_after_sigkill_matches_uninterrupted_run(tmp_path) -> None:
    args = sets("train.epochs=6", "model.dropout=0.1", "train.eta=0.2")
    full = cli("train", str(CONFIG), "--out", str(tmp_path / "full"), *args)
    assert full.returncode == 0, full.stderr

    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "primal_attention.cli", "train", str(CONFIG), "--out", str(out), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpts = out / "seed_0" / "checkpoints"
    deadline = time.time() + 300
    while time.time() < deadline:
        latest = ckpts / "latest"
        if latest.is_file() and latest.read_text().strip() >= "ckpt-00000016":  # after 2 of 6 epochs
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "seed_0" / "metrics.json").exists(), "the run finished before it could be killed"
    cpu_killed = load_checkpoint(latest_checkpoint(ckpts))[1]["cpu_time"]
    assert cpu_killed > 0

    resumed = cli("train", str(CONFIG), "--out", str(out), "--resume", *args)
    assert resumed.returncode == 0, resumed.stderr
    a = json.loads((tmp_path / "full" / "seed_0" / "metrics.json").read_text())
    b = json.loads((out / "seed_0" / "metrics.json").read_text())
    for key in ("final_test_acc", "best_test_acc", "best_epoch", "steps", "ksvd_j_final"):
        assert a[key] == b[key], key
    assert b["cpu_time_s"] > cpu_killed  # CPU seconds add up over the killed session and the resumed one
    wa = load_file(str(sorted((tmp_path / "full" / "seed_0" / "checkpoints").glob("ckpt-*"))[-1] / "model.safetensors"))
    wb = load_file(str(sorted(ckpts.glob("ckpt-*"))[-1] / "model.safetensors"))
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    ha = (tmp_path / "full" / "seed_0" / "history.csv").read_text()
    hb = (out / "seed_0" / "history.csv").read_text()
    assert ha == hb


def test_ddp_two_processes_equal_one(tmp_path) -> None:
    """Same global batch: torchrun with 2 gloo processes gives the single-process weights to 1e-5."""
    args = sets("train.epochs=2", "model.dropout=0.0", "model.attention_options.softmax.dropout=0.0", "train.eta=0.2", "train.ksvd_reduction=sample")
    single = cli("train", str(CONFIG), "--out", str(tmp_path / "one"), *args)
    assert single.returncode == 0, single.stderr
    ddp = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "primal_attention.cli", "train", str(CONFIG), "--out", str(tmp_path / "two"), *args],
        capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    a = json.loads((tmp_path / "one" / "seed_0" / "metrics.json").read_text())
    b = json.loads((tmp_path / "two" / "seed_0" / "metrics.json").read_text())
    assert a["final_test_acc"] == pytest.approx(b["final_test_acc"], abs=1 / 370 + 1e-9)
    wa = load_file(str(sorted((tmp_path / "one" / "seed_0" / "checkpoints").glob("ckpt-*"))[-1] / "model.safetensors"))
    wb = load_file(str(sorted((tmp_path / "two" / "seed_0" / "checkpoints").glob("ckpt-*"))[-1] / "model.safetensors"))
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-4, atol=1e-5, msg=k)


def test_corrupt_checkpoint_gives_a_clear_error(tmp_path) -> None:
    proc = cli("train", str(CONFIG), "--out", str(tmp_path), *sets("train.epochs=1"))
    assert proc.returncode == 0, proc.stderr
    ckpt = tmp_path / "seed_0" / "checkpoints" / (tmp_path / "seed_0" / "checkpoints" / "latest").read_text().strip()
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    ev = cli("eval", str(tmp_path / "seed_0"), "--last")
    assert ev.returncode == 2 and "not a readable safetensors file" in ev.stderr and "Traceback" not in ev.stderr
    (tmp_path / "seed_0" / "metrics.json").unlink()  # so --resume continues the run instead of skipping it
    resumed = cli("train", str(CONFIG), "--out", str(tmp_path), "--resume", *sets("train.epochs=2"))
    assert resumed.returncode == 2 and "cannot resume" in resumed.stderr and "Traceback" not in resumed.stderr
