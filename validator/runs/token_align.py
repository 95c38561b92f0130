"""Token alignment: pairing the tensors of two SGLang dumper runs whose requests were batched differently
(prefill chunks of other sizes, prefill against decode, other batch sizes), token by token.

Each run's dumps of ``input_ids``, ``positions`` and ``seq_lens`` per step (the fields SGLang's dumper writes
for a forward batch; ``rids``, the batch's request ids, link a request's steps) say which row of a step's
tensors is which token: the batch's requests come in order, request ``i`` holds the rows of positions
``seq_lens[i] - n .. seq_lens[i] - 1`` (so prefill chunks and decode steps both fit). A request's tokens are
collected in position order across steps; a later step that covers positions again (a recomputed chunk)
replaces them. Requests are matched between runs by their token ids, as SGLang's ``smart`` aligner does: equal
ids first, else the longest one-is-a-prefix-of-the-other; the tokens both runs hold (positions 0 .. n-1 of
the shorter) are compared. Request ids need not agree between the runs.

A batch may also come as ``b s`` (``input_ids`` of shape ``[B, S]``, ``positions`` alike; ``seq_lens``, if
dumped, one per batch row): batch row ``i`` is request ``i``, its tokens the columns that are not padding, at
consecutive positions. Padding is what an ``attention_mask`` of shape ``[B, S]`` marks 0, or a negative
position; a row whose remaining positions skip (or do not end at its ``seq_lens``) is reported and left out.
Rows count batch-major (``b * S + s``), as SGLang's comparator collapses ``b s``. Without positions each
row starts at position 0.

Megatron's fields are read too: ``position_ids`` stands for ``positions``; a batch with ``cu_seqlens_q`` (and no
``seq_lens``) is packed, sequence i holding rows ``cu_seqlens_q[i] .. cu_seqlens_q[i + 1] - 1`` of the flattened
``input_ids`` (a ``[1, T]`` one included), at the positions ``position_ids`` give or else from 0; rows after
``cu_seqlens_q[-1]`` are padding. ``position_ids`` without ``cu_seqlens_q`` make one sequence of the batch.
Megatron dumps no request ids, so its sequences are told apart by step and index.

With DP attention each DP rank runs a batch of its own: tensors that carry a coordinate ``dp=<rank>`` (aux
fields included) are that DP rank's, its ``rids`` are the manifest's ``dp_rids[step][rank]``, and each DP
rank's batch is read as above on its own; a request is keyed by its rid (or, without rids, by step, DP rank and
batch index), so the DP ranks' requests join into one set. A step's rows are counted over its DP ranks in
DP-rank order, the order DP attention's gather puts them in, so a tensor of that step without a ``dp``
coordinate whose token dimension holds every DP rank's rows (one after the gather) is aligned too. A run with
DP attention thus pairs token by token with one without it.

The aligned run has, per matched request and per tensor that has a token dimension in every step (the dim
named ``t``, or ``b*s``, in the dumper's dims, else the dims ``b`` and ``s`` of a ``b s`` batch in either order;
without dims, dim 0, or dims 0 and 1 where they are the batch's ``[B, S]``), one tensor
``name [req=<A's request id> tok=0:n layer=...]``: the request's rows, in position order, gathered from the
steps' reassembled tensors (``b`` and ``s`` become one token dimension where the first of them was). A request found in one
run only keeps its tensors under its own id, so the comparison reports them as present on one side. What
could not be aligned (steps whose aux fields disagree, positions never dumped, tensors without a token
dimension) is listed in the aligned run's manifest (``token_alignment``). Without ``rids`` each step's requests
are told apart by batch index, so only whole prompts prefilled from position 0 can be aligned.

A folder holding several dump folders (a prefill server's and a decode server's, one run split in two) is
read as one run by :func:`open_for_alignment`: each folder's steps follow the previous folder's.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from probes.core.shards import Coords, ShardSpec
from validator.errors import InputError
from validator.runs.dims import LayoutError, parse_dims
from validator.runs.dumper import BATCH_FIELDS, dump_folders, read_dumper_dir
from validator.runs.reassembly import LogicalTensor, group_logical
from validator.runs.tensorfile import torch_dtype
from validator.runs.view import RunView, TensorRef

__all__ = ["Sequence", "align_views", "match_sequences", "merge_runs", "open_for_alignment", "token_sequences"]

_FLAT = ("input_ids", "positions", "seq_lens")  # what a flat SGLang batch needs; a b s or Megatron one: input_ids

Batch = tuple[int, "int | None"]  # (step, DP rank): one batch of one step; the DP rank None without DP attention


@dataclass
class Sequence:
    """One request's tokens as a run computed them: ``ids[p]`` and where its row is, ``(step, row)``, for
    positions p = 0 .. len - 1. ``row`` counts the step's rows over its DP ranks' batches in DP-rank order (the
    order DP attention gathers them in); a ``b s`` batch's rows are counted batch-major (``b * S + s``)."""

    key: str
    ids: list[int] = field(default_factory=list)
    rows: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class _Aux:
    """One batch's aux fields, flattened batch-major; ``grid``: (B, S) when its ``input_ids`` is ``[B, S]``."""

    fields: dict[str, list[int]] = field(default_factory=dict)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    grid: tuple[int, int] | None = None
    per_rank: set[str] = field(default_factory=set)  # fields the reader kept per world rank (coordinate rank=)

    @property
    def rows(self) -> int:
        return len(self.fields.get("input_ids", []))


