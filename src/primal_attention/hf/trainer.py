"""Train a primalized HF model with HF's ``Trainer``: task loss + η · KSVD loss, no hand-written loop.

Two ways: :class:`PrimalTrainer` (a Trainer subclass), or :class:`KSVDLossFunc` given to any Trainer
(the plain ``transformers.Trainer``, and trainers built on it) as its ``compute_loss_func``."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from transformers import Trainer, TrainingArguments

from primal_attention.ksvd.terms import ksvd_terms

REDUCTIONS = ("batch", "sample")
FORMS = ("authors", "paper")


def _check_ksvd_options(prefix: str, eta: float, reduction: str, form: str) -> None:
    """ValueError naming the option (``prefix`` + its name) for an η < 0, a reduction or a form we do not have."""
    if not eta >= 0.0:
        raise ValueError(f"{prefix}eta must be >= 0, got {eta}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"{prefix}reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if form not in FORMS:
        raise ValueError(f"{prefix}form must be one of {FORMS}, got {form!r}")


class PrimalTrainer(Trainer):
    """``transformers.Trainer`` whose training loss is the model's loss + ``ksvd_eta`` · the KSVD term (``ksvd_terms(model).loss()``).

    Everything else is the Trainer's: DDP / FSDP / DeepSpeed through Accelerate, gradient
    accumulation, mixed precision, logging. The KSVD term follows the task loss's gradient
    accumulation scaling (divided by the accumulation steps when the Trainer does not divide the
    returned loss itself), and under data parallelism each rank regularises its own forwards, which
    the gradient all-reduce averages. Evaluation losses are the task loss alone. The mean KSVD term
    since the previous log is logged as ``ksvd_loss``.

    DDP: Λ enters only the KSVD term, not the model's output, so DDP's ``find_unused_parameters``
    (HF's default for a PreTrainedModel) would mark it unused in the forward and then see its
    gradient arrive from the KSVD term ("marked as ready twice"). With ``ksvd_eta > 0`` the trainer
    therefore sets ``args.ddp_find_unused_parameters = False`` (in place) and refuses ``True``.

    Args:
        ksvd_eta: η ≥ 0 (0 turns the term off). ksvd_reduction: "batch" or "sample";
            ksvd_form: "authors" or "paper" (docs/method.md §4). Other arguments: the Trainer's.
    """

    def __init__(self, model: nn.Module | None = None, args: TrainingArguments | None = None, *more: Any,
                 ksvd_eta: float = 0.0, ksvd_reduction: str = "batch", ksvd_form: str = "authors",
                 **kwargs: Any) -> None:
        _check_ksvd_options("PrimalTrainer: ksvd_", ksvd_eta, ksvd_reduction, ksvd_form)
        if ksvd_eta > 0.0:
            args = args if args is not None else TrainingArguments(output_dir="trainer_output")
            if args.ddp_find_unused_parameters:
                raise ValueError("PrimalTrainer: ddp_find_unused_parameters=True cannot be used with ksvd_eta > 0 "
                                 "(Λ is used only by the KSVD term; DDP would mark it unused, then ready twice)")
            args.ddp_find_unused_parameters = False
        super().__init__(model, args, *more, **kwargs)
        self.ksvd_eta = float(ksvd_eta)
        self.ksvd_reduction = ksvd_reduction
        self.ksvd_form = ksvd_form
        self._ksvd_logged: list[float] = []

    def compute_loss(self, model: nn.Module, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Tensor | int | None = None) -> Tensor | tuple[Tensor, Any]:
        with ksvd_terms(model) as terms:  # this forward's KSVD terms; nothing stays on the layers
            loss, outputs = super().compute_loss(model, inputs, return_outputs=True,
                                                 num_items_in_batch=num_items_in_batch)
        if self.ksvd_eta > 0.0 and model.training and torch.is_grad_enabled():
            term = terms.loss(self.ksvd_reduction, self.ksvd_form)
            self._ksvd_logged.append(float(term.detach()))
            if self._loss_scaled_for_accumulation(num_items_in_batch):
                term = term / self.current_gradient_accumulation_steps
            loss = loss + self.ksvd_eta * term.to(loss.dtype)
        return (loss, outputs) if return_outputs else loss

    def _loss_scaled_for_accumulation(self, num_items_in_batch: Tensor | int | None) -> bool:
        """Whether Trainer.training_step will leave the returned loss undivided (its own rule)."""
        if self.loss_is_scaled_for_ga is not None:
            return bool(self.loss_is_scaled_for_ga)
        return bool((self.model_accepts_loss_kwargs and num_items_in_batch is not None)
                    or self.compute_loss_func is not None)

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        if self._ksvd_logged and "loss" in logs:
            logs = {**logs, "ksvd_loss": sum(self._ksvd_logged) / len(self._ksvd_logged)}
            self._ksvd_logged = []
        super().log(logs, *args, **kwargs)


class KSVDLossFunc:
    """A ``compute_loss_func`` for ``transformers.Trainer``: the model's own task loss + η · KSVD loss.

        loss_func = hf.KSVDLossFunc(model, eta=0.1, args=training_args)
        trainer = transformers.Trainer(model=model, args=training_args, train_dataset=ds, compute_loss_func=loss_func)

    It holds an open :func:`~primal_attention.ksvd_terms` collector of ``model`` (a handle: ``close()``
    it, or drop the object, when training is over), so every training forward's KSVD terms reach the
    next call; forwards without gradients (evaluation) are not kept. The task loss is the model's
    ``loss_function`` on ``outputs.logits`` and the labels (causal and masked language models). With
    ``args``, the KSVD term is divided by its ``gradient_accumulation_steps``, as the Trainer divides
    nothing a ``compute_loss_func`` returns. The mean KSVD term since the previous call of
    :meth:`pop_logged` is kept for logging.
    """

    def __init__(self, model: nn.Module, eta: float, *, args: TrainingArguments | None = None,
                 reduction: str = "batch", form: str = "authors") -> None:
        _check_ksvd_options("KSVDLossFunc: ", eta, reduction, form)
        if not callable(getattr(model, "loss_function", None)) or getattr(model.config, "vocab_size", None) is None:
            raise ValueError(f"KSVDLossFunc: {type(model).__name__} has no language-model loss_function; use "
                             "hf.PrimalTrainer, which adds the term to any head's loss")
        self.model, self.eta, self.reduction, self.form = model, float(eta), reduction, form
        self.accumulation = 1 if args is None else int(args.gradient_accumulation_steps)
        self.terms = ksvd_terms(model)
        self._logged: list[float] = []

    def __call__(self, outputs: Any, labels: Tensor | None, num_items_in_batch: Tensor | int | None = None) -> Tensor:
        if labels is None:
            raise ValueError("KSVDLossFunc: the batch has no labels (the task loss needs them)")
        loss = self.model.loss_function(outputs.logits, labels, vocab_size=self.model.config.vocab_size,
                                        num_items_in_batch=num_items_in_batch)
        if self.eta > 0.0 and self.model.training and torch.is_grad_enabled():
            term = self.terms.loss(self.reduction, self.form)
            self._logged.append(float(term.detach()))
            loss = loss + self.eta * (term / self.accumulation).to(loss.dtype)
        else:
            self.terms.clear()
        return loss

    def pop_logged(self) -> float | None:
        """The mean KSVD term of the training calls since the previous call (None if none)."""
        logged, self._logged = self._logged, []
        return sum(logged) / len(logged) if logged else None

    def close(self) -> None:
        """Close the collector (the model's forwards are no longer collected)."""
        self.terms.close()

