"""The FastAPI application: `create_app(settings) -> FastAPI`.

Run it with `uvicorn --factory app.main:create_app`. Migrations are a separate step
(`alembic upgrade head`); the app never migrates on start-up, and /readyz says not-ready until
the database is at the head.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import re
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import anyio
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.routing import APIRoute
from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.calibration import api as calibration_api
from app.catalog import api as catalog_api
from app.catalog.schemas import repository_id_hint
from app.catalog.service import SpecCache
from app.charts import api as charts_api
from app.db import RequestAbandoned, RequestDeadline, make_engine, make_session_factory, memory_only_session
from app.docs import install_docs
from app.errors import current_request_id, install_error_handlers, problem_response
from app.estimates import api as estimates_api
from app.ops import api as ops_api
from app.planning import api as planning_api
from app.planning.pool import PlanPool, SearchTimedOut
from app.quotes import api as quotes_api
from app.settings import Settings
from app.sizing.serving import plan as plan_core

VERSION = "0.1.0"
MAX_BODY_BYTES = 1 << 20  # 1 MiB: a config.json is a few KiB; anything bigger is a mistake or abuse
REQUEST_ID_PATTERN = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
SECURITY_HEADERS = {
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    # Only frame-ancestors: a fuller policy would also have to allow Swagger UI's scripts at /docs.
    "content-security-policy": "frame-ancestors 'none'",
    "referrer-policy": "no-referrer",
    "cross-origin-resource-policy": "same-origin",
}
# Starlette tries the routes in this order for every request: the sizing endpoints, called in bulk, come right
# after the probes, before the catalog's routes (matching them first was about 15% of a capacity request's CPU).
ROUTERS = (ops_api.router, estimates_api.router, planning_api.router, catalog_api.gpus_router, catalog_api.models_router,
           quotes_api.router, charts_api.router, calibration_api.router)

access_log = logging.getLogger("app.access")
error_log = logging.getLogger("app.errors")


# Logging -----------------------------------------------------------------------------------

_RECORD_FIELDS = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with the request id. Callers pass fields with `extra=`;
    nothing here reads headers, so keys and tokens never reach the log."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": current_request_id.get(),
        }
        entry.update({key: value for key, value in vars(record).items() if key not in _RECORD_FIELDS})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(level: str) -> None:
    logger = logging.getLogger("app")
    logger.setLevel(level.upper())
    if not any(isinstance(handler.formatter, JsonFormatter) for handler in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter())
        logger.addHandler(handler)
    logger.propagate = False


# Metrics -----------------------------------------------------------------------------------

class Metrics:
    """Request count and latency by route template (not raw path: bounded label values)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("http_requests_total", "HTTP requests", ["method", "route", "status"],
                                registry=self.registry)
        self.latency = Histogram("http_request_duration_seconds", "HTTP request latency", ["method", "route"],
                                 registry=self.registry,
                                 buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))


# Request context middleware ----------------------------------------------------------------

