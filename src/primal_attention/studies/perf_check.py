"""The performance target table in one run: decoding (today's code vs now vs Hugging Face GPT-2), the
decoding state's growth, and the efficiency rows (inference, layer, training step vs the authors').

    .venv/bin/python scripts/perf_check.py --authors-repo <export of yingyichen-cyy/PrimalAttention>
    .venv/bin/python scripts/perf_check.py --short          # minutes: a check that every row fills

"Today's" decoding is the code of ``--base`` (default ``main``): ``git archive`` of its
``src/primal_attention``, imported as the package ``pa_base`` beside the working tree's
``primal_attention`` in the same process, with the same weights. Each decoding cell (model, batch,
context) runs in a fresh process; inside it the methods are timed in interleaved rounds (median):

* ``base``: what ``generate`` of the code of --base runs per token (its ``decode_session`` where it
  has one, else ``CausalLM.step``);
* ``step``: ``CausalLM.step`` now with one ``DecodeCache`` updated in place (what ``generate`` runs),
  each round from a copy of the prefix's cache;
* ``hf``: Hugging Face ``GPT2LMHeadModel`` of the same shape (D, layers, heads, FFN, vocabulary;
  the all-softmax model's block weights copied in, :func:`primal_attention.bench.decode.hf_gpt2`)
  with its ``DynamicCache`` (skipped, with the reason, when ``transformers`` is not installed).

The state of a context C is synthetic (each layer's ``prefill_state`` of C random hidden vectors,
:func:`primal_attention.bench.decode.synthetic_state`); HF's cache gets the all-softmax model's keys and
values of the same prefix. The efficiency rows come from ``primal bench --levels train,layer,infer``
(N 4096) at each ``--threads`` value; the state / RSS row from ``primal bench --level decode`` cells.

Writes ``perf_check.json`` and ``perf_check.md`` (the target table, then every measured cell) to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from primal_attention.provenance import shown_command
from primal_attention.studies.paths import ROOT

KINDS = ("transformer", "primal+", "primalformer")
SHAPE = {"layers": 4, "dim": 128, "num_heads": 4, "ffn_dim": 512, "vocab_size": 4096, "rank": 30}


# -- today's code as the package pa_base ----------------------------------------------------------

def export_base(ref: str, dest: Path, repo: Path = ROOT) -> Path:
    """``git archive`` of ref's src/primal_attention into dest/pa_base, every import renamed."""
    raw = dest / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(repo), "archive", ref, "src/primal_attention"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(raw)], input=archive.stdout, check=True)
    pkg = dest / "pa_base"
    shutil.copytree(raw / "src" / "primal_attention", pkg)
    for path in pkg.rglob("*.py"):
        path.write_text(re.sub(r"\bprimal_attention\b", "pa_base", path.read_text()))
    return dest


def export_authors(repo: str, dest: Path) -> str:
    """A folder of the authors' code: repo as given if it is a folder with files, else a git dir exported."""
    path = Path(repo)
    if (path / "PrimalAttention_LRA").is_dir() or (path / "model.py").is_file():
        return str(path)
    git_dir = path / "repo" if (path / "repo" / "HEAD").is_file() else path
    out = dest / "authors"
    out.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "--git-dir", str(git_dir), "archive", "HEAD"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    return str(out)


# -- one decoding cell (fresh process) ------------------------------------------------------------

def _lm_config(pkg, kind: str, context: int, extra: int):
    from primal_attention.bench.decode import pattern

    return pkg.CausalLMConfig(vocab_size=SHAPE["vocab_size"], max_seq_len=context + extra, dim=SHAPE["dim"],
                              num_heads=SHAPE["num_heads"], ffn_dim=SHAPE["ffn_dim"], attention=pattern(kind, SHAPE["layers"]),
                              attention_options={"primal": {"rank": SHAPE["rank"]}}, dropout=0.0)


