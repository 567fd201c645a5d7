"""Which efficiencies a request's expected numbers use: calibration profiles, stored in SQL.

Every endpoint that reports an *expected* time resolves its efficiencies here, so one place decides
which calibration profile applies and every response can name it, and what the profile's cross-validation
says of such predictions (`HeldOutErrors`). Profiles:

- `builtin`: the cited constants of `efficiency.DEFAULT_EFFICIENCY` (uncalibrated); always there.
- `default`: fitted to the published measurements by `python -m app.calibrate` and shipped as
  `app/data/calibration/default-profile.json`; `python -m app.load_catalog` stores it. A request that
  names no profile uses it, and `builtin` until it has been loaded.
- profiles users fit to their own measurements with POST /v1/calibrations.

A stored profile is one row: its entries (an `Efficiency` per GPU family and compute precision, with a
global fallback) and its provenance (the measurements' file hash, rows used, date, fit error, leave-one-
source-out error, parameter bounds) as JSON documents, plus the fields a list page shows as columns.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.calibration import crossval
from app.calibration.held_out_schemas import HeldOutErrorOut
from app.calibration.tables import CalibrationProfileRecord
from app.catalog import repository as catalog_repository
from app.catalog import service as catalog_service
from app.catalog.tables import ORIGIN_REFERENCE
from app.errors import Conflict, NotFound
from app.sizing.calibration.fit import CalibrationProfile, ProfileEntry, single_entry_profile
from app.sizing.hardware.efficiency import DEFAULT_EFFICIENCY, Efficiency
from app.sizing.specs import GpuSpec

BUILTIN_PROFILE = "builtin"
DEFAULT_PROFILE = "default"
RESERVED_PROFILE_NAMES = frozenset({BUILTIN_PROFILE, DEFAULT_PROFILE})
DEFAULT_PROFILE_PATH = Path(__file__).resolve().parents[1] / "data" / "calibration" / "default-profile.json"

BUILTIN_DESCRIPTION = ("Cited constants, not fitted: the published A100 GEMM curve, 70% of HBM bandwidth, "
                       "0.3 ms per step + 3 us per layer, 7.5 us per all-reduce (SIZING.md sections 5-6).")

# The numeric parameters of an `Efficiency` (the curve and the source are stored beside them).
_EFFICIENCY_FIELDS = tuple(field.name for field in fields(Efficiency)
                           if field.init and field.name not in ("compute_curve", "source"))
_FLAG_FIELDS = frozenset(field.name for field in fields(Efficiency) if field.type in (bool, "bool"))


# Documents <-> profiles -----------------------------------------------------------------------

def entry_document(entry: ProfileEntry) -> dict[str, Any]:
    efficiency = entry.efficiency
    return {
        "family": entry.family, "compute_dtype": entry.compute_dtype, "rows": entry.rows,
        **{name: getattr(efficiency, name) for name in _EFFICIENCY_FIELDS},
        "compute_curve": [[tokens, fraction] for tokens, fraction in efficiency.compute_curve],
        "source": efficiency.source,
    }


def profile_from_entries(name: str, entries: list[dict[str, Any]]) -> CalibrationProfile:
    """A profile from its stored entry documents (raises ValueError on inconsistent values)."""
    return CalibrationProfile(name, tuple(
        ProfileEntry(
            family=entry["family"], compute_dtype=entry["compute_dtype"], rows=int(entry["rows"]),
            efficiency=Efficiency(
                # A parameter a stored entry predates keeps its default (and must have one).
                **{name: None if entry[name] is None else bool(entry[name]) if name in _FLAG_FIELDS
                   else float(entry[name]) for name in _EFFICIENCY_FIELDS if name in entry},
                compute_curve=tuple((int(tokens), float(fraction)) for tokens, fraction in entry["compute_curve"]),
                source=entry["source"],
            ),
        )
        for entry in entries
    ))


def profile_document(profile: CalibrationProfile, *, description: str, provenance: dict[str, Any],
                     created_at: datetime) -> dict[str, Any]:
    """The JSON form of a profile: what the default-profile file holds and the API returns."""
    return {
        "name": profile.name,
        "description": description,
        "created_at": created_at.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "entries": [entry_document(entry) for entry in profile.entries],
        "provenance": provenance,
    }


def builtin_profile() -> CalibrationProfile:
    return single_entry_profile(BUILTIN_PROFILE, DEFAULT_EFFICIENCY)


# Resolution -----------------------------------------------------------------------------------

def _parsed(session: Session, name: str) -> CalibrationProfile | None:
    """The stored profile `name` parsed, None when there is none; cached with the catalog's specs (every
    profile write bumps the catalog revision), so a request reads no profile row."""
    def build() -> CalibrationProfile | None:
        record = session.get(CalibrationProfileRecord, name)
        return None if record is None else profile_from_entries(record.name, record.entries)

    return catalog_service.cached(session, ("calibration-profile", name), build)


def get_profile(session: Session, name: str | None = None, pointer: str = "/body/calibration") -> CalibrationProfile:
    """The named profile (None = the default: `default` once loaded, else `builtin`); 404 if unknown, naming the
    input (`pointer`: where the request named it; every sizing body calls it `calibration`)."""
    if name is None:
        return _parsed(session, DEFAULT_PROFILE) or builtin_profile()
    if name == BUILTIN_PROFILE:
        return builtin_profile()
    profile = _parsed(session, name)
    if profile is None:
        raise _unknown_profile(name, pointer)
    return profile


def _unknown_profile(name: str, pointer: str) -> NotFound:
    return NotFound(f"calibration profile {name!r} does not exist",
                    errors=[(pointer, "unknown calibration profile; GET /v1/calibrations lists them all")])


def cross_validation(session: Session, name: str | None = None) -> dict[str, Any] | None:
    """The cross-validation of the profile `get_profile(session, name)` resolves (its provenance's
    `cross_validation`); None for `builtin` and for profiles fitted without one. Cached as the profile is."""
    resolved = get_profile(session, name).name
    if resolved == BUILTIN_PROFILE:
        return None

    def build() -> dict[str, Any] | None:
        record = session.get(CalibrationProfileRecord, resolved)
        return None if record is None else (record.provenance or {}).get("cross_validation")

    return catalog_service.cached(session, ("calibration-cross-validation", resolved), build)


class HeldOutErrors:
    """The held-out errors one model's predictions on one engine report (`crossval.held_out_error`), from
    a profile's cross-validation (`validation`: `cross_validation(...)`, or a snapshot's provenance's)."""

    def __init__(self, validation: dict[str, Any] | None, model_id: str | None, engine: str | None) -> None:
        self.validation = validation
        self.model_family = crossval.publisher(model_id)  # as the cross-validation groups rows
        self.engine = engine

    def out(self, layout_kind: str, gpus: Sequence[str]) -> HeldOutErrorOut | None:
        """Built once per cross-validation document and question, and shared by the answers that nest it (as
        `efficiency_out` is: a nested model is kept, not copied, and nothing mutates an answer)."""
        key = (id(self.validation), layout_kind, tuple(gpus), self.model_family, self.engine)
        known = _HELD_OUT_MEMO.get(key)
        if known is not None and known[0] is self.validation:  # the same document, not one at a reused id
            return known[1]
        found = crossval.held_out_error(self.validation, layout_kind=layout_kind, gpus=gpus,
                                        model_family=self.model_family, engine=self.engine)
        answer = None if found is None else HeldOutErrorOut.model_validate(found)
        if len(_HELD_OUT_MEMO) >= HELD_OUT_MEMO_SIZE:
            _HELD_OUT_MEMO.clear()
        _HELD_OUT_MEMO[key] = (self.validation, answer)
        return answer


