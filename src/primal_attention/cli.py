"""The ``primal`` command line."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path


def _selfcheck(args: argparse.Namespace) -> int:
    import torch

    from primal_attention import PrimalAttention
    from primal_attention.bench.timing import time_callable
    from primal_attention.checks import check_case, reference_files

    torch.manual_seed(0)
    dirs = [Path(d) for d in args.reference_dir]
    ok = True
    print(f"{'reference case':32s} {'path':9s} " + " ".join(f"{k:>13s}" for k in ("out", "J batch", "J sample", "grad x")))
    for path in reference_files(*dirs):
        for fused in (True, False):
            r = check_case(path, fused=fused)
            ok &= r.passed()
            errs = [r.errors.get(k) for k in ("out", "ksvd_j_batch", "ksvd_j_sample", "grad_x")]
            cells = " ".join(f"{e:13.2e}" if e is not None else f"{'-':>13s}" for e in errs)
            print(f"{r.name:32s} {'fast' if fused else 'reference':9s} {cells}")
    print("reference vectors:", "all within rtol 1e-5 / atol 1e-6" if ok else "MISMATCH")

    b, n, d, h, s, m = args.batch, args.seq_len, args.dim, args.heads, args.rank, args.num_samples
    layer = PrimalAttention(d, h, s, num_samples=m)
    x = torch.randn(b, n, d, requires_grad=True)
    result: dict[str, object] = {"shape": dict(B=b, N=n, D=d, H=h, s=s, n=m), "threads": torch.get_num_threads()}

    def step() -> None:
        out = layer(x)
        (out.square().mean() + layer.ksvd_objective() ** 2).backward()

    for fused in (True, False):
        layer.fused = fused
        t = time_callable(step, warmup=1, repeats=args.repeats)
        result["fast" if fused else "reference"] = t.as_dict()
    ratio = result["reference"]["median"] / result["fast"]["median"]
    result["reference_over_fast"] = ratio
    print(
        f"layer + KSVD, forward+backward, B {b} N {n} D {d} H {h} s {s} n {m} ({result['threads']} threads): "
        f"fast {result['fast']['median'] * 1e3:.1f} ms, reference {result['reference']['median'] * 1e3:.1f} ms, "
        f"ratio {ratio:.2f}x"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0 if ok else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="primal", description="Primal-Attention: train, benchmark, analyse.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("selfcheck", help="reproduce the authors' reference vectors and time the layer")
    p.add_argument("--reference-dir", action="append", default=[], help="extra directory of reference .npz files")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--rank", type=int, default=20)
    p.add_argument("--num-samples", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", help="write the timing as JSON here")
    p.set_defaults(func=_selfcheck)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
