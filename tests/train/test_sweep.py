"""`primal sweep`: grid parsing, selection on validation only, resumable and parallel cells."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from primal_attention.train.config import ConfigError
from primal_attention.train.sweep import (
    Sweep, SweepPoint, grid_points, parse_grid, point_name, select_point, selected_val_loss,
)

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "uea" / "JapaneseVowels_primal+.yaml"
TINY = ["data.max_examples=60", "model.dim=16", "model.num_heads=2", "model.ffn_dim=32",
        "model.attention_options.primal.rank=4", "train.batch_size=8", "train.eval_batch_size=128", "train.epochs=2"]


def test_grid_values_are_yaml_and_their_product_is_ordered() -> None:
    grid = parse_grid(["optim.lr=1e-4,3e-4", "train.eta=0,0.1", "model.dropout=null"])
    assert grid == {"optim.lr": [1e-4, 3e-4], "train.eta": [0, 0.1], "model.dropout": [None]}
    points = grid_points(grid)
    assert [tuple(p.values()) for p in points] == [(1e-4, 0, None), (1e-4, 0.1, None), (3e-4, 0, None), (3e-4, 0.1, None)]
    assert point_name(points[1]) == "optim.lr=0.0001,train.eta=0.1,model.dropout=null"
    assert point_name({"model.attention": "a/b c"}) == "model.attention=a_b_c"


@pytest.mark.parametrize("specs, message", [
    ([], "at least one --grid"),
    (["optim.lr"], "must look like key.sub=v1,v2"),
    (["optim.lr="], "must look like key.sub=v1,v2"),
    (["optim.lr=1e-4,,1e-3"], "empty value"),
    (["optim.lr=1e-4,1e-4"], "repeated"),
    (["optim.lr=1e-4", "optim.lr=1e-3"], "given twice"),
    (["train.seed=0,1"], "cannot be swept"),
    (["train.protocol=authors"], "cannot be swept"),
])
def test_bad_grids_are_one_clear_error(specs, message) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_grid(specs)


def test_grid_values_are_kept_exactly() -> None:
    """Two values equal to 6 digits are two points (two runs), not one run reported twice."""
    grid = parse_grid(["optim.lr=1e-4,1.0000001e-4"])
    names = [point_name(p) for p in grid_points(grid)]
    assert len(set(names)) == 2 and names[1] == "optim.lr=0.00010000001"


def test_a_store_of_another_config_is_refused(tmp_path) -> None:
    """A stored cell is reused only for the same resolved config: a re-run with another --set is refused."""
    store = tmp_path / "store"
    cell = store / "points" / point_name({"optim.lr": 1e-3}) / "seed_0.json"
    cell.parent.mkdir(parents=True)
    sets = [*TINY, "optim.lr=0.001", "train.protocol=holdout", "train.threads=1"]
    command = f"primal train {CONFIG} --out x --seeds 0 --resume " + " ".join(f"--set {s}" for s in sets)
    cell.write_text(json.dumps({"best_val_acc": 0.5, "command": command}))
    Sweep(CONFIG, {"optim.lr": [1e-3]}, tmp_path / "out", store, overrides=tuple(TINY))  # the same: accepted
    with pytest.raises(ConfigError, match=r"trained with another config \(differs in train.epochs\)"):
        Sweep(CONFIG, {"optim.lr": [1e-3]}, tmp_path / "out", store, overrides=(*TINY, "train.epochs=3"))
    cell.write_text(json.dumps({"best_val_acc": 0.5, "config": {"optim.lr": 1.0}}))
    with pytest.raises(ConfigError, match="differs in"):
        Sweep(CONFIG, {"optim.lr": [1e-3]}, tmp_path / "out", store, overrides=tuple(TINY))
    cell.write_text("{not json")
    with pytest.raises(ConfigError, match="is not a stored sweep cell"):
        Sweep(CONFIG, {"optim.lr": [1e-3]}, tmp_path / "out", store, overrides=tuple(TINY))


def _point(lr: float, val: float, test: float) -> SweepPoint:
    return SweepPoint({"optim.lr": lr}, point_name({"optim.lr": lr}), val, test, {})


def test_selection_uses_validation_in_the_task_direction_and_ties_go_first() -> None:
    points = [_point(1e-4, 0.5, 0.9), _point(3e-4, 0.7, 0.1), _point(1e-3, 0.7, 0.2)]
    assert select_point(points, maximize=True).point == {"optim.lr": 3e-4}  # test (0.9) never chooses
    assert select_point(points, maximize=False).point == {"optim.lr": 1e-4}  # e.g. a validation loss
    # a saturated validation accuracy: the lower validation loss at the selected evaluation decides
    saturated = [SweepPoint({"optim.lr": lr}, "", 1.0, None, {}, loss) for lr, loss in ((1e-4, 0.3), (1e-3, 0.1), (3e-3, None))]
    assert select_point(saturated, maximize=True).point == {"optim.lr": 1e-3}


def test_the_tie_break_reads_the_selected_evaluations_validation_loss() -> None:
    history = [{"val_acc": 0.9, "val_loss": 0.5}, {"val_acc": 1.0, "val_loss": 0.2}, {"val_acc": 1.0, "val_loss": 0.1}]
    assert selected_val_loss({"history": history}, "acc", True) == 0.2  # the first evaluation at the best
    assert selected_val_loss({"history": [{"val_acc": 1.0}]}, "acc", True) is None
    with pytest.raises(ValueError):
        select_point([], maximize=True)


def test_a_sweep_checks_every_point_before_training(tmp_path) -> None:
    with pytest.raises(ConfigError, match="model.num_heads|divisible|heads"):
        Sweep(CONFIG, {"model.num_heads": [2, 5]}, tmp_path, overrides=tuple(TINY))
    with pytest.raises(ConfigError, match="unknown key"):
        Sweep(CONFIG, {"optim.lrr": [1e-3]}, tmp_path, overrides=tuple(TINY))
    assert not (tmp_path / "points").exists()


def _fake(store: Path, lr: float, val: float, test: float) -> None:
    path = store / "points" / point_name({"optim.lr": lr}) / "seed_0.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"name": "x", "best_val_acc": val, "test_acc": test, "wall_time_s": 1.0,
                                "selection": {"metric": "acc", "maximize": True}}))


def test_stored_points_are_selected_on_validation_not_test(tmp_path) -> None:
    sweep = Sweep(CONFIG, {"optim.lr": [1e-4, 1e-3, 1e-2]}, tmp_path, overrides=tuple(TINY))
    _fake(tmp_path, 1e-4, val=0.6, test=0.95)
    _fake(tmp_path, 1e-3, val=0.8, test=0.50)
    assert sweep.chosen() is None  # one point still missing
    _fake(tmp_path, 1e-2, val=0.7, test=0.99)
    assert sweep.chosen().point == {"optim.lr": 1e-3}
    report = sweep.write_report()
    assert report["complete"] and report["chosen"] == {"optim.lr": 1e-3} and not report["final_complete"]
    assert "**chosen**" in (tmp_path / "sweep.md").read_text().split("0.001 |")[1].splitlines()[0]


def test_a_sweep_past_its_start_by_starts_no_cell_but_keeps_what_is_stored(tmp_path) -> None:
    import time

    late = Sweep(CONFIG, {"optim.lr": [1e-4, 1e-3]}, tmp_path, overrides=tuple(TINY), start_by=time.time() - 1)
    _fake(tmp_path, 1e-4, val=0.6, test=0.6)
    assert late.step() is False  # 1e-3 is not started (training it here would take seconds and leave a file)
    assert [p.point for p in late.results()] == [{"optim.lr": 1e-4}]
    assert not (tmp_path / "points" / point_name({"optim.lr": 1e-3})).exists()
    assert late.run_cell(*late.cells()[0]) is True  # a stored cell is stored, whatever the time
    assert late.held == 0  # refused for the time, not held by another worker


def test_a_sweep_in_progress_reports_its_points_so_far(tmp_path) -> None:
    """A pass that leaves a cell to another worker still writes the report: the results pages show the
    points so far (and no choice) while a long sweep runs."""
    import fcntl

    sweep = Sweep(CONFIG, {"optim.lr": [1e-4, 1e-3]}, tmp_path, overrides=tuple(TINY))
    _fake(tmp_path, 1e-4, val=0.6, test=0.9)
    (tmp_path / "locks").mkdir()
    with open(tmp_path / "locks" / f"point-{point_name({'optim.lr': 1e-3})}-seed_0.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another worker trains this cell
        assert sweep.step() is False
    assert sweep.held == 1  # counted, so a worker with a deadline waits for it rather than stop
    report = json.loads((tmp_path / "sweep.json").read_text())
    assert [p["name"] for p in report["points"]] == ["optim.lr=0.0001"]
    assert not report["complete"] and report["chosen"] is None
    assert not list(tmp_path.glob(".sweep.*.tmp"))  # written whole, then renamed


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "primal_attention.cli", *args], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})


def _sets() -> list[str]:
    return [a for s in TINY for a in ("--set", s)]


def test_sweep_cli_trains_selects_and_runs_the_final_seeds_once(tmp_path) -> None:
    out, store = tmp_path / "runs", tmp_path / "store"
    args = ["sweep", str(CONFIG), "--grid", "optim.lr=1e-4,3e-3", "--out", str(out), "--store", str(store),
            "--seeds", "1,2", "--workers", "2", *_sets()]
    proc = cli(*args)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((store / "sweep.json").read_text())
    points = {p["name"]: p for p in report["points"]}
    assert set(points) == {"optim.lr=0.0001", "optim.lr=0.003"} and report["complete"] and report["final_complete"]
    best = max(report["points"], key=lambda p: (p["val_acc"], -p["val_loss"], -report["points"].index(p)))
    assert report["chosen"] == best["point"] and report["selection"]["metric"] == "val_acc"
    for p in report["points"]:  # every point trained once, under the holdout protocol, on one budget
        metrics = json.loads((store / "points" / p["name"] / "seed_0.json").read_text())
        assert metrics["protocol"] == "holdout" and metrics["epochs"] == 2 and metrics["val_examples"] > 0
    # the final seeds are fresh runs: the sweep's run of the chosen point (which won the selection) is not one
    finals = store / "final" / point_name(report["chosen"])
    assert sorted(p.name for p in finals.iterdir()) == ["seed_1.json", "seed_2.json"]
    assert [json.loads((finals / f"seed_{s}.json").read_text())["seed"] for s in (1, 2)] == [1, 2]
    assert report["final"]["test_acc"]["n"] == 2
    # run again: nothing is trained, the same report comes back
    again = cli(*args)
    assert again.returncode == 0, again.stderr
    assert "$ primal train" not in again.stdout and json.loads((store / "sweep.json").read_text()) == report


def test_a_final_seed_equal_to_the_sweep_seed_is_refused(tmp_path) -> None:
    proc = cli("sweep", str(CONFIG), "--grid", "optim.lr=1e-4,3e-3", "--out", str(tmp_path), "--seeds", "0,1")
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0
    assert "must not include the sweep seed 0" in proc.stderr and not (tmp_path / "work").exists()


def test_sweep_cli_bad_grid_is_one_line(tmp_path) -> None:
    proc = cli("sweep", str(CONFIG), "--grid", "train.seed=0,1", "--out", str(tmp_path))
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0
    assert "primal sweep: error: --grid: train.seed cannot be swept" in proc.stderr


def test_sigterm_stops_a_sweep_with_a_message_and_exit_143(tmp_path) -> None:
    import signal
    import time

    args = [sys.executable, "-m", "primal_attention.cli", "sweep", str(CONFIG), "--grid", "optim.lr=1e-4,3e-3",
            "--out", str(tmp_path / "runs"), *_sets(), "--set", "train.epochs=50"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not list((tmp_path / "runs").glob("work/*/seed_0/config.yaml")) and time.time() < deadline:
        time.sleep(0.2)  # training has started
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "Traceback" not in err and "run the same command again to continue" in err
