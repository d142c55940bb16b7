"""scripts/results_lm.py: the tuned LM comparison is given in perplexity too once finished, and the earlier
runs' table stays labelled as shared lr either way."""

from __future__ import annotations

import math
from pathlib import Path

from primal_attention.studies.comparison import Entry, Outcome

ROOT = Path(__file__).resolve().parents[2]


def _script(monkeypatch):
    from primal_attention.studies import lm as module

    monkeypatch.setattr(module.tuned, "section", lambda comparison: ["(the tuned table)"])
    return module


def _outcome(label: str, test: list[float]) -> Outcome:
    return Outcome(Entry(label, Path("c.yaml"), Path("store")), "loss", False, [], {"optim.lr": 1e-3}, test, test,
                   test, [], {"optim.lr": [1e-3]})


def test_the_finished_comparison_is_given_in_perplexity_and_the_earlier_table_stays_labelled(monkeypatch) -> None:
    page = _script(monkeypatch)
    losses = {"Transformer": [4.5, 4.6, 4.7], "PrimalFormer": [4.4, 4.4, 4.4]}
    monkeypatch.setattr(page.tuned, "entries", lambda c: [Entry(k, Path("c"), Path("s")) for k in losses])
    monkeypatch.setattr(page, "outcome", lambda e: _outcome(e.label, losses[e.label]))
    text = "\n".join(page.tuned_note())
    ppl = [math.exp(v) for v in losses["Transformer"]]
    mean = sum(ppl) / 3
    std = math.sqrt(sum((v - mean) ** 2 for v in ppl) / 2)
    assert f"Transformer {mean:.2f} ± {std:.2f}" in text
    assert f"PrimalFormer {math.exp(4.4):.2f} ± 0.00" in text
    assert "The earlier runs (**shared lr**" in text and "*Previous runs*" in text and "Not rerun" not in text

    losses["PrimalFormer"] = [4.4]  # one final seed short: not finished
    text = "\n".join(page.tuned_note())
    assert "Not rerun under the tuned protocol yet" in text and "perplexity per BPE token (exp" not in text
