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

This module holds the math, the streaming statistics and the analysis of a model; the JSON / PNG /
table output is :mod:`primal_attention.analysis.spectrum_report`, the ``primal spectrum`` command
:mod:`primal_attention.analysis.spectrum_command`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
