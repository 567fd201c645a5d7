"""Operations: liveness, readiness (database reachable and migrated), Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.responses import Response

from app.common import Health, Readiness
from app.db import database_revisions, migration_heads
from app.errors import ServiceUnavailable, problem_responses

router = APIRouter(tags=["operations"])

# Never wait for one of the per-process request slots (app.main): a process whose slots are all busy is alive
# and can be scraped. Queued behind the work, a liveness probe would time out under load and have an
# orchestrator restart a healthy, busy process, dropping its requests in flight. Readiness stays queued: a
# saturated process reads as not ready, and traffic goes to the other replicas until it catches up.
UNQUEUED_PATHS = frozenset({"/healthz", "/metrics"})


@router.get("/healthz", response_model=Health, summary="Liveness", responses=problem_responses())
def healthz() -> Health:
    """The process is up and serving; says nothing about the database."""
    return Health(status="ok")


@router.get("/readyz", response_model=Readiness, summary="Readiness", responses=problem_responses(503))
def readyz(request: Request) -> Readiness:
    """Ready when the database answers and is at the migration head (503 problem otherwise)."""
    engine = request.app.state.engine
    try:
        current = database_revisions(engine)
    except (DBAPIError, PoolTimeoutError):
        raise ServiceUnavailable("The database is unreachable", headers={"Retry-After": "5"}) from None
    expected = migration_heads()
    if current != expected:
        found = ", ".join(sorted(current)) or "no migrations"
        raise ServiceUnavailable(f"The database is at {found}, the service needs {', '.join(sorted(expected))}: "
                                 "run `alembic upgrade head`", headers={"Retry-After": "5"})
    return Readiness(status="ready", database=engine.dialect.name, migration=", ".join(sorted(current)))


# HEAD where GET is (RFC 9110 section 9.1; some monitors probe with it): the GET's status and headers, no body.
@router.head("/healthz", include_in_schema=False)
def healthz_head() -> Response:
    return Response(status_code=200)


@router.head("/readyz", include_in_schema=False)
def readyz_head(request: Request) -> Response:
    readyz(request)  # a database not ready raises the same 503 problem
    return Response(status_code=200)


@router.get(
    "/metrics", summary="Prometheus metrics", response_class=Response,
    responses={200: {"description": "Prometheus text exposition format",
                     "content": {"text/plain": {"schema": {"type": "string"},
                                                "example": "http_requests_total{method=\"GET\",route=\"/v1/gpus\","
                                                           "status=\"200\"} 3.0\n"}}},
               **problem_responses()},
)
def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
