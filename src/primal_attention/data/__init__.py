"""Datasets: one module per family, all returning :class:`SequenceData`.

- :mod:`~primal_attention.data.uea`: the UEA archive (``load_uea_splits``), bundled or user files.
- :mod:`~primal_attention.data.fsdd`: Free Spoken Digit MFCCs (``load_fsdd_splits``).
- :mod:`~primal_attention.data.lra`: Long Range Arena tasks (``load_lra``, ``fetch_lra``).

Loaders are imported lazily by their modules so that ``import primal_attention.data`` stays cheap.
"""

from primal_attention.data.base import Batch, DataError, SequenceData

__all__ = ["Batch", "DataError", "SequenceData"]
