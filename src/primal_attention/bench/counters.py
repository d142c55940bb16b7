"""FLOPs and bytes of one call, counted from the operators it runs, and the layer's analytic floor.

:class:`OpCounter` is a ``TorchDispatchMode`` that sees every ATen operator of a call, forward and
backward (custom autograd Functions included):

* FLOPs: 2·M·N·K per matmul (mm, addmm, bmm, baddbmm, in place or not, any overload) and PyTorch's
  own SDPA formulas for the fused attention kernels (including the CPU flash kernel, which
  ``torch.utils.flop_counter`` does not list). Elementwise work is not counted as FLOPs.
* bytes: for every operator that is not a view, the bytes of its tensor inputs plus its outputs —
  the traffic if nothing stayed in cache between operators (an upper bound for a chunked kernel
  whose chunks do stay in cache, about the real traffic for whole-tensor operators).

:func:`primal_layer_floor` is the compulsory work of one primal layer step (fold path, forward +
backward + KSVD): matmul FLOPs and the bytes that must cross main memory at least once.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
from torch.utils import flop_counter
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

aten = torch.ops.aten

_MATMUL = {"mm", "addmm", "addmm_", "bmm", "baddbmm", "baddbmm_", "matmul"}
_SDPA_FWD = {
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
}
_SDPA_BWD = {name + "_backward" for name in _SDPA_FWD}


def _matmul_flops(name: str, args: tuple) -> int:
    if name in ("mm", "bmm", "matmul"):
        a, b = args[0], args[1]
    else:  # addmm(self, a, b), baddbmm(self, a, b)
        a, b = args[1], args[2]
    if a.dim() == 2:
        return 2 * a.shape[0] * a.shape[1] * b.shape[1]
    return 2 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[-1]


def _sdpa_flops(name: str, args: tuple) -> int:
    if name in _SDPA_FWD:
        q, k, v = args[0], args[1], args[2]
        return int(flop_counter.sdpa_flop_count(q.shape, k.shape, v.shape))
    grad_out, q, k, v = args[0], args[1], args[2], args[3]
    return int(flop_counter.sdpa_backward_flop_count(grad_out.shape, q.shape, k.shape, v.shape))


class OpCounter(TorchDispatchMode):
    """Count matmul / attention FLOPs and operator-level bytes of what runs inside the ``with``."""

    def __init__(self) -> None:
        super().__init__()
        self.flops = 0
        self.bytes = 0
        self.flops_by_op: dict[str, int] = defaultdict(int)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func._overloadpacket.__name__
        flops = 0
        if name in _MATMUL:
            flops = _matmul_flops(name, args)
        elif name in _SDPA_FWD or name in _SDPA_BWD:
            flops = _sdpa_flops(name, args)
        if flops:
            self.flops += flops
            self.flops_by_op[name] += flops
        if not func.is_view:
            tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            self.bytes += sum(t.numel() * t.element_size() for t in tensors + outs)
        return out


def count(fn: Any) -> dict[str, Any]:
    """Run ``fn()`` once under :class:`OpCounter`: {"flops", "bytes", "flops_by_op"}."""
    with OpCounter() as c:
        fn()
    return {"flops": c.flops, "bytes": c.bytes, "flops_by_op": dict(c.flops_by_op)}


def primal_layer_floor(batch: int, seq_len: int, dim: int, heads: int, itemsize: int = 4) -> dict[str, float]:
    """Compulsory FLOPs and bytes of one non-causal primal layer step (forward, backward, KSVD).

    Matmuls with BN = B·N rows, D width, d = D/H: q/k projection 4·BN·D², folded output 4·BN·D²,
    Gram matrices 4·BN·D·d (forward); d(fold) 4·BN·D², d[q̂|k̂] 4·BN·D², Gram backward 4·BN·D·d,
    dx 4·BN·D², dW 4·BN·D² (backward): BN·(24·D² + 8·D·d) in all.
    Bytes that must cross main memory at least once: forward reads x and writes [q̂|k̂] (2D), the
    inverse norms (2H) and out; backward reads grad_out, x, [q̂|k̂], the norms and writes dx:
    BN·(9·D + 4·H)·itemsize.
    """
    rows = batch * seq_len
    d = dim // heads
    return {
        "flops": float(rows * (24 * dim * dim + 8 * dim * d)),
        "bytes": float(rows * (9 * dim + 4 * heads) * itemsize),
    }
