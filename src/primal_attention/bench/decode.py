"""The ``decode`` level of ``primal bench``: tokens/s and memory of incremental decoding vs context.

For each model (all softmax with a KV cache, last layer primal, all primal with their O(1) state)
and each context C, in a fresh process:

1. build a :class:`~primal_attention.CausalLM` (positions up to C + new tokens) and one throwaway
   step (the library's one-time initialisation), and read the resident set size (the baseline:
   weights, library buffers);
2. build the decoding cache after a prefix of C positions: each
   layer's own ``prefill_state`` applied to C hidden vectors (its real keys / values, or Σ[q | k]),
   which costs O(C·D²) instead of the O(C²) forward a softmax prefill of a real prompt would need;
   the cost of a decoding step depends only on the state's size, not on the prefix's content;
3. reset the high-water mark again, decode ``warmup`` tokens, then time ``new_tokens`` one at a
   time with :meth:`CausalLM.step` (the path ``generate`` runs: the cache updated in place, key /
   value buffers allocated once for the C + new positions);
4. report tokens/s, the cache's bytes (:meth:`DecodeCache.nbytes`: states and decoding constants),
   and the peak RSS while decoding minus the baseline.

Optionally (``prefill_max``) the real prefill of a random prompt (one forward) is timed too, for
C up to that length. The process runs with glibc's mmap threshold at 64 KiB (freed buffers leave
the RSS), one thread unless told otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from primal_attention.bench.memory import status_kib

#: model name -> per-layer attention pattern of its ``layers`` layers.
DECODE_MODELS = ("transformer", "primal+", "primalformer")
#: the anchor a user would pick instead: Hugging Face GPT-2 of the same shape with its KV cache
#: (``transformers`` imported only for it; the cell says so when it is not installed).
HF_MODEL = "gpt2-hf"
#: the same GPT-2 with every layer primalized (``primal_attention.hf.primalize``): decoding through HF's
#: own forward and cache, as a user of a primalized HF model runs it.
HF_PRIMAL_MODEL = "gpt2-hf-primal"
HF_MODELS = (HF_MODEL, HF_PRIMAL_MODEL)
DEFAULT_CONTEXTS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
#: decode models beyond the paper's: every layer a window + primal layer (``window_primal``) of
#: this window; not in the default grid.
WINDOW_MODELS = {"window32-primalformer": 32, "window128-primalformer": 128}


@dataclass
class DecodeConfig:
    """The decode grid: models × contexts, model size, tokens decoded, threads."""

    models: tuple[str, ...] = DECODE_MODELS
    contexts: tuple[int, ...] = DEFAULT_CONTEXTS
    layers: int = 4
    dim: int = 128
    num_heads: int = 4
    ffn_dim: int = 512
    vocab_size: int = 4096
    rank: int = 30
    batch: int = 1
    new_tokens: int = 64
    warmup: int = 4
    prefill_max: int = 8192
    threads: int = 1
    device: str = "cpu"
    extra: dict[str, Any] = field(default_factory=dict)


def pattern(model: str, layers: int) -> list[str]:
    from primal_attention.models.transformer import hybrid_pattern

    if model in HF_MODELS:
        return hybrid_pattern(layers, "transformer")
    if model in WINDOW_MODELS:
        return ["window_primal"] * layers
    if model not in DECODE_MODELS:
        raise ValueError(f"decode model must be one of {', '.join(DECODE_MODELS + tuple(WINDOW_MODELS))}, "
                         f"got {model!r}")
    return hybrid_pattern(layers, model)


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def synthetic_state(model, context: int, batch: int, generator=None, chunk: int = 1024, capacity: int | None = None):
    """The :class:`~primal_attention.DecodeCache` after ``context`` positions: every layer's
    ``prefill_state`` of (batch, context, D) standard-normal hidden vectors, built ``chunk``
    positions at a time (KV caches concatenated, primal sums added: both exact). ``capacity``: the
    positions the key / value buffers are allocated for (None: ``context``)."""
    import torch

    from primal_attention.layers.cache import DecodeCache, KVBuffer
    from primal_attention.layers.softmax import KVCache
    from primal_attention.layers.window import WindowPrimalAttention

    p = next(model.parameters())
    cache = DecodeCache(capacity)
    with torch.no_grad():
        for block, layer in zip(model.decoder.blocks, cache.bind(model.decoder, batch, "synthetic_state")):
            parts = []
            for start in range(0, context, chunk):
                n = min(chunk, context - start)
                x = torch.randn(batch, n, model.config.dim, generator=generator, dtype=p.dtype).to(p.device)
                if isinstance(block.attn, WindowPrimalAttention):  # a window's ring continues from the last chunk
                    parts = [block.attn.extend(x, parts[0] if parts else None)[1]]
                else:
                    parts.append(block.attn.prefill_state(x))
            state = merge_states(parts)
            if isinstance(state, KVCache):
                layer.attn = KVBuffer(capacity)
                layer.attn.append(state.k, state.v)
            else:
                layer.attn = state
    cache.length = context
    return cache


def merge_states(parts: list):
    """One layer's state after consecutive prefix chunks, from the states of each chunk alone:
    KV caches concatenated along time, primal sums and counts added (both exact)."""
    import torch

    from primal_attention.layers.primal import PrimalState
    from primal_attention.layers.softmax import KVCache

    if all(isinstance(c, KVCache) for c in parts):
        return KVCache(torch.cat([c.k for c in parts], dim=2), torch.cat([c.v for c in parts], dim=2))
    if all(isinstance(c, PrimalState) for c in parts):
        return PrimalState(sum(c.total for c in parts), sum(c.count for c in parts))
    if len(parts) == 1:
        return parts[0]
    raise TypeError(f"merge_states: no rule to merge states of types {sorted({type(c).__name__ for c in parts})}")


def hf_gpt2(ours, max_positions: int):
    """``transformers.GPT2LMHeadModel`` of an all-softmax :class:`~primal_attention.CausalLM`'s shape
    (pre-norm, exact GELU, learned positions, tied head) with its block weights copied in. GPT-2 has
    no √D input scale, so its logits differ; the work per token is the same. Raises ImportError
    without transformers."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    c = ours.config
    cfg = GPT2Config(vocab_size=c.vocab_size, n_positions=max_positions, n_embd=c.dim, n_layer=len(c.attention),
                     n_head=c.num_heads, n_inner=c.ffn_dim, activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0, layer_norm_epsilon=1e-5, bos_token_id=None, eos_token_id=None)
    hf = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        hf.transformer.wte.weight.copy_(ours.embed.weight)
        n = min(max_positions, c.max_seq_len)
        hf.transformer.wpe.weight[:n].copy_(ours.pos[:n])
        for block, ob in zip(hf.transformer.h, ours.decoder.blocks):
            a = ob.attn
            block.ln_1.weight.copy_(ob.norm1.weight)
            block.ln_1.bias.copy_(ob.norm1.bias)
            block.ln_2.weight.copy_(ob.norm2.weight)
            block.ln_2.bias.copy_(ob.norm2.bias)
            block.attn.c_attn.weight.copy_(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).t())
            block.attn.c_attn.bias.copy_(torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]))
            block.attn.c_proj.weight.copy_(a.out_proj.weight.t())
            block.attn.c_proj.bias.copy_(a.out_proj.bias)
            block.mlp.c_fc.weight.copy_(ob.ffn.fc1.weight.t())
            block.mlp.c_fc.bias.copy_(ob.ffn.fc1.bias)
            block.mlp.c_proj.weight.copy_(ob.ffn.fc2.weight.t())
            block.mlp.c_proj.bias.copy_(ob.ffn.fc2.bias)
        hf.transformer.ln_f.weight.copy_(ours.decoder.norm.weight)
        hf.transformer.ln_f.bias.copy_(ours.decoder.norm.bias)
    return hf


