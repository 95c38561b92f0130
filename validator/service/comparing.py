"""A comparison of two runs named by path or by stored name: what a local caller (the CLI) asks for.

Where every reference is a path (bundles, ``.safetensors`` files, folders of them), :func:`compare_refs` reads
them itself: no store, no database, not even the store's imports (SQLAlchemy's alone is ~0.4 s of a
comparison of two 512 MiB files on the 2-core dev box: ``benchmarks/file_compare_bench.md``). Otherwise it
opens the store and asks :meth:`validator.service.Service.compare`, which measures through
:func:`compare_resolved` too.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from validator.runs.sources import open_path

if TYPE_CHECKING:
    from validator.judging.compare import Comparison
    from validator.judging.policy import Policy
    from validator.runs.view import RunView

__all__ = ["ComparesRuns", "Progress", "compare_refs", "compare_resolved"]

Progress = Callable[[int, int], None]  # (pairs done, pairs in all)


class ComparesRuns(Protocol):
    """What :func:`compare_refs` asks of the store it opens: :meth:`validator.service.Service.compare` (named
    here, not imported: :mod:`.core` imports SQLAlchemy, and measures through this module)."""

    def compare(
        self, a: str, b: str, *, policy: Policy | None = ..., floor: tuple[str, str] | None = ...,
        progress: Progress | None = ..., executor: str | None = ...,
    ) -> Comparison: ...


def compare_refs(
    a: str,
    b: str,
    *,
    open_store: Callable[[], ComparesRuns],
    policy: Policy | None = None,
    floor: tuple[str, str] | None = None,
    progress: Progress | None = None,
    executor: str | None = None,
) -> Comparison:
    """:meth:`Service.compare` for a local caller. When every reference is an existing path (bundles,
    ``.safetensors`` files, folders of them) the store is never opened: no database, no migrations. Otherwise
    ``open_store()`` opens it, and references resolve as in :meth:`Service.resolve` (a path first, then a run)."""
    if all(Path(r).exists() for r in (a, b, *(floor or ()))):
        return compare_resolved(open_path, a, b, policy=policy, floor=floor, progress=progress, executor=executor)
    return open_store().compare(a, b, policy=policy, floor=floor, progress=progress, executor=executor)


def compare_resolved(
    resolve: Callable[[str], RunView],
    a: str,
    b: str,
    *,
    policy: Policy | None,
    floor: tuple[str, str] | None,
    progress: Progress | None,
    executor: str | None = None,
    blob_url: str | None = None,
) -> Comparison:
    """The comparison of the runs ``resolve`` gives for ``a`` and ``b`` (and the noise floor's two), measured
    where ``executor`` says (``validator.executors``; ``blob_url``: where its workers read stored runs)."""
    from validator.executors import make_executor
    from validator.settings import parse_executor

    ex = make_executor(parse_executor(executor), blob_url=blob_url)  # first: a bad --executor or no cluster fails fast
    from validator.judging.compare import compare_runs

    fl = (resolve(floor[0]), resolve(floor[1])) if floor else None
    return compare_runs(resolve(a), resolve(b), policy=policy, floor=fl, progress=progress, executor=ex)
