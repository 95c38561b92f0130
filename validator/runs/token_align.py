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

The aligned run has, per matched request and per tensor that has a token dimension in every step (the dim
named ``t`` in the dumper's dims, else dim 0), one tensor ``name [req=<A's request id> tok=0:n layer=...]``:
the request's rows, in position order, gathered from the steps' reassembled tensors. A request found in one
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

from probes.shards import Coords, ShardSpec
from validator.errors import InputError
from validator.runs.dims import LayoutError, parse_dims
from validator.runs.reassembly import LogicalTensor, group_logical
from validator.runs.tensorfile import torch_dtype
from validator.runs.view import RunView, TensorRef

__all__ = ["Sequence", "align_views", "match_sequences", "merge_runs", "open_for_alignment", "token_sequences"]

AUX_NAMES = frozenset({"input_ids", "positions", "seq_lens", "req_pool_indices"})


@dataclass
class Sequence:
    """One request's tokens as a run computed them: ``ids[p]`` and where its row is, ``(step, row)``, for
    positions p = 0 .. len - 1."""

    key: str
    ids: list[int] = field(default_factory=list)
    rows: list[tuple[int, int]] = field(default_factory=list)


def _aux(view: RunView) -> tuple[dict[int, dict[str, list[int]]], dict[tuple[Any, ...], dict[int, LogicalTensor]]]:
    """Per step the aux fields as lists, and every other tensor's logical tensors by identity and step."""
    per_step: dict[int, dict[str, list[int]]] = defaultdict(dict)
    others: dict[tuple[Any, ...], dict[int, LogicalTensor]] = defaultdict(dict)
    for lt in group_logical(view.tensors).values():
        c = lt.coords
        if c.step is None:
            continue
        if lt.name in AUX_NAMES:  # under PP every stage may dump them (coordinate pp=): any stage's will do
            if c.layer is None and all(k == "pp" for k, _ in c.extra) and lt.name not in per_step[c.step]:
                per_step[c.step][lt.name] = [int(x) for x in lt.materialize().reshape(-1).tolist()]
            continue
        others[(lt.name, c.request, c.tokens, c.layer, c.extra)][c.step] = lt
    return per_step, others


def token_sequences(view: RunView) -> tuple[dict[str, Sequence], list[str]]:
    """The requests of a dumper run and their tokens (module docstring), and the problems met."""
    per_step, _ = _aux(view)
    rids: Mapping[str, list[str]] = (view.manifest.get("sglang_dumper") or {}).get("rids") or {}
    cover: dict[str, dict[int, tuple[int, int, int]]] = {}  # request -> position -> (id, step, row)
    problems: list[str] = []
    for step in sorted(per_step):  # a later step's rows replace an earlier one's at the same positions
        aux = per_step[step]
        if not {"input_ids", "positions", "seq_lens"} <= aux.keys():
            problems.append(f"step {step}: no {', '.join(sorted({'input_ids', 'positions', 'seq_lens'} - aux.keys()))} dumped")
            continue
        ids, pos, lens = aux["input_ids"], aux["positions"], aux["seq_lens"]
        names = rids.get(str(step))
        if len(ids) != len(pos) or (names is not None and len(names) != len(lens)):
            problems.append(f"step {step}: {len(ids)} input_ids, {len(pos)} positions, {len(lens)} seq_lens"
                            + (f", {len(names)} rids" if names is not None else ""))
            continue
        at = 0
        for i, end in enumerate(lens):
            start = pos[at] if at < len(pos) else end
            n = end - start
            if n <= 0 or at + n > len(ids) or pos[at : at + n] != list(range(start, end)):
                problems.append(f"step {step}: request {i} of the batch: positions and seq_lens disagree at row {at}")
                break
            key = names[i] if names is not None else (f"step{step}.{i}" if start == 0 else None)
            if key is None:
                problems.append(f"step {step}: request {i} continues at position {start}, and no rids say whose it is")
            else:
                c = cover.setdefault(key, {})
                for j in range(n):
                    c[start + j] = (ids[at + j], step, at + j)
            at += n
        else:
            if at != len(ids):
                problems.append(f"step {step}: {len(ids) - at} rows beyond the batch's seq_lens")
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
    offset = 0
    for v in views:
        steps = [r.coords.step for r in v.tensors if r.coords.step is not None]
        for r in v.tensors:
            c = r.coords if r.coords.step is None else replace(r.coords, step=r.coords.step + offset)
            tensors.append(replace(r, coords=c))
        info = v.manifest.get("sglang_dumper") or {}
        dims.update(info.get("dims") or {})
        rids.update({str(int(k) + offset): x for k, x in (info.get("rids") or {}).items() if str(k).isdigit()})
        offset += max(steps, default=-1) + 1
    manifest = {"sglang_dumper": {"folders": [v.location for v in views], "dims": dims, "rids": rids,
                                  "unassembled": [u for v in views for u in (v.manifest.get("sglang_dumper") or {}).get("unassembled", [])]}}
    return RunView(name=name, source="sglang-dumper", location=location, labels=dict(views[0].labels), manifest=manifest,
                   tensors=tensors)