def _measure_hf(cfg: DecodeConfig, model, context: int, tokens, row: dict[str, Any]) -> dict[str, Any]:
    """The gpt2-hf cells: GPT-2 with a ``DynamicCache`` holding the all-softmax model's keys and values,
    or (gpt2-hf-primal) every layer primalized, its cache filled by a chunked prefill of the context."""
    import torch

    try:
        from transformers import DynamicCache
    except ImportError:
        return {**row, "skipped": "transformers is not installed (pip install transformers): no HF GPT-2 cell"}
    hf = hf_gpt2(model, context + cfg.warmup + cfg.new_tokens)
    primal = row["model"] == HF_PRIMAL_MODEL
    if primal:
        from primal_attention import hf as pa_hf

        pa_hf.primalize(hf, layers="all", rank=cfg.rank).eval()
    with torch.no_grad():
        baseline_kib = status_kib("VmRSS")
        cache = DynamicCache(config=hf.config)
        if primal:  # O(N) prefill through HF's forward, 1024 tokens at a time
            prompt = torch.randint(0, cfg.vocab_size, (cfg.batch, context), generator=torch.Generator().manual_seed(2))
            t0 = time.perf_counter()
            for start in range(0, context, 1024):
                chunk = prompt[:, start:start + 1024]
                hf(input_ids=chunk, past_key_values=cache, use_cache=True,
                   position_ids=torch.arange(start, start + chunk.shape[1]).expand(cfg.batch, -1))
            row["prefill_s"] = time.perf_counter() - t0
            del prompt
        else:
            for i, layer in enumerate(synthetic_state(model, context, cfg.batch,
                                                      torch.Generator().manual_seed(3)).layers):
                cache.update(layer.attn.keys, layer.attn.values, i)
        peak_ok = _reset_peak()
        position = torch.arange(context, context + cfg.warmup + cfg.new_tokens)
        for t in range(cfg.warmup):
            hf(input_ids=tokens[:, t : t + 1], past_key_values=cache, use_cache=True,
               position_ids=position[t].expand(cfg.batch, 1))
        t0 = time.perf_counter()
        for t in range(cfg.warmup, cfg.warmup + cfg.new_tokens):
            hf(input_ids=tokens[:, t : t + 1], past_key_values=cache, use_cache=True,
               position_ids=position[t].expand(cfg.batch, 1))
        elapsed = time.perf_counter() - t0
    # the cache after the decoding, as the other models' state column
    if primal:
        state_bytes = pa_hf.cache_nbytes(cache)
    else:
        state_bytes = 2 * cfg.batch * cache.get_seq_length() * model.config.dim * 4 * len(hf.transformer.h)
    row.update(tokens_per_s=cfg.new_tokens * cfg.batch / elapsed, ms_per_token=1e3 * elapsed / cfg.new_tokens,
               state_mib=state_bytes / 2**20)
    if peak_ok:
        row["rss_growth_mib"] = (status_kib("VmHWM") - baseline_kib) / 1024
    return row


