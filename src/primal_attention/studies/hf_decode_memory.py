"""Decode-cache memory of a GPT-2-small-shaped HF model (random weights): softmax vs primalized.

Counts the bytes of every tensor in the HF cache after a prompt of N tokens and one decoded token
(`primal_attention.hf.cache_nbytes`): keys and values of softmax layers, running sums of primal
layers. The long contexts run on the meta device (shapes and dtypes, no arithmetic); a short
context is also run on real CPU tensors to check that both count the same bytes. The prompt goes in
chunks shorter than 16·D tokens: the primal layer's folded long-sequence path (N ≥ 16·D) needs
real tensors, and later chunks advance the primal state token by token as decoding does.

    python scripts/hf_decode_memory.py [--contexts 1024 4096 16384] [--check-context 128]

Prints the markdown table of docs/hf.md.
"""

from __future__ import annotations

import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from primal_attention import hf

SETTINGS = {"softmax (original)": None, "Primal.+ (last layer primal)": [-1], "all layers primal": "all"}


def gpt2_small(max_positions: int) -> GPT2Config:
    return GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=max_positions)


def cache_bytes(layers, context: int, device: str) -> int:
    """Cache bytes after `context` prompt tokens and one decoded token, batch 1, float32."""
    with torch.device(device):
        model = GPT2LMHeadModel(gpt2_small(context + 1)).eval()
    if layers is not None:
        hf.primalize(model, layers=layers, rank=20)
    chunk = 16 * model.config.n_embd - 1
    cache = None
    with torch.no_grad():
        for start in range(0, context, chunk):
            n = min(chunk, context - start)
            cache = model(torch.zeros(1, n, dtype=torch.int64, device=device), cache=cache, use_cache=True).cache
        cache = model(torch.zeros(1, 1, dtype=torch.int64, device=device), cache=cache, use_cache=True).cache
    assert cache.get_seq_length() == context + 1
    return hf.cache_nbytes(cache)


def mib(n: int) -> str:
    return f"{n / 2**20:,.2f} MiB" if n >= 2**20 else f"{n / 2**10:,.1f} KiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--check-context", type=int, default=128)
    a = parser.parse_args()
    for name, layers in SETTINGS.items():
        real, meta = cache_bytes(layers, a.check_context, "cpu"), cache_bytes(layers, a.check_context, "meta")
        if real != meta:
            raise SystemExit(f"{name}: {real} bytes on CPU but {meta} on meta at context {a.check_context}")
    print("| context | " + " | ".join(SETTINGS) + " |")
    print("|---|" + "---|" * len(SETTINGS))
    for context in a.contexts:
        row = [cache_bytes(layers, context, "meta") for layers in SETTINGS.values()]
        print(f"| {context:,} | " + " | ".join(f"{mib(n)} ({n:,} B)" for n in row) + " |")


if __name__ == "__main__":
    main()
