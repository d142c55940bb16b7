"""scripts/results_summary.py: the tuned RL average is measured against the behaviour policy of the data it
used, and the earlier verdicts against the earlier data's."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _summary(monkeypatch, tmp: Path):
    monkeypatch.setenv("PRIMAL_ATTENTION_CACHE", str(tmp / "cache"))
    from primal_attention.studies import summary as module

    monkeypatch.setattr(module.tuned, "COLLECTED_BEHAVIOUR", tmp / "rl_collected_behaviour.json")
    return module


def test_the_rl_baseline_of_the_tuned_average_needs_every_datasets_card(tmp_path, monkeypatch) -> None:
    summary = _summary(monkeypatch, tmp_path)
    monkeypatch.setattr(summary.tuned, "rl_linear_baseline", lambda c, compute=True: None)  # none stored yet
    scores = {d: float(i) for i, d in enumerate(summary.RL_DATASETS)}  # 0 .. 8, mean 4
    (tmp_path / "rl_collected_behaviour.json").write_text(json.dumps({d: scores[d] for d in summary.RL_DATASETS[:-1]}))
    assert summary._rl_collected_baseline() is None  # one dataset not collected again yet
    (tmp_path / "rl_collected_behaviour.json").write_text(json.dumps(scores))
    assert summary._rl_collected_baseline() == ("behaviour 4.0", 4.0)
    rl = next(s for s in summary.SYSTEMS if s.name.startswith("Offline RL"))
    assert rl.tuned_baseline() == ("behaviour 4.0", 4.0)
    linear = {f"rl/{d}": {"test_score": [scores[d] + 2.0]} for d in summary.RL_DATASETS[:-1]}
    monkeypatch.setattr(summary.tuned, "rl_linear_baseline", lambda c, compute=True: linear.get(c))
    # per dataset the better of the two: linear (+2) on 8 of 9, behaviour (8.0) on the last: (36 + 16) / 9
    assert summary._rl_collected_baseline() == (f"best of behaviour / linear per dataset {52 / 9:.1f}", 52 / 9)
    linear[f"rl/{summary.RL_DATASETS[-1]}"] = {"test_score": [10.0]}  # mean (1+2+...+7 + 2*8 + 10) / 9 = 6.0
    assert summary._rl_collected_baseline() == ("linear 6.0", 6.0)


def test_a_row_still_on_earlier_runs_says_how_far_its_tuned_parts_are(tmp_path, monkeypatch) -> None:
    summary = _summary(monkeypatch, tmp_path)
    rl = next(s for s in summary.SYSTEMS if s.name.startswith("Offline RL"))
    assert len(rl.parts) == 9
    state = dict.fromkeys(rl.parts, "not started")
    monkeypatch.setattr(summary.tuned, "progress", lambda c: state[c])
    assert summary._parts_note(rl) == ""
    state["rl/hopper-medium"] = "complete"
    state["rl/walker2d-medium"] = "in progress"
    assert summary._parts_note(rl) == ("; tuned comparison complete on 1 of 9 (hopper-medium), "
                                       "in progress on walker2d-medium, on rl.md")
    monkeypatch.setattr(summary.tuned, "rl_average", lambda: None)
    monkeypatch.setattr(summary, "_earlier", lambda system: {"Transformer": [1.0]})
    assert summary._values(rl) == ({"Transformer": [1.0]}, summary.EARLIER + summary._parts_note(rl), False)


def test_a_row_with_tuned_parts_in_progress_is_still_read_as_earlier_runs(tmp_path, monkeypatch) -> None:
    summary = _summary(monkeypatch, tmp_path)
    real = summary.tuned.progress
    monkeypatch.setattr(summary.tuned, "progress",  # the RL parts' state set here, not the stored sweeps'
                        lambda c: "in progress" if c == "rl/hopper-medium" else "not started" if c.startswith("rl/")
                        else real(c))
    monkeypatch.setattr(summary.tuned, "rl_average", lambda: None)
    monkeypatch.setattr(summary, "PAGE", tmp_path / "README.md")
    summary.write_page(False)
    page = (tmp_path / "README.md").read_text()
    row = next(line for line in page.splitlines() if line.startswith("| Offline RL"))
    assert f"{summary.EARLIER}; tuned comparison complete on 0 of 9, in progress on hopper-medium, on rl.md" in row
    assert "- Offline RL" not in page  # not listed among the changes of the tuned protocol


def test_a_longer_comparison_fills_its_row_once_complete_and_until_then_says_how_far_it_is(tmp_path, monkeypatch) -> None:
    summary = _summary(monkeypatch, tmp_path)
    image = next(s for s in summary.SYSTEMS if s.name == "LRA image")
    assert (image.tuned, image.longer) == ("lra/image", "lra/image-4x")
    state = {"lra/image": "complete", "lra/image-4x": "in progress"}
    monkeypatch.setattr(summary.tuned, "progress", lambda c: state[c])
    monkeypatch.setattr(summary.tuned, "remaining", lambda c: (4, 2.2, "its runs so far"))
    assert summary._comparison(image) == "lra/image"
    note = summary._longer_note(image)
    assert "4× the steps (`lra/image-4x`): in progress, 4 runs left, ≈ 2 CPU h" in note and "curves rising" in note
    state["lra/image-4x"] = "complete"
    assert summary._comparison(image) == "lra/image-4x"
    assert summary._longer_note(image) == "; 4× the steps (`lra/image-4x`)"
    listops = next(s for s in summary.SYSTEMS if s.name == "LRA listops")
    assert "first-operator lookup" in listops.longer_why
    assert not next(s for s in summary.SYSTEMS if s.name == "LRA text").longer


def test_a_tuned_row_flags_a_choice_at_the_grids_edge(tmp_path, monkeypatch) -> None:
    from primal_attention.studies.comparison import Entry, Outcome

    summary = _summary(monkeypatch, tmp_path)
    jv = next(s for s in summary.SYSTEMS if s.name == "UEA JapaneseVowels")
    grid = {"optim.lr": [1e-4, 1e-3, 1e-2]}

    def made(entry: Entry) -> Outcome:
        chosen = {"optim.lr": 1e-2 if entry.label == "PrimalFormer" else 1e-3}
        points = [{"point": {"optim.lr": v}, "val_acc": 0.5} for v in grid["optim.lr"]]
        return Outcome(entry, "acc", True, points, chosen, [0.9, 0.91], [0.9, 0.91], [0.9, 0.91], [[], []], grid)

    monkeypatch.setattr(summary, "outcome", made)
    values, source, is_tuned = summary._values(jv)
    assert is_tuned and values["PrimalFormer"] == [90.0, 91.0]
    assert "; chosen at the grid's edge: PrimalFormer (optim.lr 0.01, the largest)" in source
    assert "Transformer (" not in source.split("edge:")[1]


def test_where_no_verdict_is_given_the_difference_carries_no_direction(tmp_path, monkeypatch) -> None:
    summary = _summary(monkeypatch, tmp_path)
    ref, primal = [80.0, 80.5, 80.2], [86.8, 86.6, 87.0]
    values = {"Transformer": ref, "PrimalFormer": primal}
    cell, verdict = summary._verdict(primal, ref, 84.6, True, values, "parity")  # the Transformer under the linear 84.6
    assert verdict.startswith("no fair verdict") and cell.endswith("excludes 0") and "better" not in cell
    cell, verdict = summary._verdict(primal, ref, 90.0, True, values, "parity")  # nobody above the baseline
    assert verdict == "no signal on this budget" and cell.endswith("excludes 0")
    cell, verdict = summary._verdict(primal, ref, 50.0, True, values, "parity")  # a fair comparison
    assert cell.endswith("better") and verdict.startswith("not reproduced")

    # a row whose longer comparison has not finished is no verdict either, whatever the baselines say
    cell, verdict = summary._verdict(primal, ref, 50.0, True, values, "parity", "this schedule leaves curves rising")
    assert verdict == "no fair verdict: this schedule leaves curves rising" and cell.endswith("excludes 0")


def test_a_row_waiting_for_its_longer_comparison_gives_no_verdict_until_it_fills_the_row(tmp_path, monkeypatch) -> None:
    summary = _summary(monkeypatch, tmp_path)
    lm = next(s for s in summary.SYSTEMS if s.name == "Causal LM")
    state = {"lm/corpora": "complete", "lm/corpora-4x": "in progress"}
    monkeypatch.setattr(summary.tuned, "progress", lambda c: state[c])
    assert summary._pending(lm) == "this schedule leaves curves rising; `lm/corpora-4x` not finished"
    state["lm/corpora-4x"] = "complete"
    assert summary._pending(lm) is None
    assert summary._pending(next(s for s in summary.SYSTEMS if s.name == "LRA text")) is None  # none registered


def test_a_single_seed_below_the_trivial_baseline_is_flagged_too(tmp_path, monkeypatch) -> None:
    summary = _summary(monkeypatch, tmp_path)
    assert summary._cell([48.2], 1, 62.5, True).endswith("(n=1) ⚠ not above the trivial baseline")
    assert summary._cell([70.0], 1, 62.5, True) == "70.0 (n=1)"
    assert summary._cell([], 1, 62.5, True) == "– (n=0)"  # nothing measured: nothing to flag
    assert summary._cell([60.0], 2, 62.5, False) == "60.00 (n=1)"  # lower is better (perplexity)


def test_the_change_list_puts_the_tuned_value_of_the_earlier_schedule_between_when_a_longer_one_fills_the_row(
        tmp_path, monkeypatch) -> None:
    summary = _summary(monkeypatch, tmp_path)
    lm = next(s for s in summary.SYSTEMS if s.name == "Causal LM")
    values = {"lm/corpora": {"Transformer": [93.0, 94.0], "Primal.+Trans.": [93.0, 93.5]},
              "lm/corpora-4x": {"Transformer": [63.0, 64.0], "Primal.+Trans.": [64.0, 64.5]}}
    monkeypatch.setattr(summary, "_comparison_values", lambda system, c: (values[c], {}))
    monkeypatch.setattr(summary.tuned, "progress", lambda c: "complete")
    earlier = {"Transformer": [123.0, 124.0], "Primal.+Trans.": [123.5, 124.0]}
    lines = summary._changes(lm, values["lm/corpora-4x"], earlier, 119.5, 119.5)
    assert lines[0] == ("- Causal LM, Transformer: 123.50 ± 0.71 → 93.50 ± 0.71 (tuned, same schedule) → "
                        "63.50 ± 0.71 (4× the steps from every model's two best rates)")
    assert lines[1].startswith("- Causal LM, Primal.+Trans.: 123.75 ± 0.35 → 93.25 ± 0.35 (tuned, same schedule) → ")
    monkeypatch.setattr(summary.tuned, "progress", lambda c: "complete" if c == "lm/corpora" else "in progress")
    assert "same schedule" not in summary._changes(lm, values["lm/corpora"], earlier, 119.5, 119.5)[0]


def test_no_verdict_is_read_before_the_trivial_baselines_are_computed(tmp_path, monkeypatch) -> None:
    summary = _summary(monkeypatch, tmp_path)
    ref, primal = [80.0, 80.5, 80.2], [86.8, 86.6, 87.0]
    cell, verdict = summary._verdict(primal, ref, None, True, {"Transformer": ref, "PrimalFormer": primal}, "parity")
    assert verdict == "no verdict: trivial baselines not computed yet" and cell.endswith("excludes 0")


def test_the_rl_row_of_the_datasets_tuned_so_far_shows_only_while_some_but_not_all_are_complete(tmp_path, monkeypatch) -> None:
    summary = _summary(monkeypatch, tmp_path)
    row = next(s for s in summary.SYSTEMS if s.name == "Offline RL (tuned datasets so far)")
    assert row.only_tuned and not row.old
    done: set[str] = set()
    monkeypatch.setattr(summary.tuned, "progress", lambda c: "complete" if c.removeprefix("rl/") in done else "not started")
    averaged = []
    monkeypatch.setattr(summary.tuned, "rl_average", lambda ds=None: averaged.append(ds) or {"DT": [1.0, 2.0]})
    assert summary._rl_complete() == [] and row.tuned_values() is None  # nothing complete: no row
    done.update(summary.RL_DATASETS[:2])
    assert row.tuned_values() == {"Transformer": [1.0, 2.0]} and averaged[-1] == summary.RL_DATASETS[:2]
    monkeypatch.setattr(summary, "_rl_rising", lambda ds: f"; {len(ds)} still improving")
    assert row.tuned_note() == f"; the mean over {', '.join(summary.RL_DATASETS[:2])}, per seed; 2 still improving"
    (tmp_path / "rl_collected_behaviour.json").write_text(json.dumps({d: 10.0 for d in summary.RL_DATASETS[:2]}))
    linear = {f"rl/{d}": {"test_score": [12.0]} for d in summary.RL_DATASETS[:1]}
    monkeypatch.setattr(summary.tuned, "rl_linear_baseline", lambda c, compute=True: linear.get(c))
    assert row.tuned_baseline() == ("best of behaviour / linear per dataset 11.0", 11.0)  # (12 + 10) / 2
    linear[f"rl/{summary.RL_DATASETS[1]}"] = {"test_score": [14.0]}
    assert row.tuned_baseline() == ("linear 13.0", 13.0)
    done.update(summary.RL_DATASETS)  # all nine: the 9-dataset row has them, this one goes
    assert summary._rl_complete() == [] and row.tuned_values() is None
    monkeypatch.setattr(summary, "PAGE", tmp_path / "README.md")
    done.clear()
    summary.write_page(False)
    assert "Offline RL (tuned datasets so far)" not in (tmp_path / "README.md").read_text()


def test_the_rl_rows_source_counts_the_seeds_still_improving_per_dataset(tmp_path, monkeypatch) -> None:
    from primal_attention.studies.comparison import Entry

    summary = _summary(monkeypatch, tmp_path)
    counts = {("a", "DT"): (3, 3), ("a", "Primal.+DT"): (0, 3), ("b", "DT"): (1, 3), ("b", "Primal.+DT"): (0, 3)}
    monkeypatch.setattr(summary.tuned, "entries", lambda c: [Entry(m, Path(c), Path(c)) for m in ("DT", "Primal.+DT")])
    monkeypatch.setattr(summary, "outcome", lambda e: e)
    monkeypatch.setattr(summary, "still_improving", lambda e: counts[(str(e.config).removeprefix("rl/"), e.label)])
    assert summary._rl_rising(["a", "b"]) == ("; validation still improving at the schedule's end (seeds, per dataset): "
                                               "DT 3/3, 1/3; Primal.+DT 0/3, 0/3")  # named as rl.md and the rows name them
    counts.update({k: (0, 3) for k in counts})
    assert summary._rl_rising(["a", "b"]) == ""  # every curve flat: nothing to say


def test_the_rl_rows_name_the_decision_transformers_as_rl_md_does() -> None:
    from primal_attention.studies import summary

    rl = next(s for s in summary.SYSTEMS if s.name.startswith("Offline RL"))
    lm = next(s for s in summary.SYSTEMS if s.name == "Causal LM")
    assert [summary._shown(rl, m) for m in ("Transformer", "Primal.+Trans.")] == ["DT", "Primal.+DT"]
    assert [summary._shown(lm, m) for m in ("Transformer", "Primal.+Trans.")] == ["Transformer", "Primal.+Trans."]
