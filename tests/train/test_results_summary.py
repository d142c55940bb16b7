"""scripts/results_summary.py: the tuned RL average is measured against the behaviour policy of the data it
used, and the earlier verdicts against the earlier data's."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _summary(monkeypatch, tmp: Path):
    monkeypatch.setenv("PRIMAL_ATTENTION_CACHE", str(tmp / "cache"))
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location("results_summary_under_test", ROOT / "scripts" / "results_summary.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module.tuned, "COLLECTED_BEHAVIOUR", tmp / "rl_collected_behaviour.json")
    return module


def test_the_rl_baseline_of_the_tuned_average_needs_every_datasets_card(tmp_path, monkeypatch) -> None:
    summary = _summary(monkeypatch, tmp_path)
    scores = {d: float(i) for i, d in enumerate(summary.RL_DATASETS)}  # 0 .. 8, mean 4
    (tmp_path / "rl_collected_behaviour.json").write_text(json.dumps({d: scores[d] for d in summary.RL_DATASETS[:-1]}))
    assert summary._rl_collected_baseline() is None  # one dataset not collected again yet
    (tmp_path / "rl_collected_behaviour.json").write_text(json.dumps(scores))
    assert summary._rl_collected_baseline() == ("behaviour 4.0", 4.0)
    rl = next(s for s in summary.SYSTEMS if s.name.startswith("Offline RL"))
    assert rl.tuned_baseline() == ("behaviour 4.0", 4.0)
