"""Runs never lose data, bad configs never train: one clear line and exit 2 (or 130 for Ctrl-C)."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from primal_attention.cli import main
from primal_attention.train import checkpoint
from primal_attention.train.checkpoint import CheckpointError
from primal_attention.train.load import load_config
from primal_attention.train.trainer import RunError, Trainer, check_resumable, run_seeds
from test_trainer import CONFIG, TINY, cli, sets

CONFIG_ERRORS = {
    "model.attention_options.primal.rnk=30": "unexpected keyword argument 'rnk'",
    "model.dim=30": "dim 30 is not divisible by num_heads 8",
    "model.pooling=bogus": "model.pooling: expected one of mean, cls, flatten, got 'bogus'",
    "model.dropout=2": "dropout must be in [0, 1), got 2.0",
    "model.attention=[softmax,foo]": "unknown attention 'foo'",
    "model.attention=[softmax": "is not valid YAML",
    "train.device=cuda": "CUDA is not available",
    "data.family=lra": "LRA task must be one of",
}


@pytest.mark.parametrize("override", list(CONFIG_ERRORS))
def test_config_errors_are_one_line_before_anything_is_written(tmp_path, override) -> None:
    if override == "train.device=cuda" and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    extra = ["--set", "data.name=nope"] if override.startswith("data.family") else []
    proc = cli("train", str(CONFIG), "--out", str(tmp_path / "out"), "--set", override, *extra)
    assert proc.returncode == 2, proc.stderr
    assert CONFIG_ERRORS[override] in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_a_finished_run_is_not_overwritten_without_asking(tmp_path) -> None:
    args = ["train", str(CONFIG), "--out", str(tmp_path), *sets("train.epochs=1")]
    assert cli(*args).returncode == 0
    before = (tmp_path / "seed_0" / "metrics.json").read_text()
    again = cli(*args)
    assert again.returncode == 2
    assert "already holds a run; continue it with --resume or replace it with --overwrite" in again.stderr
    assert (tmp_path / "seed_0" / "metrics.json").read_text() == before
    events = list((tmp_path / "seed_0" / "tensorboard").iterdir())
    replaced = cli(*args, "--overwrite")
    assert replaced.returncode == 0, replaced.stderr
    assert not set(events) & set((tmp_path / "seed_0" / "tensorboard").iterdir())  # old events removed


def test_unusable_out_is_one_clear_error(tmp_path) -> None:
    file = tmp_path / "README.md"
    file.write_text("x")
    proc = cli("train", str(CONFIG), "--out", str(file), *sets("train.epochs=1"))
    assert proc.returncode == 2 and "is a file" in proc.stderr and "Traceback" not in proc.stderr


def test_resume_refuses_a_changed_config(tmp_path) -> None:
    assert cli("train", str(CONFIG), "--out", str(tmp_path), *sets("train.epochs=1")).returncode == 0
    config = (tmp_path / "seed_0" / "config.yaml").read_text()
    changed = cli("train", str(CONFIG), "--out", str(tmp_path), "--resume", *sets("train.epochs=1", "optim.lr=0.01"))
    assert changed.returncode == 2 and "Traceback" not in changed.stderr
    assert "cannot resume" in changed.stderr and "the config differs from the one it was trained with in optim.lr" in changed.stderr
    assert (tmp_path / "seed_0" / "config.yaml").read_text() == config
    longer = cli("train", str(CONFIG), "--out", str(tmp_path), "--resume", *sets("train.epochs=2"))
    assert longer.returncode == 0, longer.stderr
    assert json.loads((tmp_path / "seed_0" / "metrics.json").read_text())["epochs"] == 2


def test_shorter_schedule_is_not_resumable(tmp_path) -> None:
    old = load_config(CONFIG, ["train.epochs=5"])
    with pytest.raises(RunError, match="only a longer schedule"):
        check_resumable(old, load_config(CONFIG, ["train.epochs=3"]), tmp_path)
    check_resumable(old, load_config(CONFIG, ["train.epochs=7", "train.progress=false"]), tmp_path)


def test_ctrl_c_keeps_the_checkpoint_and_says_how_to_continue(tmp_path) -> None:
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "primal_attention.cli", "train", str(CONFIG), "--out", str(out),
                             *sets("train.epochs=200")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # a shell that started us in the background may ignore SIGINT; the child must not
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    latest = out / "seed_0" / "checkpoints" / "latest"
    deadline = time.time() + 300
    while time.time() < deadline and not latest.is_file():
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "interrupted at epoch" in err and "continue with --resume" in err and "Traceback" not in err
    assert (out / "seed_0" / "checkpoints" / latest.read_text().strip() / "state.pt").is_file()


def test_non_finite_loss_stops_with_the_step_and_keeps_the_checkpoint(tmp_path, monkeypatch) -> None:
    cfg = load_config(CONFIG, [s for s in sets("train.epochs=3") if s != "--set"])
    import torch.nn.functional as F

    calls = {"n": 0}
    real = F.cross_entropy

    def poisoned(*args, **kwargs):
        calls["n"] += 1
        loss = real(*args, **kwargs)
        return loss * float("nan") if calls["n"] == 12 else loss

    monkeypatch.setattr(F, "cross_entropy", poisoned)  # what the task loss calls
    with pytest.raises(RunError, match=r"non-finite loss at step \d+, epoch [\d.]+ .*; stopped, last good checkpoint kept: "):
        Trainer(cfg, tmp_path).fit()
    assert (tmp_path / "checkpoints" / "latest").is_file()


def test_eval_takes_every_seed_of_a_train_folder(tmp_path) -> None:
    assert cli("train", str(CONFIG), "--out", str(tmp_path), "--seeds", "0,1", *sets("train.epochs=1")).returncode == 0
    ev = cli("eval", str(tmp_path))
    assert ev.returncode == 0, ev.stderr
    assert set(json.loads(ev.stdout)) == {"seed_0", "seed_1"}
    missing = cli("eval", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr


@pytest.mark.parametrize("args", [
    ("spectrum", "x", "--batch-size", "0"),
    ("spectrum", "x", "--max-examples", "0"),
    ("selfcheck", "--seq-len", "0"),
    ("selfcheck", "--reference-dir", "/nonexistent"),
])
def test_argument_ranges(args) -> None:
    proc = cli(*args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "positive integer" in proc.stderr or "not a directory" in proc.stderr


def _tiny_run(out: Path, *extra: str) -> Path:
    """A one-epoch tiny run trained in this process (no interpreter start): its seed folder."""
    run_seeds(load_config(CONFIG, [*TINY, "train.epochs=1", *extra]), out, [0])
    return out / "seed_0"


def _primal(capsys, *argv: str) -> tuple[int, str]:
    """``primal ARGV`` in this process: (exit code, stderr)."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as stop:  # argparse errors
        code = stop.code
    return code, capsys.readouterr().err