def measure_one(cfg: DecodeConfig, model_name: str, context: int) -> dict[str, Any]:
    """One (model, context) cell, in this process (the caller makes it a fresh one): :meth:`CausalLM.step`
    with one :class:`~primal_attention.DecodeCache` updated in place (what ``generate`` runs)."""
    import torch

    from primal_attention.models.lm import CausalLM, CausalLMConfig

    torch.set_num_threads(cfg.threads)
    torch.manual_seed(0)
    device = torch.device(cfg.device)
    total = context + cfg.warmup + cfg.new_tokens
    model = CausalLM(CausalLMConfig(
        vocab_size=cfg.vocab_size, max_seq_len=total, dim=cfg.dim,
        num_heads=cfg.num_heads, ffn_dim=cfg.ffn_dim, attention=pattern(model_name, cfg.layers),
        attention_options={"primal": {"rank": cfg.rank},
                           "window_primal": {"rank": cfg.rank, "window": WINDOW_MODELS.get(model_name, 32)}}, dropout=0.0,
    )).to(device).eval()
    row: dict[str, Any] = {"model": model_name, "context": context, "batch": cfg.batch}
    tokens = torch.randint(0, cfg.vocab_size, (cfg.batch, cfg.warmup + cfg.new_tokens),
                           generator=torch.Generator().manual_seed(1)).to(device)
    cuda = device.type == "cuda"
    if model_name in HF_MODELS:
        return _measure_hf(cfg, model, context, tokens, row)
    with torch.no_grad():
        # One throwaway step from an empty cache: the first call's one-time library initialisation
        # (6-9 MiB of resident memory) is then not counted as the decoding's growth.
        model.step(tokens[:, 0])
    with torch.no_grad():
        if cfg.prefill_max and context <= cfg.prefill_max:
            prompt = torch.randint(0, cfg.vocab_size, (cfg.batch, context), generator=torch.Generator().manual_seed(2))
            t0 = time.perf_counter()
            model.prefill(prompt.to(device))
            if cuda:
                torch.cuda.synchronize()
            row["prefill_s"] = time.perf_counter() - t0
            del prompt
        baseline_kib = status_kib("VmRSS")
        if cuda:
            allocated = torch.cuda.memory_allocated()
        cache = synthetic_state(model, context, cfg.batch, torch.Generator().manual_seed(3), capacity=total)
        peak_ok = _reset_peak()  # the peak of decoding, with the state resident
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        for t in range(cfg.warmup):
            model.step(tokens[:, t], cache)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for t in range(cfg.warmup, cfg.warmup + cfg.new_tokens):
            model.step(tokens[:, t], cache)
        if cuda:
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
    row.update(tokens_per_s=cfg.new_tokens * cfg.batch / elapsed, ms_per_token=1e3 * elapsed / cfg.new_tokens,
               state_mib=cache.nbytes() / 2**20)
    if cuda:
        row["peak_growth_mib"] = (torch.cuda.max_memory_allocated() - allocated) / 2**20
    elif peak_ok:
        row["rss_growth_mib"] = (status_kib("VmHWM") - baseline_kib) / 1024
    return row


