"""SequenceData: validation and subsets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from primal_attention.data.base import DataError, SequenceData


def make(m: int = 5) -> SequenceData:
    return SequenceData(
        x=torch.arange(m * 3).view(m, 3), mask=torch.ones(m, 3, dtype=torch.bool), y=torch.arange(m) % 2,
        num_classes=2, vocab_size=20, name="toy",
        meta={"lengths": torch.tensor([3] * (m - 1) + [2]), "ids": np.arange(m) * 10, "source": "unit test", "classes": ["a", "b"]},
    )


def test_subset_carries_per_example_metadata() -> None:
    d = make()
    s = d.subset(torch.tensor([4, 1]))
    assert s.x.tolist() == [[12, 13, 14], [3, 4, 5]]
    assert s.meta["lengths"].tolist() == [2, 3] and s.meta["ids"].tolist() == [40, 10]
    assert s.meta["source"] == "unit test" and s.meta["classes"] == ["a", "b"]


def test_validation_errors() -> None:
    with pytest.raises(DataError, match="mask"):
        SequenceData(x=torch.zeros(2, 3), mask=torch.ones(2, 4, dtype=torch.bool), y=torch.zeros(2), num_classes=2)
    with pytest.raises(DataError, match="expected y"):
        SequenceData(x=torch.zeros(2, 3), mask=torch.ones(2, 3, dtype=torch.bool), y=torch.zeros(3), num_classes=2)
