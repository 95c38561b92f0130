"""Numerics: pure math on tensors, no I/O. The metrics of a pair (``compare_tensors`` in
:mod:`validator.metrics`, with its backends in :mod:`validator.kernels`) and the floors and intervals a
verdict rests on (:mod:`.floors`)."""

from validator._exports import public

__getattr__, __all__ = public(
    __name__,
    {"floors": ["BlockSums", "block_sums", "rounding_sums", "more_precise", "bootstrap_interval"]},
)
