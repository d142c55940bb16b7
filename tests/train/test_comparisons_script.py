"""scripts/sweep_comparisons.py: what the results pages say is (not) rerun comes from the stored sweeps."""

from __future__ import annotations

import json
from pathlib import Path

from primal_attention.studies.comparison import BASELINES_VERSION
from primal_attention.train.sweep import point_name

ROOT = Path(__file__).resolve().parents[2]


def _script(monkeypatch, store: Path):
    from primal_attention.studies import sweeps as module

    monkeypatch.setattr(module, "STORE", store)
    monkeypatch.setattr(module, "WORK", store / "work")
    monkeypatch.setattr(module, "BASELINES", store / "baselines")  # nothing a test computes lands in docs/
    monkeypatch.setattr(module, "COLLECTED_BEHAVIOUR", store / "baselines" / "rl_collected_behaviour.json")
    monkeypatch.setattr(module, "COMPARISONS", {"uea/JapaneseVowels": ["uea/JapaneseVowels_transformer"]})
    return module


def _store(path: Path, val: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"name": "x", "best_val_acc": val, "test_acc": val, "wall_time_s": 1.0,
                                "selection": {"metric": "acc", "maximize": True}}))


def test_progress_and_the_not_rerun_note_follow_the_stored_sweeps(tmp_path, monkeypatch) -> None:
    tuned = _script(monkeypatch, tmp_path)
    names = {"JapaneseVowels": "uea/JapaneseVowels", "BasicMotions": "uea/BasicMotions"}
    assert tuned.progress("uea/JapaneseVowels") == "not started"
    note = " ".join(tuned.not_rerun_note(names))
    assert "JapaneseVowels (not started; 14 runs left, time per run unknown)" in note  # 4 grid points + 10 seeds
    assert "BasicMotions (not registered)" in note

    points = tmp_path / "JapaneseVowels_transformer" / "points"
    lrs = tuned.GRID["optim.lr"]
    _store(points / point_name({"optim.lr": lrs[0]}) / "seed_0.json", 0.5)
    assert tuned.progress("uea/JapaneseVowels") == "in progress"
    for i, lr in enumerate(lrs[1:]):
        _store(points / point_name({"optim.lr": lr}) / "seed_0.json", 0.7 - i / 100)
    best = point_name({"optim.lr": lrs[1]})  # inside the grid: no widening
    (tmp_path / "JapaneseVowels_transformer" / "points" / best / "seed_0.json").write_text(json.dumps(
        {"name": "x", "best_val_acc": 0.7, "test_acc": 0.7, "wall_time_s": 3600.0,
         "selection": {"metric": "acc", "maximize": True}}))  # the median of 1, 1, 1, 3600 s is 1 s
    assert tuned.remaining("uea/JapaneseVowels") == (10, 10 / 3600, "its runs so far")
    assert "JapaneseVowels (in progress; 10 runs left, ≈ 0.0 CPU h at the median time per run of its runs so far)" \
        in " ".join(tuned.not_rerun_note(names))
    _store(tmp_path / "JapaneseVowels_transformer" / "final" / best / "seed_0.json", 0.6)  # not a final seed: ignored
    assert tuned.seeds_for("uea/JapaneseVowels") == tuple(range(1, 11))  # more seeds where 3 cannot resolve it
    for seed in tuned.seeds_for("uea/JapaneseVowels"):
        assert tuned.progress("uea/JapaneseVowels") == "in progress"
        _store(tmp_path / "JapaneseVowels_transformer" / "final" / best / f"seed_{seed}.json", 0.6)
    assert tuned.progress("uea/JapaneseVowels") == "complete"
    assert "JapaneseVowels (" not in " ".join(tuned.not_rerun_note(names))
    assert tuned.not_rerun_note({"JapaneseVowels": "uea/JapaneseVowels"}) == []