def decode_cell(spec: dict) -> dict:
    import torch

    torch.set_num_threads(spec["threads"])
    import primal_attention as pa
    from primal_attention.bench.decode import synthetic_state

    kind, batch, context, n, rounds = spec["kind"], spec["batch"], spec["context"], spec["tokens"], spec["rounds"]
    extra = rounds * n + 16
    row = {"kind": kind, "batch": batch, "context": context, "tokens": n, "rounds": rounds, "threads": spec["threads"]}
    tokens = torch.randint(0, SHAPE["vocab_size"], (batch, n + 4), generator=torch.Generator().manual_seed(1))
    timers: dict = {}
    with torch.no_grad():
        torch.manual_seed(0)
        model = pa.CausalLM(_lm_config(pa, "transformer" if kind == "gpt2-hf" else kind, context, extra)).eval()
        if kind == "gpt2-hf":
            try:
                import transformers  # noqa: F401
            except ImportError:
                return {**row, "skipped": "transformers is not installed (pip install transformers)"}
            from primal_attention.bench.decode import hf_gpt2

            hf = hf_gpt2(model, context + extra)
            prefix = synthetic_state(model, context, batch, torch.Generator().manual_seed(3))
            from transformers import DynamicCache

            cache = DynamicCache(config=hf.config)
            for i, layer in enumerate(prefix.layers):
                cache.update(layer.attn.keys.clone(), layer.attn.values.clone(), i)
            del prefix
            positions = torch.arange(context, context + n + 4)

            def hf_run(count: int) -> None:
                for t in range(count):
                    hf(input_ids=tokens[:, t : t + 1], past_key_values=cache, use_cache=True,
                       position_ids=positions[t].expand(batch, 1))
                cache.crop(-count)

            timers["hf"] = hf_run
        else:
            state = synthetic_state(model, context, batch, torch.Generator().manual_seed(3), capacity=context + extra)
            model.step(tokens[:, -1], state)  # its decoding constants, built once (as base's session builds its plan)
            row["state_bytes"] = state.nbytes()
            if spec.get("base"):
                sys.path.insert(0, spec["base"])
                import pa_base
                from pa_base.bench.decode import synthetic_state as base_state

                base = pa_base.CausalLM(_lm_config(pa_base, kind, context, extra)).eval()
                weights = model.state_dict()
                if "decoder.blocks.0.ffn.0.weight" in base.state_dict():  # --base before FeedForward had names
                    weights = {k.replace(".ffn.fc1.", ".ffn.0.").replace(".ffn.fc2.", ".ffn.3."): v for k, v in weights.items()}
                base.load_state_dict(weights)
                bstate = base_state(base, context, batch, torch.Generator().manual_seed(3))

                def base_run(count: int) -> float:
                    if hasattr(base, "decode_session"):  # the two-path decoder: generate's loop
                        session = base.decode_session(bstate, batch, count)
                        t0 = time.perf_counter()
                        for t in range(count):
                            session.step(tokens[:, t])
                        return time.perf_counter() - t0
                    s = bstate.copy()
                    t0 = time.perf_counter()
                    for t in range(count):
                        base.step(tokens[:, t], s)
                    return time.perf_counter() - t0

                timers["base"] = base_run

            def step_run(count: int) -> float:
                cache = state.copy()  # the copy is not a decoding step
                t0 = time.perf_counter()
                for t in range(count):
                    model.step(tokens[:, t], cache)
                return time.perf_counter() - t0

            timers["step"] = step_run
        for fn in timers.values():  # warm-up
            fn(2)
        times: dict = {k: [] for k in timers}
        for _ in range(rounds):
            for name, fn in timers.items():
                t0 = time.perf_counter()
                inner = fn(n)
                times[name].append(inner if isinstance(inner, float) else time.perf_counter() - t0)
    for name, ts in times.items():
        row[f"{name}_tok_s"] = n * batch / statistics.median(ts)
        row[f"{name}_ms"] = 1e3 * statistics.median(ts) / n
    return row


def _kv_bytes(kind: str, batch: int, context: int) -> int:
    softmax_layers = {"transformer": 4, "gpt2-hf": 4, "primal+": 3, "primalformer": 0}[kind]
    return softmax_layers * 2 * batch * context * SHAPE["dim"] * 4


