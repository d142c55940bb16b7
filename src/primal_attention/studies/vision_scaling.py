"""Throughput and peak memory of a ViT vs image size at a fixed patch size: softmax vs primal blocks.

Each case (image size, model) runs in its own process so that its peak resident memory is its own:
a ViT of the Fashion-MNIST shape (patch 4, D 64, depth 4, H 4, MLP 128; primal s 20 sampling every
token), batch 8, one thread. Training = forward + backward (+ η·KSVD) + AdamW step; inference = forward
under ``inference_mode``. Times are medians of ``--repeats`` calls after one warm-up; the two models of a
size run back to back, so compare them as ratios. Writes docs/results/vision/scaling.{json,md,png}.

    .venv/bin/python scripts/vision_scaling.py [--sizes 28,56,112,224] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from primal_attention.studies.paths import ROOT

OUT = ROOT / "docs" / "results" / "vision"
MODELS = {"softmax": "transformer", "primal": "primalformer"}


def case(size: int, model: str, repeats: int, batch: int) -> dict:
    import torch

    import primal_attention as pa
    from primal_attention.models.vision import VisionTransformer, vit_cpu

    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = VisionTransformer(vit_cpu(10, image_size=size, in_channels=1, attention=MODELS[model],
                                    attention_options={"primal": {"rank": 20}}))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    x, y = torch.randn(batch, 1, size, size), torch.randint(0, 10, (batch,))
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    terms = pa.ksvd_terms(net)  # a handle: every training forward's KSVD term, consumed by terms.loss()

    def train() -> None:
        loss = torch.nn.functional.cross_entropy(net(x), y)
        if model == "primal":
            loss = loss + 0.05 * terms.loss()
        opt.zero_grad()
        loss.backward()
        opt.step()

    def infer() -> None:
        with torch.inference_mode():
            net.eval()
            net(x)
            net.train()

    out = {"image_size": size, "model": model, "tokens": (size // 4) ** 2 + 1, "batch": batch}
    for name, fn in (("train", train), ("infer", infer)):
        fn()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        times.sort()
        out[f"{name}_s"] = times[len(times) // 2]
        out[f"{name}_images_per_s"] = batch / out[f"{name}_s"]
    out["peak_rss_growth_mib"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="28,56,112,224")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--case", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.case:
        size, model = args.case.split(":")
        print(json.dumps(case(int(size), model, args.repeats, args.batch)))
        return
    rows = []
    for size in [int(s) for s in args.sizes.split(",")]:
        for model in MODELS:
            proc = subprocess.run([sys.executable, "-m", "primal_attention.studies.vision_scaling", "--case", f"{size}:{model}", "--repeats", str(args.repeats),
                                   "--batch", str(args.batch)], capture_output=True, text=True, check=True)
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(rows[-1], flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "scaling.json").write_text(json.dumps({"command": "scripts/vision_scaling.py " + " ".join(sys.argv[1:]),
                                                  "rows": rows}, indent=2))
    by = {(r["image_size"], r["model"]): r for r in rows}
    sizes = sorted({r["image_size"] for r in rows})
    lines = [
        f"Measured with `.venv/bin/python scripts/vision_scaling.py {' '.join(sys.argv[1:])}` (CPU, one thread,",
        f"batch {args.batch}, median of {args.repeats}; the machine had other jobs running, so read the ratios, which were",
        "measured back to back). Model: the Fashion-MNIST ViT (patch 4, D 64, 4 blocks, H 4), all blocks softmax",
        "(SDPA) or all primal (s 20, every token sampled); training includes the KSVD term. Peak memory = growth of",
        "the process's peak resident set during the measurement.",
        "",
        "| image | tokens | train img/s softmax | train img/s primal | speed-up | infer img/s softmax | infer img/s primal | speed-up | peak MiB softmax | peak MiB primal |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in sizes:
        a, b = by[(s, "softmax")], by[(s, "primal")]
        lines.append(f"| {s} px | {a['tokens']} | {a['train_images_per_s']:.1f} | {b['train_images_per_s']:.1f} | "
                     f"{a['train_s'] / b['train_s']:.2f}× | {a['infer_images_per_s']:.1f} | {b['infer_images_per_s']:.1f} | "
                     f"{a['infer_s'] / b['infer_s']:.2f}× | {a['peak_rss_growth_mib']:.0f} | {b['peak_rss_growth_mib']:.0f} |")
    lines += ["", "![time per training step vs tokens](vision/scaling.png)"]
    (OUT / "scaling.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for model in MODELS:
        pts = [by[(s, model)] for s in sizes]
        tok = [r["tokens"] for r in pts]
        axes[0].loglog(tok, [r["train_s"] for r in pts], "o-", label=model)
        axes[1].loglog(tok, [max(r["peak_rss_growth_mib"], 1) for r in pts], "o-", label=model)
    axes[0].set(xlabel="tokens", ylabel="s per training step", title="time")
    axes[1].set(xlabel="tokens", ylabel="peak RSS growth (MiB)", title="memory")
    for ax in axes:
        ax.legend()
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(OUT / "scaling.png", dpi=110)
    print("wrote", OUT / "scaling.md")


if __name__ == "__main__":
    main()
