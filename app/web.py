"""HTTP plumbing shared by the domain routers: canonical representations and ETags, the session and
API-key scope dependencies, conditional request headers, pagination parameters, and JSON responses
with strong ETags."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ValidationError
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from app.common import NO_NUL_PATTERN, SLUG_PATTERN
from app.db import NeedsDatabase, RequestDeadline, get_session
from app.errors import Forbidden, PreconditionFailed, Unauthorized
from app.settings import ApiKey
from app.sizing.calibration.fit import keep_going

# Representations and ETags ---------------------------------------------------------------


def representation(model: BaseModel) -> bytes:
    """The canonical JSON body of a response: sorted keys, no spaces, UTF-8."""
    return json.dumps(model.model_dump(mode="json"), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode()


def etag_of(model: BaseModel) -> str:
    """Strong ETag of a representation. It covers slug, version and every field, so any write
    (which bumps the version and updated_at) changes it."""
    return '"' + hashlib.sha256(representation(model)).hexdigest()[:32] + '"'


@dataclass(frozen=True, slots=True)
class Preconditions:
    """Parsed If-Match / If-None-Match headers: None = header absent; ("*",) = any version."""

    if_match: tuple[str, ...] | None = None
    if_none_match: tuple[str, ...] | None = None

    def check(self, current_etag: str | None) -> None:
        """Raise PreconditionFailed unless the stored row (None = absent) satisfies them."""
        if self.if_match is not None:
            if current_etag is None:
                raise PreconditionFailed("If-Match was sent but the row does not exist")
            # Strong comparison (RFC 9110 13.1.1): weak tags never match.
            if "*" not in self.if_match and current_etag not in self.if_match:
                raise PreconditionFailed("The row changed since you read it (stale If-Match ETag); "
                                         "GET it again and reapply your change")
        if self.if_none_match is not None and current_etag is not None and _matches_weakly(self.if_none_match,
                                                                                          current_etag):
            raise PreconditionFailed("The row already exists (If-None-Match)")


# Computed answers ------------------------------------------------------------------------

BodyT = TypeVar("BodyT", bound=BaseModel)


async def computed_answer(request: Request, compute: Callable[[Session, BodyT], BaseModel], body: BodyT) -> Response:
    """A sizing answer (a pure computation over catalog specs) as JSON, serialized once.

    It runs on the event loop with a memory-only session when the specs it needs are cached and
    fresh (no database round trip, no worker thread); otherwise (the cache due for its revision check,
    or a slug not cached yet) again in a worker thread with a database session. Either way it reads
    only, so running it twice changes nothing.
    """
    state = request.app.state
    try:
        answer = compute(state.memory_only_session, body)
    except NeedsDatabase:
        answer = await run_in_threadpool(_compute_with_session, state.session_factory, compute, body)
    return json_response(answer)


def plan_offload(request: Request) -> Callable[..., Any]:
    """The application's plan pool, each search bounded by this request's deadline (`PlanPool.until`): none
    outlives its request's 503."""
    deadline: RequestDeadline | None = request.scope.get(RequestDeadline.SCOPE_KEY)
    return request.app.state.plan_pool.until(deadline.due if deadline is not None else None)


def deadline_check(request: Request) -> Callable[[], None]:
    """What long work in a worker thread calls between its pieces: it raises `RequestAbandoned` once this
    request has been answered 503 at its deadline (`RequestDeadline.check`), so the work stops and frees its
    request slot instead of running to its end for nobody."""
    deadline: RequestDeadline | None = request.scope.get(RequestDeadline.SCOPE_KEY)
    return deadline.check if deadline is not None else keep_going


DeadlineCheck = Annotated[Callable[[], None], Depends(deadline_check)]


def json_response(answer: BaseModel) -> Response:
    """The answer as JSON, serialized once (FastAPI would validate a returned model again first)."""
    return Response(answer.model_dump_json(), media_type="application/json")


