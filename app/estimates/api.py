"""/v1/kv-cache, /v1/roofline (and its batch sweep) and /v1/capacity: sizing answers for one deployment."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from app.errors import problem_responses
from app.estimates import capacity_service
from app.estimates import service as estimates
from app.estimates.capacity_schemas import CapacityRequest, CapacityResponse
from app.estimates.schemas import (
    BatchSweepRequest,
    BatchSweepResponse,
    KvCacheRequest,
    KvCacheResponse,
    RooflineRequest,
    RooflineResponse,
)
from app.web import ComputedRoute, SizingRead, computed_answer

# One router for the three: Starlette tries the included routers in turn for every request (one is faster than
# three), and ComputedRoute answers a well-formed JSON body without FastAPI's generic request handling.
router = APIRouter(tags=["sizing"], dependencies=[SizingRead], route_class=ComputedRoute)


# /v1/kv-cache: how much KV cache a model keeps for a batch of sequences.
@router.post("/v1/kv-cache", response_model=KvCacheResponse, summary="KV-cache size",
             responses=problem_responses(404, 413, 422, 503))
async def kv_cache(request: Request, body: KvCacheRequest) -> Response:
    """KV-cache bytes per sequence, for the batch, and on the most loaded GPU under TP/PP, from the
    architecture: GQA/MQA KV heads (replicated when tp exceeds them), MLA's latent (replicated on every
    rank), sliding/chunked windows (with the curve of bytes against context) and paged block rounding.
    Also what plain multi-head attention would have cached."""
    return await computed_answer(request, estimates.kv_cache, body)


# /v1/roofline: one prefill or decode step against the GPU's roofline; /v1/roofline/batch-sweep:
# decode time and throughput against batch size, with the knee where decode turns compute-bound.
@router.post("/v1/roofline", response_model=RooflineResponse, summary="Roofline of one prefill or decode step",
             responses=problem_responses(404, 413, 422, 503))
async def roofline(request: Request, body: RooflineRequest) -> Response:
    """FLOPs and HBM bytes of one step on one GPU of the tensor-parallel group, per operator; the
    arithmetic intensity against the ridge point; the ideal time (every FLOP at peak, every byte at
    full bandwidth) and the expected time under the calibration profile's efficiencies; and the
    attention's memory traffic with and without FlashAttention."""
    return await computed_answer(request, estimates.roofline_step, body)


@router.post("/v1/roofline/batch-sweep", response_model=BatchSweepResponse, summary="Decode throughput against batch size",
             responses=problem_responses(404, 413, 422, 503))
async def batch_sweep(request: Request, body: BatchSweepRequest) -> Response:
    """Decode step time, aggregate and per-user tokens/s and the bound at each batch size (default
    1, 2, 4, ..., 1024), and the knee: the smallest batch whose ideal step is compute-bound, or null
    when every added sequence brings more KV reads than FLOPs (long contexts)."""
    return await computed_answer(request, estimates.batch_sweep, body)


# /v1/capacity: how many concurrent requests fit on a deployment, and how fast they go.
@router.post("/v1/capacity", response_model=CapacityResponse, summary="Concurrent requests that fit, and their speed",
             responses=problem_responses(404, 413, 422, 503))
async def capacity(request: Request, body: CapacityRequest) -> Response:
    """The serving engine's memory accounting per GPU (vLLM, SGLang, TensorRT-LLM or a generic budget:
    weights, activation peak, non-torch memory, CUDA graphs, reserve, KV budget), the KV capacity in
    tokens and blocks, concurrency three ways (worst case at max_model_len, admission at input + output,
    steady state at the mean live tokens; each capped by max_num_seqs, the binding limit named), the
    longest single request, and the decode operating point at the engine's own concurrency (step time,
    TPOT, per-user and aggregate tokens/s, requests/s with prefill included).

    A configuration that cannot serve is a 200 with `fits: false`, the reasons, and the smallest
    layout inside one node or cheaper weight precision that would."""
    return await computed_answer(request, capacity_service.plan_capacity, body)
