"""Optional fused kernels of the primal layer's folded path (docs/method.md §4, efficiency note).

:mod:`primal_attention.kernels.triton_folded` is a Triton version of
:class:`primal_attention.functional._FoldedPrimal` for CUDA (``pip install triton``; CUDA builds of
torch ship it). :func:`kernel_choice` says which implementation the folded path takes; the
environment variable ``PRIMAL_ATTENTION_KERNEL`` overrides it: ``torch`` (always the PyTorch path),
``triton`` (always Triton; on CPU this needs Triton's interpreter, ``TRITON_INTERPRET=1``, which is
how the tests check it without a GPU), ``auto`` (default: Triton on CUDA when it imports).
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

ENV = "PRIMAL_ATTENTION_KERNEL"
CHOICES = ("auto", "torch", "triton")


@functools.cache
def triton_available() -> bool:
    """True when the ``triton`` package can be imported here."""
    return importlib.util.find_spec("triton") is not None


def kernel_choice(device: torch.device) -> str:
    """``"triton"`` or ``"torch"``: the implementation of the folded path for tensors on ``device``."""
    choice = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if choice not in CHOICES:
        raise ValueError(f"{ENV} must be one of {', '.join(CHOICES)}, got {choice!r}")
    if choice == "triton":
        if not triton_available():
            raise RuntimeError(f"{ENV}=triton, but the triton package is not installed (pip install triton)")
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError(f"{ENV}=triton on {device.type} tensors needs Triton's interpreter: set TRITON_INTERPRET=1")
        return "triton"
    if choice == "auto" and device.type == "cuda" and triton_available():
        return "triton"
    return "torch"
