"""scripts/results_convert.py: the page renders with no runs (listing what is missing), and a tiny
one-seed classifier grid runs, stores its cells and is not run again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UEA_TINY = ["data.max_examples=60", "model.dim=16", "model.num_heads=2", "model.ffn_dim=32",
            "model.attention_options.primal.rank=4", "train.batch_size=8", "train.eval_batch_size=128"]


def _script():
    from primal_attention.studies import conversion

    return conversion


def test_page_renders_without_runs(tmp_path) -> None:
    _script().main(["--table-only", "--results", str(tmp_path), "--work", str(tmp_path / "work")])
    page = (tmp_path / "convert.md").read_text()
    assert "**Verdict rule.**" in page and "## Missing" in page
    assert "- lm: convert all_transfer_finetune, seeds stored 0/3" in page
    assert "- uea: original, seeds stored 0/3" in page


@pytest.mark.slow
def test_tiny_classifier_grid_runs_and_resumes(tmp_path) -> None:
    args = ["--tasks", "uea", "--seeds", "0", "--results", str(tmp_path), "--work", str(tmp_path / "work"),
            "--uea-epochs", "2", "--uea-transfer-steps", "4", "--uea-finetune-steps", "4", "--uea-eval-every", "2"]
    for s in UEA_TINY:
        args += ["--uea-set", s]
    _script().main(args)
    store = tmp_path / "convert_runs" / "uea"
    cells = sorted(p.parent.name for p in store.glob("*/seed_0.json"))
    assert cells == ["all_finetune", "all_transfer_finetune", "last_finetune", "last_transfer_finetune", "original",
                     "scratch_all", "scratch_last"]
    report = json.loads((store / "all_transfer_finetune" / "seed_0.json").read_text())
    assert report["command"].startswith("primal convert ") and report["done"] == {"transfer": 4, "finetune": 4}
    scratch = json.loads((store / "scratch_all" / "seed_0.json").read_text())
    original = json.loads((store / "original" / "seed_0.json").read_text())
    assert scratch["steps"] == original["steps"] + 8  # the same total steps as conversion (iii)
    page = (tmp_path / "convert.md").read_text()
    assert "| (iii) transfer + fine-tune | 1 |" in page and "uea: original" not in page
    assert "## Language model" in page  # a --tasks uea run keeps the other task's section on the page
    assert original["cpu_time_s"] > 0 and scratch["cpu_time_s"] > 0  # the trainer's, kept across resumes
    assert "†" not in page.split("## Classifier")[1].split("## Decoding")[0]  # every CPU time here is known
    stamp = (store / "original" / "seed_0.json").stat().st_mtime_ns
    _script().main(args)  # everything stored: nothing runs again
    assert (store / "original" / "seed_0.json").stat().st_mtime_ns == stamp


@pytest.mark.slow
def test_tiny_lm_grid_converts_to_window_arms_and_reports_their_gates(tmp_path, monkeypatch) -> None:
    import random

    words = "the and of to in that shall unto lord thou thy king love night death".split()
    text = tmp_path / "text"
    text.mkdir()
    for name, seed, lines in (("train.txt", 0, 300), ("valid.txt", 1, 40), ("test.txt", 2, 40)):
        rng = random.Random(seed)
        (text / name).write_text("\n".join(" ".join(rng.choice(words) for _ in range(8)) for _ in range(lines)))
    monkeypatch.setenv("PRIMAL_ATTENTION_CACHE", str(tmp_path / "cache"))
    tiny = ["data.name=text_files", f"data.data_dir={text}", "data.seq_len=16", "data.options.vocab_size=300",
            "model.dim=16", "model.num_heads=2", "model.ffn_dim=32", "model.attention_options.primal.rank=4",
            "model.attention_options.window_primal.rank=4", "train.steps=6", "train.eval_every=3",
            "train.batch_size=8", "optim.warmup_steps=1", "train.eval_batch_size=64"]
    args = ["--tasks", "lm4x", "--seeds", "0", "--results", str(tmp_path), "--work", str(tmp_path / "work"),
            "--transfer-steps", "2", "--finetune-steps", "2", "--eval-every", "1"]
    for s in tiny:
        args += ["--set", s]
    _script().main(args)
    store = tmp_path / "convert_runs" / "lm4x"
    cells = sorted(p.parent.name for p in store.glob("*/seed_0.json"))
    assert cells == ["all_transfer_finetune", "last_transfer_finetune", "original", "scratch_all", "scratch_last",
                     "scratch_window128", "scratch_window32", "scratch_window32_only", "window128_transfer_finetune",
                     "window32_only_transfer_finetune", "window32_transfer_finetune"]
    report = json.loads((store / "window32_transfer_finetune" / "seed_0.json").read_text())
    assert "primal.window=32" in report["command"] and "primal.gate_init=2.0" in report["command"]
    alpha = report["window_alpha"]
    assert len(alpha) == 4 and all(len(layer) == 2 and all(0 < a < 1 for a in layer) for layer in alpha)
    page = (tmp_path / "convert.md").read_text()
    assert "| **all layers window 32 + primal** |" in page and "| **all layers window 128 + primal** |" in page
    assert "- **all layers window 32 + primal** " in page and "% of the gap closed)" in page  # the window verdict
    assert "The window alone (the control) keeps" in page and "the window cannot be judged yet (fewer than two seeds" in page
    control = json.loads((store / "window32_only_transfer_finetune" / "seed_0.json").read_text())
    assert all(a > 0.999 for layer in control["window_alpha"] for a in layer)  # the control stays a window
