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

import math
from array import array
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from validator.errors import InputError
from validator.runs.jsonlines import json_lines

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
    """Validated rows into typed columns (8 bytes a field, no Python object per row); duplicate tokens and a
    sample's differing weight versions are found at :meth:`build` by sorting (O(n log n)), and reported at the
    later line as they would be read, naming the first."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.step = array("q")
        self.sample = array("q")
        self.token = array("q")
        self.ro = array("d")
        self.tr = array("d")
        self.ver = array("q")
        self.line = array("q")  # the line (record, row) number of each row, with ``self.parts`` its prefix
        self.parts: list[tuple[int, str]] = []  # (first row, prefix such as "FILE line ")
        self.names: dict[str, int] = {}

    def start(self, prefix: str) -> None:
        self.parts.append((len(self.step), prefix))

    def add(self, obj: Any, number: int) -> None:
        try:  # the usual line, checked inline (a quarter of the cost); anything else through _check's messages
            st, sid, tok, ro, tr = obj["step"], obj["sample_id"], obj["token_index"], obj["rollout_logprob"], obj["train_logprob"]
            ver = obj.get("weight_version")
            fast = (
                type(obj) is dict and type(st) is int and type(tok) is int and 0 <= st <= _MAX_INT and 0 <= tok <= _MAX_INT
                and ((type(sid) is str and sid != "") or type(sid) is int) and type(ro) is float and type(tr) is float
                and -math.inf < ro <= _LOGPROB_TOL and -math.inf < tr <= _LOGPROB_TOL
                and (ver is None or (type(ver) is int and 0 <= ver <= _MAX_INT))
            )
        except (TypeError, KeyError, AttributeError, IndexError):
            fast = False
        if fast:
            sid, ver = str(sid), NO_VERSION if ver is None else ver
        else:
            st, sid, tok, ro, tr, ver = _check(obj, f"{self.parts[-1][1]}{number}")
        self.step.append(st)
        self.sample.append(self.names.setdefault(sid, len(self.names)))
        self.token.append(tok)
        self.ro.append(ro)
        self.tr.append(tr)
        self.ver.append(ver)
        self.line.append(number)

    def _where(self, row: int) -> str:
        k = bisect_right([first for first, _ in self.parts], row) - 1
        return f"{self.parts[k][1]}{self.line[row]}"

    def _check_keys(self, step: npt.NDArray[np.int64], sample: npt.NDArray[np.int64], token: npt.NDArray[np.int64],
                    ver: npt.NDArray[np.int64], sample_ids: tuple[str, ...]) -> None:
        n = step.size
        rows = np.arange(n, dtype=np.int64)
        bad: list[tuple[int, str]] = []  # (row, message) of the first error of each kind
        o = np.lexsort((rows, token, sample, step))
        same = (step[o][1:] == step[o][:-1]) & (sample[o][1:] == sample[o][:-1]) & (token[o][1:] == token[o][:-1])
        if same.any():
            later = o[1:][same]
            r = int(later.min())
            first = int(rows[(step == step[r]) & (sample == sample[r]) & (token == token[r])].min())
            bad.append((r, f"duplicate token (step={int(step[r])}, sample_id={sample_ids[int(sample[r])]!r}, "
                           f"token_index={int(token[r])}), first at {self._where(first)}"))
        o = np.lexsort((rows, sample, step))
        group = np.ones(n, dtype=bool)
        group[1:] = (step[o][1:] != step[o][:-1]) | (sample[o][1:] != sample[o][:-1])
        head = o[np.maximum.accumulate(np.where(group, np.arange(n), 0))]  # each row's group's first row
        differs = ver[o] != ver[head]
        if differs.any():
            r = int(o[differs].min())
            h = int(head[np.flatnonzero(o == r)[0]])
            def show(v: int) -> str:
                return str(v) if v != NO_VERSION else "None"
            bad.append((r, f"'weight_version' {show(int(ver[r]))} differs from {show(int(ver[h]))} given for sample "
                           f"{sample_ids[int(sample[r])]!r} of step {int(step[r])} at {self._where(h)}"))
        if bad:
            r, msg = min(bad)
            raise LogprobInputError(f"{self._where(r)}: {msg}")

    def build(self) -> LogprobRecords:
        if not self.step:
            raise LogprobInputError(f"{self.source}: no records")
        step = np.frombuffer(self.step, dtype=np.int64).copy()
        sample = np.frombuffer(self.sample, dtype=np.int64).copy()
        token = np.frombuffer(self.token, dtype=np.int64).copy()
        ver = np.frombuffer(self.ver, dtype=np.int64).copy()
        sample_ids = tuple(self.names)
        self._check_keys(step, sample, token, ver, sample_ids)
        return LogprobRecords(
            step=step,
            sample=sample,
            sample_ids=sample_ids,
            token_index=token,
            rollout_logprob=np.frombuffer(self.ro, dtype=np.float64).copy(),
            train_logprob=np.frombuffer(self.tr, dtype=np.float64).copy(),
            weight_version=ver,
            source=self.source,
        )


def records_from_objects(objs: Iterable[Any], *, source: str = "records") -> LogprobRecords:
    """Validate parsed JSON objects (e.g. an API body); errors say ``source record N`` (1-based)."""
    b = _Builder(source)
    b.start(f"{source} record ")
    for i, obj in enumerate(objs, 1):
        b.add(obj, i)
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
    b.start(f"{p} line ")
    with f:
        for n, obj in json_lines(p, f, error=LogprobInputError):
            b.add(obj, n)


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
    fast = _parquet_columns(table, str(path))
    if fast is not None:
        return fast
    cols = {c: table.column(c).to_pylist() for c in LOGPROB_FIELDS if c in table.column_names}
    n = table.num_rows
    b = _Builder(str(path))
    b.start(f"{path} row ")
    for i in range(n):
        b.add({c: v[i] for c, v in cols.items()}, i)
    return b.build()


def _parquet_columns(table: Any, source: str) -> LogprobRecords | None:
    """A table of the fixed schema whose values all pass, as arrays without a Python object per row; ``None``
    when anything is off (then the row-by-row path names the row and field)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    want = {"step": pa.int64(), "sample_id": pa.string(), "token_index": pa.int64(), "rollout_logprob": pa.float64(),
            "train_logprob": pa.float64()}
    if table.num_rows == 0 or any(table.schema.field(c).type != t for c, t in want.items()):
        return None
    if any(table.column(c).null_count for c in want):
        return None
    has_ver = "weight_version" in table.column_names
    if has_ver and table.schema.field("weight_version").type != pa.int64():
        return None
    step = table.column("step").to_numpy()
    token = table.column("token_index").to_numpy()
    ro = table.column("rollout_logprob").to_numpy()
    tr = table.column("train_logprob").to_numpy()
    if has_ver:
        ver = pc.fill_null(table.column("weight_version"), NO_VERSION).to_numpy()
        if (ver < NO_VERSION).any() or (pc.sum(pc.equal(table.column("weight_version"), NO_VERSION)).as_py() or 0):
            return None
    else:
        ver = np.full(step.size, NO_VERSION, dtype=np.int64)
    if (step < 0).any() or (token < 0).any():
        return None
    for lp in (ro, tr):
        if not (np.isfinite(lp).all() and (lp <= _LOGPROB_TOL).all()):
            return None
    sid = pc.dictionary_encode(table.column("sample_id").combine_chunks())
    names = tuple(sid.dictionary.to_pylist())
    if any(not n for n in names):
        return None
    sample = sid.indices.to_numpy().astype(np.int64)
    b = _Builder(source)
    b.start(f"{source} row ")
    b.line = array("q", range(step.size))
    step, token, ver = (np.ascontiguousarray(x, dtype=np.int64) for x in (step, token, ver))
    b._check_keys(step, sample, token, ver, names)
    return LogprobRecords(
        step=step, sample=sample, sample_ids=names, token_index=token,
        rollout_logprob=np.ascontiguousarray(ro, dtype=np.float64), train_logprob=np.ascontiguousarray(tr, dtype=np.float64),
        weight_version=ver, source=source,
    )
