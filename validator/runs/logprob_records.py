"""Logprob records: one sampled token of an RL rollout, with the rollout engine's and the trainer's logprob.

JSON lines in (one object per line, the format of docs/rl.md), numpy arrays out (:class:`LogprobRecords`),
Parquet for storage. Fields of a line:

- ``step`` (int >= 0): the rollout step;
- ``sample_id`` (string or int): the sampled sequence; unique within a step, and the bootstrap's unit;
- ``token_index`` (int >= 0): the token's position in the sample's response;
- ``rollout_logprob``, ``train_logprob`` (finite numbers <= 1e-3): natural-log probability of the sampled token
  under the rollout engine and under the trainer;
- ``weight_version`` (int >= 0, optional): the weight version the rollout engine served.

Bad input raises :class:`LogprobInputError` naming the file, the line and the field. No pickle anywhere.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from validator.errors import InputError

__all__ = [
    "LOGPROB_FIELDS",
    "LogprobInputError",
    "LogprobRecords",
    "LOGPROB_FILE",
    "read_logprob_files",
    "read_logprob_jsonl",
    "read_logprob_parquet",
    "records_from_objects",
    "write_logprob_parquet",
]

LOGPROB_FILE = "logprobs.jsonl"  # a bundle part's logprob records
LOGPROB_FIELDS = ("step", "sample_id", "token_index", "rollout_logprob", "train_logprob", "weight_version")
_REQUIRED = LOGPROB_FIELDS[:5]
_LOGPROB_TOL = 1e-3  # logprobs a little above 0 (rounding) are accepted
_MAX_INT = 2**63 - 1
NO_VERSION = -1  # weight_version absent


class LogprobInputError(InputError, ValueError):
    """Logprob records that cannot be read: the message names the file, the line and the field."""


@dataclass(frozen=True)
class LogprobRecords:
    """Validated records as parallel arrays, in input order. ``sample`` indexes ``sample_ids``;
    ``weight_version`` is -1 where a line gave none."""

    step: npt.NDArray[np.int64]
    sample: npt.NDArray[np.int64]
    sample_ids: tuple[str, ...]
    token_index: npt.NDArray[np.int64]
    rollout_logprob: npt.NDArray[np.float64]
    train_logprob: npt.NDArray[np.float64]
    weight_version: npt.NDArray[np.int64]
    source: str = "records"

    def __len__(self) -> int:
        return int(self.step.size)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check(obj: Any, where: str) -> tuple[int, str, int, float, float, int]:
    if not isinstance(obj, dict):
        raise LogprobInputError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    for key in _REQUIRED:
        if key not in obj:
            raise LogprobInputError(f"{where}: missing required field {key!r}")
    ints: dict[str, int] = {}
    for key in ("step", "token_index"):
        v = obj[key]
        if not _is_int(v) or not 0 <= v <= _MAX_INT:
            raise LogprobInputError(f"{where}: {key!r} must be an int >= 0, got {v!r:.60}")
        ints[key] = v
    sid = obj["sample_id"]
    if isinstance(sid, bool) or not isinstance(sid, (str, int)) or (isinstance(sid, str) and not sid):
        raise LogprobInputError(f"{where}: 'sample_id' must be a non-empty string or an int, got {sid!r:.60}")
    lps: list[float] = []
    for key in ("rollout_logprob", "train_logprob"):
        v = obj[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise LogprobInputError(f"{where}: {key!r} must be a number (a logprob), got {v!r:.60}")
        try:
            f = float(v)
        except OverflowError:
            f = math.inf
        if not math.isfinite(f):
            raise LogprobInputError(f"{where}: {key!r} must be finite, got {v!r:.60}")
        if f > _LOGPROB_TOL:
            raise LogprobInputError(f"{where}: {key!r} must be a logprob (<= 0), got {v!r}")
        lps.append(f)
    ver = obj.get("weight_version")
    if ver is None:
        ver = NO_VERSION
    elif not _is_int(ver) or not 0 <= ver <= _MAX_INT:
        raise LogprobInputError(f"{where}: 'weight_version' must be an int >= 0 or absent, got {ver!r:.60}")
    return ints["step"], str(sid), ints["token_index"], lps[0], lps[1], ver


class _Builder:
    def __init__(self, source: str) -> None:
        self.source = source
        self.rows: list[tuple[int, str, int, float, float, int]] = []
        self.seen: dict[tuple[int, str, int], str] = {}
        self.versions: dict[tuple[int, str], tuple[int, str]] = {}

    def add(self, obj: Any, where: str) -> None:
        row = _check(obj, where)
        key = (row[0], row[1], row[2])
        first = self.seen.get(key)
        if first is not None:
            raise LogprobInputError(
                f"{where}: duplicate token (step={key[0]}, sample_id={key[1]!r}, token_index={key[2]}), first at {first}"
            )
        self.seen[key] = where
        v = self.versions.setdefault((row[0], row[1]), (row[5], where))
        if v[0] != row[5]:
            raise LogprobInputError(
                f"{where}: 'weight_version' {row[5] if row[5] != NO_VERSION else None} differs from "
                f"{v[0] if v[0] != NO_VERSION else None} given for sample {row[1]!r} of step {row[0]} at {v[1]}"
            )
        self.rows.append(row)

    def build(self) -> LogprobRecords:
        if not self.rows:
            raise LogprobInputError(f"{self.source}: no records")
        steps, sids, toks, ro, tr, ver = zip(*self.rows)
        names: dict[str, int] = {}
        sample = np.fromiter((names.setdefault(s, len(names)) for s in sids), dtype=np.int64, count=len(sids))
        return LogprobRecords(
            step=np.asarray(steps, dtype=np.int64),
            sample=sample,
            sample_ids=tuple(names),
            token_index=np.asarray(toks, dtype=np.int64),
            rollout_logprob=np.asarray(ro, dtype=np.float64),
            train_logprob=np.asarray(tr, dtype=np.float64),
            weight_version=np.asarray(ver, dtype=np.int64),
            source=self.source,
        )


def records_from_objects(objs: Iterable[Any], *, source: str = "records") -> LogprobRecords:
    """Validate parsed JSON objects (e.g. an API body); errors say ``source record N`` (1-based)."""
    b = _Builder(source)
    for i, obj in enumerate(objs, 1):
        b.add(obj, f"{source} record {i}")
    return b.build()


def read_logprob_jsonl(path: str | Path) -> LogprobRecords:
    """Read and validate a JSONL file of logprob records. Blank lines are skipped."""
    b = _Builder(str(path))
    _read_into(b, Path(path))
    return b.build()


def read_logprob_files(paths: Iterable[str | Path]) -> LogprobRecords:
    """Records of several JSONL files (a bundle's parts) as one: a token may appear in only one of them."""
    ps = [Path(p) for p in paths]
    b = _Builder(", ".join(map(str, ps)))
    for p in ps:
        _read_into(b, p)
    return b.build()


def _read_into(b: _Builder, p: Path) -> None:
    try:
        f = open(p, encoding="utf-8")
    except OSError as exc:
        raise LogprobInputError(f"{p}: cannot read: {exc.strerror or exc}") from None
    with f:
        try:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except (ValueError, RecursionError) as exc:
                    raise LogprobInputError(f"{p} line {n}: not valid JSON ({exc})") from None
                b.add(obj, f"{p} line {n}")
        except UnicodeDecodeError:
            raise LogprobInputError(f"{p}: not UTF-8 text") from None


def _parquet_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("step", pa.int64(), nullable=False),
            pa.field("sample_id", pa.string(), nullable=False),
            pa.field("token_index", pa.int64(), nullable=False),
            pa.field("rollout_logprob", pa.float64(), nullable=False),
            pa.field("train_logprob", pa.float64(), nullable=False),
            pa.field("weight_version", pa.int64()),
        ],
        metadata={b"validator.runs.logprob_records.version": b"1"},
    )


