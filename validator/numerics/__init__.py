"""Numerics: pure math on tensors, no I/O. The metrics of a pair (:func:`compare_tensors` in :mod:`.metrics`,
measured by one of the backends in :mod:`.backends`: Triton on a GPU, numba on the CPU (NumPy for CPU pairs of at
most 8,192 elements), the float64 reference elsewhere) and the floors and intervals a verdict rests on
(:mod:`.floors`). A side of a pair is a torch tensor or a :class:`HostArray` (:mod:`.host`: small float tensors
read as NumPy, measured without importing torch)."""

from validator._exports import public

__getattr__, __all__ = public(
    __name__,
    {
        "metrics": ["TensorMetrics", "MetricInputError", "compare_tensors", "measure", "metrics_from_totals"],
        "host": ["HostArray"],
        "floors": [
            "BlockSums",
            "block_edges",
            "block_sums",
            "measure_blocks",
            "rounding_sums",
            "more_precise",
            "bootstrap_interval",
        ],
        "jsonsafe": ["json_safe"],
    },
)
