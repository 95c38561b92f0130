"""Initial schema: runs, labels, blobs, tensors, artifacts.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "blobs",
        sa.Column("sha256", sa.String(64), primary_key=True),
        sa.Column("nbytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("source", sa.String(32), nullable=False),
        sa.Column("manifest", sa.JSON(), nullable=False),
        sa.Column("n_tensors", sa.Integer(), nullable=False),
        sa.Column("total_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    )
    op.create_index("ix_runs_status", "runs", ["status"])
    op.create_table(
        "run_labels",
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("key", sa.String(100), primary_key=True),
        sa.Column("value", sa.String(500), nullable=False),
    )
    op.create_index("ix_run_labels_key_value", "run_labels", ["key", "value"])
    op.create_table(
        "tensors",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("slot", sa.String(1000), nullable=False),
        sa.Column("coords", sa.JSON(), nullable=False),
        sa.Column("shard", sa.JSON(), nullable=False),
        sa.Column("dtype", sa.String(32), nullable=False),
        sa.Column("shape", sa.JSON(), nullable=False),
        sa.Column("sha256", sa.String(64), sa.ForeignKey("blobs.sha256"), nullable=False),
        sa.Column("nbytes", sa.BigInteger(), nullable=False),
        sa.UniqueConstraint("run_id", "name", "slot", name="uq_tensors_run_name_slot"),
    )
    op.create_index("ix_tensors_run_id", "tensors", ["run_id"])
    op.create_index("ix_tensors_sha256", "tensors", ["sha256"])
    op.create_table(
        "artifacts",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("sha256", sa.String(64), sa.ForeignKey("blobs.sha256"), nullable=False),
        sa.Column("nbytes", sa.BigInteger(), nullable=False),
        sa.UniqueConstraint("run_id", "kind", name="uq_artifacts_run_kind"),
    )
    op.create_index("ix_artifacts_run_id", "artifacts", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_artifacts_run_id", table_name="artifacts")
    op.drop_table("artifacts")
    op.drop_index("ix_tensors_sha256", table_name="tensors")
    op.drop_index("ix_tensors_run_id", table_name="tensors")
    op.drop_table("tensors")
    op.drop_index("ix_run_labels_key_value", table_name="run_labels")
    op.drop_table("run_labels")
    op.drop_index("ix_runs_status", table_name="runs")
    op.drop_table("runs")
    op.drop_table("blobs")