def test_rl_comparisons_wait_for_their_data_and_average_only_when_complete(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PRIMAL_ATTENTION_CACHE", str(tmp_path / "cache"))
    tuned = _script(monkeypatch, tmp_path)
    monkeypatch.setattr(tuned, "RL_DATASETS", ["hopper-medium", "walker2d-medium"])
    monkeypatch.setattr(tuned, "COMPARISONS", {f"rl/{d}": [f"rl/{d}_dt", f"rl/{d}_primal+"] for d in tuned.RL_DATASETS})
    assert "collect-rl hopper" in tuned.waiting_for("rl/hopper-medium")
    (tmp_path / "cache" / "rl" / "hopper-medium-seed0.npz").write_bytes(b"")
    assert tuned.waiting_for("rl/hopper-medium") is None and tuned.waiting_for("lra/listops") is None
    assert [e.label for e in tuned.entries("rl/hopper-medium")] == ["DT", "Primal.+DT"]

    def finished(stem: str, scores: list[float]) -> None:
        store = tmp_path / (stem + tuned.STORE_SUFFIX[f"rl/{stem.rsplit('_', 1)[0]}"])
        point = {"optim.lr": tuned.GRID["optim.lr"][0]}
        (store).mkdir(parents=True, exist_ok=True)
        (store / "sweep.json").write_text(json.dumps({"selection": {"metric": "val_score", "maximize": True},
                                                      "points": [], "chosen": point, "grid": tuned.GRID,
                                                      "final_seeds": list(tuned.FINAL_SEEDS)}))
        for seed, score in zip(tuned.FINAL_SEEDS, scores):
            path = store / "final" / point_name(point) / f"seed_{seed}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"test_score": score}))

    finished("hopper-medium_dt", [10.0, 20.0, 30.0])
    finished("hopper-medium_primal+", [12.0, 22.0, 32.0])
    finished("walker2d-medium_dt", [30.0, 40.0, 50.0])
    assert tuned.rl_average() is None  # walker2d-medium's Primal.+DT is missing
    finished("walker2d-medium_primal+", [30.0, 40.0])
    assert tuned.rl_average() is None  # one final seed short
    finished("walker2d-medium_primal+", [30.0, 40.0, 52.0])
    assert tuned.rl_average() == {"DT": [20.0, 30.0, 40.0], "Primal.+DT": [21.0, 31.0, 42.0]}


def test_a_choice_at_an_edge_widens_the_grid_of_every_model_until_it_is_interior(tmp_path, monkeypatch) -> None:
    tuned = _script(monkeypatch, tmp_path)
    monkeypatch.setattr(tuned, "COMPARISONS", {"uea/JapaneseVowels": ["uea/JapaneseVowels_transformer",
                                                                      "uea/JapaneseVowels_primal+"]})
    assert [tuned.beyond(v, up=True) for v in (1e-4, 3e-4, 3e-3)] == [3e-4, 1e-3, 1e-2]
    assert [tuned.beyond(v, up=False) for v in (1e-4, 3e-4, 1e-3)] == [3e-5, 1e-4, 3e-4]
    lrs = tuned.GRID["optim.lr"]
    for i, lr in enumerate(lrs):  # the Transformer prefers the middle, Primal.+ the largest rate
        _store(tmp_path / "JapaneseVowels_transformer" / "points" / point_name({"optim.lr": lr}) / "seed_0.json",
               [0.5, 0.9, 0.8, 0.7][i])
        if lr != lrs[-1]:
            _store(tmp_path / "JapaneseVowels_primal+" / "points" / point_name({"optim.lr": lr}) / "seed_0.json", 0.5 + i / 10)
    assert tuned.grid_for("uea/JapaneseVowels") == tuned.GRID  # one model's grid is not complete yet
    _store(tmp_path / "JapaneseVowels_primal+" / "points" / point_name({"optim.lr": lrs[-1]}) / "seed_0.json", 0.95)
    wide = tuned.grid_for("uea/JapaneseVowels")
    assert wide == {"optim.lr": [*lrs, 1e-2]}  # for both models, not only the one at the edge
    assert [s.grid for s in tuned.sweeps_of("uea/JapaneseVowels")] == [wide, wide]
    assert tuned.progress("uea/JapaneseVowels") == "in progress"  # the new point is not trained
    # a choice at the widened edge widens again, once the new point is trained for every model
    _store(tmp_path / "JapaneseVowels_primal+" / "points" / point_name({"optim.lr": 1e-2}) / "seed_0.json", 0.99)
    assert tuned.grid_for("uea/JapaneseVowels") == wide  # the Transformer's 1e-2 is not trained yet
    _store(tmp_path / "JapaneseVowels_transformer" / "points" / point_name({"optim.lr": 1e-2}) / "seed_0.json", 0.6)
    wider = tuned.grid_for("uea/JapaneseVowels")
    assert wider == {"optim.lr": [*lrs, 1e-2, 3e-2]}
    for model in ("transformer", "primal+"):  # 3e-2 worse for both: the choice 1e-2 is interior, no more widening
        _store(tmp_path / f"JapaneseVowels_{model}" / "points" / point_name({"optim.lr": 3e-2}) / "seed_0.json", 0.3)
    assert tuned.grid_for("uea/JapaneseVowels") == wider
    assert tuned.sweeps_of("uea/JapaneseVowels")[1].chosen().point == {"optim.lr": 1e-2}


def test_an_rl_baseline_comes_from_the_card_of_the_data_in_use_and_is_kept(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PRIMAL_ATTENTION_CACHE", str(tmp_path / "cache"))
    tuned = _script(monkeypatch, tmp_path)
    monkeypatch.setattr(tuned, "COLLECTED_BEHAVIOUR", tmp_path / "baselines" / "rl_collected_behaviour.json")
    assert tuned.baselines("rl/hopper-medium") == {}  # no card, nothing recorded: no baseline rather than a stale one
    card = tmp_path / "cache" / "rl" / "hopper-seed0-card.json"
    card.parent.mkdir(parents=True, exist_ok=True)
    card.write_text(json.dumps({"datasets": {"medium": {"score_mean": 64.9}, "medium-replay": {"score_mean": 9.0}}}))
    assert tuned.baselines("rl/hopper-medium")["behaviour"]["test_score"] == [64.9]
    assert tuned.baselines("rl/hopper-medium-replay")["behaviour"]["test_score"] == [9.0]
    card.unlink()  # a machine without the data keeps what the card said
    assert tuned.baselines("rl/hopper-medium")["behaviour"]["test_score"] == [64.9]
    assert json.loads(tuned.COLLECTED_BEHAVIOUR.read_text()) == {"hopper-medium": 64.9, "hopper-medium-replay": 9.0}


def test_rl_old_vs_new_rows_read_the_first_round_with_and_without_its_reused_sweep_run(tmp_path, monkeypatch) -> None:
    from primal_attention.studies import rl as page

    monkeypatch.setenv("PRIMAL_ATTENTION_CACHE", str(tmp_path / "cache"))  # no collection card on this machine
    tuned = _script(monkeypatch, tmp_path)
    monkeypatch.setattr(page, "FIRST_ROUND_BEHAVIOUR", tmp_path / "behaviour.json")
    (tmp_path / "behaviour.json").write_text(json.dumps({"hopper-medium": 37.0}))
    monkeypatch.setattr(tuned, "RL_DATASETS", ["hopper-medium"])
    monkeypatch.setattr(tuned, "COMPARISONS", {"rl/hopper-medium": ["rl/hopper-medium_dt", "rl/hopper-medium_primal+"]})
    assert page.round_comparison_lines() == []  # no first round stored
    first = tmp_path / "hopper-medium_dt"  # the first round's store: no suffix, 5 episodes
    for path, score in [(first / "points" / "optim.lr=0.01" / "seed_0.json", 60.0),
                        (first / "final" / "optim.lr=0.01" / "seed_1.json", 30.0),
                        (first / "final" / "optim.lr=0.01" / "seed_2.json", 31.0)]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"test_score": score, "val_examples": 5}))
    assert page.first_round("hopper-medium", "dt") == {"chosen": "0.01", "episodes": 5, "sweep_run": 60.0, "edge": False,
                                                       "fresh": {1: 30.0, 2: 31.0}}
    assert page.first_round("hopper-medium", "primal+") is None
    rows = [line for line in page.round_comparison_lines() if line.startswith("| hopper-medium")]
    assert len(rows) == 1
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[2:7] == ["37.0", "0.01", "60.0", "40.3 ± 17.0 (n=3)", "30.5 ± 0.7 (n=2)"] and cells[7:] == ["–", "–"]
    (first / "points" / "optim.lr=0.03").mkdir()  # a point never run does not count
    for lr in ("0.001", "0.003"):  # the first round's grid below 0.01: its choice was the largest rate
        (first / "points" / f"optim.lr={lr}").mkdir()
        (first / "points" / f"optim.lr={lr}" / "seed_0.json").write_text(json.dumps({"test_score": 1.0}))
    assert page.first_round("hopper-medium", "dt")["edge"]
    assert "| 0.01 (at the grid's edge) |" in "".join(page.round_comparison_lines())
    assert tuned.entries("rl/hopper-medium")[0].store == tmp_path / f"hopper-medium_dt_ep{tuned.RL_EVAL_EPISODES}"
    # whether the rounds shared their data is read from the two collections' behaviour scores
    assert "Not every dataset's second-round collection is recorded yet" in "".join(page.round_comparison_lines())
    tuned.COLLECTED_BEHAVIOUR.parent.mkdir(parents=True, exist_ok=True)
    tuned.COLLECTED_BEHAVIOUR.write_text(json.dumps({"hopper-medium": 37.0}))
    assert "Both rounds trained on the same collection here" in "".join(page.round_comparison_lines())
    tuned.COLLECTED_BEHAVIOUR.write_text(json.dumps({"hopper-medium": 36.5}))
    assert "The rounds did not all train on the same collection" in "".join(page.round_comparison_lines())


