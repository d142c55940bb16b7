"""studies/comparison: the tuned sections of the results pages, read from sweep stores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from primal_attention.studies.comparison import (Entry, Outcome, at_grid_edge, below_baseline, clears_baseline, outcome,
                                             tuned_section)
from primal_attention.train.sweep import Sweep, point_name

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "uea" / "JapaneseVowels_primal+.yaml"
TINY = ("data.max_examples=60", "model.dim=16", "model.num_heads=2", "model.ffn_dim=32",
        "model.attention_options.primal.rank=4", "train.batch_size=8", "train.epochs=2")
GRID = {"optim.lr": [1e-4, 1e-3]}


def write(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))


def store(tmp: Path, name: str, vals: dict[float, float], finals: list[float] | None, rising: bool = False,
          grid: dict[str, list[float]] = GRID, metric: str = "acc") -> Entry:
    """A sweep store of ``name``: seed 0 per grid point (validation value = test value), and the chosen point's
    final seeds; ``rising``: each final's best validation evaluation is its last. ``metric`` "loss" is minimised."""
    root = tmp / name
    maximize = metric != "loss"
    selection = {"metric": metric, "maximize": maximize}
    for lr, val in vals.items():
        write(root / "points" / point_name({"optim.lr": lr}) / "seed_0.json",
              {"name": name, f"best_val_{metric}": val, f"test_{metric}": val, "wall_time_s": 1.0, "selection": selection})
    sweep = Sweep(CONFIG, grid, root, overrides=TINY, final_seeds=tuple(range(1, 1 + len(finals or [0]))))
    chosen = sweep.chosen()
    if chosen is not None and finals:
        curve = [0.5, 0.9, 1.0] if rising else [0.5, 0.7, 0.6]
        history = [{f"val_{metric}": v if maximize else 6.0 - v} for v in curve]
        for seed, test in enumerate(finals, start=1):
            write(root / "final" / chosen.name / f"seed_{seed}.json",
                  {"name": name, f"test_{metric}": test, f"best_test_{metric}": test + 0.01,
                   f"final_test_{metric}": test - 0.01, "history": history, "selection": selection})
    sweep.write_report()
    return Entry(name, CONFIG, root)


def test_tuned_section_rows_choice_interval_and_baselines(tmp_path: Path) -> None:
    ref = store(tmp_path, "Transformer", {1e-4: 0.70, 1e-3: 0.80}, [0.60, 0.62, 0.61])
    better = store(tmp_path, "PrimalFormer", {1e-4: 0.90, 1e-3: 0.85}, [0.80, 0.81, 0.79], rising=True)
    partial = store(tmp_path, "Primal.+Trans.", {1e-4: 0.75}, None)
    baselines = {"majority": {"what": "most frequent class", "test_acc": [0.61, 0.61, 0.61]}}
    lines = tuned_section([ref, better, partial], baselines, reference="Transformer")
    text = "\n".join(lines)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in lines if line.startswith("| ")}
    assert "0.0001: 70.0 · **0.001: 80.0**" in rows["Transformer"]  # chosen on validation, in bold
    assert "**0.0001: 90.0** · 0.001: 85.0" in rows["PrimalFormer"]
    # a point not run yet shows – in its place in the grid
    assert "0.0001: 75.0 · 0.001: – (1 left)" in rows["Primal.+Trans."] and "| 0 |" in rows["Primal.+Trans."]
    assert "61.0 ± 1.0" in rows["Transformer"] and "3/3 flat" in rows["Transformer"]
    assert "3/3 still improving" in rows["PrimalFormer"]  # a new best in the last quarter of its evaluations
    assert "*trivial: majority* (most frequent class)" in text
    # the Transformer's 61.0 ± 1.0 is not clearly above the majority class's 61.0: the +19 is no verdict
    assert below_baseline([ref, better, partial], baselines) == ["Transformer (61.0 vs majority 61.0)"]
    assert "**At or below a trivial baseline**" in text
    assert "+19.0 [" in rows["PrimalFormer"] and "excludes 0" in rows["PrimalFormer"] and "better" not in rows["PrimalFormer"]
    assert "**No verdict: the Transformer is not above a trivial baseline**" in text
    assert "**Validation still rising at the end of the schedule** (a new best in the last quarter" in text
    assert "PrimalFormer (3/3 seeds, +10.0)." in text  # 1.0 at the end against the earlier best 0.9
    # without a baseline that the Transformer fails, the same difference is a verdict
    fair = tuned_section([ref, better, partial], {"majority": {"what": "most frequent class", "test_acc": [0.5] * 3}},
                         reference="Transformer")
    assert any(line.startswith("| PrimalFormer") and line.split(" | ")[6].endswith("better") for line in fair)
    assert not any(line.startswith("**No verdict") for line in fair)
    # a still-rising schedule gives that verdict only because the Transformer clears every trivial baseline
    assert "read as a verdict because the Transformer is above every trivial baseline, best majority 50.0" in \
        "\n".join(fair)
    assert "read as a verdict" not in text
    # a Transformer with one final seed is not known to clear the baseline: nothing is claimed for it
    one = store(tmp_path, "Transformer1", {1e-4: 0.70, 1e-3: 0.80}, [0.60])
    early = "\n".join(tuned_section([one, better], {"majority": {"what": "m", "test_acc": [0.5] * 3}},
                                     reference="Transformer1"))
    assert "still rising" in early and "read as a verdict" not in early
    # stds 1.0 a side, n = 3: Welch df = 4, t = 2.776, half-width 2.776 · sqrt(2/3) = 2.27
    # and the true difference found 4 times in 5: (t_.975 + t_.80) · se = (2.776 + 0.941) · 0.816 = 3.03
    assert "**Smallest detectable difference** (±: half the width of the 95 % interval" in text
    assert "PrimalFormer ±2.3 (80 % power: 3.0)." in text


