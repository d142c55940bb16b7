"""Analysis of trained models: attention singular value spectra and KSVD diagnostics.

* :mod:`~primal_attention.analysis.capture`: record attention layer inputs, rebuild their matrices;
* :mod:`~primal_attention.analysis.spectrum`: batched masked SVDs, streaming curve statistics,
  plots, and ``primal spectrum``;
* :mod:`~primal_attention.analysis.diagnostics`: J, Λ and the KSVD stationarity residuals.
"""

from primal_attention.analysis.capture import LayerInput, attention_layers, capture_inputs, layer_matrices
from primal_attention.analysis.diagnostics import KKTResiduals, ksvd_diagnostics, stationarity_residuals
from primal_attention.analysis.spectrum import (
    SpectrumStats,
    analyse_spectrum,
    components_for,
    components_table,
    cumulative_energy,
    load_target,
    masked_svdvals,
    spectrum_command,
    write_spectrum,
)

__all__ = [
    "KKTResiduals",
    "LayerInput",
    "SpectrumStats",
    "analyse_spectrum",
    "attention_layers",
    "capture_inputs",
    "components_for",
    "components_table",
    "cumulative_energy",
    "ksvd_diagnostics",
    "layer_matrices",
    "load_target",
    "masked_svdvals",
    "spectrum_command",
    "stationarity_residuals",
    "write_spectrum",
]
