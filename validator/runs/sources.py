"""Opening the things a user can name as a run: a bundle directory, a ``.safetensors`` file, or a directory
of plain safetensors files. Each becomes a :class:`RunView`, the one shape the comparison works on
(the store produces the same shape for stored runs).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from probes.core.bundle import BUNDLE_FORMAT, BUNDLE_VERSION, MANIFEST, PART_FILE, BundleError, check_tensor_name
from probes.core.shards import Coords, ShardSpec, ShardSpecError
from validator.errors import InputError
from validator.runs.tensorfile import SafetensorsFile, check_dtype
from validator.runs.view import RunView, TensorRef

if TYPE_CHECKING:
    pass

__all__ = ["TensorRef", "RunView", "open_path", "read_bundle", "read_safetensors_dir", "read_safetensors_file"]


def open_path(path: str | Path) -> RunView:
    """A bundle directory, a ``.safetensors`` file or a directory of them, or an SGLang dumper folder."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such file or directory")
    if p.is_file():
        if p.suffix == ".jsonl":
            return RunView(name=p.stem, source="jsonl", location=str(p), acceptance_files=[p])
        if p.suffix != ".safetensors":
            raise InputError(f"{p}: expected a bundle directory, a .safetensors file or an acceptance .jsonl file")
        return read_safetensors_file(p)
    if (p / MANIFEST).exists():
        return read_bundle(p)
    if not any(p.glob("*.safetensors")):
        from validator.runs.dumper import (  # SGLang dumper output (validator/runs/dumper.py)
            dump_folders,
            find_dump_dir,
            read_dumper_dir,
        )

        if dump_folders(p):
            return read_dumper_dir(find_dump_dir(p))  # several folders: the error names them
    return read_safetensors_dir(p)


# Limits on what a bundle's JSON may hold (docs/reliability.md): a manifest is read whole and kept in the
# store, so it is capped in size; no document may nest deeper than the API and the dashboard can render.
MAX_MANIFEST_BYTES = 4 << 20
MAX_JSON_DEPTH = 64


def _load_json(path: Path, *, max_bytes: int | None = None) -> Any:
    try:
        if max_bytes is not None and (size := path.stat().st_size) > max_bytes:
            raise InputError(f"{path.name}: {size:,} bytes, more than the {max_bytes:,} a manifest may hold")
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except (ValueError, RecursionError) as exc:
        raise InputError(f"{path}: not valid JSON ({exc})") from None
    if _depth(doc) > MAX_JSON_DEPTH:
        raise InputError(f"{path.name}: JSON nested deeper than the {MAX_JSON_DEPTH} levels accepted")
    return doc


def _depth(doc: Any) -> int:
    """How deep arrays and objects nest in ``doc`` (a scalar is 0), without recursion."""
    deepest, todo = 0, [(doc, 1)]
    while todo:
        node, level = todo.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        if level <= MAX_JSON_DEPTH:  # deeper than the limit is refused anyway: stop counting
            todo.extend((c, level + 1) for c in children)
    return deepest


def read_bundle(root: Path) -> RunView:
    """Read and validate a bundle (all parts merged). Nothing is loaded but headers and records."""
    mpath = root / MANIFEST
    manifest = _load_json(mpath, max_bytes=MAX_MANIFEST_BYTES)
    if not isinstance(manifest, dict) or manifest.get("format") != BUNDLE_FORMAT:
        raise InputError(f"{mpath}: not a validator bundle manifest (format must be {BUNDLE_FORMAT!r})")
    if manifest.get("version") != BUNDLE_VERSION:
        raise InputError(f"{mpath}: unsupported bundle version {manifest.get('version')!r} (this reads {BUNDLE_VERSION})")
    run = manifest.get("run")
    if not isinstance(run, dict) or not isinstance(run.get("name"), str) or not run["name"]:
        raise InputError(f"{mpath}: manifest needs run.name")
    labels = run.get("labels") or {}
    if not isinstance(labels, dict):
        raise InputError(f"{mpath}: run.labels must be an object")
    view = RunView(
        name=run["name"],
        source="bundle",
        location=str(root),
        labels={str(k): str(v) for k, v in labels.items()},
        manifest=manifest,
    )
    parts_dir = root / "parts"
    parts = sorted(p for p in parts_dir.iterdir() if p.is_dir()) if parts_dir.is_dir() else []
    for part in parts:
        ppath = part / PART_FILE
        acc = part / "acceptance.jsonl"
        if acc.exists():
            view.acceptance_files.append(acc)  # written whole and renamed into place: complete by itself
        lp = part / "logprobs.jsonl"
        if lp.exists():
            view.logprob_files.append(lp)  # RL logprob records (docs/rl.md)
        if (part / "metrics.json").exists():
            if view.engine_metrics_file is not None:
                raise InputError(f"{part}: a second metrics.json in one bundle ({view.engine_metrics_file})")
            view.engine_metrics_file = part / "metrics.json"
        if (part / "gsm8k.jsonl").exists():
            if view.gsm8k_file is not None:
                raise InputError(f"{part}: a second gsm8k.jsonl in one bundle ({view.gsm8k_file})")
            view.gsm8k_file = part / "gsm8k.jsonl"
        if not ppath.exists():
            if (acc.exists() or lp.exists()) and not any(part.glob("*.safetensors")):
                continue  # a part holding only acceptance or logprob records
            raise InputError(f"{part}: incomplete part (no {PART_FILE}; the writer did not close it)")
        doc = _load_json(ppath)
        recs = doc.get("tensors") if isinstance(doc, dict) else None
        if not isinstance(recs, list):
            raise InputError(f"{ppath}: 'tensors' must be a list of records")
        files: dict[str, SafetensorsFile] = {}
        for i, rec in enumerate(recs):
            view.tensors.append(_record_ref(part, ppath, i, rec, files))
    _check_capture_coverage(root, view)
    return view