def test_outcome_of_a_sweep_not_started_and_the_baseline_rule(tmp_path: Path) -> None:
    assert outcome(Entry("x", CONFIG, tmp_path / "nothing")) is None
    assert clears_baseline([0.9, 0.92], 0.8, maximize=True)
    assert not clears_baseline([0.9, 0.70], 0.8, maximize=True)  # within one std
    assert clears_baseline([100.0], 120.0, maximize=False)  # a perplexity below the baseline's


def test_a_loss_comparison_before_any_sweep_shows_the_loss_and_its_baselines(tmp_path: Path) -> None:
    entries = [Entry("Transformer", CONFIG, tmp_path / "a"), Entry("PrimalFormer", CONFIG, tmp_path / "b")]
    baselines = {"bigram": {"what": "bigram model", "test_loss": [4.7843, 4.7843, 4.7843]}}
    lines = tuned_section(entries, baselines, reference="Transformer", metric="loss")
    assert "validation loss per optim.lr" in lines[0]
    assert any("| *trivial: bigram* (bigram model) | – | 3 | 4.784 ± 0.000 |" in line for line in lines)
    assert sum("not run yet" in line for line in lines) == 2


def test_a_choice_at_the_edge_of_a_finished_grid_is_flagged(tmp_path: Path) -> None:
    grid = {"optim.lr": [1e-4, 1e-3, 1e-2]}
    top = store(tmp_path, "PrimalFormer", {1e-4: 0.5, 1e-3: 0.6, 1e-2: 0.7}, [0.7], grid=grid)
    inner = store(tmp_path, "Transformer", {1e-4: 0.5, 1e-3: 0.8, 1e-2: 0.7}, [0.8], grid=grid)
    low = store(tmp_path, "Primal.+Trans.", {1e-4: 0.9, 1e-3: 0.8, 1e-2: 0.7}, [0.9], grid=grid)
    unfinished = store(tmp_path, "half", {1e-4: 0.9}, None, grid=grid)
    two = store(tmp_path, "two", {1e-4: 0.9, 1e-3: 0.8}, [0.9])  # a two-value grid has no inside: always an edge
    assert at_grid_edge(outcome(top)) == "optim.lr 0.01, the largest"
    assert at_grid_edge(outcome(low)) == "optim.lr 0.0001, the smallest"
    assert at_grid_edge(outcome(inner)) == at_grid_edge(outcome(unfinished)) == ""
    assert at_grid_edge(outcome(two)) == "optim.lr 0.0001, the smallest"
    lines = tuned_section([inner, top, low], {}, reference="Transformer")
    assert lines[-1].startswith("**Chosen at the edge of the grid**")
    assert "PrimalFormer (optim.lr 0.01, the largest); Primal.+Trans. (optim.lr 0.0001, the smallest)." in lines[-1]


