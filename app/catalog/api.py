"""/v1/gpus and /v1/models: read the catalog; create, replace and delete rows with a catalog:write key; import a
Hugging Face config.json as a model."""

from __future__ import annotations

import json
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request
from starlette.responses import Response

from app.catalog import service as catalog_service
from app.catalog.schemas import (
    GpuOut,
    GpuPage,
    GpuPut,
    ModelImport,
    ModelOut,
    ModelPage,
    ModelPut,
    split_read_only,
)
from app.common import SLUG_PATTERN
from app.errors import Unprocessable, problem_responses
from app.web import (
    ETAG_HEADER,
    NOT_MODIFIED,
    BearerCredentials,
    CatalogRead,
    CatalogWriter,
    FilterText,
    KeyFirstRoute,
    Limit,
    Offset,
    PreconditionsDep,
    SessionDep,
    SlugPath,
    authenticate,
    etag_of,
    json_with_etag,
    representation,
    requires,
)

# /v1/gpus: read the accelerator catalog; create, replace and delete rows with a catalog:write key.
gpus_router = APIRouter(prefix="/v1/gpus", tags=["gpus"], route_class=KeyFirstRoute)


@gpus_router.get("", response_model=GpuPage, summary="List GPUs", dependencies=[CatalogRead],
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
    items, total = catalog_service.read_page(session, catalog_service.GPUS, catalog_service.gpu_filters(vendor, family), limit, offset)
    return json_with_etag(request, GpuPage(items=items, total=total, limit=limit, offset=offset))


@gpus_router.get("/{slug}", response_model=GpuOut, summary="Get one GPU", dependencies=[CatalogRead],
                 responses={**NOT_MODIFIED, **problem_responses(404, 422, 503)})
def get_gpu(request: Request, session: SessionDep, slug: SlugPath) -> Response:
    return json_with_etag(request, catalog_service.read_one(session, catalog_service.GPUS, slug))


@gpus_router.put(
                 "/{slug}", response_model=GpuOut, summary="Create or replace a GPU",
                 responses={
                 200: {"description": "Replaced", "headers": ETAG_HEADER},
                 201: {"description": "Created", "model": GpuOut,
                 "headers": {**ETAG_HEADER, "Location": {"description": "URL of the new row", "schema": {"type": "string"}}}},
                 **problem_responses(401, 403, 409, 412, 413, 422, 503),
                 },
                 )
def put_gpu(request: Request, writer: CatalogWriter, session: SessionDep, slug: SlugPath, body: GpuPut,
            preconditions: PreconditionsDep) -> Response:
    """Create (201 + Location) or replace (200) a row. Send `If-Match: <ETag>` to replace only
    the version you read (412 otherwise), or `If-None-Match: *` to create only. The body may be
    what GET returned, read-only fields included: they must match the stored row (see each field)."""
    columns = catalog_service.gpu_columns(slug, body)
    stored, created = catalog_service.put(session, catalog_service.GPUS, slug, columns, preconditions,
                                          written_by=writer.name, echoed=split_read_only(body)[1])
    if created:
        return json_with_etag(request, stored, status_code=201, headers={"Location": f"{catalog_service.GPUS.path}/{slug}"})
    return json_with_etag(request, stored)


@gpus_router.delete("/{slug}", status_code=204, summary="Delete a GPU", dependencies=[requires("catalog:write")],
                    responses=problem_responses(401, 403, 404, 412, 422, 503))
def delete_gpu(session: SessionDep, slug: SlugPath, preconditions: PreconditionsDep) -> Response:
    catalog_service.delete(session, catalog_service.GPUS, slug, preconditions)
    return Response(status_code=204)


# /v1/models: read the model-architecture catalog; write rows with a catalog:write key; import a Hugging Face
# config.json.
models_router = APIRouter(prefix="/v1/models", tags=["models"], route_class=KeyFirstRoute)

RESERVED_SLUGS = frozenset({"import"})  # would shadow POST /v1/models/import
LOCATION_HEADER = {"Location": {"description": "URL of the new row", "schema": {"type": "string"}}}
STORED_ETAG_HEADER = {"ETag": {"description": "When stored: the stored row's entity tag (GET /v1/models/{slug}'s), "
                                              "for the next If-Match", "schema": {"type": "string"}}}


@models_router.get("", response_model=ModelPage, summary="List models", dependencies=[CatalogRead],
                   responses={**NOT_MODIFIED, **problem_responses(422, 503)})
def list_models(
    request: Request,
    session: SessionDep,
    architecture: Annotated[Literal["dense", "moe"] | None, Query(description="dense or moe")] = None,
    attention: Annotated[Literal["mha", "mqa", "gqa", "mla"] | None, Query(description="Attention kind")] = None,
    limit: Limit = 50,
    offset: Offset = 0,
) -> Response:
    """Models ordered by slug, optionally filtered by architecture and attention kind."""
    filters = catalog_service.model_filters(architecture, attention)
    items, total = catalog_service.read_page(session, catalog_service.MODELS, filters, limit, offset)
    return json_with_etag(request, ModelPage(items=items, total=total, limit=limit, offset=offset))


@models_router.get("/{slug}", response_model=ModelOut, summary="Get one model", dependencies=[CatalogRead],
                   responses={**NOT_MODIFIED, **problem_responses(404, 422, 503)})
def get_model(request: Request, session: SessionDep, slug: SlugPath) -> Response:
    return json_with_etag(request, catalog_service.read_one(session, catalog_service.MODELS, slug))


@models_router.put(
                   "/{slug}", response_model=ModelOut, summary="Create or replace a model",
                   responses={
                   200: {"description": "Replaced", "headers": ETAG_HEADER},
                   201: {"description": "Created", "model": ModelOut, "headers": {**ETAG_HEADER, **LOCATION_HEADER}},
                   **problem_responses(401, 403, 409, 412, 413, 422, 503),
                   },
                   )
def put_model(request: Request, writer: CatalogWriter, session: SessionDep, slug: SlugPath, body: ModelPut,
              preconditions: PreconditionsDep) -> Response:
    """Create (201 + Location) or replace (200) a row. Send `If-Match: <ETag>` to replace only
    the version you read (412 otherwise), or `If-None-Match: *` to create only. The body may be
    what GET returned, read-only fields included: they must match the stored row (see each field)."""
    _refuse_reserved(slug)
    columns = catalog_service.model_columns(slug, body)
    stored, created = catalog_service.put(session, catalog_service.MODELS, slug, columns, preconditions,
                                          written_by=writer.name, echoed=split_read_only(body)[1])
    if created:
        return json_with_etag(request, stored, status_code=201, headers={"Location": f"{catalog_service.MODELS.path}/{slug}"})
    return json_with_etag(request, stored)


@models_router.delete("/{slug}", status_code=204, summary="Delete a model",
                      dependencies=[requires("catalog:write")], responses=problem_responses(401, 403, 404, 412, 422, 503))
def delete_model(session: SessionDep, slug: SlugPath, preconditions: PreconditionsDep) -> Response:
    catalog_service.delete(session, catalog_service.MODELS, slug, preconditions)
    return Response(status_code=204)


def _refuse_reserved(slug: str) -> None:
    if slug in RESERVED_SLUGS:
        raise Unprocessable(f"The slug {slug!r} is reserved", errors=[("/path/slug", "reserved slug")])


def _no_constants(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


async def raw_config(request: Request) -> object:
    """The request body as JSON, exactly as sent (no schema): malformed JSON is a 422 problem."""
    body = await request.body()
    try:
        # Python's json accepts NaN and Infinity; JSON does not.
        return json.loads(body, parse_constant=_no_constants)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, nesting
        raise Unprocessable("The body is not valid JSON", errors=[("/body", str(exc) or "too deeply nested")]) from None


LLAMA_3_8B_CONFIG = {
    "_name_or_path": "meta-llama/Meta-Llama-3-8B", "architectures": ["LlamaForCausalLM"],
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
    "max_position_embeddings": 8192, "rope_theta": 500000.0, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "hidden_act": "silu", "rms_norm_eps": 1e-05,
}


def import_access(
    request: Request,
    credentials: BearerCredentials,
    dry_run: Annotated[bool, Query(description="true: only normalize; false: also store (catalog:write key "
                                               "needed)")] = True,
) -> str | None:
    """The name of the key storing the import, after checking it has catalog:write (before the body is
    read); None for a dry run, which is a catalog read."""
    if dry_run:
        if not request.app.state.settings.open_reads:
            authenticate(request, credentials, "catalog:read")
        return None
    return authenticate(request, credentials, "catalog:write").name


@models_router.post(
                    "/import", response_model=ModelImport, summary="Import a Hugging Face config.json",
                    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"type": "object", "additionalProperties": True,
                    "description": "A config.json exactly as published (text_config nesting allowed)"},
                    "example": LLAMA_3_8B_CONFIG,
                    }}},
                    # Added to the bearer scheme: a dry run needs no key, storing does.
                    "security": [{}]},
                    responses={200: {"description": "Normalized (dry run), or stored over an existing row",
                                     "headers": STORED_ETAG_HEADER},
                               201: {"description": "Stored as a new row", "model": ModelImport,
                                     "headers": {**STORED_ETAG_HEADER, **LOCATION_HEADER}},
                    **problem_responses(401, 403, 409, 412, 413, 422, 503)},
                    )
def import_model(
    session: SessionDep,
    writer: Annotated[str | None, Depends(import_access)],
    preconditions: PreconditionsDep,
    config: Annotated[object, Depends(raw_config)],
    slug: Annotated[str, Query(pattern=SLUG_PATTERN, max_length=64, description="Catalog key to store under")],
) -> Response:
    """Normalize a raw config.json (nested text_config, MoE and MLA key variants, sliding
    windows, Falcon's multi_query, library defaults for omitted fields) to the catalog shape.
    The response lists which fields came from defaults. Missing essentials are a 422 listing them."""
    if writer is not None:
        _refuse_reserved(slug)
    result, created = catalog_service.import_model(session, slug, config, written_by=writer,
                                                   preconditions=preconditions)
    headers = {"Location": f"{catalog_service.MODELS.path}/{slug}"} if created else {}
    if result.stored:  # the stored row's tag, as a PUT answers with: the next conditional write can use it
        headers["ETag"] = etag_of(catalog_service.read_one(session, catalog_service.MODELS, slug))
    return Response(representation(result), status_code=201 if created else 200,
                    media_type="application/json", headers=headers)
