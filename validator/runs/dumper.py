"""Reading the output of SGLang's own dumper (``sglang.srt.debug_utils.dumper``) as a run.

Two file-naming generations (docs/sglang.md, section 4), both one ``torch.save`` of
``{"value": ..., "meta": {...}}`` per dump, in one folder per experiment:

- sglang 0.5.9: ``SGLANG_DUMPER_DIR/sglang_dump_<time>/forward_pass_id=3___rank=0___dump_index=7___name=x[___layer_id=5].pt``
- sglang >= 0.5.10: ``DUMPER_DIR/<exp_name>/step=3___rank=0___dump_index=7___name=x[___layer_id=5...].pt``
  (later releases may add ``tp_rank=``, ``pp_rank=``... to the name).

Files are loaded with ``torch.load(path, weights_only=True)`` only, never full unpickling; a file over the
size cap is refused before it is opened, and a file the restricted loader refuses (a pickle that calls a
function, for instance) is refused with its path. Mapping to coordinates: ``forward_pass_id`` / ``step`` ->
``step``; ``layer_id`` -> ``layer``; the meta's ``sglang_parallel_info`` (or the name's ``tp_rank`` /
``pp_rank``) -> placement; ``rank``, ``dump_index`` and ``recompute_status`` are bookkeeping; any other tag
(user keys) -> an extra coordinate, which identifies the tensor. When several ranks dump the same tensor it is ``replicated`` (copies compared)
unless a ``split`` rule names it (``{"attn_*": 1}``: TP slices along dim 1, in rank order). A name
dumped twice by one rank in one step gets an extra ``call`` coordinate (0, 1, ... in dump order).
Values that are not tensors are skipped and listed in the run manifest.
"""

from __future__ import annotations

import functools
import os
import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from probes.bundle import BundleError, check_tensor_name
from probes.config import glob_match
from probes.shards import Coords, ShardSpec
from validator.errors import InputError
from validator.runs.tensorfile import DTYPES, dtype_name
from validator.runs.view import RunView, TensorRef

__all__ = ["DEFAULT_MAX_FILE_BYTES", "DumpFile", "find_dump_dir", "is_dumper_dir", "parse_dump_name", "read_dumper_dir"]

DEFAULT_MAX_FILE_BYTES = 4 << 30
_STEP_KEYS = ("forward_pass_id", "step")
# placement and bookkeeping tags: not part of a tensor's identity (recompute_status: training recompute)
_PLACEMENT_TAGS = {"rank", "dump_index", "tp_rank", "tp_size", "pp_rank", "pp_size", "cp_rank", "ep_rank", "etp_rank",
                   "recompute_status"}
_SUPPORTED = set(DTYPES.values())
_COORD_NAMES = {"step", "tokens", "layer", "pp_stage", "tp_rank", "tp_size", "call", "pp"}


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


def find_dump_dir(path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    if not p.is_dir():
        raise InputError(f"{p}: not a directory")
    if _dump_files(p):
        return p
    subs = sorted(s for s in p.iterdir() if s.is_dir() and _dump_files(s))
    if len(subs) == 1:
        return subs[0]
    if subs:
        names = ", ".join(s.name for s in subs[:10])
        raise InputError(f"{p}: holds {len(subs)} SGLang dump folders ({names}); name one of them")
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
        for key, v in items:
            label = f"{f.name}" + (f"[{key}]" if key is not None else "")
            if not isinstance(v, torch.Tensor):
                skipped.append(f"{label}: {type(v).__name__} value")
                continue
            if v.dtype not in _SUPPORTED:
                skipped.append(f"{label}: dtype {dtype_name(v.dtype)} is not supported")
                continue
            tname = tags["name"] + (f".{key}" if key is not None else "")
            pieces.append(DumpFile(f, None if key is None else str(key), _safe_name(tname), tags, meta, v.dtype, tuple(v.shape)))
        del obj
    refs = _refs(pieces, dict(split or {}), max_file_bytes)
    return RunView(
        name=name or root.name,
        source="sglang-dumper",
        location=str(root),
        labels={"engine": "sglang", "dumper_naming": gen_key},
        manifest={"sglang_dumper": {"folder": str(root), "naming": gen_key, "files": len(files),
                                    "tensors": len(refs), "skipped": skipped}},
        tensors=refs,
    )


def _refs(pieces: list[DumpFile], split: dict[str, int], max_file_bytes: int) -> list[TensorRef]:
    # identity: name, step, layer and every other non-placement tag
    def ident(p: DumpFile) -> tuple[Any, ...]:
        extra = tuple(sorted((k, v) for k, v in p.tags.items()
                             if k not in _PLACEMENT_TAGS and k not in _STEP_KEYS and k not in ("name", "layer_id")))
        return (p.name, p.tags.get("forward_pass_id", p.tags.get("step")), p.tags.get("layer_id"), extra)

    # a name dumped more than once by one rank with the same identity: number the calls in dump order
    per_rank: dict[tuple[Any, ...], list[DumpFile]] = defaultdict(list)
    for p in pieces:
        per_rank[(ident(p), p.rank())].append(p)
    repeated = {k[0] for k, v in per_rank.items() if len(v) > 1}
    call: dict[int, int] = {}
    for (idn, _), ps in per_rank.items():
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
    refs = []
    for (idn, k, stage), ps in final.items():
        ps.sort(key=lambda p: (p.parallel("tp_rank") if p.parallel("tp_rank") is not None else p.rank(), p.rank()))
        dim = next((d for pat, d in split.items() if glob_match(pat, ps[0].name)), None)
        extra = {(f"tag_{kk}" if kk in _COORD_NAMES else kk): vv for kk, vv in idn[3]}
        if k is not None:
            extra["call"] = str(k)
        if stage is not None:
            extra["pp"] = str(stage)
        for i, p in enumerate(ps):
            if len(ps) == 1:
                shard = ShardSpec.full()
            elif dim is not None:
                shard = ShardSpec.split(dim, i, len(ps))
            else:
                shard = ShardSpec.replicated(i, len(ps))
            try:
                check_tensor_name(p.name)
                coords = Coords.make(
                    step=_int_tag(p.tags, "forward_pass_id" if "forward_pass_id" in p.tags else "step", p.path),
                    layer=_int_tag(p.tags, "layer_id", p.path),
                    pp_stage=p.parallel("pp_rank"), tp_rank=p.parallel("tp_rank"), tp_size=p.parallel("tp_size"),
                    **extra,
                )
            except BundleError as exc:
                raise InputError(f"{p.path}: {exc}") from None
            nbytes = int(torch.Size(p.shape).numel()) * torch.empty((), dtype=p.dtype).element_size()
            refs.append(TensorRef(
                name=p.name, coords=coords, shard=shard, dtype=dtype_name(p.dtype), shape=p.shape, sha256=None,
                nbytes=nbytes, origin=f"{p.path}" + (f"[{p.key}]" if p.key else ""),
                loader=functools.partial(_value, p.path, p.key, max_file_bytes),
            ))  # fmt: skip
    return refs