def _dp_of(extra: tuple[tuple[str, str], ...]) -> tuple[int | None, tuple[tuple[str, str], ...]]:
    """The DP rank a tensor's coordinate ``dp`` names (the batch of that DP rank), and the other extras."""
    dp = next((v for k, v in extra if k == "dp"), None)
    rest = tuple((k, v) for k, v in extra if k != "dp")
    return (int(dp) if dp is not None and dp.lstrip("-").isdigit() else None), rest


def _order(b: Batch) -> tuple[int, int]:
    return b[0], -1 if b[1] is None else b[1]


def _aux(view: RunView) -> tuple[dict[Batch, _Aux], dict[tuple[Any, ...], dict[Batch, LogicalTensor]]]:
    """Per batch the aux fields, and every other tensor's logical tensors by identity and batch."""
    per_batch: dict[Batch, _Aux] = defaultdict(_Aux)
    others: dict[tuple[Any, ...], dict[Batch, LogicalTensor]] = defaultdict(dict)
    for lt in group_logical(view.tensors).values():
        c = lt.coords
        if c.step is None:
            continue
        dp, extra = _dp_of(c.extra)
        if lt.name in BATCH_FIELDS:  # under PP every stage may dump them (coordinate pp=): any stage's will do
            aux = per_batch[(c.step, dp)]
            if c.layer is None and all(k == "pp" for k, _ in extra) and lt.name not in aux.fields:
                x = lt.materialize()
                aux.fields[lt.name] = [int(v) for v in x.reshape(-1).tolist()]
                aux.shapes[lt.name] = tuple(x.shape)
            elif any(k == "rank" for k, _ in extra):
                aux.per_rank.add(lt.name)
            continue
        others[(lt.name, c.request, c.tokens, c.layer, extra)][(c.step, dp)] = lt
    for aux in per_batch.values():
        f = aux.fields
        if "positions" not in f and "position_ids" in f:  # Megatron's name for them
            f["positions"], aux.shapes["positions"] = f["position_ids"], aux.shapes["position_ids"]
        shape = aux.shapes.get("input_ids", ())
        if len(shape) == 2 and "cu_seqlens_q" not in f:  # [B, S]; with cu_seqlens_q a packed [1, T]
            aux.grid = (shape[0], shape[1])
    return per_batch, others


def _offsets(per_batch: Mapping[Batch, _Aux]) -> dict[Batch, int]:
    """Where each batch's rows start among its step's rows (DP ranks in order)."""
    out: dict[Batch, int] = {}
    at: dict[int, int] = defaultdict(int)
    for b in sorted(per_batch, key=_order):
        out[b] = at[b[0]]
        at[b[0]] += per_batch[b].rows
    return out


def _rids(view: RunView, b: Batch) -> list[str] | None:
    info = view.manifest.get("sglang_dumper") or {}
    if b[1] is None:
        got = (info.get("rids") or {}).get(str(b[0]))
    else:
        got = ((info.get("dp_rids") or {}).get(str(b[0])) or {}).get(str(b[1]))
    return list(got) if isinstance(got, (list, tuple)) else None


def _megatron(aux: _Aux) -> bool:
    """A flat batch described Megatron's way: ``cu_seqlens_q`` (packed sequences), or ``position_ids`` alone
    (one sequence), rather than SGLang's ``seq_lens``."""
    return (
        aux.grid is None and "seq_lens" not in aux.fields and bool({"cu_seqlens_q", "position_ids"} & aux.fields.keys())
    )