HELD_OUT_MEMO_SIZE = 512
_HELD_OUT_MEMO: dict[tuple[Any, ...], tuple[dict[str, Any] | None, HeldOutErrorOut | None]] = {}


def _iso(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    moment = moment if moment.tzinfo else moment.replace(tzinfo=UTC)  # SQLite returns naive UTC
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def profile_snapshot(session: Session, name: str | None = None) -> tuple[CalibrationProfile, dict[str, Any]]:
    """The named profile (None = the default, as `get_profile`) and the whole of it as a JSON document:
    its entries (content) and provenance, and who stored it when. A quote keeps this document, so the
    quote can be explained and reproduced after the profile is deleted or a new default is shipped."""
    profile = get_profile(session, name)
    if profile.name == BUILTIN_PROFILE:
        return profile, {
            "name": BUILTIN_PROFILE, "origin": "builtin", "description": BUILTIN_DESCRIPTION,
            "created_at": None, "updated_at": None, "written_by": None,
            "entries": [entry_document(entry) for entry in profile.entries], "provenance": None,
        }
    record = get_record(session, profile.name)
    return profile, {
        "name": record.name, "origin": record.origin, "description": record.description,
        "created_at": _iso(record.created_at), "updated_at": _iso(record.updated_at),
        "written_by": record.written_by, "entries": record.entries, "provenance": record.provenance,
    }


def resolve_efficiency(
    session: Session, gpu: GpuSpec, compute_dtype: str, profile: str | None = None
) -> tuple[Efficiency, str]:
    """Efficiency for `gpu` at `compute_dtype` under the named profile (None = the default profile).

    Returns the efficiency and the name of the profile that produced it; the efficiency's `source`
    says which entry of the profile (GPU family and precision, the GPU maker's, or the global fallback) applied.
    """
    resolved = get_profile(session, profile)
    return resolved.efficiency_for(gpu.family, compute_dtype, gpu.vendor), resolved.name


# Storage --------------------------------------------------------------------------------------

def page_of_records(session: Session, limit: int, offset: int) -> tuple[list[CalibrationProfileRecord], int]:
    """Stored profiles in the byte order of their names (one page), and how many there are."""
    total = session.scalar(select(func.count()).select_from(CalibrationProfileRecord)) or 0
    name = catalog_repository.in_byte_order(session, CalibrationProfileRecord.name)
    records = session.scalars(select(CalibrationProfileRecord).order_by(name).limit(limit).offset(offset))
    return list(records), total


def default_profile_name(session: Session) -> str:
    """What a request that names no profile gets."""
    return DEFAULT_PROFILE if session.get(CalibrationProfileRecord, DEFAULT_PROFILE) is not None else BUILTIN_PROFILE


def get_record(session: Session, name: str, pointer: str = "/path/name") -> CalibrationProfileRecord:
    record = session.get(CalibrationProfileRecord, name)
    if record is None:
        raise _unknown_profile(name, pointer)
    return record


def _columns(document: dict[str, Any]) -> dict[str, Any]:
    provenance = document["provenance"]
    return {
        "description": document["description"],
        "entries": document["entries"],
        "provenance": provenance,
        "source_sha256": provenance["source_sha256"],
        "rows_used": provenance["rows_used"],
        "fit_median_abs_pct_error": provenance["fit_error"]["after"]["median_abs_pct_error"],
        "created_at": datetime.fromisoformat(document["created_at"]),  # ISO 8601, "Z" for UTC
    }


def store_profile(session: Session, document: dict[str, Any], *, origin: str, written_by: str | None = None,
                  now: datetime | None = None) -> CalibrationProfileRecord:
    """Insert a new profile (written by the key named `written_by`; None for the service's own data); a
    name already taken is a 409 (profiles are never overwritten by users)."""
    name = document["name"]
    if session.get(CalibrationProfileRecord, name) is not None:
        raise Conflict(f"a calibration profile named {name!r} already exists; choose another name")
    record = CalibrationProfileRecord(name=name, origin=origin, updated_at=now or datetime.now(UTC),
                                      written_by=written_by, **_columns(document))
    session.add(record)
    try:
        session.flush()
    except IntegrityError:
        raise Conflict(f"a calibration profile named {name!r} was created at the same time") from None
    catalog_repository.bump_catalog_revision(session)
    return record


def read_default_profile_document(path: Path = DEFAULT_PROFILE_PATH) -> dict[str, Any]:
    with path.open(encoding="utf-8") as handle:
        return json.load(handle)


def load_default_profile(session: Session, *, now: datetime | None = None,
                         path: Path = DEFAULT_PROFILE_PATH) -> str:
    """Store the shipped default profile (`python -m app.load_catalog` calls this); idempotent.

    Returns "inserted", "updated" (the shipped file changed since the last load) or "unchanged".
    Does not commit.
    """
    document = read_default_profile_document(path)
    if document["name"] != DEFAULT_PROFILE:
        raise ValueError(f"{path} holds profile {document['name']!r}, not {DEFAULT_PROFILE!r}")
    profile_from_entries(DEFAULT_PROFILE, document["entries"])  # refuse a broken file before storing it
    now = now or datetime.now(UTC)
    columns = _columns(document)
    record = session.get(CalibrationProfileRecord, DEFAULT_PROFILE)
    if record is None:
        session.add(CalibrationProfileRecord(name=DEFAULT_PROFILE, origin=ORIGIN_REFERENCE, updated_at=now,
                                             **columns))
        session.flush()
        catalog_repository.bump_catalog_revision(session)
        return "inserted"
    if all(_same(getattr(record, column), value) for column, value in columns.items()):
        return "unchanged"
    for column, value in columns.items():
        setattr(record, column, value)
    record.origin = ORIGIN_REFERENCE
    record.updated_at = now
    session.flush()
    catalog_repository.bump_catalog_revision(session)
    return "updated"


def _same(stored: Any, value: Any) -> bool:
    if isinstance(stored, datetime):  # SQLite returns naive UTC timestamps
        stored = stored if stored.tzinfo else stored.replace(tzinfo=UTC)
    return bool(stored == value)