class _RunsCode:
    """What a crafted state.pt holds: unpickling it would create the directory ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (str(self.marker),)


def test_a_crafted_state_pt_runs_nothing_under_eval_generate_spectrum_and_resume(tmp_path, capsys) -> None:
    run = _tiny_run(tmp_path / "out")
    marker = tmp_path / "code-ran"
    for ckpt in (run / "checkpoints").glob("ckpt-*"):  # every checkpoint, so none is a fallback
        torch.save({"step": 1, "x": _RunsCode(marker)}, ckpt / "state.pt")
    commands = [("eval", run), ("generate", run), ("spectrum", run),
                ("train", CONFIG, "--out", tmp_path / "out", "--resume", "--set", "train.epochs=2",
                 *[a for s in TINY for a in ("--set", s)])]
    for argv in commands:
        code, err = _primal(capsys, *argv)
        assert code == 2, (argv[0], err)
        assert "refusing to load" in err and "asks to call the Python object posix.mkdir, which could run code" in err
        assert len(err.strip().splitlines()) == 1, err
    assert not marker.exists()
    with pytest.raises(checkpoint.UnsafeCheckpointError):
        checkpoint.latest_checkpoint(run / "checkpoints")


def test_the_real_state_loads_without_unpickling_code(tmp_path) -> None:
    run = _tiny_run(tmp_path, "train.protocol=holdout")  # holdout: best weights and a best row too
    ckpt = checkpoint.latest_checkpoint(run / "checkpoints")
    state = checkpoint.read_state(ckpt / "state.pt")  # weights_only=True
    assert {"optimizer", "scheduler", "rng", "history", "best", "step"} <= set(state)
    assert isinstance(state["history"][0], dict) and state["rng"].dtype == torch.uint8


def test_an_edited_model_key_in_config_yaml_is_refused(tmp_path, capsys) -> None:
    run = _tiny_run(tmp_path / "out")
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("activation: gelu", "activation: relu"))
    code, err = _primal(capsys, "eval", run)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "was trained with another model than" in err and "model.activation ('gelu' there, 'relu' in config.yaml)" in err
    code, err = _primal(capsys, "spectrum", run, "--max-examples", "4")
    assert code == 2 and "model.activation" in err
    # --resume with the edited config: config.yaml agrees with it, the checkpoint does not.
    code, err = _primal(capsys, "train", CONFIG, "--out", tmp_path / "out", "--resume",
                        *[a for s in [*TINY, "train.epochs=2", "model.activation=relu"] for a in ("--set", s)])
    assert code == 2 and "cannot resume" in err and "model.activation" in err
    config.write_text(config.read_text().replace("activation: relu", "activation: gelu"))
    assert _primal(capsys, "eval", run)[0] == 0


def test_disk_full_while_checkpointing_keeps_the_previous_checkpoint(tmp_path, monkeypatch, capsys) -> None:
    out = tmp_path / "out"
    cfg = load_config(CONFIG, [*TINY, "train.epochs=2"])
    real_save, calls = torch.save, []

    def full_disk(obj, f, *args, **kwargs):
        calls.append(f)
        if len(calls) == 2:  # the second checkpoint: half a file, then ENOSPC
            Path(f).write_bytes(b"PK\x03\x04 partial")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(checkpoint.torch, "save", full_disk)
    ckpts = out / "seed_0" / "checkpoints"
    with pytest.raises(CheckpointError) as caught:
        run_seeds(cfg, out, [0])
    message = str(caught.value)
    assert "\n" not in message
    assert "cannot write checkpoint ckpt-00000016" in message and "No space left on device" in message
    assert "the previous checkpoint ckpt-00000008 is intact" in message
    assert sorted(p.name for p in ckpts.iterdir()) == ["ckpt-00000008", "latest"]  # no stale temporary folder
    assert checkpoint.latest_checkpoint(ckpts).name == "ckpt-00000008"
    monkeypatch.setattr(checkpoint.torch, "save", real_save)  # space freed: the run continues
    summary = run_seeds(cfg, out, [0], resume=True)
    assert summary["seeds"] == [0] and checkpoint.latest_checkpoint(ckpts).name == "ckpt-00000016"


def test_a_failing_tensorboard_writer_on_resume_is_one_line(tmp_path, monkeypatch) -> None:
    tensorboard = pytest.importorskip("torch.utils.tensorboard")
    run = _tiny_run(tmp_path / "out")
    (run / "metrics.json").unlink()  # so the run continues instead of being reported again

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(tensorboard, "SummaryWriter", no_space)
    cfg = load_config(CONFIG, [*TINY, "train.epochs=2"])
    with pytest.raises(RunError, match=r"cannot write TensorBoard events to .*tensorboard \(No space left on device\); "
                                       r"the checkpoints are untouched"):
        run_seeds(cfg, tmp_path / "out", [0], resume=True)


def _start_training(out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "primal_attention.cli", "train", str(CONFIG), "--out", str(out),
                             *sets(*extra)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and not path.is_file() and proc.poll() is None:
        time.sleep(0.01)
    assert path.is_file(), proc.communicate()[1] if proc.poll() is not None else f"no {path}"


def test_a_second_training_into_the_same_run_folder_stops_at_once(tmp_path) -> None:
    from primal_attention.train.trainer import run_lock

    out = tmp_path / "out"
    first = _start_training(out, "train.epochs=500")
    _wait_for(out / "seed_0" / "config.yaml", first)
    second = cli("train", str(CONFIG), "--out", str(out), "--seeds", "1,0", "--overwrite",
                 *sets("train.epochs=1", "train.eta=0.5"))
    assert first.poll() is None, "the first run ended before the second one started"
    assert second.returncode == 2 and "Traceback" not in second.stderr
    assert f"seed_0 is in use by another primal train (pid {first.pid})" in second.stderr
    assert "eta: 0.5" not in (out / "seed_0" / "config.yaml").read_text()  # --overwrite did not touch the first run
    assert not (out / "seed_1").exists()  # refused before anything was written
    run_seeds(load_config(CONFIG, [*TINY, "train.epochs=1"]), out, [2])  # another seed may train beside it
    first.kill()  # a crash: the kernel drops the lock with the process
    first.communicate()
    with run_lock([out / "seed_0"]):
        assert (out / ".seed_0.lock").read_text().strip() == str(os.getpid())


def test_sigterm_keeps_the_checkpoint_prints_the_resume_command_and_resumes_exactly(tmp_path) -> None:
    import shlex

    from safetensors.torch import load_file

    extra = ("train.epochs=6", "model.dropout=0.1")
    out = tmp_path / "run"
    proc = _start_training(out, *extra)
    _wait_for(out / "seed_0" / "checkpoints" / "latest", proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "terminated by SIGTERM at epoch" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (out / "seed_0" / "metrics.json").exists(), "the run finished before SIGTERM came"
    command = err.split("continue with --resume: ")[1].strip()
    argv = shlex.split(command)
    assert argv[:2] == ["primal", "train"] and argv[-1] == "--resume"
    assert not list((out / "seed_0" / "checkpoints").glob(".ckpt-*"))  # no half-written checkpoint
    resumed = subprocess.run([sys.executable, "-m", "primal_attention.cli", *argv[1:]], capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    run_seeds(load_config(CONFIG, [*TINY, *extra]), tmp_path / "full", [0])  # the same run, never stopped
    a = json.loads((tmp_path / "full" / "seed_0" / "metrics.json").read_text())
    b = json.loads((out / "seed_0" / "metrics.json").read_text())
    for key in ("final_test_acc", "best_test_acc", "best_epoch", "steps", "ksvd_j_final"):
        assert a[key] == b[key], key
    last = lambda run: load_file(str(checkpoint.latest_checkpoint(run / "seed_0" / "checkpoints") / "model.safetensors"))  # noqa: E731
    wa, wb = last(tmp_path / "full"), last(out)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_an_out_of_range_seed_is_one_line_before_anything_is_written(tmp_path, capsys) -> None:
    for seeds in ("-1", str(2**40)):
        code, err = _primal(capsys, "train", CONFIG, "--out", tmp_path / "out", "--seeds", seeds,
                            *[a for s in TINY for a in ("--set", s)])
        assert code == 2 and f"--seeds must be integers in [0, 2**32), got '{seeds}'" in err
    assert not (tmp_path / "out").exists()


def test_a_model_key_the_checkpoint_did_not_record_is_not_a_difference(tmp_path, capsys) -> None:
    import json as json_

    from safetensors.torch import load_file, save_file

    run = _tiny_run(tmp_path / "out")
    for ckpt in (run / "checkpoints").glob("ckpt-*"):  # as if written before model.activation existed
        file = ckpt / "model.safetensors"
        config = checkpoint.checkpoint_config(ckpt)
        del config["model"]["activation"]
        save_file(load_file(str(file)), str(file), metadata={checkpoint.CONFIG_METADATA: json_.dumps(config)})
    assert _primal(capsys, "eval", run)[0] == 0


def test_summary_covers_every_seed_of_the_out_folder_and_a_corrupt_metrics_file_is_one_line(tmp_path) -> None:
    cfg = load_config(CONFIG, [*TINY, "train.epochs=1"])
    run_seeds(cfg, tmp_path, [0])
    summary = run_seeds(cfg, tmp_path, [1])  # a second invocation with another seed
    assert summary["seeds"] == [0, 1] and json.loads((tmp_path / "summary.json").read_text())["seeds"] == [0, 1]
    other = load_config(CONFIG, [*TINY, "train.epochs=1", "optim.lr=0.01"])
    assert run_seeds(other, tmp_path / "other", [2])["seeds"] == [2]
    (tmp_path / "seed_0" / "metrics.json").write_text("{")
    with pytest.raises(RunError, match="metrics.json is not valid JSON"):
        run_seeds(cfg, tmp_path, [0], resume=True)