def test_cached_baselines_of_other_data_are_stale_and_unknown_data_reads_the_cache(tmp_path, monkeypatch) -> None:
    import pytest

    from primal_attention.studies.comparison import baselines_for
    from primal_attention.train import trivial

    calls = []
    monkeypatch.setattr(trivial, "trivial_baselines", lambda cfg, seed: calls.append(seed) or
                        {"linear": {"what": "w", "test_score": 10.0 + len(calls)}})
    config = ROOT / "configs" / "rl" / "hopper-medium_dt.yaml"
    cache = tmp_path / "rl_hopper-medium.json"
    first = baselines_for(config, (1,), cache, data_key={"episodes": 10})
    assert first["linear"]["test_score"] == [11.0] and calls == [1]
    assert baselines_for(config, (1,), cache, data_key={"episodes": 10}) == first and calls == [1]  # cached
    assert baselines_for(config, (1,), cache, compute=False) == first  # data unknown here: the record stands
    with pytest.raises(LookupError):  # re-collected data: the record is stale and not recomputed without compute
        baselines_for(config, (1,), cache, compute=False, data_key={"episodes": 12})
    assert baselines_for(config, (1,), cache, data_key={"episodes": 12})["linear"]["test_score"] == [12.0]


def test_final_seeds_wait_until_a_widened_grid_stops_widening(tmp_path, monkeypatch) -> None:
    tuned = _script(monkeypatch, tmp_path)
    grids = [[1e-4, 3e-3], [1e-4, 3e-3, 1e-2], [1e-4, 3e-3, 1e-2, 3e-2]]  # each pass's grid_for: widened twice
    ran: list[tuple[str, float]] = []

    class FakeSweep:
        def __init__(self, lrs: list[float]) -> None:
            self.grid = {"optim.lr": lrs}

        def step(self, *, finals: bool = True) -> bool:
            ran.append(("grid" if not finals else "finals", self.grid["optim.lr"][-1]))
            return True

    calls = iter(grids + [grids[-1]] * 3)
    monkeypatch.setattr(tuned, "sweeps_of", lambda comparison, deadline=None: [FakeSweep(next(calls))])
    group, complete = tuned.settled_grids("uea/JapaneseVowels")
    assert all(complete) and group[0].grid == {"optim.lr": grids[-1]}
    assert ran == [("grid", 3e-3), ("grid", 1e-2), ("grid", 3e-2)]  # no finals on the grids that widened


