"""Convert a trained softmax model to Primal-Attention: swap, attention transfer, fine-tuning.

Stages, each resumable from checkpoints in ``out/checkpoints`` (weights + optimiser / RNG / stage state,
written atomically every ``checkpoint_every`` steps and at the end of a stage):

1. swap: the chosen softmax layers become primal layers initialised from them (q, k and output
   projections copied; W_e, W_r, Λ and the mix from PrimalAttention's own init), evaluated as is;
2. transfer: only the new layers train, so their outputs match the softmax layers' outputs
   (relative MSE, :mod:`primal_attention.convert.transfer`, + η·KSVD), "all" at once or "layer" by layer;
3. fine-tune: the whole model ("all") or the new layers and every norm ("primal") train on the task
   loss + η·KSVD, evaluated on validation every ``eval_every`` steps; the best weights are kept.

``out/report.json`` holds, per stage, steps, CPU and wall seconds, the loss curve, the layer errors
and the val / test metrics, beside the original's. Running the same conversion again continues where
it stopped; a larger ``transfer_steps`` (before fine-tuning began) or ``finetune_steps`` extends it.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from primal_attention.convert.subjects import ConvertError, Subject
from primal_attention.convert.transfer import all_at_once_loss, in_model_loss, layer_errors
from primal_attention.ksvd import ksvd_terms
from primal_attention.train.checkpoint import CheckpointError, fit_weights, latest_checkpoint, load_checkpoint, save_checkpoint

TRANSFER_MODES = ("all", "layer")
FINETUNE_PARTS = ("all", "primal")
#: settings a resumed conversion may change (a longer schedule is checked separately).
EXTENDABLE = ("transfer_steps", "finetune_steps", "progress")


@dataclass
class ConvertOptions:
    """How to convert.

    layers: "last", "all" or layer indices. primal: PrimalAttention options (rank, rank_multi, ...);
    for our runs they go on top of the run's ``attention_options.primal``.
    transfer_steps: optimiser steps of attention transfer ("layer" mode: per layer).
    finetune_steps: optimiser steps of fine-tuning. eta: weight of the KSVD term in both stages.
    batch_size / seed: None takes the run's (``train.batch_size``, ``train.seed``); 16 / 0 for HF.
    eval_every: fine-tuning steps between validation evaluations (the best is kept).
    error_examples: held-out examples on which the per-layer output errors are measured.
    """

    layers: Any = "last"
    primal: dict[str, Any] = field(default_factory=dict)
    transfer_steps: int = 0
    transfer_mode: str = "all"
    transfer_lr: float = 1e-3
    finetune_steps: int = 0
    finetune: str = "all"
    finetune_lr: float = 3e-4
    warmup_steps: int = 0
    weight_decay: float = 0.0
    eta: float = 0.0
    batch_size: int | None = None
    seed: int | None = None
    eval_every: int = 100
    checkpoint_every: int = 50
    error_examples: int = 64
    progress: bool = True

    def validate(self) -> None:
        checks = [
            (self.transfer_mode in TRANSFER_MODES, f"transfer_mode must be one of {TRANSFER_MODES}, got {self.transfer_mode!r}"),
            (self.finetune in FINETUNE_PARTS, f"finetune must be one of {FINETUNE_PARTS}, got {self.finetune!r}"),
            (self.transfer_steps >= 0 and self.finetune_steps >= 0, "transfer_steps and finetune_steps must be >= 0"),
            (self.transfer_lr > 0 and self.finetune_lr > 0, "learning rates must be positive"),
            (self.eta >= 0, f"eta must be >= 0, got {self.eta}"),
            (self.eval_every > 0 and self.checkpoint_every > 0, "eval_every and checkpoint_every must be positive"),
            (self.batch_size is None or self.batch_size > 0, f"batch_size must be positive, got {self.batch_size}"),
            (not {"embed_dim", "num_heads", "causal"} & set(self.primal),
             "primal options embed_dim, num_heads and causal come from the model and cannot be set"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConvertError(message)


class Interrupted(Exception):
    """Ctrl-C during a conversion; the last checkpoint is written and a re-run continues."""


def _frozen_except(model: nn.Module, trainable: list[nn.Parameter]) -> None:
    model.requires_grad_(False)
    for p in trainable:
        p.requires_grad_(True)


def _finetune_parameters(subject: Subject, student: nn.Module, layers: list[int], part: str) -> list[nn.Parameter]:
    if part == "all":
        return [p for p in student.parameters()]
    modules = subject.attention_modules(student)
    chosen = {id(p): p for i in layers for p in modules[i].parameters()}
    for m in student.modules():
        if isinstance(m, (nn.LayerNorm, nn.RMSNorm)) or type(m).__name__.endswith(("LayerNorm", "RMSNorm")):
            chosen.update({id(p): p for p in m.parameters(recurse=False)})
    return list(chosen.values())


def _schedule(optimizer: torch.optim.Optimizer, warmup: int, total: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup, then cosine decay to 0 over ``total`` steps."""

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


