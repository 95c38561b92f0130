"""Draft-KV transfer between prefill (P) and decode (D) servers with different TP sizes. Pure: no I/O.

Each side's draft KV pool holds, per rank, one buffer per draft layer and per kind (K, V). A buffer is a
sequence of pages; one page holds ``page_size`` tokens of the rank's ``heads_per_rank`` heads, either
token-major (``NHD``: ``[token][head][head_dim]``, SGLang's MHA pool) or head-major (``HND``). With
P TP4 and D TP32 over 8 heads, a P page of one layer's K is 64x2x128x2 = 32768 bytes, a D page 16384.

:func:`transfer_plan` computes, for one decode rank, the byte runs it must receive: which prefill rank,
head, source address, destination address and length, per layer and page (:mod:`probes.engines.sglang.heads`
decides which ranks hold which heads, the same rule the probes use to record draft K/V shards).
:func:`check_plan` checks a given plan (entries ``{layer, page, src_addr, dst_addr, length}``) against it
and reports every wrong entry, every missing byte range and every byte written twice. Layouts that cannot
be matched (different head counts, head_dim, dtype, page size or layers; TP sizes that do not divide the
heads) are refused by :func:`check_compatible` before anything is planned.

Worked case (the one docs/sglang.md, section 6, walks through): D buffer base 2000000, destination page 2. The right destination is
2000000 + 2*16384 = 2032768 and the page receives 16384 bytes; a flat plan that reuses the source item
length for offsets and length writes 32768 bytes at 2065536.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from probes.engines.sglang.heads import HeadLayoutError, check_heads, head_ranks, heads_per_rank, rank_heads
from validator.errors import InputError

__all__ = [
    "DTYPE_BYTES",
    "KVLayout",
    "PDLayoutError",
    "PlanCheck",
    "PlanEntry",
    "Run",
    "check_compatible",
    "check_plan",
    "parse_plan",
    "transfer_plan",
]

DTYPE_BYTES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "int8": 1, "uint8": 1,
}  # fmt: skip
_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32",
            "fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}
KINDS = ("k", "v")


class PDLayoutError(InputError):
    """Layouts that cannot be matched, or a layout / plan description that is not valid."""


def _int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise PDLayoutError(f"{what} must be an integer, got {v!r}")
    return v


@dataclass(frozen=True)
class KVLayout:
    """One side's draft KV layout. ``buffers[rank][kind][i]``: base address of layer ``layers[i]``'s buffer."""

    tp_size: int
    total_kv_heads: int
    head_dim: int
    dtype: str = "bfloat16"
    page_size: int = 64
    layers: tuple[int, ...] = (0,)
    page_layout: str = "NHD"
    buffers: Mapping[int, Mapping[str, tuple[int, ...]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("tp_size", "total_kv_heads", "head_dim", "page_size"):
            if _int(getattr(self, name), name) < 1:
                raise PDLayoutError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.dtype not in DTYPE_BYTES:
            raise PDLayoutError(f"unknown dtype {self.dtype!r}; known: {', '.join(DTYPE_BYTES)}")
        if self.page_layout not in ("NHD", "HND"):
            raise PDLayoutError(f"page_layout must be 'NHD' (token-major) or 'HND' (head-major), got {self.page_layout!r}")
        if not self.layers or len(set(self.layers)) != len(self.layers):
            raise PDLayoutError(f"layers must be a non-empty list of distinct ids, got {list(self.layers)}")
        try:
            check_heads(self.total_kv_heads, self.tp_size)
        except HeadLayoutError as exc:
            raise PDLayoutError(str(exc)) from None
        for rank, kinds in self.buffers.items():
            if not 0 <= rank < self.tp_size:
                raise PDLayoutError(f"buffers given for rank {rank}, outside TP{self.tp_size}")
            for kind, ptrs in kinds.items():
                if kind not in KINDS or len(ptrs) != len(self.layers):
                    raise PDLayoutError(
                        f"rank {rank}: buffers[{kind!r}] must list one address per layer ({len(self.layers)})"
                    )

    @property
    def heads_per_rank(self) -> int:
        return heads_per_rank(self.total_kv_heads, self.tp_size)

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def head_bytes(self) -> int:
        """Bytes of one head of one token."""
        return self.head_dim * self.itemsize

    @property
    def page_bytes(self) -> int:
        """Bytes of one page of one layer and kind on one rank (the connector's item length)."""
        return self.page_size * self.heads_per_rank * self.head_bytes

    def offset(self, token: int, local_head: int) -> int:
        """Byte offset of (token, local head) inside one page."""
        if self.page_layout == "NHD":
            return (token * self.heads_per_rank + local_head) * self.head_bytes
        return (local_head * self.page_size + token) * self.head_bytes

    def base(self, rank: int, kind: str, layer_index: int, side: str) -> int:
        try:
            return self.buffers[rank][kind][layer_index]
        except KeyError:
            raise PDLayoutError(f"{side} layout gives no {kind.upper()} buffer addresses for rank {rank}") from None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> KVLayout:
        """``{"tp_size", "total_kv_heads", "head_dim", "dtype", "page_size", "layers", "page_layout",
        "buffers": {"<rank>": {"k": [addr per layer], "v": [...]} | [k addrs..., v addrs...]}}``."""
        if not isinstance(d, Mapping):
            raise PDLayoutError(f"a layout must be an object, got {type(d).__name__}")
        known = {"tp_size", "total_kv_heads", "head_dim", "dtype", "page_size", "layers", "page_layout", "buffers"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise PDLayoutError(f"unknown layout key(s) {unknown}; known: {sorted(known)}")
        missing = [k for k in ("tp_size", "total_kv_heads", "head_dim") if k not in d]
        if missing:
            raise PDLayoutError(f"layout needs {', '.join(missing)}")
        layers = d.get("layers", [0])
        if isinstance(layers, int):
            layers = list(range(layers))
        if not isinstance(layers, list):
            raise PDLayoutError(f"layers must be a list of layer ids or a count, got {layers!r}")
        layers_t = tuple(_int(x, "layer id") for x in layers)
        dtype = str(d.get("dtype", "bfloat16")).removeprefix("torch.")
        buffers: dict[int, dict[str, tuple[int, ...]]] = {}
        raw = d.get("buffers") or {}
        if not isinstance(raw, Mapping):
            raise PDLayoutError("buffers must be an object keyed by rank")
        for rk, v in raw.items():
            try:
                rank = int(rk)
            except (TypeError, ValueError):
                raise PDLayoutError(f"buffers key {rk!r} must be a rank number") from None
            if isinstance(v, list):  # connector order: every layer's K, then every layer's V
                if len(v) != 2 * len(layers_t):
                    raise PDLayoutError(f"rank {rank}: a buffer list must hold 2 x {len(layers_t)} addresses (K then V)")
                v = {"k": v[: len(layers_t)], "v": v[len(layers_t) :]}
            if not isinstance(v, Mapping):
                raise PDLayoutError(f"rank {rank}: buffers must be {{'k': [...], 'v': [...]}} or a list")
            buffers[rank] = {str(k): tuple(_int(a, "buffer address") for a in ptrs) for k, ptrs in v.items()}
        return cls(
            tp_size=_int(d["tp_size"], "tp_size"),
            total_kv_heads=_int(d["total_kv_heads"], "total_kv_heads"),
            head_dim=_int(d["head_dim"], "head_dim"),
            dtype=_ALIASES.get(dtype, dtype),
            page_size=_int(d.get("page_size", 64), "page_size"),
            layers=layers_t,
            page_layout=str(d.get("page_layout", "NHD")).upper(),
            buffers=buffers,
        )


def check_compatible(p: KVLayout, d: KVLayout) -> None:
    """Refuse P/D layouts whose draft KV cannot be transferred head for head."""
    problems = []
    for name in ("total_kv_heads", "head_dim", "dtype", "page_size"):
        if getattr(p, name) != getattr(d, name):
            problems.append(f"{name}: P {getattr(p, name)} vs D {getattr(d, name)}")
    if p.layers != d.layers:
        problems.append(f"layers: P {list(p.layers)} vs D {list(d.layers)}")
    if problems:
        raise PDLayoutError("incompatible P/D draft KV layouts: " + "; ".join(problems))


@dataclass(frozen=True)
class Run:
    """One contiguous copy the decode rank must receive."""

    layer: int
    page: int
    kind: str
    head: int  # first global head in the run
    src_rank: int
    src_addr: int
    dst_addr: int
    length: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class PlanEntry:
    layer: int
    page: int
    src_addr: int
    dst_addr: int
    length: int
    index: int = 0  # position in the given plan

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "index"}


def parse_plan(entries: Any) -> list[PlanEntry]:
    """A JSON plan: a list of ``{layer, page, src_addr, dst_addr, length}`` (other keys ignored)."""
    if isinstance(entries, Mapping) and "entries" in entries:
        entries = entries["entries"]
    if not isinstance(entries, list):
        raise PDLayoutError("a plan must be a list of {layer, page, src_addr, dst_addr, length}")
    out = []
    for i, e in enumerate(entries):
        if not isinstance(e, Mapping):
            raise PDLayoutError(f"plan entry {i}: not an object")
        try:
            vals = {k: _int(e[k], f"plan entry {i}: {k}") for k in ("layer", "page", "src_addr", "dst_addr", "length")}
        except KeyError as exc:
            raise PDLayoutError(f"plan entry {i}: missing {exc.args[0]!r}") from None
        if vals["length"] < 1:
            raise PDLayoutError(f"plan entry {i}: length must be >= 1")
        out.append(PlanEntry(index=i, **vals))
    return out


# -- the plan ------------------------------------------------------------------------------------


def _page_template(p: KVLayout, d: KVLayout, dst_rank: int, src_choice: int) -> list[tuple[int, int, int, int, int]]:
    """Coalesced runs ``(head, src_rank, src_off, dst_off, length)`` of one page, offsets within the page.

    ``src_choice`` picks among replicated P ranks holding a head (``alternatives[src_choice % n]``).
    """
    d_heads = rank_heads(dst_rank, d.tp_size, d.total_kv_heads)
    pieces = []
    for dl, h in enumerate(d_heads):
        alts = head_ranks(h, p.tp_size, p.total_kv_heads)
        src = alts[src_choice % len(alts)]
        pl = h - rank_heads(src, p.tp_size, p.total_kv_heads).start
        for t in range(d.page_size):
            pieces.append((h, src, p.offset(t, pl), d.offset(t, dl)))
    pieces.sort(key=lambda x: x[3])
    hb = d.head_bytes
    runs: list[list[int]] = []
    for h, src, so, do in pieces:
        last = runs[-1] if runs else None
        if last and last[1] == src and last[2] + last[4] == so and last[3] + last[4] == do:
            last[4] += hb
        else:
            runs.append([h, src, so, do, hb])
    return [(a, b, c, e, f) for a, b, c, e, f in runs]


def transfer_plan(
    p: KVLayout,
    d: KVLayout,
    dst_rank: int,
    *,
    pages: int | Sequence[int] = 1,
    src_pages: Sequence[int] | None = None,
    dst_pages: Sequence[int] | None = None,
    src_choice: int | None = None,
) -> list[Run]:
    """The runs decode rank ``dst_rank`` must receive for the request's pages.

    ``pages``: a count or the page indices (into the request's page lists); ``src_pages`` / ``dst_pages``:
    the request's physical page ids on P and D (default: page index = page id). Heads replicated on
    several P ranks are taken from ``alternatives[src_choice % n]`` (default ``dst_rank``, which spreads
    the load).
    """
    check_compatible(p, d)
    if not 0 <= dst_rank < d.tp_size:
        raise PDLayoutError(f"decode rank {dst_rank} is out of range for D TP{d.tp_size}")
    idx = list(range(pages)) if isinstance(pages, int) else list(pages)
    tmpl = _page_template(p, d, dst_rank, dst_rank if src_choice is None else src_choice)
    runs = []
    for li, layer in enumerate(d.layers):
        for kind in KINDS:
            dbase = d.base(dst_rank, kind, li, "D")
            for i in idx:
                sp = src_pages[i] if src_pages is not None else i
                dp = dst_pages[i] if dst_pages is not None else i
                dpage = dbase + dp * d.page_bytes
                for h, src, so, do, n in tmpl:
                    spage = p.base(src, kind, li, "P") + sp * p.page_bytes
                    runs.append(Run(layer, i, kind, h, src, spage + so, dpage + do, n))
    return runs


# -- checking a plan -----------------------------------------------------------------------------


@dataclass(frozen=True)
class PageExpectation:
    """What one (layer, page, kind) of the decode rank must receive, summarised for messages."""

    layer: int
    page: int
    kind: str
    dst_start: int
    dst_end: int  # one past the page's last byte
    nbytes: int  # bytes it must receive (the whole page)
    runs: int
    src_ranks: tuple[int, ...]
    src_start: int  # the first run's source address (the canonical plan's choice of P rank)

    def describe(self) -> str:
        return (
            f"layer {self.layer} page {self.page} {self.kind.upper()}: dst_addr {self.dst_start}, {self.nbytes} bytes "
            f"in {self.runs} run(s) from P rank(s) {', '.join(map(str, self.src_ranks))} (first src_addr {self.src_start})"
        )


@dataclass(frozen=True)
class WrongEntry:
    entry: PlanEntry
    reasons: tuple[str, ...]
    expected: PageExpectation | None

    def describe(self) -> str:
        e = self.entry
        head = f"entry {e.index} (layer {e.layer}, page {e.page}, src_addr {e.src_addr}, dst_addr {e.dst_addr}, length {e.length})"
        exp = f"; expected {self.expected.describe()}" if self.expected else ""
        return f"{head}: {'; '.join(self.reasons)}{exp}"


@dataclass(frozen=True)
class PlanCheck:
    """Result of :func:`check_plan`; true when every entry is right and every byte is covered once."""

    dst_rank: int
    entries: int
    expected_bytes: int
    covered_bytes: int
    wrong: tuple[WrongEntry, ...]
    missing: tuple[tuple[PageExpectation, int], ...]  # (page, bytes not received)
    overlaps: tuple[tuple[int, int, int], ...]  # (entry index, other entry index, bytes written twice)

    @property
    def ok(self) -> bool:
        return not (self.wrong or self.missing or self.overlaps)

    def __bool__(self) -> bool:
        return self.ok

    def lines(self) -> list[str]:
        out = [
            f"decode rank {self.dst_rank}: {self.entries} plan entries, {self.covered_bytes} of "
            f"{self.expected_bytes} expected bytes received correctly: {'OK' if self.ok else 'WRONG'}"
        ]
        out += [f"  wrong {w.describe()}" for w in self.wrong]
        out += [f"  missing {n} bytes of {pe.describe()}" for pe, n in self.missing]
        out += [f"  entries {a} and {b} both write {n} bytes" for a, b, n in self.overlaps]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "dst_rank": self.dst_rank,
            "entries": self.entries,
            "expected_bytes": self.expected_bytes,
            "covered_bytes": self.covered_bytes,
            "wrong": [
                {"entry": w.entry.to_dict(), "index": w.entry.index, "reasons": list(w.reasons),
                 "expected": w.expected.__dict__ if w.expected else None}
                for w in self.wrong
            ],
            "missing": [{"page": pe.__dict__, "bytes": n} for pe, n in self.missing],
            "overlaps": [{"entry": a, "other": b, "bytes": n} for a, b, n in self.overlaps],
        }


