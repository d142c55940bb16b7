"""PNG plots of a benchmark run: time and memory against N, per level, dtype and mode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from primal_attention.bench.analysis import curves
from primal_attention.bench.methods import METHODS
from primal_attention.bench.tables import STOP_REASONS


def plot(result: dict[str, Any], out_dir: Path, *, prefix: str = "") -> dict[str, str]:
    """Log-log time vs N and peak memory vs N, one line per method, per (level, dtype, mode)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {}
    for (level, dtype, mode), methods in curves(result["records"]).items():
        for kind, ylabel in (("time", "time per call (s)"), ("memory", "peak memory of one call (MiB)")):
            series = {n: c for n, c in methods.items() if c[kind]}
            if not series:
                continue
            fig, ax = plt.subplots(figsize=(6.4, 4.4))
            for name, c in series.items():
                ns = sorted(c[kind])
                ys = [c[kind][n] / (2**20 if kind == "memory" else 1) for n in ns]
                label = METHODS[name].label if name in METHODS else name
                if c["stopped"]:
                    label += f" (stops at {c['stopped'][0]}: {STOP_REASONS.get(c['stopped'][1], c['stopped'][1])})"
                style = "-" if name.startswith("primal") or name.startswith("softmax") else "--"
                lw = 2.4 if name == "primal" else 1.4
                ax.plot(ns, ys, style, marker="o", ms=3.5, lw=lw, label=label)
                if c["stopped"]:
                    ax.plot(ns[-1], ys[-1], "x", color="black", ms=8)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length N")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{level}, {dtype}, {mode}, B {result['meta']['config']['batch']}")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
            fig.tight_layout()
            name = f"{prefix}{kind}_{level}_{dtype}_{mode}.png"
            fig.savefig(out_dir / name, dpi=110)
            plt.close(fig)
            files[f"{kind}_{level}_{dtype}_{mode}"] = name
    return files
