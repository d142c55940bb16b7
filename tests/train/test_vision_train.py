"""The vision family end to end through the CLI: primal train / eval / spectrum on sklearn digits."""

from __future__ import annotations

import json
from pathlib import Path

from test_trainer import cli

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "vision" / "fmnist_primal+.yaml"
DIGITS = ["--set", "data.name=digits", "--set", "model.patch_size=2", "--set", "model.dim=32",
          "--set", "model.ffn_dim=64", "--set", "train.batch_size=32", "--set", "optim.warmup_steps=5",
          "--set", "optim.lr=0.003", "--set", "data.options.crop_padding=0", "--set", "data.options.flip=false",
          "--set", "train.progress=false", "--set", "train.threads=1"]


def test_train_eval_spectrum_on_digits(tmp_path) -> None:
    out = tmp_path / "run"
    proc = cli("train", str(CONFIG), "--out", str(out), "--set", "train.epochs=6", *DIGITS)
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads((out / "seed_0" / "metrics.json").read_text())
    assert metrics["protocol"] == "holdout" and metrics["test_acc"] > 0.8  # 10 classes: chance is 0.1
    assert metrics["best_test_acc"] >= metrics["final_test_acc"] and "best_val_acc" in metrics
    assert set(metrics["ksvd_j_final"]) == {"encoder.blocks.3.attn"}  # primal+: only the last block
    ev = cli("eval", str(out))
    assert ev.returncode == 0, ev.stderr
    assert set(json.loads(ev.stdout)["seed_0"]) >= {"val", "test"}
    spec = cli("spectrum", str(out / "seed_0"), "--max-examples", "16", "--out", str(tmp_path / "spec"))
    assert spec.returncode == 0, spec.stderr
    layers = json.loads((tmp_path / "spec" / "spectrum.json").read_text())["layers"]
    assert layers["encoder.blocks.3.attn"]["kind"] == "primal" and layers["encoder.blocks.0.attn"]["kind"] == "softmax"


def test_a_patch_that_does_not_divide_the_image_is_a_config_error(tmp_path) -> None:
    proc = cli("train", str(CONFIG), "--out", str(tmp_path / "x"), *DIGITS, "--set", "model.patch_size=3")
    assert proc.returncode == 2 and "image_size 8 is not divisible by patch_size 3" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "x").exists()


def test_an_image_folder_class_unknown_to_train_stops_before_training(tmp_path, capsys) -> None:
    from PIL import Image

    from primal_attention.cli import main

    for split, names in (("train", ("ant", "bee")), ("test", ("ant", "wasp"))):
        for name in names:
            (tmp_path / "data" / split / name).mkdir(parents=True)
            Image.new("RGB", (4, 4)).save(tmp_path / "data" / split / name / "a.png")
    argv = ["train", str(CONFIG), "--out", str(tmp_path / "run"), *DIGITS, "--set", "data.name=image_folder",
            "--set", f"data.data_dir={tmp_path / 'data'}", "--set", "data.options.image_size=4", "--set", "train.epochs=1"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "class folders ['wasp'] are not in" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run" / "seed_0" / "checkpoints").exists()  # refused before the first step