def _requests(aux: _Aux) -> int:
    """How many requests the batch holds (what its rids must count)."""
    f = aux.fields
    if aux.grid is not None:
        return aux.grid[0]
    if _megatron(aux):
        return max(len(f["cu_seqlens_q"]) - 1, 0) if "cu_seqlens_q" in f else 1
    return len(f.get("seq_lens", []))


def _spans(aux: _Aux, where: str, problems: list[str]) -> list[tuple[int, list[int]]] | None:
    """The batch's requests in batch order: (first position, the rows holding its tokens), or None when the
    fields disagree (the problem is added)."""
    f = aux.fields
    ids, lens = f["input_ids"], f.get("seq_lens")
    if _megatron(aux):  # sequence i holds rows cu_seqlens_q[i] .. cu_seqlens_q[i + 1] - 1, from position 0 unless
        cu, pos = f.get("cu_seqlens_q", [0, len(ids)]), f.get("positions")  # position_ids say otherwise
        if (
            (pos is not None and len(pos) != len(ids))
            or not cu
            or cu[0] != 0
            or cu[-1] > len(ids)
            or any(x > y for x, y in zip(cu, cu[1:]))
        ):
            problems.append(
                f"{where}: cu_seqlens_q {cu[:8]} and {len(ids)} input_ids"
                + (f", {len(pos)} position_ids" if pos is not None else "")
                + " disagree"
            )
            return None
        out = []
        for i, (x, y) in enumerate(zip(cu, cu[1:])):  # rows after cu_seqlens_q[-1]: the packed batch's padding
            p = pos[x:y] if pos is not None else list(range(y - x))
            rows = list(range(x, y))
            if p and p != list(range(p[0], p[0] + len(p))):
                problems.append(f"{where}: sequence {i}: its position_ids are not consecutive; it is not aligned")
                rows = []
            out.append((p[0] if p else 0, rows))
        return out
    if aux.grid is None:  # flat: request i holds positions seq_lens[i] - n .. seq_lens[i] - 1
        pos = f["positions"]
        assert lens is not None
        if len(pos) != len(ids):
            problems.append(f"{where}: {len(ids)} input_ids, {len(pos)} positions, {len(lens)} seq_lens")
            return None
        out, at = [], 0
        for i, end in enumerate(lens):
            start = pos[at] if at < len(pos) else end
            n = end - start
            if n <= 0 or at + n > len(ids) or pos[at : at + n] != list(range(start, end)):
                problems.append(f"{where}: request {i} of the batch: positions and seq_lens disagree at row {at}")
                return out
            out.append((start, list(range(at, at + n))))
            at += n
        if at != len(ids):
            problems.append(f"{where}: {len(ids) - at} rows beyond the batch's seq_lens")
        return out
    # b s: batch row i is request i; its tokens are the columns not marked as padding (attention_mask 0, or
    # a negative position), at consecutive positions that end at seq_lens[i] where seq_lens is dumped
    nb, ns = aux.grid
    pos = f.get("positions") or [j for _ in range(nb) for j in range(ns)]  # without positions: each row from 0
    mask = f["attention_mask"] if aux.shapes.get("attention_mask") == aux.grid else None  # not a [b, 1, s, s] one
    if len(pos) != nb * ns or (lens is not None and len(lens) != nb):
        problems.append(
            f"{where}: input_ids [{nb}, {ns}], but {len(pos)} positions"
            + (f", {len(lens)} seq_lens" if lens is not None else "")
        )
        return None
    out = []
    for i in range(nb):
        rows = [i * ns + j for j in range(ns) if pos[i * ns + j] >= 0 and (mask is None or mask[i * ns + j] != 0)]
        start = pos[rows[0]] if rows else 0
        if [pos[r] for r in rows] != list(range(start, start + len(rows))) or (
            lens is not None and rows and lens[i] != start + len(rows)
        ):
            problems.append(
                f"{where}: batch row {i}: its unpadded positions are not consecutive"
                + (" or do not end at its seq_lens" if lens is not None else "")
                + "; the row is not aligned"
            )
            rows = []  # the other rows stand on their own
        out.append((start, rows))
    return out


