"""Acceptance recorder: one JSON line per speculative-decoding verify step (no torch operations).

Layout inside a run bundle (see docs/metrics.md, "Acceptance metrics" for the record schema)::

    BUNDLE/parts/<part>/acceptance.jsonl

Lines are buffered in memory (at most ``buffer_records`` lines or ``buffer_bytes`` bytes) and appended
to a hidden temporary file in the part folder; ``close()`` flushes, fsyncs and renames it to
``acceptance.jsonl``. A recorder that never closes (crash, exception inside ``with``) leaves only the
hidden ``.tmp-acceptance-*.jsonl`` file, so a partial record file is never visible under the real name.

>>> with AcceptanceRecorder("out/run1", part="tp0") as rec:
...     rec.record("req-7", proposed=[11, 52, 9], accepted=2, step=0)

The recorder checks each record cheaply (types, ``0 <= accepted <= len(proposed)``, per-request step
order) and raises :class:`AcceptanceRecordError` on the caller's mistake; the full validation is done by
``validator.runs.acceptance_records`` on load.
"""

from __future__ import annotations

import json
import math
import operator
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .bundle import PART_RE, BundleError, ensure_manifest
from .hidden_jsonl import HiddenJsonl, PublishOnExit

__all__ = ["ACCEPTANCE_FILE", "AcceptanceRecordError", "AcceptanceRecorder"]

ACCEPTANCE_FILE = "acceptance.jsonl"


class AcceptanceRecordError(ValueError):
    """A record the recorder refuses, or a recorder used wrongly."""


def _int_list(name: str, values: Iterable[Any]) -> list[int]:
    try:
        out = [operator.index(v) for v in values]
    except TypeError:
        raise AcceptanceRecordError(f"{name!r} must be a sequence of ints") from None
    return out


def _logprob(name: str, v: Any) -> float:
    if isinstance(v, bool):
        raise AcceptanceRecordError(f"{name!r}: a logprob must be a float, got bool")
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise AcceptanceRecordError(f"{name!r}: a logprob must be a float, got {type(v).__name__}") from None
    if math.isnan(f) or f == math.inf:
        raise AcceptanceRecordError(f"{name!r}: a logprob must not be NaN or +inf, got {f}")
    return f


def _logprobs(name: str, values: Sequence[Any], lengths: tuple[int, ...]) -> list[Any]:
    """Per position: a float (logprob of the proposed/target token), ``None``, or a top-k object."""
    items = list(values)
    if len(items) not in lengths:
        want = " or ".join(str(n) for n in lengths)
        raise AcceptanceRecordError(f"{name!r} has {len(items)} entries, expected {want}")
    out: list[Any] = []
    for v in items:
        if v is None:
            out.append(None)
        elif isinstance(v, Mapping):
            ids = _int_list(f"{name}.top_ids", v.get("top_ids", ()))
            lps = [_logprob(f"{name}.top_logprobs", x) for x in v.get("top_logprobs", ())]
            if len(ids) != len(lps):
                raise AcceptanceRecordError(f"{name!r}: top_ids and top_logprobs differ in length")
            obj: dict[str, Any] = {"top_ids": ids, "top_logprobs": lps}
            if v.get("logprob") is not None:
                obj["logprob"] = _logprob(f"{name}.logprob", v["logprob"])
            out.append(obj)
        else:
            out.append(_logprob(name, v))
    return out


