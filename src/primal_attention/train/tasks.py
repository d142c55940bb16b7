"""What a run optimises and reports: classification (accuracy), language modelling (perplexity,
bits/byte) or offline RL (action regression, scored by rollouts).

A :class:`Task` gives the trainer the mean task loss of a batch, the metrics of an evaluation, which
metric selects the evaluation point (and in which direction), and which metrics a run reports.
:func:`task_for` picks it from the data; :func:`evaluate` runs one evaluation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from primal_attention.data.base import Batch

__all__ = ["ACTION_REGRESSION", "CLASSIFICATION", "LANGUAGE_MODEL", "ActionRegression", "Task", "evaluate", "task_for"]


@dataclass(frozen=True)
class Task:
    """name; select: the metric that selects the evaluation point (``maximize`` says its direction);
    reported: the metrics a run's metrics.json carries per split (``test_<m>``, ``best_val_<m>``, ...)."""

    name: str
    select: str
    maximize: bool
    reported: tuple[str, ...]

    def loss(self, output: Tensor, batch: Batch) -> Tensor:
        """Mean cross-entropy over the batch's targets, in float32: output (B, C) with y (B,), or
        logits (B, L, V) with next tokens y (B, L)."""
        return F.cross_entropy(output.float().reshape(-1, output.shape[-1]), batch.y.reshape(-1))

    def targets(self, batch: Batch) -> int:
        """Targets the task loss averages over: examples (classification) or tokens (LM)."""
        return batch.y.numel()

    def batch_accuracy(self, output: Tensor, batch: Batch) -> float:
        """Share of targets predicted right (the train-batch figure of the progress bar)."""
        return float((output.argmax(-1) == batch.y).float().mean())

    def better(self, a: float, b: float) -> bool:
        """Whether metric value ``a`` beats ``b`` for :attr:`select`."""
        return a > b if self.maximize else a < b


@dataclass(frozen=True)
class ActionRegression(Task):
    """A Decision Transformer's task: mean squared error of the predicted actions (B, K, A) over the
    real (mask) steps; evaluations are rollouts, selected on the D4RL-normalised score."""

    def loss(self, output: Tensor, batch: Batch) -> Tensor:
        err = (output.float() - batch.y.float()).pow(2).mean(-1)
        return err[batch.mask].mean()

    def targets(self, batch: Batch) -> int:
        return int(batch.mask.sum())

    def batch_accuracy(self, output: Tensor, batch: Batch) -> float:
        return float("nan")  # no accuracy for actions


CLASSIFICATION = Task("classification", select="acc", maximize=True, reported=("acc",))
LANGUAGE_MODEL = Task("language_model", select="loss", maximize=False, reported=("loss", "ppl", "bpb"))
ACTION_REGRESSION = ActionRegression("action_regression", select="score", maximize=True,
                                     reported=("score", "score_std", "return", "length"))


def task_for(data) -> Task:
    """The task of a dataset: language modelling for :class:`~primal_attention.data.lm.LMData`
    (it has ``token_bytes``), action regression for RL segments and rollouts (they have
    ``state_mean``), else classification."""
    if hasattr(data, "state_mean"):
        return ACTION_REGRESSION
    return LANGUAGE_MODEL if hasattr(data, "token_bytes") else CLASSIFICATION


@torch.no_grad()
def evaluate(model: nn.Module, data, batch_size: int, device: torch.device) -> dict[str, float]:
    """One pass over ``data`` in eval mode (the model's mode is restored).

    Classification: ``acc`` and ``loss`` (mean cross-entropy per example). Language model:
    ``loss`` (mean NLL per target token, nats), ``ppl`` = exp(loss), ``bpb`` = summed NLL /
    (ln 2 · the UTF-8 bytes the targets stand for), comparable across tokenisers, and ``acc``
    (next-token accuracy).
    """
    if hasattr(data, "target_return"):  # a RolloutSet
        from primal_attention.train.rollout import rollout

        return rollout(model, data, device)
    lm = task_for(data) is LANGUAGE_MODEL
    was_training = model.training
    model.eval()
    correct, loss, count, nbytes = 0, 0.0, 0, 0
    try:
        for start in range(0, len(data), batch_size):
            b = data.batch(torch.arange(start, min(start + batch_size, len(data)))).to(device)
            logits = model(**b.inputs).float()
            loss += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), b.y.reshape(-1), reduction="sum").item()
            correct += int((logits.argmax(-1) == b.y).sum())
            count += b.y.numel()
            if lm:
                nbytes += int(data.token_bytes[b.y.cpu()].sum())
    finally:
        model.train(was_training)
    out = {"acc": correct / max(count, 1), "loss": loss / max(count, 1)}
    if lm:
        out.update(ppl=math.exp(min(out["loss"], 700.0)), bpb=loss / (math.log(2) * max(nbytes, 1)))
    return out
