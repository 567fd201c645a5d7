"""Catalog orchestration: reads and writes of GPU and model rows, the spec cache, and HF config import.

Sizing code gets domain specs through `get_model_spec`, `get_gpu_spec` and `list_gpu_specs`; an unknown
slug raises `NotFound` (a 404 problem).
"""

from __future__ import annotations

import difflib
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from pydantic import ValidationError
from sqlalchemy import ColumnElement, event
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.orm.exc import StaleDataError

from app.catalog import repository
from app.catalog.hf_config import ConfigError, NormalizedConfig, normalize_hf_config
from app.catalog.reference import (
    architecture_kind,
    attention_kind,
    gpu_spec_from_record,
    model_spec_from_record,
    reference_slugs,
)
from app.catalog.schemas import (
    GpuIn,
    GpuOut,
    ModelImport,
    ModelIn,
    ModelOut,
    gpu_spec_from_schema,
    model_spec_from_schema,
    split_read_only,
)
from app.catalog.tables import ORIGIN_USER, GpuRecord, ModelRecord
from app.db import MEMORY_ONLY, NeedsDatabase
from app.errors import Conflict, NotFound, PreconditionFailed, Unprocessable, json_pointer
from app.sizing.specs import GpuSpec, ModelSpec
from app.web import Preconditions, etag_of

log = logging.getLogger("app.catalog")

# Spec cache ------------------------------------------------------------------------------

# A session flagged with this reads the catalog revision in its own transaction on every lookup, so
# the specs it gets are those of the rows it reads (quotes snapshot both).
CONSISTENT_READS = "catalog_reads_in_transaction"
_MISSING = object()


