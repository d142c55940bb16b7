"""The decode level of the benchmark: chunked states are exact, and the CLI writes its table and JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from primal_attention.bench.decode import merge_states, pattern, synthetic_state
from primal_attention.layers.primal import PrimalAttention
from primal_attention.layers.softmax import SoftmaxAttention
from primal_attention.models.lm import CausalLM, CausalLMConfig

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("make", [lambda: SoftmaxAttention(16, 2, causal=True),
                                  lambda: PrimalAttention(16, 2, 3, causal=True)])
def test_merged_chunk_states_equal_the_state_of_the_whole_prefix(make) -> None:
    torch.manual_seed(0)
    layer = make().double().eval()
    x = torch.randn(2, 23, 16, dtype=torch.float64)
    whole = layer.prefill_state(x)
    merged = merge_states([layer.prefill_state(x[:, a:b]) for a, b in ((0, 5), (5, 17), (17, 23))])
    assert type(merged) is type(whole)
    for got, want in zip(merged, whole):
        torch.testing.assert_close(torch.as_tensor(got, dtype=torch.float64), torch.as_tensor(want, dtype=torch.float64),
                                   rtol=1e-12, atol=1e-12)


def test_merge_states_rejects_mixed_kinds() -> None:
    torch.manual_seed(0)
    x = torch.randn(1, 4, 16)
    with pytest.raises(TypeError, match="no rule to merge"):
        merge_states([SoftmaxAttention(16, 2, causal=True).prefill_state(x), PrimalAttention(16, 2, 3, causal=True).prefill_state(x)])


def test_synthetic_state_size_grows_with_context_only_for_softmax() -> None:
    sizes = {}
    for model in ("transformer", "primalformer", "window32-primalformer"):
        lm = CausalLM(CausalLMConfig(vocab_size=50, max_seq_len=300, dim=16, num_heads=2, ffn_dim=32,
                                     attention=pattern(model, 2), attention_options={"primal": {"rank": 3},
                                                                                     "window_primal": {"rank": 3,
                                                                                                       "window": 8}})).eval()
        sizes[model] = [synthetic_state(lm, c, 1, chunk=64).nbytes() for c in (100, 200)]
        logits, cache = lm.step(torch.tensor([3]), synthetic_state(lm, 200, 1, chunk=64))
        assert logits.shape == (1, 50) and cache.length == 201
    assert sizes["transformer"][1] == 2 * sizes["transformer"][0]
    assert sizes["primalformer"][0] == sizes["primalformer"][1]
    assert sizes["window32-primalformer"][0] == sizes["window32-primalformer"][1]
    with pytest.raises(ValueError):
        pattern("gpt9", 2)


def test_a_window_models_synthetic_state_is_the_state_of_one_prefill() -> None:
    torch.manual_seed(0)
    lm = CausalLM(CausalLMConfig(vocab_size=50, max_seq_len=300, dim=16, num_heads=2, ffn_dim=32,
                                 attention=pattern("window32-primalformer", 2),
                                 attention_options={"window_primal": {"rank": 3, "window": 8}})).double().eval()
    cache = synthetic_state(lm, 70, 1, generator=torch.Generator().manual_seed(1), chunk=16)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # block 0's state from its 70 inputs in one chunk
        x = torch.cat([torch.randn(1, n, 16, generator=g, dtype=torch.float64) for n in (16, 16, 16, 16, 6)], 1)
        whole = lm.decoder.blocks[0].attn.prefill_state(x)
    for got, want in zip(cache.layers[0].attn, whole):
        assert got == want if isinstance(want, int) else torch.allclose(got, want, rtol=0, atol=1e-12)


def test_cli_decode_level_writes_table_and_json(tmp_path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-m", "primal_attention.cli", "bench", "--levels", "decode",
                           "--seq-lens", "16,32", "--out", str(tmp_path / "d")], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "d" / "decode.json").read_text())
    cells = {(r["model"], r["context"]) for r in result["rows"] if r.get("tokens_per_s", 0) > 0}
    assert cells == {(m, c) for m in ("transformer", "primal+", "primalformer") for c in (16, 32)}
    assert "tokens / s" in (tmp_path / "d" / "decode.md").read_text()


def test_hf_gpt2_anchor_has_our_block_weights() -> None:
    """GPT-2 built by hf_gpt2 computes our all-softmax model (up to the √D input scale, put back here)."""
    pytest.importorskip("transformers")
    from primal_attention.bench.decode import hf_gpt2

    torch.manual_seed(0)
    lm = CausalLM(CausalLMConfig(vocab_size=50, max_seq_len=20, dim=16, num_heads=2, ffn_dim=32,
                                 attention=pattern("transformer", 2), dropout=0.0)).eval()
    hf = hf_gpt2(lm, 20)
    tokens = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        hf.transformer.wte.weight.mul_(lm.embed_scale)  # our input scale; the tied head then scales the logits
        got = hf(input_ids=tokens).logits / lm.embed_scale
        torch.testing.assert_close(got, lm(tokens), rtol=1e-4, atol=1e-4)


def test_the_decode_level_times_a_primalized_hf_model_with_a_constant_cache(tmp_path) -> None:
    pytest.importorskip("transformers")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-m", "primal_attention.cli", "bench", "--levels", "decode",
                           "--decode-models", "gpt2-hf-primal,gpt2-hf", "--seq-lens", "64,256",
                           "--out", str(tmp_path / "d")], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr
    rows = {(r["model"], r["context"]): r for r in json.loads((tmp_path / "d" / "decode.json").read_text())["rows"]}
    primal = [rows[("gpt2-hf-primal", c)] for c in (64, 256)]
    assert all(r["tokens_per_s"] > 0 and r["prefill_s"] > 0 for r in primal)
    assert primal[0]["state_mib"] == primal[1]["state_mib"]  # the running sums: the same at every context
    kv = {c: rows[("gpt2-hf", c)]["state_mib"] for c in (64, 256)}  # the KV cache: context + 4 + 64 decoded tokens
    assert kv[256] / kv[64] == pytest.approx((256 + 68) / (64 + 68))
