"""scripts/results_ksvd.py: the KSVD study's page from stored runs, and one tiny real run through its grid."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def study():
    from primal_attention.studies import ksvd

    yield ksvd


LAYERS = ("encoder.blocks.0.attn", "encoder.blocks.1.attn")


def row(step: int, *, angle: float, residual: float, ratio: float, j: float, s_b: float = 5.0, rank: float = 12.0) -> dict:
    """One evaluation of a history.csv as the trainer writes it, the same values in both layers."""
    fields = {"solution_rank": s_b, "kernel_rank": rank, "angle_e_max": 2 * angle, "angle_e_mean": angle,
              "angle_r_max": 2 * angle, "angle_r_mean": angle, "angle_we_max": 2 * angle, "angle_we_mean": angle,
              "angle_wr_max": 2 * angle, "angle_wr_mean": angle, "captured_optimal": 0.99, "captured_learned": 0.9 * ratio,
              "objective_ratio": ratio, "j_learned": -10 * j, "j_optimal": 0.0, "res_e": residual, "res_r": residual,
              "res_e_scaled": residual, "res_r_scaled": residual}
    out = {"step": float(step), "epoch": float(step), "train_loss": 1.0, "val_acc": 0.9}
    for layer in LAYERS:
        out.update({f"ksvd_distance/{layer}.{k}": v for k, v in fields.items()})
        out[f"ksvd/{layer}.J_authors_rms"] = j
    return out


def store_run(store: Path, name: str, seed: int, final: dict, test_acc: float = 0.95) -> None:
    start = row(1, angle=70.0, residual=1.0, ratio=0.9, j=1.0, s_b=final["s_b"], rank=final["rank"])
    record = {"seed": seed, "test_acc": test_acc, "train_examples": 216, "val_examples": 54, "test_examples": 370,
              "command": "primal train ...", "history": [start, row(2, **final)]}
    (store / name).mkdir(parents=True, exist_ok=True)
    (store / name / f"seed_{seed}.json").write_text(json.dumps(record))


def store_init(store: Path, setting: str, seed: int, s_b: float, rank: float) -> None:
    d = {k.rsplit(".", 1)[1]: v for k, v in row(0, angle=70.0, residual=1.0, ratio=0.9, j=2.0, s_b=s_b, rank=rank).items()
         if k.startswith("ksvd_distance/encoder.blocks.0")}
    record = {"seed": seed, "command": "primal spectrum ...", "ksvd_diagnostics_batch": "first 16 training examples",
              "ksvd_distances": {layer: d for layer in LAYERS},
              "ksvd_diagnostics": {f"{layer}.J_authors_rms": 2.0 for layer in LAYERS}}
    (store / f"{setting}_init").mkdir(parents=True, exist_ok=True)
    (store / f"{setting}_init" / f"seed_{seed}.json").write_text(json.dumps(record))


def synthetic_store(store: Path) -> None:
    """JapaneseVowels only. s 40 (s_b = rank K: token space trivial), s 5 (informative). Per seed k:
    η 0 stays where it started (70°, residual 1, ratio 0.9); the authors' η 0.5 reaches 40 + k° and ratio
    0.95, residual unchanged (closer, not at the solution); η 5 is at the solution (1°, 0.05, 0.999)."""
    for seed in (0, 1, 2):
        for setting, s_b in (("jv", 12.0), ("jv_rank5", 5.0)):
            store_init(store, setting, seed, s_b, 12.0)
            shape = {"s_b": s_b, "rank": 12.0}
            store_run(store, f"{setting}_eta0", seed, {"angle": 70.0 + seed, "residual": 1.0, "ratio": 0.9,
                                                       "j": 1.0 + seed / 10, **shape})
            store_run(store, f"{setting}_eta0.5", seed, {"angle": 40.0 + seed, "residual": 1.0, "ratio": 0.95 + seed / 1000,
                                                         "j": 0.01 + seed / 1000, **shape})
            store_run(store, f"{setting}_eta5", seed, {"angle": 1.0 + seed / 10, "residual": 0.05, "ratio": 0.999,
                                                       "j": 0.001 + seed / 1000, **shape})
    record = {"seed": 2, "failed": "non-finite loss at step 40", "history": [], "command": "primal train ..."}
    (store / "image_eta1").mkdir(parents=True)
    (store / "image_eta1" / "seed_2.json").write_text(json.dumps(record))


def table_row(page: str, setting: str, eta: str) -> list[str]:
    line = next(x for x in page.splitlines() if x.startswith(f"| {setting} | {eta} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_page_from_synthetic_runs(study, tmp_path) -> None:
    store, page = tmp_path / "store", tmp_path / "docs" / "ksvd.md"
    synthetic_store(store)
    study.write_page(store, page)
    text = page.read_text()
    head = ["setting", "η", "n", "test acc % (val-selected)", *(m.label for m in study.METRICS)]
    col = {h: i for i, h in enumerate(head)}
    cells = table_row(text, "s 5", "0.5")
    assert cells[col["n"]] == "3" and cells[col["test acc % (val-selected)"]] == "95.0 ± 0.0"
    assert cells[col["∠ feature space °"]] == "41.0 ± 1.0" and cells[col["∠ token space °"]] == "41.0 ± 1.0"
    assert cells[col["scaled residual"]] == "1.000 ± 0.000" and cells[col["objective ratio"]] == "0.951 ± 0.001"
    assert cells[col["J_authors rms"]] == "0.011 ± 0.001" and cells[col["\\|J\\| paper's"]] == "0.11 ± 0.01"
    untrained = table_row(text, "s 5", "untrained")
    assert untrained[col["n"]] == "3" and untrained[col["∠ feature space °"]] == "70.0 ± 0.0"
    # s 40 with s_b = rank K: the token-space cells are marked trivial and left out of the comparisons.
    trivial = table_row(text, "s 40 (authors')", "5")
    assert trivial[col["∠ token space °"]] == "1.1 ± 0.1\\*" and trivial[col["∠ feature space °"]] == "1.1 ± 0.1"
    assert "| s 40 (authors'), η 0.5 − s 40 (authors'), η 0 |" in text and "trivial (s ≥ L)" in text
    assert "-30.0 [" in text and "] closer" in text and "] lower" in text
    # The verdict words follow the stated rule.
    assert "bring layers toward the KSVD solution? **toward it, not to it**" in text
    assert "Against η 0: **yes**" in text and "against the authors' η: **yes**" in text
    assert "4× steps at the authors' η, vs the standard schedule)? **not measured yet**" in text
    assert "J → 0 with the regulariser" in text and "**confirmed** (confirmed = lower" in text
    assert "**not confirmed** (confirmed = all ≥ 0.9)" in text  # η 5 has residual 0.05
    assert "**contradicted for jv s 40 (authors'), η 5, jv s 5, η 5**" in text
    assert "Failed runs (not in the table): s 20 (authors'), η 1 seed 2: non-finite loss at step 40." in text
    gaps = text.split("## Not run yet")[1]
    assert "image s 20 (authors'), η 1: seeds 0, 1;" in gaps and "jv s 5, η 0:" not in gaps
    assert (page.parent / "ksvd" / "jv.png").is_file() and not (page.parent / "ksvd" / "image.png").exists()


def test_page_renders_without_runs(study, tmp_path) -> None:
    page = tmp_path / "ksvd.md"
    study.write_page(tmp_path / "empty", page)
    text = page.read_text()
    assert text.count("No run stored yet.") == 2 and "**not measured yet**" in text
    assert "jv s 40 (authors') untrained: seeds 0, 1, 2" in text and "image s 20 (authors'), η 0.1, 4× steps: seeds 0, 1, 2" in text


@pytest.mark.slow
def test_one_tiny_run_through_the_grid(study, tmp_path) -> None:
    """JapaneseVowels s 5 at the authors' η, one epoch on 40 examples of a narrow model, and its untrained
    reference: the stored history has every layer's distances, the page shows the run."""
    store, work, page = tmp_path / "store", tmp_path / "work", tmp_path / "ksvd.md"
    tiny = ["data.max_examples=40", "train.epochs=1", "model.dim=64", "model.ffn_dim=64"]
    run = next(r for r in study.RUNS if r.name == "jv_rank5_eta0.5")
    record = study.train_cell(run, 0, store=store, work=work, extra=tiny)
    assert record == study.train_cell(run, 0, store=store, work=work, extra=tiny)  # stored: not trained again
    (final,) = record["history"]
    for layer in LAYERS:
        assert final[f"ksvd_distance/{layer}.solution_rank"] == 5.0
        assert 0.0 <= final[f"ksvd_distance/{layer}.angle_we_mean"] <= 90.0
        assert final[f"ksvd/{layer}.J_authors_rms"] > 0.0 and f"ksvd/{layer}.lam_mean" not in final
    init = study.init_cell(run.setting, 0, store=store, work=work, extra=tiny)
    assert init["ksvd_diagnostics_batch"] == "first 16 training examples"
    assert set(init["ksvd_distances"]) == set(LAYERS)
    study.write_page(store, page)
    assert table_row(page.read_text(), "s 5", "0.5")[2] == "1"
