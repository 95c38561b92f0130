"""Which KV heads a tensor-parallel rank holds, and the shard spec that records it. Pure Python (no torch).

SGLang gives each attention-TP rank ``max(1, total_kv_heads // tp_size)`` KV heads. With fewer ranks than
heads, rank ``r`` holds the contiguous heads ``r*n .. r*n+n-1``; with more ranks than heads, each head is
held by ``tp_size // total_kv_heads`` consecutive ranks (rank ``r`` holds head ``r // replicas``).

Captured K/V viewed as ``[tokens, heads_on_rank, head_dim]`` is then the slice ``split(dim=1, ...)`` of the
logical ``[tokens, total_kv_heads, head_dim]`` tensor, so runs with different TP sizes (a D-only TP32 run
and a PD run whose draft KV was written on P with TP4) reassemble to the same tensor and compare directly.
The PD transfer plan (``validator.workloads.kv_transfer_plan``) uses the same functions to decide which prefill rank, head
and bytes each decode rank must receive.
"""

from __future__ import annotations

from probes.core.shards import ShardSpec

__all__ = ["HeadLayoutError", "check_heads", "head_ranks", "heads_per_rank", "kv_head_shard", "rank_heads"]


class HeadLayoutError(ValueError):
    """A TP size that cannot hold the KV heads evenly."""


def check_heads(total_kv_heads: int, tp_size: int) -> None:
    """Refuse layouts SGLang cannot shard evenly (every rank must hold the same number of whole heads)."""
    if total_kv_heads < 1 or tp_size < 1:
        raise HeadLayoutError(f"need total_kv_heads >= 1 and tp_size >= 1, got {total_kv_heads} and {tp_size}")
    if tp_size <= total_kv_heads and total_kv_heads % tp_size:
        raise HeadLayoutError(f"{total_kv_heads} KV heads cannot be split evenly over TP{tp_size}")
    if tp_size > total_kv_heads and tp_size % total_kv_heads:
        raise HeadLayoutError(
            f"TP{tp_size} cannot replicate {total_kv_heads} KV heads evenly ({tp_size} is not a multiple)"
        )


def heads_per_rank(total_kv_heads: int, tp_size: int) -> int:
    check_heads(total_kv_heads, tp_size)
    return max(1, total_kv_heads // tp_size)


def _replicas(total_kv_heads: int, tp_size: int) -> int:
    return tp_size // total_kv_heads if tp_size > total_kv_heads else 1


def _check_rank(rank: int, tp_size: int) -> None:
    if not 0 <= rank < tp_size:
        raise HeadLayoutError(f"rank {rank} is out of range for TP{tp_size}")


def rank_heads(rank: int, tp_size: int, total_kv_heads: int) -> range:
    """The global head ids rank ``rank`` holds, in the order they sit in its buffer."""
    n = heads_per_rank(total_kv_heads, tp_size)
    _check_rank(rank, tp_size)
    first = (rank // _replicas(total_kv_heads, tp_size)) * n
    return range(first, first + n)


def head_ranks(head: int, tp_size: int, total_kv_heads: int) -> list[int]:
    """Every rank that holds global head ``head`` (several when heads are replicated)."""
    n = heads_per_rank(total_kv_heads, tp_size)
    if not 0 <= head < total_kv_heads:
        raise HeadLayoutError(f"head {head} is out of range for {total_kv_heads} KV heads")
    reps = _replicas(total_kv_heads, tp_size)
    first = (head // n) * reps
    return list(range(first, first + reps))


def kv_head_shard(rank: int, tp_size: int, total_kv_heads: int, *, dim: int = 1) -> ShardSpec:
    """Shard spec of rank ``rank``'s K or V (``[tokens, heads_on_rank, head_dim]``, heads along ``dim``).

    >>> str(kv_head_shard(1, 4, 8))
    'split(dim=1, rank=1, size=4)'
    >>> str(kv_head_shard(13, 32, 8))
    'split(dim=1, rank=3, size=8, replica=1, replicas=4)'
    """
    check_heads(total_kv_heads, tp_size)
    _check_rank(rank, tp_size)
    reps = _replicas(total_kv_heads, tp_size)
    if reps == 1:
        return ShardSpec.split(dim, rank, tp_size)
    return ShardSpec.split(dim, rank // reps, total_kv_heads, replica=rank % reps, replicas=reps)