@dataclass
class _Page:
    exp: PageExpectation
    runs: list[tuple[int, int, dict[int, int]]]  # (dst_start, dst_end, {src_rank: src_start - dst_start})
    starts: list[int]
    covered: list[tuple[int, int, int]] = field(default_factory=list)  # (dst_start, dst_end, entry index)


def _expected_pages(p: KVLayout, d: KVLayout, dst_rank: int, pages: Iterable[int],
                    src_pages: Sequence[int] | None, dst_pages: Sequence[int] | None) -> dict[tuple[int, int, str], _Page]:
    idx = sorted(set(pages))
    n_alt = len(head_ranks(rank_heads(dst_rank, d.tp_size, d.total_kv_heads)[0], p.tp_size, p.total_kv_heads))
    alts = [transfer_plan(p, d, dst_rank, pages=idx, src_pages=src_pages, dst_pages=dst_pages, src_choice=c)
            for c in [dst_rank + i for i in range(n_alt)]]
    out: dict[tuple[int, int, str], _Page] = {}
    grouped: dict[tuple[int, int, str], list[list[Run]]] = {}
    for runs in alts:
        per: dict[tuple[int, int, str], list[Run]] = {}
        for r in runs:
            per.setdefault((r.layer, r.page, r.kind), []).append(r)
        for key, rs in per.items():
            grouped.setdefault(key, []).append(rs)
    for key, variants in grouped.items():
        canon = variants[0]
        merged: dict[int, tuple[int, int, dict[int, int]]] = {}
        for rs in variants:
            for r in rs:
                lo, hi, deltas = merged.setdefault(r.dst_addr, (r.dst_addr, r.dst_addr + r.length, {}))
                deltas[r.src_rank] = r.src_addr - r.dst_addr
        runs_sorted = sorted(merged.values())
        lo = runs_sorted[0][0]
        exp = PageExpectation(
            layer=key[0], page=key[1], kind=key[2], dst_start=lo, dst_end=lo + d.page_bytes,
            nbytes=sum(b - a for a, b, _ in runs_sorted), runs=len(canon),
            src_ranks=tuple(sorted({r.src_rank for r in canon})), src_start=canon[0].src_addr,
        )
        out[key] = _Page(exp, runs_sorted, [a for a, _, _ in runs_sorted])
    return out


