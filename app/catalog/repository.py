"""Catalog queries. Each takes a session and never commits."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, delete, func, select, update
from sqlalchemy.orm import Session

from app.catalog.tables import CatalogRevision, CatalogTombstone, GpuRecord, ModelRecord

CATALOG_REVISION_ID = 1  # the counter's only row, inserted by the first migration
WROTE_CATALOG = "catalog_written"  # in a session's info once it bumped the revision

R = TypeVar("R", GpuRecord, ModelRecord)


def get(session: Session, record_class: type[R], slug: str) -> R | None:
    return session.get(record_class, slug)


def in_byte_order(session: Session, column: Any) -> Any:
    """`column` to order by in byte order on every backend: PostgreSQL's locale collation would ignore
    punctuation and put "llama-3.1-8b" before "llama-3-70b"; SQLite compares bytes already."""
    if session.get_bind().dialect.name == "postgresql":
        return column.collate("C")
    return column


def _by_slug(session: Session, record_class: type[R]) -> Any:
    return in_byte_order(session, record_class.slug)


def page(session: Session, record_class: type[R], filters: Sequence[ColumnElement[bool]],
         limit: int, offset: int) -> tuple[list[R], int]:
    """One page of rows ordered by slug, and the number of rows matching the filters."""
    total = session.scalar(select(func.count()).select_from(record_class).where(*filters)) or 0
    rows = session.scalars(
        select(record_class).where(*filters).order_by(_by_slug(session, record_class)).limit(limit).offset(offset)
    ).all()
    return list(rows), total


def all_rows(session: Session, record_class: type[R]) -> list[R]:
    return list(session.scalars(select(record_class).order_by(_by_slug(session, record_class))))


def all_slugs(session: Session, record_class: type[R]) -> list[str]:
    return list(session.scalars(select(record_class.slug)))


def catalog_revision(session: Session) -> int:
    return session.scalar(select(CatalogRevision.revision).where(CatalogRevision.id == CATALOG_REVISION_ID)) or 0


def lock_catalog(session: Session) -> None:
    """Call first in every transaction that writes catalog rows: takes the revision row's write lock (PostgreSQL:
    its row lock; SQLite: the database's write lock) without changing it, so catalog writers run one at a time:
    what one reads next is what every writer before it committed. Without it a replica's DELETE that committed
    between the reference loader's read of the tombstones and of the rows was undone (the loader inserted the row
    again), and of two racing writes of one row the later answered 409 or 412 for a conflict it could not see."""
    session.execute(
        update(CatalogRevision)
        .where(CatalogRevision.id == CATALOG_REVISION_ID)
        .values(revision=CatalogRevision.revision)
    )


def bump_catalog_revision(session: Session) -> None:
    """Call in the same transaction as every write to what sizing reads (catalog rows, calibration
    profiles): invalidates every replica's spec cache, this replica's as soon as the session commits."""
    session.info[WROTE_CATALOG] = True
    session.execute(
        update(CatalogRevision)
        .where(CatalogRevision.id == CATALOG_REVISION_ID)
        .values(revision=CatalogRevision.revision + 1)
    )


def tombstones(session: Session) -> set[tuple[str, str]]:
    return {(kind, slug) for kind, slug in session.execute(select(CatalogTombstone.kind, CatalogTombstone.slug))}


def add_tombstone(session: Session, kind: str, slug: str, when: datetime) -> None:
    if session.get(CatalogTombstone, (kind, slug)) is None:
        session.add(CatalogTombstone(kind=kind, slug=slug, deleted_at=when))


def remove_tombstone(session: Session, kind: str, slug: str) -> None:
    session.execute(delete(CatalogTombstone).where(CatalogTombstone.kind == kind, CatalogTombstone.slug == slug))


def equals_ignoring_case(column: Any, value: str) -> ColumnElement[bool]:
    return func.lower(column) == value.lower()
