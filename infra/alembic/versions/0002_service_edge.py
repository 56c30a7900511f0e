"""service edge: job owner (API key) and the S3 event dedup table

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 15:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("api_key_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True))
        batch.create_foreign_key(
            op.f("fk_jobs_api_key_id_api_keys"), "api_keys", ["api_key_id"], ["id"], ondelete="SET NULL"
        )
        batch.create_index(op.f("ix_jobs_api_key_id"), ["api_key_id"], unique=False)
    op.create_table(
        "s3_events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("dedup_key", sa.String(length=64), nullable=False),
        sa.Column("bucket", sa.String(length=255), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("version", sa.String(length=1024), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_s3_events_job_id_jobs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_s3_events")),
        sa.UniqueConstraint("dedup_key", name=op.f("uq_s3_events_dedup_key")),
    )
    op.create_index(op.f("ix_s3_events_job_id"), "s3_events", ["job_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_s3_events_job_id"), table_name="s3_events")
    op.drop_table("s3_events")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index(op.f("ix_jobs_api_key_id"))
        batch.drop_constraint(op.f("fk_jobs_api_key_id_api_keys"), type_="foreignkey")
        batch.drop_column("api_key_id")
