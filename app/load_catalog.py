"""`python -m app.load_catalog`: load the reference catalog (app/data) into DATABASE_URL.

Idempotent: inserts missing reference rows, updates reference rows whose data changed, and
never touches rows a user created, edited or deleted. Run after `alembic upgrade head`.
"""

from __future__ import annotations

import json
import sys

from sqlalchemy.exc import DBAPIError

from app.calibration.profiles import load_default_profile
from app.catalog.reference import load_reference_catalog
from app.db import database_revisions, make_engine, make_session_factory, migration_heads
from app.settings import Settings


def main() -> int:
    settings = Settings()
    engine = make_engine(settings.database_url)
    try:
        if database_revisions(engine) != migration_heads():
            print("The database is not at the migration head: run `alembic upgrade head` first", file=sys.stderr)
            return 1
        with make_session_factory(engine)() as session, session.begin():
            report = load_reference_catalog(session)
            default_profile = load_default_profile(session)  # the fitted calibration profile `default`
    except DBAPIError as exc:
        print(f"Cannot load the catalog: {type(exc.orig).__name__}: {exc.orig}", file=sys.stderr)
        return 1
    finally:
        engine.dispose()
    print(json.dumps({"catalog": "reference", "inserted": report.inserted, "updated": report.updated,
                      "unchanged": report.unchanged, "kept_user_rows": report.kept_user_rows,
                      "default_calibration_profile": default_profile}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
