"""The sizing endpoints' route class (app.web.ComputedRoute): a well-formed JSON request is answered without
FastAPI's generic request handling, and everything else gets exactly what FastAPI's handler gives."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import fastapi.routing
import pytest
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.testclient import TestClient
from pydantic import BaseModel
from starlette.responses import Response

from app.main import create_app
from app.settings import Settings
from app.web import ComputedRoute, SizingRead
from tests.api.problems import assert_problem

KV_CACHE = {"model": "llama-3-70b", "context_tokens": 8192, "batch_size": 1}


@pytest.fixture
def generic_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts the requests that went through FastAPI's generic handler (it solves the dependencies)."""
    calls: list[int] = []
    solve = fastapi.routing.solve_dependencies

    async def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return await solve(*args, **kwargs)

    monkeypatch.setattr(fastapi.routing, "solve_dependencies", counted)
    yield calls


def test_a_well_formed_json_request_skips_the_generic_handler(client: TestClient, generic_calls: list[int]) -> None:
    """The same body as `application/json` (the direct path) and as `application/json; charset=utf-8` (FastAPI's
    handler, which accepts any JSON media type): the same answer, byte for byte."""
    direct = client.post("/v1/kv-cache", json=KV_CACHE)
    assert direct.status_code == 200, direct.text
    assert generic_calls == []
    generic = client.post("/v1/kv-cache", json=KV_CACHE, headers={"content-type": "application/json; charset=utf-8"})
    assert generic.status_code == 200 and generic_calls == [1]
    assert direct.content == generic.content


@pytest.mark.parametrize(("path", "body", "pointer"), [
    ("/v1/kv-cache", {**KV_CACHE, "context_tokens": "many"}, "/body/context_tokens"),
    ("/v1/roofline", {"model": "llama-3-8b", "gpu": "h100-sxm"}, "/body/phase"),
    ("/v1/capacity", [1, 2], "/body"),
])
def test_a_body_that_does_not_validate_gets_fastapis_problem(client: TestClient, generic_calls: list[int], path: str,
                                                              body: Any, pointer: str) -> None:
    assert_problem(client.post(path, json=body), 422, pointer)
    assert generic_calls == [1]


@pytest.mark.parametrize(("body", "detail"), [
    (b'{"model": ', "JSON decode error: Expecting value at character 10 (counting from 0)"),
    # {"model": "llama-3-8b",} : the brace after the trailing comma is character 23.
    (b'{"model": "llama-3-8b",}',
     "JSON decode error: Expecting property name enclosed in double quotes at character 23 (counting from 0)"),
])
def test_malformed_json_gets_fastapis_problem_saying_what_and_where(client: TestClient, body: bytes,
                                                                    detail: str) -> None:
    """FastAPI's handler reports a JSON syntax error (it fails before the dependencies); the problem says what
    the parser expected and at which character (was: only "JSON decode error")."""
    response = client.post("/v1/capacity", content=body, headers={"content-type": "application/json"})
    problem = assert_problem(response, 422, "/body")
    assert problem["errors"] == [{"pointer": "/body", "detail": detail}]


def test_a_client_gone_before_its_body_gets_fastapis_answer(app: FastAPI, fresh_catalog: None,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """FastAPI's handler reads the body of a client that disconnected as no body (a 422: the body is required);
    the direct path hands the disconnect to it rather than letting it reach the middleware as an unhandled
    error (a logged 500)."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/kv-cache", "raw_path": b"/v1/kv-cache", "query_string": b"", "root_path": "",
             "headers": [(b"host", b"test"), (b"content-type", b"application/json"), (b"content-length", b"64")],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80), "state": {}}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    with caplog.at_level(logging.ERROR, logger="app.errors"):
        asyncio.run(app(scope, receive, send))
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 422
    assert [record for record in caplog.records if record.name == "app.errors"] == []


def test_closed_reads_still_need_the_key(settings: Settings, fresh_catalog: None) -> None:
    """With OPEN_READS=false a well-formed body goes through FastAPI's handler, which checks the key."""
    closed = create_app(settings.model_copy(update={
        "api_keys": Settings(api_keys="reader:secret-sizing-reader-0001:sizing:read").api_keys, "open_reads": False}))
    with TestClient(closed) as client:
        assert_problem(client.post("/v1/kv-cache", json=KV_CACHE), 401)
        reader = {"Authorization": "Bearer secret-sizing-reader-0001"}
        assert client.post("/v1/kv-cache", json=KV_CACHE, headers=reader).status_code == 200
    closed.state.engine.dispose()


class Body(BaseModel):
    x: int


async def endpoint(request: Request, body: Body) -> Response:
    return Response()


async def extra() -> None:
    return None


def test_a_route_with_another_dependency_is_refused() -> None:
    """The direct path calls the endpoint with (request, body) and checks only the read access: a route that
    needs anything more must not be built with this class."""
    with pytest.raises(TypeError, match="only dependency is SizingRead"):
        APIRouter(dependencies=[SizingRead, Depends(extra)], route_class=ComputedRoute).post("/x")(endpoint)
    with pytest.raises(TypeError, match="only dependency is SizingRead"):
        APIRouter(route_class=ComputedRoute).post("/x")(endpoint)
    APIRouter(dependencies=[SizingRead], route_class=ComputedRoute).post("/x")(endpoint)  # the one accepted shape
