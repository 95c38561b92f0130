"""The probe session: capture points in a serving process write tensors into one part of a run bundle.

>>> session = ProbeSession(ProbeConfig(bundle="out/run1", part="pp0-tp0", mode="summary"))
>>> session.set_coords(step=0)
>>> session.capture("ctx.pre_norm", x, layer=19, shard=ShardSpec.partial(0, 8))
>>> session.close()

A disabled session (:data:`DISABLED`, what :func:`get_session` returns until one is set) does no work: its
``capture`` returns after one attribute check. Filters (names, steps, requests, a token window) and a
byte budget bound what is stored; whatever is filtered, dropped or goes wrong is counted in the part's
``extra`` (``extra["probe"]``) and warned about once, never silently. CUDA captures are copied to the host
asynchronously (see :mod:`probes.core.transfer`); capture points inside CUDA graphs use static slots
(see :mod:`probes.core.cudagraph`). The format and every option are described in ``docs/probes.md``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Self

import torch

from .bundle import BundleWriter, check_tensor_name
from .config import ProbeConfig
from .cudagraph import DEFAULT_GRAPH, GraphCaptureError, GraphSlot, GraphSlots
from .summary import CHECKSUM_BITS, CHECKSUM_PERIOD, SUMMARY_FIELDS, SUMMARY_NBYTES, summarize
from .transfer import Transfer, Write, host_view

__all__ = [
    "DISABLED",
    "ProbeError",
    "ProbeSession",
    "ProbeWarning",
    "get_session",
    "session_from_env",
    "set_session",
]

# With ``defer_summaries``, eager CUDA summaries of tensors whose storage holds at most this many bytes wait
# for the end of their step (the session holds the tensors until then) and are computed together in a few
# kernel launches; larger ones, whose kernels take longer than launching them, are summarised at once, and so
# are inference tensors (no version counter). A name is deferred only after one step in which none of its
# tensors was written in place before the step ended (it is watched through that step); a name whose tensor
# is, is summarised at once from then on. The bits are the same either way.
DEFER_MAX_BYTES = 4 << 20

_STAT_KEYS = (
    "captured", "captured_bytes", "dropped_captures", "dropped_bytes", "filtered", "sampled_out",
    "graph_stale_reads", "graph_missed_replays", "graph_unread_replays",
)  # fmt: skip


def _capturing_any() -> bool:
    """Is this thread's current CUDA stream capturing a graph (False when CUDA was never initialised)?"""
    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()  # type: ignore[no-untyped-call]


class ProbeError(RuntimeError):
    """A probe used in a way that cannot work (closed session, bad token window)."""


class ProbeWarning(UserWarning):
    """Something was not captured as asked (budget, graph replays, write errors). Issued once per kind."""


