"""Settings: one object, built by the application entry point and passed down (never at import time)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from validator.errors import InputError

__all__ = ["Settings", "parse_labels"]


def parse_labels(items: list[str] | tuple[str, ...] | None) -> dict[str, str]:
    """``["model=kimi-k3", "tp=4"]`` -> ``{"model": "kimi-k3", "tp": "4"}`` (CLI options, query strings)."""
    out = {}
    for item in items or []:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise InputError(f"label {item!r} must be KEY=VALUE")
        out[k] = v
    return out


def _int(env: dict[str, str], key: str, default: int) -> int:
    v = env.get(key)
    return int(v) if v else default


def _float(env: dict[str, str], key: str, default: float) -> float:
    v = env.get(key)
    try:
        return float(v) if v else default
    except ValueError:
        raise InputError(f"{key}={v!r} is not a number") from None


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
    # for as long, is deleted with its uploads and the blobs only it held (validator.store.expiry)
    pending_expiry_hours: float = 7 * 24.0
    # where background comparisons measure their pairs: "local" (this process), "ray" or "ray=HOST:PORT"
    # (a Ray cluster whose workers reach the blob store; validator.ray_executor, docs/ray.md)
    compare_executor: str = "local"

    def __post_init__(self) -> None:
        if not 0 < self.pending_expiry_hours <= 1e6:  # beyond, dates overflow
            raise InputError(
                f"pending_expiry_hours (VALIDATOR_PENDING_EXPIRY_HOURS) must be a number of hours above 0 and at most "
                f"1e6, not {self.pending_expiry_hours!r}"
            )

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
        env = dict(os.environ) if env is None else env
        h = home or env.get("VALIDATOR_HOME") or str(Path.home() / ".validator")
        tokens = tuple(t.strip() for t in env.get("VALIDATOR_TOKENS", "").split(",") if t.strip())
        return cls(
            home=Path(h).expanduser(),
            database_url=env.get("VALIDATOR_DATABASE_URL") or None,
            blob_url=env.get("VALIDATOR_BLOB_URL") or None,
            tokens=tokens,
            protect_reads=env.get("VALIDATOR_PROTECT_READS", "") in ("1", "true", "yes"),
            max_upload_bytes=_int(env, "VALIDATOR_MAX_UPLOAD_BYTES", 64 << 30),
            pending_expiry_hours=_float(env, "VALIDATOR_PENDING_EXPIRY_HOURS", 7 * 24.0),
            compare_executor=env.get("VALIDATOR_COMPARE_EXECUTOR") or "local",
        )