class RequestContextMiddleware:
    """Outermost layer: request id (accepted when well-formed, else generated; echoed),
    security headers, the 1 MiB body limit, the request slots (liveness and metrics never wait for one:
    `ops.api.UNQUEUED_PATHS`) and timeout, metrics, the access log, and a problem+json 500 (without
    internals) for anything unhandled."""

    def __init__(self, app: ASGIApp, metrics: Metrics, timeout_s: float, max_concurrent: int) -> None:
        self.app = app
        self.metrics = metrics
        self.timeout_s = timeout_s
        # anyio's semaphore makes a future per waiter in the running loop, so one app can serve
        # several event loops in turn (as test clients do).
        self.slots = anyio.Semaphore(max_concurrent, fast_acquire=True)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        request_id = incoming if REQUEST_ID_PATTERN.match(incoming) else uuid.uuid4().hex
        token = current_request_id.set(request_id)
        started = time.perf_counter()
        response = {"status": 500, "started": False}

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                response.update(status=message["status"], started=True)
                headers = MutableHeaders(scope=message)
                headers["x-request-id"] = request_id
                for name, value in SECURITY_HEADERS.items():
                    headers.setdefault(name, value)
            await send(message)

        received = 0

        async def receive_limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > MAX_BODY_BYTES:
                    # An HTTPException, so FastAPI's body reader passes it on as-is.
                    raise StarletteHTTPException(413, "The request body exceeds 1 MiB")
            return message

        try:
            declared = dict(scope["headers"]).get(b"content-length", b"0")
            if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
                await self._problem(scope, receive, send_with_headers, 413, "The request body exceeds 1 MiB")
            else:
                await self._call_with_deadline(scope, receive_limited, send_with_headers, response,
                                               queued=scope["path"] not in ops_api.UNQUEUED_PATHS)
        except Exception:  # noqa: BLE001  (the last line of defence: log it, answer a bare 500)
            error_log.exception("unhandled error", extra={"method": scope["method"], "path": scope["path"]})
            if not response["started"]:
                await self._problem(scope, receive, send_with_headers, 500, "Internal error; quote the request id")
        finally:
            self._observe(scope, int(response["status"]), time.perf_counter() - started)
            current_request_id.reset(token)

    async def _call_with_deadline(self, scope: Scope, receive: Receive, send: Send,
                                  response: dict[str, Any], queued: bool = True) -> None:
        """Run the app in one of the process's request slots (without one unless `queued`); if it has not
        started its response by the deadline (waiting for a slot included), answer a 503 problem.

        Sync endpoints run in worker threads, which cannot be interrupted: late work stops at its next
        check of the deadline where it makes one (`RequestDeadline.check`: validation and calibration
        uploads, before each row and fitted entry; plan searches are stopped with their worker process,
        app.planning.pool), else runs to its end in its slot (the slots bound the work, not just the
        waiting); either way its session rolls back instead of committing (app.db.RequestDeadline), and
        whatever it sends is dropped. A request already committing is let finish and answer.
        """
        deadline = RequestDeadline(due=time.monotonic() + self.timeout_s)
        scope[RequestDeadline.SCOPE_KEY] = deadline
        in_slot = False

        async def send_unless_expired(message: Message) -> None:
            if not deadline.expired:
                await send(message)

        async def run_in_slot() -> None:
            nonlocal in_slot
            if queued:
                await self.slots.acquire()
            in_slot = True
            try:
                await self.app(scope, receive, send_unless_expired)
            finally:
                if queued:
                    self.slots.release()

        task = asyncio.ensure_future(run_in_slot())
        try:
            done, _ = await asyncio.wait({task}, timeout=self.timeout_s)
        except asyncio.CancelledError:  # the server is shutting down
            task.cancel()
            raise
        if task in done:
            task.result()  # re-raise what the app raised
        elif response["started"] or not deadline.claim_expiry():
            await task  # a response under way, or a commit: finish it
        else:
            if not in_slot:
                task.cancel()  # still waiting for a slot: nothing has run
            task.add_done_callback(_log_late_failure)
            error_log.warning("request timed out", extra={"method": scope["method"], "path": scope["path"],
                                                          "timeout_s": self.timeout_s})
            await self._problem(scope, receive, send, 503,
                                f"The request did not finish within {self.timeout_s:g} s; retry later",
                                headers={"Retry-After": "5"})

    @staticmethod
    async def _problem(scope: Scope, receive: Receive, send: Send, status: int, detail: str,
                       headers: dict[str, str] | None = None) -> None:
        await problem_response(Request(scope), status, detail, headers=headers)(scope, receive, send)

    def _observe(self, scope: Scope, status: int, seconds: float) -> None:
        template = _route_template(scope)
        method = scope["method"]
        self.metrics.requests.labels(method, template, str(status)).inc()
        self.metrics.latency.labels(method, template).observe(seconds)
        access_log.info("request", extra={"method": method, "route": template, "path": scope["path"],
                                          "status": status, "duration_ms": round(seconds * 1000, 3)})


def _route_template(scope: Scope) -> str:
    """The template of the route that served the request, or would have: a request answered before routing (a 503
    while every slot was taken, a 413 for a declared body over the limit) is matched against the routes here, so
    that it counts under its route; "unmatched" where no route takes it."""
    route = scope.get("route")
    if route is None:
        routes = _leaf_routes(getattr(getattr(scope.get("app"), "router", None), "routes", ()))
        route = next((candidate for candidate in routes if candidate.matches(scope)[0] is Match.FULL), None)
    return getattr(route, "path", None) or "unmatched"