def run_cell(spec: dict, env: dict) -> dict:
    proc = subprocess.run([sys.executable, "-m", "primal_attention.studies.perf_check", "--cell", json.dumps(spec)],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        return {**{k: spec[k] for k in ("kind", "batch", "context")}, "error": tail[-300:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- the efficiency rows ---------------------------------------------------------------------------

def efficiency(out: Path, threads: int, repeats: int, authors: str | None, levels: str, env: dict) -> dict:
    d = out / f"bench_t{threads}"
    methods = "primal" + (",authors" if authors else "")
    cmd = [sys.executable, "-m", "primal_attention.cli", "bench", "--levels", levels, "--seq-lens", "4096",
           "--dtypes", "fp32", "--modes", "eager", "--methods", methods, "--repeats", str(repeats),
           "--threads", str(threads), "--out", str(d)]
    if authors:
        cmd += ["--authors-repo", authors]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1], "command": shown_command(cmd)}
    r = json.loads((d / "results.json").read_text())
    t = {(x["level"], x["method"]): x["time"]["median"] for x in r["records"]
         if x["seq_len"] == 4096 and x.get("status") == "ok" and isinstance(x.get("time"), dict)}
    lim = {(x["level"], x["method"]): x for x in r["analysis"]["limits"]}
    res: dict = {"command": shown_command(cmd), "times_s": {f"{k[0]}/{k[1]}": v for k, v in t.items()}}
    for level in ("infer", "layer", "train"):
        if (level, "authors") in t and (level, "primal") in t:
            res[f"{level}_vs_authors"] = t[(level, "authors")] / t[(level, "primal")]
    if ("infer", "primal") in lim:
        res["infer_floor_fraction"] = lim[("infer", "primal")]["floor_fraction"]
    if ("layer", "primal") in lim:
        res["layer_floor_fraction"] = lim[("layer", "primal")].get("analytic_floor_fraction")
    return res


# -- the table --------------------------------------------------------------------------------------

def _fmt(v, spec=".2f", suffix="") -> str:
    return "–" if v is None else f"{v:{spec}}{suffix}"


def target_table(result: dict) -> list[str]:
    cells = result["decode"]
    eff = result["efficiency"]

    def cell(kind, batch, context):
        return next((c for c in cells if c["kind"] == kind and c["batch"] == batch and c["context"] == context), {})

    first = eff.get(str(result["threads"][0]), {})
    rows = []

    def add(measure, now, target, ok, how):
        met = "–" if ok is None else ("met" if ok else "NOT met")
        rows.append(f"| {measure} | {now} | {target} | {met} | {how} |")

    v = first.get("infer_vs_authors")
    add("inference forward vs the authors' model, N 4096", _fmt(v, ".2f", "×"), "≥ 2×", None if v is None else v >= 2, "t_authors / t_primal, infer level")
    v = first.get("infer_floor_fraction")
    add("inference forward, fraction of its floor", _fmt(None if v is None else 100 * v, ".0f", " %"), "≥ 75 %", None if v is None else v >= 0.75, "counted FLOP / bytes at the measured peaks")
    v = first.get("layer_floor_fraction")
    add("layer fwd+bwd, fraction of its floor", _fmt(None if v is None else 100 * v, ".0f", " %"), "≥ 70 %", None if v is None else v >= 0.70, "analytic floor / time")
    vals = [eff.get(str(t), {}).get("layer_vs_authors") for t in result["threads"]]
    got = [v for v in vals if v is not None]
    add(f"layer + KSVD fwd+bwd vs the authors' ({', '.join(map(str, result['threads']))} threads)",
        " / ".join(_fmt(v, ".2f", "×") for v in vals), "≥ 2.7×", None if not got else min(got) >= 2.7, "t_authors / t_primal, layer level")
    vals = [eff.get(str(t), {}).get("train_vs_authors") for t in result["threads"]]
    got = [v for v in vals if v is not None]
    add("model training step vs the authors' (the bench's workload: dropout 0.1)", " / ".join(_fmt(v, ".2f", "×") for v in vals),
        "≥ 2.0×", None if not got else min(got) >= 2.0, "t_authors / t_primal, train level")
    ctxs = sorted({c["context"] for c in cells if c["kind"] == "primalformer" and c["batch"] == 1})
    ratios = [(c, cell("primalformer", 1, c)) for c in ctxs]
    steps = [r.get("step_tok_s", 0) / r["base_tok_s"] for _, r in ratios if r.get("base_tok_s")]
    add("all-primal LM decode, batch 1, tokens/s vs --base",
        f"{_fmt(min(steps) if steps else None, '.2f', '×')}–{_fmt(max(steps) if steps else None, '.2f', '×')}",
        "≥ 0.9×", None if not steps else min(steps) >= 0.9,
        f"contexts {', '.join(str(c) for c in ctxs)}; generate's loop in both")
    hf_ctx = 16384 if cell("gpt2-hf", 1, 16384) else max((c["context"] for c in cells if c["kind"] == "gpt2-hf"), default=None)
    p, h = cell("primalformer", 1, hf_ctx), cell("gpt2-hf", 1, hf_ctx)
    v = p["step_tok_s"] / h["hf_tok_s"] if p.get("step_tok_s") and h.get("hf_tok_s") else None
    add(f"all-primal LM decode vs HF GPT-2 (KV cache) at {hf_ctx} context, batch 1", _fmt(v, ".1f", "×"), "≥ 20×",
        None if v is None else v >= 20, h.get("skipped", "step tokens/s / HF tokens/s"))
    mem = result.get("memory", {})
    rows_m = [r for r in mem.get("rows", []) if "state_mib" in r]
    if rows_m:
        lo, hi = rows_m[0], rows_m[-1]
        growth = [r.get("rss_growth_mib") for r in rows_m]
        sizes = [round(r["state_mib"] * 2**20) for r in rows_m]
        # The cache of 4 layers (Σ[q | k] of 2D floats + a count each, and the decoding constants, which
        # DecodeCache.nbytes counts) is the same at every context; the RSS growth while decoding at most 9 MiB.
        add(f"decode cache / RSS growth, {lo['context']} to {hi['context']} context, all-primal",
            " / ".join(f"{b} B" for b in sizes) + "; RSS growth " + " / ".join(_fmt(g, ".1f", " MiB") for g in growth),
            "unchanged in N / ≤ 9 MiB", len(set(sizes)) == 1 and all(g is not None and g <= 9 for g in growth),
            "primal bench --level decode cells (fresh process each)")
    return ["| measure | now | target | met | how |", "|---|---|---|---|---|", *rows]


def render(result: dict) -> str:
    lines = [f"# Performance check ({result['started']}, {result['threads']} threads for the efficiency rows, "
             f"{result['decode_threads']} for decoding)", "", f"Command: `{result['command']}`", "", *target_table(result), "",
             "## Decoding cells (tokens/s, median of interleaved rounds)", "",
             "| model | batch | context | --base (generate's loop) | now (step with a DecodeCache) | HF GPT-2 | cache (KiB) |",
             "|---|---|---|---|---|---|---|"]
    for c in result["decode"]:
        why = c.get("skipped") or c.get("error")
        lines.append(f"| {c['kind']} | {c['batch']} | {c['context']} | {_fmt(c.get('base_tok_s'), '.0f')} | "
                     f"{_fmt(c.get('step_tok_s'), '.0f')} | "
                     f"{_fmt(c.get('hf_tok_s'), '.0f')} | {_fmt(None if 'state_bytes' not in c else c['state_bytes'] / 1024, '.0f')} |"
                     + (f" {why}" if why else ""))
    lines += ["", "## Efficiency rows", "", "```", json.dumps(result["efficiency"], indent=1), "```", ""]
    return "\n".join(lines)


BEGIN, END = "<!-- perf_check:begin -->", "<!-- perf_check:end -->"


def put_section(page: Path, result: dict) -> None:
    """The performance target table, with its command and date, between the markers of ``page``."""
    section = "\n".join([BEGIN, "## Performance targets (scripts/perf_check.py)", "",
                          f"Measured {result['started']} with `{result['command']}` (ratios side by side in one run; "
                          "decoding cells in fresh processes, methods interleaved, median of rounds).", "",
                          *target_table(result), "", END])
    text = page.read_text() if page.is_file() else ""
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + section + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    page.write_text(text)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cell", help=argparse.SUPPRESS)
    p.add_argument("--short", action="store_true", help="a few minutes: contexts 1K and 16K, batch 1 and 32 up to 4K, "
                   "2 rounds of 16 tokens, efficiency at 1 thread with 1 repeat")
    p.add_argument("--out", default=None, help="output folder (default perf_check-<time>)")
    p.add_argument("--base", default="main", help="git ref of today's code (default main)")
    p.add_argument("--git", default=str(ROOT), help="the git checkout that --base is read from (default this one)")
    p.add_argument("--authors-repo", default=os.environ.get("PRIMAL_AUTHORS_REPO"),
                   help="the authors' code (an export, or the git mirror) for the efficiency rows")
    p.add_argument("--threads", default="1,2", help="threads of the efficiency rows (default 1,2)")
    p.add_argument("--decode-threads", type=int, default=1)
    p.add_argument("--contexts", default=None, help="decoding contexts (default 1024,...,65536)")
    p.add_argument("--batches", default="1,32")
    p.add_argument("--tokens", type=int, default=None)
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--memory-budget-gb", type=float, default=6.0, help="skip decoding cells whose KV caches need more")
    p.add_argument("--skip-efficiency", action="store_true")
    p.add_argument("--doc", action="append", default=[],
                   help="also put the target table into this markdown page (repeatable: docs/results/efficiency.md, "
                        "docs/results/lm.md), between <!-- perf_check --> markers, replaced on a rerun (appended the "
                        "first time); run it after `primal bench --doc`, which rewrites the efficiency page")
    args = p.parse_args()
    # This checkout's code, here and in every process started below (an installed primal_attention,
    # e.g. an editable install of another checkout, would otherwise win in the decode cells).
    sys.path.insert(0, str(ROOT / "src"))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    if args.cell:
        print(json.dumps(decode_cell(json.loads(args.cell))))
        return 0
    short = args.short
    contexts = [int(c) for c in (args.contexts or ("1024,16384" if short else "1024,4096,16384,65536")).split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    threads = [int(t) for t in ("1" if short and args.threads == "1,2" else args.threads).split(",")]
    tokens = args.tokens or (16 if short else 64)
    rounds = args.rounds or (2 if short else 5)
    out = Path(args.out or f"perf_check-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="perf_check_"))
    env = {**os.environ, "OMP_NUM_THREADS": str(args.decode_threads), "MALLOC_MMAP_THRESHOLD_": "65536",
           "PYTHONPATH": os.environ["PYTHONPATH"]}
    result: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "command": shown_command([sys.executable, *sys.argv]),
                    "threads": threads, "decode_threads": args.decode_threads, "shape": SHAPE, "decode": [],
                    "efficiency": {}}
    base = str(export_base(args.base, tmp, Path(args.git)))
    for batch in batches:
        for context in contexts:
            for kind in (*KINDS, "gpt2-hf"):
                spec = {"kind": kind, "batch": batch, "context": context, "tokens": tokens, "rounds": rounds,
                        "threads": args.decode_threads, "base": base}
                need = _kv_bytes(kind, batch, context) * (3 if kind != "gpt2-hf" else 2)
                if short and batch > 1 and context > 4096:
                    continue
                if need > args.memory_budget_gb * 2**30:
                    row = {"kind": kind, "batch": batch, "context": context,
                           "skipped": f"KV caches need {need / 2**30:.1f} GiB > --memory-budget-gb {args.memory_budget_gb}"}
                else:
                    row = run_cell(spec, env)
                result["decode"].append(row)
                print(json.dumps(row), flush=True)
    from primal_attention.bench import decode

    mem_ctx = (contexts[0], contexts[-1])
    cfg = decode.DecodeConfig(models=("primalformer",), contexts=mem_ctx, prefill_max=0, new_tokens=tokens,
                              threads=args.decode_threads)
    assert Path(decode.__file__).resolve().is_relative_to(ROOT / "src"), decode.__file__
    result["memory"] = decode.run_decode(cfg, progress=True)
    if not args.skip_efficiency:
        authors = export_authors(args.authors_repo, tmp) if args.authors_repo else None
        env_e = {**env, "OMP_NUM_THREADS": str(max(threads))}
        for t in threads:
            result["efficiency"][str(t)] = efficiency(out, t, 1 if short else 3, authors, "train,layer,infer", env_e)
            print(json.dumps(result["efficiency"][str(t)]), flush=True)
    (out / "perf_check.json").write_text(json.dumps(result, indent=1))
    (out / "perf_check.md").write_text(render(result))
    for page in args.doc:
        put_section(Path(page), result)
    print("\n".join(target_table(result)))
    print(f"wrote {out / 'perf_check.json'} and {out / 'perf_check.md'}")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
