"""The quotes table: stored plan answers with their catalog snapshot."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, DateTime, Double, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from app.db import Base


class QuoteRecord(Base):
    """A saved /v1/slo-plan answer: the validated request, the catalog rows it read, the result.

    Rows are only ever inserted (nothing updates or deletes a quote), so a quote reads back the
    same forever, whatever happens to the catalog afterwards.
    """

    __tablename__ = "quotes"
    # UNIQUE per creating API key: of one key's concurrent creates with one Idempotency-Key, the database lets
    # exactly one insert win; another API key's equal Idempotency-Key is another quote's (migration 0007).
    __table_args__ = (UniqueConstraint("created_by", "idempotency_key"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)  # UUID4, lower-case hyphenated
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    request_sha256: Mapped[str] = mapped_column(String(64))  # of the canonical request JSON
    request: Mapped[dict[str, Any]] = mapped_column(JSON)
    catalog_snapshot: Mapped[dict[str, Any]] = mapped_column(JSON)
    result: Mapped[dict[str, Any]] = mapped_column(JSON)
    calculation_version: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    # Copied from the result at creation, so a list page does not read every result document.
    model: Mapped[str | None] = mapped_column(String(64))  # catalog slug; null for an inline model_spec
    feasible: Mapped[bool]
    cheapest_gpu: Mapped[str | None] = mapped_column(String(64))
    cheapest_cost_per_hour_usd: Mapped[float | None] = mapped_column(Double)
    # Name of the API key that created it (at created_at); null for quotes made before keys had names.
    created_by: Mapped[str | None] = mapped_column(String(64))
