"""Datasets: one module per family, all returning :class:`SequenceData`."""

from primal_attention.data.base import SequenceData, DataError

__all__ = ["SequenceData", "DataError"]
