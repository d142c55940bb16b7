"""Trivial baselines: each rule on data where its answer is known, the order-free features, the n-gram
LMs against a direct count, the Welch interval against its textbook value, and the CLI on tiny data."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from primal_attention.train.stats import t_quantile, welch_difference
from primal_attention.train.trivial import (
    _bag, _channel_stats, first_token_lookup, majority_class, ngram_lm, position_blind_features,
)
from primal_attention.data.base import SequenceData

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "uea" / "JapaneseVowels_transformer.yaml"


def test_majority_and_first_token_rules() -> None:
    y = torch.tensor([2, 2, 1, 0, 2])
    assert majority_class(y, torch.tensor([2, 1]), torch.tensor([0, 0, 2, 2])) == [0.5, 0.5]
    x = torch.tensor([[5, 1], [5, 2], [7, 1], [7, 1], [7, 3]])
    labels = torch.tensor([0, 0, 1, 1, 2])
    # first token 5 -> 0, 7 -> 1, unseen 9 -> TRAIN's majority (0 and 1 tie at 2 examples: the lower, 0)
    test = (torch.tensor([[5, 0], [7, 0], [9, 0], [7, 0]]), torch.tensor([0, 1, 0, 2]))
    assert first_token_lookup(x, labels, test) == [0.75]


def test_position_blind_features_ignore_order_and_padding() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(1, 6, (4, 9), generator=g)
    mask = torch.arange(9)[None] < torch.tensor([[9], [4], [7], [1]])
    perm = torch.randperm(9, generator=g)
    shuffled = torch.stack([torch.cat([row[:n][torch.randperm(int(n), generator=g)], row[n:]])
                            for row, n in zip(x, mask.sum(1))])
    padded = torch.where(mask, x, 3)  # other tokens at padding
    assert torch.equal(_bag(x, mask, 6), _bag(shuffled, mask, 6)) and torch.equal(_bag(x, mask, 6), _bag(padded, mask, 6))
    f = torch.randn(4, 9, 3, generator=g)
    assert torch.allclose(_channel_stats(f, mask), _channel_stats(torch.where(mask[..., None], f, 99.0), mask))
    assert torch.allclose(_channel_stats(f[:, perm], torch.ones(4, 9, dtype=torch.bool)),
                          _channel_stats(f, torch.ones(4, 9, dtype=torch.bool)))
    data = SequenceData(x, mask, torch.zeros(4, dtype=torch.int64), 2, vocab_size=6, name="t")
    feats, what = position_blind_features([data, data])
    assert feats[0].shape == (4, 7) and "bag of tokens" in what


def test_ngram_models_match_direct_counts() -> None:
    train = torch.tensor([0, 1, 1, 2, 1, 0, 1])
    test = torch.tensor([1, 0, 3, 1])
    (uni,) = ngram_lm(train, 1, 4, test, k=0.5)
    counts = [2, 4, 1, 0]
    p = [(c + 0.5) / (7 + 0.5 * 4) for c in counts]
    assert math.isclose(uni, -sum(math.log(p[t]) for t in (0, 3, 1)) / 3, rel_tol=1e-12)
    (bi,) = ngram_lm(train, 2, 4, test, k=0.5)
    pair = {(0, 1): 2, (1, 1): 1, (1, 2): 1, (2, 1): 1, (1, 0): 1}
    ctx = {0: 2, 1: 3, 2: 1, 3: 0}
    direct = [(pair.get((a, b), 0) + 0.5) / (ctx[a] + 2.0) for a, b in ((1, 0), (0, 3), (3, 1))]
    assert math.isclose(bi, -sum(map(math.log, direct)) / 3, rel_tol=1e-12)


def test_welch_interval_and_verdicts() -> None:
    assert math.isclose(t_quantile(0.975, 4), 2.776445105, rel_tol=1e-8)
    d = welch_difference([0.80, 0.82, 0.81], [0.70, 0.72, 0.71])
    # equal variances and sizes: Welch = the pooled interval, t(0.975, 4) * sqrt(2 * 0.01² / 3)
    half = 2.776445105 * math.sqrt(2 * 1e-4 / 3)
    assert math.isclose(d.low, 0.1 - half, rel_tol=1e-7) and d.verdict == "better"
    assert welch_difference([0.70, 0.72], [0.80, 0.81]).verdict == "worse"
    # the 80 % power difference: z_.975 + z_.80 = 1.960 + 0.842 = 2.802 standard errors once df is large
    big = welch_difference([0.0, 1.0] * 500, [0.5, 1.5] * 500)
    assert abs(big.detectable() / big.se - 2.802) < 0.01
    assert abs(big.detectable(0.5) - (big.high - big.low) / 2) < 1e-9  # at 50 % power: the half width
    assert math.isnan(welch_difference([0.7], [0.8, 0.9]).detectable())
    assert welch_difference([1.0, 1.0], [1.0, 1.0]).detectable() == 0.0
    with pytest.raises(ValueError, match="power must lie in"):
        big.detectable(0.3)
    assert welch_difference([0.70, 0.72], [0.80, 0.81], maximize=False).verdict == "better"  # e.g. perplexity
    assert welch_difference([0.7, 0.9, 0.8], [0.75, 0.85, 0.8]).verdict == "within noise"
    assert welch_difference([0.7], [0.8, 0.81]).verdict == "no interval"
    with pytest.raises(ValueError):
        t_quantile(0.3, 2)


def test_the_linear_baseline_reads_the_raw_input_and_selects_its_decay_on_validation() -> None:
    from primal_attention.train.trivial import fit_linear, raw_features

    g = torch.Generator().manual_seed(0)
    w = torch.randn(20, 3, generator=g)
    x = torch.randn(600, 20, generator=g)
    y = (x @ w).argmax(1)
    acc_v, acc_t, decay, tried = fit_linear((x[:400], y[:400]), (x[400:500], y[400:500]), (x[500:], y[500:]), 3)
    assert acc_v > 0.9 and acc_t > 0.9 and decay in tried and tried[0] < decay < tried[-1]
    # a series is flattened and zeroed past its end; padding values never reach the features
    series = SimpleNamespace(x=torch.ones(2, 4, 3), mask=torch.tensor([[True] * 4, [True, True, False, False]]),
                             vocab_size=None, name="s", x2=None)
    (feats,), what = raw_features([series])
    assert feats.shape == (2, 12) and float(feats[1, 6:].abs().sum()) == 0.0 and "flattened" in what


def test_a_baselines_regularisation_grid_widens_past_an_edge_until_the_choice_is_interior() -> None:
    from primal_attention.train.trivial import grid_text, select_widened

    calls: list[float] = []

    def peaked_at(top: float):
        def score(v: float) -> tuple[float, str]:
            calls.append(v)
            return -abs(math.log10(v) - math.log10(top)), f"fit {v:g}"
        return score

    # the best value lies two decades past the upper edge: the grid grows one decade at a time, one fit each
    value, score, payload, tried = select_widened((1e-3, 1e-2, 1e-1), peaked_at(10.0))
    assert value == 10.0 and score == 0.0 and payload == "fit 10" and tried == [1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0]
    assert sorted(calls) == tried  # nothing is fitted twice
    assert grid_text(tried, value) == "{0.001, 0.01, 0.1, 1, 10, 100}, here 10"
    # the lower edge widens downwards; an interior choice widens nothing
    assert select_widened((1e-3, 1e-2, 1e-1), peaked_at(1e-5))[3][:2] == [1e-6, 1e-5]
    assert select_widened((1e-3, 1e-2, 1e-1), peaked_at(1e-2))[3] == [1e-3, 1e-2, 1e-1]
    # ties go to the larger value; the widening stops after max_widen steps and the text says so
    value, _, _, tried = select_widened((1.0, 2.0), lambda v: (0.5, None), factor=2.0, max_widen=3)
    assert value == 16.0 and tried == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert grid_text(tried, value).endswith("here 16, at the edge of what was tried")


def test_baselines_cli_on_tiny_uea(tmp_path) -> None:
    out = tmp_path / "b.json"
    proc = subprocess.run([sys.executable, "-m", "primal_attention.cli", "baselines", str(CONFIG), "--seeds", "0,1",
                           "--set", "data.max_examples=100", "--json", str(out)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert set(result) == {"seed_0", "seed_1"}
    for r in result.values():
        assert set(r) == {"majority", "linear", "position_blind"} and 0 <= r["majority"]["test_acc"] <= 1
        assert r["position_blind"]["test_acc"] > r["majority"]["test_acc"]  # channel statistics carry signal here
        assert r["linear"]["test_acc"] > r["majority"]["test_acc"] and "weight decay chosen on validation" in r["linear"]["what"]
        assert r["linear"]["choice"] in r["linear"]["tried"]  # each seed's own choice, beside the shared description
    bad = subprocess.run([sys.executable, "-m", "primal_attention.cli", "baselines", str(CONFIG), "--set", "data.name=Nope"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.startswith("primal baselines: error:")