def test_a_verdict_is_read_against_the_papers_claim() -> None:
    from primal_attention.studies.comparison import verdict_against_claim

    assert verdict_against_claim("better", "better") == "reproduced (better)"
    assert verdict_against_claim("within noise", "parity") == "reproduced (parity)"
    assert verdict_against_claim("worse", "worse") == "reproduced (worse)"  # the paper's PrimalFormer on Pathfinder
    assert verdict_against_claim("better", "parity") == "not reproduced (better; the paper: parity)"
    assert verdict_against_claim("within noise", "better") == "not reproduced (parity; the paper: better)"
    with pytest.raises(ValueError):  # a claim is a direction read from the paper's two numbers, nothing vaguer
        verdict_against_claim("within noise", "not worse")
    assert verdict_against_claim("better", None) == "better (no claim in the paper)"
    with pytest.raises(ValueError, match="claimed must be one of"):
        verdict_against_claim("better", "much better")


def test_a_loss_comparison_shows_its_difference_to_the_losss_digits_and_says_falling(tmp_path: Path) -> None:
    ref = store(tmp_path, "Transformer", {1e-4: 5.0, 1e-3: 4.6}, [4.534, 4.530, 4.540], metric="loss")
    worse = store(tmp_path, "PrimalFormer", {1e-4: 5.0, 1e-3: 4.7}, [4.569, 4.570, 4.567], rising=True, metric="loss")
    lines = tuned_section([ref, worse], {}, reference="Transformer")
    text = "\n".join(lines)
    row = next(line for line in lines if line.startswith("| PrimalFormer"))
    assert "0.0001: 5.000 · **0.001: 4.700**" in row  # the lower validation loss is chosen
    assert "+0.034 [+0.0" in row and "worse" in row  # a loss difference to 0.001, not rounded to +0.0
    assert "**Validation loss still falling at the end of the schedule**" in text and "PrimalFormer (3/3 seeds, +0.100)" in text  # 6 - 0.9 → 6 - 1.0
    assert "still rising" not in text


def test_a_curve_still_improving_reaches_a_new_best_in_its_last_quarter(tmp_path: Path) -> None:
    from primal_attention.studies.comparison import late_gains, no_verdict, still_improving

    entry = Entry("x", CONFIG, tmp_path)

    def made(*curves: list[float], maximize: bool = True) -> Outcome:
        key = "val_acc" if maximize else "val_loss"
        return Outcome(entry, "acc" if maximize else "loss", maximize, [], None, [], [], [],
                       [[{key: v} for v in c] for c in curves], {})

    # ten evaluations: the last three are the last quarter. A best at evaluation 9 of 10 still counts (the audit's
    # LRA Image curves), a plateau reached early does not, nor a late value that only ties the earlier best.
    late_peak = [0.1 * i for i in range(9)] + [0.75]
    plateau = [0.5, 0.8, 0.9, 0.9, 0.9, 0.89, 0.9, 0.88, 0.9, 0.9]
    assert still_improving(made(late_peak, plateau)) == (1, 2)
    assert late_gains(made(late_peak))[0] == pytest.approx(100 * (0.8 - 0.6))
    # a loss improves downwards
    assert still_improving(made([5.0, 4.0, 3.9, 3.8], maximize=False)) == (1, 1)
    assert still_improving(made([5.0, 4.0, 4.1, 4.2], maximize=False)) == (0, 1)
    assert still_improving(made([0.5])) == (1, 1)  # one evaluation: nothing shows a plateau
    assert still_improving(made([], [0.5, 0.6])) == (1, 1)  # a seed without a history is not counted

    # no_verdict: nobody clears the baseline / the reference does not / a fair comparison
    ref, other = [0.80, 0.81, 0.80], [0.86, 0.87, 0.86]
    assert no_verdict({"T": ref, "P": other}, "T", 0.90, True) == "no signal on this budget"
    assert no_verdict({"T": ref, "P": other}, "T", 0.84, True) == "no fair verdict: the T is not above a trivial baseline"
    assert no_verdict({"T": ref, "P": other}, "T", 0.50, True) is None
    assert no_verdict({"T": ref, "P": other}, "T", None, True) is None


