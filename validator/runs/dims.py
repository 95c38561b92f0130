"""The ``dims`` layout annotation of SGLang's dumper (0.5.23 and later), and the plan that turns the ranks'
dumps of one tensor back into the tensor the model sees.

A dump made with ``dumper.dump(name, x, dims="t h[tp] d")`` stores the string in its meta. Grammar (docs/sglang.md,
section 4): the part before ``#`` names each dimension of the tensor, in order; a dimension may carry
``[axis]``, ``[axis:partial]``, ``[axis:zigzag]`` or several comma-separated modifiers (``(a*b)`` is one fused
dimension, ``1`` a size-1 one); after ``#``, ``axis:replicated`` declares an axis whose ranks hold copies
and ``dp:=group`` names the process group that plays the data-parallel role. The ranks' coordinates come
from the meta's ``sglang_parallel_info`` / ``megatron_parallel_info`` (``tp_rank``/``tp_size``, ...); an
axis is active when its size is above 1.

:func:`plan_layout` is pure: dims, the pieces' coordinates and shapes in, a :class:`Layout` out, or a
:class:`LayoutError` whose message says what does not fit (an active axis nobody declared, a missing rank,
two ranks claiming one slot, a shape at odds with the dims).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["AXES", "Dims", "Layout", "LayoutError", "Modifier", "Op", "axes_of", "parse_dims", "plan_layout"]

# the parallel axes the dumper's metadata names (``<axis>_rank`` / ``<axis>_size``)
AXES = (
    "tp",
    "cp",
    "ep",
    "sp",
    "dp",
    "etp",
    "edp",
    "attn_tp",
    "attn_dp",
    "moe_ep",
    "moe_tp",
    "moe_dp",
    "recompute_pseudo",
)
_INFO_KEYS = ("sglang_parallel_info", "megatron_parallel_info")
_NAME = re.compile(r"[A-Za-z_]\w*")
_DIM = re.compile(r"(?P<name>[A-Za-z_]\w*|\((?P<fused>[^()]+)\))(?:\[(?P<mods>[^\]]+)\])?")


class LayoutError(ValueError):
    """A tensor's dumps do not form one tensor under its dims (the message says why)."""


@dataclass(frozen=True)
class Modifier:
    axis: str
    partial: bool = False  # the ranks hold addends: sum them
    zigzag: bool = False  # context-parallel load balancing: rank r holds chunks r and 2n-1-r of 2n


@dataclass(frozen=True)
class Dims:
    names: tuple[str, ...]
    modifiers: tuple[tuple[Modifier, ...], ...]  # per dimension
    replicated: frozenset[str] = frozenset()
    dp_alias: str | None = None
    text: str = ""

    @property
    def dp_axis(self) -> str:
        return self.dp_alias or "dp"


def _axis(name: str, where: str) -> str:
    if name not in AXES:
        raise LayoutError(f"dims {where!r}: unknown parallel axis {name!r} (known: {', '.join(AXES)})")
    return name


