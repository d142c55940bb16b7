"""What a run optimises and reports: classification (accuracy), language modelling (perplexity,
bits/byte) or offline RL (action regression, scored by rollouts).

A :class:`Task` gives the trainer the mean task loss of a batch, the metrics of an evaluation, which
metric selects the evaluation point (and in which direction), and which metrics a run reports. A run's
data family (:mod:`primal_attention.train.families`) says which task it has; :meth:`Task.evaluate` runs
one evaluation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from primal_attention.data.base import Batch

__all__ = ["ACTION_REGRESSION", "CLASSIFICATION", "LANGUAGE_MODEL", "ActionRegression", "LanguageModel", "Task",
           "evaluate"]


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

    @torch.no_grad()
    def evaluate(self, model: nn.Module, data, batch_size: int, device: torch.device) -> dict[str, float]:
        """One pass over ``data`` in eval mode (the model's mode is restored): ``acc`` and ``loss`` (mean
        cross-entropy per target), and what :meth:`_extra` adds."""
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
                nbytes += self._bytes(data, b)
        finally:
            model.train(was_training)
        out = {"acc": correct / max(count, 1), "loss": loss / max(count, 1)}
        out.update(self._extra(loss, nbytes, out["loss"]))
        return out

    def _bytes(self, data, batch: Batch) -> int:
        return 0

    def _extra(self, summed_loss: float, nbytes: int, mean_loss: float) -> dict[str, float]:
        return {}


@dataclass(frozen=True)
class LanguageModel(Task):
    """Next-token prediction: :meth:`evaluate` adds ``ppl`` = exp(loss) and ``bpb`` = summed NLL /
    (ln 2 · the UTF-8 bytes the targets stand for), comparable across tokenisers."""

    def _bytes(self, data, batch: Batch) -> int:
        return int(data.token_bytes[batch.y.cpu()].sum())

    def _extra(self, summed_loss: float, nbytes: int, mean_loss: float) -> dict[str, float]:
        return {"ppl": math.exp(min(mean_loss, 700.0)), "bpb": summed_loss / (math.log(2) * max(nbytes, 1))}


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

    def evaluate(self, model: nn.Module, data, batch_size: int, device: torch.device) -> dict[str, float]:
        """Rollouts of ``data`` (a :class:`~primal_attention.train.rollout.RolloutSet`) in the environment."""
        from primal_attention.train.rollout import rollout

        return rollout(model, data, device)


CLASSIFICATION = Task("classification", select="acc", maximize=True, reported=("acc",))
LANGUAGE_MODEL = LanguageModel("language_model", select="loss", maximize=False, reported=("loss", "ppl", "bpb"))
ACTION_REGRESSION = ActionRegression("action_regression", select="score", maximize=True,
                                     reported=("score", "score_std", "return", "length"))


def evaluate(model: nn.Module, data, batch_size: int, device: torch.device, task: Task = CLASSIFICATION) -> dict[str, float]:
    """``task.evaluate(model, data, batch_size, device)``: one evaluation of ``model`` on ``data``."""
    return task.evaluate(model, data, batch_size, device)
