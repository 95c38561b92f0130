"""Comparisons measured on a Ray cluster, where the tensors are (docs/ray.md).

The driver (the process running ``compare_runs``) plans tasks (:mod:`.planning`): a batch of logical tensor
pairs each, small pairs packed together and a large pair alone. A task receives the pairs as metadata only
(:func:`.assembly.portable`: names, shard layout, dtype, shape and, for each shard, where its bytes are: a
blob's sha256 and the store's URL, or a safetensors file on a filesystem every worker mounts and the byte
offset in it), reads the bytes itself, runs the measurement the comparison passes on each pair
(``validator.judging.compare.measure_pair``, sent by reference, so the code is the same as in one process)
and returns the small results. The driver judges them exactly as ``compare_runs`` does in one process, so
the comparison document is the same, bit for bit. No tensor byte passes through the driver.

Tasks: consecutive pairs up to ``BATCH_BYTES`` of tensors (fewer when the comparison is small next to the
cluster: at least four tasks per CPU when the pairs allow), a pair larger than that alone. A pair larger
than ``range_bytes`` (``VALIDATOR_RAY_RANGE_BYTES``, default ``RANGE_BYTES``) is cut into element ranges
(:func:`.planning.plan_ranges`), a task each: the task reads only its range of each stored piece
(:func:`.assembly.assemble_range`) and returns the engine's range partials (``validator.numerics.ranges``);
the driver merges them in the engine's own order (:func:`.tasks.merge_measured`), the same bits as the
whole pair.

Memory: a task reserves (Ray's ``memory`` resource) the most one of its pairs needs, an estimate of the
assembled tensors' bytes (:func:`.planning.pair_memory`); Ray then never runs more tasks on a node than its
memory holds, and a pair larger than every node is refused before anything runs.

Faults: a task whose worker process or node dies is run again by Ray (``max_retries``), with the same
result, as measurements are pure functions of the bytes. No cluster, or a cluster lost during the
comparison: a :class:`~validator.executors.ray_cluster.RayUnavailable` (exit 2) and nothing stored.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from validator.errors import InputError, ValidatorError
from validator.executors.assembly import portable
from validator.executors.planning import BATCH_BYTES, BATCH_PAIRS, plan_jobs, rounding_dtype
from validator.executors.ray_cluster import (
    RAY_INSTALL,
    RayUnavailable,
    check_reachable,
    connect,
    connected,
    head_address,
    head_answers,
    leave,
    lost,
)
from validator.executors.tasks import RangeResult, checked, measure_batch, measure_range, merge_measured
from validator.runs.reassembly import LogicalTensor
from validator.settings import RANGE_BYTES, ExecutorSettings, ExecutorSpec

if TYPE_CHECKING:
    from validator.judging.compare import Measured, PairToMeasure

__all__ = ["HEAD_CHECK_S", "LOST_AFTER_S", "MAX_RETRIES", "RayExecutor", "make_executor"]

MAX_RETRIES = 3  # Ray runs a task again this many times when its worker process or node dies
LOST_AFTER_S = 30.0  # a cluster with no node able to run a task for this long is lost
HEAD_CHECK_S = 2.0  # while waiting for results, whether the head still answers is checked this often


@dataclass
class _Watch:
    """When a wait for results last looked at the cluster's head, and last got a result."""

    last_check: float = field(default_factory=time.monotonic)
    last_progress: float = field(default_factory=time.monotonic)


