"""The training loop: task loss + η·KSVD, evaluation protocols, checkpoints, resume, DDP.

Determinism: the order of the training data is a pure function of (seed, data epoch), so the batch
at any global step is known without saved sampler state; the torch RNG (dropout) is saved with every
checkpoint. A run resumed from a checkpoint therefore follows exactly the same trajectory as an
uninterrupted one (on the same device and thread count).

Distributed: under ``torchrun`` (WORLD_SIZE > 1) each rank takes every world-th example of the
global batch and the model is wrapped in DistributedDataParallel (gloo on CPU, nccl on CUDA). The
losses are scaled so the averaged gradient equals the single-process gradient of the global batch;
that holds exactly for ``ksvd_reduction="sample"`` (a mean over samples), while "batch" computes J
over each rank's share of the batch.
"""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from primal_attention.allocator import retain_freed_memory
from primal_attention.data.base import Batch, SequenceData
from primal_attention.ksvd import ksvd_diagnostics, ksvd_terms, primal_layers
from primal_attention.train.checkpoint import (
    CheckpointError,
    checkpoint_config,
    fit_weights,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    state_tensors,
)
from primal_attention.train.config import ConfigError, ExperimentConfig, config_to_dict, dump_config
from primal_attention.train.load import load_config
from primal_attention.train.data import Splits, build_model, build_splits, train_batch
from primal_attention.train.stats import mean_std
from primal_attention.train.families import get_family
from primal_attention.train.tasks import Task


class RunError(ValueError):
    """A run cannot start or continue: its output directory or config does not allow it, or its
    loss stopped being finite."""


class Interrupted(Exception):
    """Training was interrupted (Ctrl-C / SIGINT) after ``step`` steps; the checkpoints stay intact."""

    def __init__(self, step: int, epoch: float, out: Path) -> None:
        super().__init__(f"interrupted at epoch {epoch:.2f}, step {step}")
        self.step, self.epoch, self.out = step, epoch, out


#: config keys a resumed run may change: cosmetics, and a longer schedule (checked separately).
RESUMABLE_CHANGES = {"train.progress", "train.epochs", "train.steps"}


