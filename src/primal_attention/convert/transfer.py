"""Attention transfer: the losses that make a primal layer imitate the softmax layer it replaced.

The target of layer i is the original softmax layer's output on the original model's own input to
that layer. Hooks on the original's attention modules record, in one forward, every chosen layer's
input (the call's arguments) and output. "all" mode feeds each primal layer the recorded input of
its softmax layer and trains every layer at once (one teacher forward per step); "layer" mode trains
one layer after the other inside the partly converted model, so a later layer sees (and learns to
correct) what the earlier primal layers produce.

The error is the relative MSE ``‖y_primal − y_softmax‖² / ‖y_softmax‖²`` over the batch, so layers of
different output scale weigh alike and 1.0 means "no better than predicting zeros".
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from primal_attention.convert.subjects import Subject, output_tensor


@dataclass
class Call:
    """One recorded call of an attention module: its arguments and its output tensor (B, N, D)."""

    args: tuple
    kwargs: dict[str, Any]
    output: Tensor


class StopForward(Exception):
    """Raised by a hook once the layer being trained has run: the rest of the model is not needed."""


@contextmanager
def record_calls(modules: Sequence[nn.Module], stop_after: int | None = None) -> Iterator[dict[int, Call]]:
    """Record every call of ``modules[i]`` under key i; ``stop_after=i`` raises :class:`StopForward`
    once module i has run (catch it around the forward)."""
    seen: dict[int, Call] = {}
    handles = []

    def hook_for(i: int):
        def hook(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            seen[i] = Call(args, kwargs, output_tensor(output))
            if stop_after == i:
                raise StopForward

        return hook

    try:
        for i, m in enumerate(modules):
            handles.append(m.register_forward_hook(hook_for(i), with_kwargs=True))
        yield seen
    finally:
        for h in handles:
            h.remove()


def relative_mse(y: Tensor, target: Tensor) -> Tensor:
    """‖y − target‖² / ‖target‖², in float32."""
    y, target = y.float(), target.float()
    return (y - target).pow(2).sum() / target.pow(2).sum().clamp_min(1e-12)


def teacher_calls(subject: Subject, batch: Any, layers: Sequence[int], stop_after: int | None = None) -> dict[int, Call]:
    """The original model's recorded calls of ``layers`` on ``batch`` (no gradients)."""
    modules = subject.attention_modules(subject.original)
    with torch.no_grad(), record_calls([modules[i] for i in layers], stop_after) as seen:
        try:
            subject.forward(subject.original, batch)
        except StopForward:
            pass
    return {layer: seen[k] for k, layer in enumerate(layers)}


def all_at_once_loss(subject: Subject, student: nn.Module, batch: Any, layers: Sequence[int]) -> dict[int, Tensor]:
    """Relative MSE of every converted layer fed the original's input to that layer."""
    targets = teacher_calls(subject, batch, layers)
    modules = subject.attention_modules(student)
    return {i: relative_mse(output_tensor(modules[i](*targets[i].args, **targets[i].kwargs)), targets[i].output)
            for i in layers}


def in_model_loss(subject: Subject, student: nn.Module, batch: Any, layer: int) -> Tensor:
    """Relative MSE of converted layer ``layer`` inside the student (earlier layers as converted so far)."""
    target = teacher_calls(subject, batch, [layer], stop_after=0)[layer].output
    modules = subject.attention_modules(student)
    with record_calls([modules[layer]], stop_after=0) as seen:
        try:
            subject.forward(student, batch)
        except StopForward:
            pass
    return relative_mse(seen[0].output, target)


@torch.no_grad()
def layer_errors(subject: Subject, student: nn.Module, layers: Sequence[int], batches: Sequence[Any]) -> dict[str, dict[int, float]]:
    """Relative MSE per converted layer on held-out batches, two ways: ``isolated`` (each layer fed the
    original's input, what "all" mode trains) and ``in_model`` (inside the converted model)."""
    was = student.training
    student.eval()
    iso = {i: 0.0 for i in layers}
    inside = {i: 0.0 for i in layers}
    try:
        for batch in batches:
            for i, err in all_at_once_loss(subject, student, batch, layers).items():
                iso[i] += float(err) / len(batches)
            targets = teacher_calls(subject, batch, layers)
            with record_calls([subject.attention_modules(student)[i] for i in layers]) as seen:
                subject.forward(student, batch)
            for k, i in enumerate(layers):
                inside[i] += float(relative_mse(seen[k].output, targets[i].output)) / len(batches)
    finally:
        student.train(was)
    return {"isolated": iso, "in_model": inside}
