"""/v1/quotes: saved /v1/slo-plan answers for the quoting pipeline.

Quotes carry deal data (a customer's workload, SLO, hardware and price), so every quote route needs a
key: creating one the quotes:write scope, listing, reading and repricing (which stores nothing) the
quotes:read scope. A malformed quote id is a 422
problem naming /path/quote_id, like a malformed catalog slug; a well-formed id that matches no
quote is a 404.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Path, Request
from starlette.responses import Response

from app.db import RequestDeadline
from app.errors import problem_responses
from app.planning.schemas import SloPlanRequest
from app.quotes import service as quotes
from app.quotes.schemas import (
    IDEMPOTENCY_KEY_PATTERN,
    QUOTE_ID_EXAMPLE,
    QUOTE_ID_PATTERN,
    QuoteOut,
    QuotePage,
    RepriceOut,
    ReproduceOut,
)
from app.web import (
    ETAG_HEADER,
    NOT_MODIFIED,
    KeyFirstRoute,
    Limit,
    Offset,
    QuoteReader,
    QuoteWriter,
    SessionDep,
    json_with_etag,
    plan_offload,
)

router = APIRouter(prefix="/v1/quotes", tags=["quotes"], route_class=KeyFirstRoute)

QuoteIdPath = Annotated[str, Path(pattern=QUOTE_ID_PATTERN, max_length=36, description="Quote id (UUID4)",
                                  examples=[QUOTE_ID_EXAMPLE])]
IdempotencyKey = Annotated[str | None, Header(
    min_length=1, max_length=255, pattern=IDEMPOTENCY_KEY_PATTERN,
    description="Makes retries safe: the same key with the same body returns the quote stored the first "
                "time (200); with another body it is a 422. 1 to 255 printable ASCII characters.",
    examples=["order-2026-11-29-0042"],
)]


@router.post(
    "", response_model=QuoteOut, status_code=201, summary="Plan and save a quote",
    responses={
        200: {"description": "A retry with the same Idempotency-Key and body: the quote stored the first "
                             "time", "model": QuoteOut, "headers": ETAG_HEADER},
        201: {"description": "Created", "headers": {
            **ETAG_HEADER, "Location": {"description": "URL of the quote", "schema": {"type": "string"}}}},
        **problem_responses(401, 403, 404, 409, 413, 422, 503),
    },
)
def create_quote(request: Request, writer: QuoteWriter, body: SloPlanRequest,
                 idempotency_key: IdempotencyKey = None) -> Response:
    """Run the plan exactly as `POST /v1/slo-plan` does and store the request, a snapshot of every
    catalog row it read (with their versions), the result, the calculation version and the time.
    The stored quote never changes, even when the catalog does."""
    deadline: RequestDeadline | None = request.scope.get(RequestDeadline.SCOPE_KEY)
    stored, created = quotes.create_quote(request.app.state.session_factory, body, idempotency_key, writer.name,
                                          may_commit=deadline.claim_commit if deadline else lambda: True,
                                          offload=plan_offload(request))
    if created:
        return json_with_etag(request, stored, status_code=201,
                              headers={"Location": f"/v1/quotes/{stored.id}"})
    return json_with_etag(request, stored)


@router.get("", response_model=QuotePage, summary="List quotes, newest first", dependencies=[QuoteReader],
            responses={**NOT_MODIFIED, **problem_responses(401, 403, 422, 503)})
def list_quotes(request: Request, session: SessionDep, limit: Limit = 50, offset: Offset = 0) -> Response:
    return json_with_etag(request, quotes.list_quotes(session, limit, offset))


@router.get("/{quote_id}", response_model=QuoteOut, summary="Get a quote, exactly as stored",
            dependencies=[QuoteReader], responses={**NOT_MODIFIED, **problem_responses(401, 403, 404, 422, 503)})
def get_quote(request: Request, session: SessionDep, quote_id: QuoteIdPath) -> Response:
    """The same bytes (and ETag) as when the quote was made, whatever the catalog holds today."""
    return json_with_etag(request, quotes.read_quote(session, quote_id))


@router.post("/{quote_id}/reprice", response_model=RepriceOut, dependencies=[QuoteReader],
             summary="Plan a quote again on today's catalog",
             responses=problem_responses(401, 403, 404, 409, 422, 503))
def reprice_quote(request: Request, session: SessionDep, quote_id: QuoteIdPath) -> RepriceOut:
    """Run the stored request against today's catalog and list the differences: catalog rows changed,
    added or deleted since (a deleted candidate GPU is left out; a deleted model, the speculative draft
    model too, is planned from the architecture stored in the quote), and changed outcomes (feasibility, the cheapest plan's GPU,
    layout, replicas and $/hour). Stores nothing."""
    return quotes.reprice(session, quote_id, offload=plan_offload(request))


@router.post("/{quote_id}/reproduce", response_model=ReproduceOut, dependencies=[QuoteReader],
             summary="Plan a quote again from its own snapshot",
             responses=problem_responses(401, 403, 404, 409, 422, 503))
def reproduce_quote(request: Request, session: SessionDep, quote_id: QuoteIdPath) -> ReproduceOut:
    """Run the stored request on the quote's snapshot alone (its catalog rows, calibration profile and
    inline GPUs), never on today's catalog or profiles, and say whether the answer is byte for byte the
    stored one. Stores nothing. Quotes made before quotes kept their calibration profile are a 409."""
    return quotes.reproduce(session, quote_id, offload=plan_offload(request))
