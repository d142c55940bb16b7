"""Page faults and time of one ListOps training step, with and without retain_freed_memory.

    .venv/bin/python scripts/allocator_probe.py            # glibc defaults
    .venv/bin/python scripts/allocator_probe.py --retain   # primal_attention.allocator.retain_freed_memory()

Run the two in separate processes (the setting is process-wide). Prints, per N, the step time and the
minor page faults and system time of that step (``resource.getrusage``).
"""

from __future__ import annotations

import argparse
import resource
import time

import torch

from primal_attention.allocator import retain_freed_memory
from primal_attention.bench.workloads import Case, build


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--retain", action="store_true")
    p.add_argument("--method", default="primal")
    p.add_argument("--seq-lens", default="4096,8192,16384")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.retain:
        print("retain_freed_memory applied:", retain_freed_memory())
    for n in (int(v) for v in args.seq_lens.split(",")):
        step = build(Case("train", args.method, n, 8))
        step()
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        step()
        dt, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
        print(f"N {n:6d}  {dt * 1e3:7.0f} ms  minor faults {r1.ru_minflt - r0.ru_minflt:8d}  "
              f"system {r1.ru_stime - r0.ru_stime:.3f} s")


if __name__ == "__main__":
    main()