def _check_capture_coverage(root: Path, view: RunView) -> None:
    """Bundles written by the SGLang plugin: every capture layer must have been seen on some PP stage
    (the "aux hidden states captured only on the last PP rank" bug). The result goes in the manifest,
    where compare turns problems into a failing reason."""
    from probes.engines.sglang.coverage import check_coverage, read_reports

    try:
        reports = read_reports(root)
    except (OSError, ValueError) as exc:
        raise InputError(f"{root}: unreadable probe report in a part.json ({exc})") from None
    if reports:
        cov = check_coverage(reports)
        view.manifest = {
            **view.manifest,
            "coverage": {"ok": cov.ok, "capture_layers": list(cov.capture_layers), "problems": list(cov.problems)},
        }


def _record_ref(part: Path, ppath: Path, i: int, rec: Any, files: dict[str, SafetensorsFile]) -> TensorRef:
    where = f"{ppath} record {i}"
    if not isinstance(rec, dict):
        raise InputError(f"{where}: not an object")
    missing = [k for k in ("name", "key", "file", "dtype", "shape", "sha256") if k not in rec]
    if missing:
        raise InputError(f"{where}: missing {', '.join(missing)}")
    try:
        name = check_tensor_name(rec["name"])
        coords = Coords.from_dict(rec.get("coords"))
        shard = ShardSpec.from_dict(rec.get("shard"))
    except (BundleError, ShardSpecError) as exc:
        raise InputError(f"{where}: {exc}") from None
    fname = rec["file"]
    if not isinstance(fname, str) or "/" in fname or "\\" in fname or fname.startswith(".") or not fname.endswith(".safetensors"):
        raise InputError(f"{where}: tensor {name!r}: bad file name {fname!r}")
    if fname not in files:
        files[fname] = SafetensorsFile(part / fname)
    sf = files[fname]
    key = rec["key"]
    entry = sf.entries.get(key) if isinstance(key, str) else None
    if entry is None:
        raise InputError(f"{sf.path}: tensor {name!r} (key {key!r}) is not in the file")
    dtype = check_dtype(str(rec["dtype"]), where=f"{where}: tensor {name!r}: ")
    shape = tuple(rec["shape"]) if isinstance(rec["shape"], list) else None
    if entry.dtype_name != dtype or entry.shape != shape:
        raise InputError(
            f"{sf.path}: tensor {name!r} is {entry.dtype_name}{list(entry.shape)} in the file "
            f"but {rec['dtype']}{rec['shape']} in {PART_FILE}"
        )
    return TensorRef(
        name=name,
        coords=coords,
        shard=shard,
        dtype=dtype,
        shape=entry.shape,
        sha256=str(rec["sha256"]),
        nbytes=entry.nbytes,
        origin=f"{sf.path}[{key}]",
        loader=functools.partial(sf.load, key),
        location=(sf.path, entry.begin),
    )


def _plain_refs(path: Path, seen: dict[str, str]) -> list[TensorRef]:
    sf = SafetensorsFile(path)
    refs = []
    for key, e in sf.entries.items():
        try:
            check_tensor_name(key)
        except BundleError as exc:
            raise InputError(f"{path}: {exc}") from None
        if key in seen:
            raise InputError(f"{path}: tensor {key!r} also appears in {seen[key]}")
        seen[key] = str(path)
        refs.append(
            TensorRef(
                name=key,
                coords=Coords(),
                shard=ShardSpec.full(),
                dtype=e.dtype_name,
                shape=e.shape,
                sha256=None,
                nbytes=e.nbytes,
                origin=f"{path}[{key}]",
                loader=functools.partial(sf.load, key),
                location=(sf.path, e.begin),
            )
        )
    return refs


def read_safetensors_file(path: Path) -> RunView:
    """A plain safetensors file: each key is one tensor (paired with the other side by key)."""
    return RunView(name=path.stem, source="safetensors", location=str(path), tensors=_plain_refs(path, {}))


def read_safetensors_dir(path: Path) -> RunView:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise InputError(f"{path}: neither a bundle (no {MANIFEST}) nor a directory of .safetensors files")
    seen: dict[str, str] = {}
    refs = [r for f in files for r in _plain_refs(f, seen)]
    return RunView(name=path.name, source="safetensors", location=str(path), tensors=refs)
