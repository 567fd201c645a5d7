"""Saved quotes: the validated /v1/slo-plan request, the catalog rows it read, and its result.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "quotes",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("idempotency_key", sa.String(length=255), nullable=True),
        sa.Column("request_sha256", sa.String(length=64), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("catalog_snapshot", sa.JSON(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=False),
        sa.Column("calculation_version", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("model", sa.String(length=64), nullable=True),
        sa.Column("feasible", sa.Boolean(), nullable=False),
        sa.Column("cheapest_gpu", sa.String(length=64), nullable=True),
        sa.Column("cheapest_cost_per_hour_usd", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_quotes")),
        # Idempotency: of concurrent creates with one key, exactly one insert wins.
        sa.UniqueConstraint("idempotency_key", name=op.f("uq_quotes_idempotency_key")),
    )
    with op.batch_alter_table("quotes") as batch_op:
        batch_op.create_index(batch_op.f("ix_quotes_created_at"), ["created_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("quotes") as batch_op:
        batch_op.drop_index(batch_op.f("ix_quotes_created_at"))
    op.drop_table("quotes")