def token_sequences(view: RunView) -> tuple[dict[str, Sequence], list[str]]:
    """The requests of a dumper run and their tokens (module docstring), and the problems met."""
    per_batch, _ = _aux(view)
    offsets = _offsets(per_batch)
    cover: dict[str, dict[int, tuple[int, int, int]]] = {}  # request -> position -> (id, step, row)
    problems: list[str] = []
    for b in sorted(per_batch, key=_order):  # a later step's rows replace an earlier one's at the same positions
        step, dp = b
        where = f"step {step}" + (f" DP rank {dp}" if dp is not None else "")
        aux = per_batch[b]
        need = _FLAT[:1] if aux.grid is not None or _megatron(aux) else _FLAT
        if aux.per_rank:  # ranks that dumped different batches and no DP rank that tells them apart
            problems.append(
                f"{where}: {', '.join(sorted(aux.per_rank))} differ between ranks and were kept per rank "
                "(a batch per rank, as with DP attention, needs each dump's DP rank); the step is not aligned"
            )
            continue
        if not set(need) <= aux.fields.keys():
            problems.append(f"{where}: no {', '.join(sorted(set(need) - aux.fields.keys()))} dumped")
            continue
        names = _rids(view, b)
        spans = _spans(aux, where, problems)
        if spans is None:
            continue
        if names is not None and len(names) != _requests(aux):
            problems.append(f"{where}: {len(names)} rids for a batch of {_requests(aux)} requests")
            continue
        ids = aux.fields["input_ids"]
        for i, (start, rows) in enumerate(spans):
            if not rows:  # an empty batch row (all padding)
                continue
            key = (
                names[i]
                if names is not None
                else ((f"step{step}.{i}" if dp is None else f"step{step}.dp{dp}.{i}") if start == 0 else None)
            )
            if key is None:
                problems.append(f"{where}: request {i} continues at position {start}, and no rids say whose it is")
                continue
            c = cover.setdefault(key, {})
            for j, r in enumerate(rows):
                c[start + j] = (ids[r], step, offsets[b] + r)
    seqs: dict[str, Sequence] = {}
    for key, c in cover.items():
        n = 0
        while n in c:
            n += 1
        if len(c) > n:
            problems.append(f"request {key}: position {n} was never dumped; its tokens from there on are not aligned")
        seqs[key] = Sequence(key, [c[p][0] for p in range(n)], [(c[p][1], c[p][2]) for p in range(n)])
    return seqs, problems


def merge_runs(views: list[RunView], name: str, location: str) -> RunView:
    """Several dumper folders of one run (a prefill server's and a decode server's) as one: each folder's steps
    follow the previous folder's."""
    tensors: list[TensorRef] = []
    dims: dict[str, str] = {}
    rids: dict[str, list[str]] = {}
    dp_rids: dict[str, dict[str, list[str]]] = {}
    offset = 0
    for v in views:
        steps = [r.coords.step for r in v.tensors if r.coords.step is not None]
        for r in v.tensors:
            c = r.coords if r.coords.step is None else replace(r.coords, step=r.coords.step + offset)
            tensors.append(replace(r, coords=c))
        info = v.manifest.get("sglang_dumper") or {}
        dims.update(info.get("dims") or {})
        rids.update({str(int(k) + offset): x for k, x in (info.get("rids") or {}).items() if str(k).isdigit()})
        dp_rids.update({str(int(k) + offset): x for k, x in (info.get("dp_rids") or {}).items() if str(k).isdigit()})
        offset += max(steps, default=-1) + 1
    manifest = {
        "sglang_dumper": {
            "folders": [v.location for v in views],
            "dims": dims,
            "rids": rids,
            "unassembled": [u for v in views for u in (v.manifest.get("sglang_dumper") or {}).get("unassembled", [])],
        }
    }
    if dp_rids:
        manifest["sglang_dumper"]["dp_rids"] = dp_rids
    return RunView(
        name=name,
        source="sglang-dumper",
        location=location,
        labels=dict(views[0].labels),
        manifest=manifest,
        tensors=tensors,
    )


def open_for_alignment(path: str | Path) -> RunView:
    """What :func:`validator.runs.sources.open_path` opens, except that a folder holding several SGLang dump
    folders (a disaggregated run: the prefill and the decode server's) is read as one run (:func:`merge_runs`,
    in folder-name order)."""
    from validator.runs.sources import open_path

    p = Path(path)
    folders = dump_folders(p) if p.is_dir() else []
    if len(folders) > 1:
        return merge_runs([read_dumper_dir(f) for f in folders], p.name, str(p))
    return open_path(p)


