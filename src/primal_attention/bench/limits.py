"""What this machine can do at best: measured matmul throughput and memory bandwidth.

Both run in the same process and session as the grid, so the distance-to-limit figures compare
numbers taken under the same load:

* matmul: float32 GEMMs, the median of a few calls each — a square 2048³ one (what the BLAS reaches
  at its best) and the skinny shape of the primal layer's matmuls (2048 rows, K 128, 64 columns);
* bandwidth: ``copy_`` between two 256 MiB float32 buffers (bytes read + written per second) and a
  read-only ``sum`` over one of them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from primal_attention.bench.timing import time_callable


def _median_time(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    return time_callable(fn, warmup=1, repeats=repeats, device=device).median


def measure_limits(device: str = "cpu", *, repeats: int = 7, buffer_mib: int = 256) -> dict[str, float]:
    """Matmul throughput (GFLOP/s) and memory bandwidth (GB/s) of ``device``, measured now."""
    dev = torch.device(device)
    gen = torch.Generator().manual_seed(0)
    out: dict[str, float] = {}
    size = 4096 if dev.type == "cuda" else 2048
    a = torch.randn(size, size, generator=gen).to(dev)
    b = torch.randn(size, size, generator=gen).to(dev)
    t = _median_time(lambda: a @ b, repeats, dev)
    out[f"matmul_square_{size}_gflops"] = 2 * size**3 / t / 1e9
    rows = 2048 if dev.type == "cpu" else 65536
    x = torch.randn(rows, 128, generator=gen).to(dev)
    w = torch.randn(128, 64, generator=gen).to(dev)
    t = _median_time(lambda: x @ w, repeats * 4, dev)
    out["matmul_layer_shape_gflops"] = 2 * rows * 128 * 64 / t / 1e9
    if dev.type == "cuda":
        ab = a.bfloat16()
        bb = b.bfloat16()
        t = _median_time(lambda: ab @ bb, repeats, dev)
        out[f"matmul_square_{size}_bf16_gflops"] = 2 * size**3 / t / 1e9
    numel = buffer_mib * 2**20 // 4
    src = torch.ones(numel, device=dev)
    dst = torch.empty_like(src)
    t = _median_time(lambda: dst.copy_(src), repeats, dev)
    out["bandwidth_copy_gbs"] = 2 * numel * 4 / t / 1e9
    t = _median_time(lambda: src.sum(), repeats, dev)
    out["bandwidth_read_gbs"] = numel * 4 / t / 1e9
    out["matmul_peak_gflops"] = max(v for k, v in out.items() if k.startswith("matmul_square") and "bf16" not in k)
    out["bandwidth_peak_gbs"] = max(out["bandwidth_copy_gbs"], out["bandwidth_read_gbs"])
    return out
