"""Packed rows: documents concatenated in one row with document ids (segments) equal each document run alone."""

from __future__ import annotations

import pytest
import torch

import primal_attention as pa
from primal_attention.ops.segments import segment_starts

PATTERNS = {"all-primal": ["primal", "primal"], "hybrid": ["softmax", "primal"], "softmax": ["softmax", "softmax"]}


def lm(pattern: list[str], seed: int = 0) -> pa.CausalLM:
    torch.manual_seed(seed)
    return pa.CausalLM(pa.CausalLMConfig(vocab_size=23, max_seq_len=40, dim=16, num_heads=2, ffn_dim=32, attention=pattern,
                                         dropout=0.0, attention_options={"primal": {"rank": 4}})).double().eval()


def packed(lengths: list[int], seed: int) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    docs = [torch.randint(0, 23, (n,), generator=g) for n in lengths]
    segments = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
    return docs, torch.cat(docs), segments


def test_segment_starts_marks_each_documents_first_token() -> None:
    segments = torch.tensor([[0, 0, 0, 1, 1, 2], [5, 5, 5, 5, 5, 5]])
    assert segment_starts(segments).tolist() == [[0, 0, 0, 3, 3, 5], [0, 0, 0, 0, 0, 0]]


@pytest.mark.parametrize("kind", list(PATTERNS))
def test_a_packed_row_equals_its_documents_run_alone(kind) -> None:
    model = lm(PATTERNS[kind])
    rows = [packed([5, 9, 3], 1), packed([1, 12, 4], 2)]  # two packed rows of 17 tokens
    x = torch.stack([r[1] for r in rows])
    segments = torch.stack([r[2] for r in rows])
    with torch.no_grad():
        got = model(x, segments=segments)
        for b, (docs, _, _) in enumerate(rows):
            want = torch.cat([model(d[None])[0] for d in docs])
            torch.testing.assert_close(got[b], want, rtol=0, atol=1e-9)


def test_packed_training_gives_each_documents_gradients_and_ksvd_terms() -> None:
    model = lm(PATTERNS["hybrid"]).train()
    docs, x, segments = packed([6, 8], 3)
    with pa.ksvd_terms(model) as terms:
        model(x[None], segments=segments[None]).sum().backward()
    assert len(terms) == 1  # the primal layer's KSVD term (Λ enters only it: no gradient from the output here)
    assert all(p.grad is not None for n, p in model.named_parameters() if not n.endswith("lam"))
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None and "lam" not in n}
    model.zero_grad()
    for d in docs:
        model(d[None]).sum().backward()
    for name, g in grads.items():
        torch.testing.assert_close(g, dict(model.named_parameters())[name].grad, rtol=0, atol=1e-9, msg=name)


def test_bad_segments_are_one_line_errors() -> None:
    model = lm(PATTERNS["hybrid"])
    x = torch.randint(0, 23, (2, 6))
    with pytest.raises(ValueError, match=r"expected segments of integer document ids \(2, 6\)"):
        model(x, segments=torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="expected segments of integer document ids"):
        model(x, segments=torch.zeros(2, 6))
    with pytest.raises(ValueError, match="not for decoding with a cache"):
        model(x, segments=torch.zeros(2, 6, dtype=torch.long), cache=pa.DecodeCache())
    layer = pa.PrimalAttention(16, 2, rank=4)  # not causal
    with pytest.raises(ValueError, match="need a causal layer"):
        layer(torch.randn(1, 4, 16), segments=torch.zeros(1, 4, dtype=torch.long))
    stack = pa.TransformerStack(["linear", "primal"], dim=16, num_heads=2, ffn_dim=32, causal=True)
    with pytest.raises(TypeError, match="takes no segments"):
        stack(torch.randn(1, 4, 16), segments=torch.zeros(1, 4, dtype=torch.long))
