"""The primal op in one place (the module :class:`~primal_attention.layers.primal.PrimalAttention`
is thin on top of it):

* :mod:`~primal_attention.ops.primal.reference`: the math as written in docs/method.md §2–§4,
  every intermediate kept (:class:`PrimalWeights`, :class:`PrimalTrace`, the KSVD objective);
* :mod:`~primal_attention.ops.primal.fused`: the same numbers with fewer passes over memory, the
  per-head path and the folded path (:class:`PrimalCache`, the KSVD objective from Gram matrices);
* :mod:`~primal_attention.ops.primal.folded` / :mod:`~primal_attention.ops.primal.triton_folded`:
  the folded path's row loop in PyTorch and in Triton, chosen by
  :mod:`~primal_attention.ops.primal.kernel` (:data:`Kernel`);
* :mod:`~primal_attention.ops.primal.decode`: O(1) decoding, :class:`PrimalState`, one step, the
  fused step and its :class:`PrimalDecodePlan`.

The Triton module is imported only when that kernel runs.
"""

from primal_attention.ops.primal.decode import PrimalDecodePlan, PrimalState
from primal_attention.ops.primal.fused import PrimalCache
from primal_attention.ops.primal.kernel import Kernel
from primal_attention.ops.primal.reference import EPS, PrimalTrace, PrimalWeights

__all__ = ["EPS", "Kernel", "PrimalCache", "PrimalDecodePlan", "PrimalState", "PrimalTrace", "PrimalWeights"]