def test_runs_that_score_test_once_say_why_best_and_final_test_are_missing(tmp_path: Path) -> None:
    ref = store(tmp_path, "Transformer", {1e-4: 0.70, 1e-3: 0.80}, [0.60, 0.62, 0.61])
    for path in (tmp_path / "Transformer" / "final").rglob("seed_*.json"):  # as a run with train.track_test off
        record = json.loads(path.read_text())
        del record["best_test_acc"], record["final_test_acc"]
        path.write_text(json.dumps(record))
    text = "\n".join(tuned_section([ref], {}, reference="Transformer"))
    assert "| 61.0 ± 1.0 | – | – |" in text and "`train.track_test` off" in text
    assert "track_test" not in "\n".join(tuned_section([store(tmp_path, "x", {1e-4: 0.7}, [0.6])], {}, reference="x"))


def test_a_pending_longer_comparison_takes_the_direction_out_of_every_difference(tmp_path: Path) -> None:
    ref = store(tmp_path, "Transformer", {1e-4: 0.70, 1e-3: 0.80}, [0.60, 0.62, 0.61])
    better = store(tmp_path, "PrimalFormer", {1e-4: 0.90, 1e-3: 0.85}, [0.80, 0.81, 0.79])
    lines = tuned_section([ref, better], {}, reference="Transformer", pending="curves rise; `x` not finished")
    row = next(line for line in lines if line.startswith("| PrimalFormer"))
    assert row.split(" | ")[6].endswith("excludes 0")
    assert "**No verdict: curves rise; `x` not finished**" in "\n".join(lines)


def test_a_baselines_description_says_what_each_seed_chose_and_which_stayed_at_an_edge() -> None:
    from primal_attention.studies.comparison import baseline_what

    assert baseline_what({"what": "majority"}) == "majority"
    row = {"what": "linear", "choice": [1e-3, 0.1, 1e-3], "tried": [[1e-4, 1e-3, 1e-2], [1e-3, 1e-2, 0.1], [1e-4, 1e-3, 1e-2]]}
    assert baseline_what(row) == "linear; chosen per seed: 0.001, 0.1, 0.001 (1 of 3 still at the edge of what was tried)"
    row["tried"][1].append(1.0)
    assert baseline_what(row) == "linear; chosen per seed: 0.001, 0.1, 0.001"


def test_a_choice_among_tied_validation_values_is_flagged(tmp_path: Path) -> None:
    ref = store(tmp_path, "Transformer", {1e-4: 0.90, 1e-3: 0.90}, [0.60, 0.62, 0.61])
    other = store(tmp_path, "PrimalFormer", {1e-4: 0.90, 1e-3: 0.85}, [0.60, 0.62, 0.61])
    text = "\n".join(tuned_section([ref, other], {}, reference="Transformer"))
    assert "**Chosen by the tie-break**" in text and "Transformer (2 of 2 points at 90.0)." in text
    assert "PrimalFormer (" not in text.split("**Chosen by the tie-break**")[1].split("\n\n")[0]  # a clear winner


def test_the_power_figure_of_seeds_that_all_agree_is_not_a_number(tmp_path: Path) -> None:
    ref = store(tmp_path, "Transformer", {1e-4: 0.80, 1e-3: 0.90}, [1.0, 1.0, 1.0])
    other = store(tmp_path, "PrimalFormer", {1e-4: 0.80, 1e-3: 0.90}, [1.0, 1.0, 1.0])
    text = "\n".join(tuned_section([ref, other], {}, reference="Transformer"))
    assert "PrimalFormer ±0.0 (80 % power: –, every seed of both gave the same value)." in text
