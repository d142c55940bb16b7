"""The results scripts' helpers: stored evaluation histories and grid claims."""

from __future__ import annotations

from primal_attention.train.experiments import claim, evaluation_history
from primal_attention.train.stats import value_cell


def test_history_keeps_the_evaluations_without_diagnostics(tmp_path) -> None:
    path = tmp_path / "history.csv"
    path.write_text("step,epoch,train_loss,train_batch_acc,val_acc,test_acc,ksvd/a.J\n10,0.5,1.2,0.4,0.5,0.45,3\n20,1.0,0.9,0.6,0.7,,2\n")
    assert evaluation_history(path) == [
        {"step": 10.0, "epoch": 0.5, "train_loss": 1.2, "val_acc": 0.5, "test_acc": 0.45},
        {"step": 20.0, "epoch": 1.0, "train_loss": 0.9, "val_acc": 0.7},
    ]
    assert evaluation_history(tmp_path / "missing.csv") == []


def test_history_keeps_the_columns_asked_for(tmp_path) -> None:
    path = tmp_path / "history.csv"
    path.write_text("step,epoch,train_loss,val_acc,ksvd/a.J,ksvd_distance/a.objective_ratio\n10,0.5,1.2,0.5,3,0.75\n")
    assert evaluation_history(path, ("ksvd_distance/",)) == [
        {"step": 10.0, "epoch": 0.5, "train_loss": 1.2, "val_acc": 0.5, "ksvd_distance/a.objective_ratio": 0.75}]


def test_a_cell_is_claimed_once_and_cells_format(tmp_path) -> None:
    folder = tmp_path / "claims"
    assert claim(folder, "a-seed_0") and not claim(folder, "a-seed_0") and claim(folder, "a-seed_1")
    assert value_cell([]) == "–" and value_cell([1.0]) == "1.00" and value_cell([1.0, 3.0], 1) == "2.0 ± 1.4"
