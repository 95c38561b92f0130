"""Shard specs and capture coordinates: how one captured tensor relates to the logical tensor.

A probe on one rank sees only its piece of a logical tensor. The shard spec says which piece:

- ``full()``: the whole logical tensor.
- ``split(dim, rank, size)``: slice ``rank`` of ``size`` equal-order slices along ``dim`` (TP sharding);
  the pieces are concatenated back in rank order. ``replica``/``replicas`` mark copies of one slice held
  by several ranks (e.g. 8 KV heads on TP32: each head on 4 ranks).
- ``replicated(rank, size)``: every rank holds the same tensor; the copies must agree.
- ``partial(stage, of)``: an additive partial (PP stage contributions); the logical tensor is the sum of
  the stages' pieces, added in stage order. A stage with no contribution may record nothing.

Copies (``replicated``, or ``split`` with ``replicas > 1``) may say how they came to be copies:
``replication="declared"`` where the run's layout declares them replicated (SGLang's dumper ``dims``,
``# tp:replicated``: copies that differ fail their pair), ``"assumed"`` where a reader only guessed it (a
tensor dumped without dims on several ranks: a note when they differ); unset, they are a note too. The dict
form carries it only when set, so records without it read and write as before; the text form leaves it out.

This module is pure Python (no torch) so that records can be parsed anywhere.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Coords", "Replication", "ShardSpec", "ShardSpecError"]

ShardKind = Literal["full", "split", "replicated", "partial"]
_KINDS = ("full", "split", "replicated", "partial")
Replication = Literal["declared", "assumed"]
_REPLICATIONS = ("declared", "assumed")


class ShardSpecError(ValueError):
    """A shard spec or coordinate set that cannot be valid."""


@dataclass(frozen=True)
class ShardSpec:
    kind: ShardKind = "full"
    index: int = 0  # rank for split/replicated, stage for partial
    count: int = 1  # size for split/replicated, number of stages for partial
    dim: int | None = None  # split only
    replica: int = 0  # split only: which copy of this slice
    replicas: int = 1  # split only: how many ranks hold this slice
    replication: Replication | None = None  # copies only: declared by the run's layout, or assumed by a reader

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ShardSpecError(f"unknown shard kind {self.kind!r}; expected one of {', '.join(_KINDS)}")
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ShardSpecError(f"shard index {self.index} out of range for count {self.count}")
        if self.replicas < 1 or not 0 <= self.replica < self.replicas:
            raise ShardSpecError(f"replica {self.replica} out of range for replicas {self.replicas}")
        if self.kind == "split" and self.dim is None:
            raise ShardSpecError("split shard needs a dim")
        if self.kind != "split" and (self.dim is not None or self.replicas != 1):
            raise ShardSpecError(f"{self.kind} shard takes no dim or replicas")
        if self.kind == "full" and self.count != 1:
            raise ShardSpecError("full shard has count 1")
        if self.replication is not None:
            if self.replication not in _REPLICATIONS:
                raise ShardSpecError(
                    f"unknown replication {self.replication!r}; expected one of {', '.join(_REPLICATIONS)}"
                )
            if self.kind != "replicated" and not (self.kind == "split" and self.replicas > 1):
                raise ShardSpecError(
                    f"replication {self.replication!r} is for copies only: a replicated shard, or a split one "
                    "with replicas > 1"
                )

    # -- constructors -------------------------------------------------------------------------
    @classmethod
    def full(cls) -> ShardSpec:
        return cls("full")

    @classmethod
    def split(
        cls,
        dim: int,
        rank: int,
        size: int,
        *,
        replica: int = 0,
        replicas: int = 1,
        replication: Replication | None = None,
    ) -> ShardSpec:
        return cls(
            "split", index=rank, count=size, dim=dim, replica=replica, replicas=replicas, replication=replication
        )

    @classmethod
    def replicated(cls, rank: int, size: int, *, replication: Replication | None = None) -> ShardSpec:
        return cls("replicated", index=rank, count=size, replication=replication)

    @classmethod
    def partial(cls, stage: int, of: int) -> ShardSpec:
        return cls("partial", index=stage, count=of)

    # -- text and dict forms ------------------------------------------------------------------
    def __str__(self) -> str:
        if self.kind == "full":
            return "full()"
        if self.kind == "split":
            extra = f", replica={self.replica}, replicas={self.replicas}" if self.replicas > 1 else ""
            return f"split(dim={self.dim}, rank={self.index}, size={self.count}{extra})"
        if self.kind == "replicated":
            return f"replicated(rank={self.index}, size={self.count})"
        return f"partial(stage={self.index}, of={self.count})"

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind}
        if self.kind == "full":
            return d
        d.update(index=self.index, count=self.count)
        if self.kind == "split":
            d["dim"] = self.dim
            if self.replicas > 1:
                d.update(replica=self.replica, replicas=self.replicas)
        if self.replication is not None:
            d["replication"] = self.replication
        return d

    @classmethod
    def from_dict(cls, d: Any) -> ShardSpec:
        if d is None:
            return cls.full()
        if isinstance(d, str):
            return cls.parse(d)
        if not isinstance(d, dict):
            raise ShardSpecError(f"shard spec must be an object or a string, got {type(d).__name__}")
        try:
            return cls(
                kind=d.get("kind", "full"),
                index=_as_int(d.get("index", 0), "index"),
                count=_as_int(d.get("count", 1), "count"),
                dim=None if d.get("dim") is None else _as_int(d["dim"], "dim"),
                replica=_as_int(d.get("replica", 0), "replica"),
                replicas=_as_int(d.get("replicas", 1), "replicas"),
                replication=_replication(d.get("replication")),
            )
        except TypeError as exc:  # unexpected value types
            raise ShardSpecError(f"bad shard spec {d!r}: {exc}") from None

    @classmethod
    def parse(cls, text: str) -> ShardSpec:
        m = re.fullmatch(r"\s*(\w+)\s*\((.*)\)\s*", text)
        if not m:
            raise ShardSpecError(f"cannot parse shard spec {text!r}; expected e.g. 'split(dim=0, rank=1, size=4)'")
        kind, body = m.group(1), m.group(2).strip()
        kw: dict[str, Any] = {}  # integers: the text form carries no replication
        if body:
            for item in body.split(","):
                k, sep, v = item.partition("=")
                if not sep:
                    raise ShardSpecError(f"cannot parse shard spec {text!r}: arguments must be key=value")
                kw[k.strip()] = _as_int(v.strip(), k.strip())
        try:
            if kind == "full":
                return cls.full(**kw)
            if kind == "split":
                return cls.split(**kw)
            if kind == "replicated":
                return cls.replicated(**kw)
            if kind == "partial":
                return cls.partial(**kw)
        except TypeError as exc:
            raise ShardSpecError(f"bad arguments in shard spec {text!r}: {exc}") from None
        raise ShardSpecError(f"unknown shard kind {kind!r} in {text!r}")


def _replication(v: Any) -> Replication | None:
    if v is None:
        return None
    if v == "declared":
        return "declared"
    if v == "assumed":
        return "assumed"
    raise ShardSpecError(f"replication must be one of {', '.join(map(repr, _REPLICATIONS))}, got {v!r}")


def _as_int(v: Any, what: str) -> int:
    if isinstance(v, bool):
        raise ShardSpecError(f"{what} must be an integer, got {v!r}")
    if isinstance(v, int):
        return v
    if isinstance(v, str) and re.fullmatch(r"-?[0-9]+", v):
        return int(v)
    raise ShardSpecError(f"{what} must be an integer, got {v!r}")


def _plain_int(x: Any) -> bool:
    return type(x) is int or (isinstance(x, int) and not isinstance(x, bool))


_COORD_FIELDS = ("step", "request", "tokens", "layer", "pp_stage", "tp_rank", "tp_size")
_COORD_SET = frozenset(_COORD_FIELDS)


@dataclass(frozen=True)
class Coords:
    """Where a captured tensor comes from.

    ``step``, ``request`` (request id or prompt hash), ``tokens`` (half-open ``[start, end)``) and ``layer``
    identify the logical tensor; ``pp_stage``, ``tp_rank`` and ``tp_size`` only say where it was held, so
    a PP8 run and a PP1 run of the same layer pair up.
    """

    step: int | None = None
    request: str | None = None
    tokens: tuple[int, int] | None = None
    layer: int | None = None
    pp_stage: int | None = None
    tp_rank: int | None = None
    tp_size: int | None = None
    extra: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        ints = (self.step, self.layer, self.pp_stage, self.tp_rank, self.tp_size)
        for name, v in zip(("step", "layer", "pp_stage", "tp_rank", "tp_size"), ints, strict=True):
            if v is not None and type(v) is not int and (isinstance(v, bool) or not isinstance(v, int)):
                raise ShardSpecError(f"coordinate {name} must be an integer, got {v!r}")
        if self.request is not None and not isinstance(self.request, str):
            raise ShardSpecError(f"coordinate request must be a string, got {self.request!r}")
        if self.tokens is not None:
            t = self.tokens
            if not (
                isinstance(t, tuple) and len(t) == 2 and _plain_int(t[0]) and _plain_int(t[1]) and 0 <= t[0] <= t[1]
            ):
                raise ShardSpecError(f"coordinate tokens must be a [start, end) pair, got {t!r}")

    @classmethod
    def make(cls, **kw: Any) -> Coords:
        """Coordinates from keywords: the known fields, and any other key (not None) as an ``extra`` string."""
        tokens, request = kw.get("tokens"), kw.get("request")
        extra: tuple[tuple[str, str], ...] = ()
        if not _COORD_SET.issuperset(kw):
            extra = tuple(sorted((str(k), str(v)) for k, v in kw.items() if k not in _COORD_SET and v is not None))
        return cls(
            kw.get("step"),
            None if request is None else str(request),
            None if tokens is None else tuple(tokens),
            kw.get("layer"),
            kw.get("pp_stage"),
            kw.get("tp_rank"),
            kw.get("tp_size"),
            extra,
        )

    def identity(self) -> tuple[Any, ...]:
        """The part of the coordinates that names the logical tensor (placement excluded)."""
        return (self.step, self.request, self.tokens, self.layer, self.extra)

    def label(self) -> str:
        """Short human-readable identity, e.g. ``step=3 layer=19``."""
        parts = []
        if self.step is not None:
            parts.append(f"step={self.step}")
        if self.request is not None:
            parts.append(f"req={self.request}")
        if self.tokens is not None:
            parts.append(f"tok={self.tokens[0]}:{self.tokens[1]}")
        if self.layer is not None:
            parts.append(f"layer={self.layer}")
        parts.extend(f"{k}={v}" for k, v in self.extra)
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        values = (self.step, self.request, self.tokens, self.layer, self.pp_stage, self.tp_rank, self.tp_size)
        d: dict[str, Any] = {k: v for k, v in zip(_COORD_FIELDS, values, strict=True) if v is not None}
        if self.tokens is not None:
            d["tokens"] = list(self.tokens)
        if self.extra:
            d["extra"] = dict(self.extra)
        return d

    @classmethod
    def from_dict(cls, d: Any) -> Coords:
        if d is None:
            return cls()
        if not isinstance(d, dict):
            raise ShardSpecError(f"coords must be an object, got {type(d).__name__}")
        unknown = set(d) - set(_COORD_FIELDS) - {"extra"}
        if unknown:
            raise ShardSpecError(f"unknown coordinate(s) {sorted(unknown)}")
        extra = d.get("extra") or {}
        if not isinstance(extra, dict):
            raise ShardSpecError("coords.extra must be an object")
        kw = {k: d[k] for k in _COORD_FIELDS if k in d}
        if kw.get("tokens") is not None:
            if not isinstance(kw["tokens"], (list, tuple)):
                raise ShardSpecError(f"coordinate tokens must be a [start, end) pair, got {kw['tokens']!r}")
            kw["tokens"] = tuple(kw["tokens"])
        return cls(**kw, extra=tuple(sorted((str(k), str(v)) for k, v in extra.items())))