class KeyFirstRoute(APIRoute):
    """The route class of endpoints that take a JSON body and may need a key: a missing or unknown key is a 401
    (a key without the scope a 403) whatever the body holds.

    FastAPI decodes a JSON body before it solves any dependency, so a body that is not JSON at all was a 422
    before the key was looked at (a body that is JSON but not the schema's already meets the key check first).
    When FastAPI's handler finds the body is not JSON, the route's key checks (`requires`, `open_unless_closed`)
    run, and their refusal is the answer.
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        generic = super().get_route_handler()
        key_checks = [check for dependency in self.dependant.dependencies
                      if (check := getattr(dependency.call, "key_check", None)) is not None]
        if not key_checks:
            return generic

        async def handle(request: Request) -> Response:
            try:
                return await generic(request)
            except RequestValidationError as exc:
                if any(error["type"] == "json_invalid" for error in exc.errors()):
                    credentials = await _bearer(request)
                    for check in key_checks:
                        check(request, credentials)
                raise

        return handle


class ComputedRoute(KeyFirstRoute):
    """The route class of the sizing answers: endpoints `(request, body)` whose only dependency is the
    open read access (`SizingRead`).

    FastAPI's own handler decodes the body with `json.loads`, reads the content type through the email
    package and solves the dependency graph on every request: about a fifth of a sizing request's CPU.
    When reads are open and the request says exactly `application/json`, this handler validates the body
    in one pass (`model_validate_json`) and calls the endpoint itself. Anything else (reads closed: a key
    to check; another content type; a body that does not validate; a client gone before its body arrived) goes
    to FastAPI's handler (behind `KeyFirstRoute`'s key check), so every error is exactly FastAPI's.
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        generic = super().get_route_handler()
        checks = [dependency.call for dependency in self.dependant.dependencies]
        if checks != [_sizing_read_check] or self.body_field is None:
            raise TypeError(f"{self.path}: a computed route's only dependency is SizingRead, and it takes a body")
        validate_json = self.body_field.field_info.annotation.model_validate_json
        endpoint = self.endpoint

        async def handle(request: Request) -> Response:
            if request.app.state.settings.open_reads and request.headers.get("content-type") == "application/json":
                try:
                    body = validate_json(await request.body())
                except (ValidationError, ClientDisconnect):  # FastAPI's handler answers both (422)
                    return await generic(request)
                return await endpoint(request, body)
            return await generic(request)

        return handle


def _compute_with_session(factory: sessionmaker[Session], compute: Callable[[Session, BodyT], BaseModel],
                          body: BodyT) -> BaseModel:
    with factory() as session:
        return compute(session, body)


# The session is committed when the endpoint returns, before the response is sent, so a failed
# commit becomes an error response instead of a success that was never stored.
SessionDep = Annotated[Session, Depends(get_session, scope="function")]

SlugPath = Annotated[str, Path(pattern=SLUG_PATTERN, max_length=64, description="Catalog key",
                               examples=["h100-sxm"])]
Limit = Annotated[int, Query(ge=1, le=200, description="Page size")]
Offset = Annotated[int, Query(ge=0, le=1_000_000, description="Rows to skip")]
FilterText = Annotated[str | None, Query(min_length=1, max_length=64, pattern=NO_NUL_PATTERN)]

_bearer = HTTPBearer(auto_error=False, description="A key from API_KEYS; each operation says which scope it needs")
_CHALLENGE = 'Bearer realm="llm-sizing"'
BearerCredentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def authenticate(request: Request, credentials: HTTPAuthorizationCredentials | None, scope: str) -> ApiKey:
    """The configured key presented as `Authorization: Bearer <key>` (several are valid at once, for
    rotation), if it has `scope`: 401 without a known key, 403 when the key lacks the scope."""
    if not request.app.state.settings.api_keys:
        raise Unauthorized(f"This operation needs an API key with the {scope} scope, and this server was "
                           "started without API_KEYS: it refuses every operation that needs a key",
                           headers={"WWW-Authenticate": _CHALLENGE})
    if credentials is None:
        raise Unauthorized(f"This operation needs an API key with the {scope} scope "
                           "(Authorization: Bearer <key>)", headers={"WWW-Authenticate": _CHALLENGE})
    presented = credentials.credentials.encode()
    matched: ApiKey | None = None
    for key in request.app.state.settings.api_keys:
        # Compare against every key in constant time: timing reveals neither key nor position.
        if hmac.compare_digest(presented, key.secret.get_secret_value().encode()):
            matched = key
    if matched is None:
        raise Unauthorized("Unknown API key",
                           headers={"WWW-Authenticate": f'{_CHALLENGE}, error="invalid_token"'})
    if scope not in matched.scopes:
        raise Forbidden(f"API key {matched.name!r} lacks the {scope} scope",
                        headers={"WWW-Authenticate": f'{_CHALLENGE}, error="insufficient_scope", scope="{scope}"'})
    return matched


