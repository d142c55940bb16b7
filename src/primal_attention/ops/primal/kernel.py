"""Which implementation runs the folded path's row loop: PyTorch or Triton.

The choice is an argument (``PrimalAttention(kernel=...)``, ``fused.primal_attention(kernel=...)``):

* ``"auto"`` (default): Triton on CUDA tensors when the ``triton`` package imports, else PyTorch;
* ``"torch"``: always :mod:`primal_attention.ops.primal.folded`;
* ``"triton"``: always :mod:`primal_attention.ops.primal.triton_folded` (``pip install triton``; CUDA
  builds of torch ship it). On CPU tensors this needs Triton's interpreter, ``TRITON_INTERPRET=1``,
  which is how the tests check the kernels without a GPU.

The environment variable ``PRIMAL_ATTENTION_KERNEL`` (same values) overrides every argument; it is
read once, the first time a kernel is chosen, so a whole run uses one choice.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from typing import Literal, get_args

import torch

Kernel = Literal["auto", "torch", "triton"]
ENV = "PRIMAL_ATTENTION_KERNEL"
CHOICES: tuple[str, ...] = get_args(Kernel)


@functools.cache
def triton_available() -> bool:
    """True when the ``triton`` package can be imported here."""
    return importlib.util.find_spec("triton") is not None


#: the override as first read (a plain dict, not a functools cache: torch.compile traces through it).
_OVERRIDE: dict[str, str | None] = {}


def env_override() -> str | None:
    """The value of ``PRIMAL_ATTENTION_KERNEL``, None when unset or empty: read at the first call,
    the same value afterwards (:func:`reset_env_override` reads it again)."""
    if "value" not in _OVERRIDE:
        value = os.environ.get(ENV, "").strip().lower() or None
        if value is not None and value not in CHOICES:
            raise ValueError(f"{ENV} must be one of {', '.join(CHOICES)}, got {value!r}")
        _OVERRIDE["value"] = value
    return _OVERRIDE["value"]


def reset_env_override() -> None:
    """Forget the value read, so the next choice reads ``PRIMAL_ATTENTION_KERNEL`` again (tests)."""
    _OVERRIDE.clear()


def check_kernel(kernel: str, name: str = "kernel") -> None:
    """One clear error for a value that is not a :data:`Kernel`."""
    if kernel not in CHOICES:
        raise ValueError(f"{name} must be one of {', '.join(CHOICES)}, got {kernel!r}")


def resolve_kernel(kernel: Kernel, device: torch.device) -> Literal["torch", "triton"]:
    """The implementation of the folded path for tensors on ``device``: the environment override if
    set, else ``kernel``; ``"auto"`` resolved as the module docstring says."""
    check_kernel(kernel)
    override = env_override()
    choice = override or kernel
    source = f"{ENV}=triton" if override == "triton" else "kernel='triton'"
    if choice == "triton":
        if not triton_available():
            raise RuntimeError(f"{source}, but the triton package is not installed (pip install triton)")
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError(f"{source} on {device.type} tensors needs Triton's interpreter: set TRITON_INTERPRET=1")
        return "triton"
    if choice == "auto" and device.type == "cuda" and triton_available():
        return "triton"
    return "torch"
