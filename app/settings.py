"""Service settings, read from the environment and validated at start-up.

The variable names are the ones operators set (`DATABASE_URL`, `API_KEYS`, `OPEN_READS`, `HOST`, `PORT`,
`LOG_LEVEL`, `CORS_ORIGINS`, `REQUEST_TIMEOUT_S`, `MAX_CONCURRENT_REQUESTS`); a bad value stops the service before it serves
anything.

API keys carry scopes. `API_KEYS` is a comma-separated list of entries, each either
`name:secret:scope1+scope2` (a named key with those scopes; `*` = every scope) or a bare `secret`
(the older form: every scope, named `key-` and the first 12 hex digits of the secret's SHA-256, a name
that stays the key's when other keys are added or removed and does not reveal the secret). The name,
never the secret, is what logs and stored resources record.
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
# A write key is a shared secret: long enough not to be guessed, and free of the characters
# that would make it ambiguous in a comma-separated list or an Authorization header.
API_KEY_PATTERN = re.compile(r"^[A-Za-z0-9._~+/=-]{16,256}$")
# Key names are recorded on what a key writes: short, plain identifiers.
KEY_NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
# What a key may do. Catalog and sizing reads need their scope only when OPEN_READS is false.
SCOPES = ("catalog:read", "catalog:write", "sizing:read", "quotes:read", "quotes:write", "calibrations:write")
ORIGIN_PATTERN = re.compile(r"^https?://[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*(:[0-9]{1,5})?$")


class ApiKey(BaseModel):
    """One configured key: its name (recorded on writes), its secret, and what it may do."""

    model_config = ConfigDict(frozen=True)

    name: str
    secret: SecretStr
    scopes: frozenset[str]


def bare_key_name(secret: str) -> str:
    """The name of a bare key: derived from its secret, so that it does not change when other keys are
    added or removed (a name owns its quotes and Idempotency-Keys); 48 bits of a hash do not give the
    secret back."""
    return "key-" + hashlib.sha256(secret.encode()).hexdigest()[:12]


def _parse_key(entry: str, position: int) -> dict[str, object]:
    """An API_KEYS entry as ApiKey fields; errors say which entry, never what it holds."""
    parts = entry.split(":", 2)  # scopes contain colons themselves; names and secrets cannot
    if len(parts) == 1:
        return {"name": bare_key_name(entry), "secret": entry, "scopes": frozenset(SCOPES)}
    if len(parts) != 3:
        raise ValueError(f"API key #{position} must be name:secret:scope1+scope2 or a bare secret")
    name, secret, scopes = parts
    if not KEY_NAME_PATTERN.match(name):
        raise ValueError(f"API key #{position}: the name must be 1-64 characters of a-z 0-9 . _ -")
    granted = frozenset(SCOPES) if scopes == "*" else frozenset(scopes.split("+"))
    unknown = granted - set(SCOPES)
    if unknown or not granted:
        raise ValueError(f"API key #{position} ({name}): scopes must be * or some of {', '.join(SCOPES)} "
                         f"joined by +, not {'+'.join(sorted(unknown)) or 'nothing'}")
    return {"name": name, "secret": secret, "scopes": granted}


def _split_csv(value: object) -> object:
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


class Settings(BaseSettings):
    # hide_input_in_errors: a rejected API key must not be echoed into start-up logs.
    model_config = SettingsConfigDict(case_sensitive=False, extra="ignore", hide_input_in_errors=True)

    database_url: str = Field(
        "sqlite:///./data/sizing.db",
        description="SQLAlchemy URL; SQLite by default, PostgreSQL via postgresql+psycopg://",
    )
    api_keys: Annotated[list[ApiKey], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated bearer keys, each name:secret:scope1+scope2 or a bare secret (every "
                    "scope); several at once for rotation",
    )
    open_reads: bool = Field(
        True, description="Catalog and sizing reads need no key; false: they need catalog:read / sizing:read",
    )
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    log_level: str = "info"
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Comma-separated allowed origins; empty turns CORS off"
    )
    # The slowest honest request (an /v1/slo-plan search) takes about a second; a request still
    # running after this gets a 503 problem instead of holding its client (and a proxy slot).
    request_timeout_s: float = Field(
        30.0, gt=0, le=3600, allow_inf_nan=False,
        description="Seconds a request may run (waiting for its turn included) before it is answered "
                    "with a 503 problem",
    )
    # Sizing requests answer from specs cached in memory; the catalog revision is read again at most
    # this often, so another replica's catalog write shows within this bound (this replica's at once).
    catalog_max_age_s: float = Field(
        0.25, ge=0, le=60, allow_inf_nan=False,
        description="Seconds a process answers from its cached catalog before checking the catalog revision "
                    "again (how soon another replica's write is seen; its own are seen at once)",
    )
    # Plan searches run in worker processes, this many at a time per serving process (more wait); the
    # default leaves half the cores to the serving processes themselves.
    plan_workers: int = Field(
        default_factory=lambda: max(1, min(4, (os.cpu_count() or 2) // 2)), ge=1, le=64,
        description="Worker processes for /v1/slo-plan searches, per serving process",
    )
    plan_workers_prestart: bool = Field(
        True, description="Start the plan workers with the process, each loading the planner, so that a "
                          "replica's first /v1/slo-plan does not wait for them (false: on first use)",
    )
    # Catalog, quote and calibration endpoints are sync: each request needs one of the 40 worker
    # threads several times, and keeps its pooled database connection (15) between them. Past 40 + 15 requests at once, every thread
    # can be waiting for a connection held by a request that is waiting for a thread: a deadlock
    # until the pool times out. Requests beyond this limit wait their turn instead.
    max_concurrent_requests: int = Field(
        40, ge=1, le=40,
        description="Requests one process serves at once; more wait for a slot (within REQUEST_TIMEOUT_S)",
    )

    @field_validator("database_url")
    @classmethod
    def _valid_database_url(cls, value: str) -> str:
        # Plain postgres:// URLs (as many hosting platforms hand them out) would select psycopg2,
        # which is not installed; psycopg 3 is the driver this service ships with.
        for prefix in ("postgres://", "postgresql://"):
            if value.startswith(prefix):
                value = "postgresql+psycopg://" + value[len(prefix):]
        try:
            url = make_url(value)
        except ArgumentError as exc:
            raise ValueError(f"not a database URL: {exc}") from None
        if url.get_backend_name() not in ("sqlite", "postgresql"):
            raise ValueError("DATABASE_URL must be a sqlite:// or postgresql+psycopg:// URL")
        return value

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        entries = _split_csv(value)
        if not isinstance(entries, list):
            return entries
        return [_parse_key(entry, position) if isinstance(entry, str) else entry
                for position, entry in enumerate(entries, start=1)]

    @field_validator("api_keys")
    @classmethod
    def _strong_keys(cls, keys: list[ApiKey]) -> list[ApiKey]:
        for position, key in enumerate(keys, start=1):
            if not API_KEY_PATTERN.match(key.secret.get_secret_value()):
                # Say which key is wrong, never what it is.
                raise ValueError(
                    f"API key #{position} must be 16-256 characters of A-Z a-z 0-9 . _ ~ + / = -"
                )
        # One secret under two names would make a request's key (its name and scopes) depend on which
        # one matched: name the keys, never the secret.
        by_secret: dict[str, list[str]] = {}
        for key in keys:
            by_secret.setdefault(key.secret.get_secret_value(), []).append(key.name)
        shared = [names for names in by_secret.values() if len(names) > 1]
        if shared:
            raise ValueError("API keys must have different secrets: "
                             + "; ".join(" and ".join(names) for names in shared) + " share one")
        names = [key.name for key in keys]
        if len(set(names)) != len(names):
            raise ValueError("API key names must be unique (they say who wrote what)")
        return keys

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _split_origins(cls, value: object) -> object:
        return _split_csv(value)

    @field_validator("cors_origins")
    @classmethod
    def _exact_origins(cls, origins: list[str]) -> list[str]:
        # An allowlist of exact origins: "*" (or a pattern, or a path) would let any site's
        # scripts call the API with its users' network position.
        for origin in origins:
            if not ORIGIN_PATTERN.match(origin):
                raise ValueError(f"CORS_ORIGINS entries must be exact origins such as https://tools.example.com, "
                                 f"not {origin[:100]!r}")
        return origins

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        level = value.strip().lower()
        if level not in LOG_LEVELS:
            raise ValueError(f"LOG_LEVEL must be one of {', '.join(LOG_LEVELS)}")
        return level

    @field_validator("host")
    @classmethod
    def _non_empty_host(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("HOST must not be empty")
        return value.strip()
