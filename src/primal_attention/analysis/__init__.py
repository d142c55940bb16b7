"""Analysis of trained models: attention singular value spectra.

* :mod:`~primal_attention.analysis.capture`: record attention layer inputs, rebuild their matrices;
* :mod:`~primal_attention.analysis.spectrum`: batched masked SVDs, streaming curve statistics,
  plots, and ``primal spectrum`` (with ``--ksvd``, the distances to the exact KSVD solution).

J, Λ and the KSVD stationarity residuals live beside the loss, in :mod:`primal_attention.ksvd`.
"""

from primal_attention.analysis.capture import LayerInput, attention_layers, capture_inputs, layer_matrices
from primal_attention.analysis.spectrum import (
    SpectrumStats,
    analyse_spectrum,
    components_for,
    components_table,
    cumulative_energy,
    ksvd_table,
    masked_svdvals,
    spectrum_command,
    write_spectrum,
)

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
