"""Acceptance records: the canonical per-verify-step schema, JSONL loading, Parquet storage, validation.

One record = one verify step of one request (the schema is documented in docs/metrics.md, "Acceptance metrics").
The probe ``probes.core.acceptance.AcceptanceRecorder`` writes the same schema as JSON lines into a run bundle
(``BUNDLE/parts/<part>/acceptance.jsonl``). Loaded records become a pandas DataFrame with one row per step
and the columns of :data:`COLUMNS`; per-position logprobs are split into ``*_logprob`` (the float form),
``*_top_ids`` and ``*_top_logprobs`` (the top-k form) so that the frame stores losslessly in Parquet.

Bad input raises :class:`AcceptanceInputError` naming the file, the line (or Parquet row) and the field.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from validator.errors import InputError
from validator.runs.jsonlines import json_lines

__all__ = [
    "ACCEPTANCE_FILE",
    "COLUMNS",
    "PARQUET_SCHEMA",
    "AcceptanceInputError",
    "check_frame",
    "empty_frame",
    "frame_to_records",
    "normalize_record",
    "read_acceptance_bundle",
    "read_acceptance_jsonl",
    "read_acceptance_parquet",
    "records_to_frame",
    "write_acceptance_jsonl",
    "write_acceptance_parquet",
]

ACCEPTANCE_FILE = "acceptance.jsonl"
SCHEMA_VERSION = 1
_MAX_INT = 2**63 - 1
_LOGPROB_TOL = 1e-3  # logprobs a little above 0 (rounding) are accepted

RECORD_KEYS = frozenset(
    {
        "request_id",
        "step",
        "proposed",
        "accepted",
        "bonus",
        "draft_logprobs",
        "target_tokens",
        "target_logprobs",
        "prompt_hash",
        "output_tokens",
    }
)

_INT_LIST = pa.list_(pa.int64())
_FLOAT_LIST = pa.list_(pa.float64())
PARQUET_SCHEMA = pa.schema(
    [
        pa.field("request_id", pa.string(), nullable=False),
        pa.field("step", pa.int64(), nullable=False),
        pa.field("prompt_hash", pa.string()),
        pa.field("proposed", _INT_LIST, nullable=False),
        pa.field("num_proposed", pa.int64(), nullable=False),
        pa.field("accepted", pa.int64(), nullable=False),
        pa.field("bonus", pa.bool_(), nullable=False),
        pa.field("output_tokens", _INT_LIST),
        pa.field("target_tokens", _INT_LIST),
        pa.field("draft_logprob", _FLOAT_LIST),
        pa.field("draft_top_ids", pa.list_(_INT_LIST)),
        pa.field("draft_top_logprobs", pa.list_(_FLOAT_LIST)),
        pa.field("target_logprob", _FLOAT_LIST),
        pa.field("target_top_ids", pa.list_(_INT_LIST)),
        pa.field("target_top_logprobs", pa.list_(_FLOAT_LIST)),
    ],
    metadata={b"validator.runs.acceptance_records.version": str(SCHEMA_VERSION).encode()},
)
COLUMNS: tuple[str, ...] = tuple(PARQUET_SCHEMA.names)
_INT_COLUMNS = ("step", "num_proposed", "accepted")


class AcceptanceInputError(InputError, ValueError):
    """Acceptance records that cannot be read: the message names the file, line (or row) and field."""


# -- one record ---------------------------------------------------------------------------------------


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int_list(where: str, key: str, v: Any, *, nonneg: bool = True) -> list[int]:
    if not isinstance(v, list):
        raise AcceptanceInputError(f"{where}: {key!r} must be a list of ints, got {type(v).__name__}")
    for i, x in enumerate(v):
        if not _is_int(x) or not (0 if nonneg else -_MAX_INT) <= x <= _MAX_INT:
            raise AcceptanceInputError(
                f"{where}: {key!r}[{i}] must be a{' non-negative' if nonneg else 'n'} int, got {x!r}"
            )
    return v


def _logprob(where: str, key: str, v: Any) -> float:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise AcceptanceInputError(f"{where}: {key} must be a number (a logprob), got {v!r}")
    try:
        f = float(v)
    except OverflowError:  # an integer too large for a float
        raise AcceptanceInputError(f"{where}: {key} must be a logprob (<= 0, not NaN), got {v!r:.40}") from None
    if math.isnan(f) or f > _LOGPROB_TOL:
        raise AcceptanceInputError(f"{where}: {key} must be a logprob (<= 0, not NaN), got {v!r}")
    return f


def _split_logprobs(where: str, key: str, v: Any, lengths: tuple[int, ...]) -> tuple[Any, Any, Any]:
    """``[float | None | {top_ids, top_logprobs[, logprob]}]`` -> (logprob list, top_ids, top_logprobs)."""
    if not isinstance(v, list):
        raise AcceptanceInputError(
            f"{where}: {key!r} must be a list (one entry per position), got {type(v).__name__}"
        )
    if len(v) not in lengths:
        want = " or ".join(str(n) for n in lengths)
        raise AcceptanceInputError(f"{where}: {key!r} has {len(v)} entries, expected {want}")
    lps: list[float | None] = []
    ids: list[list[int] | None] = []
    tops: list[list[float] | None] = []
    for i, item in enumerate(v):
        at = f"{key!r}[{i}]"
        if item is None:
            lps.append(None)
            ids.append(None)
            tops.append(None)
        elif isinstance(item, dict):
            for need in ("top_ids", "top_logprobs"):
                if need not in item:
                    raise AcceptanceInputError(f"{where}: {at} is an object without {need!r}")
            t_ids = _int_list(where, f"{key}[{i}].top_ids", item["top_ids"])
            t_lp = item["top_logprobs"]
            if not isinstance(t_lp, list) or len(t_lp) != len(t_ids) or not t_ids:
                raise AcceptanceInputError(
                    f"{where}: {at}: 'top_logprobs' must be a list as long as 'top_ids' (at least 1 entry)"
                )
            if len(set(t_ids)) != len(t_ids):
                raise AcceptanceInputError(f"{where}: {at}: 'top_ids' has repeated token ids")
            tops.append([_logprob(where, f"{at}.top_logprobs[{j}]", x) for j, x in enumerate(t_lp)])
            ids.append(list(t_ids))
            lp = item.get("logprob")
            lps.append(None if lp is None else _logprob(where, f"{at}.logprob", lp))
        else:
            lps.append(_logprob(where, at, item))
            ids.append(None)
            tops.append(None)
    has_top = any(x is not None for x in ids)
    return lps, (ids if has_top else None), (tops if has_top else None)


def normalize_record(obj: Any, *, where: str = "record", strict: bool = False) -> dict[str, Any]:
    """Check one record (a parsed JSON object) and return it as a row of :data:`COLUMNS`.

    ``where`` prefixes error messages (e.g. ``"steps.jsonl line 17"``). Unknown keys are ignored unless
    ``strict``.
    """
    if not isinstance(obj, dict):
        raise AcceptanceInputError(f"{where}: a record must be a JSON object, got {type(obj).__name__}")
    for key in ("request_id", "step", "proposed", "accepted"):
        if key not in obj:
            raise AcceptanceInputError(f"{where}: missing required key {key!r}")
    if strict and not RECORD_KEYS.issuperset(obj):
        extra = sorted(set(obj) - RECORD_KEYS)
        raise AcceptanceInputError(f"{where}: unknown keys {extra} (allowed: {sorted(RECORD_KEYS)})")
    rid = obj["request_id"]
    if not isinstance(rid, str) or not rid:
        raise AcceptanceInputError(f"{where}: 'request_id' must be a non-empty string, got {rid!r}")
    step = obj["step"]
    if not _is_int(step) or not 0 <= step <= _MAX_INT:
        raise AcceptanceInputError(f"{where}: 'step' must be an int >= 0, got {step!r}")
    proposed = _int_list(where, "proposed", obj["proposed"])
    n = len(proposed)
    acc = obj["accepted"]
    if not _is_int(acc) or not 0 <= acc <= n:
        raise AcceptanceInputError(
            f"{where}: 'accepted' must be an int between 0 and len(proposed)={n}, got {acc!r}"
        )
    bonus = obj.get("bonus", True)
    if bonus is None:
        bonus = True
    if not isinstance(bonus, bool):
        raise AcceptanceInputError(f"{where}: 'bonus' must be true or false, got {bonus!r}")
    ph = obj.get("prompt_hash")
    if ph is not None and (not isinstance(ph, str) or not ph):
        raise AcceptanceInputError(f"{where}: 'prompt_hash' must be a non-empty string, got {ph!r}")
    out_tokens = obj.get("output_tokens")
    if out_tokens is not None:
        _int_list(where, "output_tokens", out_tokens)
        if len(out_tokens) > acc + bonus:
            raise AcceptanceInputError(
                f"{where}: 'output_tokens' has {len(out_tokens)} entries, more than accepted + bonus = {acc + bonus}"
            )
    target_lengths: tuple[int, ...] = (n, n + 1)
    target_tokens = obj.get("target_tokens")
    if target_tokens is not None:
        _int_list(where, "target_tokens", target_tokens)
        if len(target_tokens) not in target_lengths:
            raise AcceptanceInputError(
                f"{where}: 'target_tokens' has {len(target_tokens)} entries, expected {n} or {n + 1} (len(proposed)[+1])"
            )
        target_lengths = (len(target_tokens),)
    row: dict[str, Any] = {
        "request_id": rid,
        "step": step,
        "prompt_hash": ph,
        "proposed": list(proposed),
        "num_proposed": n,
        "accepted": acc,
        "bonus": bonus,
        "output_tokens": None if out_tokens is None else list(out_tokens),
        "target_tokens": None if target_tokens is None else list(target_tokens),
    }
    for src, prefix, lengths in (
        ("draft_logprobs", "draft", (n,)),
        ("target_logprobs", "target", target_lengths),
    ):
        v = obj.get(src)
        lp, ids, tops = (None, None, None) if v is None else _split_logprobs(where, src, v, lengths)
        row[f"{prefix}_logprob"], row[f"{prefix}_top_ids"], row[f"{prefix}_top_logprobs"] = lp, ids, tops
    return row


def _join_logprobs(lp: Any, ids: Any, tops: Any) -> list[Any] | None:
    if lp is None and ids is None:
        return None
    n = len(lp) if lp is not None else len(ids)
    out: list[Any] = []
    for i in range(n):
        f = None if lp is None else lp[i]
        if ids is not None and ids[i] is not None:
            obj: dict[str, Any] = {"top_ids": list(ids[i]), "top_logprobs": list(tops[i])}
            if f is not None:
                obj["logprob"] = f
            out.append(obj)
        else:
            out.append(f)
    return out


def frame_to_records(df: pd.DataFrame) -> Iterator[dict[str, Any]]:
    """The inverse of :func:`records_to_frame`: records in the JSONL schema (optional keys only when set)."""
    for row in df.itertuples(index=False):
        r = row._asdict()
        rec: dict[str, Any] = {
            "request_id": r["request_id"],
            "step": int(r["step"]),
            "proposed": [int(x) for x in r["proposed"]],
            "accepted": int(r["accepted"]),
        }
        if not r["bonus"]:
            rec["bonus"] = False
        if r["prompt_hash"] is not None:
            rec["prompt_hash"] = r["prompt_hash"]
        for key in ("output_tokens", "target_tokens"):
            if r[key] is not None:
                rec[key] = [int(x) for x in r[key]]
        for key, prefix in (("draft_logprobs", "draft"), ("target_logprobs", "target")):
            joined = _join_logprobs(
                r[f"{prefix}_logprob"], r[f"{prefix}_top_ids"], r[f"{prefix}_top_logprobs"]
            )
            if joined is not None:
                rec[key] = joined
        yield rec


# -- frames -------------------------------------------------------------------------------------------


def _frame(columns: Mapping[str, list[Any]]) -> pd.DataFrame:
    data: dict[str, pd.Series] = {}
    for name in COLUMNS:
        values = columns[name]
        if name in _INT_COLUMNS:
            data[name] = pd.Series(np.asarray(values, dtype=np.int64), dtype="int64")
        elif name == "bonus":
            data[name] = pd.Series(np.asarray(values, dtype=bool), dtype=bool)
        else:
            arr = np.empty(len(values), dtype=object)
            arr[:] = values
            data[name] = pd.Series(arr, dtype=object)
    return pd.DataFrame(data, columns=list(COLUMNS))


def empty_frame() -> pd.DataFrame:
    """A frame with the acceptance columns and no rows."""
    return _frame({c: [] for c in COLUMNS})


class _Collector:
    """Accumulates normalised rows column-wise, catching duplicate steps and prompt-hash conflicts."""

    def __init__(self, seen: dict[tuple[str, int], str] | None = None) -> None:
        self.cols: dict[str, list[Any]] = {c: [] for c in COLUMNS}
        self.seen = {} if seen is None else seen
        self.hashes: dict[str, tuple[str | None, str]] = {}

    def add(self, row: dict[str, Any], where: str) -> None:
        key = (row["request_id"], row["step"])
        first = self.seen.get(key)
        if first is not None:
            raise AcceptanceInputError(
                f"{where}: duplicate step (request_id={key[0]!r}, step={key[1]}), first seen at {first}"
            )
        self.seen[key] = where
        h = self.hashes.setdefault(row["request_id"], (row["prompt_hash"], where))
        if h[0] != row["prompt_hash"]:
            raise AcceptanceInputError(
                f"{where}: 'prompt_hash' {row['prompt_hash']!r} differs from {h[0]!r} given for request "
                f"{row['request_id']!r} at {h[1]}"
            )
        for c in COLUMNS:
            self.cols[c].append(row[c])

    def frame(self) -> pd.DataFrame:
        return _frame(self.cols)


def records_to_frame(
    records: Iterable[Any], *, source: str = "records", strict: bool = False
) -> pd.DataFrame:
    """Validate records (parsed JSON objects) into an acceptance frame; errors say ``source record N``."""
    col = _Collector()
    for i, rec in enumerate(records, start=1):
        where = f"{source} record {i}"
        col.add(normalize_record(rec, where=where, strict=strict), where)
    return col.frame()


def _read_jsonl(path: Path, col: _Collector, strict: bool) -> None:
    try:
        f = path.open("r", encoding="utf-8")
    except OSError as exc:
        raise AcceptanceInputError(f"{path}: cannot open: {exc.strerror or exc}") from None
    with f:
        for lineno, obj in json_lines(path, f, error=AcceptanceInputError):
            where = f"{path} line {lineno}"
            col.add(normalize_record(obj, where=where, strict=strict), where)


def read_acceptance_jsonl(path: str | os.PathLike[str], *, strict: bool = False) -> pd.DataFrame:
    """Load one JSONL file of acceptance records (blank lines are skipped)."""
    col = _Collector()
    try:
        _read_jsonl(Path(path), col, strict)
    except UnicodeDecodeError as exc:
        raise AcceptanceInputError(f"{path}: not UTF-8 text ({exc.reason})") from None
    return col.frame()


def read_acceptance_bundle(bundle: str | os.PathLike[str], *, strict: bool = False) -> pd.DataFrame:
    """Load and merge ``parts/*/acceptance.jsonl`` of a run bundle (parts in name order).

    A (request_id, step) recorded by two parts is an error: exactly one rank should record each step.
    """
    root = Path(bundle)
    files = sorted((root / "parts").glob(f"*/{ACCEPTANCE_FILE}"))
    if not files:
        raise AcceptanceInputError(f"{root}: no parts/*/{ACCEPTANCE_FILE} in this bundle")
    return read_acceptance_files(files, strict=strict)


