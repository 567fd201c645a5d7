"""Shapes of /v1/quotes: a saved /v1/slo-plan answer, its list summaries, and a reprice report.

A quote's body is stored once and served as stored: `StoredQuote` carries the request, catalog
snapshot and result as the JSON documents they were saved as (never re-validated, so a later change
to the plan schema cannot alter or break an old quote); `QuoteOut` narrows those documents to their
schemas for the OpenAPI description.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from app.catalog.schemas import GPU_OUT_EXAMPLE, MODEL_OUT_EXAMPLE, GpuOut, ModelOut, UtcDatetime
from app.common import Page, Slug, schema_examples
from app.planning.schemas import ISSUE_EXAMPLE, SloPlanRequest, SloPlanResponse

QUOTE_ID_PATTERN = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
# Printable ASCII (space to tilde), 1 to 255 characters: enough for a UUID or an order number.
IDEMPOTENCY_KEY_PATTERN = r"^[\x20-\x7e]*[\x21-\x7e][\x20-\x7e]*$"  # printable ASCII, not only spaces

# The plan's own first response example, so a quote's example shows a complete result.
SLO_PLAN_RESPONSE_EXAMPLE: dict[str, Any] = (
    SloPlanResponse.model_config["json_schema_extra"]["examples"][0])  # type: ignore[index]
QUOTE_ID_EXAMPLE = "0b7c9d6e-3f4a-4e2b-9c1d-5a6b7c8d9e0f"
CREATED_AT_EXAMPLE = "2026-11-29T10:15:30.123456Z"
CREATED_BY_DESCRIPTION = ("Name of the API key that created the quote, at created_at (never the secret); null for "
                          "quotes made before keys had names")
# Llama-3.1-70B has Llama-3-70B's architecture with a 128k context.
SNAPSHOT_EXAMPLE: dict[str, Any] = {
    "models": {"llama-3.1-70b": {**MODEL_OUT_EXAMPLE, "slug": "llama-3.1-70b", "name": "Llama-3.1-70B",
                                 "hf_id": "meta-llama/Llama-3.1-70B", "max_position_embeddings": 131072}},
    "gpus": {"h100-sxm": GPU_OUT_EXAMPLE},
    "calibration_profile": {"name": "builtin", "origin": "builtin", "description": "Cited constants, not fitted",
                            "created_at": None, "updated_at": None, "written_by": None, "entries": [],
                            "provenance": None},
    "engine_rules_version": "2026.12.01",
    "calculation_version": "2026.12.03.4",
}


class CatalogSnapshot(BaseModel):
    """Everything the plan read besides its request, as it was: catalog rows (each with its `version`)
    keyed by slug, the calibration profile's content and provenance, and the engine rules and formula
    versions. Together with the request (which holds inline GPUs and models) it reproduces the answer."""

    model_config = schema_examples(SNAPSHOT_EXAMPLE)

    models: dict[str, ModelOut] = Field(description="The model (and a draft model) by catalog slug; "
                                                    "empty for an inline model_spec")
    gpus: dict[str, GpuOut] = Field(description="Every candidate catalog GPU the plan resolved, by slug")
    calibration_profile: dict[str, Any] | None = Field(
        None, description="The calibration profile the plan used, whole: name, origin, description, entries "
                          "(efficiencies per GPU family and precision, per GPU maker, and global), provenance, "
                          "when and by which key it was stored (absent in quotes made before quotes kept it)")
    engine_rules_version: str | None = Field(None, description="Version of the engine rules the plan applied")
    calculation_version: str | None = Field(None, description="Version of the formulas the plan applied")


class StoredQuote(BaseModel):
    """A quote exactly as stored: what GET /v1/quotes/{id} returns, unchanged forever."""

    id: str = Field(pattern=QUOTE_ID_PATTERN, description="UUID4", examples=[QUOTE_ID_EXAMPLE])
    created_at: UtcDatetime
    created_by: str | None = Field(description=CREATED_BY_DESCRIPTION)
    calculation_version: str = Field(description="Version of the formulas that produced the result")
    request_sha256: str = Field(description="SHA-256 of the canonical request JSON (sorted keys, no spaces)")
    request: dict[str, Any]
    catalog_snapshot: dict[str, Any]
    result: dict[str, Any]


QUOTE_EXAMPLE: dict[str, Any] = {
    "id": QUOTE_ID_EXAMPLE,
    "created_at": CREATED_AT_EXAMPLE,
    "created_by": "sales-desk",
    "calculation_version": "2026.12.03.4",
    "request_sha256": "5d41402abc4b2a76b9719d911017c592a9f3e0c1d2b3a4f5e6d7c8b9a0f1e2d3",
    "request": SloPlanRequest.model_validate(ISSUE_EXAMPLE).model_dump(mode="json"),  # defaults filled in
    "catalog_snapshot": SNAPSHOT_EXAMPLE,
    "result": SLO_PLAN_RESPONSE_EXAMPLE,
}


class QuoteOut(StoredQuote):
    """A saved plan: the validated request, the catalog rows it read (with their versions), the
    result as /v1/slo-plan returned it, the calculation version and the time it was made."""

    model_config = schema_examples(QUOTE_EXAMPLE)

    request: SloPlanRequest  # type: ignore[assignment]
    catalog_snapshot: CatalogSnapshot  # type: ignore[assignment]
    result: SloPlanResponse  # type: ignore[assignment]


SUMMARY_EXAMPLE: dict[str, Any] = {
    "id": QUOTE_ID_EXAMPLE, "created_at": CREATED_AT_EXAMPLE, "created_by": "sales-desk", "model": "llama-3-70b",
    "feasible": True,
    "cheapest_gpu": "h100-sxm", "cheapest_cost_per_hour_usd": 58.24, "calculation_version": "2026.12.03.4",
}


class QuoteSummary(BaseModel):
    """One line of the quote list."""

    model_config = schema_examples(SUMMARY_EXAMPLE)

    id: str = Field(pattern=QUOTE_ID_PATTERN, examples=[QUOTE_ID_EXAMPLE])
    created_at: UtcDatetime
    created_by: str | None = Field(description=CREATED_BY_DESCRIPTION)
    model: Slug | None = Field(description="Catalog slug of the model; null for an inline model_spec")
    feasible: bool = Field(description="Whether any candidate met the SLO")
    cheapest_gpu: Slug | None = Field(description="GPU of the cheapest plan; null when infeasible")
    cheapest_cost_per_hour_usd: float | None = Field(
        description="$/hour of the cheapest plan; null when infeasible or when no candidate has a price")
    calculation_version: str


class QuotePage(Page[QuoteSummary]):
    """One page of quotes, newest first."""

    model_config = schema_examples({"items": [SUMMARY_EXAMPLE], "total": 1, "limit": 50, "offset": 0})


DIFFERENCE_EXAMPLES: list[dict[str, Any]] = [
    {"kind": "catalog", "subject": "gpu h100-sxm", "field": "price_per_hour_usd", "change": "changed",
     "before": 3.64, "after": 2.99,
     "detail": "gpu h100-sxm price_per_hour_usd: 3.64 -> 2.99 (version 1 -> 2)"},
    {"kind": "catalog", "subject": "gpu h200-sxm", "field": None, "change": "deleted", "before": 1,
     "after": None, "detail": "gpu h200-sxm (version 1) was deleted from the catalog since; "
                              "the reprice plans without it"},
    {"kind": "outcome", "subject": "cheapest plan", "field": "cost_per_hour_usd", "change": "changed",
     "before": 58.24, "after": 47.84, "detail": "cheapest plan cost_per_hour_usd: 58.24 -> 47.84"},
]


class QuoteDifference(BaseModel):
    """One way today's answer differs from the stored quote."""

    model_config = schema_examples(*DIFFERENCE_EXAMPLES)

    kind: Literal["catalog", "calibration", "engine_rules_version", "calculation_version", "outcome"] = Field(
        description="catalog: a row the quote read changed, appeared or was deleted; calibration: the "
                    "profile the quote used changed or was deleted, or another profile is now the default; "
                    "engine_rules_version / calculation_version: the engine rules or formulas changed; "
                    "outcome: the plan's answer changed")
    subject: str = Field(description='What changed: "gpu <slug>", "model <slug>", "cheapest plan", ...')
    field: str | None = Field(description="The changed field; null when a whole row appeared or went away")
    change: Literal["changed", "added", "deleted"]
    before: Any = Field(description="Stored value (a row's version for added/deleted rows)")
    after: Any = Field(description="Today's value (a row's version for added/deleted rows)")
    detail: str = Field(description="The difference in words")


