"""SQLAlchemy 2 models. Alembic's env.py reads only this metadata; every change is a migration."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, DateTime, ForeignKey, Index, Integer, String, UniqueConstraint, func
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

__all__ = ["Base", "Run", "RunLabel", "Tensor", "Blob", "Artifact", "Upload", "ComparisonRecord"]


class Base(DeclarativeBase):
    pass


class Blob(Base):
    """Content-addressed bytes: one row per distinct sha256, whatever the number of runs using it."""

    __tablename__ = "blobs"
    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    nbytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class Run(Base):
    __tablename__ = "runs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    # 'complete' runs are visible; 'pending' ones are being uploaded (never listed or compared).
    status: Mapped[str] = mapped_column(String(16), default="pending", index=True)
    source: Mapped[str] = mapped_column(String(32), default="bundle")
    manifest: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    n_tensors: Mapped[int] = mapped_column(Integer, default=0)
    total_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())

    labels: Mapped[list[RunLabel]] = relationship(back_populates="run", cascade="all, delete-orphan", lazy="selectin")
    tensors: Mapped[list[Tensor]] = relationship(back_populates="run", cascade="all, delete-orphan", lazy="raise")
    artifacts: Mapped[list[Artifact]] = relationship(cascade="all, delete-orphan", lazy="selectin")

    def label_dict(self) -> dict[str, str]:
        return {lb.key: lb.value for lb in self.labels}


class RunLabel(Base):
    __tablename__ = "run_labels"
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    key: Mapped[str] = mapped_column(String(100), primary_key=True)
    value: Mapped[str] = mapped_column(String(500))
    run: Mapped[Run] = relationship(back_populates="labels")
    __table_args__ = (Index("ix_run_labels_key_value", "key", "value"),)


class Tensor(Base):
    """One stored shard of a logical tensor."""

    __tablename__ = "tensors"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(256))
    # canonical JSON of coords + shard: unique per run and name
    slot: Mapped[str] = mapped_column(String(1000))
    coords: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    shard: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    dtype: Mapped[str] = mapped_column(String(32))
    shape: Mapped[list[int]] = mapped_column(JSON)
    sha256: Mapped[str] = mapped_column(ForeignKey("blobs.sha256"), index=True)
    nbytes: Mapped[int] = mapped_column(BigInteger)
    run: Mapped[Run] = relationship(back_populates="tensors")
    __table_args__ = (UniqueConstraint("run_id", "name", "slot", name="uq_tensors_run_name_slot"),)


class Artifact(Base):
    """Other content of a run: acceptance records (Parquet), eval results (JSON)."""

    __tablename__ = "artifacts"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    sha256: Mapped[str] = mapped_column(ForeignKey("blobs.sha256"))
    nbytes: Mapped[int] = mapped_column(BigInteger)
    __table_args__ = (UniqueConstraint("run_id", "kind", name="uq_artifacts_run_kind"),)


class Upload(Base):
    """A bundle file received for a pending run (stored as a blob; names validated, never used as paths)."""

    __tablename__ = "uploads"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    part: Mapped[str] = mapped_column(String(64))
    filename: Mapped[str] = mapped_column(String(64))
    sha256: Mapped[str] = mapped_column(ForeignKey("blobs.sha256"))
    nbytes: Mapped[int] = mapped_column(BigInteger)
    __table_args__ = (UniqueConstraint("run_id", "part", "filename", name="uq_uploads_run_part_file"),)


class ComparisonRecord(Base):
    """A comparison computed once and cached under a key of its inputs."""

    __tablename__ = "comparisons"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(64), unique=True)
    request: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16))  # queued | running | done | error
    verdict: Mapped[str | None] = mapped_column(String(16), nullable=True)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    error: Mapped[str | None] = mapped_column(String(2000), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
