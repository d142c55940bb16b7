"""The attention ops below the modules: tensors in, tensors out, no parameters of their own.

:mod:`primal_attention.ops.primal` is Primal-Attention's: the readable reference, the fast path
with its row-loop kernels, and O(1) decoding.
"""
