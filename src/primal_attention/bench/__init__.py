"""Efficiency benchmarks: timing utilities and the attention / model grid."""
