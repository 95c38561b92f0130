"""The one shape a comparison works on: :class:`RunView`, a run's tensors (:class:`TensorRef`, one stored
shard each, loaded on demand) and artifacts, whatever it was read from (a bundle, safetensors files, an
SGLang dumper folder, the store)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from probes.shards import Coords, ShardSpec
from validator.errors import InputError
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
        """The tensor's raw bytes (as ``probes.bundle.tensor_bytes(self.load())``), streamed in bounded
        pieces when the bytes lie contiguous in a file."""
        if self.location is not None:
            yield from file_byte_chunks(self.location[0], self.location[1], self.nbytes)
        else:
            from probes.bundle import tensor_bytes

            yield tensor_bytes(self.load())

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
