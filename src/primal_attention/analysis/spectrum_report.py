"""The output of a spectrum analysis: ``spectrum.json``, the PNGs, and the tables ``primal spectrum``
prints (see :mod:`primal_attention.analysis.spectrum` for what the curves are)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


__all__ = ["components_table", "ksvd_table", "write_spectrum"]


def _short(name: str) -> str:
    return name.replace("encoder.blocks.", "L").replace(".attn", "")


def write_spectrum(result: dict[str, Any], out_dir: str | Path, *, title: str = "") -> list[Path]:
    """Write ``spectrum.json`` and the PNGs to ``out_dir``; returns the paths written.

    PNGs: ``cumulative_index.png`` / ``cumulative_fraction.png`` (one panel per view, mean ± 1 std
    band over the (sample, head) matrices of each layer group), ``heatmap.png`` (group × component
    index, mean σ_j/σ_1) and ``components.png`` (components for 90% / 99%, mean ± std).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "spectrum.json"]
    written[0].write_text(json.dumps(result, indent=1))
    groups = result.get("groups") or result["layers"]
    rows = [(name, view, s) for name, e in groups.items() for view, s in e["views"].items()]
    if not rows:
        return written
    views = sorted({v for _, v, _ in rows})
    prefix = (title + ": ") if title else ""

    for grid, curve, fname, xlabel in (
        ("index_grid", "cumulative", "cumulative_index.png", "component index j"),
        ("fraction_grid", "fraction_cumulative", "cumulative_fraction.png", "fraction of components j / r"),
    ):
        fig, axes = plt.subplots(2, len(views), figsize=(5 * len(views), 7.2), squeeze=False)
        for row, (prefix_key, ylabel) in enumerate((("", "cumulative Σσ² / total"), ("sigma_", "cumulative Σσ / total"))):
            for ax, view in zip(axes[row], views):
                ends, low = [], 1.0
                for name, v, s in rows:
                    if v != view:
                        continue
                    x = np.asarray(s[grid])
                    mean, sd = np.asarray(s[f"{prefix_key}{curve}_mean"]), np.asarray(s[f"{prefix_key}{curve}_std"])
                    (line,) = ax.plot(x, mean, label=_short(name))
                    ax.fill_between(x, np.clip(mean - sd, 0, 1), np.clip(mean + sd, 0, 1), alpha=0.2,
                                    color=line.get_color())
                    ends.append(next((j for j, c in zip(x, mean) if c >= 0.999), x[-1]))
                    low = min(low, float(np.clip(mean - sd, 0, 1).min()))
                for th in result["thresholds"]:
                    ax.axhline(th, color="grey", lw=0.6, ls=":")
                # Zoom on where the curves still rise: they reach 1 long before the last component.
                span = max(ends) * 1.5
                ax.set_xlim(x[0] - 0.02 * span, max(span, 5 if grid == "index_grid" else 0.05) + 0.02 * span)
                ax.set(title=view, xlabel=xlabel, ylabel=ylabel, ylim=(math.floor(low * 10) / 10, 1.01))
                ax.legend(fontsize=7)
        fig.suptitle(prefix + "normalised cumulative singular values (mean ± 1 std)")
        fig.tight_layout()
        fig.savefig(out / fname, dpi=110)
        plt.close(fig)
        written.append(out / fname)

    heat = np.asarray([s["normalised_sv_mean"] for _, _, s in rows])
    width = int(max(5, min(heat.shape[1], 2 * max(np.argmax(r < 0.01) if (r < 0.01).any() else r.size for r in heat))))
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.5))
    im = ax.imshow(heat[:, :width], aspect="auto", cmap="viridis", vmin=0, vmax=1,
                   extent=(0.5, width + 0.5, len(rows) - 0.5, -0.5))
    ax.set_yticks(range(len(rows)), [f"{_short(n)} [{v}]" for n, v, _ in rows], fontsize=7)
    ax.set(xlabel="component index j", title=prefix + "mean σ_j / σ_1")
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(out / "heatmap.png", dpi=110)
    plt.close(fig)
    written.append(out / "heatmap.png")

    fig, ax = plt.subplots(figsize=(max(5, 0.9 * len(rows) + 2), 3.6))
    pos = np.arange(len(rows))
    for i, pct in enumerate(("90", "99")):
        ax.bar(pos + (i - 0.5) * 0.38, [s[f"components_{pct}_mean"] for *_, s in rows], 0.38,
               yerr=[s[f"components_{pct}_std"] for *_, s in rows], capsize=2, label=f"{pct}% of Σσ²")
    ax.set_xticks(pos, [f"{_short(n)}\n{v}" for n, v, _ in rows], fontsize=7)
    ax.set(ylabel="components needed (mean ± std)", title=prefix + "components for 90% / 99%")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "components.png", dpi=110)
    plt.close(fig)
    written.append(out / "components.png")
    return written


def components_table(result: dict[str, Any]) -> str:
    """A markdown table: per (layer group, view) the components for 90% / 99% (σ² and σ)."""
    lines = [
        "| layer | kind | view | matrices | mean r | k90 mean | k90 median | k99 mean | k99 median | k99 / r "
        "| k90 (σ) | k99 (σ) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, e in (result.get("groups") or result["layers"]).items():
        for view, s in e["views"].items():
            lines.append(
                f"| {name} | {e['kind']} | {view} | {s['matrices']} | {s['mean_rank']:.1f} | "
                f"{s['components_90_mean']:.2f} | {s['components_90_median']} | {s['components_99_mean']:.2f} | "
                f"{s['components_99_median']} | {s['components_99_fraction_mean']:.3f} | "
                f"{s['components_sigma_90_mean']:.2f} | {s['components_sigma_99_mean']:.2f} |"
            )
    return "\n".join(lines)


def ksvd_table(distances: dict[str, dict[str, float]]) -> str:
    """A markdown table of :func:`primal_attention.ksvd.model_ksvd_distances`: per primal layer the
    mean over samples and heads of the distances to the exact KSVD solution (docs/method.md §7).
    Where s_b equals rank K the target is the whole kernel and the span distances are trivially 0."""
    lines = [
        "| layer | s_b | rank K | captured opt | captured learned | objective ratio | ∠E max / mean | ∠R max / mean "
        "| ∠W_e max / mean | J learned | J optimal | res_e scaled | res_r scaled |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, d in distances.items():
        lines.append(
            f"| {name} | {d['solution_rank']:.1f} | {d['kernel_rank']:.1f} | {d['captured_optimal']:.3f} | {d['captured_learned']:.3f} | "
            f"{d['objective_ratio']:.3f} | {d['angle_e_max']:.1f}° / {d['angle_e_mean']:.1f}° | "
            f"{d['angle_r_max']:.1f}° / {d['angle_r_mean']:.1f}° | {d['angle_we_max']:.1f}° / {d['angle_we_mean']:.1f}° | "
            f"{d['j_learned']:.3g} | {d['j_optimal']:.1e} | {d['res_e_scaled']:.3f} | {d['res_r_scaled']:.3f} |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------------- `primal spectrum`