def parse_dims(text: str) -> Dims:
    """``"t h[tp:partial] d # ep:replicated dp:=moe_dp"`` -> :class:`Dims`."""
    shape, _, decl = text.partition("#")
    tokens = shape.split()
    if not tokens:
        raise LayoutError(f"dims {text!r}: names no dimension")
    names: list[str] = []
    mods: list[tuple[Modifier, ...]] = []
    for tok in tokens:
        if tok == "1":
            names.append("1")
            mods.append(())
            continue
        m = _DIM.fullmatch(tok)
        if m is None:
            raise LayoutError(f"dims {text!r}: cannot read {tok!r}")
        if m["fused"] is not None:
            subs = [s.strip() for s in m["fused"].split("*")]
            if len(subs) < 2 or not all(_NAME.fullmatch(s) for s in subs):
                raise LayoutError(f"dims {text!r}: bad fused dimension {tok!r}")
            names.append("*".join(subs))
        else:
            names.append(m["name"])
        here: list[Modifier] = []
        for raw in (m["mods"] or "").split(",") if m["mods"] else []:
            ax, _, quals = raw.strip().partition(":")
            q = {s.strip() for s in quals.split("+") if s.strip()} - {"sharded", "natural"}
            if q - {"partial", "zigzag"}:
                raise LayoutError(f"dims {text!r}: unknown qualifier(s) {sorted(q - {'partial', 'zigzag'})} in {tok!r}")
            if any(h.axis == ax.strip() for h in here):
                raise LayoutError(f"dims {text!r}: axis {ax.strip()!r} twice in {tok!r}")
            here.append(Modifier(_axis(ax.strip(), text), partial="partial" in q, zigzag="zigzag" in q))
        mods.append(tuple(here))
    flat = [s for n in names if n != "1" for s in n.split("*")]
    if len(flat) != len(set(flat)):
        raise LayoutError(f"dims {text!r}: a dimension name is used twice")
    replicated: set[str] = set()
    alias = None
    for tok in decl.split():
        if tok.startswith("dp:="):
            alias = _axis(tok[4:], text)
        elif tok.endswith(":replicated"):
            replicated.add(_axis(tok[: -len(":replicated")], text))
        else:
            raise LayoutError(f"dims {text!r}: cannot read {tok!r} after '#' (expected axis:replicated or dp:=group)")
    sharded = {m.axis for ms in mods for m in ms}
    if sharded & replicated:
        raise LayoutError(f"dims {text!r}: axis {sorted(sharded & replicated)} both sharded and replicated")
    return Dims(tuple(names), tuple(mods), frozenset(replicated), alias, text)