def test_a_fixed_grid_is_widened_like_any_grid_when_a_choice_lies_at_its_edge(tmp_path, monkeypatch) -> None:
    tuned = _script(monkeypatch, tmp_path)
    models = ["uea/JapaneseVowels_transformer", "uea/JapaneseVowels_primalformer"]
    monkeypatch.setattr(tuned, "COMPARISONS", {"uea/JapaneseVowels": models, "uea/long": models})
    monkeypatch.setattr(tuned, "START_GRIDS", {"uea/long": {"optim.lr": [3e-3, 1e-2]}})
    monkeypatch.setattr(tuned, "LONGER", {"uea/long": ("uea/JapaneseVowels", 2.0)})
    monkeypatch.setattr(tuned, "STORE_SUFFIX", {"uea/long": "_long"})
    monkeypatch.setattr(tuned, "OVERRIDES", {})
    monkeypatch.setattr(tuned, "baselines", lambda comparison, **kw: {})  # the page's grid line is what is tested
    assert tuned.grid_for("uea/long") == {"optim.lr": [3e-3, 1e-2]}
    # the Transformer picks the larger rate, the PrimalFormer the smaller: both edges, so both sides widen
    for stem, best in (("JapaneseVowels_transformer_long", 1e-2), ("JapaneseVowels_primalformer_long", 3e-3)):
        for lr in (3e-3, 1e-2):
            _store(tmp_path / stem / "points" / point_name({"optim.lr": lr}) / "seed_0.json", 0.9 if lr == best else 0.7)
    assert tuned.grid_for("uea/long") == {"optim.lr": [1e-3, 3e-3, 1e-2, 3e-2]}
    assert "`optim.lr` ∈ {0.003, 0.01}, widened for every model by 0.001, 0.03" in tuned.section("uea/long")[0]
    # once the new rates are run and lose, every choice is interior and the grid stops there
    for stem in ("JapaneseVowels_transformer_long", "JapaneseVowels_primalformer_long"):
        for lr in (1e-3, 3e-2):
            _store(tmp_path / stem / "points" / point_name({"optim.lr": lr}) / "seed_0.json", 0.5)
    assert tuned.grid_for("uea/long") == {"optim.lr": [1e-3, 3e-3, 1e-2, 3e-2]}


def test_a_table_of_earlier_runs_lists_the_stored_trivial_baselines_best_first(tmp_path, monkeypatch) -> None:
    tuned = _script(monkeypatch, tmp_path)
    monkeypatch.setattr(tuned, "BASELINES", tmp_path / "baselines")
    assert tuned.trivial_line("uea/JapaneseVowels") == ""  # nothing stored, nothing computed
    (tmp_path / "baselines").mkdir()
    rows = {"majority": {"what": "m", "test_acc": [0.084] * 10}, "linear": {"what": "l", "test_acc": [0.969] * 10}}
    (tmp_path / "baselines" / "uea_JapaneseVowels.json").write_text(json.dumps(
        {"seeds": list(tuned.seeds_for("uea/JapaneseVowels")), "overrides": tuned.OVERRIDES["uea/JapaneseVowels"],
         "version": BASELINES_VERSION, "baselines": rows}))
    assert tuned.trivial_line("uea/JapaneseVowels") == "linear 96.9 · majority 8.4"


