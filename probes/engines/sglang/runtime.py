"""The plugin's state inside one SGLang process: configuration, the bundle part, coordinates, step context.

One :class:`Plugin` per process (set up by :func:`probes.engines.sglang.install.activate`). Its probe session is
created at the first capture, when SGLang's process groups exist: the part is named from them
(``<role>-pp<stage>-tp<rank>[-dp<rank>]``) and every capture carries ``pp_stage``, ``tp_rank``, ``tp_size``.
The step / request context comes from the speculative worker's ``forward_batch_generation``: a prefill
(extend) forward is step 0 of each of its requests, the k-th verify of a request is step k; tensors whose
rows are the batch's requests are split per request (``request`` = SGLang's rid, ``tokens`` = positions).
Shards: K/V and vocabulary slices say which heads / columns a rank holds; every other tensor is the same on
all TP ranks and is recorded as ``replicated(tp_rank, tp_size)`` (reassembly compares the copies); a PP
partial projection is recorded by TP rank 0 of its stage only.

Wrappers never break serving: an exception inside the plugin's own code is counted per point, warned
about once and the SGLang call goes on. Everything that was reached, captured, skipped (inside CUDA graph
capture) or failed is recorded in the part (``extra.probe.sglang``) and the bundle manifest (``run.sglang``).
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from probes.core.capture import ProbeSession, ProbeWarning
from probes.core.config import ProbeConfig, ProbeConfigError, glob_match
from probes.core.shards import ShardSpec

from .heads import HeadLayoutError, kv_head_shard
from .points import POINTS, point_names

__all__ = ["ENV_PREFIX", "Batch", "Plugin", "PluginConfig", "infer_kv_shard"]

ENV_PREFIX = "VALIDATOR_SGLANG_"


@dataclass(frozen=True)
class PluginConfig:
    """``VALIDATOR_SGLANG_*`` variables (the probe session itself is configured by ``VALIDATOR_PROBE_*``)."""

    points: tuple[str, ...] = ()  # selected points (globs); empty = the default points
    required: tuple[str, ...] = ()  # points whose absence stops start-up ("selected" = all selected)
    role: str = ""  # part-name prefix and label, e.g. "prefill" / "decode" / "donly"
    capture_layers: tuple[int, ...] | None = None  # target capture layer ids (default: from SGLang)
    max_forwards: int | None = None  # close the part after this many worker forwards
    pp_keys: tuple[str, ...] = ("*ctx*", "*dspark*", "*aux*")  # pp.send: tensor-dict keys to record
    close_file: str | None = None  # close the part once this file exists (and the rank is idle)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> PluginConfig:
        env = os.environ if environ is None else environ
        known = {"POINTS", "REQUIRED", "ROLE", "CAPTURE_LAYERS", "MAX_FORWARDS", "PP_KEYS", "CLOSE_FILE"}
        kw: dict[str, Any] = {}
        for key, value in env.items():
            if not key.startswith(ENV_PREFIX):
                continue
            short = key[len(ENV_PREFIX) :]
            if short not in known:
                raise ProbeConfigError(
                    f"unknown plugin variable {key}; known: {', '.join(ENV_PREFIX + k for k in sorted(known))}"
                )
            items = tuple(v.strip() for v in value.split(",") if v.strip())
            if short in ("POINTS", "REQUIRED", "PP_KEYS"):
                kw[short.lower()] = items
            elif short == "ROLE":
                kw["role"] = value.strip()
            elif short == "CLOSE_FILE":
                kw["close_file"] = value.strip() or None
            elif short == "CAPTURE_LAYERS":
                try:
                    kw["capture_layers"] = tuple(int(x) for x in items)
                except ValueError:
                    raise ProbeConfigError(f"{key} must be comma-separated layer ids, got {value!r}") from None
            else:
                try:
                    kw["max_forwards"] = int(value) if value.strip() else None
                except ValueError:
                    raise ProbeConfigError(f"{key} must be an integer, got {value!r}") from None
        cfg = cls(**kw)
        for pat in (*cfg.points, *(r for r in cfg.required if r not in ("all", "selected"))):
            if pat not in ("all", "default") and not any(glob_match(pat, n) for n in point_names()):
                raise ProbeConfigError(
                    f"{ENV_PREFIX}POINTS/REQUIRED: {pat!r} matches no capture point; known: {', '.join(point_names())}"
                )
        if cfg.close_file and os.path.exists(cfg.close_file):
            raise ProbeConfigError(f"{ENV_PREFIX}CLOSE_FILE {cfg.close_file} already exists: remove it before starting")
        if cfg.role and not all(c.isalnum() or c in "_-." for c in cfg.role):
            raise ProbeConfigError(f"{ENV_PREFIX}ROLE must be letters, digits, '_', '-', '.', got {cfg.role!r}")
        return cfg

    def selected(self) -> list[str]:
        if not self.points or "default" in self.points:
            base = {p.name for p in POINTS if p.default}
        else:
            base = set()
        for pat in self.points:
            base |= {n for n in point_names() if pat == "all" or glob_match(pat, n)}
        base.add("batch")
        return [n for n in point_names() if n in base]

    def is_required(self, name: str) -> bool:
        if "all" in self.required or "selected" in self.required:
            return True
        return any(glob_match(p, name) for p in self.required)


def infer_kv_shard(local_heads: int, total_heads: int, rank: int, size: int) -> ShardSpec | None:
    """Shard spec of one rank's ``[tokens, local_heads, head_dim]`` K/V, or None when it cannot be told."""
    if size <= 1 or local_heads == total_heads:
        return ShardSpec.replicated(rank, size) if size > 1 else ShardSpec.full()
    try:
        spec = kv_head_shard(rank, size, total_heads)
    except HeadLayoutError:
        return None
    return spec if max(1, total_heads // size) == local_heads else None


@dataclass
class Batch:
    """The requests of the worker forward being run, and each one's step."""

    forward: int
    reqs: list[str]
    steps: list[int]
    extend: bool
    counts: list[int] | None = None  # rows per request (extend lengths) when known
    starts: list[int] | None = None  # first position of each request's rows when known


@dataclass
class _Stats:
    reached: int = 0
    captured: int = 0
    skipped_in_graph: int = 0
    errors: int = 0

    def to_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


def _sglang_coords() -> dict[str, int]:
    """Ranks and sizes from SGLang's process groups (tp, pp; attention-TP and DP when DP attention is on)."""
    from sglang.srt.distributed import parallel_state as ps  # imported only inside a running SGLang

    tp, pp = ps.get_tp_group(), ps.get_pp_group()
    out = {
        "tp_rank": int(tp.rank_in_group),
        "tp_size": int(tp.world_size),
        "pp_stage": int(pp.rank_in_group),
        "pp_size": int(pp.world_size),
    }
    try:  # DP attention: sglang >= 0.5.2x keeps it in runtime_context.get_parallel(), older ones in dp_attention
        try:
            from sglang.srt.runtime_context import get_parallel

            par = get_parallel()
            if getattr(par, "attn_dp_enabled", False):
                out.update(
                    attn_tp_rank=int(par.attn_tp_rank),
                    attn_tp_size=int(par.attn_tp_size),
                    dp_rank=int(par.attn_dp_rank),
                    dp_size=int(par.attn_dp_size),
                )
        except ImportError:
            from sglang.srt.layers import dp_attention as dpa

            if dpa.is_dp_attention_enabled():
                out.update(
                    attn_tp_rank=int(dpa.get_attention_tp_rank()),
                    attn_tp_size=int(dpa.get_attention_tp_size()),
                    dp_rank=int(dpa.get_attention_dp_rank()),
                    dp_size=int(dpa.get_attention_dp_size()),
                )
    except Exception:  # a layout of these modules not known here: plain TP
        pass
    return out


class _Session(ProbeSession):
    """A probe session whose part records the plugin's report next to the probe counters."""

    plugin: Plugin

    def report(self) -> dict[str, Any]:
        return {**super().report(), "sglang": self.plugin.report()}


@dataclass
class Plugin:
    config: ProbeConfig
    cfg: PluginConfig
    statuses: Mapping[str, Any]  # point name -> resolve.PointStatus (static, at start-up)
    version: str
    coords_fn: Callable[[], dict[str, int]] = _sglang_coords
    selected: list[str] = field(default_factory=list)
    wrapped: dict[str, dict[str, str]] = field(default_factory=dict)  # point -> {target: "wrapped" | why not}
    stats: dict[str, _Stats] = field(default_factory=dict)
    session: ProbeSession | None = None
    recorder: Any = None
    closing: bool = False  # close() has begun: nothing new is captured
    closed: bool = False  # close() has ended: the part is written
    batch: Batch | None = None
    forwards: int = 0
    req_steps: dict[str, int] = field(default_factory=dict)
    capture_layers: tuple[int, ...] | None = None
    coverage: dict[str, Any] = field(default_factory=dict)
    first_error: str | None = None
    in_project: bool = False  # inside project_target_hidden (for the hidden_norm pre-hook)
    last_activity: float = 0.0  # time.monotonic() of the last worker forward's end
    _coords: dict[str, int] | None = None
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _pending: list[Callable[[bool], bool]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.selected = self.cfg.selected()
        self.stats = {n: _Stats() for n in self.selected}
        self.capture_layers = self.cfg.capture_layers
        self.coverage = {"sglang_capture": None, "owned": None, "seen": []}

    # -- coordinates and the part ------------------------------------------------------------------
    def coords(self) -> dict[str, int]:
        if self._coords is None:
            try:
                self._coords = self.coords_fn()
            except Exception as exc:  # before SGLang's groups exist: do not cache
                self.note_error("batch", f"process-group coordinates unavailable: {type(exc).__name__}: {exc}")
                return {}
        return self._coords

    def part_name(self) -> str:
        c = self.coords()
        base = self.config.part if self.config.part != "part0" else self.cfg.role
        name = f"pp{c.get('pp_stage', 0)}-tp{c.get('tp_rank', 0)}"
        if c.get("dp_size", 1) > 1:
            name += f"-dp{c['dp_rank']}"
        return f"{base}-{name}" if base else name

    def manifest(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "plugin": "probes.sglang",
            "role": self.cfg.role,
            "capture_layers": list(self.capture_layers) if self.capture_layers else None,
            "points": {
                n: {
                    "selected": n in self.selected,
                    "required": self.cfg.is_required(n),
                    **(self.statuses[n].to_dict() if n in self.statuses else {}),
                }
                for n in point_names()
            },
        }

    def ensure_session(self) -> ProbeSession | None:
        if self.closing:
            return None
        if self.session is None:
            if not self.coords():
                return None
            from probes.core.bundle import BundleWriter

            cfg = self.config.replace(part=self.part_name())
            labels = {"engine": "sglang", "sglang_version": self.version, **dict(cfg.labels)}
            if self.cfg.role:
                labels.setdefault("role", self.cfg.role)
            writer = BundleWriter(
                cfg.bundle,  # type: ignore[arg-type]
                run_name=cfg.run_name,
                labels=labels,
                part=cfg.part,
                manifest={"sglang": self.manifest(), "probe": cfg.sampling()},
            )
            s = _Session(cfg, writer=writer)
            s.plugin = self
            self.session = s
        return self.session

    # -- capturing ---------------------------------------------------------------------------------
    def wants(self, point: str) -> bool:
        return not self.closing and point in self.stats

    def capture(
        self, point: str, name: str, tensor: torch.Tensor, *, shard: ShardSpec | None = None, **coords: Any
    ) -> None:
        st = self.stats[point]
        if tensor.is_cuda and torch.cuda.is_current_stream_capturing() and not self.config.graph_slots:
            st.skipped_in_graph += 1
            return
        s = self.ensure_session()
        if s is None:
            return
        c = self.coords()
        tp_rank, tp_size = c.get("tp_rank", 0), c.get("tp_size", 1)
        if shard is None and tp_size > 1:  # the same tensor on every TP rank: copies, compared on reassembly
            shard = ShardSpec.replicated(tp_rank, tp_size)
        elif shard is not None and shard.kind == "partial" and tp_rank != 0:
            return  # a PP partial sum is the same on every TP rank of the stage: recorded once
        for k in ("pp_stage", "tp_rank", "tp_size"):
            coords.setdefault(k, c.get(k))
        before = s.stats["captured"]
        s.capture(name, tensor, shard=shard, **coords)
        st.captured += s.stats["captured"] - before

    def capture_rows(
        self,
        point: str,
        name: str,
        tensor: torch.Tensor,
        *,
        shard: ShardSpec | None = None,
        counts: Sequence[int] | None = None,
        starts: Sequence[int] | None = None,
        **coords: Any,
    ) -> None:
        """Capture a tensor whose rows (dim 0) are the batch's requests in order, one piece per request."""
        b = self.batch
        n = int(tensor.shape[0]) if tensor.dim() else 0
        if b is None or not b.reqs:
            self.capture(point, name, tensor, shard=shard, **coords)
            return
        counts = list(counts) if counts is not None else b.counts
        if counts is None and n % len(b.reqs) == 0:
            counts = [n // len(b.reqs)] * len(b.reqs)
        starts = list(starts) if starts is not None else b.starts
        if counts is None or len(counts) != len(b.reqs) or sum(counts) != n:
            self.capture(point, name, tensor, shard=shard, forward=b.forward, **coords)
            return
        off = 0
        for i, (rid, cnt) in enumerate(zip(b.reqs, counts)):
            tok = (int(starts[i]), int(starts[i]) + cnt) if starts is not None and i < len(starts) else None
            if cnt:
                self.capture(
                    point,
                    name,
                    tensor.narrow(0, off, cnt),
                    shard=shard,
                    step=b.steps[i],
                    request=rid,
                    tokens=tok,
                    **coords,
                )
            off += cnt

    @contextmanager
    def guard(self, point: str) -> Iterator[None]:
        """Plugin code inside never raises into SGLang: errors are counted and warned about once."""
        try:
            yield
        except Exception as exc:
            self.note_error(point, f"{type(exc).__name__}: {exc}")

    def note_error(self, point: str, message: str) -> None:
        st = self.stats.get(point)
        if st is not None:
            st.errors += 1
        if self.first_error is None:
            self.first_error = f"{point}: {message}"
            warnings.warn(
                f"validator SGLang probe {point}: {message} (counted in the bundle part; serving goes on)",
                ProbeWarning,
                stacklevel=3,
            )

    # -- step context ------------------------------------------------------------------------------
    def begin_batch(self, batch: Any) -> Batch | None:
        """The step context of a worker forward (None when the batch is not a scheduler batch)."""
        reqs = list(getattr(batch, "reqs", None) or [])
        rids = [str(getattr(r, "rid", i)) for i, r in enumerate(reqs)]
        fm = getattr(batch, "forward_mode", None)
        extend = bool(fm.is_extend()) if fm is not None and hasattr(fm, "is_extend") else False
        extend = extend or bool(getattr(batch, "is_extend_in_batch", False) and getattr(batch, "extend_lens", None))
        if extend:
            steps = [0] * len(rids)
            for r in rids:
                self.req_steps.setdefault(r, 0)
            counts = _ints(getattr(batch, "extend_lens", None))
            starts = _ints(getattr(batch, "prefix_lens", None))
            b = Batch(self.forwards, rids, steps, True, counts, starts)
        else:
            steps = []
            for r in rids:
                self.req_steps[r] = self.req_steps.get(r, 0) + 1
                steps.append(self.req_steps[r])
            starts = _ints(getattr(batch, "seq_lens_cpu", None))
            b = Batch(self.forwards, rids, steps, False, None, starts)
        self.batch = b
        return b

    def end_batch(self) -> None:
        self.batch = None
        self.forwards += 1
        self.last_activity = time.monotonic()
        self.poll()
        if self.cfg.max_forwards is not None and self.forwards >= self.cfg.max_forwards:
            self.close()
        elif self.cfg.close_file and os.path.exists(self.cfg.close_file):
            self.close()

    def watch_close_file(self, interval: float = 1.0) -> threading.Thread | None:
        """Close the part from a daemon thread once ``close_file`` exists and no forward ran for ``interval``.

        SGLang ends its scheduler processes with SIGKILL, which runs no exit handler: this (or
        ``max_forwards``) is how a rank's part gets its ``part.json`` after the workload.
        """
        path = self.cfg.close_file
        if not path:
            return None

        def watch() -> None:
            while not self.closing:
                time.sleep(interval)
                idle = self.batch is None and time.monotonic() - self.last_activity >= interval
                if idle and os.path.exists(path):
                    self.close()

        t = threading.Thread(target=watch, name="validator-probe-close-file", daemon=True)
        t.start()
        return t

    # -- deferred work (acceptance copies) --------------------------------------------------------------
    def defer(self, fn: Callable[[bool], bool]) -> None:
        """``fn(block)`` returns True once done; polled after each forward, forced (block=True) at close."""
        self._pending.append(fn)
        self.poll()

    def poll(self, block: bool = False) -> None:
        with self._lock:
            keep = []
            for fn in self._pending:
                try:
                    done = fn(block)
                except Exception as exc:
                    self.note_error("accept", f"{type(exc).__name__}: {exc}")
                    done = True
                if not done:
                    keep.append(fn)
            self._pending = keep

    def acceptance(self) -> Any:
        """This rank's acceptance recorder (one rank per attention-TP group, on the last PP stage), or None."""
        if self.recorder is False or self.closing:
            return None
        if self.recorder is None:
            c = self.coords()
            s = self.ensure_session()
            if not c or s is None:
                return None
            last = c.get("pp_stage", 0) == c.get("pp_size", 1) - 1
            first_tp = c.get("attn_tp_rank", c.get("tp_rank", 0)) == 0
            if not (last and first_tp):
                self.recorder = False
                return None
            from probes.core.acceptance import AcceptanceRecorder

            self.recorder = AcceptanceRecorder.for_writer(s.writer)
        return self.recorder

    # -- report and close --------------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        silent = [
            n
            for n in self.selected
            if n != "batch"
            and self.stats[n].reached == 0
            and any(v == "wrapped" for v in self.wrapped.get(n, {}).values())
        ]
        return {
            **self.manifest(),
            "coords": self.coords() if self._coords is not None else None,
            "wrapped": self.wrapped,
            "stats": {n: s.to_dict() for n, s in self.stats.items()},
            "never_reached": silent,
            "forwards": self.forwards,
            "coverage": {**self.coverage, "capture_layers": list(self.capture_layers) if self.capture_layers else None},
            "first_error": self.first_error,
        }

    def close(self) -> None:
        with self._lock:
            if self.closing:
                return
            self.closing = True
            self.poll(block=True)
            rep = self.report()
            if rep["never_reached"]:
                warnings.warn(
                    f"validator SGLang probes: capture point(s) {rep['never_reached']} were wrapped but never "
                    "reached in this process",
                    ProbeWarning,
                    stacklevel=2,
                )
            if self.recorder:
                self.recorder.close()
            if self.session is not None:
                self.session.close()
            self.closed = True


def _ints(x: Any) -> list[int] | None:
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        return [int(v) for v in x.tolist()]
    try:
        return [int(v) for v in x]
    except TypeError:
        return None