def requires(scope: str) -> Any:
    """A dependency: the request's key, which must have `scope` (see `authenticate`)."""
    def key_with_scope(request: Request, credentials: BearerCredentials) -> ApiKey:
        return authenticate(request, credentials, scope)

    key_with_scope.__name__ = f"requires_{scope.replace(':', '_')}"
    key_with_scope.key_check = key_with_scope  # type: ignore[attr-defined]  # for KeyFirstRoute
    return Depends(key_with_scope)


def open_unless_closed(scope: str) -> Any:
    """A dependency for catalog and sizing reads: no key needed unless OPEN_READS is false, in which
    case the key needs `scope`."""
    def check(request: Request, credentials: HTTPAuthorizationCredentials | None) -> None:
        if not request.app.state.settings.open_reads:
            authenticate(request, credentials, scope)

    # async: no I/O, so no hand-off to a worker thread on every read
    async def read_access(request: Request, credentials: BearerCredentials) -> None:
        check(request, credentials)

    read_access.__name__ = f"reads_{scope.replace(':', '_')}"
    read_access.key_check = check  # type: ignore[attr-defined]  # for KeyFirstRoute
    return Depends(read_access)


# Who may do what. Writes record the key's name (`ApiKey.name`), never its secret.
CatalogWriter = Annotated[ApiKey, requires("catalog:write")]
QuoteWriter = Annotated[ApiKey, requires("quotes:write")]
CalibrationWriter = Annotated[ApiKey, requires("calibrations:write")]
QuoteReader = requires("quotes:read")
CatalogRead = open_unless_closed("catalog:read")
SizingRead = open_unless_closed("sizing:read")
_sizing_read_check = SizingRead.dependency

# "*" or a comma-separated list of entity tags, weak or strong (RFC 9110 section 8.8.3).
ETAG_LIST_PATTERN = r'^(\*|(W/)?"[^"\x00]*"(\s*,\s*(W/)?"[^"\x00]*")*)?$'
IfMatch = Annotated[str | None, Header(max_length=2048, pattern=ETAG_LIST_PATTERN,
                                       description="Write only if the row still has this ETag (412 otherwise)")]
IfNoneMatch = Annotated[str | None, Header(max_length=2048, pattern=ETAG_LIST_PATTERN,
                                           description="* = create only (412 if the row exists)")]


def _etags(header: str | None) -> tuple[str, ...] | None:
    tags = tuple(tag.strip() for tag in (header or "").split(",") if tag.strip())
    return tags or None  # an empty header is no precondition at all


def preconditions(if_match: IfMatch = None, if_none_match: IfNoneMatch = None) -> Preconditions:
    return Preconditions(if_match=_etags(if_match), if_none_match=_etags(if_none_match))


PreconditionsDep = Annotated[Preconditions, Depends(preconditions)]


def _matches_weakly(tags: Sequence[str], etag: str) -> bool:
    """If-None-Match's weak comparison (RFC 9110 13.1.2), on reads and writes alike: W/"x" matches "x"."""
    stripped = {tag.removeprefix("W/") for tag in tags}
    return "*" in stripped or etag in stripped


def json_with_etag(request: Request, model: BaseModel, *, status_code: int = 200,
                   headers: dict[str, str] | None = None) -> Response:
    """The model as canonical JSON with a strong ETag; 304 (no body) when a GET's
    If-None-Match already has this representation."""
    etag = etag_of(model)
    all_headers = {"ETag": etag, "Cache-Control": "no-cache", **(headers or {})}
    if_none_match = request.headers.get("if-none-match")
    if request.method == "GET" and if_none_match is not None and _matches_weakly(_etags(if_none_match) or (), etag):
        return Response(status_code=304, headers=all_headers)
    return Response(representation(model), status_code=status_code, media_type="application/json",
                    headers=all_headers)


NOT_MODIFIED: dict[int | str, dict[str, Any]] = {
    304: {"description": "Not Modified: If-None-Match already holds this representation (no body)"}
}
ETAG_HEADER = {"ETag": {"description": "Strong entity tag of this representation", "schema": {"type": "string"}}}