def match_sequences(a: Mapping[str, Sequence], b: Mapping[str, Sequence]) -> list[tuple[Sequence, Sequence, int]]:
    """Pairs (A's request, B's request, tokens in common): equal token ids first, then the longest pair of
    which one is a prefix of the other. B's requests are taken in the order the run first met them."""
    by_ids: dict[tuple[int, ...], list[str]] = defaultdict(list)
    for k, s in a.items():
        by_ids[tuple(s.ids)].append(k)
    claimed: set[str] = set()
    out = []
    for sb in b.values():
        ka = next((k for k in by_ids.get(tuple(sb.ids), []) if k not in claimed), None)
        if ka is None:
            best = 0
            for k, sa in a.items():
                n = min(len(sa.ids), len(sb.ids))
                if k not in claimed and n > best and sa.ids[:n] == sb.ids[:n]:
                    ka, best = k, n
        if ka is not None:
            claimed.add(ka)
            out.append((a[ka], sb, min(len(a[ka].ids), len(sb.ids))))
    return out


Place = tuple[int, int | None]  # where a batch's rows are: (token dim, None), or (b dim, s dim), batch-major


def _token_dims(view: RunView, name: str) -> Place | str | None:
    """A tensor's token dimension(s) from its dims: ``t`` (or a fused ``b*s``), else ``b`` and ``s``; "auto"
    without dims (dim 0, or dims 0 and 1 of a ``b s`` batch); None: no token dimension."""
    dims = ((view.manifest.get("sglang_dumper") or {}).get("dims") or {}).get(name)
    if not isinstance(dims, str):
        return "auto"
    try:
        names = parse_dims(dims).names
    except LayoutError:
        return None
    for t in ("t", "b*s"):
        if t in names:
            return (names.index(t), None)
    if "b" in names and "s" in names:
        return (names.index("b"), names.index("s"))
    return None


def _place(spec: Place | str | None, shape: tuple[int, ...], rows: int, grid: tuple[int, int] | None) -> Place | None:
    """How the ``rows`` rows of a batch lie in a tensor of ``shape``, or None when they do not fit."""
    if spec == "auto":
        if shape and shape[0] == rows:
            return (0, None)
        return (0, 1) if grid is not None and len(shape) >= 2 and shape[:2] == grid else None
    if not isinstance(spec, tuple) or len(shape) <= max(d for d in spec if d is not None):
        return None
    d0, d1 = spec
    if d1 is None:
        return spec if shape[d0] == rows else None
    if shape[d0] * shape[d1] != rows or (grid is not None and shape[d0] != grid[0]):
        return None
    return spec


def _lo(place: Place) -> int:
    """The aligned tensor's token dimension."""
    return place[0] if place[1] is None else min(place[0], place[1])


def _out_shape(shape: tuple[int, ...], place: Place, n: int) -> tuple[int, ...]:
    """The aligned tensor's shape: the token dimension (``b`` and ``s`` become one, at the first) n long."""
    lo = _lo(place)
    rest = [x for i, x in enumerate(shape) if i not in place]
    return (*rest[:lo], n, *rest[lo:])


def _gather(batches: Mapping[Batch, LogicalTensor], picks: tuple[tuple[Batch, Place, int], ...]) -> torch.Tensor:
    """One row per pick (batch, where its rows lie, row in the batch), stacked on the token dimension."""
    loaded: dict[Batch, torch.Tensor] = {}
    pieces = []
    for b, (d0, d1), row in picks:
        if b not in loaded:
            loaded[b] = batches[b].materialize()
        x = loaded[b]
        if d1 is None:
            pieces.append(x.narrow(d0, row, 1))
        else:
            i, j = divmod(row, x.shape[d1])
            pieces.append(x.select(d0, i).select(d1 - (d1 > d0), j).unsqueeze(_lo((d0, d1))))
    return torch.cat(pieces, dim=_lo(picks[0][1])).contiguous()