def open_for_alignment(path: str | Path) -> RunView:
    """What :func:`validator.runs.sources.open_path` opens, except that a folder holding several SGLang dump
    folders (a disaggregated run: the prefill and the decode server's) is read as one run (:func:`merge_runs`,
    in folder-name order)."""
    from validator.runs.dumper import dump_folders, read_dumper_dir
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


def _token_dim(view: RunView, name: str) -> int | None:
    dims = ((view.manifest.get("sglang_dumper") or {}).get("dims") or {}).get(name)
    if not isinstance(dims, str):
        return 0
    try:
        names = parse_dims(dims).names
    except LayoutError:
        return None
    return names.index("t") if "t" in names else None


def _gather(steps: Mapping[int, LogicalTensor], rows: tuple[tuple[int, int], ...], dim: int) -> torch.Tensor:
    loaded: dict[int, torch.Tensor] = {}
    pieces = []
    for step, row in rows:
        if step not in loaded:
            loaded[step] = steps[step].materialize()
        pieces.append(loaded[step].narrow(dim, row, 1))
    return torch.cat(pieces, dim=dim).contiguous()


def _aligned_refs(view: RunView, items: list[tuple[str, Sequence, int]],
                  others: dict[tuple[Any, ...], dict[int, LogicalTensor]], rows_per_step: dict[int, int],
                  left_out: list[str]) -> list[TensorRef]:
    refs = []
    for (name, _request, _tokens, layer, extra), steps in sorted(others.items(), key=lambda kv: repr(kv[0])):
        dim = _token_dim(view, name)
        label = next(iter(steps.values())).label.replace(f"step={min(steps)} ", "")
        shapes = {s: lt.shape() for s, lt in steps.items()}
        if dim is None or any(len(sh) <= dim or sh[dim] != rows_per_step.get(s) for s, sh in shapes.items()):
            left_out.append(f"{label}: no token dimension of the steps' sizes")
            continue
        lt0 = next(iter(steps.values()))
        dtype = "float64" if lt0.kind == "partial" and len(lt0.shards) > 1 else lt0.dtype
        for request, seq, n in items:
            rows = tuple(seq.rows[:n])
            if any(s not in steps for s, _ in rows):
                left_out.append(f"{label} for request {seq.key}: not dumped in every step that holds its tokens")
                continue
            shape = list(shapes[rows[0][0]])
            shape[dim] = n
            coords = Coords.make(request=request, tokens=(0, n), layer=layer, **dict(extra))
            refs.append(TensorRef(
                name=name, coords=coords, shard=ShardSpec.full(), dtype=dtype, shape=tuple(shape), sha256=None,
                nbytes=math.prod(shape) * torch.empty((), dtype=torch_dtype(dtype)).element_size(), origin=f"{view.location}: {name} of request {seq.key}, rows (step, row) {list(rows)[:4]}...",
                loader=functools.partial(_gather, dict(steps), rows, dim),
            ))  # fmt: skip
    return refs


def align_views(a: RunView, b: RunView) -> tuple[RunView, RunView]:
    """``a`` and ``b`` with their tensors replaced by the token-aligned ones (module docstring)."""
    seqs, pa = token_sequences(a)
    seqs_b, pb = token_sequences(b)
    if not seqs or not seqs_b:
        which = "A" if not seqs else "B"
        raise InputError(f"{(a if not seqs else b).location}: token alignment needs input_ids, positions and seq_lens "
                         f"dumped per step; {which} has no request to align ({'; '.join((pa if not seqs else pb)[:3]) or 'none dumped'})")
    pairs = match_sequences(seqs, seqs_b)
    out = []
    for side, (view, problems) in enumerate(((a, pa), (b, pb))):
        per_step, others = _aux(view)
        rows = {s: len(v.get("input_ids", [])) for s, v in per_step.items()}
        left_out: list[str] = []
        mine = seqs if side == 0 else seqs_b
        unmatched = sorted(set(mine) - {(sa if side == 0 else sb).key for sa, sb, _ in pairs})
        # a request of one run only keeps its tensors (under its own id): the comparison sees them unpaired
        items = [(sa.key, sa if side == 0 else sb, n) for sa, sb, n in pairs] + [(k, mine[k], len(mine[k].ids)) for k in unmatched]
        refs = _aligned_refs(view, items, others, rows, left_out)
        report = {"requests": [{"a": sa.key, "b": sb.key, "tokens": n, "a_tokens": len(sa.ids), "b_tokens": len(sb.ids)}
                               for sa, sb, n in pairs],
                  "unmatched": unmatched, "problems": problems, "left_out": left_out}
        out.append(replace(view, tensors=refs, manifest={**view.manifest, "token_alignment": report},
                           acceptance_files=[], logprob_files=[]))
    return out[0], out[1]
