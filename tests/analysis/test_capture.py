"""Capture of the attention layers: the rebuilt matrices are what the layers compute."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import primal_attention as pa
from primal_attention.ops.primal import reference
from primal_attention.analysis import capture
from primal_attention.analysis.spectrum import masked_svdvals


def test_capture_records_every_attention_layer_with_shapes(tiny_classifier, ragged_data) -> None:
    model = tiny_classifier()
    data = ragged_data()
    with capture.capture_inputs(model) as seen:
        model(data.x, data.mask)
    assert set(seen) == {"encoder.blocks.0.attn", "encoder.blocks.1.attn"}
    assert seen["encoder.blocks.0.attn"].x.shape == (7, 10, 16)
    assert torch.equal(seen["encoder.blocks.1.attn"].mask, data.mask)
    layers = dict(capture.attention_layers(model))
    soft = capture.layer_matrices(layers["encoder.blocks.0.attn"], seen["encoder.blocks.0.attn"])
    prim = capture.layer_matrices(layers["encoder.blocks.1.attn"], seen["encoder.blocks.1.attn"])
    assert set(soft) == {"attention", "kernel"} and set(prim) == {"kernel", "scores"}
    assert soft["attention"].shape == (7, 2, 10, 10) and soft["attention"].dtype == torch.float64
    assert prim["kernel"].shape == (7, 2, 10, 10) and prim["scores"].shape == (7, 2, 10, 6)
    a = soft["attention"][1]  # length 3: rows sum to 1 over the real keys, padding rows / cols are 0
    torch.testing.assert_close(a[:, :3].sum(-1), torch.ones(2, 3, dtype=torch.float64))
    assert float(a[:, 3:].abs().sum() + a[:, :, 3:].abs().sum()) == 0.0
    assert float(prim["scores"][1, :, 3:].abs().sum()) == 0.0
    # A primal layer's N×N kernel has rank <= head_dim = 8.
    assert bool((masked_svdvals(prim["kernel"][0])[:, 8:] < 1e-10).all())
    # Hooks are gone after the block.
    with capture.capture_inputs(model) as seen:
        pass
    model(data.x, data.mask)
    assert seen == {}


def test_softmax_attention_reproduces_the_layer_output() -> None:
    """A v, padding rows zeroed, then out_proj, is the layer's own (SDPA) output — same masking."""
    torch.manual_seed(0)
    mask = torch.arange(9)[None] < torch.tensor([[9], [4], [1]])
    x = torch.randn(3, 9, 16)
    for causal in (False, True):
        layer = pa.SoftmaxAttention(16, 2, causal=causal).double()
        a = capture.softmax_matrices(layer, x, mask)["attention"]
        v = layer.v_proj(x.double()).view(3, 9, 2, 8).transpose(1, 2)
        y = (a @ v).transpose(1, 2).reshape(3, 9, 16)
        torch.testing.assert_close(layer.out_proj(y), layer(x.double(), mask), rtol=1e-10, atol=1e-10)
        if causal:
            assert float(a[0].triu(1).abs().max()) == 0.0


def test_primal_views_reproduce_the_layer_math_and_output() -> None:
    torch.manual_seed(0)
    layer = pa.PrimalAttention(8, 2, 2, num_samples=4, sampling="valid").double()
    x = torch.randn(3, 6, 8, dtype=torch.float64)
    mask = torch.arange(6)[None] < torch.tensor([[6], [4], [2]])
    views = capture.primal_matrices(layer, x, mask)
    trace = reference.primal_attention(x, layer.weights(), heads=2, mask=mask, sampling="valid")
    torch.testing.assert_close(views["scores"][1, :, :4], torch.cat([trace.escore, trace.rscore], -1)[1, :, :4])
    q = F.normalize(layer.q_proj(x).view(3, 6, 2, 4).transpose(1, 2), dim=-1)
    k = F.normalize(layer.k_proj(x).view(3, 6, 2, 4).transpose(1, 2), dim=-1)
    torch.testing.assert_close(views["kernel"][0], q[0] @ k[0].transpose(-1, -2))
    # The scores, mixed and projected, give the fast path's output.
    mixed = layer.mix(views["scores"]) * mask[:, None, :, None]
    out = layer.out_proj(mixed.transpose(1, 2).reshape(3, 6, 8))
    torch.testing.assert_close(out, layer(x, mask), rtol=1e-9, atol=1e-9)


def test_padding_content_does_not_change_any_view() -> None:
    torch.manual_seed(0)
    mask = torch.arange(8)[None] < torch.tensor([[8], [5], [2]])
    x = torch.randn(3, 8, 16)
    noisy = x + 3.0 * torch.randn_like(x) * (~mask)[..., None]
    layers = [pa.PrimalAttention(16, 2, 3, causal=True), pa.SoftmaxAttention(16, 2, causal=True),
              pa.SoftmaxAttention(16, 2), pa.PrimalAttention(16, 2, 3, num_samples=4, sampling="valid")]
    for layer in layers:
        clean = capture.layer_matrices(layer, capture.LayerInput(x, mask))
        dirty = capture.layer_matrices(layer, capture.LayerInput(noisy, mask))
        for view in clean:
            torch.testing.assert_close(clean[view], dirty[view])
    # The authors' uniform sampling draws padding tokens into W_{e|X}: the scores do change there.
    layer = pa.PrimalAttention(16, 2, 3, num_samples=4, sampling="uniform")
    clean = capture.layer_matrices(layer, capture.LayerInput(x, mask))["scores"]
    dirty = capture.layer_matrices(layer, capture.LayerInput(noisy, mask))["scores"]
    assert not torch.allclose(clean[1], dirty[1])
