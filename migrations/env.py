"""Alembic environment: the URL comes from DATABASE_URL (the service settings), or a connection
passed in `config.attributes["connection"]` (tests). SQLite runs in batch mode."""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

import app.calibration.tables
import app.catalog.tables
import app.quotes.tables  # noqa: F401
from app.db import Base, make_engine
from app.settings import Settings

config = context.config
target_metadata = Base.metadata


def _database_url() -> str:
    # An explicit sqlalchemy.url (set programmatically) wins; otherwise the service's DATABASE_URL.
    if config.file_config.has_section(config.config_ini_section):
        url = config.get_main_option("sqlalchemy.url")
        if url:
            return url
    return Settings().database_url


def _configure(connection: Connection | None = None, url: str | None = None) -> None:
    dialect = connection.dialect.name if connection is not None else url.split(":", 1)[0].split("+")[0]
    context.configure(
        connection=connection,
        url=url,
        target_metadata=target_metadata,
        render_as_batch=dialect == "sqlite",  # SQLite cannot ALTER most things: copy-and-move
        compare_type=True,
        literal_binds=connection is None,
    )


def run_offline() -> None:
    """`alembic upgrade head --sql`: print the SQL instead of running it."""
    _configure(url=_database_url())
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = make_engine(_database_url())
    try:
        with engine.connect() as connection:
            _configure(connection)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
