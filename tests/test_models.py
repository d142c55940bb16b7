"""Blocks, stacks and models: attention chosen per layer by name; heads and pooling."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import primal_attention as pa


def test_hybrid_patterns() -> None:
    assert pa.hybrid_pattern(2, "primal+") == ["softmax", "primal"]
    assert pa.hybrid_pattern(3, "primalformer") == ["primal"] * 3
    assert pa.hybrid_pattern(2, "transformer") == ["softmax"] * 2
    with pytest.raises(ValueError, match="model kind"):
        pa.hybrid_pattern(2, "hybrid")


def test_stack_builds_the_pattern_and_passes_options() -> None:
    stack = pa.TransformerStack(["softmax", "primal"], 16, 2, 32, max_seq_len=30,
                                attention_options={"primal": {"rank": 5, "rank_multi": 10}})
    kinds = [type(b.attn) for b in stack.blocks]
    assert kinds == [pa.SoftmaxAttention, pa.PrimalAttention]
    primal = stack.blocks[1].attn
    assert primal.rank == 5 and primal.num_samples == 30  # s·m = 50 capped by max_seq_len
    with pytest.raises(ValueError, match="non-empty list"):
        pa.TransformerStack("primal", 16, 2, 32)


@pytest.mark.parametrize("norm_first", [True, False])
def test_block_residual_forms(norm_first) -> None:
    torch.manual_seed(0)
    attn = pa.SoftmaxAttention(8, 2)
    block = pa.TransformerBlock(attn, 8, 16, norm_first=norm_first)
    x = torch.randn(2, 5, 8)
    if norm_first:
        h = x + attn(block.norm1(x))
        expected = h + block.ffn(block.norm2(h))
    else:
        h = block.norm1(x + attn(x))
        expected = block.norm2(h + block.ffn(h))
    torch.testing.assert_close(block(x), expected)


@pytest.mark.parametrize("pooling", ["mean", "cls", "flatten"])
@pytest.mark.parametrize("positional", ["learned", "sinusoidal", "none"])
def test_token_classifier_pooling_masks_padding(pooling, positional) -> None:
    torch.manual_seed(0)
    cfg = pa.ClassifierConfig(num_classes=4, max_seq_len=12, vocab_size=9, dim=16, num_heads=2, ffn_dim=32,
                              attention=["softmax", "primal"], pooling=pooling, positional=positional,
                              attention_options={"primal": {"rank": 3, "sampling": "valid"}})
    model = pa.SequenceClassifier(cfg).eval()
    x = torch.randint(1, 9, (2, 12))
    mask = torch.arange(12)[None] < torch.tensor([[12], [7]])
    logits = model(x, mask)
    assert logits.shape == (2, 4)
    x2 = x.clone()
    x2[1, 7:] = 3  # change only padding
    torch.testing.assert_close(model(x2, mask), logits)


def test_uea_style_classifier_flattens_and_pads_short_input() -> None:
    cfg = pa.ClassifierConfig(num_classes=9, max_seq_len=29, num_features=12, dim=32, num_heads=4, ffn_dim=64,
                              attention=["primal", "primal"], pooling="flatten", norm_first=False, dropout=0.1,
                              input_scale=True, attention_options={"primal": {"rank": 8, "rank_multi": 5}})
    model = pa.SequenceClassifier(cfg)
    assert model.head.in_features == 32 * 29
    assert [b.attn.num_samples for b in model.encoder.blocks] == [29, 29]
    logits = model(torch.randn(3, 20, 12))
    assert logits.shape == (3, 9)
    with pytest.raises(ValueError, match=r"\(B, N, 12\)"):
        model(torch.randn(3, 20, 5))
    with pytest.raises(ValueError, match="1..29 tokens"):
        model(torch.randn(3, 30, 12))


def test_dual_retrieval_head() -> None:
    cfg = pa.ClassifierConfig(num_classes=2, max_seq_len=20, vocab_size=257, dim=16, num_heads=2, ffn_dim=32,
                              dual=True, head_hidden=32)
    model = pa.SequenceClassifier(cfg)
    a, b = torch.randint(1, 257, (3, 20)), torch.randint(1, 257, (3, 15))
    assert model(a, None, b, None).shape == (3, 2)
    with pytest.raises(ValueError, match="second document"):
        model(a)


def test_config_errors() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        pa.ClassifierConfig(num_classes=2, max_seq_len=4)
    with pytest.raises(ValueError, match="pooling"):
        pa.ClassifierConfig(num_classes=2, max_seq_len=4, vocab_size=3, pooling="max")
    with pytest.raises(ValueError, match="tokens of shape"):
        pa.SequenceClassifier(pa.ClassifierConfig(num_classes=2, max_seq_len=4, vocab_size=3))(torch.randn(1, 4))


def test_causal_lm_is_causal_and_trains() -> None:
    torch.manual_seed(0)
    cfg = pa.CausalLMConfig(vocab_size=20, max_seq_len=16, dim=16, num_heads=2, ffn_dim=32,
                            attention=["softmax", "primal"], dropout=0.0,
                            attention_options={"primal": {"rank": 4}})
    lm = pa.CausalLM(cfg)
    tokens = torch.randint(0, 20, (2, 16))
    logits = lm(tokens)
    t2 = tokens.clone()
    t2[:, 10:] = (t2[:, 10:] + 1) % 20
    torch.testing.assert_close(lm(t2)[:, :10], logits[:, :10])
    assert all(layer.causal for _, layer in pa.primal_layers(lm))
    opt = torch.optim.Adam(lm.parameters(), lr=1e-2)
    first = None
    for _ in range(30):
        with pa.ksvd_terms(lm) as terms:
            loss = lm.loss(tokens) + 0.1 * terms.loss("sample")
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < first * 0.7


class TimmStyleBlock(nn.Module):
    """The calling convention of timm's vision_transformer.Block (timm 1.x): attn_layer(dim,
    num_heads=..., qkv_bias=..., qk_norm=..., proj_bias=..., attn_drop=..., proj_drop=...,
    norm_layer=...) and forward(x, attn_mask=None)."""

    def __init__(self, dim, num_heads, attn_layer):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = attn_layer(dim, num_heads=num_heads, qkv_bias=True, qk_norm=False, proj_bias=True,
                               attn_drop=0.0, proj_drop=0.0, norm_layer=nn.LayerNorm)

    def forward(self, x, attn_mask=None):
        return x + self.attn(self.norm1(x), attn_mask=attn_mask)


def test_timm_style_attn_layer() -> None:
    block = TimmStyleBlock(32, 4, pa.PrimalAttention.timm(rank=8, num_samples=197))
    assert isinstance(block.attn, pa.PrimalAttention) and block.attn.num_samples == 197
    x = torch.randn(2, 197, 32)  # DeiT: 196 patches + CLS, all tokens sampled
    assert block(x).shape == x.shape
    mask = torch.ones(2, 197, dtype=torch.bool)
    assert block(x, attn_mask=mask).shape == x.shape
    with pytest.raises(ValueError, match="unsupported timm options"):
        pa.PrimalAttention.timm()(32, num_heads=4, qk_norm=True)
