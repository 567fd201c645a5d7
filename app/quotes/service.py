"""Saved quotes: run a /v1/slo-plan, freeze it with everything it read, reproduce or reprice it later.

A quote stores the validated request (canonical JSON and its SHA-256; inline GPUs and models are part
of it), a snapshot of everything else the plan read (every catalog row it resolved, each with its
`version`; the calibration profile's content and provenance; the engine rules and calculation
versions), the plan response as returned, the key that made it and the time. The snapshot alone
reproduces the answer (`reproduce`), whatever happens to the catalog and profiles afterwards. Quotes are only ever inserted, so one reads back byte for byte the same
forever, whatever happens to the catalog afterwards.

Transactions: unlike the catalog endpoints, creating a quote owns its transaction boundaries,
because they are the feature. The plan (up to a second of arithmetic) runs on a read-only session;
the write is one INSERT in its own short transaction. An `Idempotency-Key` is UNIQUE per API key in the
table, so of one key's concurrent creates with one Idempotency-Key the database lets exactly one insert win;
the others roll back, read the winner and answer with it (same request) or a 422 (another request). Each API
key's keys are its own: another key's equal Idempotency-Key neither finds nor blocks its quote. Nothing is
ever half-written: a quote is one row, inserted whole or not at all.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.calibration.profiles import profile_from_entries
from app.catalog import repository
from app.catalog import service as catalog_service
from app.catalog.reference import gpu_spec_from_record, model_spec_from_record
from app.catalog.schemas import GpuOut, ModelOut
from app.catalog.tables import GpuRecord, ModelRecord
from app.errors import Conflict, NotFound, ServiceUnavailable, Unprocessable
from app.planning import service as planning
from app.planning.schemas import SloPlanRequest, SloPlanResponse
from app.quotes.schemas import QuoteDifference, QuotePage, QuoteSummary, RepriceOut, ReproduceOut, StoredQuote
from app.quotes.tables import QuoteRecord
from app.sizing import CALCULATION_VERSION, ENGINE_RULES_VERSION
from app.sizing.calibration.fit import CalibrationProfile
from app.sizing.specs import GpuSpec, ModelSpec

IDEMPOTENCY_KEY_POINTER = "/header/idempotency-key"
# A catalog write between reading the revision and re-reading it means the plan and the snapshot
# may have seen different catalogs: plan again (a few times; writes are rare and quick).
CONSISTENT_READ_ATTEMPTS = 3
# Row fields every write changes; a difference in them alone is reported once, as the version.
ROW_BOOKKEEPING = ("version", "created_at", "updated_at", "written_by")

SessionFactory = Callable[[], Session]


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no spaces, UTF-8: equal documents give equal bytes (and hashes)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode()


def request_document(request: SloPlanRequest) -> dict[str, Any]:
    """The validated request as JSON, defaults filled in: two bodies that mean the same plan
    (one spelling out a default, one leaving it out) give the same document."""
    return request.model_dump(mode="json")


def sha256_hex(document: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(document)).hexdigest()


# The plan and the catalog rows it read -----------------------------------------------------

def _candidate_gpus(session: Session, request: SloPlanRequest) -> list[GpuOut]:
    """The catalog GPUs the plan resolves: the listed candidates, or every catalog GPU (inline GPUs are in
    the request)."""
    listed = request.candidates.gpus
    if listed is None:
        return [catalog_service.GPUS.to_out(record) for record in repository.all_rows(session, GpuRecord)]
    return [catalog_service.read_one(session, catalog_service.GPUS, slug) for slug in sorted(set(listed))]


def _models(session: Session, request: SloPlanRequest) -> list[ModelOut]:
    """Catalog models the plan resolves: the model (unless inline) and a speculative draft model, as the catalog
    holds them (a reprice plans a model deleted since from the quote's copy, `_RepriceSources`)."""
    slugs = {request.model} if request.model is not None else set()
    speculative = request.speculative
    if speculative is not None and speculative.draft_model is not None:
        slugs.add(speculative.draft_model)
    records = (repository.get(session, ModelRecord, slug) for slug in sorted(slugs))
    return [catalog_service.MODELS.to_out(record) for record in records if record is not None]


def catalog_snapshot(session: Session, request: SloPlanRequest, profile: dict[str, Any]) -> dict[str, Any]:
    """Everything the plan read besides its request: every catalog row it resolves, as stored now (JSON,
    with its version) by kind and slug; the calibration profile it used (content and provenance); and
    the versions of the engine rules and formulas."""
    return {
        "models": {row.slug: row.model_dump(mode="json") for row in _models(session, request)},
        "gpus": {row.slug: row.model_dump(mode="json") for row in _candidate_gpus(session, request)},
        "calibration_profile": profile,
        "engine_rules_version": ENGINE_RULES_VERSION,
        "calculation_version": CALCULATION_VERSION,
    }


def plan_with_snapshot(session: Session, request: SloPlanRequest, sources: planning.DatabaseSources | None = None,
                       offload: planning.Offload = planning.in_this_thread,
                       runnable: Callable[[Session, SloPlanRequest], SloPlanRequest] | None = None,
                       ) -> tuple[SloPlanResponse, dict[str, Any]]:
    """The plan and the snapshot of what it read, both from one catalog revision.

    Every catalog write bumps the revision in its own transaction, so an unchanged revision
    before and after means no write landed in between. The profile is the one the plan itself
    resolved (profiles are never rewritten, except the default by the reference loader). Its spec
    lookups read the revision in this transaction too (never a cached one). `runnable` makes the request
    plannable against the catalog of each attempt (a reprice leaves out the GPUs deleted since); a row it
    kept that a write deleted during the attempt (a 404 under a revision that moved) is another attempt.
    """
    session.info[catalog_service.CONSISTENT_READS] = True
    for _ in range(CONSISTENT_READ_ATTEMPTS):
        attempt = sources or planning.DatabaseSources(session)
        revision = repository.catalog_revision(session)
        planned = request if runnable is None else runnable(session, request)
        try:
            result = planning.plan_slo(session, planned, attempt, offload=offload)
        except NotFound:
            if repository.catalog_revision(session) == revision:
                raise
            session.expire_all()  # what the attempt read is from before the write
            continue
        snapshot = catalog_snapshot(session, planned, attempt.profile_documents[planned.calibration])
        if repository.catalog_revision(session) == revision:
            return result, snapshot
        session.expire_all()
    raise Conflict("The catalog kept changing while the plan ran; retry")


def cheapest_plan(result: dict[str, Any]) -> dict[str, Any] | None:
    """The first (cheapest) plan of a plan response's JSON, or None when nothing is feasible."""
    plans = result.get("plans") or []
    return plans[0] if result.get("feasible") and plans else None


# Creating and reading quotes ---------------------------------------------------------------

def _by_key(session_factory: SessionFactory, idempotency_key: str, created_by: str) -> QuoteRecord | None:
    """The quote the API key named `created_by` stored under `idempotency_key` (another key's is not it)."""
    with session_factory() as session:
        return session.scalar(select(QuoteRecord).where(QuoteRecord.idempotency_key == idempotency_key,
                                                        QuoteRecord.created_by == created_by))


def _replay(stored: QuoteRecord, request_sha256: str) -> StoredQuote:
    """The stored quote for a retried key, if the retry carries the same request: the same digest, or a stored
    request that today's schema reads as the same document (a quote stored before a field with a default was
    added has no such field; read today, it has the default, as the retry does)."""
    if stored.request_sha256 != request_sha256 and _todays_digest(stored) != request_sha256:
        raise Unprocessable(
            "This Idempotency-Key was already used with a different request; use a new key for a new quote",
            errors=[(IDEMPOTENCY_KEY_POINTER, "already used with another request body")],
        )
    return stored_quote(stored)


def _todays_digest(stored: QuoteRecord) -> str | None:
    """The SHA-256 of the stored request as today's schema reads it (None: it no longer validates)."""
    try:
        return sha256_hex(request_document(SloPlanRequest.model_validate_json(canonical_json(stored.request))))
    except ValidationError:
        return None


def create_quote(session_factory: SessionFactory, request: SloPlanRequest, idempotency_key: str | None,
                 created_by: str, may_commit: Callable[[], bool] = lambda: True,
                 offload: planning.Offload = planning.in_this_thread) -> tuple[StoredQuote, bool]:
    """Plan, snapshot and store a quote on behalf of the key named `created_by`; returns it and whether it was created just now (False:
    a retry with the same key and request, answered with the stored quote). `may_commit` is asked
    right before the write: False (the request ran past its deadline and its client was already told
    so) stores nothing."""
    document = request_document(request)
    digest = sha256_hex(document)
    if idempotency_key is not None and (earlier := _by_key(session_factory, idempotency_key, created_by)) is not None:
        return _replay(earlier, digest), False  # a retry: no need to plan again
    with session_factory() as session:  # read-only; closed (its transaction ended) before the write
        result, snapshot = plan_with_snapshot(session, request, offload=offload)
    result_document = result.model_dump(mode="json")
    cheapest = cheapest_plan(result_document)
    record = QuoteRecord(
        id=str(uuid.uuid4()),
        idempotency_key=idempotency_key,
        request_sha256=digest,
        request=document,
        catalog_snapshot=snapshot,
        result=result_document,
        calculation_version=CALCULATION_VERSION,
        created_at=datetime.now(UTC),
        model=request.model,
        feasible=bool(result_document.get("feasible")),
        cheapest_gpu=None if cheapest is None else cheapest["gpu"],
        cheapest_cost_per_hour_usd=None if cheapest is None else cheapest["cost_per_hour_usd"],
        created_by=created_by,
    )
    try:
        with session_factory() as session, session.begin():
            if not may_commit():
                raise ServiceUnavailable("The request ran past its deadline; the quote was not stored")
            session.add(record)
    except IntegrityError:
        if idempotency_key is None:
            raise
        # Another request of this API key with this Idempotency-Key inserted first (the UNIQUE constraint).
        winner = _by_key(session_factory, idempotency_key, created_by)
        if winner is None:
            raise Conflict("A concurrent request with this Idempotency-Key failed; retry") from None
        return _replay(winner, digest), False
    return stored_quote(record), True


def stored_quote(record: QuoteRecord) -> StoredQuote:
    return StoredQuote(
        id=record.id, created_at=record.created_at, created_by=record.created_by,
        calculation_version=record.calculation_version,
        request_sha256=record.request_sha256, request=record.request,
        catalog_snapshot=record.catalog_snapshot, result=record.result,
    )


def _record_or_404(session: Session, quote_id: str) -> QuoteRecord:
    record = session.get(QuoteRecord, quote_id)
    if record is None:
        raise NotFound(f"No quote with id {quote_id!r}")
    return record


def read_quote(session: Session, quote_id: str) -> StoredQuote:
    return stored_quote(_record_or_404(session, quote_id))


def summary(row: Any) -> QuoteSummary:
    """A list line from a QuoteRecord, or from a row of its summary columns."""
    return QuoteSummary.model_validate(row, from_attributes=True)


def list_quotes(session: Session, limit: int, offset: int) -> QuotePage:
    """Newest first (creation time, then id for quotes made in the same microsecond)."""
    total = session.scalar(select(func.count()).select_from(QuoteRecord)) or 0
    # Only the summary columns: a page never loads the request, snapshot or result documents.
    rows = session.execute(
        select(QuoteRecord.id, QuoteRecord.created_at, QuoteRecord.created_by, QuoteRecord.model, QuoteRecord.feasible,
               QuoteRecord.cheapest_gpu, QuoteRecord.cheapest_cost_per_hour_usd,
               QuoteRecord.calculation_version)
        .order_by(QuoteRecord.created_at.desc(), QuoteRecord.id.desc()).limit(limit).offset(offset)
    ).all()
    return QuotePage(items=[summary(row) for row in rows],
                     total=total, limit=limit, offset=offset)


# Repricing ---------------------------------------------------------------------------------

def _stored_request(record: QuoteRecord) -> SloPlanRequest:
    try:
        return SloPlanRequest.model_validate_json(canonical_json(record.request))
    except ValidationError:
        raise Conflict("The quote's request no longer validates against today's /v1/slo-plan request "
                       "schema; it cannot be repriced") from None


def _todays_request(session: Session, stored: SloPlanRequest) -> SloPlanRequest:
    """The stored request, made runnable against today's catalog: listed candidate GPUs deleted
    since are left out (with their price overrides). A model deleted since, the speculative draft model
    too, is planned from its stored row (`_RepriceSources`)."""
    changes: dict[str, Any] = {}
    candidates = stored.candidates
    if candidates.gpus is not None:
        remaining = [slug for slug in candidates.gpus if repository.get(session, GpuRecord, slug) is not None]
        if not remaining and not candidates.gpu_specs:
            raise Conflict("Every candidate GPU of this quote has been deleted from the catalog since; "
                           "there is nothing to reprice it on")
        prices = candidates.gpu_price_per_hour_usd
        if prices is not None:
            prices = {slug: price for slug, price in prices.items() if slug in remaining}
        changes["candidates"] = candidates.model_copy(
            update={"gpus": remaining, "gpu_price_per_hour_usd": prices})
    return stored.model_copy(update=changes) if changes else stored


# What a reprice does without a deleted row, in words.
WITHOUT_DELETED_ROW = {"gpu": "the reprice plans without it",
                       "model": "the reprice plans with the architecture stored in the quote"}


def _row_differences(kind: str, before: dict[str, Any], after: dict[str, Any]) -> Iterator[QuoteDifference]:
    """Snapshot rows against today's rows of one kind: deleted, added, and changed fields."""
    for slug in sorted(before.keys() - after.keys()):
        yield QuoteDifference(
            kind="catalog", subject=f"{kind} {slug}", field=None, change="deleted",
            before=before[slug]["version"], after=None,
            detail=f"{kind} {slug} (version {before[slug]['version']}) was deleted from the catalog since; "
                   + WITHOUT_DELETED_ROW[kind],
        )
    for slug in sorted(after.keys() - before.keys()):
        yield QuoteDifference(
            kind="catalog", subject=f"{kind} {slug}", field=None, change="added",
            before=None, after=after[slug]["version"],
            detail=f"{kind} {slug} (version {after[slug]['version']}) was added to the catalog since",
        )
    for slug in sorted(before.keys() & after.keys()):
        old, new = before[slug], after[slug]
        versions = f"version {old['version']} -> {new['version']}"
        changed = [name for name in sorted(old.keys() | new.keys())
                   if name not in ROW_BOOKKEEPING and old.get(name) != new.get(name)]
        for name in changed:
            yield QuoteDifference(
                kind="catalog", subject=f"{kind} {slug}", field=name, change="changed",
                before=old.get(name), after=new.get(name),
                detail=f"{kind} {slug} {name}: {old.get(name)!r} -> {new.get(name)!r} ({versions})",
            )
        if not changed and old["version"] != new["version"]:
            yield QuoteDifference(
                kind="catalog", subject=f"{kind} {slug}", field="version", change="changed",
                before=old["version"], after=new["version"],
                detail=f"{kind} {slug} was rewritten with the same values ({versions})",
            )


# What "the outcome" of a plan is, for a reprice: whether anything works, and the cheapest plan.
OUTCOME_FIELDS = ("gpu", "tensor_parallel", "pipeline_parallel", "weight_dtype", "kv_dtype",
                  "replicas", "gpus", "cost_per_hour_usd")


def _outcome_differences(before: dict[str, Any], after: dict[str, Any]) -> Iterator[QuoteDifference]:
    if bool(before.get("feasible")) != bool(after.get("feasible")):
        yield QuoteDifference(
            kind="outcome", subject="plan", field="feasible", change="changed",
            before=bool(before.get("feasible")), after=bool(after.get("feasible")),
            detail="The SLO " + ("can now be met" if after.get("feasible") else "can no longer be met"),
        )
    old, new = cheapest_plan(before), cheapest_plan(after)
    if old is None or new is None:
        return
    for name in OUTCOME_FIELDS:
        if old.get(name) != new.get(name):
            yield QuoteDifference(
                kind="outcome", subject="cheapest plan", field=name, change="changed",
                before=old.get(name), after=new.get(name),
                detail=f"cheapest plan {name}: {old.get(name)!r} -> {new.get(name)!r}",
            )


class _RepriceSources(planning.DatabaseSources):
    """Today's catalog and profiles; a model (the main or the draft one) or a named profile deleted since is
    replaced by the quote's copy of it (`snapshot`): the model keeps its slug and its Hugging Face id (the plan's
    name and launch commands)."""

    def __init__(self, session: Session, snapshot: dict[str, Any]) -> None:
        super().__init__(session)
        self.snapshot = snapshot
        self.stored_profile: dict[str, Any] | None = snapshot.get("calibration_profile")
        self.profile_deleted = False

    def model(self, slug: str) -> tuple[ModelSpec, str]:
        try:
            return super().model(slug)
        except NotFound:
            if slug not in self.snapshot["models"]:
                raise
        return SnapshotSources(self.snapshot).model(slug)

    def profile(self, name: str | None) -> CalibrationProfile:
        try:
            return super().profile(name)
        except NotFound:
            if self.stored_profile is None or name != self.stored_profile["name"]:
                raise
        self.profile_deleted = True
        self.profile_documents[name] = self.stored_profile
        return profile_from_entries(self.stored_profile["name"], self.stored_profile["entries"])


# Fields every write of a profile changes; a difference in them alone is no difference in the profile.
PROFILE_BOOKKEEPING = ("updated_at", "written_by")


def _profile_differences(before: dict[str, Any] | None, after: dict[str, Any],
                         deleted: bool) -> Iterator[QuoteDifference]:
    """The quote's calibration profile against the one a plan resolves today."""
    if before is None:
        return  # the quote was made before quotes kept their calibration profile
    subject = f"calibration profile {before['name']}"
    if deleted:
        yield QuoteDifference(
            kind="calibration", subject=subject, field=None, change="deleted", before=before["name"], after=None,
            detail=f"{subject} was deleted since; the reprice uses the copy stored in the quote")
        return
    if after["name"] != before["name"]:
        yield QuoteDifference(
            kind="calibration", subject="calibration profile (default)", field="name", change="changed",
            before=before["name"], after=after["name"],
            detail=f"requests that name no profile now use {after['name']!r} instead of {before['name']!r}")
        return
    for name in sorted(before.keys() | after.keys()):
        if name not in PROFILE_BOOKKEEPING and before.get(name) != after.get(name):
            yield QuoteDifference(
                kind="calibration", subject=subject, field=name, change="changed",
                before=before.get(name), after=after.get(name),
                detail=f"{subject} {name} changed (stored {before.get('updated_at') or 'builtin'}, "
                       f"today {after.get('updated_at') or 'builtin'})")


def _version_differences(record: QuoteRecord) -> Iterator[QuoteDifference]:
    stored_rules = record.catalog_snapshot.get("engine_rules_version")
    if stored_rules is not None and stored_rules != ENGINE_RULES_VERSION:
        yield QuoteDifference(
            kind="engine_rules_version", subject="engine rules", field="engine_rules_version", change="changed",
            before=stored_rules, after=ENGINE_RULES_VERSION,
            detail=f"The engine rules changed: {stored_rules} -> {ENGINE_RULES_VERSION}")
    if record.calculation_version != CALCULATION_VERSION:
        yield QuoteDifference(
            kind="calculation_version", subject="formulas", field="calculation_version", change="changed",
            before=record.calculation_version, after=CALCULATION_VERSION,
            detail=f"The formulas changed: {record.calculation_version} -> {CALCULATION_VERSION}",
        )


def reprice(session: Session, quote_id: str, offload: planning.Offload = planning.in_this_thread) -> RepriceOut:
    """Plan the stored request again against today's catalog and profiles and list what changed; stores
    nothing."""
    record = _record_or_404(session, quote_id)
    stored = record.catalog_snapshot
    sources = _RepriceSources(session, stored)
    result, snapshot = plan_with_snapshot(session, _stored_request(record), sources, offload, _todays_request)
    differences = [
        *_row_differences("model", stored["models"], snapshot["models"]),
        *_row_differences("gpu", stored["gpus"], snapshot["gpus"]),
        *_profile_differences(stored.get("calibration_profile"), snapshot["calibration_profile"],
                              sources.profile_deleted),
        *_version_differences(record),
    ]
    differences.extend(_outcome_differences(record.result, result.model_dump(mode="json")))
    return RepriceOut(quote_id=record.id, original=summary(record), repriced=result, differences=differences)


# Reproducing -------------------------------------------------------------------------------

class SnapshotSources:
    """A quote's snapshot as the plan's only source: catalog rows and the calibration profile as they
    were when the quote was made, whatever the catalog and profiles hold today."""

    def __init__(self, snapshot: dict[str, Any]) -> None:
        self.snapshot = snapshot

    def _row(self, kind: str, slug: str) -> bytes:
        try:
            return canonical_json(self.snapshot[kind][slug])
        except KeyError:
            raise Conflict(f"The quote's snapshot holds no {kind} {slug!r}; it cannot be reproduced") from None

    def model(self, slug: str) -> tuple[ModelSpec, str]:
        row = ModelOut.model_validate_json(self._row("models", slug))
        return model_spec_from_record(row), row.hf_id or slug

    def gpu(self, slug: str) -> GpuSpec:
        return gpu_spec_from_record(GpuOut.model_validate_json(self._row("gpus", slug)))

    def all_gpus(self) -> list[GpuSpec]:
        return [self.gpu(slug) for slug in sorted(self.snapshot["gpus"])]

    def profile(self, name: str | None) -> CalibrationProfile:
        document = self.snapshot["calibration_profile"]
        return profile_from_entries(document["name"], document["entries"])

    def profile_document(self, name: str | None) -> dict[str, Any]:
        return self.snapshot["calibration_profile"]


def reproduce(session: Session, quote_id: str, offload: planning.Offload = planning.in_this_thread) -> ReproduceOut:
    """Plan the stored request from the quote's snapshot alone; stores nothing."""
    record = _record_or_404(session, quote_id)
    if "calibration_profile" not in record.catalog_snapshot:
        raise Conflict("This quote was made before quotes kept their calibration profile; it cannot be "
                       "reproduced from itself (reprice it instead)")
    result = planning.plan_slo(session, _stored_request(record), SnapshotSources(record.catalog_snapshot),
                               offload=offload)
    identical = canonical_json(result.model_dump(mode="json")) == canonical_json(record.result)
    return ReproduceOut(quote_id=record.id, identical=identical, stored_calculation_version=record.calculation_version,
                        calculation_version=CALCULATION_VERSION,
                        stored_engine_rules_version=record.catalog_snapshot.get("engine_rules_version"),
                        engine_rules_version=ENGINE_RULES_VERSION, result=result)
