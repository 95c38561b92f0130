"""Reassembling logical tensors from the shards a run holds, so that runs with different TP/PP layouts
compare tensor for tensor.

- ``split``: one shard per rank index is needed (any replica of it); shards are concatenated along the
  split dim in rank order. Replicas of one slice must be bitwise equal; when not, it is reported.
- ``replicated``: every copy must agree; the copy of the lowest rank is used and disagreements are reported.
- ``partial``: pieces are summed in stage order, in float64; a stage may be absent (it had nothing to add).
- ``full``: exactly one record.

A copy that differs leaves a note (:func:`replica_note`). Where the run's layout declared the copies
replicated (a shard spec with ``replication="declared"``: SGLang's dumper ``dims``, ``# tp:replicated``) the
note says so, and the comparison fails the pair on it; copies the reader only assumed to be replicated (a
tensor dumped without dims on several ranks) and records that say nothing about it leave a note only. The
flag is part of the shard spec, so a stored run keeps it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from probes.core.shards import Coords
from validator.errors import InputError
from validator.numerics.backends.small import NUMPY_MAX
from validator.runs.view import TensorRef

if TYPE_CHECKING:
    import torch

    from validator.numerics.host import Array

__all__ = ["DECLARED_DISAGREE", "LogicalTensor", "group_logical", "logical_key", "materialize_many", "replica_note"]

LogicalKey = tuple[str, tuple[Any, ...]]

# how a note about declared copies that differ begins (validator.judging.compare fails the pair on such a note)
DECLARED_DISAGREE = "declared replicas disagree"


def replica_note(first: TensorRef, other: TensorRef, worst: float) -> str:
    """The note a copy ``other`` that differs from the copy used, ``first``, leaves (``worst``: the largest
    finite |difference|, NaN when none is finite); it begins with :data:`DECLARED_DISAGREE` when ``other`` is a
    copy its layout declared replicated (its shard spec's ``replication``)."""
    what = DECLARED_DISAGREE if other.shard.replication == "declared" else "replicas disagree"
    return f"{what}: {other.origin} ({other.shard}) differs from {first.origin} ({first.shard}), max |diff| {worst:.3g}"


def logical_key(ref: TensorRef) -> LogicalKey:
    return (ref.name, ref.coords.identity())


@dataclass
class LogicalTensor:
    """A tensor as the model sees it, made of one or more stored shards."""

    name: str
    coords: Coords
    shards: list[TensorRef]
    notes: list[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return self.shards[0].shard.kind

    @property
    def label(self) -> str:
        c = self.coords.label()
        return f"{self.name} [{c}]" if c else self.name

    @property
    def dtype(self) -> str:
        """The dtype the shards were captured in (partial sums are added in float64 on load)."""
        return self.shards[0].dtype

    def shape(self) -> tuple[int, ...]:
        first = self.shards[0]
        if self.kind != "split":  # every shard has the logical tensor's shape
            return first.shape
        s = list(first.shape)
        dim = first.shard.dim or 0
        s[dim] = sum(r.shape[dim] for r in self.split_pieces())
        return tuple(s)

    def split_pieces(self) -> list[TensorRef]:
        """A split tensor's pieces in index order, one copy of each (the lowest replica): what it is assembled from."""
        by_rank: dict[int, TensorRef] = {}
        for r in sorted(self.shards, key=lambda r: (r.shard.index, r.shard.replica)):
            by_rank.setdefault(r.shard.index, r)
        return [by_rank[i] for i in sorted(by_rank)]

    def host_readable(self) -> bool:
        """Whether :func:`materialize_many` reads it as a ``numerics.host.HostArray`` (no torch): one stored
        shard (the logical tensor is that shard's), of a float dtype, of at most ``backends.small.NUMPY_MAX``
        elements, the size the engine measures in NumPy."""
        return len(self.shards) == 1 and math.prod(self.shards[0].shape) <= NUMPY_MAX and self.shards[0].host_readable()

    def materialize(self) -> torch.Tensor:
        """Load and assemble the logical tensor. Replica disagreements are appended to ``notes``."""
        import torch  # grouping and validating shards (ingest) needs no torch; assembling them does

        kind = self.kind
        if kind == "full":
            return self.shards[0].load()
        if kind == "replicated":
            first = self.shards[0].load()
            self._check_replicas(first, self.shards)
            return first
        if kind == "split":
            pieces = []
            by_index: dict[int, list[TensorRef]] = defaultdict(list)
            for r in self.shards:
                by_index[r.shard.index].append(r)
            for i in sorted(by_index):
                reps = sorted(by_index[i], key=lambda r: r.shard.replica)
                t = reps[0].load()
                self._check_replicas(t, reps)
                pieces.append(t)
            return torch.cat(pieces, dim=self.shards[0].shard.dim or 0)
        # partial: sum in stage order
        ordered = sorted(self.shards, key=lambda r: r.shard.index)
        if len(ordered) == 1:
            return ordered[0].load()
        total = ordered[0].load().to(torch.float64)
        for r in ordered[1:]:
            total = total + r.load().to(torch.float64)
        return total

    def _check_replicas(self, first: torch.Tensor, reps: list[TensorRef]) -> None:
        import torch

        ref0 = reps[0]
        for r in reps[1:]:
            if r.sha256 is not None and r.sha256 == ref0.sha256:
                continue
            other = r.load()
            if torch.equal(first, other):
                continue
            diff = (other.to(torch.float64) - first.to(torch.float64)).abs()
            finite = torch.isfinite(diff)
            worst = float(diff[finite].max()) if bool(finite.any()) else float("nan")
            self.notes.append(replica_note(ref0, r, worst))


def materialize_many(tensors: Sequence[LogicalTensor]) -> list[Array]:
    """:meth:`LogicalTensor.materialize` of each, in order, with the same elements. Those the engine measures in
    NumPy (:meth:`LogicalTensor.host_readable`) are read as ``numerics.host.HostArray``, without torch; of the
    others, those of one full stored shard that can be read into a buffer (``TensorRef.read_into``) are read
    side by side into one buffer per dtype, each a view of it, which the CPU engine measures without copying
    them together (``numerics.backends.cpu.cpu_totals_many``). Meant for a batch of small tensors: their bytes
    are read into memory, not memory-mapped; a larger tensor alone is loaded as it is stored (a large blob:
    memory-mapped)."""
    out: list[Array | None] = [t.shards[0].load_host() if t.host_readable() else None for t in tensors]
    rest = [i for i, got in enumerate(out) if got is None]
    if len(rest) == 1:
        out[rest[0]] = tensors[rest[0]].materialize()
    elif rest:
        for i, got in zip(rest, _materialize_torch([tensors[i] for i in rest])):
            out[i] = got
    return [t for t in out if t is not None]


def _materialize_torch(tensors: Sequence[LogicalTensor]) -> list[torch.Tensor]:
    """:meth:`LogicalTensor.materialize` of each (two or more), in order, as :func:`materialize_many` reads them."""
    import torch

    from validator.runs.tensorfile import dtype_name, torch_dtype

    out: list[torch.Tensor] = [torch.empty(0)] * len(tensors)
    together: dict[str, list[tuple[int, TensorRef, Callable[[memoryview], None]]]] = {}  # dtype -> its tensors
    for i, t in enumerate(tensors):
        r = t.shards[0]
        if len(t.shards) == 1 and r.read_into is not None:  # one shard: the logical tensor is that shard's
            together.setdefault(r.dtype, []).append((i, r, r.read_into))
        else:
            out[i] = t.materialize()
    for dtype, refs in together.items():
        sizes = [math.prod(r.shape) for _, r, _ in refs]
        flat = torch.empty(sum(sizes), dtype=torch_dtype(dtype))
        raw, width, named = flat.view(torch.uint8).numpy().data, flat.itemsize, dtype_name(flat.dtype) == dtype
        shapes = {r.shape for _, r, _ in refs}
        if len(shapes) == 1:  # the usual batch: one call makes every view (a view each costs twice as much)
            pieces = flat.view(len(refs), *shapes.pop()).unbind()
        else:
            pieces = tuple(p.view(r.shape) for p, (_, r, _) in zip(flat.split_with_sizes(sizes), refs))
        at = 0
        for (i, r, read_into), n, piece in zip(refs, sizes, pieces):
            if not named or r.nbytes != n * width:  # a record at odds with itself: TensorRef.load names the problem
                out[i] = tensors[i].materialize()
            else:
                if n:
                    read_into(raw[at * width : (at + n) * width])
                out[i] = piece
            at += n
    return out


def _validate(name: str, coords: Coords, refs: list[TensorRef]) -> list[str]:
    """Check the shard set describes one complete logical tensor; return notes (non-fatal findings)."""
    if len(refs) == 1 and refs[0].shard.kind in ("full", "replicated", "partial") and refs[0].shard.count == 1:
        return []  # one complete record: nothing to check (the common case, and many of them)
    kinds = {r.shard.kind for r in refs}
    where = f"tensor {name!r}" + (f" ({coords.label()})" if coords.label() else "")
    if len(kinds) > 1:
        raise InputError(f"{where}: shards mix kinds {sorted(kinds)} ({refs[0].origin})")
    kind = kinds.pop()
    counts = {r.shard.count for r in refs}
    if len(counts) > 1:
        raise InputError(f"{where}: shards disagree on their count {sorted(counts)} ({refs[0].origin})")
    count = counts.pop()
    if kind == "full" and len(refs) > 1:
        raise InputError(
            f"{where}: {len(refs)} full copies recorded; mark them replicated(rank, size) ({refs[0].origin})"
        )
    slots = [(r.shard.index, r.shard.replica) for r in refs]
    if len(set(slots)) != len(slots):
        dup = next(r for r in refs if slots.count((r.shard.index, r.shard.replica)) > 1)
        raise InputError(f"{where}: shard {dup.shard} recorded twice ({dup.origin})")
    notes: list[str] = []
    if kind == "split":
        dims = {r.shard.dim for r in refs}
        if len(dims) > 1:
            raise InputError(f"{where}: shards split along different dims {sorted(d or 0 for d in dims)}")
        dim = dims.pop() or 0
        missing = sorted(set(range(count)) - {r.shard.index for r in refs})
        if missing:
            raise InputError(f"{where}: incomplete split, rank(s) {missing} of {count} missing")
        ndims = {len(r.shape) for r in refs}
        if len(ndims) > 1 or not 0 <= dim < ndims.pop():
            raise InputError(f"{where}: split dim {dim} does not fit the shard shapes")
        others = {tuple(s for j, s in enumerate(r.shape) if j != dim) for r in refs}
        if len(others) > 1:
            raise InputError(f"{where}: split shards differ in shape outside dim {dim}")
    elif kind in ("replicated", "partial"):
        shapes = {r.shape for r in refs}
        if len(shapes) > 1:
            raise InputError(f"{where}: {kind} shards differ in shape {sorted(shapes)}")
        if kind == "replicated" and len(refs) < count:
            notes.append(f"only {len(refs)} of {count} replicas recorded")
        if kind == "partial":
            present = sorted(r.shard.index for r in refs)
            if len(present) < count:
                absent = sorted(set(range(count)) - set(present))
                notes.append(f"partial sum of stages {present} of {count} (stages {absent} contributed nothing)")
    return notes


def group_logical(refs: Iterable[TensorRef]) -> dict[LogicalKey, LogicalTensor]:
    """Group stored shards into logical tensors, validating each group's layout."""
    groups: dict[LogicalKey, list[TensorRef]] = defaultdict(list)
    for r in refs:
        groups[logical_key(r)].append(r)
    out: dict[LogicalKey, LogicalTensor] = {}
    for key, rs in groups.items():
        if len(rs) > 1:  # most logical tensors are one record
            rs.sort(key=lambda r: (r.shard.index, r.shard.replica))
        notes = _validate(rs[0].name, rs[0].coords, rs)
        coords = rs[0].coords  # without its placement: no part of a logical tensor
        if (coords.pp_stage, coords.tp_rank, coords.tp_size) != (None, None, None):
            coords = replace(coords, pp_stage=None, tp_rank=None, tp_size=None)
        out[key] = LogicalTensor(rs[0].name, coords, rs, notes)
    return out