def test_a_short_comparison_gives_no_verdict_until_its_longer_one_finishes(tmp_path, monkeypatch) -> None:
    tuned = _script(monkeypatch, tmp_path)
    monkeypatch.setattr(tuned, "COMPARISONS", {"uea/JapaneseVowels": ["uea/JapaneseVowels_transformer"],
                                               "uea/long": ["uea/JapaneseVowels_transformer"]})
    monkeypatch.setattr(tuned, "LONGER", {"uea/long": ("uea/JapaneseVowels", 2.0)})
    monkeypatch.setattr(tuned, "NEEDED_BECAUSE", {"uea/long": "curves rise"})
    state = {"uea/long": "in progress"}
    monkeypatch.setattr(tuned, "progress", lambda c: state.get(c, "complete"))
    assert tuned.pending_longer("uea/JapaneseVowels") == "curves rise; `uea/long` not finished"
    assert tuned.pending_longer("uea/long") is None  # nothing longer than it
    state["uea/long"] = "complete"
    assert tuned.pending_longer("uea/JapaneseVowels") is None


def test_an_estimate_from_earlier_runs_scales_them_to_the_comparisons_schedule(tmp_path, monkeypatch) -> None:
    tuned = _script(monkeypatch, tmp_path)
    monkeypatch.setattr(tuned, "OVERRIDES", {"uea/JapaneseVowels": ["train.epochs=6"], "lra/x": ["train.steps=4000"]})
    assert tuned.schedule_scale("uea/JapaneseVowels", {"epochs": 3, "steps": 300}) == 2.0
    assert tuned.schedule_scale("lra/x", {"steps": 1000}) == 4.0
    assert tuned.schedule_scale("uea/BasicMotions", {"epochs": 3}) == 1.0  # no override
    monkeypatch.setattr(tuned, "STORE", tmp_path / "store")
    earlier = tmp_path / "uea_runs" / "JapaneseVowels_transformer" / "holdout"
    earlier.mkdir(parents=True)
    (earlier / "seed_0.json").write_text(json.dumps({"wall_time_s": 1800.0, "epochs": 3}))
    runs, hours, source = tuned.remaining("uea/JapaneseVowels")
    assert runs == 14 and hours == 14 * 3600 / 3600 and "scaled to this schedule's length" in source


