"""Efficiency benchmark: Primal-Attention against fused softmax and the efficient baselines.

``primal bench`` (see :mod:`primal_attention.bench.cli`) runs a grid (:mod:`.grid`) of workloads
(:mod:`.workloads`: layer, training step, inference) over the methods of :mod:`.methods`, times them
side by side (:mod:`.harness`, :mod:`.timing`), measures peak memory in isolation (:mod:`.memory`),
counts FLOPs and bytes (:mod:`.counters`), measures the machine's limits (:mod:`.limits`), analyses
the records (:mod:`.analysis`: crossovers, growth exponents, targets), renders tables (:mod:`.tables`)
and plots (:mod:`.plots`), and writes the JSON, markdown and the efficiency page (:mod:`.report`,
:mod:`.doc`).
"""

from primal_attention.bench.grid import FULL, GPU, QUICK, GridConfig

__all__ = ["FULL", "GPU", "QUICK", "GridConfig"]
