"""Service errors and their RFC 9457 `application/problem+json` rendering.

Services raise `ServiceError` subclasses; the handlers installed by `install_error_handlers`
turn those, request-validation errors, HTTP errors (unknown route, wrong method) and database
outages into problem responses. `problem_responses(...)` documents them in the OpenAPI spec.
"""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Iterable, Sequence
from contextvars import ContextVar
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import get_route_path

from app.common import SLUG_PATTERN, FieldProblem, Problem

PROBLEM_MEDIA_TYPE = "application/problem+json"

# The current request's id (set by the request-context middleware), for problems and logs.
current_request_id: ContextVar[str | None] = ContextVar("current_request_id", default=None)

log = logging.getLogger("app.errors")

# A 1 MiB body of unknown keys is some 50,000 invalid inputs: listing them all would answer a
# small request with megabytes. The detail still gives the count.
MAX_LISTED_ERRORS = 100


class ServiceError(Exception):
    """An error a client can act on; `status` picks the HTTP status of the problem."""

    status: int = 500

    def __init__(self, detail: str, *, errors: Iterable[tuple[str, str]] = (),
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.errors = list(errors)
        self.headers = headers or {}


class Unauthorized(ServiceError):
    status = 401


class Forbidden(ServiceError):
    status = 403


class NotFound(ServiceError):
    status = 404


class Conflict(ServiceError):
    status = 409


class PreconditionFailed(ServiceError):
    status = 412


class Unprocessable(ServiceError):
    """Input that parsed but makes no sense; `errors` holds (JSON pointer, message) pairs."""

    status = 422


class ServiceUnavailable(ServiceError):
    status = 503


def json_pointer(location: Sequence[object]) -> str:
    """RFC 6901 pointer for a validation location such as ("body", "model_spec", "head_dim")."""
    return "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in location)


def problem_response(
    request: Request,
    status: int,
    detail: str,
    *,
    errors: Iterable[tuple[str, str]] = (),
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    problem = Problem(
        title=HTTPStatus(status).phrase,
        status=status,
        detail=detail,
        instance=request.url.path,
        request_id=current_request_id.get(),
        errors=[FieldProblem(pointer=p, detail=d) for p, d in itertools.islice(errors, MAX_LISTED_ERRORS)] or None,
    )
    return JSONResponse(
        problem.model_dump(exclude_none=True),
        status_code=status,
        media_type=PROBLEM_MEDIA_TYPE,
        # An error is about this request only: no cache or proxy may replay it to anyone else.
        headers={"Cache-Control": "no-store", **(headers or {})},
    )


async def _service_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServiceError)
    return problem_response(request, exc.status, exc.detail, errors=exc.errors, headers=exc.headers)


def _is_json(content_type: str) -> bool:
    media_type = content_type.split(";")[0].strip().lower()
    return media_type == "application/json" or media_type.endswith("+json")


def error_message(error: Any) -> str:
    """pydantic's message for one validation error (an item of `ValidationError.errors()`), with the key a
    catalog key given with capitals ("H100-SXM", "Llama-3-70B") stands for."""
    message = str(error.get("msg", "invalid"))
    value = error.get("input")
    if (error.get("type") == "string_pattern_mismatch" and (error.get("ctx") or {}).get("pattern") == SLUG_PATTERN
            and isinstance(value, str) and re.fullmatch(SLUG_PATTERN, value.lower())):
        return f"{message}: catalog keys are lower-case, {value.lower()!r}"
    return message


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    content_type = request.headers.get("content-type", "")
    if not _is_json(content_type) and any(tuple(error.get("loc", ())) == ("body",) for error in exc.errors()):
        # FastAPI reads a body without a JSON content type as no object at all; say what to send.
        sent = f"Content-Type {content_type!r}" if content_type else "no Content-Type"
        return problem_response(request, 422, f"Send the body as JSON with Content-Type: application/json "
                                              f"(this request had {sent})",
                                errors=[("/header/content-type", "must be application/json")])
    errors = []
    for error in exc.errors():
        location, message = error.get("loc", ()), error_message(error)
        if error.get("type") == "json_invalid":
            # FastAPI locates a JSON syntax error by character offset: point at the body, and say what the
            # parser expected where (a trailing comma, single quotes) in words.
            offset, reason = location[1:2], (error.get("ctx") or {}).get("error")
            location = location[:1]
            message = (f"{message}: {reason}" if reason else message) + (
                f" at character {offset[0]} (counting from 0)" if offset else "")
        errors.append((json_pointer(location), message))
    noun = "input" if len(errors) == 1 else "inputs"
    listed = f" (the first {MAX_LISTED_ERRORS} are listed)" if len(errors) > MAX_LISTED_ERRORS else ""
    return problem_response(request, 422, f"{len(errors)} invalid {noun}{listed}", errors=errors)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    status = exc.status_code
    phrase = HTTPStatus(status).phrase
    detail = exc.detail if isinstance(exc.detail, str) and exc.detail != phrase else {
        403: "The API key lacks the scope this operation needs",
    404: "No such resource",
        405: f"Method {request.method} is not allowed here",
    }.get(status, phrase)
    headers = dict(exc.headers or {})
    if status == 400:
        # FastAPI's only 400 is a body it could not decode (bad UTF-8, broken framing): to a
        # client that is one more malformed body, which this API answers with a 422.
        return problem_response(request, 422, "The body could not be read as JSON",
                                errors=[("/body", str(exc.detail))], headers=headers)
    if status == 405:
        headers["Allow"] = ", ".join(_allowed_methods(request))
    if status == 404 and (repository_id := _CATALOG_PATH_WITH_REPOSITORY_ID.match(request.url.path)):
        hint = getattr(request.app.state, "repository_id_hint", None)  # the catalog's, set by create_app
        if repository_id["kind"] == "v1/models" and hint is not None:
            detail = f"No such resource: {hint(repository_id['id'])}"
        else:
            detail = (f"No such resource: {repository_id['id']!r} looks like a Hugging Face repository id, and "
                      f"catalog slugs have no '/'. GET /{repository_id['kind']} lists each row's slug")
    return problem_response(request, status, detail, headers=headers)


_CATALOG_PATH_WITH_REPOSITORY_ID = re.compile(r"^/(?P<kind>v1/models|v1/gpus)/(?P<id>[^/]+/[^/]+)/?$")


def _allowed_methods(request: Request) -> list[str]:
    # Starlette names only the first route whose path matched; list the methods of every route
    # matching this path (create_app records them in app.state.route_methods). A literal path
    # such as /v1/models/import is its own resource, not an instance of /v1/models/{slug}.
    path = get_route_path(request.scope)
    matching = [(methods, templated) for pattern, methods, templated
                in getattr(request.app.state, "route_methods", ()) if pattern.match(path)]
    literal_only = not all(templated for _, templated in matching)
    allowed: set[str] = set()
    for methods, templated in matching:
        if not (literal_only and templated):
            allowed |= methods
    return sorted(allowed)


async def _database_error(request: Request, exc: Exception) -> JSONResponse:
    if isinstance(exc, IntegrityError):
        # A constraint caught a race the service's own checks could not (e.g. two creates).
        return problem_response(request, 409, "The change conflicts with the stored catalog; retry")
    if isinstance(exc, DataError):
        # The database refused a value the schema let through (a string longer than its column,
        # a number outside its type): bad input, not an outage. The database's wording stays in the log.
        log.warning("database refused a value", extra={"error": str(getattr(exc, "orig", exc))[:200]})
        return problem_response(request, 422, "A value is too long or out of range for storage",
                                errors=[("/body", "a value is too long or out of range for storage")])
    # Never a 500 for an outage: say so, and when to come back.
    log.warning("database error", extra={"error": type(exc).__name__})
    return problem_response(request, 503, "The database is unavailable; retry later",
                            headers={"Retry-After": "5"})


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(DBAPIError, _database_error)
    app.add_exception_handler(PoolTimeoutError, _database_error)
    _install_problem_schema(app)


# OpenAPI documentation ---------------------------------------------------------------------

_PROBLEM_DESCRIPTIONS = {
    400: "Bad request",
    401: "Missing or unknown API key (send `Authorization: Bearer <key>`)",
    403: "The API key lacks the scope this operation needs",
    404: "No such resource (unknown slug or route)",
    405: "Method not allowed",
    409: "Conflict with the stored catalog",
    412: "Precondition failed: the If-Match ETag is stale, or If-None-Match: * found a row",
    413: "Request body larger than 1 MiB",
    422: "Invalid input; `errors` lists each offending field as a JSON pointer",
    500: "Internal error (no details are disclosed)",
    503: "Database unavailable or not migrated, or the request ran past REQUEST_TIMEOUT_S; retry later",
}


def _problem_example(status: int) -> dict[str, Any]:
    example: dict[str, Any] = {
        "type": "about:blank",
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": _PROBLEM_DESCRIPTIONS[status],
        "instance": "/v1/gpus/h100-sxm",
        "request_id": "3f2b8c1e9a7d4e60b1c2d3e4f5a6b7c8",
    }
    if status == 422:
        example["errors"] = [{"pointer": "/query/limit", "detail": "Input should be less than or equal to 200"}]
    return example


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` entries for the given problem statuses (plus 500, always possible)."""
    responses: dict[int | str, dict[str, Any]] = {}
    for status in sorted({*statuses, 500}):
        responses[status] = {
            "description": _PROBLEM_DESCRIPTIONS[status],
            "content": {
                PROBLEM_MEDIA_TYPE: {
                    "schema": {"$ref": "#/components/schemas/Problem"},
                    "example": _problem_example(status),
                }
            },
        }
    return responses


def _install_problem_schema(app: FastAPI) -> None:
    """Add the Problem schema to components (routes reference it by $ref, not by model)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = build()
        problem = Problem.model_json_schema(ref_template="#/components/schemas/{model}")
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components.update(problem.pop("$defs", {}))
        components["Problem"] = problem
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
