"""Primal-Attention: self-attention through asymmetric kernel SVD in the primal."""

__version__ = "0.1.0"
