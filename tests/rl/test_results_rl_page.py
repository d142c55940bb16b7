"""scripts/results_rl.py: a collection card gives its command, and the page keeps the record of an
environment whose card this machine lacks."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _script(monkeypatch, page: Path):
    from primal_attention.studies import rl as module

    monkeypatch.setattr(module, "PAGE", page)
    return module


def test_the_command_names_only_the_options_that_differ_from_the_defaults(tmp_path, monkeypatch) -> None:
    page = _script(monkeypatch, tmp_path / "rl.md")
    from dataclasses import asdict

    from primal_attention.data.rl_collect import CollectConfig

    config = asdict(CollectConfig(env="hopper", expert_steps=200_000, medium_max_steps=150_000, threads=2))
    assert page.collect_command({"env": "hopper", "config": config}) == \
        "primal data collect-rl hopper --medium-max-steps 150000 --expert-steps 200000"
    assert page.collect_command({"env": "walker2d", "config": asdict(CollectConfig(env="walker2d"))}) == \
        "primal data collect-rl walker2d"


def test_each_environment_without_a_card_keeps_its_recorded_section(tmp_path, monkeypatch) -> None:
    page = _script(monkeypatch, tmp_path / "rl.md")
    assert page.kept_card_sections() == {}  # no page yet
    (tmp_path / "rl.md").write_text(
        "# RL\n\n## Collected datasets\n\n**hopper** (Hopper-v5, seed 0): SAC 200000 steps.\n\n| dataset |\n|---|\n"
        "| medium |\n\n**walker2d** (Walker2d-v5, seed 0): SAC 200000 steps.\n\n| dataset |\n|---|\n| medium |\n")
    kept = page.kept_card_sections()
    assert sorted(kept) == ["hopper", "walker2d"]
    assert kept["hopper"].startswith("**hopper** (Hopper-v5") and kept["hopper"].endswith("| medium |")
    assert "walker2d" not in kept["hopper"]


def _card(medium_score: float) -> dict:
    from dataclasses import asdict

    from primal_attention.data.rl_collect import CollectConfig

    dataset = {"transitions": 1000, "episodes": 10, "return_mean": 900.0, "return_std": 50.0, "return_min": 5.0,
               "return_max": 1200.0, "score_mean": medium_score}
    return {"env": "hopper", "gymnasium_env": "Hopper-v5", "seed": 0, "config": asdict(CollectConfig(env="hopper")),
            "sac": {"steps": 200000, "cpu_seconds": 2700.0},
            "medium_policy": {"steps": 80000, "return": 1229.0, "target": 1078.0, "reached": True},
            "expert_policy": {"steps": 200000, "return": 3000.0}, "d4rl_reference_returns": {"expert": 3234.0},
            "datasets": {"medium": dataset}}


def test_a_recollection_that_differs_keeps_the_earlier_record_beside_it(tmp_path, monkeypatch) -> None:
    page = _script(monkeypatch, tmp_path / "rl.md")
    earlier = page.card_sections("hopper", _card(31.5), {})
    assert len(earlier) == 1 and earlier[0].startswith("**hopper** (Hopper-v5")
    kept = {"hopper": earlier[0]}
    assert page.card_sections("hopper", _card(31.5), kept) == earlier  # the same data: one record

    both = page.card_sections("hopper", _card(37.0), kept)  # collected again, different data
    assert len(both) == 2 and "| 37.0 |" in both[0] and "| 31.5 |" in both[1]
    assert both[1].startswith("**hopper, earlier collection** (the data of the previous runs")

    # The page written with both keeps both, on a machine with the new card and on one without any card.
    (tmp_path / "rl.md").write_text("# RL\n\n## Collected datasets\n\n" + "\n\n".join(both) + "\n")
    kept = page.kept_card_sections()
    assert sorted(kept) == ["hopper", "hopper, earlier collection"]
    assert page.card_sections("hopper", _card(37.0), kept) == both
    assert page.card_sections("hopper", None, kept) == both
    assert page.card_sections("walker2d", None, kept) == []


def test_a_third_collection_keeps_both_earlier_records_each_named_by_the_runs_that_used_it(tmp_path, monkeypatch) -> None:
    page = _script(monkeypatch, tmp_path / "rl.md")
    both = page.card_sections("hopper", _card(37.0), {"hopper": page.card_sections("hopper", _card(31.5), {})[0]})
    (tmp_path / "rl.md").write_text("# RL\n\n## Collected datasets\n\n" + "\n\n".join(both) + "\n")
    three = page.card_sections("hopper", _card(40.0), page.kept_card_sections())
    assert [s.split("**")[1] for s in three] == ["hopper", "hopper, first tuned round's collection",
                                                 "hopper, earlier collection"]
    assert "| 40.0 |" in three[0] and "| 37.0 |" in three[1] and "| 31.5 |" in three[2]
    assert "(the data of the first tuned round;" in three[1]
    (tmp_path / "rl.md").write_text("# RL\n\n## Collected datasets\n\n" + "\n\n".join(three) + "\n")
    kept = page.kept_card_sections()
    assert page.card_sections("hopper", _card(40.0), kept) == three == page.card_sections("hopper", None, kept)


def test_runs_whose_policy_fell_at_every_evaluation_are_named(monkeypatch) -> None:
    from types import SimpleNamespace

    from primal_attention.studies import rl, sweeps

    def record(*lengths: float) -> dict:
        return {"history": [{"val_length": n} for n in lengths]}

    class Fake:
        def __init__(self, points: dict[str, dict], finals: list[dict]) -> None:
            self.points, self.final = points, finals

        def results(self):
            return [SimpleNamespace(name=name, metrics=m) for name, m in self.points.items()]

        def finals(self):
            return self.final

    groups = [Fake({"optim.lr=0.0003": record(21, 20), "optim.lr=0.001": record(18, 381)}, [{"seed": 1, **record(300, 30)}]),
              Fake({"optim.lr=0.0003": record(24, 36)}, [{"seed": 2, **record(12, 14)}])]
    monkeypatch.setattr(sweeps, "entries", lambda c: [SimpleNamespace(label="DT"), SimpleNamespace(label="Primal.+DT")])
    monkeypatch.setattr(sweeps, "sweeps_of", lambda c: groups)
    text = rl.fallen_lines("rl/hopper-medium")[0]
    # a run that hopped at any evaluation (381, 300 steps) is not named
    assert text.endswith("DT lr 0.0003 (21, 20 steps); Primal.+DT lr 0.0003 (24, 36 steps); Primal.+DT final seed 2 (12, 14 steps).")
    groups[:] = [Fake({"optim.lr=0.001": record(18, 381)}, [])]
    assert rl.fallen_lines("rl/hopper-medium") == []