class AcceptanceRecorder(PublishOnExit):
    """Appends acceptance records for one part of a run bundle.

    ``bundle_path`` is the bundle root (the folder holding ``manifest.json``). When the bundle has no
    manifest yet, one is written (same format as ``probes.core.bundle.BundleWriter``; ``run_name`` defaults to
    the folder name) so that an acceptance-only bundle is self-describing. Use :meth:`for_writer` to
    record next to the tensors of a ``BundleWriter``.
    """

    def __init__(
        self,
        bundle_path: str | os.PathLike[str],
        part: str = "part0",
        *,
        run_name: str | None = None,
        labels: Mapping[str, str] | None = None,
        buffer_records: int = 1024,
        buffer_bytes: int = 1 << 20,
    ) -> None:
        if not PART_RE.fullmatch(part):
            raise AcceptanceRecordError(f"part name {part!r} must be 1-64 letters, digits, '_', '.', '-'")
        if buffer_records < 1 or buffer_bytes < 1:
            raise AcceptanceRecordError("buffer_records and buffer_bytes must be positive")
        self.root = Path(bundle_path)
        self.part = part
        self.part_dir = self.root / "parts" / part
        self.path = self.part_dir / ACCEPTANCE_FILE
        if self.path.exists():
            raise AcceptanceRecordError(f"{self.path}: acceptance records for part {part!r} already exist")
        self.part_dir.mkdir(parents=True, exist_ok=True)
        try:
            ensure_manifest(self.root, run_name, labels or {})
        except BundleError as exc:
            raise AcceptanceRecordError(str(exc)) from None
        self.buffer_records = buffer_records
        self.buffer_bytes = buffer_bytes
        self._out = HiddenJsonl(self.part_dir, "acceptance")
        self._file = self._out.file
        self._buffer: list[str] = []
        self._buffered_bytes = 0
        self._next_step: dict[str, int] = {}
        self._lock = threading.Lock()
        self.count = 0
        self.closed = False

    @classmethod
    def for_writer(cls, writer: Any, **kwargs: Any) -> AcceptanceRecorder:
        """A recorder for the same bundle and part as a ``probes.core.bundle.BundleWriter``."""
        return cls(writer.root, writer.part, **kwargs)

    def record(
        self,
        request_id: str,
        proposed: Sequence[int],
        accepted: int,
        *,
        step: int | None = None,
        bonus: bool = True,
        draft_logprobs: Sequence[Any] | None = None,
        target_tokens: Sequence[int] | None = None,
        target_logprobs: Sequence[Any] | None = None,
        prompt_hash: str | None = None,
        output_tokens: Sequence[int] | None = None,
    ) -> None:
        """Record one verify step. ``step`` defaults to the request's next step index (0, 1, ...).

        Steps of one request must be recorded in increasing order (this is how duplicates are caught
        without keeping every step in memory); call :meth:`end_request` to forget a finished request.
        """
        if not isinstance(request_id, str) or not request_id:
            raise AcceptanceRecordError(f"request_id must be a non-empty string, got {request_id!r}")
        prop = _int_list("proposed", proposed)
        if isinstance(accepted, bool):
            raise AcceptanceRecordError("'accepted' must be an int, got bool")
        try:
            acc = operator.index(accepted)
        except TypeError:
            raise AcceptanceRecordError(f"'accepted' must be an int, got {type(accepted).__name__}") from None
        if not 0 <= acc <= len(prop):
            raise AcceptanceRecordError(
                f"'accepted' must be between 0 and len(proposed)={len(prop)}, got {acc} (request {request_id!r})"
            )
        rec: dict[str, Any] = {"request_id": request_id, "step": 0, "proposed": prop, "accepted": acc}
        if not bonus:
            rec["bonus"] = False
        if draft_logprobs is not None:
            rec["draft_logprobs"] = _logprobs("draft_logprobs", draft_logprobs, (len(prop),))
        target_lengths: tuple[int, ...] = (len(prop), len(prop) + 1)
        if target_tokens is not None:
            rec["target_tokens"] = _int_list("target_tokens", target_tokens)
            if len(rec["target_tokens"]) not in target_lengths:
                raise AcceptanceRecordError(
                    f"'target_tokens' has {len(rec['target_tokens'])} entries, expected {len(prop)} or {len(prop) + 1}"
                )
            target_lengths = (len(rec["target_tokens"]),)
        if target_logprobs is not None:
            rec["target_logprobs"] = _logprobs("target_logprobs", target_logprobs, target_lengths)
        if prompt_hash is not None:
            rec["prompt_hash"] = str(prompt_hash)
        if output_tokens is not None:
            rec["output_tokens"] = _int_list("output_tokens", output_tokens)
            if len(rec["output_tokens"]) > acc + int(bool(bonus)):
                raise AcceptanceRecordError(
                    f"'output_tokens' has {len(rec['output_tokens'])} entries, more than accepted + bonus"
                    f" = {acc + int(bool(bonus))}"
                )
        with self._lock:
            if self.closed:
                raise AcceptanceRecordError(f"{self.path}: recorder is closed")
            expected = self._next_step.get(request_id, 0)
            if step is None:
                s = expected
            else:
                s = operator.index(step)
                if s < expected:
                    raise AcceptanceRecordError(
                        f"request {request_id!r}: step {s} recorded after step {expected - 1} "
                        "(steps of a request must increase; duplicates are not allowed)"
                    )
            rec["step"] = s
            self._next_step[request_id] = s + 1
            line = json.dumps(rec, separators=(",", ":")) + "\n"
            self._buffer.append(line)
            self._buffered_bytes += len(line)
            self.count += 1
            if len(self._buffer) >= self.buffer_records or self._buffered_bytes >= self.buffer_bytes:
                self._write_buffer()

    def end_request(self, request_id: str) -> None:
        """Forget a finished request's step counter (keeps memory bounded over a long run)."""
        with self._lock:
            self._next_step.pop(request_id, None)

    def _write_buffer(self) -> None:
        if self._buffer:
            self._file.write("".join(self._buffer))
            self._buffer.clear()
            self._buffered_bytes = 0

    def flush(self) -> None:
        """Write buffered lines to the (still hidden) temporary file."""
        with self._lock:
            if not self.closed:
                self._write_buffer()
                self._file.flush()

    def close(self) -> None:
        """Flush, fsync and publish ``acceptance.jsonl``. Idempotent."""
        with self._lock:
            if self.closed:
                return
            self._write_buffer()
            self._out.publish(self.path)
            self.closed = True

    def abort(self) -> None:
        """Close without publishing: the temporary file is removed."""
        with self._lock:
            if self.closed:
                return
            self._out.discard()
            self._buffer.clear()
            self.closed = True

    def _keep(self) -> None:
        """On an exception inside ``with``: keep what was written for debugging, under the hidden name only."""
        with self._lock:
            if not self.closed:
                self._write_buffer()
                self._file.close()
                self.closed = True
