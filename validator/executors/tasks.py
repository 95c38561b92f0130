"""The bodies of a comparison's Ray tasks (they run on the workers) and what the driver makes of their
results: a batch of pairs measured by the function the comparison passes (``judging.compare.measure_pair``),
or one range of a huge pair measured into the engine's range partials (``numerics.ranges``), merged by the
driver in the engine's order (:func:`merge_measured`: the bits of the whole pair)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from validator.errors import InputError, ValidatorError
from validator.executors.assembly import Check, assemble_range, replica_notes
from validator.runs.reassembly import LogicalTensor

if TYPE_CHECKING:
    from validator.judging.compare import Measured, PairToMeasure

__all__ = ["Failed", "RangeResult", "checked", "measure_batch", "measure_range", "merge_measured"]


@dataclass
class RangeResult:
    """One range task's answer: the pair's range partials, the rounding floor's (or None), and the replica
    checks of A and of B over the range."""

    pair: Any  # numerics.ranges.RangePartials
    rounding: Any
    checks_a: list[Check | None]
    checks_b: list[Check | None]


def measure_range(la: LogicalTensor, lb: LogicalTensor, rounding_dtype: str | None, start: int, stop: int, blob_url: str | None) -> list[Any]:
    """The body of a range task: elements ``start .. stop`` of the pair, assembled and measured."""
    from validator.numerics.ranges import measure_range, rounding_range

    use_assigned_cpus()
    shape = la.shape()
    try:
        ta, checks_a = assemble_range(la, start, stop, blob_url)
        tb, checks_b = assemble_range(lb, start, stop, blob_url)
        part = measure_range(ta, tb, shape, start)
        rounding = rounding_range(ta, rounding_dtype, shape, start) if rounding_dtype else None
    except (ValidatorError, OSError) as exc:
        return [Failed(exc)]
    return [RangeResult(part, rounding, checks_a, checks_b)]


def merge_measured(pair: PairToMeasure, results: list[RangeResult]) -> Measured:
    """A split pair's ``Measured`` from its ranges' results in order: the bits ``compare.measure_pair`` gives
    for the whole pair (``numerics.ranges.merge``), the replica notes rebuilt from the ranges' checks."""
    from validator.judging.compare import Measured
    from validator.numerics.ranges import merge

    la, lb = pair.a, pair.b
    m, blocks = merge([x.pair for x in results])
    rounding = merge([x.rounding for x in results])[1] if results[0].rounding is not None else None
    notes = [f"A: {n}" for n in replica_notes(la, [x.checks_a for x in results])]
    notes += [f"B: {n}" for n in replica_notes(lb, [x.checks_b for x in results])]
    return Measured(m, None, notes, blocks=blocks, rounding=rounding)


@dataclass
class Failed:
    """An error a task met that the user can act on (a missing blob, an unreadable file), sent back whole."""

    error: BaseException


def measure_batch(measure: Callable[[LogicalTensor, LogicalTensor, bool], Measured], pairs: list[PairToMeasure]) -> list[Any]:
    """The body of a task: ``measure`` each pair in order, on the CPUs Ray assigned to the task."""
    use_assigned_cpus()
    out: list[Any] = []
    for p in pairs:
        try:
            out.append(measure(p.a, p.b, p.rounding_floor))
        except (ValidatorError, OSError) as exc:
            return [Failed(exc)]
    return out


def use_assigned_cpus() -> None:
    """The CPU engine's threads: as many as the CPUs Ray assigned to the task."""
    try:
        import ray

        if not ray.is_initialized():  # not in a Ray worker (a test calling a task's body)
            return
        context: Any = ray.get_runtime_context()
        cpus = context.get_assigned_resources().get("CPU", 1.0)
    except (ImportError, ValueError, RuntimeError, AssertionError):  # not in a task (Ray asserts it)
        return
    from validator.numerics.backends.cpu import set_threads

    set_threads(int(cpus))


def checked(results: list[Any]) -> list[Any]:
    """A task's results, or the error it met raised here."""
    if results and isinstance(results[0], Failed):
        err = results[0].error
        if isinstance(err, OSError):  # most likely a path the workers do not see as the driver does
            where = f"{err.filename}: " if err.filename else ""
            raise InputError(
                f"a Ray worker cannot read {where}{err.strerror or err}; the workers must see bundles and "
                "local blob stores at the same path as this machine (docs/ray.md)"
            )
        raise err
    return results

