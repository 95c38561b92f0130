"""Settings: one object, built by the application entry point and passed down (never at import time)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Settings"]


@dataclass(frozen=True)
class Settings:
    """Where the store lives.

    ``home`` holds the embedded default: ``validator.db`` (SQLite, WAL) and ``blobs/`` (content-addressed
    tensor bytes). ``database_url`` overrides the database with any SQLAlchemy URL (PostgreSQL in
    production).
    """

    home: Path
    database_url: str | None = None

    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'validator.db'}"

    @property
    def blob_dir(self) -> Path:
        return self.home / "blobs"

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, *, home: str | None = None) -> Settings:
        env = dict(os.environ) if env is None else env
        h = home or env.get("VALIDATOR_HOME") or str(Path.home() / ".validator")
        return cls(home=Path(h).expanduser(), database_url=env.get("VALIDATOR_DATABASE_URL") or None)
