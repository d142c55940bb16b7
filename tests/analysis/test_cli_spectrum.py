"""`primal spectrum` end to end on a tiny real run, and the KSVD diagnostics in the trainer history."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "uea" / "JapaneseVowels_primal+.yaml"
TINY = ["data.max_examples=40", "model.dim=16", "model.num_heads=2", "model.ffn_dim=32",
        "model.attention_options.primal.rank=4", "train.batch_size=8", "train.eval_batch_size=32",
        "train.progress=false", "train.threads=1", "train.epochs=1"]
SETS = [a for s in TINY for a in ("--set", s)]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "primal_attention.cli", *args], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ))


def test_spectrum_cli_on_a_trained_run(tmp_path) -> None:
    proc = cli("train", str(CONFIG), "--out", str(tmp_path / "run"), *SETS, "--set", "train.ksvd_distances_every=1")
    assert proc.returncode == 0, proc.stderr
    run = tmp_path / "run" / "seed_0"
    with (run / "history.csv").open() as fh:
        row = next(csv.DictReader(fh))
    for key in ("J_authors", "J_paper", "J_authors_rms", "lam_mean", "res_we", "res_wr", "res_we_scaled", "kkt_scale"):
        assert f"ksvd/encoder.blocks.1.attn.{key}" in row  # only the primal layer (layer 0 is softmax)
    assert not any(k.startswith("ksvd/encoder.blocks.0") for k in row)
    # train.ksvd_distances_every: the distances to the exact KSVD solution beside them (docs/method.md §7).
    assert 0.0 < float(row["ksvd_distance/encoder.blocks.1.attn.objective_ratio"]) < 1.0
    assert not any(k.startswith("ksvd_distance/encoder.blocks.0") for k in row)

    proc = cli("spectrum", str(run), "--max-examples", "12", "--out", str(tmp_path / "spec"))
    assert proc.returncode == 0, proc.stderr
    assert "| encoder.blocks.0.attn | softmax | attention | 24 |" in proc.stdout
    assert "encoder.blocks.1.attn.res_we" in proc.stdout
    result = json.loads((tmp_path / "spec" / "spectrum.json").read_text())
    assert result["examples"] == 12 and result["split"] == "test" and result["weights"] == "model"
    assert set(result["layers"]["encoder.blocks.1.attn"]["views"]) == {"kernel", "scores"}
    assert result["layers"]["encoder.blocks.0.attn"]["views"]["attention"]["matrices"] == 12 * 2
    assert "encoder.blocks.1.attn.res_wr_scaled" in result["ksvd_diagnostics"]
    for f in ("cumulative_index.png", "cumulative_fraction.png", "heatmap.png", "components.png"):
        assert (tmp_path / "spec" / f).is_file()

    # A ckpt-* directory gives the same analysis; the default output goes into the run. With --ksvd,
    # also the distances of the primal layer to the exact KSVD solution of its kernel.
    assert "ksvd_distances" not in result
    ckpt = sorted((run / "checkpoints").glob("ckpt-*"))[-1]
    proc = cli("spectrum", str(ckpt), "--max-examples", "12", "--ksvd")
    assert proc.returncode == 0, proc.stderr
    again = json.loads((run / "spectrum_test" / "spectrum.json").read_text())
    assert again["layers"] == result["layers"]
    assert list(again["ksvd_distances"]) == ["encoder.blocks.1.attn"]
    dist = again["ksvd_distances"]["encoder.blocks.1.attn"]
    assert 0.0 < dist["objective_ratio"] < 1.0 and 0.0 < dist["captured_learned"] < dist["captured_optimal"] <= 1.0
    assert 0.0 < dist["angle_e_max"] <= 90.0 and abs(dist["j_optimal"]) < 1e-9
    assert dist["res_e_scaled"] == pytest.approx(
        again["ksvd_diagnostics"]["encoder.blocks.1.attn.res_we_scaled"], rel=1e-9)
    assert "Distances to the exact KSVD solution" in proc.stdout
    assert "| encoder.blocks.1.attn | " in proc.stdout.split("Distances to the exact KSVD solution")[1]

    # A config is analysed untrained (its initialisation), with overrides.
    proc = cli("spectrum", str(CONFIG), *SETS, "--split", "train", "--max-examples", "8", "--out", str(tmp_path / "init"))
    assert proc.returncode == 0, proc.stderr
    init = json.loads((tmp_path / "init" / "spectrum.json").read_text())
    assert init["weights"] == "init" and init["checkpoint"] is None and init["split"] == "train"
    assert init["layers"]["encoder.blocks.1.attn"]["views"]["kernel"] != result["layers"]["encoder.blocks.1.attn"]["views"]["kernel"]

    missing = cli("spectrum", str(tmp_path))
    assert missing.returncode == 2 and "no config.yaml" in missing.stderr
    no_val = cli("spectrum", str(run), "--split", "val")
    assert no_val.returncode == 2 and "no 'val' split" in no_val.stderr
