"""Where a comparison measures its pairs: in this process (the default, ``judging.compare``) or on a Ray cluster
(``--executor ray``, docs/ray.md). ``compare_runs(executor=...)`` takes a ``PairExecutor``, which maps the
public measurement ``validator.judging.compare.measure_pair`` over the pairs; :func:`make_executor` builds one
from the setting (its syntax: :func:`validator.settings.parse_executor`).

Modules: :mod:`.planning` (tasks, ranges and memory, no Ray), :mod:`.assembly` (what a worker reads: portable
tensors, ranges of a logical tensor), :mod:`.tasks` (the task bodies and the merge of a split pair),
:mod:`.ray_cluster` (this process's connection) and :mod:`.ray_scheduler` (:class:`RayExecutor`). Ray is imported only when a comparison runs on it."""

from validator._exports import public

__getattr__, __all__ = public(
    __name__,
    {
        "planning": ["pair_memory", "plan_batches", "plan_ranges"],
        "assembly": ["portable"],
        "ray_cluster": ["RayUnavailable", "connect", "disconnect"],
        "ray_scheduler": ["RayExecutor", "make_executor"],
    },
)
