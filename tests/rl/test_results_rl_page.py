"""scripts/results_rl.py: a collection card gives its command, and the page keeps the record of an
environment whose card this machine lacks."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _script(monkeypatch, page: Path):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location("results_rl_under_test", ROOT / "scripts" / "results_rl.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
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