def config_changes(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two nested config mappings."""
    keys = sorted(set(old) | set(new))
    out = []
    for k in keys:
        a, b, key = old.get(k), new.get(k), f"{prefix}{k}"
        if isinstance(a, dict) and isinstance(b, dict) and k != "attention_options":
            out += config_changes(a, b, key + ".")
        elif a != b:
            out.append(key)
    return out


#: data keys the model is sized from directly (the rest of ``data`` sizes it through the data, and
#: other data gives weights of other shapes, which loading them already refuses).
MODEL_DATA_KEYS = ("data.family", "data.seq_len", "data.options.vocab_size", "data.options.image_size",
                   "data.options.max_ep_len")


_MISSING = object()


def _lookup(tree: dict[str, Any], key: str) -> Any:
    """The value at a dotted key, or ``_MISSING``."""
    for part in key.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return _MISSING
        tree = tree[part]
    return tree


def check_trained_config(ckpt: Path, cfg: ExperimentConfig, source: Path) -> None:
    """CheckpointError unless ``cfg`` (read from ``source``) builds the model the checkpoint ``ckpt``
    was trained with: every ``model.*`` key and :data:`MODEL_DATA_KEYS` must equal the config the
    checkpoint recorded. A change such as ``model.activation`` keeps every weight's shape, so
    loading the weights alone would not notice it. Checkpoints that recorded no config pass, and so
    do keys they did not record (a field added since, whose default keeps the old model)."""
    trained = checkpoint_config(ckpt)
    if trained is None:
        return
    current = json.loads(json.dumps(config_to_dict(cfg)))  # the JSON form the checkpoint holds
    changed = [k for k in config_changes(trained, current)
               if (k.startswith("model.") or k in MODEL_DATA_KEYS) and _lookup(trained, k) is not _MISSING]
    if changed:
        shown = lambda tree, k: "absent" if (v := _lookup(tree, k)) is _MISSING else repr(v)  # noqa: E731
        diffs = ", ".join(f"{k} ({shown(trained, k)} there, {shown(current, k)} in {source.name})" for k in changed)
        raise CheckpointError(f"{ckpt} was trained with another model than {source} describes: {diffs}; "
                              f"restore {source.name} to the config the run was trained with")


def check_resumable(stored: ExperimentConfig, cfg: ExperimentConfig, run_dir: Path) -> None:
    """RunError unless ``cfg`` equals the config ``run_dir`` was trained with, except a longer schedule."""
    old, new = config_to_dict(stored), config_to_dict(cfg)
    changed = [k for k in config_changes(old, new) if k not in RESUMABLE_CHANGES]
    for key in ("epochs", "steps"):
        a, b = old["train"][key], new["train"][key]
        if (a is None) != (b is None) or (a is not None and b < a):
            changed.append(f"train.{key} ({a} -> {b}; only a longer schedule may be resumed)")
    if changed:
        raise RunError(f"cannot resume {run_dir}: the config differs from the one it was trained with in "
                       f"{', '.join(changed)}; use the same config, or --overwrite to start afresh")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def make_optimizer(cfg: ExperimentConfig, model: nn.Module) -> torch.optim.Optimizer:
    o = cfg.optim
    kw = dict(lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay)
    cls = {"radam": torch.optim.RAdam, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[o.name]
    return cls(model.parameters(), **kw)


def make_scheduler(cfg: ExperimentConfig, optimizer: torch.optim.Optimizer, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """constant (after optional warmup), one-cycle (linear warmup then linear / cosine decay to 0), or
    inverse_sqrt (fairseq's: linear warmup, then lr · sqrt(warmup / step))."""
    o = cfg.optim
    warmup = o.warmup_steps

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if o.schedule == "constant":
            return 1.0
        if o.schedule == "inverse_sqrt":
            return math.sqrt(max(1, warmup) / (step + 1))
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        if o.schedule == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _first_batch(data, size: int, device: torch.device) -> Batch:
    """The first ``size`` examples of ``data``: the fixed batch of the KSVD diagnostics and final J."""
    return data.batch(torch.arange(min(len(data), size))).to(device)


@dataclass
class _Loop:
    """Everything one run's loop carries from step to step (and a checkpoint restores)."""

    model: nn.Module
    net: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    splits: Splits
    total: int
    steps_per_epoch: int
    task: Task
    step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    best: dict[str, Any] | None = None
    best_weights: dict[str, Tensor] | None = None
    wall_before: float = 0.0
    #: CPU seconds (this process, all its threads) of earlier sessions; None when a checkpoint from before
    #: CPU accounting was resumed (the run's CPU time is then unknown)
    cpu_before: float | None = 0.0
    started: tuple[float, float] = (0.0, 0.0)  # perf_counter, process_time at the start of this session
    last: dict[str, float] = field(default_factory=dict)

    def elapsed(self) -> tuple[float, float | None]:
        """Wall and CPU seconds of the training loop over every session of this run."""
        wall = self.wall_before + time.perf_counter() - self.started[0]
        cpu = None if self.cpu_before is None else self.cpu_before + time.process_time() - self.started[1]
        return wall, cpu


class Trainer:
    """Runs one seed of an experiment into ``out_dir`` (config.yaml, metrics.json, history.csv,
    TensorBoard events, checkpoints/)."""

    def __init__(self, cfg: ExperimentConfig, out_dir: str | Path, *, resume: bool = False) -> None:
        self.cfg = cfg
        self._task = get_family(cfg.data.family).task
        self.out = Path(out_dir)
        self.resume = resume
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.device = resolve_device(cfg.train.device)
        if self.world > 1 and self.device.type == "cuda":
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def _order(self, data_epoch: int, size: int) -> Tensor:
        g = torch.Generator().manual_seed(self.cfg.train.seed * 100_003 + data_epoch)
        return torch.randperm(size, generator=g)

    def _global_batch(self, step: int, size: int, steps_per_epoch: int) -> Tensor:
        epoch, k = divmod(step, steps_per_epoch)
        bs = self.cfg.train.batch_size
        return self._order(epoch, size)[k * bs : (k + 1) * bs]

    def fit(self) -> dict[str, Any]:
        """Train (or continue) this seed to the end of its schedule; returns and writes metrics.json."""
        t = self.cfg.train
        loop = self._setup()
        if self.resume:
            self._restore(loop)
        if self.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            dump_config(self.cfg, self.out / "config.yaml")
        writer = self._writer(loop.step)
        bar = None
        if t.progress and self.is_main:
            from tqdm.auto import tqdm

            bar = tqdm(disable=None, total=loop.total, initial=loop.step, desc=f"{self.cfg.name} seed {t.seed}", dynamic_ncols=True)
        round_len = t.eval_every if t.steps is not None else loop.steps_per_epoch
        eval_every_rounds = 1 if t.steps is not None else t.eval_every
        loop.started = (time.perf_counter(), time.process_time())
        loop.model.train()
        try:
            self._run_loop(loop, writer, bar, round_len, eval_every_rounds)
        except KeyboardInterrupt:
            raise Interrupted(loop.step, loop.step / loop.steps_per_epoch, self.out) from None
        finally:
            if bar is not None:
                bar.close()
            if writer is not None:
                writer.close()
        metrics = self._final_metrics(loop)
        if self.is_main:
            (self.out / "metrics.json").write_text(json.dumps(metrics, indent=2))
        return metrics

    def _run_loop(self, loop: _Loop, writer, bar, round_len: int, eval_every_rounds: int) -> None:
        """Steps to the end of the schedule, evaluating and checkpointing at the end of each round."""
        while loop.step < loop.total:
            self._train_step(loop)
            if bar is not None:
                bar.update(1)
                shown = {"loss": f"{loop.last['loss']:.3f}", "ksvd": f"{loop.last['ksvd']:.2e}"}
                if math.isfinite(loop.last["acc"]):  # action regression has no accuracy
                    shown["acc"] = f"{loop.last['acc']:.2f}"
                bar.set_postfix(**shown)
            if loop.step % round_len and loop.step != loop.total:
                continue
            if math.ceil(loop.step / round_len) % eval_every_rounds == 0 or loop.step == loop.total:
                self._evaluate_and_select(loop, writer, bar)
            if self.is_main:
                self._checkpoint(loop)

    def _setup(self) -> _Loop:
        """Threads, allocator, process group, seed; then data, model, optimiser and schedule."""
        cfg, t = self.cfg, self.cfg.train
        if t.threads:
            torch.set_num_threads(t.threads)
        if t.retain_freed_memory and self.device.type == "cpu":
            retain_freed_memory()
        if self.world > 1 and not torch.distributed.is_initialized():
            torch.distributed.init_process_group("nccl" if self.device.type == "cuda" else "gloo")
        torch.manual_seed(t.seed)
        splits = build_splits(cfg)
        model = build_model(cfg, splits.train).to(self.device)
        net: nn.Module = model
        if self.world > 1:
            # Λ enters only the KSVD term: with η = 0 it gets no gradient, which DDP must be told of
            net = nn.parallel.DistributedDataParallel(model, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                                                      find_unused_parameters=t.eta == 0)
        optimizer = make_optimizer(cfg, model)
        steps_per_epoch = math.ceil(len(splits.train) / t.batch_size)
        total = t.steps if t.steps is not None else t.epochs * steps_per_epoch
        scheduler = make_scheduler(cfg, optimizer, total)
        family = get_family(cfg.data.family)
        if self.is_main:
            family.prepare_run(splits, self.out)
        return _Loop(model, net, optimizer, scheduler, splits, total, steps_per_epoch, family.task)

    def _restore(self, loop: _Loop) -> None:
        """Continue from the latest checkpoint, if there is one: weights, optimiser, schedule, RNG, history."""
        ckpt_dir = self.out / "checkpoints"
        try:
            found = latest_checkpoint(ckpt_dir)
            if found is None:
                return
            weights, state, loop.best_weights = load_checkpoint(found)
            check_trained_config(found, self.cfg, self.out / "config.yaml")
            fit_weights(loop.model, weights, found / "model.safetensors")
        except CheckpointError as err:
            raise CheckpointError(f"cannot resume: {err}. Delete {ckpt_dir} to start this run afresh") from err
        loop.optimizer.load_state_dict(state["optimizer"])
        loop.scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"])
        if self.device.type == "cuda" and state.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)
        loop.step, loop.history, loop.best, loop.wall_before = state["step"], state["history"], state["best"], state["wall_time"]
        loop.cpu_before = state.get("cpu_time")  # absent from checkpoints written before CPU accounting

    def _train_step(self, loop: _Loop) -> None:
        """One optimiser step on this rank's share of the global batch: task loss + η·KSVD."""
        t, clip = self.cfg.train, self.cfg.optim.clip_norm
        index = self._global_batch(loop.step, len(loop.splits.train), loop.steps_per_epoch)
        local = index[self.rank :: self.world]
        b = train_batch(self.cfg, loop.splits.train, local, loop.step).to(self.device)
        with ksvd_terms(loop.model) as terms:  # the step's KSVD terms: nothing stays on the layers
            logits = loop.net(**b.inputs)
        share = len(local) * self.world / len(index)  # makes DDP's mean the global mean
        task = loop.task.loss(logits, b)
        reg = terms.loss(t.ksvd_reduction, t.ksvd_form) if t.eta > 0 else torch.zeros((), device=self.device)
        del terms
        # "summed": η·KSVD joins the summed task loss, the total is divided by the targets (fairseq's
        # LM criterion), so η weighs 1 / targets of what it weighs under "mean".
        eta = t.eta / loop.task.targets(b) if t.ksvd_weighting == "summed" else t.eta
        loss = (task + eta * reg) * share
        task_value, reg_value = task.item(), reg.item()
        if not (math.isfinite(task_value) and math.isfinite(reg_value)):
            kept = latest_checkpoint(self.out / "checkpoints")
            raise RunError(
                f"non-finite loss at step {loop.step + 1}, epoch {loop.step / loop.steps_per_epoch:.2f} "
                f"(task {task_value}, ksvd {reg_value}); stopped, "
                + (f"last good checkpoint kept: {kept}" if kept is not None else "no checkpoint was written yet")
            )
        loop.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if clip:
            nn.utils.clip_grad_norm_(loop.model.parameters(), clip)
        loop.optimizer.step()
        loop.scheduler.step()
        loop.step += 1
        loop.last = {"loss": task_value, "ksvd": reg_value, "acc": loop.task.batch_accuracy(logits, b)}

    def _evaluate_and_select(self, loop: _Loop, writer, bar) -> None:
        """Evaluate, append to the history, keep the best row (and, holdout, its weights), log."""
        t = self.cfg.train
        row = self._evaluate(loop.model, loop.splits, loop.step, loop.steps_per_epoch, loop.last)
        if t.ksvd_distances_every and len(loop.history) % t.ksvd_distances_every == 0 and primal_layers(loop.model):
            from primal_attention.ksvd.dual import model_ksvd_distances  # docs/method.md §7

            fixed = _first_batch(loop.splits.train, t.eval_batch_size, self.device)
            row.update({f"ksvd_distance/{name}.{k}": v for name, d in model_ksvd_distances(loop.model, fixed).items()
                        for k, v in d.items()})
        loop.history.append(row)
        selector = f"{'val' if t.protocol == 'holdout' else 'test'}_{loop.task.select}"
        if loop.best is None or loop.task.better(row[selector], loop.best[selector]):
            loop.best = dict(row)
            if t.protocol == "holdout":
                loop.best_weights = state_tensors(loop.model)
        if self.is_main:
            self._log(writer, loop.history)
            if bar is not None:
                bar.write(self._describe(row, loop.task))

    def _checkpoint(self, loop: _Loop) -> None:
        """Save everything :meth:`_restore` needs to continue exactly from this step."""
        wall, cpu = loop.elapsed()
        state = {
            "step": loop.step,
            "optimizer": loop.optimizer.state_dict(),
            "scheduler": loop.scheduler.state_dict(),
            "rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None,
            "history": loop.history,
            "best": loop.best,
            "wall_time": wall,
            "cpu_time": cpu,
        }
        save_checkpoint(self.out / "checkpoints", loop.step, loop.model, state, loop.best_weights,
                        keep=self.cfg.train.keep_checkpoints, config=config_to_dict(self.cfg))

    def _evaluate(self, model: nn.Module, splits, step: int, steps_per_epoch: int, last: dict[str, float]) -> dict[str, Any]:
        t = self.cfg.train
        row: dict[str, Any] = {"step": step, "epoch": step / steps_per_epoch, "train_loss": last["loss"],
                               "train_ksvd": last["ksvd"], "train_batch_acc": last["acc"]}
        with ksvd_terms(model):  # evaluation forwards leave nothing on the primal layers
            if splits.val is not None:
                row.update({f"val_{k}": v for k, v in self._task.evaluate(model, splits.val, t.eval_batch_size, self.device).items()})
            if t.protocol == "authors" or t.track_test:
                row.update({f"test_{k}": v for k, v in self._task.evaluate(model, splits.test, t.eval_batch_size, self.device).items()})
        if primal_layers(model):
            # KSVD state (J, Λ, stationarity residuals) on a fixed batch: the first training examples.
            fixed = _first_batch(splits.train, t.eval_batch_size, self.device)
            row.update({f"ksvd/{k}": v for k, v in ksvd_diagnostics(model, fixed, per_head=False).items()})
        return row

    @staticmethod
    def _describe(row: dict[str, Any], task: Task) -> str:
        parts = [f"step {row['step']}", f"epoch {row['epoch']:.1f}", f"loss {row['train_loss']:.4f}", f"ksvd {row['train_ksvd']:.3e}"]
        parts += [f"{s}_{m} {row[f'{s}_{m}']:.4f}" for s in ("val", "test") for m in task.reported if f"{s}_{m}" in row]
        return " | ".join(parts)

    def _writer(self, step: int):
        if not self.is_main:
            return None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # tensorboard is an optional extra
            return None
        try:
            return SummaryWriter(str(self.out / "tensorboard"), purge_step=step or None)
        except OSError as err:  # it writes its first event file at once: a full disk shows here
            raise RunError(f"cannot write TensorBoard events to {self.out / 'tensorboard'} "
                           f"({err.strerror or err}); the checkpoints are untouched") from err

    def _log(self, writer, history: list[dict[str, Any]]) -> None:
        """Rewrite history.csv from the loop state (so a resumed run never duplicates rows)."""
        keys = list(dict.fromkeys(k for row in history for k in row))
        tmp = self.out / "history.csv.tmp"
        with tmp.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=keys)
            w.writeheader()
            w.writerows(history)
        os.replace(tmp, self.out / "history.csv")
        if writer is not None:
            row = history[-1]
            for k, v in row.items():
                if k not in ("step", "epoch") and isinstance(v, (int, float)):
                    writer.add_scalar(k, v, row["step"])

    def _final_metrics(self, loop: _Loop) -> dict[str, Any]:
        t = self.cfg.train
        wall, cpu = loop.elapsed()
        model, splits, history, best, best_weights = loop.model, loop.splits, loop.history, loop.best, loop.best_weights
        total, steps_per_epoch = loop.total, loop.steps_per_epoch
        metrics: dict[str, Any] = {
            "name": self.cfg.name,
            "seed": t.seed,
            "protocol": t.protocol,
            "steps": total,
            "epochs": total / steps_per_epoch,
            "wall_time_s": wall,
            # CPU seconds of this process over every session (rank 0 under DDP); None: unknown (resumed
            # from a checkpoint written before CPU accounting)
            "cpu_time_s": cpu,
            "train_examples": len(splits.train),
            "val_examples": 0 if splits.val is None else len(splits.val),
            "test_examples": len(splits.test),
            # what chooses the evaluation point (the split is val under holdout, test under authors)
            "selection": {"metric": loop.task.select, "maximize": loop.task.maximize},
        }
        task, reported = loop.task, loop.task.reported
        if t.protocol == "authors":
            metrics.update({f"final_test_{m}": history[-1][f"test_{m}"] for m in reported})
            metrics.update({f"best_test_{m}": best[f"test_{m}"] for m in reported}, best_epoch=best["epoch"])
        else:
            selected = build_model(self.cfg, splits.train).to(self.device)
            selected.load_state_dict(best_weights)
            test = task.evaluate(selected, splits.test, t.eval_batch_size, self.device)
            metrics.update({f"test_{m}": test[m] for m in reported})
            metrics.update({f"best_val_{m}": best[f"val_{m}"] for m in reported}, best_epoch=best["epoch"])
            metrics.update({f"final_val_{m}": history[-1][f"val_{m}"] for m in reported})
            if t.track_test:  # the authors' figure from the same run (the best test row), beside the selected one
                top = history[0]
                for r in history[1:]:
                    top = r if task.better(r[f"test_{task.select}"], top[f"test_{task.select}"]) else top
                metrics.update({f"best_test_{m}": top[f"test_{m}"] for m in reported})
                metrics.update({f"final_test_{m}": history[-1][f"test_{m}"] for m in reported})
        metrics["ksvd_j_final"] = self._final_j(model, splits.train)
        return metrics

    @torch.no_grad()
    def _final_j(self, model: nn.Module, data: SequenceData) -> dict[str, float]:
        """Signed J per primal layer (batch reduction) on the first training examples, eval mode; a layer
        called twice (two towers) gives ``name`` and ``name#2``."""
        was = model.training
        model.eval()
        with ksvd_terms(model, inference=True) as terms:
            model(**_first_batch(data, self.cfg.train.eval_batch_size, self.device).inputs)
        out = {name: float(j) for name, j in terms.objectives("batch", self.cfg.train.ksvd_form).items()}
        model.train(was)
        return out