class SpecCache:
    """Domain specs and other reference reads (calibration profiles) built from the database, valid for
    one catalog revision (bumped in the transaction of every write to them, by any replica).

    Coherence, with the bound stated: the revision is read at most once every `max_age_s`; in between,
    lookups are answered from memory. So a write by another replica (another process on the same
    database) is seen within `max_age_s` of its commit, plus the one revision read under way then (at
    most `CHECK_CLAIM_S`); a write by this replica at once (its session marks the cache stale when it
    commits, before the response is sent: `watch_writes`).

    One check at a time, off the request's way: the first memory-only lookup that finds the cache due
    claims the check; the memory-only lookups after it keep answering from the cached revision until
    that check lands, instead of each taking a worker thread and a database connection to read the same
    row (at thousands of requests a second that pile-up held a few requests for hundreds of
    milliseconds). With `check_in_background` (the service) the claiming lookup answers from the cache
    too and the check runs on a thread of its own: a request never waits for it (on a busy process the
    check's round trip waits for the interpreter lock a few times, and the request that made it used to
    wait 0.1-1 s with it). Without it, the claiming lookup goes to the database (`NeedsDatabase`). A
    claim older than `CHECK_CLAIM_S` (a check that failed or stalled) is claimed again; nothing answers
    from a revision last read more than `max_age_s + CHECK_CLAIM_S` ago (a lookup then reads it on a
    database session of its own, and fails loudly if the database is gone); after a write of this
    replica's no lookup answers from the cache before a check has landed.
    """

    CHECK_CLAIM_S = 1.0

    def __init__(self, max_age_s: float = 0.25, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_age_s = max_age_s
        self.clock = clock
        self._lock = threading.Lock()
        self._revision: int | None = None
        self._checked_at = -math.inf
        self._claimed_at = -math.inf  # when a memory-only lookup last sent a revision check to the database
        self._invalidated = False  # a write of this replica's since the last check: never answer from before it
        self._generation = 0  # bumped by every invalidation: a check that overlapped one is not trusted
        self._specs: dict[tuple[str, str], Any] = {}
        self._background: Callable[[], None] | None = None  # runs one revision check (check_in_background)

    def check_in_background(self, session_factory: sessionmaker[Session],
                            start: Callable[[Callable[[], None]], None] | None = None) -> None:
        """Run the revision checks that memory-only lookups claim on a thread of their own (`start`, a
        daemon thread per check by default), on sessions of `session_factory`."""
        def check() -> None:
            try:
                with session_factory() as session:
                    self.revision(session)
            except Exception as exc:  # noqa: BLE001 - the claim lapses and a later lookup checks again
                log.warning("catalog revision check failed (%s); retried after %.1f s",
                            type(exc).__name__, self.CHECK_CLAIM_S)

        run = start or (lambda task: threading.Thread(target=task, name="catalog-revision-check",
                                                      daemon=True).start())
        self._background = lambda: run(check)

    def invalidate(self) -> None:
        """Read the revision again on the next lookup (after a write of this replica's)."""
        with self._lock:
            self._generation += 1
            self._checked_at = self._claimed_at = -math.inf
            self._invalidated = True

    def revision(self, session: Session) -> int:
        """The catalog revision to answer from: the cached one while recently checked, else read now."""
        memory_only = bool(session.info.get(MEMORY_ONLY))
        if not session.info.get(CONSISTENT_READS):
            background, cached_revision = None, 0
            with self._lock:
                now = self.clock()
                age = now - self._checked_at
                if self._revision is not None and age < self.max_age_s:
                    return self._revision  # fresh
                # May a memory-only lookup answer from the cache while a check is under way? (Never with
                # max_age_s 0: every lookup then reads the revision itself.)
                trusted = (memory_only and self.max_age_s > 0 and self._revision is not None
                           and not self._invalidated and age < self.max_age_s + self.CHECK_CLAIM_S)
                if trusted and now - self._claimed_at < self.CHECK_CLAIM_S:
                    return self._revision  # another lookup's check is under way (and no write since)
                if memory_only:
                    self._claimed_at = now  # this lookup claims the check
                    if trusted and self._background is not None:
                        background, cached_revision = self._background, self._revision
                generation = self._generation
            if background is not None:
                background()  # checks on its own thread; this lookup answers from the cached revision
                return cached_revision
        else:
            generation = None
        if memory_only:
            raise NeedsDatabase
        revision = repository.catalog_revision(session)
        with self._lock:
            if revision != self._revision:
                self._specs.clear()
                self._revision = revision
            if generation == self._generation:
                self._checked_at = self.clock()
                self._claimed_at = -math.inf
                self._invalidated = False
        return revision

    def get(self, revision: int, key: tuple[str, str]) -> Any:
        with self._lock:
            return self._specs.get(key, _MISSING) if revision == self._revision else _MISSING

    def put(self, revision: int, key: tuple[str, str], spec: Any) -> None:
        with self._lock:
            if revision == self._revision:
                self._specs[key] = spec

    def watch_writes(self, session_factory: sessionmaker[Session]) -> None:
        """Invalidate when a session of `session_factory` that wrote the catalog commits."""
        def committed(session: Session) -> None:
            if session.info.pop(repository.WROTE_CATALOG, False):
                self.invalidate()

        def rolled_back(session: Session) -> None:
            session.info.pop(repository.WROTE_CATALOG, None)

        event.listen(session_factory, "after_commit", committed)
        event.listen(session_factory, "after_rollback", rolled_back)


def _spec_cache(session: Session) -> SpecCache:
    # The application's session factory puts one cache into every session's info.
    return session.info.setdefault("spec_cache", SpecCache())


def cached(session: Session, key: tuple[str, str], build: Callable[[], Any]) -> Any:
    """The cached value of `key` at the catalog revision `session` sees, built once per revision.
    `build` may return None (remembered too) or raise (nothing is remembered)."""
    cache = _spec_cache(session)
    revision = cache.revision(session)
    value = cache.get(revision, key)
    if value is _MISSING:
        if session.info.get(MEMORY_ONLY):
            raise NeedsDatabase
        value = build()
        cache.put(revision, key, value)
    return value


def get_model_spec(session: Session, slug: str, pointer: str = "/body/model") -> ModelSpec:
    def build() -> ModelSpec:
        return model_spec_from_record(_record_or_404(session, MODELS, slug, pointer))

    return cached(session, ("model", slug), build)


def get_model_hf_id(session: Session, slug: str, pointer: str = "/body/model") -> str | None:
    """The catalog model's Hugging Face id (None when it has none)."""
    def build() -> str | None:
        return _record_or_404(session, MODELS, slug, pointer).hf_id or None

    return cached(session, ("model-hf-id", slug), build)


def get_gpu_spec(session: Session, slug: str, pointer: str = "/body/gpu") -> GpuSpec:
    def build() -> GpuSpec:
        return gpu_spec_from_record(_record_or_404(session, GPUS, slug, pointer))

    return cached(session, ("gpu", slug), build)


def list_gpu_specs(session: Session) -> list[GpuSpec]:
    """Every catalog GPU as a spec, ordered by slug."""
    def build() -> tuple[GpuSpec, ...]:
        return tuple(gpu_spec_from_record(record) for record in repository.all_rows(session, GpuRecord))

    return list(cached(session, ("gpus", "*"), build))


# Catalog reads and writes ----------------------------------------------------------------

OutT = TypeVar("OutT", GpuOut, ModelOut)


@dataclass(frozen=True)
class CatalogKind(Generic[OutT]):
    """What differs between the GPU and the model catalogs."""

    name: str  # "gpu" | "model": messages and tombstones
    record: type[GpuRecord | ModelRecord]
    out: type[OutT]
    path: str  # collection URL

    def to_out(self, record: Any) -> OutT:
        return self.out.model_validate(record, from_attributes=True)


GPUS = CatalogKind("gpu", GpuRecord, GpuOut, "/v1/gpus")
MODELS = CatalogKind("model", ModelRecord, ModelOut, "/v1/models")


def _record_or_404(session: Session, kind: CatalogKind[Any], slug: str, pointer: str = "/path/slug") -> Any:
    """The row, or a 404 naming the input (`pointer`) and the closest slugs the catalog has."""
    record = repository.get(session, kind.record, slug)
    if record is None:
        close = closest_slugs(slug, repository.all_slugs(session, kind.record))
        hint = (f"did you mean {', '.join(map(repr, close))}?" if close
                else f"no slug is close; GET {kind.path} lists them all")
        raise NotFound(f"No {kind.name} with slug {slug!r} in the catalog; {hint}",
                       errors=[(pointer, f"unknown {kind.name}; {hint}")])
    return record


def closest_slugs(slug: str, known: Sequence[str], limit: int = 3) -> list[str]:
    """Up to `limit` known slugs most like `slug` (typos, dots for dashes, a missing version)."""
    return difflib.get_close_matches(slug, known, n=limit, cutoff=0.6)


def read_one(session: Session, kind: CatalogKind[OutT], slug: str, pointer: str = "/path/slug") -> OutT:
    return kind.to_out(_record_or_404(session, kind, slug, pointer))


def read_page(session: Session, kind: CatalogKind[OutT], filters: Sequence[ColumnElement[bool]],
              limit: int, offset: int) -> tuple[list[OutT], int]:
    records, total = repository.page(session, kind.record, filters, limit, offset)
    return [kind.to_out(record) for record in records], total


def gpu_filters(vendor: str | None, family: str | None) -> list[ColumnElement[bool]]:
    filters = []
    if vendor is not None:
        filters.append(repository.equals_ignoring_case(GpuRecord.vendor, vendor))
    if family is not None:
        filters.append(repository.equals_ignoring_case(GpuRecord.family, family))
    return filters


def model_filters(architecture: str | None, attention: str | None) -> list[ColumnElement[bool]]:
    filters = []
    if architecture is not None:
        filters.append(ModelRecord.architecture == architecture)
    if attention is not None:
        filters.append(ModelRecord.attention_type == attention)
    return filters


def gpu_columns(slug: str, body: GpuIn) -> dict[str, Any]:
    gpu_spec_from_schema(body, pointer="/body", slug=slug)  # cross-field invariants -> 422
    return split_read_only(body)[0]


def model_columns(slug: str, body: ModelIn, pointer: str = "/body") -> dict[str, Any]:
    spec = model_spec_from_schema(body, pointer=pointer, slug=slug, name=body.name)
    return {**split_read_only(body)[0], "architecture": architecture_kind(spec), "attention_type": attention_kind(spec)}


def put(session: Session, kind: CatalogKind[OutT], slug: str, columns: dict[str, Any],
        preconditions: Preconditions, *, written_by: str,
        echoed: dict[str, Any] | None = None) -> tuple[OutT, bool]:
    """Create or replace a row (origin 'user') on behalf of the key named `written_by`; returns the
    stored row and whether it was created. `echoed`: read-only fields sent back with the body (see
    `check_echoed`)."""
    repository.lock_catalog(session)
    record = repository.get(session, kind.record, slug)
    preconditions.check(None if record is None else etag_of(kind.to_out(record)))
    check_echoed(kind, slug, None if record is None else kind.to_out(record), echoed or {})
    now = datetime.now(UTC)
    created = record is None
    if record is None:
        record = kind.record(slug=slug, **columns, origin=ORIGIN_USER, created_at=now, updated_at=now,
                             written_by=written_by)
        session.add(record)
        repository.remove_tombstone(session, kind.name, slug)
    else:
        for column, value in columns.items():
            setattr(record, column, value)
        record.origin = ORIGIN_USER
        record.updated_at = now
        record.written_by = written_by
    _flush_or_conflict(session, kind, slug)
    repository.bump_catalog_revision(session)
    return kind.to_out(record), created


def check_echoed(kind: CatalogKind[OutT], slug: str, stored: OutT | None, echoed: dict[str, Any]) -> None:
    """A body that GET returned may be PUT back: its read-only fields must describe the stored row.
    Another slug is a 422; another version a 412 (the row changed since it was read, as with a stale
    If-Match); any other read-only field that differs from the stored row a 422."""
    if "slug" in echoed and echoed["slug"] != slug:
        raise Unprocessable(
            f"The body is the {kind.name} {echoed['slug']!r} but the URL names {slug!r}",
            errors=[("/body/slug", f"must be {slug!r} (the URL's slug) or omitted; omit it to copy a row")])
    if "version" in echoed:
        if stored is None:
            raise PreconditionFailed(f"The body is version {echoed['version']} of {slug!r}, which does not exist; "
                                     "omit version to create it")
        if echoed["version"] != stored.version:
            raise PreconditionFailed(f"The body is version {echoed['version']} of {slug!r} but the stored row is "
                                     f"version {stored.version}; GET it again and reapply your change")
    if stored is None:
        return  # nothing to compare the rest with: a new row has its own origin and timestamps
    differing = [name for name, value in echoed.items()
                 if name not in ("slug", "version") and getattr(stored, name) != value]
    if differing:
        stored_json = stored.model_dump(mode="json", include=set(differing))
        raise Unprocessable(
            f"Read-only fields differ from the stored {kind.name}: {', '.join(differing)}",
            errors=[(f"/body/{name}", f"read-only: send the stored value {stored_json[name]} or omit it")
                    for name in differing])


def delete(session: Session, kind: CatalogKind[Any], slug: str, preconditions: Preconditions) -> None:
    repository.lock_catalog(session)
    record = _record_or_404(session, kind, slug)
    preconditions.check(etag_of(kind.to_out(record)))
    if slug in reference_slugs(kind.name):
        # Remember the deletion, or the next reference load would bring the row back.
        repository.add_tombstone(session, kind.name, slug, datetime.now(UTC))
    session.delete(record)
    _flush_or_conflict(session, kind, slug)
    repository.bump_catalog_revision(session)


def _flush_or_conflict(session: Session, kind: CatalogKind[Any], slug: str) -> None:
    try:
        session.flush()
    except StaleDataError:
        # The UPDATE/DELETE carried `WHERE version = <version read>` and matched nothing:
        # another writer got there first. Exactly one of two racing writers wins.
        raise PreconditionFailed(f"The {kind.name} {slug!r} was changed by another writer; "
                                 "GET it again and reapply your change") from None
    except IntegrityError:
        raise Conflict(f"The {kind.name} {slug!r} was created by another writer at the same time") from None


# Hugging Face config import --------------------------------------------------------------

IMPORT_SOURCE = "Imported from a Hugging Face config.json"


def _config_pointer(normalized: NormalizedConfig, location: tuple[Any, ...]) -> str:
    """Where in the imported config a catalog field's value came from (the key the client sent, an alias
    included: /body/num_local_experts for num_experts), else the field under /body."""
    name, *rest = location
    stated = normalized.pointers.get(name) if isinstance(name, str) else None
    return "/body" + stated + json_pointer(tuple(rest)) if stated is not None else json_pointer(("body", *location))


def import_model(session: Session, slug: str, config: object, *, written_by: str | None,
                 preconditions: Preconditions) -> tuple[ModelImport, bool]:
    """Normalize a raw config.json to the catalog shape; store it on behalf of the key named
    `written_by`, or only normalize it (a dry run) when that is None.

    Returns the result and whether a new row was created.
    """
    try:
        normalized = normalize_hf_config(config)
    except ConfigError as exc:
        raise Unprocessable(
            f"The config cannot be read as a model architecture ({len(exc.problems)} problems)",
            errors=[("/body" + pointer, message) for pointer, message in exc.problems],
        ) from None
    fields = {name: list(value) if isinstance(value, tuple) else value
              for name, value in normalized.fields.items() if name not in ("name", "slug")}
    hf_id = config.get("_name_or_path") if isinstance(config, dict) else None
    hf_id = hf_id if isinstance(hf_id, str) and 0 < len(hf_id) <= 200 and "\x00" not in hf_id else ""
    remarks = [*normalized.defaults_applied, *normalized.notes]
    try:
        body = ModelIn.model_validate({
            **fields,
            "name": normalized.fields.get("name") or hf_id or slug,
            "hf_id": hf_id,
            "source": IMPORT_SOURCE + (f" ({hf_id})" if hf_id else ""),
            "notes": "\n".join(remarks),
        })
    except ValidationError as exc:
        raise Unprocessable(
            "The config's values are out of range for a model architecture",
            errors=[(_config_pointer(normalized, error["loc"]), error["msg"]) for error in exc.errors()],
        ) from None
    columns = model_columns(slug, body)
    version = None
    created = False
    if written_by is not None:
        stored, created = put(session, MODELS, slug, columns, preconditions, written_by=written_by)
        version = stored.version
    result = ModelImport(
        slug=slug, stored=written_by is not None, version=version, model=body,
        architecture=columns["architecture"], attention_type=columns["attention_type"],
        defaults_applied=list(normalized.defaults_applied), notes=list(normalized.notes),
    )
    return result, created