class ProbeSession:
    """Captures tensors into one part of a run bundle. Not thread-safe: use it from the serving thread."""

    def __init__(self, config: ProbeConfig | None = None, *, writer: Any = None) -> None:
        cfg = config if config is not None else ProbeConfig()
        self.config = cfg
        self.enabled: bool = cfg.enabled and (writer is not None or cfg.bundle is not None)
        self.closed = False
        self.stats: dict[str, int] = dict.fromkeys(_STAT_KEYS, 0)
        self.budget_exhausted = False
        self._coords: dict[str, Any] = {}
        self._names: dict[str, bool] = {}
        self._warned: set[str] = set()
        self._summary = cfg.mode == "summary"
        self._defer = cfg.defer_summaries and self._summary
        self._selects = cfg.selects  # step, request or sampling rules to check on every capture
        self.writer: Any = None
        self._transfer: Transfer | None = None
        self._graphs = GraphSlots(cfg.max_graph_slots)
        self._batch_step: Any = None  # the step whose captures are staged (copied together)
        self._lost = 0  # deferred summaries lost to in-place writes, already taken off the stats
        if self.enabled:
            self.writer = (
                writer
                if writer is not None
                else BundleWriter(
                    cfg.bundle,  # type: ignore[arg-type]
                    run_name=cfg.run_name,
                    labels=dict(cfg.labels),
                    part=cfg.part,
                    manifest={"probe": cfg.sampling()},
                )
            )
            self._transfer = Transfer(self.writer, drain=cfg.drain, summary_chunk=cfg.summary_chunk)

    @classmethod
    def from_env(cls, prefix: str = "VALIDATOR_PROBE_", environ: Mapping[str, str] | None = None) -> ProbeSession:
        return cls(ProbeConfig.from_env(prefix, environ))

    # -- default coordinates --------------------------------------------------------------------
    def set_coords(self, **coords: Any) -> None:
        """Coordinates merged into every later capture (e.g. ``step``, ``request``); ``None`` removes one."""
        if not self.enabled:
            return
        for k, v in coords.items():
            if v is None:
                self._coords.pop(k, None)
            else:
                self._coords[k] = v

    @contextmanager
    def coords(self, **coords: Any) -> Iterator[None]:
        saved = dict(self._coords)
        self.set_coords(**coords)
        try:
            yield
        finally:
            self._coords = saved

    # -- capture --------------------------------------------------------------------------------
    def capture(self, name: str, tensor: torch.Tensor, *, shard: Any = None, **coords: Any) -> None:
        """Capture ``tensor`` as ``name`` with coordinates (step, request, tokens, layer, ...). Never modifies it."""
        if not self.enabled:
            return
        self._capture(name, tensor, shard, coords)

    def _capture(self, name: str, tensor: torch.Tensor, shard: Any, coords: dict[str, Any]) -> None:
        if self.closed:
            raise ProbeError(f"capture of {name!r} after the probe session was closed")
        cfg = self.config
        wanted = self._names.get(name)
        if wanted is None:
            check_tensor_name(name)
            wanted = self._names[name] = cfg.wants_name(name)
        if not wanted:
            self.stats["filtered"] += 1
            return
        merged = {**self._coords, **coords} if self._coords else coords
        t = tensor.detach()
        in_graph = t.is_cuda and torch.cuda.is_current_stream_capturing()
        if not in_graph and self._selects:
            step, request = merged.get("step"), merged.get("request")
            if not (cfg.wants_step(step) and cfg.wants_request(request)):
                self.stats["filtered"] += 1
                return
            if not cfg.sampled(step, request):
                self.stats["sampled_out"] += 1
                return
        if cfg.tokens is not None:
            windowed = self._window(name, t, merged)
            if windowed is None:
                self.stats["filtered"] += 1
                return
            t, merged = windowed
        if in_graph:
            if not cfg.graph_slots:
                raise GraphCaptureError(
                    f"capture point {name!r} was reached during CUDA graph capture; its Python code will not run "
                    "when the graph replays. Enable graph slots (ProbeConfig(graph_slots=True), then call "
                    "session.after_replay(step=...) after each replay) or move the capture point out of the graph"
                )
            self._graphs.add(name, t, coords=merged, shard=shard, mode=cfg.mode, chunk=cfg.summary_chunk)
            return
        nbytes = SUMMARY_NBYTES if self._summary else t.numel() * t.element_size()
        if (self.budget_exhausted or cfg.budget_bytes is not None) and not self._admit(nbytes):
            return
        transfer = self._transfer
        assert transfer is not None
        if transfer.pending and (t.is_cuda or not _capturing_any()):
            transfer.poll()  # event queries: never during graph capture
        if transfer.write_errors:
            self._report_write_errors()
        stored = name + ".summary" if self._summary else name
        if t.is_cuda:
            if cfg.graph_slots and t.device not in self._graphs.arenas:
                self._graphs.prepare(t.device)
            step = merged.get("step")
            if step != self._batch_step:  # a new step: summarise and copy out what the last one staged
                transfer.submit()
                self._batch_step = step
                self._report_modified()

            def make(host: torch.Tensor) -> Write:
                return Write(stored, host, shard, merged)

            held = t.untyped_storage().nbytes() if self._defer and not t.is_inference() else -1
            small = 0 <= held <= DEFER_MAX_BYTES  # held: what keeping t alive keeps
            if small and name in transfer.steady_names:  # summarised with the step's others at its end
                transfer.defer_summary(t, name, make, held)
            else:
                self._capture_now(t, name, small, make)
        else:
            with torch.no_grad():
                host = summarize(t, chunk=cfg.summary_chunk) if self._summary else t.to("cpu", copy=True)
            transfer.host([Write(stored, host.contiguous(), shard, merged)])
        self.stats["captured"] += 1
        self.stats["captured_bytes"] += nbytes

    def _capture_now(self, t: torch.Tensor, name: str, small: bool, make: Callable[[torch.Tensor], Write]) -> None:
        """A CUDA capture whose device work is queued now: a summary (two kernels; ``small`` ones are watched
        through the step), a snapshot, or the live tensor's copy."""
        cfg = self.config
        transfer = self._transfer
        assert transfer is not None
        with torch.no_grad():
            if self._summary:  # two kernels writing a row of this step's summaries
                summarize(t, out=transfer.summary_slot(t.device), chunk=cfg.summary_chunk)
                transfer.stage_summary(t.device, make)
                if small and name not in transfer.modified_names:
                    transfer.watch(t, name)  # written in place before the step ends? if not, defer later
            elif cfg.snapshot:  # one copy on the serving stream; to the host with the step's batch
                transfer.stage(t.clone(memory_format=torch.contiguous_format), make)
            else:  # the live tensor: queued now, behind the work queued so far
                transfer.to_host([t], lambda hosts: [make(hosts[0])])

    def _report_modified(self) -> None:
        """Summaries lost to in-place writes since the last call: no longer counted as captured; warn once."""
        t = self._transfer
        assert t is not None
        lost, self._lost = t.modified - self._lost, t.modified
        if not lost:
            return
        self.stats["captured"] -= lost
        self.stats["captured_bytes"] -= lost * SUMMARY_NBYTES
        self._warn(
            "modified",
            f"{t.modified} summary(ies) not recorded: the tensor was written in place before "
            f"the step's summaries ran ({', '.join(sorted(t.modified_names))}); later captures of these "
            "names are summarised at once",
        )

    def end_step(self) -> None:
        """Queue the copies of what this step captured now (non-blocking). Optional: a new ``step``
        coordinate, ``after_replay``, ``flush`` and ``close`` do it too."""
        if self.enabled and not self.closed and self._transfer is not None:
            self._transfer.submit()
            self._transfer.poll()
            self._report_modified()

    def _window(self, name: str, t: torch.Tensor, coords: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]] | None:
        """Apply the token window to dim ``token_dim``; ``coords["tokens"]`` gives the rows' first position."""
        win = self.config.tokens
        dim = self.config.token_dim
        if win is None or t.dim() == 0 or not -t.dim() <= dim < t.dim():
            return t, coords  # nothing per-token to slice
        n = t.shape[dim]
        have = coords.get("tokens")
        if have is not None:
            start, end = int(have[0]), int(have[1])
            if end - start != n:
                raise ProbeError(f"{name}: tokens={tuple(have)} spans {end - start} positions but dim {dim} has {n}")
        else:
            start = 0
        lo, hi = max(win[0], start), min(win[1], start + n)
        if lo >= hi:
            return None
        if (lo, hi) != (start, start + n):
            t = t.narrow(dim, lo - start, hi - lo)
        return t, {**coords, "tokens": (lo, hi)}

    def _admit(self, nbytes: int) -> bool:
        """Charge ``nbytes`` to the byte budget; once it is exceeded nothing more is captured."""
        budget = self.config.budget_bytes
        if not self.budget_exhausted and (budget is None or self.stats["captured_bytes"] + nbytes <= budget):
            return True
        if not self.budget_exhausted:
            self.budget_exhausted = True
            self._warn(
                "budget",
                f"probe byte budget of {budget} bytes exhausted after {self.stats['captured']} captures "
                f"({self.stats['captured_bytes']} bytes); capturing stopped, later captures are counted as "
                "dropped in the bundle part's extra",
            )
        self.stats["dropped_captures"] += 1
        self.stats["dropped_bytes"] += nbytes
        return False

    # -- CUDA graphs ----------------------------------------------------------------------------
    def prepare_graphs(self, device: torch.device | str | int | None = None) -> None:
        """Allocate and zero the graph-slot arenas on ``device``; call before capturing a graph."""
        if self.enabled:
            self._graphs.prepare(device)

    @contextmanager
    def graph_scope(self, key: str) -> Iterator[None]:
        """Wrap the capture of one graph (e.g. one per batch size); pass the same key to ``after_replay``."""
        if not self.enabled:
            yield
            return
        with self._graphs.scope(str(key)):
            yield

    def after_replay(self, *, step: int | None = None, graph: str = DEFAULT_GRAPH, **coords: Any) -> None:
        """Read out the graph slots of ``graph`` after one replay, recording them with ``step``/``coords``.

        Call on the stream that replayed the graph, after each replay. Non-blocking.
        """
        if not self.enabled:
            return
        if self.closed:
            raise ProbeError("after_replay on a closed probe session")
        transfer = self._transfer
        assert transfer is not None
        if transfer.staged:  # a replay ends a step: what the eager code around it staged goes now
            transfer.submit()
        groups = self._graphs.groups(str(graph))
        if not groups:
            return
        transfer.poll()
        if transfer.write_errors:
            self._report_write_errors()
        merged = {**self._coords, **coords}
        if step is not None:
            merged["step"] = step
        cfg = self.config
        step_, request = merged.get("step"), merged.get("request")
        passes = cfg.wants_step(step_) and cfg.wants_request(request)
        sampled = passes and cfg.sampled(step_, request)
        if not sampled:  # nothing to copy: the counters say later how many replays were left out
            for _arena, _lo, _hi, slots in groups:
                for s in slots:
                    s.skipped += 1
                self.stats["filtered" if not passes else "sampled_out"] += len(slots)
            return
        for arena, lo, hi, slots in groups:
            wanted: list[GraphSlot] = []
            for s in slots:
                if self._admit(s.nbytes):
                    wanted.append(s)
                    self.stats["captured"] += 1
                    self.stats["captured_bytes"] += s.nbytes
            skipped = [s.skipped for s in slots]
            for s in slots:
                s.skipped = 0
            has_summary = any(s.buf is None for s in slots)
            # one gather kernel: the wanted full slots (16-byte padded), the counters, the summary rows
            pieces = [s.buf for s in wanted if s.buf is not None]
            pieces.append(arena.gen[lo:hi].view(torch.uint8))
            if has_summary:
                pieces.append(arena.summary[lo:hi].reshape(-1).view(torch.uint8))
            gathered = torch.cat(pieces) if len(pieces) > 1 else pieces[0].clone()
            reader = self._reader(str(graph), lo, hi, slots, wanted, skipped, has_summary, merged)
            transfer.to_host([gathered], reader)

    def _reader(
        self,
        graph: str,
        lo: int,
        hi: int,
        slots: list[GraphSlot],
        wanted: list[GraphSlot],
        skipped: list[int],
        has_summary: bool,
        dyn: dict[str, Any],
    ) -> Any:
        def on_ready(hosts: list[torch.Tensor]) -> list[Write]:
            buf = hosts[0]
            data: dict[int, torch.Tensor] = {}
            offset = 0
            for s in wanted:
                if s.buf is not None:
                    data[id(s)] = host_view(buf, s.shape, s.dtype, offset)
                    offset += s.buf.numel()
            gens = host_view(buf, (hi - lo,), torch.int64, offset).tolist()
            offset += 8 * (hi - lo)
            if has_summary:
                rows = host_view(buf, (hi - lo, len(SUMMARY_FIELDS)), torch.float64, offset)
                for s in wanted:
                    if s.buf is None:
                        data[id(s)] = rows[s.index - lo]
            writes = []
            for s, skips in zip(slots, skipped, strict=True):
                fresh, missed = GraphSlots.observe(s, gens[s.index - lo], skips)
                got = data.get(id(s))
                if missed:
                    self.stats["graph_missed_replays"] += missed
                    self._warn(
                        "missed",
                        f"graph {graph!r}, {s.name}: {missed} replay(s) were never read out "
                        "(after_replay was not called after each replay)",
                    )
                if not fresh:
                    self.stats["graph_stale_reads"] += 1
                    self._warn(
                        "stale",
                        f"graph {graph!r}, {s.name}: read without a replay since the last read "
                        "(stale data, not written)",
                    )
                    if got is not None:
                        self.stats["captured"] -= 1
                        self.stats["captured_bytes"] -= s.nbytes
                    continue
                if got is not None:
                    writes.append(Write(s.name, got, s.shard, {**s.coords, **dyn}))
            return writes

        return on_ready

    # -- flushing and closing -------------------------------------------------------------------
    def flush(self) -> None:
        """Block until everything captured so far is in the bundle writer (and its files)."""
        if self.enabled and not self.closed and self._transfer is not None:
            self._transfer.flush()
            if self._transfer.write_errors:
                self._report_write_errors()
            self._report_modified()

    def close(self) -> None:
        """Flush, check the graph counters once more, and write the part (with ``extra["probe"]``)."""
        if not self.enabled or self.closed:
            return
        assert self._transfer is not None
        self._transfer.close()
        for s, n in self._graphs.unread():
            self.stats["graph_unread_replays"] += n
            self._warn(
                "unread", f"graph {s.graph!r}, {s.name}: {n} replay(s) after the last after_replay were never read out"
            )
        if self._transfer.write_errors:
            self._report_write_errors()
        self._report_modified()
        self.closed = True
        self.writer.close(extra={"probe": self.report()})

    def report(self) -> dict[str, Any]:
        """What was captured, dropped and reported, as recorded in the part's ``extra["probe"]``."""
        t = self._transfer
        return {
            "config": self.config.to_dict(),
            "summary_fields": list(SUMMARY_FIELDS),
            "sampling": self.config.sampling(),
            "checksum": f"sum_i word_i*((i mod {CHECKSUM_PERIOD})+1) mod 2**{CHECKSUM_BITS}, "
            "int16 words (int8 for 1-byte dtypes), row-major little-endian",
            **self.stats,
            "budget_bytes": self.config.budget_bytes,
            "budget_exhausted": self.budget_exhausted,
            "graph_slots": self._graphs.count,
            "write_errors": t.write_errors if t else 0,
            "summaries_modified_in_place": t.modified if t else 0,
            "summaries_deferred_names": sorted(t.steady_names) if t else [],
            "summaries_at_once_names": sorted(t.modified_names) if t else [],
            "first_write_error": t.first_error if t else None,
            "max_inflight_bytes": t.max_inflight_bytes if t else 0,
        }

    def _report_write_errors(self) -> None:
        t = self._transfer
        assert t is not None
        self._warn("write", f"{t.write_errors} capture(s) could not be written to the bundle; first: {t.first_error}")

    def _warn(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            warnings.warn(message, ProbeWarning, stacklevel=3)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        if exc_type is None:
            self.close()
        elif self._transfer is not None:  # keep the data files, leave the part incomplete (no part.json)
            self._transfer.close()

    def __repr__(self) -> str:
        state = "disabled" if not self.enabled else ("closed" if self.closed else "open")
        return f"ProbeSession({state}, mode={self.config.mode}, bundle={self.config.bundle!r})"


DISABLED = ProbeSession(ProbeConfig(enabled=False))
_current: ProbeSession = DISABLED


def get_session() -> ProbeSession:
    """The process-wide session (``DISABLED`` until :func:`set_session`)."""
    return _current


def set_session(session: ProbeSession | None) -> ProbeSession:
    """Make ``session`` (``None``: ``DISABLED``) the process-wide session; returns the previous one."""
    global _current
    prev, _current = _current, (session if session is not None else DISABLED)
    return prev


def session_from_env(prefix: str = "VALIDATOR_PROBE_", environ: Mapping[str, str] | None = None) -> ProbeSession:
    """A session configured from environment variables; ``DISABLED`` when they name no bundle."""
    cfg = ProbeConfig.from_env(prefix, environ)
    return ProbeSession(cfg) if cfg.active else DISABLED