def _judge(e: PlanEntry, pages: dict[tuple[int, int, str], _Page]) -> tuple[list[str], _Page | None]:
    """Reasons the entry is wrong (empty when right) and the page it belongs to."""
    cands = [pg for (layer, page, _), pg in pages.items() if layer == e.layer and page == e.page]
    if not cands:
        return [f"layer {e.layer} page {e.page} is not part of this transfer"], None
    end = e.dst_addr + e.length
    home = next((pg for pg in cands if pg.exp.dst_start <= e.dst_addr < pg.exp.dst_end), None)
    if home is None:  # nearest page of this (layer, page): the one whose source range it reads, else K
        home = next((pg for pg in cands if any(
            0 <= e.src_addr - (a + min(dl.values())) < b - a for a, b, dl in pg.runs)), cands[0])
        return [f"dst_addr {e.dst_addr} is outside the destination page [{home.exp.dst_start}, {home.exp.dst_end})"
                + (f" and length {e.length} is not the page's {home.exp.nbytes} bytes" if e.length != home.exp.nbytes else "")], home
    reasons = []
    if end > home.exp.dst_end:
        reasons.append(f"length {e.length} runs past the destination page's end ({home.exp.dst_end - e.dst_addr} bytes left; "
                       f"a page holds {home.exp.nbytes})")
        return reasons, home
    i = bisect_right(home.starts, e.dst_addr) - 1
    if i < 0 or e.dst_addr >= home.runs[i][1]:
        return [f"dst_addr {e.dst_addr} is not a byte this rank must receive"], home
    a, b, deltas = home.runs[i]
    if end > b:
        reasons.append(f"bytes [{e.dst_addr}, {end}) span {b - e.dst_addr} bytes of one head's run and then bytes "
                       "that come from a different source offset (a head-aware plan copies at most "
                       f"{b - a} contiguous bytes here)")
    delta = e.src_addr - e.dst_addr
    if delta not in deltas.values():
        want = ", ".join(f"{e.dst_addr + dv} (P rank {rk})" for rk, dv in sorted(deltas.items()))
        reasons.append(f"src_addr {e.src_addr} does not hold these bytes: expected {want}")
    return reasons, home


