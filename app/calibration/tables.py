"""The calibration profiles table: named, fitted efficiency profiles."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, CheckConstraint, DateTime, Double, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from app.db import Base


class CalibrationProfileRecord(Base):
    """A calibration profile: efficiencies per GPU family and compute precision, and how they were fitted.

    `entries` and `provenance` are the profile's JSON documents (see app.profiles); the columns beside
    them copy what a list page shows. `default` is loaded from app/data (origin reference); users
    create others with POST /v1/calibrations and never overwrite one.
    """

    __tablename__ = "calibration_profiles"
    __table_args__ = (CheckConstraint("origin IN ('reference', 'user')", name="origin"),)

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    description: Mapped[str] = mapped_column(Text, default="")
    origin: Mapped[str] = mapped_column(String(16))
    entries: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    provenance: Mapped[dict[str, Any]] = mapped_column(JSON)
    source_sha256: Mapped[str] = mapped_column(String(64))  # of the measurements the fit read
    rows_used: Mapped[int] = mapped_column(Integer)  # measurements the fit used
    fit_median_abs_pct_error: Mapped[float | None] = mapped_column(Double)  # on those measurements, after
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))  # when it was fitted
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))  # when this row was last written
    # Name of the API key that wrote it (at updated_at); null for the shipped default profile.
    written_by: Mapped[str | None] = mapped_column(String(64))