class Conversion:
    """One conversion of ``subject`` into ``out``; :meth:`run` does (or continues) every stage."""

    def __init__(self, subject: Subject, out: str | Path, options: ConvertOptions) -> None:
        options.validate()
        self.subject, self.out, self.o = subject, Path(out), options
        self.layers = subject.check_layers(options.layers)
        self.batch_size = options.batch_size or subject.default_batch_size
        self.seed = options.seed if options.seed is not None else subject.default_seed
        self.student = subject.convert(self.layers, options.primal)
        self.settings = {"source": subject.describe(), "layers": self.layers, **{
            k: v for k, v in asdict(options).items() if k not in ("layers", "progress")},
            "batch_size": self.batch_size, "seed": self.seed}

    # -- state -----------------------------------------------------------------------------------
    def _check_resume(self) -> dict[str, Any] | None:
        """The stored loop state (None for a fresh start); ConvertError for a different conversion."""
        stored_file = self.out / "convert.json"
        if not stored_file.is_file():
            if (self.out / "checkpoints").exists() or (self.out / "report.json").exists():
                raise ConvertError(f"{self.out} holds something that is not a conversion; choose another --out")
            return None
        stored = json.loads(stored_file.read_text())
        changed = [k for k in sorted(set(stored) | set(self.settings))
                   if k not in EXTENDABLE and stored.get(k) != self.settings.get(k)]
        if changed:
            raise ConvertError(f"{self.out} holds a different conversion (differs in {', '.join(changed)}); "
                               "use another --out or --overwrite")
        try:
            found = latest_checkpoint(self.out / "checkpoints")
            if found is None:
                return None
            weights, state, best = load_checkpoint(found)
            fit_weights(self.student, weights, found / "model.safetensors")
        except CheckpointError as err:
            raise ConvertError(f"cannot resume {self.out}: {err}") from err
        done = state["done"]
        if self.o.transfer_steps < done["transfer"] or self.o.finetune_steps < done["finetune"]:
            raise ConvertError(f"{self.out} already ran {done['transfer']} transfer and {done['finetune']} fine-tuning "
                               "steps; a resumed conversion can only be longer")
        if self.o.transfer_steps > done["transfer"] and done["finetune"] > 0:
            raise ConvertError(f"{self.out} finished transfer at {done['transfer']} steps and began fine-tuning; "
                               "transfer cannot be extended now (use another --out)")
        state["best_weights"] = best
        return state

    def _checkpoint(self, state: dict[str, Any]) -> None:
        """Weights (the latest in model.safetensors, fine-tuning's val-selected ones in best.safetensors),
        the stage state with its optimiser, and the report."""
        full = {k: v for k, v in state.items() if k != "best_weights"}
        full["rng"] = torch.get_rng_state()
        step = state["done"]["transfer"] + state["done"]["finetune"]
        save_checkpoint(self.out / "checkpoints", step, self.student, full, state.get("best_weights"),
                        config=self.subject.checkpoint_config(self.layers, self.o.primal))
        (self.out / "report.json").write_text(json.dumps(self._report(state), indent=2))

    def _report(self, state: dict[str, Any]) -> dict[str, Any]:
        return {"settings": self.settings, "primal_layers": self.layers, **state["report"],
                "done": state["done"], "finished": state.get("finished", False)}

    # -- stages ----------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Do or continue every stage; returns the report (also ``out/report.json``)."""
        self.out.mkdir(parents=True, exist_ok=True)
        state = self._check_resume()
        (self.out / "convert.json").write_text(json.dumps(self.settings, indent=2))
        if state is None:
            # A run's folder is loadable from the start (config.yaml); the final weights are saved by _finish.
            self.subject.save(self.student, self.out, self.layers, self.o.primal)
            state = {"done": {"transfer": 0, "finetune": 0}, "report": {}, "best": None, "best_weights": None,
                     "stage": None, "optimizer": None, "scheduler": None}
            report = state["report"]
            report["original"] = self._metrics(self.subject.original)
            report["swap"] = {**self._metrics(self.student), **self._errors()}
            self._checkpoint(state)
        if state["done"]["transfer"] < self.o.transfer_steps:
            self._transfer(state)
        if state["done"]["finetune"] < self.o.finetune_steps:
            self._finetune(state)
        if not state.get("finished") or state["report"].get("final") is None \
                or state["report"]["final"].get("steps") != state["done"]:
            self._finish(state)
        return self._report(state)

    def _metrics(self, model: nn.Module) -> dict[str, Any]:
        return {split: self.subject.evaluate(model, split) for split in ("val", "test")}

    def _errors(self) -> dict[str, Any]:
        batches = self.subject.eval_batches("val", self.o.error_examples)
        return {"layer_error": {k: {str(i): v for i, v in d.items()} for k, d in
                                layer_errors(self.subject, self.student, self.layers, batches).items()}}

    def _bar(self, total: int, initial: int, desc: str):
        if not self.o.progress:
            return None
        from tqdm.auto import tqdm

        return tqdm(disable=None, total=total, initial=initial, desc=desc, dynamic_ncols=True)

    def _loop(self, state: dict[str, Any], stage: str, total: int, loss_at: Callable[[int], tuple[Tensor, Tensor, dict]],
              make_opt: Callable[[int], tuple], renew: Callable[[int], bool] = lambda step: False,
              after_step: Callable[[int], None] | None = None) -> None:
        """The loop of both stages, from ``done[stage]`` to ``total`` steps: ``loss_at(step)`` gives
        (loss to minimise, the loss to report, extra values to log); ``make_opt(step)`` gives a fresh
        (optimiser, scheduler or None), again wherever ``renew(step)``. Timing, loss curve,
        checkpoints and Ctrl-C are handled here."""
        entry = state["report"].setdefault(stage, {"steps": 0, "cpu_s": 0.0, "wall_s": 0.0, "losses": []})
        optimizer, scheduler = make_opt(state["done"][stage])
        if state.get("stage") == stage and state.get("optimizer") is not None:
            optimizer.load_state_dict(state["optimizer"])
            if scheduler is not None:
                scheduler.load_state_dict(state["scheduler"])
            torch.set_rng_state(state["rng"])
        state["stage"] = stage
        bar = self._bar(total, state["done"][stage], stage)
        log_every = max(1, min(self.o.checkpoint_every, total // 20))
        cpu0, wall0, running = time.process_time(), time.perf_counter(), []

        def account() -> None:
            nonlocal cpu0, wall0
            entry["cpu_s"] += time.process_time() - cpu0
            entry["wall_s"] += time.perf_counter() - wall0
            cpu0, wall0 = time.process_time(), time.perf_counter()

        try:
            while state["done"][stage] < total:
                step = state["done"][stage]
                if renew(step):
                    optimizer, scheduler = make_opt(step)
                objective, reported, parts = loss_at(step)
                value = float(reported.detach())
                if not (math.isfinite(value) and math.isfinite(float(objective.detach()))):
                    kept = latest_checkpoint(self.out / "checkpoints")
                    raise ConvertError(f"{stage}: non-finite loss at step {step + 1}; stopped, last good checkpoint "
                                       f"kept: {kept}")
                optimizer.zero_grad(set_to_none=True)
                objective.backward()
                optimizer.step()
                if scheduler is not None:
                    scheduler.step()
                running.append(value)
                state["done"][stage] = entry["steps"] = step + 1
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{value:.4f}")
                if (step + 1) % log_every == 0 or step + 1 == total:
                    entry["losses"].append({"step": step + 1, "loss": sum(running) / len(running),
                                            **{k: float(v) for k, v in parts.items()}})
                    running = []
                if after_step is not None:
                    after_step(step + 1)
                if (step + 1) % self.o.checkpoint_every == 0 or step + 1 == total:
                    account()
                    state["optimizer"] = optimizer.state_dict()
                    state["scheduler"] = None if scheduler is None else scheduler.state_dict()
                    self._checkpoint(state)
        except KeyboardInterrupt:
            account()
            self._write_report(state)
            kept = latest_checkpoint(self.out / "checkpoints")
            raise Interrupted(f"interrupted in {stage} at step {state['done'][stage]}; run the same command again "
                              f"to continue from the checkpoint {kept.name if kept else '(none yet)'}") from None
        finally:
            if bar is not None:
                bar.close()

    def _write_report(self, state: dict[str, Any]) -> None:
        """On Ctrl-C the latest checkpoint already holds a consistent state; only the report is refreshed."""
        (self.out / "report.json").write_text(json.dumps(self._report(state), indent=2))

    def _transfer(self, state: dict[str, Any]) -> None:
        s, o = self.subject, self.o
        modules = s.attention_modules(self.student)
        per_layer = o.transfer_steps
        by_layer = o.transfer_mode == "layer"
        total = per_layer * (len(self.layers) if by_layer else 1)
        self.student.eval()  # targets come from the eval-mode original; no dropout in either

        def layer_at(step: int) -> int:
            return self.layers[step // per_layer]

        def make_opt(step: int) -> tuple:
            params = [p for i in ([layer_at(step)] if by_layer else self.layers) for p in modules[i].parameters()]
            _frozen_except(self.student, params)
            return torch.optim.Adam(params, lr=o.transfer_lr), None

        def loss_at(step: int) -> tuple[Tensor, Tensor, dict]:
            batch = s.batch(step, self.batch_size, self.seed)
            with ksvd_terms(self.student) as terms:
                if by_layer:
                    errors = {layer_at(step): in_model_loss(s, self.student, batch, layer_at(step))}
                else:
                    errors = all_at_once_loss(s, self.student, batch, self.layers)
            mse = sum(errors.values()) / len(errors)
            reg = terms.loss() if o.eta > 0 else torch.zeros(())
            return mse + o.eta * reg, mse, {"ksvd": reg.detach()}

        self._loop(state, "transfer", total, loss_at, make_opt,
                   renew=lambda step: by_layer and step > 0 and step % per_layer == 0)
        self.student.requires_grad_(True)
        state["report"]["transfer"].update(mode=o.transfer_mode, **self._metrics(self.student), **self._errors())
        self._checkpoint(state)

    def _finetune(self, state: dict[str, Any]) -> None:
        s, o = self.subject, self.o
        total = o.finetune_steps
        params = _finetune_parameters(s, self.student, self.layers, o.finetune)
        entry = state["report"].setdefault("finetune", {"steps": 0, "cpu_s": 0.0, "wall_s": 0.0, "losses": [],
                                                         "evaluations": []})
        entry["part"] = o.finetune

        def make_opt(step: int) -> tuple:
            _frozen_except(self.student, params)
            opt = torch.optim.AdamW(params, lr=o.finetune_lr, weight_decay=o.weight_decay)
            return opt, _schedule(opt, o.warmup_steps, total)

        def loss_at(step: int) -> tuple[Tensor, Tensor, dict]:
            self.student.train()
            batch = s.batch(step, self.batch_size, self.seed + 1)
            with ksvd_terms(self.student) as terms:
                task = s.task_loss(s.forward(self.student, batch), batch)
            reg = terms.loss() if o.eta > 0 else torch.zeros(())
            return task + o.eta * reg, task, {"ksvd": reg.detach()}

        def after_step(step: int) -> None:
            if step % o.eval_every and step != total:
                return
            val = s.evaluate(self.student, "val")
            entry["evaluations"].append({"step": step, "val": val})
            if val is None:
                return
            score = val[s.select]
            best = state.get("best")
            if best is None or (score > best["score"] if s.maximize else score < best["score"]):
                state["best"] = {"step": step, "score": score}
                state["best_weights"] = {k: v.detach().cpu().clone() for k, v in self.student.state_dict().items()}

        self._loop(state, "finetune", total, loss_at, make_opt, after_step=after_step)
        self.student.requires_grad_(True)

    def _finish(self, state: dict[str, Any]) -> None:
        """Final metrics and the saved model: fine-tuning's val-selected weights when there are some,
        else the last ones. The checkpoint keeps the last weights (a longer fine-tuning continues them)."""
        best = state.get("best_weights")
        last = None
        if best is not None:
            last = {k: v.detach().clone() for k, v in self.student.state_dict().items()}
            self.student.load_state_dict(best)
        final = {**self._metrics(self.student), "steps": dict(state["done"]),
                 "weights": f"best of fine-tuning (step {state['best']['step']})" if best is not None else "last"}
        self.subject.save(self.student, self.out, self.layers, self.o.primal)
        if last is not None:
            self.student.load_state_dict(last)
        state["report"]["final"] = final
        state["finished"] = True
        self._checkpoint(state)
        self.student.eval()
