"""The ``authors`` benchmark method: their code given by path, or a one-line reason why not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from primal_attention.ops.primal import reference
from primal_attention.bench import authors
from primal_attention.bench.methods import availability
from primal_attention.bench.workloads import Case, build
from primal_attention.layers import PrimalAttention


def test_unavailable_without_a_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(authors.ENV, raising=False)
    assert "--authors-repo" in availability("authors")


def test_unavailable_for_a_folder_that_is_not_theirs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(authors.ENV, str(tmp_path))
    reason = availability("authors")
    assert "not the authors' PrimalFormer folder" in reason and "model_wrapper.py" in reason


def test_cli_rejects_a_bad_path_in_one_line(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "primal_attention.cli", "bench", "--authors-repo", str(tmp_path),
                           "--levels", "layer", "--seq-lens", "32", "--methods", "authors", "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "--authors-repo" in proc.stderr


def test_layer_objective_is_our_authors_form_objective() -> None:
    """Their wrapper's J, fed the e / r scores and learned W_e, W_r of our reference forward, is our
    KSVD objective (form authors, batch reduction, trace on the learned parameters)."""
    torch.manual_seed(0)
    layer = PrimalAttention(16, 2, max_seq_len=40, rank=4, rank_multi=2).double()
    x = torch.randn(3, 40, 16, dtype=torch.float64)
    weights = layer.weights()
    trace = reference.primal_attention(x, weights, heads=2)
    ours = reference.ksvd_objective(trace, weights, reduction="batch", form="authors")
    theirs = authors.layer_objective([trace.escore, trace.rscore, weights.we, weights.wr], weights.lam)
    torch.testing.assert_close(theirs, ours, rtol=1e-12, atol=1e-12)


@pytest.mark.skipif(not os.environ.get(authors.ENV), reason=f"set {authors.ENV} to an export of the authors' repository")
@pytest.mark.parametrize("level", ["layer", "train", "infer"])
def test_their_code_runs_every_level(level: str) -> None:
    assert availability("authors") is None
    build(Case(level, "authors", 64, 2))()