def axes_of(meta: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """The active parallel axes (size > 1) of one dump, ``{axis: (rank, size)}``, from its meta."""
    out: dict[str, tuple[int, int]] = {}
    sources = [meta.get(k) for k in _INFO_KEYS if isinstance(meta.get(k), Mapping)]
    sources.append(meta)  # recompute_pseudo_rank/size sit at the top level of the meta
    for ax in AXES:
        for src in sources:
            assert isinstance(src, Mapping)
            r, s = src.get(f"{ax}_rank"), src.get(f"{ax}_size")
            if isinstance(r, int) and isinstance(s, int) and not isinstance(r, bool):
                if s > 1:
                    out[ax] = (r, s)
                break
    return out


@dataclass(frozen=True)
class Op:
    """One unsharding step: along ``axis``, concatenate on dimension ``dim`` (``zigzag``: then restore the
    natural order) or, when ``partial``, sum."""

    axis: str
    dim: int
    partial: bool = False
    zigzag: bool = False
    seq_lens: tuple[int, ...] | None = None  # zigzag on a packed token dimension: each sequence's global length

    def describe(self) -> str:
        how = " (zigzag)" if self.zigzag and self.seq_lens is None else " (zigzag per sequence)" if self.zigzag else ""
        return f"{self.axis}: " + ("sum" if self.partial else f"concat dim {self.dim}" + how)


@dataclass(frozen=True)
class Layout:
    """How the kept pieces (indices into the input) form the tensor.

    ``primary``: the natural-order concatenation left to reassembly (one shard per rank of that axis);
    ``ops``: the steps each group of pieces goes through first (innermost first); ``replicated``: axes whose
    ranks hold copies (compared copy against copy); ``coords[i]``: piece i's rank on each axis."""

    kept: tuple[int, ...]
    primary: Op | None
    ops: tuple[Op, ...]
    replicated: tuple[str, ...]
    sizes: Mapping[str, int]
    coords: tuple[Mapping[str, int], ...]
    dropped: tuple[int, ...] = ()  # DP ranks without data for this tensor
    notes: tuple[str, ...] = field(default=())


def _rank_list(ranks: Sequence[int]) -> str:
    return ", ".join(str(r) for r in ranks)


def plan_layout(
    dims: Dims,
    axes: Sequence[Mapping[str, tuple[int, int]]],
    shapes: Sequence[tuple[int, ...]],
    ranks: Sequence[int],
    seq_lens: Sequence[int] | None = None,
    lens_from: str = "",
) -> Layout:
    """The layout of one tensor's pieces (one per dumping rank): ``axes[i]`` piece i's active axes,
    ``shapes[i]`` its shape, ``ranks[i]`` its world rank (for messages). ``seq_lens``: the global length of
    each sequence packed in the step's token dimension (``lens_from`` names where they were read), which
    zigzag on a token dimension ``t`` needs."""
    for sh, rk in zip(shapes, ranks):
        if len(sh) != len(dims.names):
            raise LayoutError(
                f"rank {rk}: shape {list(sh)} has {len(sh)} dimensions, dims {dims.text!r} names {len(dims.names)}"
            )
    idx = list(range(len(shapes)))
    dropped: list[int] = []
    dp = dims.dp_axis
    if any(dp in a for a in axes):  # data parallel: the requests live on one DP rank; keep that rank's pieces
        by_dp: dict[int, list[int]] = defaultdict(list)
        for i in idx:
            by_dp[axes[i].get(dp, (0, 1))[0]].append(i)
        full = [r for r, ps in by_dp.items() if any(math.prod(shapes[i]) > 0 for i in ps)]
        if len(full) > 1:
            raise LayoutError(
                f"{dp} ranks {_rank_list(sorted(full))} all hold data for it; the dims declare no way to join them"
            )
        keep = full[0] if full else min(by_dp)
        idx = by_dp[keep]
        dropped = sorted(set(range(len(shapes))) - set(idx))
    active = set().union(*(axes[i].keys() for i in idx)) - {dp}
    ops: list[Op] = []
    for d, ms in enumerate(dims.modifiers):
        for m in reversed(ms):  # the rightmost modifier of a dimension is the innermost split
            if m.axis in active:
                ops.append(Op(m.axis, d, m.partial, m.zigzag))
    sharded = {o.axis for o in ops}
    replicated = sorted((dims.replicated | {"recompute_pseudo"}) & active)
    declared = sharded | set(replicated)
    undeclared = [a for a in AXES if a in active - declared]
    if undeclared:  # fine when the declared axes' ranks determine it (attn_tp under tp, say)
        bad = []
        for ax in undeclared:
            seen: dict[tuple[int, ...], int] = {}
            if (
                not declared
                or any(not declared <= axes[i].keys() for i in idx if ax in axes[i])
                or any(
                    seen.setdefault(tuple(axes[i][a][0] for a in sorted(declared)), axes[i][ax][0]) != axes[i][ax][0]
                    for i in idx
                    if ax in axes[i]
                )
            ):
                bad.append(ax)
        if bad:
            what = ", ".join(f"{a} (size {next(axes[i][a][1] for i in idx if a in axes[i])})" for a in bad)
            raise LayoutError(
                f"active axis {what} not declared by dims {dims.text!r}: say how its ranks hold the tensor "
                f"(a split like h[{bad[0]}], h[{bad[0]}:partial], or '# {bad[0]}:replicated'), or pass --split"
            )
    sizes: dict[str, int] = {}
    for i in idx:
        for ax in declared:
            if ax not in axes[i]:
                raise LayoutError(f"rank {ranks[i]}: no {ax} rank in its metadata, though other ranks have one")
            if sizes.setdefault(ax, axes[i][ax][1]) != axes[i][ax][1]:
                raise LayoutError(
                    f"{ax} size differs between ranks ({sizes[ax]} and {axes[i][ax][1]} on rank {ranks[i]})"
                )
    order = sorted(declared)
    slots: dict[tuple[int, ...], int] = {}
    for i in idx:
        key = tuple(axes[i][a][0] for a in order)
        if key in slots:
            what = ", ".join(f"{a}={r}" for a, r in zip(order, key)) or "no declared axis"
            raise LayoutError(
                f"ranks {ranks[slots[key]]} and {ranks[i]} both hold the slot ({what}): an axis the metadata "
                "does not name tells them apart"
            )
        slots[key] = i
    expected = math.prod(sizes.values())
    if len(slots) != expected:
        missing = [ax for ax in order if {k[order.index(ax)] for k in slots} != set(range(sizes[ax]))]
        raise LayoutError(
            f"incomplete: {len(slots)} of the {expected} ranks over {', '.join(order)} dumped it"
            + (f" ({', '.join(missing)} ranks missing)" if missing else "")
        )
    for k, o in enumerate(ops):
        if o.zigzag and dims.names[o.dim] == "t":
            ops[k] = _packed_zigzag(o, ops, dims, [shapes[i] for i in idx], sizes, seq_lens, lens_from)
        elif o.zigzag and dims.names[o.dim] != "s":
            raise LayoutError(
                f"zigzag order on dimension {dims.names[o.dim]!r}: only a sequence dimension 's', or a packed "
                "token dimension 't' with its sequences' lengths, is put back in order"
            )
    for ax in sizes:
        if ax in sharded and any(o.zigzag and o.seq_lens is None for o in ops if o.axis == ax):
            for i in idx:
                d = next(o.dim for o in ops if o.axis == ax)
                if shapes[i][d] % 2:
                    raise LayoutError(f"rank {ranks[i]}: zigzag dimension {d} has odd length {shapes[i][d]}")
    primary = next((o for o in ops if not o.partial and not o.zigzag and len(dims.modifiers[o.dim]) == 1), None)
    return Layout(
        kept=tuple(idx),
        primary=primary,
        ops=tuple(o for o in ops if o is not primary),
        replicated=tuple(replicated),
        sizes=sizes,
        coords=tuple({a: r for a, (r, _) in axes[i].items() if a in declared} for i in range(len(shapes))),
        dropped=tuple(dropped),
    )


def _packed_zigzag(
    op: Op,
    ops: Sequence[Op],
    dims: Dims,
    shapes: Sequence[tuple[int, ...]],
    sizes: Mapping[str, int],
    seq_lens: Sequence[int] | None,
    lens_from: str,
) -> Op:
    """Zigzag on a packed token dimension: each sequence of length L is cut into 2n chunks (n ranks), rank r
    holding chunks r and 2n-1-r of every sequence, one sequence after another. The op with the lengths it
    needs, or a :class:`LayoutError` when none were dumped or they do not fit the shapes."""
    where = f"zigzag order on dimension 't' (packed sequences over {op.axis})"
    if seq_lens is None:
        raise LayoutError(
            f"{where}: needs each sequence's length, and its ranks dumped no seq_lens or cu_seqlens_q in this step"
        )
    if any(o.dim == op.dim for o in ops[ops.index(op) + 1 :]):
        raise LayoutError(f"{where}: another split of the dimension is outside it (only an inner one is undone first)")
    n = sizes[op.axis]
    lens = [int(x) for x in seq_lens]
    # what reaches the zigzag step along the dimension: a piece times the inner concatenations of the same dim
    inner = math.prod(sizes[o.axis] for o in ops[: ops.index(op)] if o.dim == op.dim and not o.partial)
    local = {sh[op.dim] * inner for sh in shapes}
    bad = [x for x in lens if x <= 0 or x % (2 * n)]
    if bad or local != {sum(lens) // n} or sum(lens) % n:
        why = (
            f"length(s) {bad[:4]} not a positive multiple of 2 x {n}"
            if bad
            else f"they sum to {sum(lens)}, the {n} ranks hold {sorted(local)} tokens each"
        )
        raise LayoutError(
            f"{where}: the sequence lengths {lens[:8]}{' ...' if len(lens) > 8 else ''} from {lens_from or 'the step'}"
            f" do not fit ({why})"
        )
    return Op(op.axis, op.dim, op.partial, op.zigzag, tuple(lens))
