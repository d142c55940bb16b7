"""The ``primal`` command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path


def _selfcheck(args: argparse.Namespace) -> int:
    import torch

    from primal_attention import PrimalAttention, ksvd_terms
    from primal_attention.layers.primal import IMPLS
    from primal_attention.bench.timing import time_callable
    from primal_attention.selfcheck import check_case, reference_files

    if args.dim % args.heads:
        print(f"primal selfcheck: error: --heads {args.heads} must divide --dim {args.dim}", file=sys.stderr)
        return 2
    if args.json and not os.access(Path(args.json).resolve().parent, os.W_OK):
        print(f"primal selfcheck: error: --json {args.json}: its folder is not a writable directory", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    dirs = [Path(d) for d in args.reference_dir]
    ok = True
    print(f"{'reference case':32s} {'path':9s} " + " ".join(f"{k:>13s}" for k in ("out", "J batch", "J sample", "grad x")))
    for path in reference_files(*dirs):
        for impl in IMPLS:
            r = check_case(path, impl=impl)
            ok &= r.passed()
            errs = [r.errors.get(k) for k in ("out", "ksvd_j_batch", "ksvd_j_sample", "grad_x")]
            cells = " ".join(f"{e:13.2e}" if e is not None else f"{'-':>13s}" for e in errs)
            print(f"{r.name:32s} {impl:9s} {cells}")
    print("reference vectors:", "all within rtol 1e-5 / atol 1e-6" if ok else "MISMATCH")

    b, n, d, h, s, m = args.batch, args.seq_len, args.dim, args.heads, args.rank, args.num_samples
    layer = PrimalAttention(d, h, s, num_samples=m)
    x = torch.randn(b, n, d, requires_grad=True)
    result: dict[str, object] = {"shape": dict(B=b, N=n, D=d, H=h, s=s, n=m), "threads": torch.get_num_threads()}

    def step() -> None:
        with ksvd_terms(layer) as terms:
            out = layer(x)
            (out.square().mean() + terms.objective() ** 2).backward()

    for impl in IMPLS:
        layer.impl = impl
        t = time_callable(step, warmup=1, repeats=args.repeats)
        result[impl] = t.as_dict()
    ratio = result["reference"]["median"] / result["fast"]["median"]
    result["reference_over_fast"] = ratio
    print(
        f"layer + KSVD, forward+backward, B {b} N {n} D {d} H {h} s {s} n {m} ({result['threads']} threads): "
        f"fast {result['fast']['median'] * 1e3:.1f} ms, reference {result['reference']['median'] * 1e3:.1f} ms, "
        f"ratio {ratio:.2f}x"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0 if ok else 1


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"--seeds expects comma-separated integers, got {text!r}") from err
    if not seeds:
        raise argparse.ArgumentTypeError("--seeds needs at least one seed")
    if any(not 0 <= s < 2**32 for s in seeds):
        raise argparse.ArgumentTypeError(f"--seeds must be integers in [0, 2**32), got {text!r}")
    if len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"--seeds repeats a seed: {text!r}")
    return seeds


def _resume_command(args: argparse.Namespace, out: Path) -> str:
    """The command that continues this ``primal train``: the same config, overrides, seeds and --out."""
    import shlex

    argv = ["primal", "train", args.config, "--out", str(out)]
    for assignment in args.set:
        argv += ["--set", assignment]
    if args.seeds:
        argv += ["--seeds", ",".join(map(str, args.seeds))]
    return shlex.join([*argv, "--resume"])


#: exit codes of a stopped ``primal train``: 128 + the signal number, the shell's convention.
EXIT_SIGINT, EXIT_SIGTERM = 130, 143


def _train(args: argparse.Namespace) -> int:
    import signal
    import threading

    from primal_attention.data.base import DataError
    from primal_attention.train.checkpoint import CheckpointError
    from primal_attention.train.config import ConfigError
    from primal_attention.train.load import load_config
    from primal_attention.train.trainer import Interrupted, RunError, run_seeds

    terminated = []

    def on_sigterm(signum, frame) -> None:
        # Stop as Ctrl-C does (the trainer turns it into Interrupted; checkpoints are written atomically);
        # a second SIGTERM while stopping is ignored so the clean-up finishes.
        if not terminated:
            terminated.append(signum)
            raise KeyboardInterrupt

    # Only the main thread may set a handler (main() may be called from another one).
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, on_sigterm) if main_thread else None
    out = None
    try:
        cfg = load_config(args.config, args.set)
        out = Path(args.out) if args.out else Path("runs") / cfg.name
        summary = run_seeds(cfg, out, args.seeds or [cfg.train.seed], resume=args.resume, overwrite=args.overwrite)
    except (Interrupted, KeyboardInterrupt) as stop:
        what = "terminated by SIGTERM" if terminated else "interrupted"
        where = f" at epoch {stop.epoch:.2f}, step {stop.step}" if isinstance(stop, Interrupted) else ""
        then = f"; continue with --resume: {_resume_command(args, out)}" if out is not None else ""
        print(f"primal train: {what}{where}{then}", file=sys.stderr)
        return EXIT_SIGTERM if terminated else EXIT_SIGINT
    except (CheckpointError, ConfigError, DataError, RunError) as err:
        print(f"primal train: error: {err}", file=sys.stderr)
        return 2
    finally:
        if main_thread:  # None: the previous handler was not set from Python
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
    if int(os.environ.get("RANK", "0")) == 0:
        from primal_attention.train.families import get_family

        wanted = (*get_family(cfg.data.family).summary_metrics, "wall_time_s")
        keys = [k for k in wanted if k in summary]
        print(f"{cfg.name} ({summary['protocol']} protocol, seeds {summary['seeds']}) -> {out}")
        for k in keys:
            v = summary[k]
            print(f"  {k:15s} {v['mean']:.4f} ± {v['std']:.4f}")
    return 0


def _sweep(args: argparse.Namespace) -> int:
    from primal_attention.data.base import DataError
    from primal_attention.train.checkpoint import CheckpointError
    from primal_attention.train.config import ConfigError
    from primal_attention.train.sweep import parse_grid, run_sweep
    from primal_attention.train.trainer import Interrupted, RunError

    try:
        grid = parse_grid(args.grid)
        out = Path(args.out)
        report = run_sweep(args.config, grid, out, store=args.store, sweep_seed=args.sweep_seed, final_seeds=args.seeds,
                           overrides=args.set, threads=args.threads, workers=args.workers)
    except Interrupted as stop:
        print(f"primal sweep: {stop}; run the same command again to continue", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("primal sweep: interrupted; run the same command again to continue", file=sys.stderr)
        return 130
    except (CheckpointError, ConfigError, DataError, RunError, RuntimeError) as err:
        print(f"primal sweep: error: {err}", file=sys.stderr)
        return 2
    store = Path(args.store or args.out)
    metric = report["selection"]["metric"]
    print(f"{report['name']}: chose {report['chosen']} on {metric} -> {store / 'sweep.md'}")
    for key, v in report["final"].items():
        print(f"  {key:18s} {v['mean']:.4f} ± {v['std']:.4f} (n={v['n']})")
    return 0


def _baselines(args: argparse.Namespace) -> int:
    from primal_attention.data.base import DataError
    from primal_attention.train.config import ConfigError
    from primal_attention.train.load import load_config
    from primal_attention.train.trivial import trivial_baselines

    try:
        cfg = load_config(args.config, args.set)
        result = {f"seed_{s}": trivial_baselines(cfg, seed=s) for s in args.seeds}
    except (ConfigError, DataError) as err:
        print(f"primal baselines: error: {err}", file=sys.stderr)
        return 2
    text = json.dumps(result, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)
    return 0


def _eval_one(path: Path, last: bool) -> dict:
    from primal_attention.train.checkpoint import CheckpointError
    from primal_attention.train.families import get_family
    from primal_attention.train.run import load_run

    run = load_run(path, last=last)
    task = get_family(run.cfg.data.family).task
    if run.checkpoint is None:
        raise CheckpointError(f"{path} is a config, not a trained run")
    result = {"checkpoint": str(run.checkpoint), "weights": run.weights}
    for name, data in (("val", run.splits.val), ("test", run.splits.test)):
        if data is not None:
            result[name] = task.evaluate(run.model, data, run.cfg.train.eval_batch_size, run.device)
    return result


def _eval(args: argparse.Namespace) -> int:
    from primal_attention.data.base import DataError
    from primal_attention.train.checkpoint import CheckpointError
    from primal_attention.train.config import ConfigError

    path = Path(args.checkpoint)
    seeds = sorted(d for d in path.glob("seed_*") if (d / "config.yaml").is_file()) if path.is_dir() else []
    try:
        if seeds and not (path / "config.yaml").is_file():  # the folder `primal train --out` wrote
            result = {d.name: _eval_one(d, args.last) for d in seeds}
        else:
            result = _eval_one(path, args.last)
    except (CheckpointError, ConfigError, DataError) as err:
        print(f"primal eval: error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2))
    return 0


def _data_fetch(args: argparse.Namespace) -> int:
    from primal_attention.data.base import DataError
    from primal_attention.train.families import fetch_dataset

    try:
        print(fetch_dataset(args.name, data_dir=args.data_dir, vocab_size=args.vocab_size))
    except (DataError, ValueError) as err:
        print(f"primal data fetch: error: {err}", file=sys.stderr)
        return 2
    return 0


def _collect_rl(args: argparse.Namespace) -> int:
    from primal_attention.data.base import DataError
    from primal_attention.data.rl_collect import CollectConfig, collect_rl

    cfg = CollectConfig(args.env, seed=args.seed, medium_fraction=args.medium_fraction,
                        medium_max_steps=min(args.medium_max_steps, args.expert_steps), expert_steps=args.expert_steps,
                        chunk=args.chunk, learning_starts=args.learning_starts, eval_episodes=args.eval_episodes,
                        transitions=args.transitions, threads=args.threads)
    try:
        card = collect_rl(cfg)
    except (DataError, ValueError) as err:
        print(f"primal data collect-rl: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("primal data collect-rl: interrupted; run the same command again to continue", file=sys.stderr)
        return 130
    med = card["medium_policy"]
    print(f"{card['env']}: medium policy at {med['steps']} SAC steps (eval return {med['return']:.0f}, target "
          f"{med['target']:.0f}{'' if med['reached'] else ', NOT reached: best so far'}), expert at "
          f"{card['expert_policy']['steps']} steps (return {card['expert_policy']['return']:.0f})")
    for name, d in card["datasets"].items():
        print(f"  {name:13s} {d['transitions']:8d} transitions, {d['episodes']:5d} episodes, return "
              f"{d['return_mean']:7.1f} ± {d['return_std']:6.1f} (score {d['score_mean']:5.1f}): {d['file']}")
    return 0


def _generate(args: argparse.Namespace) -> int:
    import torch

    from primal_attention.train.checkpoint import CheckpointError
    from primal_attention.train.config import ConfigError
    from primal_attention.train.run import load_lm_run

    try:
        args.prompt.encode("utf-8")
    except UnicodeEncodeError as err:  # bytes that are not UTF-8 reach argv as lone surrogates
        print(f"primal generate: error: --prompt must be UTF-8 text; it holds a byte that is not UTF-8 at "
              f"character {err.start}", file=sys.stderr)
        return 2
    run_dir = Path(args.run)
    if run_dir.is_dir() and not (run_dir / "config.yaml").is_file() and any(run_dir.glob("seed_*/config.yaml")):
        seeds = ", ".join(sorted(d.parent.name for d in run_dir.glob("seed_*/config.yaml")))
        print(f"primal generate: error: {run_dir} is the --out folder of primal train; generate from one of its "
              f"seed folders ({seeds}), e.g. {run_dir / seeds.split(', ')[0]}", file=sys.stderr)
        return 2
    try:
        run = load_lm_run(args.run, last=args.last)
    except (CheckpointError, ConfigError) as err:
        print(f"primal generate: error: {err}", file=sys.stderr)
        return 2
    tok = run.tokenizer
    ids = tok.encode(args.prompt) or [tok.eot_id]  # an empty prompt starts a new document
    context = run.model.config.max_seq_len
    if len(ids) + args.max_new_tokens > context:
        print(f"primal generate: error: the prompt ({len(ids)} tokens) + --max-new-tokens {args.max_new_tokens} "
              f"exceeds the model's context of {context} tokens", file=sys.stderr)
        return 2
    if not args.temperature >= 0:  # also NaN
        print(f"primal generate: error: --temperature must be >= 0, got {args.temperature}", file=sys.stderr)
        return 2
    generator = torch.Generator(device=run.device).manual_seed(args.seed)
    prompt = torch.tensor([ids] * args.num_samples, dtype=torch.int64, device=run.device)
    out = run.model.generate(prompt, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                             generator=generator)
    for i, row in enumerate(out.tolist()):
        if args.num_samples > 1:  # samples may hold newlines: a header line separates them
            print(f"=== sample {i} ===")
        print(tok.decode(row if args.prompt else row[1:]))
    return 0


def _spectrum(args: argparse.Namespace) -> int:
    from primal_attention.analysis.spectrum_command import spectrum_command

    return spectrum_command(args.target, split=args.split, max_examples=args.max_examples, batch_size=args.batch_size,
                            group_size=args.group_size, out=args.out, last=args.last, overrides=args.set,
                            ksvd=args.ksvd)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from err
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _generator_seed(text: str) -> int:
    """A seed torch.Generator.manual_seed takes: an integer in [0, 2**64)."""
    try:
        value = int(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from err
    if not 0 <= value < 2**64:
        raise argparse.ArgumentTypeError(f"expected an integer in [0, 2**64), got {value}")
    return value


def _directory(text: str) -> str:
    if not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text} is not a directory")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="primal", description="Primal-Attention: train, benchmark, analyse.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("selfcheck", help="reproduce the authors' reference vectors and time the layer")
    p.add_argument("--reference-dir", action="append", default=[], type=_directory, help="extra directory of reference .npz files")
    p.add_argument("--batch", type=_positive, default=8)
    p.add_argument("--seq-len", type=_positive, default=4096)
    p.add_argument("--dim", type=_positive, default=64)
    p.add_argument("--heads", type=_positive, default=2)
    p.add_argument("--rank", type=_positive, default=20)
    p.add_argument("--num-samples", type=_positive, default=200)
    p.add_argument("--repeats", type=_positive, default=5)
    p.add_argument("--json", help="write the timing as JSON here")
    p.set_defaults(func=_selfcheck)

    p = sub.add_parser("train", help="train a model from a YAML config (one run per seed)")
    p.add_argument("config", help="experiment YAML, e.g. configs/uea/JapaneseVowels_primal+.yaml")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config value, e.g. train.epochs=5")
    p.add_argument("--out", help="output directory (default runs/<name>)")
    p.add_argument("--seeds", type=_seeds, help="comma-separated seeds, e.g. 0,1,2 (default: train.seed)")
    p.add_argument("--resume", action="store_true",
                   help="continue interrupted runs, skip finished seeds (the config must be the one they were trained with)")
    p.add_argument("--overwrite", action="store_true", help="remove runs already in --out (checkpoints, TensorBoard) first")
    p.set_defaults(func=_train)

    p = sub.add_parser("sweep", help="sweep a config over a grid, select on validation, then train the choice with several seeds")
    p.add_argument("config", help="experiment YAML (trained under the holdout protocol whatever it says)")
    p.add_argument("--grid", action="append", required=True, metavar="KEY=V1,V2,...",
                   help="values to sweep, e.g. optim.lr=1e-4,3e-4,1e-3,3e-3 (repeat for more keys: their product)")
    p.add_argument("--out", required=True, help="sweep directory (run folders, checkpoints, locks)")
    p.add_argument("--store", help="where the JSON results and sweep.md go (default: --out)")
    p.add_argument("--sweep-seed", type=int, default=0, help="the one seed every grid point is trained with")
    p.add_argument("--seeds", type=_seeds, default=[1, 2, 3],
                   help="final seeds of the chosen point, fresh runs never equal to --sweep-seed (default 1,2,3)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config value at every point")
    p.add_argument("--threads", type=_positive, default=1, help="torch threads per run")
    p.add_argument("--workers", type=_positive, default=1, help="processes sharing the grid (each a run at a time)")
    p.set_defaults(func=_sweep)

    p = sub.add_parser("baselines", help="trivial baselines (majority class, position-blind, ...) on a config's holdout splits")
    p.add_argument("config", help="experiment YAML")
    p.add_argument("--seeds", type=_seeds, default=[0], help="validation splits drawn with these seeds (default 0)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config value")
    p.add_argument("--json", help="also write the result here")
    p.set_defaults(func=_baselines)

    data = sub.add_parser("data", help="prepare datasets")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    p = data_sub.add_parser("fetch", help="fetch / generate and cache a dataset")
    p.add_argument("name", help="an LRA task (listops, text, retrieval, image, pathfinder), fsdd, lm (the language-model "
                                "corpora: Shakespeare, Milton, KJV Bible), or a UEA dataset name")
    p.add_argument("--data-dir", help="UEA: where to download the archive files (default: the cache)")
    p.add_argument("--vocab-size", type=_positive, default=4096, help="lm: train (or load) the BPE of this size and report token counts")
    p.set_defaults(func=_data_fetch)
    p = data_sub.add_parser("collect-rl", help="collect D4RL-style datasets (medium, medium-replay, medium-expert) with SAC; resumable")
    p.add_argument("env", help="hopper, halfcheetah or walker2d")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--medium-fraction", type=float, default=1 / 3, help="medium level: this share of D4RL's expert return")
    p.add_argument("--medium-max-steps", type=_positive, default=300_000, help="SAC steps after which the best policy so far is the medium one")
    p.add_argument("--expert-steps", type=_positive, default=1_000_000, help="SAC steps in all (the expert policy)")
    p.add_argument("--chunk", type=_positive, default=10_000, help="SAC steps between checkpoints and evaluations")
    p.add_argument("--learning-starts", type=int, default=10_000, help="random steps before SAC updates")
    p.add_argument("--eval-episodes", type=_positive, default=5)
    p.add_argument("--transitions", type=_positive, default=1_000_000, help="rollout steps per policy (D4RL: 1M)")
    p.add_argument("--threads", type=_positive, default=1)
    p.set_defaults(func=_collect_rl)

    p = sub.add_parser("eval", help="evaluate a trained run: a seed's run directory, a ckpt-* directory, or the --out folder of primal train (every seed)")
    p.add_argument("checkpoint")
    p.add_argument("--last", action="store_true", help="use the last weights even where a holdout-selected best exists")
    p.set_defaults(func=_eval)

    p = sub.add_parser("generate", help="continue a prompt with a trained language model (a run of data.family lm)")
    p.add_argument("run", help="a run directory (e.g. runs/x/seed_0) or a ckpt-* directory")
    p.add_argument("--prompt", default="", help="text to continue (default: start a new document)")
    p.add_argument("--max-new-tokens", type=_positive, default=100)
    p.add_argument("--temperature", type=float, default=1.0, help="0 = greedy decoding")
    p.add_argument("--top-k", type=_positive, default=None, help="sample among the k most likely tokens")
    p.add_argument("--num-samples", type=_positive, default=1, help="continuations of the same prompt (a batch)")
    p.add_argument("--seed", type=_generator_seed, default=0, help="seed of the sampling generator")
    p.add_argument("--last", action="store_true", help="use the last weights instead of the val-selected ones")
    p.set_defaults(func=_generate)

    p = sub.add_parser("spectrum", help="singular value spectra of the attention layers and KSVD diagnostics")
    p.add_argument("target", help="a run directory (e.g. runs/x/seed_0), a ckpt-* directory, or a YAML config (untrained)")
    p.add_argument("--split", default="test", choices=("train", "val", "test"))
    p.add_argument("--max-examples", type=_positive, default=200, help="analyse the first N examples of the split")
    p.add_argument("--batch-size", type=_positive, default=16, help="examples per forward / batched SVD")
    p.add_argument("--group-size", type=_positive, default=1, help="pool this many consecutive same-kind layers per curve")
    p.add_argument("--out", help="output directory (default RUN_DIR/spectrum_<split>)")
    p.add_argument("--last", action="store_true", help="use the last weights even where a holdout-selected best exists")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a value of a config target")
    p.add_argument("--ksvd", action="store_true",
                   help="also each primal layer's distances to the exact KSVD solution of its kernel (docs/method.md §7)")
    p.set_defaults(func=_spectrum)

    from primal_attention.convert.cli import add_arguments as add_convert_arguments
    from primal_attention.convert.cli import run as run_convert

    p = sub.add_parser("convert", help="convert a trained softmax model (a run, or an HF causal LM with --hf) to "
                       "Primal-Attention: swap layers, attention transfer, fine-tuning; resumable")
    add_convert_arguments(p)
    p.set_defaults(func=run_convert)

    from primal_attention.bench.cli import add_arguments as add_bench_arguments
    from primal_attention.bench.cli import run as run_bench

    p = sub.add_parser("bench", help="efficiency benchmark grid (JSON, markdown, plots)")
    add_bench_arguments(p)
    p.set_defaults(func=run_bench)
    return parser


#: set to 1 to see the traceback of an error that a command reports in one line.
DEBUG_ENV = "PRIMAL_DEBUG"


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``primal`` command. Each command reports the errors it knows in its own words; any other
    exception still ends in one line on stderr (its type and message) and exit status 2, never a
    traceback (``PRIMAL_DEBUG=1`` shows it); Ctrl-C is exit status 130 and SIGTERM 143, each with a message,
    in every command."""
    import signal
    import threading

    args = build_parser().parse_args(argv)
    name = " ".join(str(getattr(args, k)) for k in ("command", "data_command") if getattr(args, k, None))
    terminated: list[int] = []

    def on_sigterm(signum, frame) -> None:
        # SIGTERM stops a command as Ctrl-C does (its own clean-up and message); a second one is ignored
        if not terminated:
            terminated.append(signum)
            raise KeyboardInterrupt

    # `primal train` sets its own handler; only the main thread may set one
    handle = args.command != "train" and threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, on_sigterm) if handle else None
    try:
        code = int(args.func(args) or 0)
        return EXIT_SIGTERM if terminated and code == EXIT_SIGINT else code
    except KeyboardInterrupt:
        what = "terminated by SIGTERM" if terminated else "interrupted"
        print(f"primal {name}: {what}; run the same command again to continue where it can", file=sys.stderr)
        return EXIT_SIGTERM if terminated else EXIT_SIGINT
    except Exception as err:  # noqa: BLE001 - the last guard: one line, not a traceback
        if os.environ.get(DEBUG_ENV):
            raise
        text = " ".join(str(err).split()) or "(no message)"
        print(f"primal {name}: error: {type(err).__name__}: {text[:500]} ({DEBUG_ENV}=1 shows the traceback)",
              file=sys.stderr)
        return 2
    finally:
        if handle:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


if __name__ == "__main__":
    sys.exit(main())
