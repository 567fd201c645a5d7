"""The real migrations build the schema on SQLite and PostgreSQL, reverse cleanly, and match the ORM."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, inspect, select

from app.catalog.tables import CatalogRevision
from app.db import Base, database_revisions, migration_heads
from tests.conftest import reset_catalog, run_migrations


def _tables(engine: Engine) -> set[str]:
    return set(inspect(engine).get_table_names()) - {"alembic_version"}


def test_there_is_one_head_and_the_test_database_is_at_it(engine: Engine) -> None:
    assert len(migration_heads()) == 1
    assert database_revisions(engine) == migration_heads()


def test_upgrade_downgrade_upgrade_round_trip(engine: Engine) -> None:
    try:
        run_migrations(engine, "downgrade", "base")
        assert _tables(engine) == set()
        assert database_revisions(engine) == frozenset()

        run_migrations(engine, "upgrade", "head")
        assert _tables(engine) == set(Base.metadata.tables)
        assert {"gpus", "models", "catalog_revision", "catalog_tombstones"} <= _tables(engine)
        with engine.connect() as connection:
            # The first migration seeds the revision counter's only row.
            assert connection.execute(select(CatalogRevision.id, CatalogRevision.revision)).all() == [(1, 0)]
    finally:
        run_migrations(engine, "upgrade", "head")
        reset_catalog(engine)


def test_orm_metadata_has_no_diff_from_the_migrated_schema(engine: Engine) -> None:
    with engine.connect() as connection:
        context = MigrationContext.configure(
            connection, opts={"compare_type": True, "render_as_batch": engine.dialect.name == "sqlite"}
        )
        diff = compare_metadata(context, Base.metadata)
    assert diff == []


def test_constraint_names_follow_the_naming_convention(engine: Engine) -> None:
    inspector = inspect(engine)
    assert inspector.get_pk_constraint("gpus")["name"] == "pk_gpus"
    assert inspector.get_pk_constraint("models")["name"] == "pk_models"
    check_names = {check["name"] for check in inspector.get_check_constraints("gpus")}
    assert "ck_gpus_origin" in check_names