def test_the_not_rerun_note_says_what_an_rl_comparison_waits_for(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PRIMAL_ATTENTION_CACHE", str(tmp_path / "cache"))
    tuned = _script(monkeypatch, tmp_path)
    monkeypatch.setattr(tuned, "COMPARISONS", {"rl/walker2d-medium": ["rl/walker2d-medium_dt"]})
    note = " ".join(tuned.not_rerun_note({"walker2d-medium": "rl/walker2d-medium"}))
    assert "first: dataset walker2d-medium not collected (primal data collect-rl walker2d))" in note


def test_an_estimate_counts_the_widening_an_edge_choice_makes_certain(tmp_path, monkeypatch) -> None:
    tuned = _script(monkeypatch, tmp_path)
    models = ["uea/JapaneseVowels_transformer", "uea/JapaneseVowels_primalformer"]
    monkeypatch.setattr(tuned, "COMPARISONS", {"uea/JapaneseVowels": models})
    monkeypatch.setattr(tuned, "OVERRIDES", {})
    finals = len(tuned.seeds_for("uea/JapaneseVowels"))
    grid = tuned.GRID["optim.lr"]
    assert tuned.certain_widening("uea/JapaneseVowels") == 0 and tuned.remaining("uea/JapaneseVowels")[0] == 2 * (4 + finals)
    monkeypatch.setattr(tuned, "START_GRIDS", {"uea/JapaneseVowels": {"optim.lr": [1e-3, 3e-3]}})
    assert tuned.certain_widening("uea/JapaneseVowels") == 1  # a two-rate grid widens whatever is chosen
    monkeypatch.setattr(tuned, "START_GRIDS", {})
    # the Transformer's grid is done and chose its largest rate: every model's grid will gain one rate
    for lr in grid:
        _store(tmp_path / "JapaneseVowels_transformer" / "points" / point_name({"optim.lr": lr}) / "seed_0.json",
               0.9 if lr == grid[-1] else 0.7)
    assert tuned.certain_widening("uea/JapaneseVowels") == 1
    assert tuned.remaining("uea/JapaneseVowels")[0] == finals + (4 + finals) + 2
    note = " ".join(tuned.not_rerun_note({"JapaneseVowels": "uea/JapaneseVowels"}))
    assert f"{finals + (4 + finals) + 2} runs left" in note and "counting the 1 rate per model that a choice at" in note
    # once every model's grid is done the grid itself is widened, and the new rates are counted as points left
    for lr in grid:
        _store(tmp_path / "JapaneseVowels_primalformer" / "points" / point_name({"optim.lr": lr}) / "seed_0.json",
               0.9 if lr == grid[1] else 0.7)  # an interior choice: only the Transformer's edge widens
    assert tuned.certain_widening("uea/JapaneseVowels") == 0
    assert tuned.remaining("uea/JapaneseVowels")[0] == 2 * (1 + finals)
    # a side already widened MAX_WIDENINGS times gains nothing more, so the estimate counts nothing for it
    monkeypatch.setattr(tuned, "MAX_WIDENINGS", 1)
    top = tuned.grid_for("uea/JapaneseVowels")["optim.lr"][-1]
    _store(tmp_path / "JapaneseVowels_transformer" / "points" / point_name({"optim.lr": top}) / "seed_0.json", 0.95)
    assert tuned.grid_for("uea/JapaneseVowels")["optim.lr"][-1] == top  # the cap holds the grid
    assert tuned.certain_widening("uea/JapaneseVowels") == 0


def test_an_estimate_from_earlier_runs_takes_the_slowdown_of_the_familys_other_comparisons(tmp_path, monkeypatch) -> None:
    tuned = _script(monkeypatch, tmp_path)
    monkeypatch.setattr(tuned, "COMPARISONS", {"uea/JapaneseVowels": ["uea/JapaneseVowels_transformer"],
                                               "uea/BasicMotions": ["uea/BasicMotions_transformer"],
                                               "uea/FSDD": ["uea/FSDD_transformer"], "vision/fmnist": ["vision/fmnist_vit"]})
    monkeypatch.setattr(tuned, "OVERRIDES", {"uea/JapaneseVowels": ["train.epochs=3"], "uea/BasicMotions": ["train.epochs=3"],
                                             "uea/FSDD": ["train.epochs=2"]})
    monkeypatch.setattr(tuned, "STORE", tmp_path / "store")
    for family, config, wall in (("uea", "JapaneseVowels_transformer", 50.0), ("uea", "BasicMotions_transformer", 100.0),
                                 ("uea", "FSDD_transformer", 10.0), ("vision", "fmnist_vit", 30.0)):
        (tmp_path / f"{family}_runs" / config / "holdout").mkdir(parents=True)
        (tmp_path / f"{family}_runs" / config / "holdout" / "seed_0.json").write_text(
            json.dumps({"wall_time_s": wall, "epochs": 3 if config[0] != "F" else 2}))
    point = tmp_path / "store" / "JapaneseVowels_transformer" / "points" / point_name({"optim.lr": 1e-4}) / "seed_0.json"
    _store(point, 0.9)
    point.write_text(json.dumps({**json.loads(point.read_text()), "wall_time_s": 200.0}))  # 4x its earlier run
    runs, hours, source = tuned.remaining("uea/BasicMotions")
    assert hours == runs * 400.0 / 3600 and "times 4.00 (the median ratio of the runs of uea/JapaneseVowels" in source
    runs, hours, source = tuned.remaining("uea/FSDD")  # its own schedule, the same slowdown
    assert hours == runs * 40.0 / 3600 and "times 4.00" in source
    runs, hours, source = tuned.remaining("vision/fmnist")  # another family: its earlier runs as they are
    assert hours == runs * 30.0 / 3600 and "ratio" not in source


def test_an_estimate_takes_each_models_own_time_per_run(tmp_path, monkeypatch) -> None:
    tuned = _script(monkeypatch, tmp_path)
    models = ["uea/JapaneseVowels_transformer", "uea/JapaneseVowels_primalformer", "uea/JapaneseVowels_primal+"]
    monkeypatch.setattr(tuned, "COMPARISONS", {"uea/JapaneseVowels": models})
    monkeypatch.setattr(tuned, "OVERRIDES", {})
    finals = len(tuned.seeds_for("uea/JapaneseVowels"))
    for stem, wall in (("JapaneseVowels_transformer", 1000.0), ("JapaneseVowels_primalformer", 100.0)):
        point = tmp_path / stem / "points" / point_name({"optim.lr": 1e-4}) / "seed_0.json"
        _store(point, 0.9)
        point.write_text(json.dumps({**json.loads(point.read_text()), "wall_time_s": wall}))
    runs, hours, source = tuned.remaining("uea/JapaneseVowels")
    left = 3 + finals  # each model: 3 grid points and the final seeds; the third model runs at the others' median
    assert runs == 3 * left + 1 and source == "its runs so far"
    assert hours == (left * 1000.0 + left * 100.0 + (left + 1) * 550.0) / 3600

def test_a_worker_freed_by_a_run_goes_back_to_the_first_comparison_with_work(tmp_path, monkeypatch) -> None:
    tuned = _script(monkeypatch, tmp_path)
    # "a" (first in priority) has two cells, the second held by another worker until a's next pass; "b" has two.
    # A step trains every cell of its comparison that is free at the time, as Sweep.step does.
    cells = {"a": ["a1", "a2"], "b": ["b1", "b2"]}
    calls = {"a": 0, "b": 0}
    trained: list[str] = []

    class Fake:
        def __init__(self, name: str) -> None:
            self.name, self.held = name, 0

        def step(self, finals: bool = True) -> bool:
            calls[self.name] += 1
            for cell in cells[self.name]:
                held = cell == "a2" and calls["a"] == 1
                if cell not in trained and not held:
                    trained.append(cell)
            return all(c in trained for c in cells[self.name])

    monkeypatch.setattr(tuned, "settled_grids", lambda name, deadline=None: ([Fake(name)], [True]))
    monkeypatch.setattr(tuned, "stored_runs", lambda name: sum(c.startswith(name) for c in trained))
    sleeps: list[float] = []
    monkeypatch.setattr(tuned.time, "sleep", sleeps.append)
    tuned.work_through(["a", "b"], poll=60.0)
    # a1 stored, a2 held: back to "a" (not on to "b"), where a2 is free by then; no waiting, there was work
    assert trained == ["a1", "a2", "b1", "b2"] and sleeps == []


def test_a_worker_with_a_deadline_starts_only_runs_that_end_by_it_then_stops(tmp_path, monkeypatch) -> None:
    tuned = _script(monkeypatch, tmp_path)
    # "long" (first in priority) takes 2 h a run, "short" 10 min; one hour is left: only "short" is trained.
    # "short2" is held by another worker on the first pass: the worker waits for it rather than stop.
    hours = {"long": 2.0, "short": 1 / 6}
    trained: list[str] = []
    passes = {"short": 0}
    now = 1_000_000.0
    monkeypatch.setattr(tuned.time, "time", lambda: now)

    class Fake:
        def __init__(self, name: str, deadline: float | None) -> None:
            self.name, self.held = name, 0
            self.start_by = None if deadline is None else deadline - 3600 * hours[name]

        def step(self, finals: bool = True) -> bool:
            passes[self.name] = passes.get(self.name, 0) + 1
            for cell in (f"{self.name}1", f"{self.name}2"):
                if cell == "short2" and passes["short"] == 1:
                    self.held += 1
                elif cell not in trained and (self.start_by is None or now <= self.start_by):
                    trained.append(cell)
            return all(c in trained for c in (f"{self.name}1", f"{self.name}2"))

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        assert len(sleeps) < 5, "the worker waits forever"

    monkeypatch.setattr(tuned, "settled_grids", lambda name, deadline=None: ([Fake(name, deadline)], [True]))
    monkeypatch.setattr(tuned, "stored_runs", lambda name: sum(c.startswith(name) for c in trained))
    sleeps: list[float] = []
    monkeypatch.setattr(tuned.time, "sleep", sleep)
    tuned.work_through(["long", "short"], poll=60.0, deadline=now + 3600)
    assert trained == ["short1", "short2"]  # then it stops rather than wait for "long" ...
    assert sleeps == []  # ... and short1's pass went straight back to the top, where short2 was free by then
    passes["short"] = 0
    trained.remove("short2")
    tuned.work_through(["long", "short"], poll=60.0, deadline=now + 3600)  # short2 held, nothing stored: wait once
    assert trained == ["short1", "short2"] and sleeps == [60.0]
    tuned.work_through(["long", "short"], poll=60.0)  # no deadline: "long" too
    assert trained[2:] == ["long1", "long2"]


def test_a_deadline_is_set_by_each_models_expected_run_time(tmp_path, monkeypatch) -> None:
    tuned = _script(monkeypatch, tmp_path)
    models = ["uea/JapaneseVowels_transformer", "uea/JapaneseVowels_primalformer", "uea/JapaneseVowels_primal+"]
    monkeypatch.setattr(tuned, "COMPARISONS", {"uea/JapaneseVowels": models})
    monkeypatch.setattr(tuned, "OVERRIDES", {})
    for stem, walls in (("JapaneseVowels_transformer", (100.0, 300.0, 400.0)), ("JapaneseVowels_primalformer", (50.0,))):
        for lr, wall in zip(tuned.GRID["optim.lr"], walls):
            point = tmp_path / stem / "points" / point_name({"optim.lr": lr}) / "seed_0.json"
            _store(point, 0.9)
            point.write_text(json.dumps({**json.loads(point.read_text()), "wall_time_s": wall}))
    # each model's median; a model without runs takes the median over the others' runs (50, 100, 300, 400)
    assert tuned.expected_run_s("uea/JapaneseVowels") == (dict(zip(models, (300.0, 50.0, 200.0))), "its runs so far")
    assert [s.start_by for s in tuned.sweeps_of("uea/JapaneseVowels", deadline=1000.0)] == [700.0, 950.0, 800.0]
    assert all(s.start_by is None for s in tuned.sweeps_of("uea/JapaneseVowels"))
    # a model without any time (no runs anywhere) is not started under a deadline
    monkeypatch.setattr(tuned, "model_times", lambda c: ({m: [] for m in models}, "nothing"))
    assert [s.start_by for s in tuned.sweeps_of("uea/JapaneseVowels", deadline=1000.0)] == [float("-inf")] * 3


def test_the_script_refuses_a_deadline_that_is_not_ahead() -> None:
    import subprocess
    import sys

    for hours, message in (("0", "--hours must be a positive, finite number, got 0"), ("inf", "finite number, got inf")):
        done = subprocess.run([sys.executable, str(ROOT / "scripts" / "sweep_comparisons.py"), "--hours", hours],
                              capture_output=True, text=True)
        assert done.returncode == 2 and message in done.stderr
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "sweep_comparisons.py"), "--hours", "1", "--list"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "--hours applies to training runs, not to --list or --baselines" in done.stderr


