"""Vision Transformer (Primal.+ViT): presets, per-block attention, primal sampling, errors, DropPath."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import primal_attention as pa
from primal_attention.data.vision import load_digits_images
from primal_attention.models.transformer import DropPath
from primal_attention.models.vision import ViTConfig, VisionTransformer, deit_small, deit_tiny, vit_cpu


def _tiny(attention="primal+", **overrides) -> VisionTransformer:
    """An 8 × 8 one-channel ViT: patch 2 (16 + 1 tokens), D 16, depth 2."""
    torch.manual_seed(0)
    options = dict(image_size=8, patch_size=2, dim=16, num_heads=2, ffn_dim=32)
    options.update(overrides)
    pattern = pa.hybrid_pattern(2, attention) if isinstance(attention, str) else attention
    return VisionTransformer(vit_cpu(10, attention=pattern, **options))


def test_shapes_and_batch_inputs():
    model = _tiny()
    data = load_digits_images("test")
    batch = data.batch(torch.arange(5))
    assert model(**batch.inputs).shape == (5, 10)
    assert model.encode(batch.x).shape == (5, 16)
    assert model.config.num_tokens == 17 and model.pos_embed.shape == (1, 17, 16)


def test_presets_are_the_deit_topologies():
    tiny, small = deit_tiny(), deit_small(num_classes=100)
    assert (tiny.patch_size, tiny.dim, tiny.depth, tiny.num_heads, tiny.ffn_dim) == (16, 192, 12, 3, 768)
    assert (small.patch_size, small.dim, small.depth, small.num_heads, small.ffn_dim) == (16, 384, 12, 6, 1536)
    assert small.num_classes == 100 and small.num_tokens == 197 and small.attention == ["softmax"] * 12
    cpu = vit_cpu(10)
    assert (cpu.image_size, cpu.in_channels, cpu.patch_size, cpu.num_tokens, cpu.depth) == (28, 1, 4, 50, 4)
    assert vit_cpu(10, patch_size=7).num_tokens == 17  # overrides replace the preset's fields


@pytest.mark.parametrize("kind, expected", [("primal+", [False] * 3 + [True]), ("primalformer", [True] * 4),
                                            ("transformer", [False] * 4)])
def test_pattern_puts_primal_only_where_asked(kind, expected):
    cfg = vit_cpu(10, image_size=8, patch_size=2, dim=16, num_heads=2, ffn_dim=32, attention=kind)
    assert cfg.attention == pa.hybrid_pattern(4, kind)
    model = VisionTransformer(cfg)
    assert [isinstance(b.attn, pa.PrimalAttention) for b in model.encoder.blocks] == expected


def test_primal_samples_every_token_unless_told():
    model = _tiny("primalformer", attention_options={"primal": {"rank": 4, "rank_multi": 2}})
    assert all(b.attn.num_samples == 17 for b in model.encoder.blocks)  # not s·m = 8
    told = _tiny("primalformer", attention_options={"primal": {"rank": 4, "num_samples": 6}})
    assert all(b.attn.num_samples == 6 for b in told.encoder.blocks)
    assert told.encoder.blocks[0].attn.rank == 4
    no_bias = _tiny("primal+", qkv_bias=False)
    assert all(b.attn.q_proj.bias is None for b in no_bias.encoder.blocks)


def test_optimiser_steps_reduce_the_loss_on_digits():
    torch.set_num_threads(1)
    model = _tiny()
    data = load_digits_images("train")
    x, y = data.x[:256], data.y[:256]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(25):
        with pa.ksvd_terms(model) as terms:
            loss = F.cross_entropy(model(x), y)
        total = loss + 0.05 * terms.loss()
        opt.zero_grad()
        total.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]


def test_state_dict_round_trip_gives_identical_logits():
    model = _tiny(drop_path=0.2, dropout=0.1).eval()
    torch.manual_seed(1)
    other = VisionTransformer(model.config).eval()
    x = load_digits_images("test").x[:6]
    assert not torch.equal(model(x), other(x))
    other.load_state_dict(model.state_dict())
    assert torch.equal(model(x), other(x))


@pytest.mark.parametrize("fields, message", [
    (dict(image_size=30), "ViTConfig: image_size 30 is not divisible by patch_size 16"),
    (dict(dim=100, num_heads=3), "dim 100 is not divisible by num_heads 3"),
    (dict(num_classes=1), "num_classes must be an int >= 2"),
    (dict(patch_size=0), "patch_size must be a positive int"),
    (dict(attention="primal"), "attention must be a non-empty list"),
    (dict(attention=[]), "attention must be a non-empty list"),
    (dict(drop_path=1.0), r"drop_path must be in \[0, 1\)"),
    (dict(attention_options={"primal": {"bias": False}}), r"sets \['bias'\]; the model sets them \(qkv_bias\)"),
    (dict(attention_options={"primal": {"max_seq_len": 5}}), "sets \\['max_seq_len'\\]"),
])
def test_bad_config_values_are_named(fields, message):
    with pytest.raises(ValueError, match=message):
        ViTConfig(**{"num_classes": 10, "image_size": 32, **fields})


@pytest.mark.parametrize("x", [torch.zeros(2, 1, 9, 8), torch.zeros(2, 1, 8, 16), torch.zeros(2, 3, 8, 8),
                               torch.zeros(2, 1, 8, 8, dtype=torch.int64), torch.zeros(1, 8, 8)])
def test_bad_images_give_expected_vs_got(x):
    model = _tiny()
    with pytest.raises(ValueError, match=re.escape(f"expected float images of shape (B, 1, 8, 8), got {tuple(x.shape)}")):
        model(x)


def test_float64_images_into_a_float32_vit_are_one_clear_error():
    model = _tiny()
    with pytest.raises(ValueError) as caught:
        model(torch.zeros(2, 1, 8, 8, dtype=torch.float64))
    assert "VisionTransformer: expected x of dtype torch.float32 (the layer's parameters), got torch.float64" in str(caught.value)
    assert model.double()(torch.zeros(2, 1, 8, 8, dtype=torch.float64)).dtype == torch.float64


def test_drop_path_rises_linearly_and_defaults_to_nothing():
    model = _tiny(["softmax"] * 3, drop_path=0.2)
    assert [b.drop_path.p if isinstance(b.drop_path, DropPath) else 0.0 for b in model.encoder.blocks] == [0.0, 0.1, 0.2]
    plain = pa.TransformerStack(["softmax", "primal"], 16, 2, 32)
    assert all(isinstance(b.drop_path, torch.nn.Identity) for b in plain.blocks)
    with pytest.raises(ValueError, match="one probability per layer"):
        pa.TransformerStack(["softmax", "primal"], 16, 2, 32, drop_path=[0.1])
    with pytest.raises(ValueError, match="DropPath"):
        pa.TransformerStack(["softmax"], 16, 2, 32, drop_path=-0.1)


def test_drop_path_is_identity_in_eval_and_unbiased_in_training():
    drop = DropPath(0.25)
    x = torch.randn(4000, 3, 2) + 2.0
    assert drop.eval()(x) is x
    torch.manual_seed(0)
    out = drop.train()(x)
    kept = (out != 0).flatten(1)
    assert (kept.all(1) | ~kept.any(1)).all()  # a whole sample is dropped or kept
    assert torch.allclose(out[kept.all(1)], x[kept.all(1)] / 0.75)
    assert abs(kept.all(1).float().mean().item() - 0.75) < 0.03
    assert torch.allclose(out.mean(0), x.mean(0), atol=0.1)  # E[out] = x
