"""Quotes: an Idempotency-Key is one API key's, unique per key name (was: unique across every key).

A key reusing another key's Idempotency-Key with the same body was answered with the other key's stored quote:
its id, creator, time and result, read by a key that may lack the quote-reading scope. Each key's retries now
find only its own quotes. Quotes made before keys had names (created_by null) keep their keys, unique among them
only as far as the database treats nulls as distinct.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("quotes") as batch:
        batch.drop_constraint("uq_quotes_idempotency_key", type_="unique")
        batch.create_unique_constraint("uq_quotes_created_by", ["created_by", "idempotency_key"])


def downgrade() -> None:
    with op.batch_alter_table("quotes") as batch:
        batch.drop_constraint("uq_quotes_created_by", type_="unique")
        batch.create_unique_constraint("uq_quotes_idempotency_key", ["idempotency_key"])
