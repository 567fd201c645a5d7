"""Who wrote what: the name of the API key (never its secret) on catalog rows, quotes and profiles.

Existing rows get null: reference data, and writes made before keys had names.

Revision ID: 0005
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# table -> the column that names the writing key
COLUMNS = {"gpus": "written_by", "models": "written_by", "calibration_profiles": "written_by",
           "quotes": "created_by"}


def upgrade() -> None:
    for table, column in COLUMNS.items():
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column(column, sa.String(length=64), nullable=True))


def downgrade() -> None:
    for table, column in COLUMNS.items():
        with op.batch_alter_table(table) as batch:
            batch.drop_column(column)
