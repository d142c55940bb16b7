"""The KSVD side of Primal-Attention: the loss over a model and how close layers are to a solution.

* :mod:`~primal_attention.ksvd.terms`: :func:`ksvd_terms`, the collector (a ``with`` scope or a handle
  closed explicitly) that keeps every primal forward's term (``terms.loss()``, ``terms.objectives()``),
  and :func:`primal_layers`; the layers themselves keep nothing;
* :mod:`~primal_attention.ksvd.diagnostics`: J, Λ and the stationarity (KKT) residuals;
* :mod:`~primal_attention.ksvd.dual`: the exact KSVD solution of a layer's kernel (:func:`layer_ksvd`)
  and a layer's distances to it (:func:`ksvd_distances`), docs/method.md §7.

The objective of one forward is :func:`primal_attention.ops.primal.fused.ksvd_objective` (fast) or
:func:`primal_attention.ops.primal.reference.ksvd_objective` (reference), docs/method.md §4.
"""

from primal_attention.ksvd.diagnostics import KKTResiduals, ksvd_diagnostics, stationarity_residuals
from primal_attention.ksvd.dual import (
    KSVDDistances,
    KSVDSolution,
    dual_output,
    ksvd_distances,
    layer_ksvd,
    model_ksvd_distances,
    paper_objective,
    principal_angles,
    solution_state,
    solve_ksvd,
)
from primal_attention.ksvd.terms import KSVDTerms, ksvd_terms, primal_layers

__all__ = [
    "KKTResiduals",
    "KSVDDistances",
    "KSVDSolution",
    "KSVDTerms",
    "dual_output",
    "ksvd_diagnostics",
    "ksvd_distances",
    "ksvd_terms",
    "layer_ksvd",
    "model_ksvd_distances",
    "paper_objective",
    "primal_layers",
    "principal_angles",
    "solution_state",
    "solve_ksvd",
    "stationarity_residuals",
]
