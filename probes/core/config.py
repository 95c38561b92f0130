"""Probe configuration: what to capture, how, and how much. Pure Python (no torch).

A :class:`ProbeConfig` is built in code, from a dict (``ProbeConfig.from_dict``) or from environment
variables (``ProbeConfig.from_env(prefix="VALIDATOR_PROBE_")``: one variable per field, upper case,
e.g. ``VALIDATOR_PROBE_BUNDLE=/data/run1 VALIDATOR_PROBE_MODE=summary VALIDATOR_PROBE_STEPS=0-3,10``).
Unknown keys are refused, so a misspelt variable fails loudly instead of being ignored.

Name patterns (``names`` here, ``patterns`` in :func:`probes.core.hooks.attach`) are dotted globs: ``*``
matches within one dot-separated component, ``**`` matches any run of characters including dots, ``?``
one character that is not a dot. ``layers.*.mlp`` matches ``layers.3.mlp`` but not ``layers.3.mlp.up``;
``**.mlp.output`` matches the MLP output of every layer.
"""

from __future__ import annotations

import dataclasses
import os
import re
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

__all__ = ["ProbeConfig", "ProbeConfigError", "glob_match", "parse_bytes"]

Mode = Literal["full", "summary"]
Drain = Literal["thread", "inline"]
_MODES = ("full", "summary")
_DRAINS = ("thread", "inline")


class ProbeConfigError(ValueError):
    """A probe configuration that cannot be valid."""


@lru_cache(maxsize=1024)
def _glob_regex(pattern: str) -> re.Pattern[str]:
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^.]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^.]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out))


def glob_match(pattern: str, name: str) -> bool:
    """Dotted glob match of the whole name (see the module docstring)."""
    return _glob_regex(pattern).fullmatch(name) is not None


_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}


