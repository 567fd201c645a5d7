"""Engine and session factory, the declarative base, and the per-request session dependency.

One session per request: the dependency commits when the endpoint returns and rolls back when
it raises. Repositories and services never commit.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from fastapi import Request
from sqlalchemy import Engine, MetaData, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

# Deterministic constraint names, so migrations can name (and drop) every constraint on both
# SQLite (batch mode rebuilds tables) and PostgreSQL.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

MIGRATIONS_DIR = Path(__file__).resolve().parents[1] / "migrations"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def make_engine(database_url: str) -> Engine:
    """An engine for SQLite (creating the file's folder) or PostgreSQL (psycopg 3)."""
    url = make_url(database_url)
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if url.get_backend_name() == "sqlite":
        if url.database and url.database != ":memory:" and not url.database.startswith("file:"):
            Path(url.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        # Requests run in a thread pool; SQLite's own lock serializes writers (wait up to 15 s).
        kwargs["connect_args"] = {"check_same_thread": False, "timeout": 15}
    else:
        # Fail fast when the server is unreachable, so readiness and requests answer 503 quickly.
        kwargs["connect_args"] = {"connect_timeout": 5}
    engine = create_engine(url, **kwargs)
    if url.get_backend_name() == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()
    # SQLite's lower() folds ASCII letters only, PostgreSQL's every letter: a case-insensitive filter found
    # "ÜBERCHIP Ltd" on PostgreSQL and not on SQLite. Python's str.lower, as the value compared is lowered.
    dbapi_connection.create_function("lower", 1, _lower, deterministic=True)


def _lower(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


def make_session_factory(engine: Engine, info: dict[str, Any] | None = None) -> sessionmaker[Session]:
    # `info` is shallow-copied into every session, so an object in it (the application's spec
    # cache) is shared by all sessions of one application.
    return sessionmaker(bind=engine, expire_on_commit=False, info=info or {})


# A session whose info holds this must not touch the database: code that caches database reads
# raises NeedsDatabase instead of reading (see app.web.computed_answer).
MEMORY_ONLY = "memory_only"


class NeedsDatabase(Exception):
    """A memory-only session was asked for something not in memory (or no longer fresh there)."""


def memory_only_session(session_factory: sessionmaker[Session]) -> Session:
    """An unbound session sharing the factory's info (its caches): any query would raise."""
    return Session(info={**session_factory.kw.get("info", {}), MEMORY_ONLY: True})


@cache
def migration_heads() -> frozenset[str]:
    """The Alembic head revision(s) this code expects."""
    return frozenset(ScriptDirectory(str(MIGRATIONS_DIR)).get_heads())


def database_revisions(engine: Engine) -> frozenset[str]:
    """The Alembic revision(s) the database is at (empty before the first migration)."""
    with engine.connect() as connection:
        return frozenset(MigrationContext.configure(connection).get_current_heads())


class RequestAbandoned(Exception):
    """Raised by work that finds its request already answered 503 at its deadline (`RequestDeadline.check`):
    nothing it could still compute would reach anyone, so it stops and frees its request slot."""


class RequestDeadline:
    """Whether a request may still commit, or has run past its deadline (its client got a 503).

    The timeout middleware puts one in the request's scope. Exactly one of the two claims wins,
    so a client told "timed out" can rely on its write not being applied, and a write that is
    committing is let finish (and answered) even when the deadline passes meanwhile. Long work in a
    worker thread (which nothing can interrupt) calls `check` between its pieces to stop once expired.
    """

    SCOPE_KEY = "app.deadline"

    def __init__(self, due: float | None = None) -> None:
        self.due = due  # the `time.monotonic()` instant the client is answered 503 if not before; None: never
        self._lock = threading.Lock()
        self._state = "running"  # -> "committing" | "expired"

    def claim_commit(self) -> bool:
        with self._lock:
            if self._state == "running":
                self._state = "committing"
            return self._state == "committing"

    def claim_expiry(self) -> bool:
        with self._lock:
            if self._state == "running":
                self._state = "expired"
            return self._state == "expired"

    @property
    def expired(self) -> bool:
        return self._state == "expired"

    def check(self) -> None:
        """Raise RequestAbandoned once the request has been answered 503 (its work can stop)."""
        if self.expired:
            raise RequestAbandoned("the request ran past its deadline and was answered 503; its work stopped")


def get_session(request: Request) -> Iterator[Session]:
    """FastAPI dependency: one session per request; commit on success, roll back on error or
    when the request ran past its deadline."""
    session: Session = request.app.state.session_factory()
    deadline: RequestDeadline | None = request.scope.get(RequestDeadline.SCOPE_KEY)
    try:
        yield session
        if deadline is None or deadline.claim_commit():
            session.commit()
        else:
            session.rollback()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