def run_decode(cfg: DecodeConfig, *, progress: bool = True, max_total_s: float | None = None) -> dict[str, Any]:
    """Every (model, context) cell in its own process; a cell that fails (out of memory, killed) is
    recorded with its error and the model's larger contexts are skipped."""
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": str(cfg.threads)}
    for model_name in cfg.models:
        pattern(model_name, cfg.layers)  # a bad name fails before any process starts
        failed = False
        for context in cfg.contexts:
            if failed or (max_total_s is not None and time.perf_counter() - start > max_total_s):
                rows.append({"model": model_name, "context": context, "skipped": True})
                continue
            payload = json.dumps({"cfg": asdict(cfg), "model": model_name, "context": context})
            proc = subprocess.run([sys.executable, "-m", "primal_attention.bench.decode", payload],
                                  capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                failed = True
                tail = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
                rows.append({"model": model_name, "context": context, "error": tail[-300:]})
            else:
                rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            if progress:
                r = rows[-1]
                what = (f"{r['tokens_per_s']:8.1f} tok/s, state {r['state_mib']:8.2f} MiB, RSS growth "
                        f"{r.get('rss_growth_mib', float('nan')):8.1f} MiB" if "tokens_per_s" in r else r.get("error", "skipped"))
                print(f"decode {model_name:12s} context {context:6d}: {what}", flush=True)
    import torch

    return {"config": asdict(cfg), "rows": rows, "torch": torch.__version__,
            "method": "fresh process per cell; one throwaway step before the baseline; cache from "
                      "each layer's prefill_state of C hidden vectors (key / value buffers for C + new tokens); "
                      f"{cfg.warmup} warm-up tokens, then {cfg.new_tokens} timed steps; RSS growth = VmHWM of the "
                      "decoding (high-water mark reset after the state is built) minus VmRSS before the state "
                      "(glibc mmap threshold 64 KiB)"}


def render_markdown(result: dict[str, Any]) -> str:
    """A table per quantity: models as rows, contexts as columns."""
    rows = result["rows"]
    contexts = sorted({r["context"] for r in rows})
    models = list(dict.fromkeys(r["model"] for r in rows))
    head = "| model | " + " | ".join(f"{c // 1024}K" if c % 1024 == 0 else str(c) for c in contexts) + " |"
    out = []
    for title, key, fmt in (("tokens / s (CausalLM.step with one DecodeCache, as generate)", "tokens_per_s", "{:.0f}"),
                            # written by results of the two-path decoder (before the DecodeCache)
                            ("tokens / s (decode_session: preallocated in-place state, as generate)", "session_tokens_per_s", "{:.0f}"),
                            ("decoding cache (MiB: states and decoding constants)", "state_mib", "{:.2f}"),
                            ("peak memory growth (MiB)", "rss_growth_mib", "{:.0f}"), ("prefill of a real prompt (s)", "prefill_s", "{:.2f}")):
        if not any(key in r for r in rows):
            continue
        out += [f"**{title}**", "", head, "|---|" + "---|" * len(contexts)]
        for m in models:
            cells = []
            for c in contexts:
                r = next(r for r in rows if r["model"] == m and r["context"] == c)
                cells.append(fmt.format(r[key]) if key in r else ("skipped" if r.get("skipped") else ("failed" if "error" in r else "–")))
            if not any(key in r for r in rows if r["model"] == m):
                why = next((r["skipped"] for r in rows if r["model"] == m and isinstance(r.get("skipped"), str)), None)
                if why:
                    out.append(f"| {m} | {why} |" + " |" * (len(contexts) - 1))
                    continue
            out.append(f"| {m} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def plot(result: dict[str, Any], path: Path) -> Path | None:
    """tokens/s and memory growth vs context, one line per model (log-log)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for m in dict.fromkeys(r["model"] for r in result["rows"]):
        done = [r for r in result["rows"] if r["model"] == m and "tokens_per_s" in r]
        xs = [r["context"] for r in done]
        axes[0].plot(xs, [r["tokens_per_s"] for r in done], marker="o", label=m)
        mem = [(r["context"], r.get("rss_growth_mib", r.get("peak_growth_mib"))) for r in done]
        axes[1].plot([c for c, v in mem if v is not None], [max(v, 0.1) for c, v in mem if v is not None], marker="o", label=m)
    for ax, label in zip(axes, ("tokens / s", "peak memory growth (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context (tokens of prefix)")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_outputs(result: dict[str, Any], out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"decode_json": out / "decode.json", "decode_md": out / "decode.md"}
    paths["decode_json"].write_text(json.dumps(result, indent=2))
    paths["decode_md"].write_text(render_markdown(result))
    png = plot(result, out / "decode.png")
    if png is not None:
        paths["decode_plot"] = png
    return paths


def _main(payload: str) -> None:
    spec = json.loads(payload)
    cfg = DecodeConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in spec["cfg"].items()})
    print(json.dumps(measure_one(cfg, spec["model"], spec["context"])))


if __name__ == "__main__":
    _main(sys.argv[1])