def parse_bytes(value: Any) -> int | None:
    """``1048576``, ``"512MiB"``, ``"2GB"`` -> bytes; ``None``/``"none"``/``"unlimited"`` -> no limit."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ProbeConfigError(f"byte budget must be a size, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ProbeConfigError(f"byte budget must be >= 0, got {value}")
        return value
    text = str(value).strip().lower()
    if text in ("none", "unlimited", "inf"):
        return None
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)\s*([a-z]*)", text)
    if not m or m.group(2) not in _UNITS:
        raise ProbeConfigError(f"cannot parse byte size {value!r}; expected e.g. 1048576, '512MiB', '2GB'")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def _parse_bool(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ProbeConfigError(f"{key} must be a boolean (1/0, true/false), got {value!r}")


def _parse_int(value: Any, key: str) -> int:
    if isinstance(value, bool):
        raise ProbeConfigError(f"{key} must be an integer, got {value!r}")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ProbeConfigError(f"{key} must be an integer, got {value!r}") from None


def _split(value: Any) -> list[Any]:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, Iterable):
        return list(value)
    return [value]


def _parse_steps(value: Any) -> tuple[tuple[int, int], ...]:
    """``"0-3,10"`` / ``[0, 1, [5, 8]]`` -> inclusive ranges ``((0, 3), (10, 10))``."""
    ranges = []
    for item in _split(value):
        if isinstance(item, (list, tuple)) and len(item) == 2:
            lo, hi = _parse_int(item[0], "steps"), _parse_int(item[1], "steps")
        elif isinstance(item, str) and re.fullmatch(r"[0-9]+\s*-\s*[0-9]+", item):
            lo, hi = (int(x) for x in item.split("-"))
        else:
            lo = hi = _parse_int(item, "steps")
        if lo < 0 or hi < lo:
            raise ProbeConfigError(f"bad step range {item!r}: expected 0 <= first <= last")
        ranges.append((lo, hi))
    return tuple(ranges)


def _parse_tokens(value: Any) -> tuple[int, int]:
    """``"0:64"`` / ``"0-64"`` / ``[0, 64]`` -> half-open ``(0, 64)``."""
    if isinstance(value, str):
        parts = re.split(r"[:\-]", value.strip())
    else:
        parts = list(value)
    if len(parts) != 2:
        raise ProbeConfigError(f"token window must be 'start:end', got {value!r}")
    lo, hi = _parse_int(parts[0], "tokens"), _parse_int(parts[1], "tokens")
    if not 0 <= lo < hi:
        raise ProbeConfigError(f"token window {value!r} must satisfy 0 <= start < end")
    return (lo, hi)


def _parse_labels(value: Any) -> dict[str, str]:
    if isinstance(value, Mapping):
        return {str(k): str(v) for k, v in value.items()}
    out = {}
    for item in _split(value):
        k, sep, v = str(item).partition("=")
        if not sep or not k.strip():
            raise ProbeConfigError(f"labels must be 'key=value,...', got {value!r}")
        out[k.strip()] = v.strip()
    return out


@dataclass(frozen=True)
class ProbeConfig:
    """Everything a :class:`probes.core.capture.ProbeSession` needs to know. See ``docs/probes.md``."""

    bundle: str | None = None  # bundle directory; no bundle -> the session is disabled
    run_name: str | None = None
    part: str = "part0"  # one part per rank, e.g. "pp3-tp1"
    labels: Mapping[str, str] = field(default_factory=dict)
    enabled: bool = True
    mode: Mode = "full"  # "full": the tensor; "summary": 5 statistics computed on the device
    names: tuple[str, ...] | None = None  # dotted globs; None = every name
    steps: tuple[tuple[int, int], ...] | None = None  # inclusive step ranges; None = every step
    requests: frozenset[str] | None = None  # request ids; None = every request
    tokens: tuple[int, int] | None = None  # half-open token window applied to dim ``token_dim``
    token_dim: int = 0
    budget_bytes: int | None = 1 << 30  # bytes stored (pinned buffers in flight included); None = no limit
    snapshot: bool = True  # copy on the serving stream first (safe against later in-place updates)
    drain: Drain = "thread"  # who writes completed copies to the bundle
    graph_slots: bool = False  # allow capture points inside CUDA graph capture
    max_graph_slots: int = 1024  # per device
    summary_chunk: int = 1 << 24  # elements per reduction chunk (bounds summary temporaries, ~9 B each)
    defer_summaries: bool = False  # eager CUDA summaries at the end of the step, all together (docs/probes.md)
    step_every: int = 1  # sampling: only steps with step % step_every == 0
    request_every: int = 1  # sampling: only requests with crc32(id) % request_every == 0

    def __post_init__(self) -> None:
        if self.mode not in _MODES:
            raise ProbeConfigError(f"mode must be one of {_MODES}, got {self.mode!r}")
        if self.drain not in _DRAINS:
            raise ProbeConfigError(f"drain must be one of {_DRAINS}, got {self.drain!r}")
        if self.budget_bytes is not None and self.budget_bytes < 0:
            raise ProbeConfigError("budget_bytes must be >= 0 or None")
        if self.max_graph_slots < 1 or self.summary_chunk < 1:
            raise ProbeConfigError("max_graph_slots and summary_chunk must be >= 1")
        if self.step_every < 1 or self.request_every < 1:
            raise ProbeConfigError("step_every and request_every must be >= 1")
        if self.tokens is not None and not 0 <= self.tokens[0] < self.tokens[1]:
            raise ProbeConfigError(f"token window {self.tokens!r} must satisfy 0 <= start < end")

    @property
    def active(self) -> bool:
        """True when a session built from this config captures anything at all."""
        return self.enabled and self.bundle is not None

    def replace(self, **changes: Any) -> ProbeConfig:
        return dataclasses.replace(self, **changes)

    # -- matching ---------------------------------------------------------------------------------
    def wants_name(self, name: str) -> bool:
        return self.names is None or any(glob_match(p, name) for p in self.names)

    @property
    def selects(self) -> bool:
        """Does a step, request or sampling rule apply? If not, every capture passes :meth:`wants_step`,
        :meth:`wants_request` and :meth:`sampled` (a session then skips them)."""
        return self.steps is not None or self.requests is not None or self.step_every > 1 or self.request_every > 1

    def wants_step(self, step: int | None) -> bool:
        if self.steps is None:
            return True
        return step is not None and any(lo <= step <= hi for lo, hi in self.steps)

    def wants_request(self, request: Any) -> bool:
        return self.requests is None or (request is not None and str(request) in self.requests)

    def sampled(self, step: int | None, request: Any) -> bool:
        """Sampling for always-on use: every ``step_every``-th step (``step % step_every == 0``) and the
        requests whose id hashes to 0 modulo ``request_every`` (``zlib.crc32`` of the UTF-8 id: the same
        requests on every rank and in every run). A missing coordinate does not match while its rate is > 1."""
        if self.step_every > 1 and (step is None or int(step) % self.step_every):
            return False
        if self.request_every > 1:
            return request is not None and zlib.crc32(str(request).encode()) % self.request_every == 0
        return True

    def sampling(self) -> dict[str, Any]:
        """What a session with this config records: the bundle manifest's ``run.probe`` and each part's
        ``extra["probe"]["sampling"]`` (see docs/bundle-format.md)."""
        d = self.to_dict()
        keys = ("mode", "names", "steps", "step_every", "requests", "request_every", "tokens", "token_dim")
        out = {k: d[k] for k in keys}
        out["request_rule"] = "zlib.crc32(request id as UTF-8) % request_every == 0"
        out["step_rule"] = "step % step_every == 0"
        return out

    # -- construction from plain data -------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ProbeConfig:
        """Build from a dict of field names to values (strings are parsed as the env form)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - fields)
        if unknown:
            raise ProbeConfigError(f"unknown probe setting(s) {unknown}; known: {sorted(fields)}")
        kw: dict[str, Any] = {}
        for key, value in d.items():
            if value is None:
                kw[key] = None
            elif key in ("bundle", "run_name", "part"):
                kw[key] = str(value)
            elif key in ("mode", "drain"):
                kw[key] = str(value).strip().lower()
            elif key in ("enabled", "snapshot", "graph_slots", "defer_summaries"):
                kw[key] = _parse_bool(value, key)
            elif key in ("token_dim", "max_graph_slots", "summary_chunk", "step_every", "request_every"):
                kw[key] = _parse_int(value, key)
            elif key == "labels":
                kw[key] = _parse_labels(value)
            elif key == "names":
                kw[key] = tuple(str(p) for p in _split(value))
            elif key == "steps":
                kw[key] = _parse_steps(value)
            elif key == "requests":
                kw[key] = frozenset(str(r) for r in _split(value))
            elif key == "tokens":
                kw[key] = _parse_tokens(value)
            elif key == "budget_bytes":
                kw[key] = parse_bytes(value)
        return cls(**kw)

    @classmethod
    def from_env(cls, prefix: str = "VALIDATOR_PROBE_", environ: Mapping[str, str] | None = None) -> ProbeConfig:
        """Build from ``<prefix><FIELD>`` variables; ``<prefix>BUDGET`` is accepted for ``budget_bytes``."""
        env = os.environ if environ is None else environ
        fields = {f.name.upper(): f.name for f in dataclasses.fields(cls)}
        fields["BUDGET"] = "budget_bytes"
        d: dict[str, Any] = {}
        for key, value in env.items():
            if not key.startswith(prefix):
                continue
            short = key[len(prefix) :]
            if short not in fields:
                raise ProbeConfigError(
                    f"unknown probe variable {key}; known: {', '.join(prefix + k for k in sorted(fields))}"
                )
            d[fields[short]] = value
        return cls.from_dict(d)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (recorded in the bundle part's ``extra``)."""
        d = dataclasses.asdict(self)
        d["labels"] = dict(self.labels)
        d["requests"] = None if self.requests is None else sorted(self.requests)
        for k in ("names", "steps", "tokens"):
            if d[k] is not None:
                d[k] = [list(x) if isinstance(x, tuple) else x for x in d[k]]
        return d
