"""RL logprob recorder: one JSON line per sampled token, with the rollout engine's and the trainer's logprob.

Layout inside a run bundle (the record format is in docs/rl.md, "Logprob records")::

    BUNDLE/parts/<part>/logprobs.jsonl

Lines go to a hidden temporary file in the part folder; ``close()`` flushes, fsyncs and renames it to
``logprobs.jsonl``, so a partial file is never visible under the real name (a recorder that dies leaves only the
hidden ``.tmp-logprobs-*.jsonl``).

>>> with LogprobRecorder("out/rl-run", part="trainer0") as rec:
...     rec.record_sample(step=12, sample_id="p37-r2", rollout_logprobs=engine_lps, train_logprobs=trainer_lps,
...                       weight_version=12)

``record_sample`` takes sequences of floats or 1-D tensors (moved to the host). Each value is checked cheaply
(finite, ``<= 1e-3``); the full validation is ``validator.runs.logprob_records`` on load. No torch import here
unless tensors are passed.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from probes.core.bundle import PART_RE, ensure_manifest
from probes.core.hidden_jsonl import HiddenJsonl, PublishOnExit

__all__ = ["LOGPROB_FILE", "LogprobRecordError", "LogprobRecorder"]

LOGPROB_FILE = "logprobs.jsonl"


class LogprobRecordError(ValueError):
    """A record the recorder refuses, or a recorder used wrongly."""


def _floats(name: str, values: Any) -> list[float]:
    if hasattr(values, "detach"):  # a tensor
        values = values.detach().to("cpu").double().reshape(-1).tolist()
    out: list[float] = []
    for i, v in enumerate(values):
        if isinstance(v, bool):
            raise LogprobRecordError(f"{name}[{i}]: a logprob must be a float, got bool")
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise LogprobRecordError(f"{name}[{i}]: a logprob must be a float, got {type(v).__name__}") from None
        if not math.isfinite(f) or f > 1e-3:
            raise LogprobRecordError(f"{name}[{i}]: a logprob must be finite and <= 0, got {f}")
        out.append(f)
    return out


class LogprobRecorder(PublishOnExit):
    """Writes ``BUNDLE/parts/<part>/logprobs.jsonl``; creates the bundle's manifest if there is none."""

    def __init__(
        self,
        bundle: str | os.PathLike[str],
        *,
        part: str = "logprobs",
        run_name: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        if not PART_RE.fullmatch(part):
            raise LogprobRecordError(f"part name {part!r} must match {PART_RE.pattern}")
        self.root = Path(bundle)
        self.dir = self.root / "parts" / part
        self.dir.mkdir(parents=True, exist_ok=True)
        if (self.dir / LOGPROB_FILE).exists():
            raise LogprobRecordError(f"{self.dir / LOGPROB_FILE} exists: one recorder per part")
        ensure_manifest(self.root, run_name, labels or {})
        self._out = HiddenJsonl(self.dir, "logprobs")
        self._f = self._out.file
        self._seen: set[tuple[int, str]] = set()
        self.closed = False

    def record_sample(
        self,
        *,
        step: int,
        sample_id: str | int,
        rollout_logprobs: Sequence[float] | Any,
        train_logprobs: Sequence[float] | Any,
        weight_version: int | None = None,
        first_token: int = 0,
    ) -> None:
        """One sample's tokens (``token_index`` from ``first_token``); the two sequences must be equally long."""
        if self.closed:
            raise LogprobRecordError("recorder is closed")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise LogprobRecordError(f"step must be an int >= 0, got {step!r}")
        if weight_version is not None and (
            isinstance(weight_version, bool) or not isinstance(weight_version, int) or weight_version < 0
        ):
            raise LogprobRecordError(f"weight_version must be an int >= 0 or None, got {weight_version!r}")
        ro = _floats("rollout_logprobs", rollout_logprobs)
        tr = _floats("train_logprobs", train_logprobs)
        if len(ro) != len(tr):
            raise LogprobRecordError(f"sample {sample_id!r}: {len(ro)} rollout logprobs but {len(tr)} train logprobs")
        key = (step, str(sample_id))
        if first_token == 0 and key in self._seen:
            raise LogprobRecordError(f"sample {sample_id!r} of step {step} recorded twice")
        self._seen.add(key)
        extra = {} if weight_version is None else {"weight_version": weight_version}
        for i, (a, b) in enumerate(zip(ro, tr)):
            self._f.write(
                json.dumps(
                    {
                        "step": step,
                        "sample_id": sample_id,
                        "token_index": first_token + i,
                        "rollout_logprob": a,
                        "train_logprob": b,
                        **extra,
                    }
                )
                + "\n"
            )

    def close(self) -> None:
        """Flush, fsync and rename into place."""
        if self.closed:
            return
        self.closed = True
        self._out.publish(self.dir / LOGPROB_FILE)

    def abort(self) -> None:
        """Drop what was recorded (the hidden file is removed)."""
        if not self.closed:
            self.closed = True
            self._out.discard()

    def _keep(self) -> None:
        """On an exception inside ``with``: the hidden file stays, the visible name never appears. After
        ``close()`` or ``abort()`` there is nothing left to keep (and the exception is not replaced)."""
        if self.closed:
            return
        self._out.keep()
        self.closed = True