def _other_finished_seeds(cfg: ExperimentConfig, out: Path, seeds: list[int]) -> list[dict[str, Any]]:
    """The finished runs of other seeds in ``out`` trained with this config (apart from the seed), so that
    ``summary.json`` covers every seed trained into ``out``, not only this invocation's."""
    import dataclasses

    found = []
    for run_dir in sorted(out.glob("seed_*")):
        try:
            seed = int(run_dir.name.removeprefix("seed_"))
            if seed in seeds or not (run_dir / "metrics.json").is_file():
                continue
            stored = load_config(run_dir / "config.yaml")
            mine = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seed=seed))
            if [k for k in config_changes(config_to_dict(stored), config_to_dict(mine)) if k not in RESUMABLE_CHANGES]:
                continue
            metrics = json.loads((run_dir / "metrics.json").read_text())
        except (ValueError, OSError, ConfigError):
            continue  # not a finished run of this config: left out of the summary
        if _finished(mine, metrics):
            found.append(metrics)
    return found


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean ± std (sample std over seeds) of every numeric metric of the runs."""
    keys = [k for k, v in runs[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "seed"]
    summary: dict[str, Any] = {"name": runs[0]["name"], "protocol": runs[0]["protocol"], "seeds": [r["seed"] for r in runs]}
    summary.update({k: dict(zip(("mean", "std"), mean_std([float(r[k]) for r in runs])), n=len(runs)) for k in keys})
    return summary


def _finished(cfg: ExperimentConfig, metrics: dict[str, Any]) -> bool:
    """Whether a run's final metrics already cover the schedule of ``cfg`` (a longer one continues)."""
    t = cfg.train
    return metrics["steps"] >= t.steps if t.steps is not None else metrics["epochs"] >= t.epochs - 1e-9