class RayExecutor:
    """A ``PairExecutor`` (validator.judging.compare) on a Ray cluster.

    ``blob_url``: the blob store as the workers reach it (``s3://...``, or ``file://PATH`` of a directory
    they all mount at the same path); needed for stored runs. ``in_flight``: tasks submitted ahead of the
    results consumed (default: two per CPU of the cluster). ``fresh_workers``: each task in a new worker
    process (Ray's ``max_calls=1``): whatever a task allocated goes back to the node when it ends, at the
    cost of a process start and the imports (torch, numba) per task."""

    def __init__(
        self,
        address: str | None = None,
        *,
        blob_url: str | None = None,
        max_retries: int = MAX_RETRIES,
        cpus_per_task: float = 1.0,
        batch_bytes: int = BATCH_BYTES,
        batch_pairs: int = BATCH_PAIRS,
        in_flight: int | None = None,
        fresh_workers: bool = False,
        range_bytes: int | None = RANGE_BYTES,
    ) -> None:
        self.address = address
        self.blob_url = blob_url
        self.max_retries = max_retries
        self.cpus_per_task = cpus_per_task
        self.batch_bytes = batch_bytes
        self.batch_pairs = batch_pairs
        self.in_flight = in_flight
        self.fresh_workers = fresh_workers
        self.range_bytes = range_bytes
        self.tasks_submitted = 0
        self.range_tasks = 0  # tasks that measured a range of a split pair
        self._lost_head = False

    def __call__(self, measure: Callable[[LogicalTensor, LogicalTensor, bool], Measured], pairs: list[PairToMeasure]) -> Iterator[Measured]:
        if not pairs:
            return iter(())
        shipped = [p._replace(a=portable(p.a, self.blob_url), b=portable(p.b, self.blob_url)) for p in pairs]  # before connecting: bad input first
        ray = connect(self.address)
        return self._run(ray, measure, shipped)

    def _run(self, ray: Any, measure: Callable[..., Measured], pairs: list[PairToMeasure]) -> Iterator[Measured]:
        from ray import exceptions as rex

        try:
            nodes = [n for n in ray.nodes() if n.get("Alive")]
        except Exception as exc:  # any failure to talk to the cluster is a lost cluster
            raise lost(exc) from None
        node_mem = max((n.get("Resources", {}).get("memory", 0.0) for n in nodes), default=0.0)
        cpus = sum(n.get("Resources", {}).get("CPU", 0.0) for n in nodes)
        if cpus < self.cpus_per_task:
            raise RayUnavailable(f"the Ray cluster at {connected()} has no node with {self.cpus_per_task:g} CPU(s) to run a task")
        # at least four tasks per task slot when the pairs allow it, so that every worker has work to the end
        total = sum(r.nbytes for p in pairs for r in (*p.a.shards, *p.b.shards))
        slots = max(1, int(cpus / self.cpus_per_task))
        batch_bytes = max(1, min(self.batch_bytes, total // (4 * slots)))
        jobs = plan_jobs(pairs, batch_bytes=batch_bytes, batch_pairs=self.batch_pairs, range_bytes=self.range_bytes)
        worst = max(range(len(jobs)), key=lambda j: jobs[j].memory)
        if node_mem and jobs[worst].memory > node_mem:
            la = pairs[jobs[worst].pairs[0]].a
            raise InputError(
                f"tensor {la.label!r} needs about {jobs[worst].memory / 2**30:.1f} GiB to compare, more than any Ray node "
                f"offers ({node_mem / 2**30:.1f} GiB of its memory resource)"
            )
        remote = ray.remote(max_calls=1) if self.fresh_workers else ray.remote
        batch_task, range_task = remote(measure_batch), remote(measure_range)
        measure_ref = ray.put(measure)
        window = self.in_flight or max(2, int(2 * cpus / self.cpus_per_task))
        pending: dict[Any, int] = {}
        done: dict[int, list[Any]] = {}
        ranges: dict[int, list[RangeResult]] = {}
        submitted = 0
        watch = _Watch()
        self._lost_head = False
        was_lost = False

        def options(name: str, memory: int) -> dict[str, Any]:
            opts: dict[str, Any] = {"num_cpus": self.cpus_per_task, "max_retries": self.max_retries, "retry_exceptions": False, "name": name}
            if node_mem:
                opts["memory"] = min(memory, int(node_mem))
            return opts

        try:
            for j in range(len(jobs)):
                while submitted < len(jobs) and len(pending) < window:
                    job = jobs[submitted]
                    opts = options(f"validator.measure[{submitted}]", job.memory)
                    if job.span is None:
                        ref = batch_task.options(**opts).remote(measure_ref, [pairs[i] for i in job.pairs])
                    else:
                        p = pairs[job.pairs[0]]
                        ref = range_task.options(**opts).remote(p.a, p.b, rounding_dtype(p.a, p.b, p.rounding_floor), *job.span, self.blob_url)
                        self.range_tasks += 1
                    pending[ref] = submitted
                    submitted += 1
                    self.tasks_submitted += 1
                while j not in done:
                    for ref, value in self._wait(ray, list(pending), watch):
                        done[pending.pop(ref)] = value
                results = checked(done.pop(j))
                job = jobs[j]
                if job.span is None:
                    yield from results
                    continue
                got = ranges.setdefault(job.pairs[0], [])
                got.append(results[0])
                if job.last:
                    del ranges[job.pairs[0]]
                    yield merge_measured(pairs[job.pairs[0]], got)
        except rex.RayTaskError as exc:  # an error in our code on a worker: not a fault Ray retries
            raise ValidatorError(f"a comparison task failed on the Ray cluster: {exc.cause!r}") from None
        except (rex.RayError, ConnectionError) as exc:  # worker or node gone past its retries, object lost, GCS gone
            was_lost = True
            raise lost(exc) from None
        finally:
            if was_lost or self._lost_head:
                leave(ray)
            else:
                for ref in pending:
                    with contextlib.suppress(Exception):
                        ray.cancel(ref, force=True)

    def _check_head(self) -> None:
        if not head_answers():
            self._lost_head = True
            raise RayUnavailable(
                f"the Ray cluster was lost during the comparison: its head at {head_address()} no longer answers; nothing was stored"
            )

    def _wait(self, ray: Any, refs: list[Any], watch: _Watch) -> list[tuple[Any, Any]]:
        """Up to a second's wait for any of ``refs``: the results that came, as (ref, value). Without one, the
        head is checked every HEAD_CHECK_S and the workers after LOST_AFTER_S without a result."""
        ready, _ = ray.wait(refs, num_returns=1, timeout=1.0)
        got = [(ref, ray.get(ref)) for ref in ready]
        now = time.monotonic()
        if got:
            watch.last_progress = now
            return got
        if now - watch.last_check > HEAD_CHECK_S:
            watch.last_check = now
            self._check_head()
        if now - watch.last_progress > LOST_AFTER_S:
            self._check_alive(ray)
            watch.last_progress = time.monotonic()
        return got

    def _check_alive(self, ray: Any) -> None:
        try:
            alive = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0.0) >= self.cpus_per_task]
        except Exception as exc:
            raise lost(exc) from None
        if not alive:
            raise RayUnavailable(
                f"the Ray cluster at {connected()} has had no live node able to run a task for {LOST_AFTER_S:g} s; nothing was stored"
            )




def make_executor(spec: ExecutorSpec, *, blob_url: str | None = None, settings: ExecutorSettings | None = None) -> RayExecutor | None:
    """The executor ``spec`` names (None: measure in this process); ``settings``: ``RAY_ADDRESS`` and
    ``VALIDATOR_RAY_RANGE_BYTES`` (default: from the environment)."""
    if spec.kind == "local":
        return None
    import importlib.util

    if importlib.util.find_spec("ray") is None:  # without importing it
        raise RayUnavailable(f"--executor ray needs Ray, which is not installed here: {RAY_INSTALL}")
    settings = settings or ExecutorSettings.from_env()
    address = spec.address or settings.ray_address
    if address and address != "auto":
        check_reachable(address)  # before the comparison reads anything: no cluster is the first error
    return RayExecutor(address, blob_url=blob_url, range_bytes=settings.range_bytes)
