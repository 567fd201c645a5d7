"""Shared fixtures: a database built by the real migrations, the app, a client, write headers.

`TEST_DATABASE_URL` selects the database: unset = a fresh SQLite file in a temporary folder;
a postgresql+psycopg:// URL = that throwaway database (the Makefile creates and drops it).
Each test that uses `client` or `db_session` starts from the reference catalog exactly.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from alembic import command
from alembic.config import Config
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine, delete
from sqlalchemy.orm import Session

from app.calibration.profiles import load_default_profile
from app.calibration.tables import CalibrationProfileRecord
from app.catalog.reference import load_reference_catalog
from app.catalog.repository import bump_catalog_revision
from app.catalog.tables import CatalogTombstone, GpuRecord, ModelRecord
from app.db import MIGRATIONS_DIR
from app.main import create_app
from app.settings import Settings
from scripts.render_charts import chromium

TEST_API_KEY = "test-write-key-0123456789abcdef"
OTHER_API_KEY = "rotated-write-key-fedcba9876543210"


def alembic_config() -> Config:
    """An Alembic config for the project's migrations (the connection is passed in attributes)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def run_migrations(engine: Engine, action: str, target: str) -> None:
    """`alembic upgrade|downgrade <target>` over one of `engine`'s connections."""
    config = alembic_config()
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        getattr(command, action)(config, target)


@pytest.fixture(scope="session")
def database_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = os.environ.get("TEST_DATABASE_URL")
    if url:
        return url
    return f"sqlite:///{tmp_path_factory.mktemp('db') / 'sizing-test.db'}"


@pytest.fixture(scope="session")
def settings(database_url: str) -> Settings:
    # The plan workers start on first use here: most test applications never plan (test_plan_pool prestarts them).
    return Settings(database_url=database_url, api_keys=f"{TEST_API_KEY},{OTHER_API_KEY}", log_level="warning",
                    plan_workers_prestart=False)


@pytest.fixture(scope="session")
def app(settings: Settings) -> FastAPI:
    """The application, on a database migrated to head by the real migrations."""
    application = create_app(settings)
    run_migrations(application.state.engine, "upgrade", "head")
    return application


@pytest.fixture
def default_profile_loaded(app: FastAPI) -> Iterator[None]:
    """The shipped default calibration profile stored, as `make load-catalog` stores it: requests naming no
    profile then use it. Removed afterwards (other tests expect the builtin default), through the application's
    own sessions, so its cache sees the change at once."""
    def clear() -> None:
        with app.state.session_factory() as session, session.begin():
            session.execute(delete(CalibrationProfileRecord))
            bump_catalog_revision(session)  # as every write to what sizing reads

    clear()
    with app.state.session_factory() as session, session.begin():
        assert load_default_profile(session) == "inserted"
    yield
    clear()


@pytest.fixture(scope="session")
def engine(app: FastAPI) -> Engine:
    return app.state.engine


def reset_catalog(engine: Engine) -> None:
    """Exactly the reference catalog, and a new catalog revision (drops every spec cache)."""
    with Session(engine) as session, session.begin():
        for table in (GpuRecord, ModelRecord, CatalogTombstone):
            session.execute(delete(table))
        bump_catalog_revision(session)
        load_reference_catalog(session)


@pytest.fixture
def fresh_catalog(app: FastAPI, engine: Engine) -> None:
    reset_catalog(engine)
    # Written outside the application, as another replica would: tell it, rather than wait for its
    # next revision check (CATALOG_MAX_AGE_S).
    app.state.spec_cache.invalidate()


@pytest.fixture
def client(app: FastAPI, fresh_catalog: None) -> Iterator[TestClient]:
    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client


@pytest.fixture
def db_session(app: FastAPI, fresh_catalog: None) -> Iterator[Session]:
    """A session from the application's own factory (shares its spec cache); rolled back after."""
    session: Session = app.state.session_factory()
    try:
        yield session
    finally:
        session.rollback()
        session.close()


@pytest.fixture
def write_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {TEST_API_KEY}"}


@pytest.fixture(scope="session")
def live_url(app: FastAPI) -> Iterator[str]:
    """The application served by uvicorn on a loopback port, for clients that speak real HTTP
    (a browser, curl, a generated client). Tests using it also ask for `fresh_catalog`."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            pytest.fail("the live server did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        listener.close()


@pytest.fixture(scope="session")
def browser() -> str:
    """Headless Chromium (Debian's `chromium`). Skipped where missing, except in CI (CI=true), which
    installs it: there a missing browser means the browser checks silently stopped running."""
    found = chromium()
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("Chromium is not installed; CI must install it (apt-get install -y chromium)")
        pytest.skip("Chromium is not installed (Debian: apt-get install chromium); the browser check did not run")
    return found
