"""Singular value spectra of attention matrices (``primal spectrum``; the paper's Figure 2).

The paper's third claim: the KSVD regulariser gives a primal layer a sharper singular value decay
than canonical softmax attention. This module measures that on a model and a data split.

Views (per layer, head and sample, always restricted to the sample's L **real** tokens; built by
:mod:`primal_attention.analysis.capture`):

* ``"attention"`` (softmax layers): A = softmax(q kᵀ / √d_h) over the keys the layer may attend to,
  L×L. Full rank in general.
* ``"kernel"`` (every layer): the cosine kernel K = q̂ k̂ᵀ, L×L, rank ≤ d_h. For a primal layer it is
  the asymmetric kernel matrix K = Φ_q Φ_kᵀ that KSVD factorises (causal: q̂, k̂ of the prefix
  means); for a softmax layer the same construction on its q, k — the like-for-like comparison.
* ``"scores"`` (primal layers): the L×2s projection-score matrix [E, R] the layer outputs from,
  rank ≤ min(L, 2s).

Padding: the padding rows and columns of each matrix are set to 0. That only appends zero singular
values, so the first r = min(real rows, real cols) values of ``torch.linalg.svdvals`` are exactly
those of the matrix with the padding removed, and samples of different lengths share one batched
SVD. Positions past the last real token of a whole batch are cropped before the SVD (samples are
batched by length), which saves time and changes nothing. Everything is float64.

Curves and the common grids. For one matrix with σ_1 ≥ … ≥ σ_r the normalised cumulative
spectrum is c_p(j) = Σ_{i≤j} σ_i^p / Σ_{i≤r} σ_i^p, with c_p(j) = 1 for j > r; p = 2 ("energy",
explained variance) is the main curve, p = 1 (nuclear-norm mass, much less dominated by σ_1) is
kept for the component counts. Two grids make matrices of different sizes comparable:

* ``index``: c_2(j) at component j = 1..G, G the split's padded length N (every curve fits), and
  σ_j / σ_1 (0 for j > r) for the heatmap;
* ``fraction``: c_2 at component ceil(t·r) for t on :data:`FRACTION_GRID` (0.01 .. 1).

"Components for 90% / 99%": the smallest j with c_p(j) ≥ 0.9 / 0.99, per matrix; reported as
mean, std, median and mean j / r over the matrices of a layer (or layer group).

Memory: only running sums (count, Σ, Σ²) of those curves and histograms of the component counts
are kept per (layer, view) — O(G) floats, independent of the number of samples.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from primal_attention.analysis.capture import attention_layers, capture_inputs, layer_matrices
from primal_attention.layers import PrimalAttention
from primal_attention.data.base import SequenceData

FRACTION_GRID = torch.linspace(0.01, 1.0, 100, dtype=torch.float64)
THRESHOLDS = (0.9, 0.99)
POWERS = {"": 2.0, "sigma_": 1.0}  # key prefix -> power p of c_p


# --------------------------------------------------------------------------------------------- SVD


def masked_svdvals(matrix: Tensor, row_mask: Tensor | None = None, col_mask: Tensor | None = None) -> Tensor:
    """Singular values of each matrix restricted to its real rows and columns, float64.

    Args:
        matrix: (..., R, C).
        row_mask: (..., R) bool, True = real row, or None (all real). Broadcast over leading axes.
        col_mask: (..., C) bool or None.

    Returns:
        (..., min(R, C)) descending. The first min(#real rows, #real cols) values are those of the
        restricted matrix; the rest are 0 (zeroed rows / columns only add zero singular values).
    """
    m = matrix.to(torch.float64)
    if row_mask is not None:
        m = m * row_mask[..., :, None].to(m.dtype)
    if col_mask is not None:
        m = m * col_mask[..., None, :].to(m.dtype)
    return torch.linalg.svdvals(m)


def cumulative_energy(sv: Tensor, rank: Tensor, power: float = 2.0) -> Tensor:
    """Normalised cumulative spectrum c_p(j) = Σ_{i≤j} σ_i^p / Σ_{i≤r} σ_i^p: (..., K) for sv (..., K).

    rank: (...) int, the number r of valid values; values beyond r are ignored and c = 1 there.
    A zero matrix gives c = 1 everywhere.
    """
    k = sv.shape[-1]
    valid = torch.arange(k, device=sv.device) < rank[..., None]
    energy = torch.where(valid, sv.to(torch.float64) ** power, torch.zeros((), dtype=torch.float64))
    total = energy.sum(-1, keepdim=True)
    cum = energy.cumsum(-1) / total.clamp_min(torch.finfo(torch.float64).tiny)
    cum = torch.where(total > 0, cum, torch.ones_like(cum))
    return torch.where(valid, cum.clamp(max=1.0), torch.ones_like(cum))


def components_for(cum: Tensor, threshold: float) -> Tensor:
    """Smallest j (1-based) with c(j) ≥ threshold: (...) int64 for cum (..., K)."""
    # A tiny tolerance so that c(r) = 1 - 1e-16 from rounding still counts as reaching 100%.
    reached = cum >= threshold - 1e-12
    return reached.to(torch.int64).argmax(-1) + 1


def on_fraction_grid(cum: Tensor, rank: Tensor, grid: Tensor = FRACTION_GRID) -> Tensor:
    """c at component ceil(t·r) for each t of ``grid``: (..., T)."""
    r = rank.to(torch.float64)[..., None]
    j = torch.ceil(grid.to(cum.device) * r - 1e-9).clamp_min(1).to(torch.int64) - 1
    j = torch.minimum(j, torch.full_like(j, cum.shape[-1] - 1))
    return torch.gather(cum, -1, j)


# ------------------------------------------------------------------------------ running statistics


@dataclass
class SpectrumStats:
    """Running statistics of one (layer, view) over its (sample, head) matrices; memory O(G).

    Curves (each a running Σ and Σ² over matrices): ``cumulative`` c_2 on the index grid,
    ``fraction_cumulative`` c_2 on the fraction grid, and ``sigma_cumulative`` /
    ``sigma_fraction_cumulative`` the same for c_1.
    """

    grid_len: int
    count: int = 0
    rank_sum: float = 0.0
    curves: dict[str, list[Tensor]] = field(init=False)  # name -> [Σ c, Σ c²]
    sv_sum: Tensor = field(init=False)  # Σ σ_j / σ_1 (0 beyond r)
    needed: dict[str, Tensor] = field(init=False)  # "<prefix><pct>" -> histogram of components
    needed_frac_sum: dict[str, float] = field(init=False)  # same key -> Σ components / r

    def __post_init__(self) -> None:
        g, t = self.grid_len, FRACTION_GRID.numel()
        self.curves = {}
        for prefix in POWERS:
            self.curves[f"{prefix}cumulative"] = [torch.zeros(g, dtype=torch.float64) for _ in range(2)]
            self.curves[f"{prefix}fraction_cumulative"] = [torch.zeros(t, dtype=torch.float64) for _ in range(2)]
        self.sv_sum = torch.zeros(g, dtype=torch.float64)
        keys = [f"{p}{round(th * 100)}" for p in POWERS for th in THRESHOLDS]
        self.needed = {k: torch.zeros(g + 1, dtype=torch.int64) for k in keys}
        self.needed_frac_sum = {k: 0.0 for k in keys}

    def update(self, sv: Tensor, rank: Tensor) -> None:
        """Add M matrices: sv (M, K) singular values (descending), rank (M,) their valid counts."""
        sv, rank = sv.cpu().to(torch.float64), rank.cpu().to(torch.int64)
        g = self.grid_len
        sv = F.pad(sv, (0, g - sv.shape[-1])) if sv.shape[-1] < g else sv[:, :g]
        rank = rank.clamp(max=g)
        self.count += sv.shape[0]
        self.rank_sum += float(rank.sum())
        valid = torch.arange(g) < rank[:, None]
        self.sv_sum += torch.where(valid, sv / sv[:, :1].clamp_min(1e-300), torch.zeros(())).sum(0)
        for prefix, power in POWERS.items():
            cum = cumulative_energy(sv, rank, power)
            for name, curve in ((f"{prefix}cumulative", cum), (f"{prefix}fraction_cumulative", on_fraction_grid(cum, rank))):
                self.curves[name][0] += curve.sum(0)
                self.curves[name][1] += curve.square().sum(0)
            for th in THRESHOLDS:
                key = f"{prefix}{round(th * 100)}"
                k = components_for(cum, th)
                self.needed[key] += torch.bincount(k, minlength=g + 1)[: g + 1]
                self.needed_frac_sum[key] += float((k.to(torch.float64) / rank.clamp_min(1)).sum())

    def merge(self, other: SpectrumStats) -> SpectrumStats:
        """The statistics of both sets of matrices together (a layer group); same grid length."""
        if other.grid_len != self.grid_len:
            raise ValueError(f"cannot merge statistics of grid length {self.grid_len} and {other.grid_len}")
        out = SpectrumStats(self.grid_len, self.count + other.count, self.rank_sum + other.rank_sum)
        out.curves = {k: [a + b for a, b in zip(v, other.curves[k])] for k, v in self.curves.items()}
        out.sv_sum = self.sv_sum + other.sv_sum
        out.needed = {k: v + other.needed[k] for k, v in self.needed.items()}
        out.needed_frac_sum = {k: v + other.needed_frac_sum[k] for k, v in self.needed_frac_sum.items()}
        return out

    def summary(self) -> dict[str, Any]:
        """JSON-ready: curves (``<curve>_mean``, ``<curve>_std`` over matrices) on both grids, mean
        σ_j/σ_1, and the component counts (``components_<prefix><pct>_{mean,std,median,fraction_mean}``)."""
        n = max(self.count, 1)
        out: dict[str, Any] = {
            "matrices": self.count,
            "mean_rank": self.rank_sum / n,
            "index_grid": list(range(1, self.grid_len + 1)),
            "fraction_grid": FRACTION_GRID.tolist(),
            "normalised_sv_mean": (self.sv_sum / n).tolist(),
        }
        for name, (total, sq) in self.curves.items():
            mean = total / n
            out[f"{name}_mean"] = mean.tolist()
            out[f"{name}_std"] = (sq / n - mean.square()).clamp_min(0).sqrt().tolist()
        for key, hist in self.needed.items():
            h = hist.to(torch.float64)
            ks = torch.arange(h.numel(), dtype=torch.float64)
            mean = float((h * ks).sum() / n)
            cdf = h.cumsum(0) / h.sum().clamp_min(1)
            out[f"components_{key}_mean"] = mean
            out[f"components_{key}_std"] = float(((h * (ks - mean) ** 2).sum() / n).sqrt())
            out[f"components_{key}_median"] = int(torch.searchsorted(cdf, torch.tensor(0.5, dtype=torch.float64)))
            out[f"components_{key}_fraction_mean"] = self.needed_frac_sum[key] / n
        for th in THRESHOLDS:
            mean_curve = self.curves["cumulative"][0] / n
            out[f"components_{round(th * 100)}_of_mean_curve"] = int(components_for(mean_curve, th))
        return out


def _rank(view: str, mask: Tensor, heads: int, width: int) -> Tensor:
    """(B·H,) number of valid singular values: L for L×L views, min(L, 2s) for the scores."""
    length = mask.sum(-1)
    r = length if view != "scores" else torch.clamp(length, max=width)
    return r[:, None].expand(-1, heads).reshape(-1)


def _layer_groups(layers: dict[str, nn.Module], group_size: int) -> dict[str, list[str]]:
    """Consecutive layers of the same kind, ``group_size`` at a time: group name -> layer names."""
    groups: dict[str, list[str]] = {}
    names = list(layers)
    kinds = ["primal" if isinstance(layers[n], PrimalAttention) else "softmax" for n in names]
    i = 0
    while i < len(names):
        j = i
        while j < len(names) and j - i < group_size and kinds[j] == kinds[i]:
            j += 1
        groups[f"{kinds[i]} layers {i}-{j - 1}" if j - i > 1 else names[i]] = names[i:j]
        i = j
    return groups


@torch.no_grad()
def analyse_spectrum(
    model: nn.Module,
    data: SequenceData,
    *,
    batch_size: int = 16,
    max_examples: int | None = 200,
    device: torch.device | str = "cpu",
    group_size: int = 1,
) -> dict[str, Any]:
    """Stream the first ``max_examples`` of ``data`` through ``model`` (eval mode) and summarise the
    spectra of every attention layer's views.

    Args:
        model: a model whose attention layers are :class:`SoftmaxAttention` / :class:`PrimalAttention`,
            called as ``model(**batch.inputs)`` (the models of :mod:`primal_attention.models`).
        data: the split; examples are taken in order, then batched by length.
        group_size: pool this many consecutive layers of the same kind into one group (1: each
            layer is its own group).

    Returns:
        JSON-ready ``{"examples", "grid_len", "thresholds", "layers": {name: {"kind", "heads",
        "head_dim", "rank" (primal), "views": {view: SpectrumStats.summary()}}}}`` and, when
        ``group_size`` > 1, ``"groups": {group: {"kind", "layers", "views"}}``. The training mode is
        restored.
    """
    device = torch.device(device)
    was = model.training
    model.eval()
    m = len(data) if max_examples is None else min(len(data), max_examples)
    # Sequences: the padded length; images: the token count the layers see (taken from the first batch).
    grid_len = getattr(data, "seq_len", None)
    layers = dict(attention_layers(model))
    stats: dict[str, dict[str, SpectrumStats]] = {name: {} for name in layers}
    # Similar lengths in a batch make the crop below effective; the statistics are order-free.
    mask = getattr(data, "mask", None)
    order = torch.argsort(mask[:m].sum(-1), stable=True) if mask is not None else torch.arange(m)
    try:
        with capture_inputs(model) as seen:
            for start in range(0, m, batch_size):
                idx = order[start : start + batch_size]
                model(**data.batch(idx).to(device).inputs)
                for name, layer in layers.items():
                    inp = seen[name]
                    if grid_len is None:
                        grid_len = inp.x.shape[1]
                    real = inp.mask.any(0).nonzero()
                    last = int(real.max()) + 1 if real.numel() else 1
                    for view, mat in layer_matrices(layer, inp).items():
                        mat = mat[:, :, :last, :last] if view != "scores" else mat[:, :, :last]
                        b, h = mat.shape[:2]
                        sv = masked_svdvals(mat).reshape(b * h, -1)
                        st = stats[name].setdefault(view, SpectrumStats(grid_len))
                        st.update(sv, _rank(view, inp.mask, h, mat.shape[-1]))
                seen.clear()
    finally:
        model.train(was)
    out: dict[str, Any] = {"examples": m, "grid_len": grid_len, "thresholds": list(THRESHOLDS), "layers": {}}
    for name, layer in layers.items():
        entry: dict[str, Any] = {
            "kind": "primal" if isinstance(layer, PrimalAttention) else "softmax",
            "heads": layer.num_heads,
            "head_dim": layer.head_dim,
        }
        if isinstance(layer, PrimalAttention):
            entry["rank"] = layer.rank
        entry["views"] = {view: st.summary() for view, st in stats[name].items()}
        out["layers"][name] = entry
    if group_size <= 1:
        return out
    out["groups"] = {}
    for group, names in _layer_groups(layers, group_size).items():
        views: dict[str, SpectrumStats] = {}
        for name in names:
            for view, st in stats[name].items():
                views[view] = views[view].merge(st) if view in views else st
        out["groups"][group] = {"kind": out["layers"][names[0]]["kind"], "layers": names,
                                "views": {v: st.summary() for v, st in views.items()}}
    return out


# ------------------------------------------------------------------------------------------ output


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


def spectrum_command(
    path: str | Path,
    *,
    split: str = "test",
    max_examples: int | None = 200,
    batch_size: int = 16,
    group_size: int = 1,
    out: str | Path | None = None,
    last: bool = False,
    overrides: list[str] | None = None,
    ksvd: bool = False,
) -> int:
    """``primal spectrum``: analyse ``split`` of the target, print the KSVD diagnostics and the
    component table, write JSON + PNGs (default: RUN_DIR/spectrum_<split>, or
    runs/<name>/spectrum_<split>_init for a config). Returns the exit code.

    With ``ksvd``, also the distances of every primal layer to the exact KSVD solution of its kernel
    (:func:`primal_attention.ksvd.model_ksvd_distances`, on the same batch as the diagnostics): under
    ``"ksvd_distances"`` in spectrum.json and as a table on stdout."""
    from primal_attention.data.base import DataError
    from primal_attention.ksvd.diagnostics import ksvd_diagnostics
    from primal_attention.train.checkpoint import CheckpointError
    from primal_attention.train.config import ConfigError
    from primal_attention.train.run import load_run

    try:
        t = load_run(path, overrides=overrides, last=last)
    except (CheckpointError, ConfigError, DataError) as err:
        print(f"primal spectrum: error: {err}", file=sys.stderr)
        return 2
    data = getattr(t.splits, split)
    if data is None:
        print(f"primal spectrum: error: this run has no {split!r} split (protocol {t.cfg.train.protocol})", file=sys.stderr)
        return 2
    result = analyse_spectrum(t.model, data, batch_size=batch_size, max_examples=max_examples, device=t.device,
                              group_size=group_size)
    first = torch.arange(min(len(t.splits.train), t.cfg.train.eval_batch_size))
    diagnostics = ksvd_diagnostics(t.model, t.splits.train.batch(first).to(t.device))
    result.update(source=str(t.source), checkpoint=None if t.checkpoint is None else str(t.checkpoint),
                  weights=t.weights, split=split, name=t.cfg.name, ksvd_diagnostics=diagnostics,
                  ksvd_diagnostics_batch=f"first {len(first)} training examples")
    if ksvd:
        from primal_attention.ksvd.dual import model_ksvd_distances

        result["ksvd_distances"] = model_ksvd_distances(t.model, t.splits.train.batch(first).to(t.device))
    if out is None:
        base = Path("runs") / t.cfg.name if t.checkpoint is None else t.checkpoint.parent.parent
        out = base / (f"spectrum_{split}" + ("_init" if t.checkpoint is None else ""))
    files = write_spectrum(result, out, title=f"{t.cfg.name} ({split})")
    where = t.checkpoint.name if t.checkpoint is not None else "no checkpoint"
    print(f"{t.cfg.name}: {result['examples']} {split} examples, {where}, weights {t.weights}")
    if diagnostics:
        print(f"KSVD diagnostics ({result['ksvd_diagnostics_batch']}, eval mode):")
        for key, value in diagnostics.items():
            print(f"  {key:44s} {value: .4e}")
    print(components_table(result))
    if ksvd:
        print(f"Distances to the exact KSVD solution ({result['ksvd_diagnostics_batch']}, eval mode; "
              "angles between learned and optimal spans, docs/method.md §7):")
        print(ksvd_table(result["ksvd_distances"]) if result["ksvd_distances"] else "  (no primal layers)")
    print("wrote", ", ".join(str(f) for f in files))
    return 0