def _leaf_routes(routes: Iterable[Any]) -> Iterator[Any]:
    """The routes of a router, those of the routers it includes among them (FastAPI keeps an included router
    whole, as `original_router`)."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        yield from _leaf_routes(inner.routes) if inner is not None else (route,)


def _log_late_failure(task: asyncio.Future[None]) -> None:
    """Collect the outcome of work that outlived its deadline (asyncio warns about unread errors)."""
    if task.cancelled() or task.exception() is None:
        return
    if isinstance(task.exception(), SearchTimedOut):  # the expected end of a search past the deadline
        error_log.warning("timed-out search stopped", extra={"detail": str(task.exception())})
    elif isinstance(task.exception(), RequestAbandoned):  # work that checked its deadline and stopped
        error_log.warning("timed-out work stopped", extra={"detail": str(task.exception())})
    else:
        error_log.error("timed-out request failed later", exc_info=task.exception())


# Application -------------------------------------------------------------------------------

def operation_id(route: APIRoute) -> str:
    return route.name


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # Everything the started process holds (modules, routes, schemas: about 200,000 objects) is moved out of
    # the collector's reach: a full collection walked them all, 110-120 ms with the event loop held (measured
    # 2026-12-02 in process: one such pause in 20,000 /v1/kv-cache requests and a few plans, the lone stall of
    # 70-110 ms seen in load tests); with them frozen, a full collection takes about 0.5 ms. They stay alive
    # for the process's life anyway. Unfrozen on shutdown, so a process that outlives the app can free them.
    gc.freeze()
    if app.state.settings.plan_workers_prestart:
        app.state.plan_pool.prestart(plan_core.__name__)
    yield
    gc.unfreeze()
    app.state.plan_pool.shutdown()
    app.state.engine.dispose()


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    configure_logging(settings.log_level)
    if not settings.api_keys:
        logging.getLogger("app").warning("API_KEYS is not set: every operation that needs a key (writes; reads "
                                         "too when OPEN_READS is false) is refused with 401")
    app = FastAPI(
        title="LLM inference sizing service",
        version=VERSION,
        summary="What hardware, how many, at what cost and latency, to serve a large language model.",
        description="Catalog of accelerators and model architectures (read freely; write with a bearer key) "
                    "and sizing calculations over them. Every error is an RFC 9457 problem+json.",
        lifespan=lifespan,
        docs_url=None,  # served from packaged assets by app.docs, never from a CDN
        redoc_url=None,
        # Operation ids are the endpoint functions' names (`kv_cache`, `create_quote`): what a
        # client generated from the spec names its functions, so they are part of the contract.
        generate_unique_id_function=operation_id,
        # One schema per model, not `X-Input` and `X-Output` twins where serialization differs (a quote
        # echoes its request): generated clients fail to resolve the hyphenated twin names.
        separate_input_output_schemas=False,
        openapi_tags=[
            {"name": "gpus", "description": "Accelerator catalog"},
            {"name": "models", "description": "Model-architecture catalog and Hugging Face config import"},
            {"name": "operations", "description": "Liveness, readiness and metrics"},
        ],
    )
    engine = make_engine(settings.database_url)
    app.state.settings = settings
    app.state.engine = engine
    app.state.spec_cache = spec_cache = SpecCache(max_age_s=settings.catalog_max_age_s)
    app.state.session_factory = make_session_factory(engine, info={"spec_cache": spec_cache})
    spec_cache.watch_writes(app.state.session_factory)
    spec_cache.check_in_background(app.state.session_factory)  # no request waits for a revision check
    # Never queries (unbound), so one serves every request on the event loop (app.web.computed_answer).
    app.state.memory_only_session = memory_only_session(app.state.session_factory)
    app.state.plan_pool = PlanPool(settings.plan_workers)
    app.state.metrics = Metrics()
    install_error_handlers(app)
    install_docs(app)
    for router in ROUTERS:
        app.include_router(router)
    # A Hugging Face id in a /v1/models path: the 404 names its catalog slug, as a body field's 422 does (app.errors).
    app.state.repository_id_hint = repository_id_hint
    # For the Allow header of 405 problems (see app.errors).
    app.state.route_methods = [(route.path_regex, set(route.methods), bool(route.param_convertors))
                               for router in ROUTERS for route in router.routes if isinstance(route, APIRoute)]
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "PUT", "DELETE", "POST"],
            allow_headers=["Authorization", "Content-Type", "If-Match", "If-None-Match", "X-Request-ID"],
            expose_headers=["ETag", "Location", "X-Request-ID"],
        )
    app.add_middleware(RequestContextMiddleware, metrics=app.state.metrics,  # outermost
                       timeout_s=settings.request_timeout_s, max_concurrent=settings.max_concurrent_requests)
    return app
