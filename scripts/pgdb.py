"""Create or drop a throwaway PostgreSQL database: `pgdb.py create|drop ADMIN_URL NAME`.

The database sorts text by a locale's rules (ICU's en-US, which ignores punctuation: "fit_a" < "fit-b"), as
production databases created with a locale do, so a listing that must be in byte order is tested against one
that is not; a server without ICU gets its default collation, and says so."""

import re
import sys

import psycopg


def main() -> int:
    action, admin_url, name = sys.argv[1:4]
    if action not in {"create", "drop"} or not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", name):
        print("usage: pgdb.py create|drop ADMIN_URL NAME", file=sys.stderr)
        return 2
    try:
        with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
            if action == "create":
                conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
                try:
                    conn.execute(f"CREATE DATABASE \"{name}\" LOCALE_PROVIDER icu ICU_LOCALE 'en-US' "
                                 "TEMPLATE template0")
                except psycopg.errors.FeatureNotSupported:
                    print("pgdb.py: this PostgreSQL has no ICU; the test database takes its default collation",
                          file=sys.stderr)
                    conn.execute(f'CREATE DATABASE "{name}"')
            else:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    except psycopg.Error as exc:
        print(f"PostgreSQL is not usable at {admin_url}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
