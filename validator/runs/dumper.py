"""Reading the output of SGLang's own dumper (``sglang.srt.debug_utils.dumper``) as a run.

Two file-naming generations (docs/sglang.md, section 4), both one ``torch.save`` of
``{"value": ..., "meta": {...}}`` per dump, in one folder per experiment:

- sglang 0.5.9: ``SGLANG_DUMPER_DIR/sglang_dump_<time>/forward_pass_id=3___rank=0___dump_index=7___name=x[___layer_id=5].pt``
- sglang >= 0.5.10: ``DUMPER_DIR/<exp_name>/step=3___rank=0___dump_index=7___name=x[___layer_id=5...].pt``
  (0.5.23 adds ``recompute_status=`` and, optionally, ``pp_rank=``, ``tp_rank=``... to the name).

Files are loaded with ``torch.load(path, weights_only=True)`` only, never full unpickling; a file over the
size cap is refused before it is opened, and a file the restricted loader refuses (a pickle that calls a
function, for instance) is refused with its path. Mapping to coordinates: ``forward_pass_id`` / ``step`` ->
``step``; ``layer_id`` -> ``layer``; the meta's ``sglang_parallel_info`` (or the name's ``tp_rank`` /
``pp_rank``) -> placement; ``rank``, ``dump_index`` and ``recompute_status`` are bookkeeping; any other tag
(user keys) -> an extra coordinate, which identifies the tensor.

How the ranks' dumps of one tensor form it: a ``split`` rule (``{"attn_*": 1}``: TP slices along dim 1, in
rank order) first; else the meta's ``dims`` (0.5.23; validator/runs/dims.py: concatenation, partial sums,
replicated copies, DP filtering, context-parallel zigzag order, on a packed token dimension per sequence with
the step's ``seq_lens`` or ``cu_seqlens_q``); else, without dims, ``replicated`` copies. With DP attention (an active
``attn_dp``, else ``dp``, axis) each DP rank runs a batch of its own: a batch field dumped without dims
(``input_ids``, ``positions``...), and a tensor whose dims name its DP group (``# dp:=attn_dp``) when several
DP ranks hold rows of it, is a tensor per DP rank (coordinate ``dp``), and the ``rids`` per DP rank are kept
in the manifest's ``dp_rids``. Each copy's shard spec says whether its replication was declared (dims that
name an active axis ``replicated``) or assumed (no dims): copies that differ fail their pair in the first
case, and are a note in the second (a stored run keeps the flag). A tensor whose layout does not
fit (an active axis its dims do not declare, a missing rank, copies of different shapes without dims) is
kept per rank (coordinate ``rank``) and the reason listed in the manifest (``unassembled``). A name dumped
twice by one rank in one step gets an extra ``call`` coordinate (0, 1, ... in dump order). Values that are
not tensors are skipped and listed in the run manifest; the ``rids`` lists are kept there for token alignment
(validator/runs/token_align.py). A user tag named like a coordinate the reader sets becomes ``tag_<name>``.
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from probes.core.bundle import BundleError, check_tensor_name
from probes.core.config import glob_match
from probes.core.shards import Coords, Replication, ShardSpec
from validator.errors import InputError
from validator.runs.dims import LayoutError, Op, axes_of, parse_dims, plan_layout
from validator.runs.tensorfile import DTYPES, dtype_name
from validator.runs.view import RunView, TensorRef

__all__ = [
    "DEFAULT_MAX_FILE_BYTES",
    "DumpFile",
    "dump_folders",
    "find_dump_dir",
    "is_dumper_dir",
    "parse_dump_name",
    "read_dumper_dir",
]

DEFAULT_MAX_FILE_BYTES = 4 << 30
_STEP_KEYS = ("forward_pass_id", "step")
# placement and bookkeeping tags: not part of a tensor's identity (recompute_status: training recompute)
_PLACEMENT_TAGS = {
    "rank",
    "dump_index",
    "tp_rank",
    "tp_size",
    "pp_rank",
    "pp_size",
    "cp_rank",
    "ep_rank",
    "etp_rank",
    "recompute_status",
}
_SUPPORTED = set(DTYPES.values())
_COORD_NAMES = {"step", "tokens", "layer", "pp_stage", "tp_rank", "tp_size", "call", "pp"}
# a forward batch's own fields (SGLang's and Megatron's dumpers): with DP attention each DP rank's are its own
BATCH_FIELDS = frozenset(
    {
        "input_ids",
        "positions",
        "seq_lens",
        "req_pool_indices",
        "attention_mask",  # b s padding
        "position_ids",  # Megatron's
        "cu_seqlens_q",
        "cu_seqlens_kv",
    }
)


def parse_dump_name(filename: str) -> dict[str, str] | None:
    """``step=1___rank=0___dump_index=2___name=x.pt`` -> tags; ``None`` for files the dumper did not name."""
    if not filename.endswith(".pt"):
        return None
    tags: dict[str, str] = {}
    for part in filename[:-3].split("___"):
        k, sep, v = part.partition("=")
        if not sep or not k:
            return None
        tags[k] = v
    if next(iter(tags), None) not in _STEP_KEYS or "name" not in tags or "rank" not in tags:
        return None
    return tags


def _dump_files(d: Path) -> list[Path]:
    try:
        return sorted(p for p in d.iterdir() if p.is_file() and parse_dump_name(p.name) is not None)
    except OSError:
        return []


def is_dumper_dir(path: str | os.PathLike[str]) -> bool:
    """A folder of dumper files, or a folder holding exactly one such folder."""
    try:
        find_dump_dir(path)
    except InputError:
        return False
    return True


def dump_folders(path: str | os.PathLike[str]) -> list[Path]:
    """``path`` itself when it holds dump files, else its sub-folders that do (in name order)."""
    p = Path(path)
    if _dump_files(p):
        return [p]
    try:
        return sorted(s for s in p.iterdir() if s.is_dir() and _dump_files(s))
    except OSError:
        return []


def find_dump_dir(path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    if not p.is_dir():
        raise InputError(f"{p}: not a directory")
    subs = dump_folders(p)
    if subs == [p]:
        return p
    if len(subs) == 1:
        return subs[0]
    if subs:
        names = ", ".join(s.name for s in subs[:10])
        raise InputError(
            f"{p}: holds {len(subs)} SGLang dump folders ({names}); name one of them, or compare with "
            "--align-tokens, which reads them as one run (a prefill and a decode server's)"
        )
    raise InputError(
        f"{p}: no SGLang dumper files (forward_pass_id=...___name=....pt or step=...___name=....pt) here "
        "or in a sub-folder"
    )


def _safe_name(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_.:\-\[\]]", "_", name).replace("..", "_.")
    if not s or not re.match(r"[A-Za-z0-9_]", s):
        s = "_" + s
    return s[:256]


def _load(path: Path, max_bytes: int) -> Any:
    size = path.stat().st_size
    if size > max_bytes:
        raise InputError(f"{path}: {size} bytes is over the size cap of {max_bytes} bytes (raise --max-file-bytes)")
    try:
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc):
                raise
            return torch.load(path, map_location="cpu", weights_only=True)  # the legacy (non-zip) format
    except Exception as exc:  # the restricted unpickler's refusals, corrupt archives
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(
            f"{path}: refused: not loadable with torch.load(weights_only=True) ({type(exc).__name__}: {first[:300]})"
        ) from None


def _value(path: Path, key: str | None, max_bytes: int) -> torch.Tensor:
    obj = _load(path, max_bytes)
    v = obj.get("value") if isinstance(obj, dict) else None
    if key is not None:
        v = v.get(key) if isinstance(v, dict) else None
    if not isinstance(v, torch.Tensor):
        raise InputError(f"{path}: no tensor value{f' {key!r}' if key else ''} (the file changed since it was read)")
    return v.detach().contiguous()


@dataclass(frozen=True)
class DumpFile:
    """One tensor of one dump file, before shard specs are assigned."""

    path: Path
    key: str | None  # the key inside a dict value, or None for a tensor value
    name: str
    tags: Mapping[str, str]
    meta: Mapping[str, Any]
    dtype: torch.dtype
    shape: tuple[int, ...]

    def rank(self) -> int:
        return int(self.tags["rank"])

    def parallel(self, key: str) -> int | None:
        info = self.meta.get("sglang_parallel_info")
        if isinstance(info, Mapping) and not info.get("distributed_error") and isinstance(info.get(key), int):
            return int(info[key])
        raw = self.tags.get(key)
        return int(raw) if raw is not None and raw.lstrip("-").isdigit() else None


def _int_tag(tags: Mapping[str, str], key: str, path: Path) -> int | None:
    raw = tags.get(key)
    if raw is None or raw == "None":
        return None
    try:
        return int(raw)
    except ValueError:
        raise InputError(f"{path}: tag {key}={raw!r} is not an integer") from None


def read_dumper_dir(
    path: str | os.PathLike[str],
    *,
    split: Mapping[str, int] | None = None,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    name: str | None = None,
) -> RunView:
    """A :class:`RunView` of an SGLang dump folder (see the module docstring)."""
    root = find_dump_dir(path)
    files = _dump_files(root)
    generation = parse_dump_name(files[0].name)
    gen_key = next(iter(generation or {"step": ""}))
    pieces: list[DumpFile] = []
    skipped: list[str] = []
    rids: dict[str, list[str]] = {}  # per step: the batch's request ids, in batch order
    dp_rids: dict[str, dict[str, list[str]]] = {}  # with DP attention: per step and DP rank
    for f in files:
        tags = parse_dump_name(f.name)
        assert tags is not None
        if next(iter(tags)) != gen_key:
            raise InputError(f"{root}: mixes file-naming generations ({gen_key}= and {next(iter(tags))}=)")
        obj = _load(f, max_file_bytes)
        if not isinstance(obj, dict) or "value" not in obj:
            raise InputError(f"{f}: not a dumper file (expected a dict with 'value' and 'meta')")
        meta: dict[str, Any] = obj["meta"] if isinstance(obj.get("meta"), dict) else {}
        value = obj["value"]
        items = value.items() if isinstance(value, dict) else [(None, value)]
        if tags["name"] == "rids" and isinstance(value, (list, tuple)) and all(isinstance(r, str) for r in value):
            step_key, dp = tags.get("forward_pass_id") or tags.get("step", ""), _batch_dp(meta)  # token alignment
            if dp is None:
                rids.setdefault(step_key, [str(r) for r in value])
            else:
                dp_rids.setdefault(step_key, {}).setdefault(str(dp), [str(r) for r in value])
            continue
        for key, v in items:
            label = f"{f.name}" + (f"[{key}]" if key is not None else "")
            if not isinstance(v, torch.Tensor):
                skipped.append(f"{label}: {type(v).__name__} value")
                continue
            if v.dtype not in _SUPPORTED:
                skipped.append(f"{label}: dtype {dtype_name(v.dtype)} is not supported")
                continue
            tname = tags["name"] + (f".{key}" if key is not None else "")
            pieces.append(
                DumpFile(f, None if key is None else str(key), _safe_name(tname), tags, meta, v.dtype, tuple(v.shape))
            )
        del obj
    unassembled: list[str] = []
    refs = _refs(pieces, dict(split or {}), max_file_bytes, unassembled)
    dims = {p.name: p.meta["dims"] for p in pieces if isinstance(p.meta.get("dims"), str)}
    return RunView(
        name=name or root.name,
        source="sglang-dumper",
        location=str(root),
        labels={"engine": "sglang", "dumper_naming": gen_key},
        manifest={
            "sglang_dumper": {
                "folder": str(root),
                "naming": gen_key,
                "files": len(files),
                "tensors": len(refs),
                "skipped": skipped,
                "dims": dict(sorted(dims.items())),
                "unassembled": unassembled,
                "rids": rids,
                **({"dp_rids": dp_rids} if dp_rids else {}),
            }
        },
        tensors=refs,
    )


def _batch_dp(meta: Mapping[str, Any], axis: str | None = None) -> int | None:
    """The DP rank whose batch a dump holds: on ``axis``, else attention DP (SGLang) or DP (Megatron), when
    that axis is active; None without one."""
    axes = axes_of(meta)
    return next((axes[a][0] for a in ((axis,) if axis else ("attn_dp", "dp")) if a in axes), None)


def _own_batches(ps: list[DumpFile]) -> dict[int, list[DumpFile]] | None:
    """With DP attention each DP rank runs a batch of its own: a forward batch's fields (no dims) are split by
    DP rank, and so is a tensor whose dims name its DP group (``# dp:=attn_dp``) when more than one DP rank
    holds data (with one, that rank's is the tensor, as :func:`plan_layout` keeps it). None: no split."""
    texts = {p.meta.get("dims") for p in ps}
    if texts == {None} and ps[0].name in BATCH_FIELDS:
        axis, always = None, True
    elif len(texts) == 1 and isinstance(text := next(iter(texts)), str):
        try:
            alias = parse_dims(text).dp_alias
        except LayoutError:
            return None
        if alias is None:
            return None
        axis, always = alias, False
    else:
        return None
    groups: dict[int, list[DumpFile]] = defaultdict(list)
    for p in ps:
        dp = _batch_dp(p.meta, axis)
        if dp is None:
            return None
        groups[dp].append(p)
    if always:
        return dict(sorted(groups.items()))
    full = sorted(r for r, g in groups.items() if any(math.prod(p.shape) > 0 for p in g))
    return {r: groups[r] for r in full} if len(full) > 1 else None


def _refs(
    pieces: list[DumpFile], split: dict[str, int], max_file_bytes: int, unassembled: list[str] | None = None
) -> list[TensorRef]:
    # identity: name, step, layer and every other non-placement tag
    def ident(p: DumpFile) -> tuple[Any, ...]:
        extra = tuple(
            sorted(
                (k, v)
                for k, v in p.tags.items()
                if k not in _PLACEMENT_TAGS and k not in _STEP_KEYS and k not in ("name", "layer_id")
            )
        )
        return (p.name, p.tags.get("forward_pass_id", p.tags.get("step")), p.tags.get("layer_id"), extra)

    # a name dumped more than once by one rank with the same identity: number the calls in dump order (the
    # original and the recomputed forward of activation checkpointing are two copies, not two calls)
    per_rank: dict[tuple[Any, ...], list[DumpFile]] = defaultdict(list)
    for p in pieces:
        per_rank[(ident(p), p.rank(), p.tags.get("recompute_status"))].append(p)
    repeated = {k[0] for k, v in per_rank.items() if len(v) > 1}
    call: dict[int, int] = {}
    for (idn, _, _), ps in per_rank.items():
        if idn in repeated:
            for i, p in enumerate(sorted(ps, key=lambda p: int(p.tags.get("dump_index", "0")))):
                call[id(p)] = i

    groups: dict[tuple[Any, ...], list[DumpFile]] = defaultdict(list)
    for p in pieces:
        groups[(ident(p), call.get(id(p)))].append(p)
    final: dict[tuple[Any, ...], list[DumpFile]] = {}
    for (idn, k), ps in groups.items():
        stages = {p.parallel("pp_rank") for p in ps}
        if len(stages) > 1:  # the same name on several PP stages is several tensors
            for st in stages:
                final[(idn, k, st)] = [p for p in ps if p.parallel("pp_rank") == st]
        else:
            final[(idn, k, None)] = ps
    by_dp: dict[tuple[Any, ...], list[DumpFile]] = {}
    for key, ps in final.items():  # DP attention: each DP rank's own batch is a tensor of its own (coordinate dp=)
        own = _own_batches(ps)
        by_dp.update({(*key, None): ps} if own is None else {(*key, dp): g for dp, g in own.items()})
    # a user tag named like a coordinate the reader sets is renamed tag_<name> (``dp`` only where DP batches are)
    taken = _COORD_NAMES | {"dp"} if any(key[-1] is not None for key in by_dp) else _COORD_NAMES
    lengths = _step_lengths(pieces, max_file_bytes)
    refs: list[TensorRef] = []
    for (idn, k, stage, dp), ps in by_dp.items():
        ps.sort(key=lambda p: (p.parallel("tp_rank") if p.parallel("tp_rank") is not None else p.rank(), p.rank()))
        dim = next((d for pat, d in split.items() if glob_match(pat, ps[0].name)), None)
        extra = {(f"tag_{kk}" if kk in taken else kk): vv for kk, vv in idn[3]}
        if k is not None:
            extra["call"] = str(k)
        if stage is not None:
            extra["pp"] = str(stage)
        if dp is not None:
            extra["dp"] = str(dp)
        dims_text = {p.meta.get("dims") for p in ps}
        if dim is None and dims_text != {None}:  # the dumper's dims say the layout (--split overrides)
            try:
                refs.extend(_dims_refs(ps, dims_text, extra, max_file_bytes, lengths))
                continue
            except LayoutError as exc:
                problem = str(exc)
        elif dim is None and len({p.shape for p in ps}) > 1:
            problem = f"its ranks dumped different shapes {sorted({p.shape for p in ps})} and no dims say how they fit"
        else:
            problem = None
        if problem is not None:  # not guessed: each rank's dump stays a tensor of its own (coordinate rank=)
            where = (
                f"{ps[0].name} (step {idn[1]}"
                + (f", layer {idn[2]}" if idn[2] is not None else "")
                + (f", DP rank {dp}" if dp is not None else "")
                + ")"
            )
            if unassembled is None:
                raise InputError(f"{ps[0].path.parent}: tensor {where}: {problem}")
            unassembled.append(f"{where}: {problem}; kept per rank")
            refs.extend(
                _ref([p], ShardSpec.full(), {**extra, "rank": str(p.rank())}, max_file_bytes, placed=True) for p in ps
            )
            continue
        for i, p in enumerate(ps):
            if len(ps) == 1:
                shard = ShardSpec.full()
            elif dim is not None:
                shard = ShardSpec.split(dim, i, len(ps))
            else:  # copies, as nothing says otherwise: assumed, not declared
                shard = ShardSpec.replicated(i, len(ps), replication="assumed")
            refs.append(_ref([p], shard, extra, max_file_bytes, placed=True))
    return refs


def _ref(
    ps: list[DumpFile],
    shard: ShardSpec,
    extra: Mapping[str, str],
    max_file_bytes: int,
    *,
    placed: bool,
    ops: tuple[Op, ...] = (),
    coords: tuple[Mapping[str, int], ...] = (),
) -> TensorRef:
    """A record of one dump file (``placed``: with its rank's placement), or of several ranks' files that
    ``ops`` combine on load."""
    p = ps[0]
    try:
        check_tensor_name(p.name)
        c = Coords.make(
            step=_int_tag(p.tags, "forward_pass_id" if "forward_pass_id" in p.tags else "step", p.path),
            layer=_int_tag(p.tags, "layer_id", p.path),
            pp_stage=p.parallel("pp_rank"),
            tp_rank=p.parallel("tp_rank") if placed else None,
            tp_size=p.parallel("tp_size") if placed else None,
            **extra,
        )
    except BundleError as exc:
        raise InputError(f"{p.path}: {exc}") from None
    shape = p.shape
    if len(ps) == 1:
        origin = f"{p.path}" + (f"[{p.key}]" if p.key else "")
        loader: Any = functools.partial(_value, p.path, p.key, max_file_bytes)
    else:
        shape = _combined_shape([q.shape for q in ps], ops, coords)
        ranks = ", ".join(
            f"{q.rank()} ({', '.join(f'{a}={r}' for a, r in sorted(cs.items()))})" for q, cs in zip(ps, coords)
        )
        origin = f"{p.path.parent}/{p.name}" + (f"[{p.key}]" if p.key else "") + f" of ranks {ranks}"
        loader = functools.partial(_combined, tuple((q.path, q.key) for q in ps), ops, coords, p.dtype, max_file_bytes)
    nbytes = int(torch.Size(shape).numel()) * torch.empty((), dtype=p.dtype).element_size()
    return TensorRef(
        name=p.name,
        coords=c,
        shard=shard,
        dtype=dtype_name(p.dtype),
        shape=shape,
        sha256=None,
        nbytes=nbytes,
        origin=origin,
        loader=loader,
    )


def _step_lengths(
    pieces: list[DumpFile], max_file_bytes: int
) -> Callable[[list[DumpFile]], tuple[list[int] | None, str]]:
    """The lengths of the sequences packed in a step's token dimension, as its ranks dumped them: ``seq_lens``
    (SGLang), else the differences of ``cu_seqlens_q`` (Megatron); read on first use, for the ranks of one
    tensor's pieces. ``(None, "")`` when those ranks dumped neither in that step; a :class:`LayoutError` when
    their dumps disagree."""
    by_step: dict[Any, list[DumpFile]] = defaultdict(list)
    for q in pieces:
        if q.name in ("seq_lens", "cu_seqlens_q") and len(q.shape) == 1:
            by_step[q.tags.get("forward_pass_id", q.tags.get("step"))].append(q)

    read: dict[tuple[Path, str | None], tuple[int, ...]] = {}  # each file read once, however many tensors ask

    def value(q: DumpFile) -> tuple[int, ...]:
        if (q.path, q.key) not in read:
            read[(q.path, q.key)] = tuple(int(x) for x in _value(q.path, q.key, max_file_bytes).tolist())
        return read[(q.path, q.key)]

    def lengths(ps: list[DumpFile]) -> tuple[list[int] | None, str]:
        # the ranks holding tokens (with data parallelism, those of the DP rank that ran the batch)
        ranks = {p.rank() for p in ps if math.prod(p.shape) > 0} or {p.rank() for p in ps}
        step = ps[0].tags.get("forward_pass_id", ps[0].tags.get("step"))
        for field in ("seq_lens", "cu_seqlens_q"):
            found = [q for q in by_step.get(step, []) if q.name == field and q.rank() in ranks]
            if not found:
                continue
            seen = {value(q) for q in found}
            if len(seen) > 1:
                raise LayoutError(
                    f"zigzag order on dimension 't': its ranks dumped different {field} in this step "
                    f"({', '.join(str(list(v)[:8]) for v in sorted(seen))})"
                )
            vals = list(next(iter(seen)))
            if field == "cu_seqlens_q":
                vals = [b - a for a, b in zip(vals, vals[1:])]
            return vals, f"{field} of step {step}"
        return None, ""

    return lengths


def _dims_refs(
    ps: list[DumpFile],
    dims_text: set[Any],
    extra: Mapping[str, str],
    max_file_bytes: int,
    lengths: Callable[[list[DumpFile]], tuple[list[int] | None, str]] | None = None,
) -> list[TensorRef]:
    """The records of one tensor whose dumps carry ``dims`` (validator/runs/dims.py); ``lengths``: the packed
    sequences' lengths of its step, for zigzag on a token dimension."""
    if len(dims_text) > 1 or not all(isinstance(t, str) for t in dims_text):
        raise LayoutError(f"its ranks dumped it with different dims {sorted(map(repr, dims_text))}")
    dims = parse_dims(str(next(iter(dims_text))))
    for p in ps[1:]:
        if p.dtype != ps[0].dtype:
            raise LayoutError(
                f"rank {p.rank()} dumped it as {dtype_name(p.dtype)}, rank {ps[0].rank()} as {dtype_name(ps[0].dtype)}"
            )
    packed = any(m.zigzag for n, ms in zip(dims.names, dims.modifiers) if n == "t" for m in ms)
    seq_lens, lens_from = lengths(ps) if packed and lengths is not None else (None, "")
    lay = plan_layout(
        dims, [axes_of(p.meta) for p in ps], [p.shape for p in ps], [p.rank() for p in ps], seq_lens, lens_from
    )
    kept = [ps[i] for i in lay.kept]
    coords = [lay.coords[i] for i in lay.kept]
    if len(kept) == 1:
        return [_ref(kept, ShardSpec.full(), extra, max_file_bytes, placed=False)]
    rep_sizes = [lay.sizes[a] for a in lay.replicated]
    replicas = math.prod(rep_sizes)
    # the dims name an active axis replicated (a recompute's copy alone, the dumper's own axis, is assumed)
    replication: Replication = "declared" if dims.replicated & set(lay.replicated) else "assumed"

    def rep_index(c: Mapping[str, int]) -> int:
        i = 0
        for a, n in zip(lay.replicated, rep_sizes):
            i = i * n + c[a]
        return i

    if lay.primary is None and not lay.replicated and len(lay.ops) == 1 and lay.ops[0].partial:
        ax = lay.ops[0].axis  # one axis of addends: reassembly sums them in float64
        return [
            _ref([p], ShardSpec.partial(c[ax], lay.sizes[ax]), extra, max_file_bytes, placed=False)
            for p, c in zip(kept, coords)
        ]
    groups: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, c in enumerate(coords):
        groups[(c[lay.primary.axis] if lay.primary else 0, rep_index(c))].append(i)
    out = []
    for (slot, rep), members in sorted(groups.items()):
        if lay.primary is not None:
            shard = ShardSpec.split(
                lay.primary.dim,
                slot,
                lay.sizes[lay.primary.axis],
                replica=rep,
                replicas=replicas,
                replication=replication if replicas > 1 else None,
            )
        elif replicas > 1:
            shard = ShardSpec.replicated(rep, replicas, replication=replication)
        else:
            shard = ShardSpec.full()
        out.append(
            _ref(
                [kept[i] for i in members],
                shard,
                extra,
                max_file_bytes,
                placed=False,
                ops=lay.ops,
                coords=tuple(coords[i] for i in members),
            )
        )
    return out


def _apply_ops(items: list[tuple[Mapping[str, int], Any]], ops: tuple[Op, ...], cat: Any, add: Any) -> Any:
    """Fold ``items`` (coordinates, value) through ``ops``: per op, the items that differ only on its axis
    become one, in rank order, by ``cat(values, op)`` or ``add(values)``."""
    for op in ops:
        buckets: dict[tuple[tuple[str, int], ...], list[tuple[int, Any]]] = defaultdict(list)
        for c, v in items:
            buckets[tuple(sorted((a, r) for a, r in c.items() if a != op.axis))].append((c.get(op.axis, 0), v))
        items = []
        for key, vs in sorted(buckets.items()):
            vals = [v for _, v in sorted(vs, key=lambda x: x[0])]
            items.append((dict(key), add(vals) if op.partial else cat(vals, op)))
    if len(items) != 1:
        raise InputError(f"{len(items)} pieces left after unsharding: the dims do not describe these ranks")
    return items[0][1]


def _combined_shape(
    shapes: list[tuple[int, ...]], ops: tuple[Op, ...], coords: tuple[Mapping[str, int], ...]
) -> tuple[int, ...]:
    def cat(vals: list[tuple[int, ...]], op: Op) -> tuple[int, ...]:
        return tuple(sum(v[op.dim] for v in vals) if j == op.dim else n for j, n in enumerate(vals[0]))

    return tuple(_apply_ops(list(zip(coords, shapes)), ops, cat, lambda vals: vals[0]))


def _combined(
    files: tuple[tuple[Path, str | None], ...],
    ops: tuple[Op, ...],
    coords: tuple[Mapping[str, int], ...],
    dtype: torch.dtype,
    max_file_bytes: int,
) -> torch.Tensor:
    """Several ranks' dumps of one tensor combined by ``ops``: concatenated in rank order (zigzag halves put
    back in sequence order, per packed sequence on a token dimension), addends summed in float64 and rounded
    once to the dumped dtype."""

    def unzigzag(vals: list[torch.Tensor], dim: int) -> torch.Tensor:
        n = len(vals)
        halves = [h for v in vals for h in v.chunk(2, dim=dim)]  # rank r holds chunks r and 2n-1-r
        return torch.cat([halves[2 * c] if c < n else halves[2 * (2 * n - 1 - c) + 1] for c in range(2 * n)], dim=dim)

    def cat(vals: list[torch.Tensor], op: Op) -> torch.Tensor:
        if not op.zigzag:
            return torch.cat(vals, dim=op.dim)
        if op.seq_lens is None:
            return unzigzag(vals, op.dim)
        n = len(vals)  # each rank holds L / n tokens of every sequence of length L, one sequence after another
        parts = [v.split_with_sizes([x // n for x in op.seq_lens], dim=op.dim) for v in vals]
        return torch.cat([unzigzag([p[j] for p in parts], op.dim) for j in range(len(op.seq_lens))], dim=op.dim)

    def add(vals: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack([v.to(torch.float64) for v in vals]).sum(dim=0)

    values = [_value(p, k, max_file_bytes) for p, k in files]
    out: torch.Tensor = _apply_ops(list(zip(coords, values)), ops, cat, add)
    return out.to(dtype).contiguous()