def read_acceptance_files(files: Iterable[str | os.PathLike[str]], *, strict: bool = False) -> pd.DataFrame:
    """Load and merge several acceptance JSONL files; a step recorded in two of them is an error."""
    col = _Collector()
    for path in map(Path, files):
        try:
            _read_jsonl(path, col, strict)
        except UnicodeDecodeError as exc:
            raise AcceptanceInputError(f"{path}: not UTF-8 text ({exc.reason})") from None
    return col.frame()


def write_acceptance_jsonl(
    records: pd.DataFrame | Iterable[Mapping[str, Any]], path: str | os.PathLike[str]
) -> int:
    """Write records (a frame or record dicts) as JSONL, atomically. Returns the number of lines."""
    path = Path(path)
    rows: Iterable[Mapping[str, Any]] = (
        frame_to_records(records) if isinstance(records, pd.DataFrame) else records
    )
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".jsonl", dir=path.parent)
    count = 0
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for rec in rows:
                f.write(json.dumps(rec, separators=(",", ":")) + "\n")
                count += 1
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return count


# -- Parquet ------------------------------------------------------------------------------------------


def check_frame(df: pd.DataFrame, *, source: str = "frame") -> None:
    """Vectorised checks of a frame's columns and cross-row rules (for frames not built by this module)."""
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise AcceptanceInputError(f"{source}: missing columns {missing}")
    if len(df) == 0:
        return
    lengths = np.fromiter((len(p) for p in df["proposed"]), dtype=np.int64, count=len(df))
    checks = (
        (df["step"].to_numpy() < 0, "'step' must be >= 0"),
        (lengths != df["num_proposed"].to_numpy(), "'num_proposed' must equal len(proposed)"),
        (
            (df["accepted"].to_numpy() < 0) | (df["accepted"].to_numpy() > lengths),
            "'accepted' must be between 0 and len(proposed)",
        ),
        (df.duplicated(["request_id", "step"]).to_numpy(), "duplicate (request_id, step)"),
        (
            df.groupby("request_id")["prompt_hash"].transform("nunique").to_numpy() > 1,
            "request has several prompt_hash",
        ),
    )
    for bad, msg in checks:
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise AcceptanceInputError(
                f"{source} row {i + 1}: {msg} (request_id={df['request_id'].iloc[i]!r}, step={df['step'].iloc[i]})"
            )


def write_acceptance_parquet(df: pd.DataFrame, path: str | os.PathLike[str]) -> None:
    """Write an acceptance frame as columnar Parquet (schema :data:`PARQUET_SCHEMA`), atomically."""
    check_frame(df)
    path = Path(path)
    arrays = {c: df[c].tolist() for c in COLUMNS}
    table = pa.Table.from_pydict(arrays, schema=PARQUET_SCHEMA)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".parquet", dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_acceptance_parquet(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Read a frame written by :func:`write_acceptance_parquet` (checked; errors name the row)."""
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise AcceptanceInputError(f"{path}: not a readable Parquet file: {exc}") from None
    missing = [c for c in COLUMNS if c not in table.column_names]
    if missing:
        raise AcceptanceInputError(f"{path}: missing columns {missing}")
    try:
        table = table.select(list(COLUMNS)).cast(PARQUET_SCHEMA)
    except (pa.ArrowException, ValueError) as exc:
        raise AcceptanceInputError(f"{path}: columns do not match the acceptance schema: {exc}") from None
    df = _frame({c: table.column(c).to_pylist() for c in COLUMNS})
    check_frame(df, source=str(path))
    return df
