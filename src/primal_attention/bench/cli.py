"""``primal bench``: the arguments and what the subcommand runs."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from primal_attention.bench.grid import PRESETS, with_overrides
from primal_attention.bench.methods import METHODS
from primal_attention.bench.workloads import DTYPES, LEVELS, MODES


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from err
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return tuple(sorted(set(values)))


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _choices(allowed: tuple[str, ...] | list[str]):
    def parse(text: str) -> tuple[str, ...]:
        values = tuple(v.strip() for v in text.split(",") if v.strip())
        bad = [v for v in values if v not in allowed]
        if bad or not values:
            raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {', '.join(allowed)}, got {text!r}")
        return values

    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="the quick grid (training step, fp32 eager, N 256-4096; < 3 min on 2 cores)")
    p.add_argument("--preset", choices=sorted(PRESETS), default=None, help="grid preset (default full; --quick = quick)")
    p.add_argument("--out", default=None, help="output directory (default bench_results/<preset>-<time>)")
    p.add_argument("--levels", type=_choices((*LEVELS, "decode")),
                   help=f"comma-separated subset of {','.join(LEVELS)},decode (decode: language-model decoding, tokens/s and "
                        "memory vs context; --seq-lens are its contexts, default 1K-64K)")
    p.add_argument("--decode-models", type=_choices(("transformer", "primal+", "primalformer", "gpt2-hf",
                                                      "gpt2-hf-primal", "window32-primalformer",
                                                      "window128-primalformer")),
                   help="models of the decode level (default transformer,primal+,primalformer; gpt2-hf: Hugging Face "
                        "GPT-2 of the same shape with its KV cache; gpt2-hf-primal: that GPT-2 with every layer "
                        "primalized, decoding through HF's forward and cache; both need transformers; "
                        "window32-primalformer / window128-primalformer: every layer window + primal)")
    p.add_argument("--seq-lens", type=_ints, help="comma-separated N, e.g. 256,1024,4096")
    p.add_argument("--batch", type=_positive_int)
    p.add_argument("--dtypes", type=_choices(DTYPES), help="fp32,bf16 (bf16 = autocast)")
    p.add_argument("--modes", type=_choices(MODES), help="eager,compile")
    p.add_argument("--methods", type=_choices(list(METHODS)), help=f"subset of {','.join(METHODS)}")
    p.add_argument("--compile-methods", type=_choices(list(METHODS)), help="methods also run under torch.compile")
    p.add_argument("--repeats", type=_positive_int)
    p.add_argument("--warmup", type=int)
    p.add_argument("--time-budget", type=float, dest="time_budget_s", help="seconds per call before a method stops")
    p.add_argument("--memory-budget-gb", type=float, help="GB per call before a method stops (default: half the free memory)")
    p.add_argument("--max-minutes", type=float, help="stop the whole grid (marked) after this long")
    p.add_argument("--device", help="cpu or cuda[:i]")
    p.add_argument("--threads", type=_positive_int, help="torch threads (default: torch's)")
    p.add_argument("--no-memory", action="store_true", help="skip the isolated peak-memory measurement")
    p.add_argument("--authors-repo", help="an export of the authors' repository (yingyichen-cyy/PrimalAttention): "
                   "enables the `authors` method (their PrimalFormer, run side by side)")
    p.add_argument("--doc", help="also write the efficiency page here (e.g. docs/results/efficiency.md)")
    p.add_argument("--gpu-json", help="a GPU run's results.json to fill the page's GPU section")
    p.add_argument("--from-json", help="re-render tables, plots (and --doc) from existing results.json files (comma-separated runs of "
                   "disjoint grids are merged); runs nothing")


def run(args: argparse.Namespace) -> int:
    from primal_attention.bench import report

    preset = args.preset or ("quick" if args.quick else "full")
    if args.authors_repo:
        from primal_attention.bench.authors import ENV, unavailable_reason

        os.environ[ENV] = str(Path(args.authors_repo).resolve())
        reason = unavailable_reason()
        if reason is not None:
            print(f"primal bench: --authors-repo: {reason}", file=sys.stderr)
            return 2
    if args.from_json:
        sources = [Path(v) for v in args.from_json.split(",") if v.strip()]
        missing = [str(v) for v in sources if not v.is_file()]
        if missing:
            print(f"primal bench: --from-json: no such file: {', '.join(missing)}", file=sys.stderr)
            return 2
        result = report.merge([report.load(v) for v in sources])
        out = Path(args.out) if args.out else sources[0].parent
    elif args.levels and "decode" in args.levels:
        return _run_decode(args, preset)
    else:
        from primal_attention.bench.harness import run_grid

        config = with_overrides(
            PRESETS[preset],
            levels=args.levels, seq_lens=args.seq_lens, batch=args.batch, dtypes=args.dtypes, modes=args.modes,
            methods=args.methods, compile_methods=args.compile_methods, repeats=args.repeats, warmup=args.warmup,
            time_budget_s=args.time_budget_s, memory_budget_gb=args.memory_budget_gb,
            max_total_s=None if args.max_minutes is None else args.max_minutes * 60, device=args.device,
            threads=args.threads, measure_memory=False if args.no_memory else None,
        )
        out = Path(args.out) if args.out else Path("bench_results") / f"{preset}-{time.strftime('%Y%m%d-%H%M%S')}"
        result = run_grid(config)
    paths = report.write_outputs(result, out)
    if args.doc:
        from primal_attention.bench.doc import write_doc

        gpu = report.load(Path(args.gpu_json)) if args.gpu_json else None
        paths["doc"] = write_doc(result, Path(args.doc), json_path=paths["json"], plots_dir=out, gpu=gpu)
    analysis = json.loads(paths["json"].read_text())["analysis"]
    for t in analysis["targets"]:
        met = "–" if t["met"] is None else ("met" if t["met"] else "NOT met")
        val = "–" if t["value"] is None else f"{t['value']:.2f}"
        print(f"target {t['target']}: {val} (goal {t['goal']}) {met}")
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0


def _run_decode(args: argparse.Namespace, preset: str) -> int:
    """The decode level (alone, or before the grid's other levels into the same --out)."""
    from primal_attention.bench import decode

    cfg = decode.DecodeConfig(
        models=args.decode_models or decode.DECODE_MODELS,
        contexts=args.seq_lens or decode.DEFAULT_CONTEXTS, batch=args.batch or 1, threads=args.threads or 1,
        device=args.device or "cpu",
    )
    out = Path(args.out) if args.out else Path("bench_results") / f"decode-{time.strftime('%Y%m%d-%H%M%S')}"
    result = decode.run_decode(cfg, max_total_s=None if args.max_minutes is None else args.max_minutes * 60)
    for kind, path in decode.write_outputs(result, out).items():
        print(f"{kind}: {path}")
    rest = tuple(level for level in args.levels if level != "decode")
    if rest:
        args.levels, args.out = rest, str(out)
        return run(args)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="primal bench", description="efficiency benchmark grid")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