def _holds_run(run_dir: Path) -> bool:
    return any((run_dir / name).exists() for name in ("config.yaml", "checkpoints", "metrics.json", "tensorboard"))


def prepare_output(out: Path, run_dirs: list[Path], *, resume: bool, overwrite: bool) -> None:
    """Refuse an unusable ``--out`` or one that already holds a run (unless resume / overwrite);
    with overwrite, remove those runs whole (checkpoints, TensorBoard events, metrics)."""
    if resume and overwrite:
        raise RunError("give --resume or --overwrite, not both")
    if out.exists() and not out.is_dir():
        raise RunError(f"--out {out} is a file, not a directory")
    existing = [d for d in run_dirs if _holds_run(d)]
    if existing and not (resume or overwrite):
        raise RunError(f"{existing[0]} already holds a run; continue it with --resume or replace it with --overwrite")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise RunError(f"--out {out} is not a writable directory ({err.strerror or err})") from err
    if overwrite:
        for d in existing:
            shutil.rmtree(d)
        (out / "summary.json").unlink(missing_ok=True)


@contextmanager
def run_lock(run_dirs: list[Path], command: str = "primal train") -> Iterator[None]:
    """Hold an exclusive advisory lock per run folder while the block runs: the file
    ``.<name>.lock`` beside each (in ``--out``, outside the folder, which ``--overwrite`` removes).

    One lock per seed folder, not one per ``--out``: one run folder has one writer, while other
    seeds may train into the same ``--out`` at once (``primal sweep``'s workers do). The kernel drops
    an ``flock`` when its process exits, however it exits, so a crashed or killed run never leaves a
    folder locked. RunError at once (no waiting) when another process holds one; the lock file then
    names its pid.
    """
    try:
        import fcntl
    except ImportError:  # not POSIX (Windows): no flock, and no lock either
        yield
        return
    with ExitStack() as held:
        for run_dir in run_dirs:
            lock = run_dir.parent / f".{run_dir.name}.lock"
            try:
                run_dir.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as err:
                raise RunError(f"--out {run_dir.parent} is not a writable directory ({err.strerror or err})") from err
            held.callback(os.close, fd)  # closing releases the lock; the file stays (removing it would race)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
                raise RunError(f"{run_dir} is in use by another {command}{f' (pid {holder})' if holder else ''}: "
                               "one run folder has one writer; wait for it to finish or choose another --out") from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield


