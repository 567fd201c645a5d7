"""/v1/gpus: read the accelerator catalog; create, replace and delete rows with a write key."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from app import services
from app.api import (
    ETAG_HEADER,
    NOT_MODIFIED,
    FilterText,
    Limit,
    Offset,
    PreconditionsDep,
    SessionDep,
    SlugPath,
    WriteAccess,
    json_with_etag,
)
from app.errors import problem_responses
from app.schemas.catalog import GpuIn, GpuOut, GpuPage

router = APIRouter(prefix="/v1/gpus", tags=["gpus"])


@router.get("", response_model=GpuPage, summary="List GPUs",
            responses={**NOT_MODIFIED, **problem_responses(422, 503)})
def list_gpus(
    request: Request,
    session: SessionDep,
    vendor: FilterText = None,
    family: FilterText = None,
    limit: Limit = 50,
    offset: Offset = 0,
) -> Response:
    """GPUs ordered by slug, optionally filtered by vendor or family (case-insensitive)."""
    items, total = services.read_page(session, services.GPUS, services.gpu_filters(vendor, family), limit, offset)
    return json_with_etag(request, GpuPage(items=items, total=total, limit=limit, offset=offset))


@router.get("/{slug}", response_model=GpuOut, summary="Get one GPU",
            responses={**NOT_MODIFIED, **problem_responses(404, 422, 503)})
def get_gpu(request: Request, session: SessionDep, slug: SlugPath) -> Response:
    return json_with_etag(request, services.read_one(session, services.GPUS, slug))


@router.put(
    "/{slug}", response_model=GpuOut, summary="Create or replace a GPU", dependencies=[WriteAccess],
    responses={
        200: {"description": "Replaced", "headers": ETAG_HEADER},
        201: {"description": "Created", "model": GpuOut,
              "headers": {**ETAG_HEADER, "Location": {"description": "URL of the new row", "schema": {"type": "string"}}}},
        **problem_responses(401, 409, 412, 413, 422, 503),
    },
)
def put_gpu(request: Request, session: SessionDep, slug: SlugPath, body: GpuIn,
            preconditions: PreconditionsDep) -> Response:
    """Create (201 + Location) or replace (200) a row. Send `If-Match: <ETag>` to replace only
    the version you read (412 otherwise), or `If-None-Match: *` to create only."""
    stored, created = services.put(session, services.GPUS, slug, services.gpu_columns(slug, body), preconditions)
    if created:
        return json_with_etag(request, stored, status_code=201, headers={"Location": f"{services.GPUS.path}/{slug}"})
    return json_with_etag(request, stored)


@router.delete("/{slug}", status_code=204, summary="Delete a GPU", dependencies=[WriteAccess],
               responses=problem_responses(401, 404, 412, 422, 503))
def delete_gpu(session: SessionDep, slug: SlugPath, preconditions: PreconditionsDep) -> Response:
    services.delete(session, services.GPUS, slug, preconditions)
    return Response(status_code=204)