def check_plan(
    p: KVLayout,
    d: KVLayout,
    dst_rank: int,
    plan: Sequence[PlanEntry],
    *,
    pages: int | Sequence[int] | None = None,
    src_pages: Sequence[int] | None = None,
    dst_pages: Sequence[int] | None = None,
) -> PlanCheck:
    """Check ``plan`` (one decode rank's copies) against :func:`transfer_plan`.

    The pages checked are ``pages`` (a count or indices) plus every page the plan names. An entry is right
    when its bytes lie inside one run of the expected plan and its source offset matches a P rank holding
    those heads; entries may split runs. Expected bytes no right entry covers are reported as missing.
    """
    check_compatible(p, d)
    wanted = set(range(pages) if isinstance(pages, int) else (pages or ()))
    wanted |= {e.page for e in plan if e.layer in d.layers and e.page >= 0}
    if src_pages is not None or dst_pages is not None:
        limit = min(len(x) for x in (src_pages, dst_pages) if x is not None)
        wanted = {i for i in wanted if i < limit}
    pgs = _expected_pages(p, d, dst_rank, wanted, src_pages, dst_pages)
    wrong = []
    for e in plan:
        reasons, home = _judge(e, pgs)
        if reasons:
            wrong.append(WrongEntry(e, tuple(reasons), home.exp if home else None))
        else:
            assert home is not None
            home.covered.append((e.dst_addr, e.dst_addr + e.length, e.index))
    missing, overlaps, covered = [], [], 0
    for key in sorted(pgs):
        pg = pgs[key]
        spans = sorted(pg.covered)
        got = 0
        reach, owner = -1, -1
        for lo, hi, idx in spans:
            if lo < reach:
                overlaps.append((owner, idx, min(hi, reach) - lo))
            new_lo = max(lo, reach)
            if hi > new_lo:
                got += hi - new_lo
            if hi > reach:
                reach, owner = hi, idx
        covered += got
        if got < pg.exp.nbytes:
            missing.append((pg.exp, pg.exp.nbytes - got))
    return PlanCheck(
        dst_rank=dst_rank,
        entries=len(plan),
        expected_bytes=sum(pg.exp.nbytes for pg in pgs.values()),
        covered_bytes=covered,
        wrong=tuple(wrong),
        missing=tuple(missing),
        overlaps=tuple(overlaps),
    )
