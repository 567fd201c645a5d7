"""/v1/slo-plan: the cheapest deployment that meets a latency SLO, with simulated percentiles."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from app.errors import problem_responses
from app.planning import service as planning
from app.planning.schemas import SloPlanRequest, SloPlanResponse
from app.web import KeyFirstRoute, SizingRead, json_response, plan_offload

router = APIRouter(prefix="/v1/slo-plan", tags=["sizing"], dependencies=[SizingRead], route_class=KeyFirstRoute)


@router.post("", response_model=SloPlanResponse, summary="Cheapest deployment meeting a latency SLO",
             responses=problem_responses(404, 413, 422, 503))
async def slo_plan(request: Request, body: SloPlanRequest) -> Response:
    """Searches GPUs, tensor/pipeline parallelism, precisions and engine batch limits for the cheapest
    fleet whose simulated p-th percentile TTFT, TPOT (and E2E, and goodput) meet the SLO at the peak
    load. Configurations are screened by analytic bounds (memory, TPOT and TTFT floors, a throughput
    ceiling), then the ones that can still win are simulated with a seeded continuous-batching
    scheduler: the same request always gives the same answer. Returns the plans cheapest first, each
    with its predicted percentiles, binding constraint and launch command; the cost-latency frontier;
    and every configuration that cannot work, with its reasons (`feasible: false` when none can)."""
    state, offload = request.app.state, plan_offload(request)

    def answer() -> SloPlanResponse:  # in a worker thread; the search itself in the plan pool
        with state.session_factory() as session:
            return planning.plan_slo(session, body, offload=offload)

    return json_response(await run_in_threadpool(answer))