def test_a_longer_schedules_estimate_takes_the_slowdown_other_longer_schedules_showed(tmp_path, monkeypatch) -> None:
    tuned = _script(monkeypatch, tmp_path)
    models = ["uea/JapaneseVowels_transformer"]
    monkeypatch.setattr(tuned, "COMPARISONS", {"uea/JapaneseVowels": models, "uea/a-2x": models, "uea/b-2x": models})
    monkeypatch.setattr(tuned, "LONGER", {"uea/a-2x": ("uea/JapaneseVowels", 2.0), "uea/b-2x": ("uea/JapaneseVowels", 2.0)})
    monkeypatch.setattr(tuned, "STORE_SUFFIX", {"uea/a-2x": "_a", "uea/b-2x": "_b"})
    monkeypatch.setattr(tuned, "OVERRIDES", {})
    for stem, wall in (("JapaneseVowels_transformer", 100.0), ("JapaneseVowels_transformer_a", 300.0)):
        point = tmp_path / stem / "points" / point_name({"optim.lr": 1e-4}) / "seed_0.json"
        _store(point, 0.9)
        point.write_text(json.dumps({**json.loads(point.read_text()), "wall_time_s": wall}))
    # a-2x's run took 300 s where 2 x 100 s was expected: b-2x's estimate is 2 x 100 s x 1.5
    assert tuned.longer_slowdown("uea/b-2x") == (1.5, ["uea/a-2x"])
    expected, source = tuned.expected_run_s("uea/b-2x")
    assert expected == {models[0]: 300.0} and "times 2 (this schedule's length), times 1.50" in source
    assert tuned.longer_slowdown("uea/a-2x") == (1.5, ["uea/a-2x"])  # its own run (b-2x has none)
    monkeypatch.setattr(tuned, "LONGER", {"uea/b-2x": ("uea/JapaneseVowels", 2.0)})
    assert tuned.longer_slowdown("uea/b-2x") is None  # no longer comparison has runs


