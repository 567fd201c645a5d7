"""/v1/roofline: one prefill or decode step against the GPU's roofline; /v1/roofline/batch-sweep:
decode time and throughput against batch size, with the knee where decode turns compute-bound."""

from __future__ import annotations

from fastapi import APIRouter

from app import services
from app.api import SessionDep
from app.errors import problem_responses
from app.schemas.sizing import BatchSweepRequest, BatchSweepResponse, RooflineRequest, RooflineResponse

router = APIRouter(prefix="/v1/roofline", tags=["sizing"])


@router.post("", response_model=RooflineResponse, summary="Roofline of one prefill or decode step",
             responses=problem_responses(404, 413, 422, 503))
def roofline(session: SessionDep, body: RooflineRequest) -> RooflineResponse:
    """FLOPs and HBM bytes of one step on one GPU of the tensor-parallel group, per operator; the
    arithmetic intensity against the ridge point; the ideal time (every FLOP at peak, every byte at
    full bandwidth) and the expected time under the calibration profile's efficiencies; and the
    attention's memory traffic with and without FlashAttention."""
    return services.roofline_step(session, body)


@router.post("/batch-sweep", response_model=BatchSweepResponse, summary="Decode throughput against batch size",
             responses=problem_responses(404, 413, 422, 503))
def batch_sweep(session: SessionDep, body: BatchSweepRequest) -> BatchSweepResponse:
    """Decode step time, aggregate and per-user tokens/s and the bound at each batch size (default
    1, 2, 4, ..., 1024), and the knee: the smallest batch whose ideal step is compute-bound, or null
    when every added sequence brings more KV reads than FLOPs (long contexts)."""
    return services.batch_sweep(session, body)
