"""Analysis of trained models: attention singular value spectra.

* :mod:`~primal_attention.analysis.capture`: record attention layer inputs, rebuild their matrices;
* :mod:`~primal_attention.analysis.spectrum`: batched masked SVDs, streaming curve statistics and
  the analysis of a model; :mod:`~primal_attention.analysis.spectrum_report` its JSON, plots and
  tables; :mod:`~primal_attention.analysis.spectrum_command` ``primal spectrum`` (with ``--ksvd``,
  the distances to the exact KSVD solution).

J, Λ and the KSVD stationarity residuals live beside the loss, in :mod:`primal_attention.ksvd`.
"""

from primal_attention.analysis.capture import LayerInput, attention_layers, capture_inputs, layer_matrices
from primal_attention.analysis.spectrum import (
    SpectrumStats,
    analyse_spectrum,
    components_for,
    cumulative_energy,
    masked_svdvals,
)
from primal_attention.analysis.spectrum_command import spectrum_command
from primal_attention.analysis.spectrum_report import components_table, ksvd_table, write_spectrum

__all__ = [
    "LayerInput",
    "SpectrumStats",
    "analyse_spectrum",
    "attention_layers",
    "capture_inputs",
    "components_for",
    "components_table",
    "cumulative_energy",
    "ksvd_table",
    "layer_matrices",
    "masked_svdvals",
    "spectrum_command",
    "write_spectrum",
]