def _aligned_refs(
    view: RunView,
    items: list[tuple[str, Sequence, int]],
    others: dict[tuple[Any, ...], dict[Batch, LogicalTensor]],
    per_batch: Mapping[Batch, _Aux],
    left_out: list[str],
) -> list[TensorRef]:
    offsets = _offsets(per_batch)
    totals: dict[int, int] = defaultdict(int)
    for b, aux in per_batch.items():
        totals[b[0]] += aux.rows
    # per step, the DP batches in row order: a step's row r is in the last batch that starts at or before it
    starts: dict[int, list[tuple[int, Batch]]] = defaultdict(list)
    for b in sorted(per_batch, key=_order):
        starts[b[0]].append((offsets[b], b))
    refs = []
    for (name, _request, _tokens, layer, extra), batches in sorted(others.items(), key=lambda kv: repr(kv[0])):
        spec = _token_dims(view, name)
        lt0 = next(iter(batches.values()))
        where_c = replace(lt0.coords, step=None, extra=_dp_of(lt0.coords.extra)[1]).label()
        label = f"{name} [{where_c}]" if where_c else name
        places: dict[Batch, Place] = {}
        for b, lt in batches.items():  # a batch of one DP rank, or (DP rank None) every row of the step
            own = per_batch.get(b)
            rows, grid = (own.rows, own.grid) if own is not None else (totals.get(b[0], -1), None)
            where = _place(spec, lt.shape(), rows, grid)
            if where is not None:
                places[b] = where
        if len(places) != len(batches):
            left_out.append(f"{label}: no token dimension of the steps' sizes")
            continue
        dtype = "float64" if lt0.kind == "partial" and len(lt0.shards) > 1 else lt0.dtype
        for request, seq, n in items:
            picks = []
            for step, row in seq.rows[:n]:
                off, b = next((o, bb) for o, bb in reversed(starts[step]) if o <= row)
                if b in batches:
                    picks.append((b, places[b], row - off))
                elif (step, None) in batches:
                    picks.append(((step, None), places[(step, None)], row))
                else:
                    break
            if len(picks) < n:
                left_out.append(f"{label} for request {seq.key}: not dumped in every step that holds its tokens")
                continue
            b0, place0, _ = picks[0]
            shape = _out_shape(batches[b0].shape(), place0, n)
            coords = Coords.make(request=request, tokens=(0, n), layer=layer, **dict(extra))
            refs.append(TensorRef(
                name=name, coords=coords, shard=ShardSpec.full(), dtype=dtype, shape=shape, sha256=None,
                nbytes=math.prod(shape) * torch.empty((), dtype=torch_dtype(dtype)).element_size(),
                origin=f"{view.location}: {name} of request {seq.key}, rows (step, row) {list(seq.rows[:4])}...",
                loader=functools.partial(_gather, dict(batches), tuple(picks)),
            ))  # fmt: skip
    return refs


def align_views(a: RunView, b: RunView) -> tuple[RunView, RunView]:
    """``a`` and ``b`` with their tensors replaced by the token-aligned ones (module docstring)."""
    seqs, pa = token_sequences(a)
    seqs_b, pb = token_sequences(b)
    if not seqs or not seqs_b:
        which = "A" if not seqs else "B"
        raise InputError(
            f"{(a if not seqs else b).location}: token alignment needs input_ids, positions and seq_lens "
            f"dumped per step; {which} has no request to align ({'; '.join((pa if not seqs else pb)[:3]) or 'none dumped'})"
        )
    pairs = match_sequences(seqs, seqs_b)
    out = []
    for side, (view, problems) in enumerate(((a, pa), (b, pb))):
        per_batch, others = _aux(view)
        left_out: list[str] = []
        mine = seqs if side == 0 else seqs_b
        unmatched = sorted(set(mine) - {(sa if side == 0 else sb).key for sa, sb, _ in pairs})
        # a request of one run only keeps its tensors (under its own id): the comparison sees them unpaired
        items = [(sa.key, sa if side == 0 else sb, n) for sa, sb, n in pairs] + [
            (k, mine[k], len(mine[k].ids)) for k in unmatched
        ]
        refs = _aligned_refs(view, items, others, per_batch, left_out)
        report = {
            "requests": [
                {"a": sa.key, "b": sb.key, "tokens": n, "a_tokens": len(sa.ids), "b_tokens": len(sb.ids)}
                for sa, sb, n in pairs
            ],
            "unmatched": unmatched,
            "problems": problems,
            "left_out": left_out,
        }
        out.append(
            replace(
                view,
                tensors=refs,
                manifest={**view.manifest, "token_alignment": report},
                acceptance_files=[],
                logprob_files=[],
            )
        )
    return out[0], out[1]