def write_logprob_parquet(records: LogprobRecords, path: str | Path) -> None:
    """Store records as Parquet (fixed schema; ``weight_version`` null where absent)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    ver = records.weight_version
    table = pa.table(
        {
            "step": records.step,
            "sample_id": pa.array([records.sample_ids[i] for i in records.sample], pa.string()),
            "token_index": records.token_index,
            "rollout_logprob": records.rollout_logprob,
            "train_logprob": records.train_logprob,
            "weight_version": pa.array(ver, pa.int64(), mask=ver == NO_VERSION),
        },
        schema=_parquet_schema(),
    )
    pq.write_table(table, str(path))


def read_logprob_parquet(path: str | Path) -> LogprobRecords:
    """Read records stored by :func:`write_logprob_parquet`, validated again row by row."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(str(path))
    except (OSError, ValueError) as exc:
        raise LogprobInputError(f"{path}: not a readable Parquet file ({exc})") from None
    missing = [c for c in _REQUIRED if c not in table.column_names]
    if missing:
        raise LogprobInputError(f"{path}: missing column(s) {missing}")
    cols = {c: table.column(c).to_pylist() for c in LOGPROB_FIELDS if c in table.column_names}
    n = table.num_rows
    b = _Builder(str(path))
    for i in range(n):
        b.add({c: v[i] for c, v in cols.items()}, f"{path} row {i}")
    return b.build()
