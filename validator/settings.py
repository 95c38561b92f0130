"""Settings: one object, built by the application entry point and passed down (never at import time)."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from validator.errors import InputError

__all__ = [
    "ClientSettings", "ExecutorSettings", "ExecutorSpec", "Settings", "check_blob_url", "check_database_url", "check_executor",
    "parse_executor", "parse_labels", "ray_hostport",
]


# -- the executor setting (--executor, VALIDATOR_COMPARE_EXECUTOR): its syntax only, neither Ray nor torch ------


@dataclass(frozen=True)
class ExecutorSpec:
    """Where a comparison measures its pairs: ``local`` (this process) or ``ray`` (``address`` None: the
    cluster of ``RAY_ADDRESS`` or of this machine)."""

    kind: str = "local"
    address: str | None = None

    def __str__(self) -> str:
        return self.kind if self.address is None else f"{self.kind}={self.address}"


def parse_executor(text: str | None) -> ExecutorSpec:
    """``local``, ``ray`` or ``ray=ADDRESS`` (``HOST:PORT`` of the head's GCS, or ``ray://HOST:PORT``)."""
    if not text or text == "local":
        return ExecutorSpec()
    kind, sep, address = text.partition("=")
    if kind != "ray" or (sep and not address.strip()):
        raise InputError(f"executor {text[:200]!r}: use local, ray or ray=ADDRESS (HOST:PORT of the Ray head, or ray://HOST:PORT)")
    if sep:
        ray_hostport(address.strip())
    return ExecutorSpec("ray", address.strip() or None)


# a DNS name or IPv4 address (at most 253 characters, labels of at most 63), or an IPv6 address in brackets
_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_IPV6 = re.compile(r"\[[0-9A-Fa-f:.]{2,45}\]")


def _good_host(host: str) -> bool:
    if _IPV6.fullmatch(host):
        return True
    return 0 < len(host) <= 253 and all(_LABEL.fullmatch(label) for label in host.removesuffix(".").split("."))


def ray_hostport(address: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``ray://HOST:PORT`` -> (host, port); anything else is an :class:`InputError`."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not _good_host(host) or not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError(
            f"Ray address {address[:200]!r}{'...' if len(address) > 200 else ''}: use HOST:PORT (the head's GCS port, "
            "6379 by default) or ray://HOST:PORT, HOST a name or IP address"
        )
    return host.strip("[]"), int(port)


def parse_labels(items: list[str] | tuple[str, ...] | None) -> dict[str, str]:
    """``["model=kimi-k3", "tp=4"]`` -> ``{"model": "kimi-k3", "tp": "4"}`` (CLI options, query strings)."""
    out = {}
    for item in items or []:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise InputError(f"label {item!r} must be KEY=VALUE")
        out[k] = v
    return out


_MAX_INT64 = (1 << 63) - 1
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def _int(env: dict[str, str], key: str, default: int, *, low: int = 1, high: int = _MAX_INT64) -> int:
    v = env.get(key, "").strip()
    if not v:
        return default
    try:
        n = int(v)
    except ValueError:
        raise InputError(f"{key}={v!r:.60} is not a whole number (e.g. {default})") from None
    if not low <= n <= high:
        raise InputError(f"{key}={v!r:.60} is out of range: it must be between {low} and {high}")
    return n


def _float(env: dict[str, str], key: str, default: float) -> float:
    v = env.get(key, "").strip()
    try:
        x = float(v) if v else default
    except ValueError:
        raise InputError(f"{key}={v!r:.60} is not a number") from None
    if not math.isfinite(x):
        raise InputError(f"{key}={v!r:.60} is not a finite number")
    return x


def _bool(env: dict[str, str], key: str) -> bool:
    v = env.get(key, "").strip().lower()
    if v not in _TRUE + _FALSE:
        raise InputError(f"{key}={env[key]!r:.60} is not a yes or no (use 1, true, yes or on; 0, false, no or off)")
    return v in _TRUE


def _hide_password(url: str) -> str:
    return re.sub(r"://[^@/]*@", "://***@", url)


def check_database_url(url: str, name: str) -> None:
    """A SQLAlchemy URL whose dialect and driver load (no connection is made); the InputError names ``name``
    (the variable or option) and never shows a password."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    shown = _hide_password(url)
    try:
        dialect = make_url(url).get_dialect()
    except NoSuchModuleError:  # a subclass of ArgumentError
        scheme = url.partition("://")[0]
        raise InputError(f"{name}={shown!r:.200}: no database dialect {scheme!r:.60} (use postgresql://... or sqlite:///...)") from None
    except ArgumentError:
        raise InputError(f"{name}={shown!r:.200} is not a database URL (e.g. postgresql://USER:PASSWORD@HOST/DB or sqlite:///PATH)") from None
    try:
        dialect.import_dbapi()
    except ImportError as exc:
        raise InputError(f"{name}={shown!r:.200}: its database driver is not installed ({exc})") from None


def check_blob_url(url: str, name: str) -> None:
    """``file://PATH`` or ``s3://BUCKET[/PREFIX][?endpoint=URL&region=R]`` (validator.store.blob_url), by syntax."""
    if url.startswith("file://"):
        if not url[len("file://") :]:
            raise InputError(f"{name}={_hide_password(url)!r:.200}: file:// needs a path (file:///srv/blobs)")
    elif url.startswith("s3://"):
        if not urlsplit(url).netloc:
            raise InputError(f"{name}={_hide_password(url)!r:.200}: needs a bucket (s3://BUCKET/PREFIX)")
    else:
        raise InputError(f"{name}={_hide_password(url)!r:.200} is not a blob store URL (use file://PATH or s3://BUCKET/PREFIX)")


def check_executor(text: str, name: str) -> None:
    """``local``, ``ray`` or ``ray=ADDRESS`` (:func:`parse_executor`: syntax only, no Ray)."""
    try:
        parse_executor(text)
    except InputError as exc:
        raise InputError(f"{name}: {exc}") from None


def _check_home(home: Path, name: str) -> None:
    if home.exists() and not home.is_dir():
        raise InputError(f"{name}={str(home)!r:.200} is not a directory (the store's home: a directory, made if missing)")


@dataclass(frozen=True)
class Settings:
    """Where the store lives, and how the service guards it.

    ``home`` holds the embedded default: ``validator.db`` (SQLite, WAL), ``blobs/`` (content-addressed
    tensor bytes) and ``staging/`` (uploads in progress). ``database_url`` overrides the database with
    any SQLAlchemy URL (PostgreSQL in production).
    """

    home: Path
    database_url: str | None = None
    blob_url: str | None = None  # None: blobs/ under home; s3://BUCKET/PREFIX?endpoint=URL for object storage
    tokens: tuple[str, ...] = field(default=(), repr=False)  # bearer tokens accepted by mutating routes
    protect_reads: bool = False  # also require a token on GET routes
    max_upload_bytes: int = 64 << 30  # per uploaded file
    max_json_bytes: int = 1 << 20  # request bodies that are JSON
    # a pending run (uploaded, never finalized) created this long ago, none of whose files received a byte
    # for as long, is deleted with its uploads and the blobs only it held (validator.service.expiry)
    pending_expiry_hours: float = 7 * 24.0
    # where background comparisons measure their pairs: "local" (this process), "ray" or "ray=HOST:PORT"
    # (a Ray cluster whose workers reach the blob store; validator.executors, docs/ray.md)
    compare_executor: str = "local"

    def __post_init__(self) -> None:
        """Every field checked (from_env names the variable first; a ``--db`` arrives here by ``replace``)."""
        if not 0 < self.pending_expiry_hours <= 1e6:  # beyond, dates overflow
            raise InputError(
                f"pending_expiry_hours (VALIDATOR_PENDING_EXPIRY_HOURS) must be a number of hours above 0 and at most "
                f"1e6, not {self.pending_expiry_hours!r}"
            )
        for key, n in (("max_upload_bytes", self.max_upload_bytes), ("max_json_bytes", self.max_json_bytes)):
            if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= _MAX_INT64:
                raise InputError(f"{key} must be a whole number of bytes from 1 to {_MAX_INT64}, not {n!r:.60}")
        if self.database_url:
            check_database_url(self.database_url, "--db")  # from_env has checked the variable
        if self.blob_url:
            check_blob_url(self.blob_url, "VALIDATOR_BLOB_URL")
        if self.compare_executor != "local":
            check_executor(self.compare_executor, "VALIDATOR_COMPARE_EXECUTOR")

    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'validator.db'}"

    @property
    def blob_dir(self) -> Path:
        return self.home / "blobs"

    @property
    def cache_dir(self) -> Path:
        return self.home / "cache"

    @property
    def staging_dir(self) -> Path:
        return self.home / "staging"

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, *, home: str | None = None) -> Settings:
        """Settings from ``VALIDATOR_*`` variables (``home``: the ``--home`` option). A bad value is an InputError
        (exit 2, HTTP server refused at start) naming the variable and the problem (docs/reliability.md)."""
        env = dict(os.environ) if env is None else env
        h = Path(home or env.get("VALIDATOR_HOME") or str(Path.home() / ".validator")).expanduser()
        _check_home(h, "--home" if home else "VALIDATOR_HOME")
        tokens = tuple(t.strip() for t in env.get("VALIDATOR_TOKENS", "").split(",") if t.strip())
        database_url = env.get("VALIDATOR_DATABASE_URL", "").strip() or None
        if database_url:
            check_database_url(database_url, "VALIDATOR_DATABASE_URL")
        blob_url = env.get("VALIDATOR_BLOB_URL", "").strip() or None
        if blob_url:
            check_blob_url(blob_url, "VALIDATOR_BLOB_URL")
        executor = env.get("VALIDATOR_COMPARE_EXECUTOR", "").strip() or "local"
        if executor != "local":
            check_executor(executor, "VALIDATOR_COMPARE_EXECUTOR")
        return cls(
            home=h,
            database_url=database_url,
            blob_url=blob_url,
            tokens=tokens,
            protect_reads=_bool(env, "VALIDATOR_PROTECT_READS"),
            max_upload_bytes=_int(env, "VALIDATOR_MAX_UPLOAD_BYTES", 64 << 30),
            pending_expiry_hours=_float(env, "VALIDATOR_PENDING_EXPIRY_HOURS", 7 * 24.0),
            compare_executor=executor,
        )


