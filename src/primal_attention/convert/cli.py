"""``primal convert``: a trained run (RUN_DIR) or a Hugging Face causal LM folder (--hf) to Primal-Attention."""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
from pathlib import Path
from typing import Any

from primal_attention.convert.pipeline import FINETUNE_PARTS, TRANSFER_MODES, ConvertOptions


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", nargs="?", help="a run directory of primal train (e.g. runs/lm/seed_0) or a ckpt-* directory")
    p.add_argument("--hf", metavar="PATH", help="instead of RUN: a save_pretrained folder of a transformers causal LM")
    p.add_argument("--hf-class", default="AutoModelForCausalLM", help="its transformers class (default AutoModelForCausalLM)")
    p.add_argument("--hf-data", metavar="FILE", help="with --hf: token blocks, a .pt file holding an int64 tensor (M, N) "
                   "(or a dict with 'train' and optional 'val'), or a .txt file tokenised with the folder's tokenizer")
    p.add_argument("--hf-seq-len", type=int, default=128, help="tokens per block when --hf-data is text")
    p.add_argument("--out", required=True, help="output folder (re-running the same command continues it)")
    p.add_argument("--layers", default="last", help="'last', 'all' or comma-separated layer indices (default last)")
    p.add_argument("--transfer-steps", type=int, default=0, help="attention-transfer steps (per layer in --transfer-mode layer)")
    p.add_argument("--transfer-mode", default="all", choices=TRANSFER_MODES)
    p.add_argument("--finetune-steps", type=int, default=0)
    p.add_argument("--finetune", default="all", choices=FINETUNE_PARTS, help="train the whole model or the new layers and norms")
    p.add_argument("--eta", type=float, default=0.0, help="weight of the KSVD term in transfer and fine-tuning")
    p.add_argument("--window", type=int, metavar="W", help="convert to window + primal layers: softmax over the last W "
                   "tokens beside the primal term, gated per head (the same as --set primal.window=W)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="any conversion option, e.g. primal.rank=16, transfer_lr=3e-3, eval_every=50 (docs/convert.md)")
    p.add_argument("--overwrite", action="store_true", help="remove what --out holds and start afresh")
    p.add_argument("--no-progress", action="store_true")


def _options(args: argparse.Namespace) -> ConvertOptions:
    import yaml

    from primal_attention.convert.subjects import ConvertError

    o = ConvertOptions(layers=args.layers, transfer_steps=args.transfer_steps, transfer_mode=args.transfer_mode,
                       finetune_steps=args.finetune_steps, finetune=args.finetune, eta=args.eta,
                       progress=not args.no_progress)
    names = {f.name: f for f in dataclasses.fields(ConvertOptions)}
    for item in args.set:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ConvertError(f"--set {item!r} must look like key=value")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            raise ConvertError(f"--set {item!r}: the value is not valid YAML") from None
        if key.startswith("primal."):
            o.primal[key.removeprefix("primal.")] = value
        elif key in names and key not in ("primal", "progress"):
            default = getattr(ConvertOptions(), key)
            if isinstance(default, float) and isinstance(value, (int, str)) and not isinstance(value, bool):
                try:
                    value = float(value)
                except ValueError:
                    raise ConvertError(f"--set {key}: expected a number, got {raw!r}") from None
            setattr(o, key, value)
        else:
            raise ConvertError(f"--set: unknown option {key!r}; expected primal.<PrimalAttention option> or one of "
                               f"{', '.join(n for n in names if n not in ('primal', 'progress'))}")
    if args.window is not None:
        if o.primal.get("window", args.window) != args.window:
            raise ConvertError(f"--window {args.window} and --set primal.window={o.primal['window']} disagree; give one")
        o.primal["window"] = args.window
    return o


def _token_blocks(args: argparse.Namespace):
    import torch

    from primal_attention.convert.subjects import ConvertError

    if not args.hf_data:
        raise ConvertError("--hf needs --hf-data: the token blocks to transfer and fine-tune on")
    path = Path(args.hf_data)
    if not path.is_file():
        raise ConvertError(f"--hf-data {path} does not exist")
    if path.suffix == ".txt":
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(args.hf)
        except (OSError, ValueError) as err:
            raise ConvertError(f"--hf-data is text but {args.hf} has no tokenizer ({str(err).splitlines()[0]}); "
                               "give token blocks as a .pt file") from None
        ids = torch.tensor(tokenizer(path.read_text())["input_ids"], dtype=torch.int64)
        n = args.hf_seq_len
        if len(ids) < 2 * n:
            raise ConvertError(f"--hf-data {path} gives {len(ids)} tokens, fewer than two blocks of {n}")
        return ids[: len(ids) // n * n].view(-1, n), None
    try:
        data = torch.load(path, weights_only=True)
    except Exception as err:  # pickle / zip errors of a foreign file
        raise ConvertError(f"--hf-data {path} is not a torch file of token blocks ({err})") from None
    if isinstance(data, dict):
        if "train" not in data:
            raise ConvertError(f"--hf-data {path}: a dict needs the key 'train' (and optionally 'val')")
        return data["train"], data.get("val")
    return data, None


def _hf_model(args: argparse.Namespace):
    import transformers

    from primal_attention.convert.subjects import ConvertError
    from primal_attention.hf import from_pretrained, primal_settings

    folder = Path(args.hf)
    if not (folder / "config.json").is_file():
        raise ConvertError(f"--hf {folder} is not a save_pretrained folder (no config.json)")
    cls = getattr(transformers, args.hf_class, None)
    if not isinstance(cls, type) or not hasattr(cls, "from_pretrained"):
        raise ConvertError(f"--hf-class {args.hf_class!r} is not a transformers model class")
    config = transformers.AutoConfig.from_pretrained(folder)
    if primal_settings(config):
        if args.hf_class.startswith("Auto"):
            raise ConvertError("--hf holds an already primalized model; name its class with --hf-class")
        return from_pretrained(cls, folder)
    try:
        return cls.from_pretrained(folder)
    except (ValueError, OSError) as err:
        raise ConvertError(f"--hf {folder} does not load as {args.hf_class} ({str(err).splitlines()[0]})") from None


def _fmt(metrics: dict[str, Any] | None, keys: tuple[str, ...]) -> str:
    if not metrics:
        return "-"
    return " ".join(f"{k} {metrics[k]:.4g}" for k in keys if k in metrics)


def _check_removable(out: Path) -> None:
    """``--overwrite`` removes only a conversion of ours (its convert.json) or a folder with nothing in it."""
    from primal_attention.convert import ConvertError

    if not out.is_dir():
        raise ConvertError(f"--out {out} is a file, not a conversion folder; refusing to remove it")
    if any(out.iterdir()) and not (out / "convert.json").is_file():
        raise ConvertError(f"--out {out} holds something that is not a conversion (a training run?); --overwrite "
                           "removes only a conversion's folder: choose another --out")


def run(args: argparse.Namespace) -> int:
    from primal_attention.convert import Conversion, ConvertError, HFSubject, Interrupted, RunSubject
    from primal_attention.data.base import DataError
    from primal_attention.train.checkpoint import CheckpointError
    from primal_attention.train.config import ConfigError
    from primal_attention.train.trainer import RunError, run_lock

    out = Path(args.out)
    try:
        if (args.run is None) == (args.hf is None):
            raise ConvertError("give a run directory or --hf PATH (one of them)")
        options = _options(args)
        if args.hf is not None:
            try:
                import transformers  # noqa: F401
            except ImportError:
                raise ConvertError("--hf needs transformers: pip install 'primal-attention[hf]'") from None
            model = _hf_model(args)
            train_ids, val_ids = _token_blocks(args)
            subject = HFSubject(model, train_ids, val_ids, source=str(args.hf))
        else:
            subject = RunSubject(args.run)
        if args.run is not None and Path(args.run).resolve() == out.resolve():
            raise ConvertError(f"--out {out} is the run being converted; choose another --out")
        with run_lock([out], command="primal convert"):
            if args.overwrite and out.exists():
                _check_removable(out)
                shutil.rmtree(out)
            report = Conversion(subject, out, options).run()
    except (ConvertError, CheckpointError, ConfigError, DataError, RunError) as err:
        print(f"primal convert: error: {err}", file=sys.stderr)
        return 2
    except Interrupted as err:
        print(f"primal convert: {err}", file=sys.stderr)
        return 130
    keys = subject.reported
    print(f"converted layers {report['primal_layers']} -> {out}")
    rows = [("original", report["original"]), ("swap only", report["swap"])]
    if "transfer" in report:
        t = report["transfer"]
        rows.append((f"transfer ({t['steps']} steps, {t['cpu_s']:.0f} CPU s)", t))
    if "finetune" in report:
        f = report["finetune"]
        rows.append((f"fine-tuned ({f['steps']} steps, {f['cpu_s']:.0f} CPU s)", report["final"]))
    else:
        rows.append(("final", report["final"]))
    for name, r in rows:
        test = f" test: {_fmt(r['test'], keys)}" if r.get("test") else ""
        print(f"  {name:40s} val: {_fmt(r.get('val'), keys):36s}{test}")
    print(f"  final weights: {report['final']['weights']}; report: {out / 'report.json'}")
    return 0