class RepriceOut(BaseModel):
    """A stored quote's request planned again against today's catalog (nothing is stored)."""

    model_config = schema_examples({
        "quote_id": QUOTE_ID_EXAMPLE, "original": SUMMARY_EXAMPLE, "repriced": SLO_PLAN_RESPONSE_EXAMPLE,
        "differences": DIFFERENCE_EXAMPLES,
    })

    quote_id: str = Field(pattern=QUOTE_ID_PATTERN, examples=[QUOTE_ID_EXAMPLE])
    original: QuoteSummary
    repriced: SloPlanResponse = Field(description="The plan as /v1/slo-plan answers it today")
    differences: list[QuoteDifference] = Field(
        description="Changed catalog rows first, then the calibration profile, versions, and changed outcomes; "
                    "empty when nothing changed")


class ReproduceOut(BaseModel):
    """A stored quote's request planned again from the quote's own snapshot (nothing else is read, nothing
    is stored)."""

    model_config = schema_examples({"quote_id": QUOTE_ID_EXAMPLE, "identical": True,
                              "stored_calculation_version": "2026.12.03.4", "calculation_version": "2026.12.03.4",
                              "stored_engine_rules_version": "2026.12.01", "engine_rules_version": "2026.12.01",
                              "result": SLO_PLAN_RESPONSE_EXAMPLE})

    quote_id: str = Field(pattern=QUOTE_ID_PATTERN, examples=[QUOTE_ID_EXAMPLE])
    identical: bool = Field(description="Whether the result is byte for byte the stored one (canonical JSON); "
                                        "expected whenever the calculation and engine rules versions are unchanged")
    stored_calculation_version: str = Field(description="Version of the formulas that made the quote")
    calculation_version: str = Field(description="Version of the formulas that reproduced it now")
    stored_engine_rules_version: str | None = Field(
        description="Version of the engine rules that made the quote (null: a quote made before quotes kept it)")
    engine_rules_version: str = Field(description="Version of the engine rules that reproduced it now")
    result: SloPlanResponse = Field(description="The plan recomputed from the snapshot")