RANGE_BYTES = 1 << 30  # a pair holding more bytes (A's and B's shards) is measured on Ray in ranges of at most this many


@dataclass(frozen=True)
class ExecutorSettings:
    """What the Ray executor takes from the environment (docs/ray.md): ``RAY_ADDRESS``, the cluster ``--executor
    ray`` connects to when it names none (None: the cluster of this machine), and ``VALIDATOR_RAY_RANGE_BYTES``,
    the bytes (A's and B's shards) above which a pair is measured in ranges (None: never split; default
    :data:`RANGE_BYTES`)."""

    ray_address: str | None = None
    range_bytes: int | None = RANGE_BYTES

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> ExecutorSettings:
        env = dict(os.environ) if env is None else env
        text = env.get("VALIDATOR_RAY_RANGE_BYTES", "").strip()
        range_bytes: int | None = RANGE_BYTES
        if text:
            try:
                value = int(text)
            except ValueError:
                value = -1
            if value < 0:
                raise InputError(f"VALIDATOR_RAY_RANGE_BYTES={text!r:.60}: use a number of bytes (0: never split a pair)")
            range_bytes = value or None
        return cls(ray_address=env.get("RAY_ADDRESS", "").strip() or None, range_bytes=range_bytes)


@dataclass(frozen=True)
class ClientSettings:
    """What the CLI takes from the environment besides the store's settings: ``VALIDATOR_SERVER`` (work against
    a validator server at this URL, the ``--server`` default), ``VALIDATOR_TOKEN`` (its bearer token, the
    ``--token`` default), ``VALIDATOR_DEBUG`` (any non-empty value: an internal error prints its traceback) and
    ``GITHUB_STEP_SUMMARY`` (the file a GitHub Actions step's summary is appended to: ``validator gate``
    appends its Markdown there)."""

    server: str | None = None
    token: str | None = field(default=None, repr=False)
    debug: bool = False
    step_summary: str | None = None

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> ClientSettings:
        env = dict(os.environ) if env is None else env
        return cls(
            server=env.get("VALIDATOR_SERVER") or None,
            token=env.get("VALIDATOR_TOKEN") or None,
            debug=bool(env.get("VALIDATOR_DEBUG")),
            step_summary=env.get("GITHUB_STEP_SUMMARY") or None,
        )
