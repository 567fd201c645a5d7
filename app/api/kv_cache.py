"""/v1/kv-cache: how much KV cache a model keeps for a batch of sequences."""

from __future__ import annotations

from fastapi import APIRouter

from app import services
from app.api import SessionDep
from app.errors import problem_responses
from app.schemas.sizing import KvCacheRequest, KvCacheResponse

router = APIRouter(prefix="/v1/kv-cache", tags=["sizing"])


@router.post("", response_model=KvCacheResponse, summary="KV-cache size",
             responses=problem_responses(404, 413, 422, 503))
def kv_cache(session: SessionDep, body: KvCacheRequest) -> KvCacheResponse:
    """KV-cache bytes per sequence, for the batch, and on the most loaded GPU under TP/PP, from the
    architecture: GQA/MQA KV heads (replicated when tp exceeds them), MLA's latent (replicated on every
    rank), sliding/chunked windows (with the curve of bytes against context) and paged block rounding.
    Also what plain multi-head attention would have cached."""
    return services.kv_cache(session, body)