def test_a_longer_schedule_with_runs_of_its_own_takes_its_own_models_slowdown(tmp_path, monkeypatch) -> None:
    """Once one model of a longer comparison has runs, the others' estimates scale by that model's ratio (the same
    schedule and data), not by the other longer comparisons'."""
    tuned = _script(monkeypatch, tmp_path)
    models = ["uea/JapaneseVowels_transformer", "uea/JapaneseVowels_primalformer"]
    monkeypatch.setattr(tuned, "COMPARISONS", {"uea/JapaneseVowels": models, "uea/a-2x": models, "uea/b-2x": models})
    monkeypatch.setattr(tuned, "LONGER", {"uea/a-2x": ("uea/JapaneseVowels", 2.0), "uea/b-2x": ("uea/JapaneseVowels", 2.0)})
    monkeypatch.setattr(tuned, "STORE_SUFFIX", {"uea/a-2x": "_a", "uea/b-2x": "_b"})
    monkeypatch.setattr(tuned, "OVERRIDES", {})
    for stem, wall in (("JapaneseVowels_transformer", 100.0), ("JapaneseVowels_primalformer", 50.0),
                       ("JapaneseVowels_transformer_a", 300.0), ("JapaneseVowels_transformer_b", 160.0)):
        point = tmp_path / stem / "points" / point_name({"optim.lr": 1e-4}) / "seed_0.json"
        _store(point, 0.9)
        point.write_text(json.dumps({**json.loads(point.read_text()), "wall_time_s": wall}))
    assert tuned.longer_slowdown("uea/b-2x") == (0.8, ["uea/b-2x"])  # 160 s where 2 x 100 s was expected
    assert tuned.longer_slowdown("uea/a-2x") == (1.5, ["uea/a-2x"])
    expected, source = tuned.expected_run_s("uea/b-2x")
    assert expected == {models[0]: 160.0, models[1]: 80.0}  # the PrimalFormer: 2 x 50 s x 0.8
    assert "times 0.80 (the median ratio, per model, of the runs of uea/b-2x" in source


def test_the_trivial_note_names_the_seeds_that_chose_the_baselines(tmp_path, monkeypatch) -> None:
    tuned = _script(monkeypatch, tmp_path)
    assert "validation splits of seeds 1, 2, 3, 4, 5, 6, 7, 8, 9, 10," in tuned.trivial_note("uea/JapaneseVowels")
    assert "validation splits of seeds 1, 2, 3," in tuned.trivial_note("lra/image", "lra/text")
