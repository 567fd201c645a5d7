"""/v1/capacity: how many concurrent requests fit on a deployment, and how fast they go."""

from __future__ import annotations

from fastapi import APIRouter

from app import services
from app.api import SessionDep
from app.errors import problem_responses
from app.schemas.capacity import CapacityRequest, CapacityResponse

router = APIRouter(prefix="/v1/capacity", tags=["sizing"])


@router.post("", response_model=CapacityResponse, summary="Concurrent requests that fit, and their speed",
             responses=problem_responses(404, 413, 422, 503))
def capacity(session: SessionDep, body: CapacityRequest) -> CapacityResponse:
    """The serving engine's memory accounting per GPU (vLLM, SGLang, TensorRT-LLM or a generic budget:
    weights, activation peak, non-torch memory, CUDA graphs, reserve, KV budget), the KV capacity in
    tokens and blocks, concurrency three ways (worst case at max_model_len, admission at input + output,
    steady state at the mean live tokens; each capped by max_num_seqs, the binding limit named), the
    longest single request, and the decode operating point at the engine's own concurrency (step time,
    TPOT, per-user and aggregate tokens/s, requests/s with prefill included).

    A configuration that cannot serve is a 200 with `fits: false`, the reasons, and the smallest
    layout inside one node or cheaper weight precision that would."""
    return services.plan_capacity(session, body)
