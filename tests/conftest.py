"""Shared fixtures: the authors' reference vectors (bundled, plus any held-out ones beside the repo), and a
tiny hybrid classifier with ragged (padded) data for the analysis tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import primal_attention as pa
from primal_attention.selfcheck import reference_files
from primal_attention.data.base import SequenceData

ROOT = Path(__file__).resolve().parents[1]
#: further reference cases in the bundled format, from wherever a user keeps them.
EXTRA_REFERENCE_DIRS = [Path(os.environ["PRIMAL_REFERENCE_DIR"])] if os.environ.get("PRIMAL_REFERENCE_DIR") else []


def all_reference_files() -> list[Path]:
    return reference_files(*EXTRA_REFERENCE_DIRS)


@pytest.fixture(params=all_reference_files(), ids=lambda p: p.stem)
def reference_case(request: pytest.FixtureRequest) -> Path:
    return request.param



def _tiny_classifier(attention=("softmax", "primal"), sampling: str = "valid") -> pa.SequenceClassifier:
    torch.manual_seed(0)
    options = {"primal": {"rank": 3, "rank_multi": 2, "sampling": sampling}}
    cfg = pa.ClassifierConfig(num_classes=3, max_seq_len=10, num_features=4, dim=16, num_heads=2, ffn_dim=32,
                              attention=list(attention), attention_options=options, pooling="mean")
    return pa.SequenceClassifier(cfg)


def _ragged_data(m: int = 7, n: int = 10, seed: int = 1) -> SequenceData:
    """m sequences of lengths 10, 3, 7, 1, 10, 5, 8 (right padding, zeros at padding)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([n, 3, 7, 1, 10, 5, 8][:m])
    mask = torch.arange(n)[None] < lengths[:, None]
    x = torch.randn(m, n, 4, generator=g) * mask[..., None]
    return SequenceData(x, mask, torch.randint(0, 3, (m,), generator=g), 3)


@pytest.fixture
def tiny_classifier():
    """Factory: a 2-layer classifier (D 16, H 2, s 3, n 6) with the given attention per layer."""
    return _tiny_classifier


@pytest.fixture
def ragged_data():
    """Factory: m ≤ 7 padded continuous sequences with real lengths 10, 3, 7, 1, 10, 5, 8."""
    return _ragged_data