def run_seeds(cfg: ExperimentConfig, out_dir: str | Path, seeds: list[int], *, resume: bool = False,
              overwrite: bool = False) -> dict[str, Any]:
    """One run per seed into ``out_dir/seed_<s>``, then ``out_dir/summary.json``.

    A seed folder that already holds a run is refused unless ``resume`` (an interrupted run
    continues, a finished one is reported again; both only with the config they were trained
    with, see :func:`check_resumable`) or ``overwrite`` (the old run is removed first).
    Each seed folder is locked (:func:`run_lock`) before anything is written and until the end.
    """
    from primal_attention.train.data import check_buildable

    check_buildable(cfg)
    out = Path(out_dir)
    # Seeds reach torch generators scaled by about 10**6 (which take 64 bits) and numpy's default_rng
    # (no negative seeds): 32 bits leave room for both.
    bad = [s for s in seeds if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < 2**32]
    if bad:
        raise RunError(f"a seed must be an integer in [0, 2**32), got {bad[0]!r}")
    if len(set(seeds)) != len(seeds):
        raise RunError(f"--seeds repeats a seed: {', '.join(map(str, seeds))}")
    if resume and overwrite:
        raise RunError("give --resume or --overwrite, not both")
    if out.exists() and not out.is_dir():
        raise RunError(f"--out {out} is a file, not a directory")
    # Under torchrun every rank runs this; rank 0 alone writes, so it alone takes the locks.
    run_dirs = [out / f"seed_{seed}" for seed in seeds]
    group_was_open = torch.distributed.is_available() and torch.distributed.is_initialized()
    finished = False
    try:
        with run_lock(run_dirs) if int(os.environ.get("RANK", "0")) == 0 else nullcontext():
            summary = _run_seeds(cfg, out, seeds, resume=resume, overwrite=overwrite)
        finished = True
        return summary
    finally:
        if not group_was_open and torch.distributed.is_available() and torch.distributed.is_initialized():
            # The group the trainer opened is closed here: a rank leaving with it open can abort at exit
            # while another still writes. The barrier only after a clean run (a failed rank never reaches it).
            if finished:
                torch.distributed.barrier()
            torch.distributed.destroy_process_group()


