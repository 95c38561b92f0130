"""The one shape a comparison works on: :class:`RunView`, a run's tensors (:class:`TensorRef`, one stored
shard each, loaded on demand) and artifacts, whatever it was read from (a bundle, safetensors files, an
SGLang dumper folder, the store)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from probes.core.shards import Coords, ShardSpec
from validator.errors import InputError
from validator.numerics.host import STORAGE, HostArray
from validator.runs.tensorfile import dtype_name, file_byte_chunks

if TYPE_CHECKING:
    import torch

__all__ = ["TensorRef", "RunView"]


@dataclass(frozen=True)
class TensorRef:
    """One stored tensor (one shard of a logical tensor) and how to load it."""

    name: str
    coords: Coords
    shard: ShardSpec
    dtype: str
    shape: tuple[int, ...]
    sha256: str | None
    nbytes: int
    origin: str  # where it came from, for messages: "path/file.safetensors[t000003]"
    loader: Callable[[], torch.Tensor] = field(repr=False, compare=False)
    location: tuple[Path, int] | None = field(default=None, repr=False, compare=False)  # (file, byte offset)
    # reads the tensor's raw bytes into a buffer of ``nbytes`` (a stored blob): how a batch of small tensors is
    # read side by side into one buffer (validator.runs.reassembly.materialize_many); None: only ``load``
    read_into: Callable[[memoryview], None] | None = field(default=None, repr=False, compare=False)

    def byte_chunks(self) -> Iterator[bytes | memoryview]:
        """The tensor's raw bytes (as ``probes.core.bundle.tensor_bytes(self.load())``), streamed in bounded
        pieces when the bytes lie contiguous in a file."""
        if self.location is not None:
            yield from file_byte_chunks(self.location[0], self.location[1], self.nbytes)
        else:
            from probes.core.bundle import tensor_bytes

            yield tensor_bytes(self.load())

    def host_readable(self) -> bool:
        """Whether :meth:`load_host` can read it: a float dtype of ``numerics.host.STORAGE`` whose bytes lie in
        a file or a blob, as many as its shape needs."""
        storage = STORAGE.get(self.dtype)
        return (
            storage is not None
            and (self.read_into is not None or self.location is not None)
            and self.nbytes == math.prod(self.shape) * np.dtype(storage).itemsize
        )

    def load_host(self) -> HostArray:
        """The tensor as a ``numerics.host.HostArray``, its bytes read as they are stored (no torch); only where
        :meth:`host_readable`."""
        buf = np.empty(self.shape, STORAGE[self.dtype])
        raw = buf.reshape(-1).view(np.uint8).data
        if not self.nbytes:
            pass
        elif self.read_into is not None:
            self.read_into(raw)
        else:
            assert self.location is not None
            path, offset = self.location
            try:
                with open(path, "rb", buffering=0) as f:
                    f.seek(offset)
                    got = f.readinto(raw)
            except OSError as exc:
                raise InputError(f"{self.origin}: cannot read: {exc.strerror or exc}") from None
            if got != self.nbytes:
                raise InputError(f"{self.origin}: the file ends {self.nbytes - (got or 0)} bytes before the tensor's end")
        return HostArray(buf, self.dtype)

    def load(self) -> torch.Tensor:
        t = self.loader()
        if tuple(t.shape) != self.shape or dtype_name(t.dtype) != self.dtype:
            raise InputError(
                f"{self.origin}: tensor {self.name!r} is {dtype_name(t.dtype)}{list(t.shape)}, "
                f"its record says {self.dtype}{list(self.shape)}"
            )
        return t


@dataclass
class RunView:
    name: str
    source: str  # "bundle", "safetensors", "store"
    location: str
    labels: dict[str, str] = field(default_factory=dict)
    manifest: dict[str, Any] = field(default_factory=dict)
    tensors: list[TensorRef] = field(default_factory=list)
    acceptance_files: list[Path] = field(default_factory=list)  # JSONL step records (bundle parts, or a .jsonl)
    acceptance_parquet: Path | None = None  # a stored run's acceptance records
    logprob_files: list[Path] = field(default_factory=list)  # RL logprob records (bundle parts' logprobs.jsonl)
    logprob_parquet: Path | None = None  # a stored run's logprob records
    gsm8k_file: Path | None = None  # GSM8K probe rows (gsm8k.jsonl), see validator.workloads.gsm8k
    engine_metrics_file: Path | None = None  # scraped engine counters (metrics.json), see validator.workloads.scrape
    run_id: int | None = None

    @property
    def has_acceptance(self) -> bool:
        return bool(self.acceptance_files) or self.acceptance_parquet is not None

    def load_acceptance(self) -> Any:
        """The acceptance records as a DataFrame (see validator.runs.acceptance_records), or None."""
        if self.acceptance_files:
            from validator.runs.acceptance_records import read_acceptance_files

            return read_acceptance_files(self.acceptance_files)
        if self.acceptance_parquet is not None:
            from validator.runs.acceptance_records import read_acceptance_parquet

            return read_acceptance_parquet(self.acceptance_parquet)
        return None

    @property
    def has_logprobs(self) -> bool:
        return bool(self.logprob_files) or self.logprob_parquet is not None

    def load_logprobs(self) -> Any:
        """The RL logprob records (validator.runs.logprob_records.LogprobRecords), or None."""
        from validator.runs.logprob_records import read_logprob_files, read_logprob_parquet

        if self.logprob_files:
            return read_logprob_files(self.logprob_files)
        if self.logprob_parquet is not None:
            return read_logprob_parquet(self.logprob_parquet)
        return None
