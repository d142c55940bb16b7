"""The classifier's embedding init: the authors' N(0, 0.02) for token input (LRA), their U(±0.02)
learned positions with PyTorch's input layer for continuous input (UEA), and both on request."""

from __future__ import annotations

import pytest
import torch

import primal_attention as pa


def _classifier(**kw) -> pa.SequenceClassifier:
    torch.manual_seed(0)
    base = dict(num_classes=3, max_seq_len=2000, dim=64, num_heads=2, ffn_dim=32, attention=["softmax"])
    return pa.SequenceClassifier(pa.ClassifierConfig(**{**base, **kw})).requires_grad_(False)  # inspected, not trained


def test_token_input_follows_the_authors_lra_init() -> None:
    model = _classifier(vocab_size=500)
    for table in (model.embed.weight.detach(), model.pos.detach()):
        assert abs(float(table.std()) - 0.02) < 0.002 and abs(float(table.mean())) < 0.002
    # position carries a signal of the token's size at init (it was ~1 % of it under PyTorch's N(0, 1))
    ratio = model.pos.detach().norm(dim=-1).mean() / model.embed.weight.detach().norm(dim=-1).mean()
    assert 0.8 < float(ratio) < 1.25


def test_continuous_input_keeps_the_authors_uea_init() -> None:
    model = _classifier(num_features=12)
    pos = model.pos.detach()
    assert float(pos.abs().max()) <= 0.02 and float(pos.std()) > 0.01  # U(-0.02, 0.02)
    fresh = torch.nn.Linear(12, 64).requires_grad_(False)
    assert abs(float(model.embed.weight.std()) - float(fresh.weight.std())) < 0.02  # PyTorch's default


def test_the_previous_init_is_an_option() -> None:
    model = _classifier(vocab_size=500, embedding_init="torch")
    assert abs(float(model.embed.weight.std()) - 1.0) < 0.05 and float(model.pos.abs().max()) <= 0.02
    normal = _classifier(num_features=12, embedding_init="normal")
    assert abs(float(normal.pos.std()) - 0.02) < 0.002 and float(normal.pos.abs().max()) > 0.03


def test_a_bad_init_name_is_one_clear_error() -> None:
    with pytest.raises(ValueError, match="embedding_init must be one of"):
        _classifier(vocab_size=5, embedding_init="xavier")