def _run_seeds(cfg: ExperimentConfig, out: Path, seeds: list[int], *, resume: bool, overwrite: bool) -> dict[str, Any]:
    import dataclasses

    run_dirs = [out / f"seed_{seed}" for seed in seeds]
    prepare_output(out, run_dirs, resume=resume, overwrite=overwrite)
    runs = []
    for seed, run_dir in zip(seeds, run_dirs):
        run_cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seed=seed))
        if resume and (run_dir / "config.yaml").is_file():
            try:
                stored = load_config(run_dir / "config.yaml")
            except ConfigError as err:
                raise RunError(f"cannot resume {run_dir}: its config.yaml does not load ({err})") from err
            check_resumable(stored, run_cfg, run_dir)
        done = run_dir / "metrics.json"
        if resume and done.is_file():
            try:
                metrics = json.loads(done.read_text())
            except ValueError as err:
                raise RunError(f"{done} is not valid JSON ({err}); remove it and --resume finishes the run from "
                               "its last checkpoint") from None
            if _finished(run_cfg, metrics):
                runs.append(metrics)
                continue
        runs.append(Trainer(run_cfg, run_dir, resume=resume).fit())
    summary = summarize(sorted(runs + _other_finished_seeds(cfg, out, seeds), key=lambda r: r["seed"]))
    if int(os.environ.get("RANK", "0")) == 0:
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
