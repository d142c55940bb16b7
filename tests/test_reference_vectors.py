"""Our layer reproduces the vectors computed by the authors' code (rtol 1e-5 / atol 1e-6)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import all_reference_files

from primal_attention.selfcheck import check_case, load_reference
import primal_attention as pa
from primal_attention.ops.primal import reference

RTOL, ATOL = 1e-5, 1e-6


def close(ours: torch.Tensor, theirs: np.ndarray) -> None:
    torch.testing.assert_close(ours.detach().double(), torch.tensor(theirs, dtype=torch.float64), rtol=RTOL, atol=ATOL)


def test_all_five_published_cases_are_found() -> None:
    names = {p.stem for p in all_reference_files()}
    assert {
        "noncausal_basic",
        "noncausal_padded",
        "noncausal_dense_sampling",
        "causal_basic",
        "causal_rank_above_head_dim",
    } <= names


@pytest.mark.parametrize("fused", [True, False], ids=["fast", "reference"])
def test_reference_case(reference_case, fused: bool) -> None:
    layer, d = load_reference(reference_case)
    layer.impl = "fast" if fused else "reference"
    x = torch.tensor(d["x"], dtype=torch.float32, requires_grad=True)
    mask = torch.tensor(d["mask"]).bool() if "mask" in d else None
    if "sample_index" in d:
        from primal_attention.ops.primal.reference import uniform_sample_index

        assert uniform_sample_index(x.shape[1], layer.num_samples).tolist() == d["sample_index"].tolist()

    with pa.ksvd_terms(layer) as terms:
        out = layer(x, mask)
    close(out, d["out"])
    j_batch = terms.objective("batch")
    close(j_batch, d["ksvd_j_batch"])
    close(terms.objective("sample"), d["ksvd_j_sample"])
    trace = (layer.we * layer.wr).sum() / layer.num_heads
    close(trace, d["ksvd_trace"])
    if "grad_x_of_sum_out_plus_j2" in d:
        (grad,) = torch.autograd.grad(out.sum() + j_batch**2, x)
        close(grad, d["grad_x_of_sum_out_plus_j2"])


def test_reference_scores(reference_case) -> None:
    """The readable path also reproduces the per-token scores e, r."""
    layer, d = load_reference(reference_case)
    layer.impl = "reference"
    mask = torch.tensor(d["mask"]).bool() if "mask" in d else None
    trace = reference.primal_attention(torch.tensor(d["x"], dtype=torch.float32), layer.weights(),
                                       heads=layer.num_heads, causal=layer.causal, mask=mask, sampling=layer.sampling)
    close(trace.escore, d["escore"])
    close(trace.rscore, d["rscore"])


def test_padded_rows_equal_out_bias() -> None:
    path = next(p for p in all_reference_files() if p.stem == "noncausal_padded")
    layer, d = load_reference(path)
    mask = torch.tensor(d["mask"]).bool()
    out = layer(torch.tensor(d["x"], dtype=torch.float32), mask)
    torch.testing.assert_close(out[~mask], layer.out_proj.bias.expand(int((~mask).sum()), -1))


def test_check_case_reports_small_errors(reference_case) -> None:
    result = check_case(reference_case)
    assert result.passed(), result.errors
