"""Security: write keys (constant-time comparison, rotation, never logged), CORS only for an
allowlist of exact origins, security headers on every answer, and no internals in errors."""

from __future__ import annotations

import hmac
import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import ValidationError

import app.web
from app.catalog import service as catalog_service
from app.estimates import service as estimates
from app.main import JsonFormatter, create_app
from app.settings import Settings
from tests.conftest import OTHER_API_KEY, TEST_API_KEY

KV = {"model": "llama-3-70b", "context_tokens": 8192}
NEW_KEY = "third-write-key-after-rotation-42"
BOOKKEEPING = ("slug", "origin", "version", "created_at", "updated_at", "written_by")


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def gpu_body(client: TestClient, **changes: Any) -> dict[str, Any]:
    row = client.get("/v1/gpus/h100-sxm").json()
    return {**{key: value for key, value in row.items() if key not in BOOKKEEPING}, **changes}


@pytest.fixture
def app_with(settings: Settings, app: FastAPI, fresh_catalog: None) -> Iterator[Any]:
    """Build an application on the test database with some settings changed."""
    def build(**changes: Any) -> FastAPI:
        return create_app(settings.model_copy(update=changes))
    yield build


@pytest.fixture
def captured_logs() -> Iterator[io.StringIO]:
    """Everything logged while the test runs, by the service's loggers and any other, at DEBUG."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    loggers = [logging.getLogger(), logging.getLogger("app")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
    try:
        yield stream
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.removeHandler(handler)
            logger.setLevel(level)


# Write keys -----------------------------------------------------------------------------------

@pytest.mark.parametrize("presented", [TEST_API_KEY, OTHER_API_KEY, "not-a-configured-key-000"])
def test_every_configured_key_is_compared_in_constant_time(client: TestClient, monkeypatch: pytest.MonkeyPatch,
                                                           presented: str) -> None:
    """hmac.compare_digest against each of the two configured keys, whichever matches (or none):
    neither the answer's timing nor the number of comparisons tells which key was used."""
    compared: list[tuple[bytes, bytes]] = []
    real_compare = hmac.compare_digest

    def recording_compare(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real_compare(a, b)

    monkeypatch.setattr(app.web.hmac, "compare_digest", recording_compare)
    response = client.put("/v1/gpus/h100-sxm", json=gpu_body(client), headers=bearer(presented))
    assert response.status_code == (401 if presented.startswith("not-") else 200), response.text
    assert sorted(configured for _, configured in compared) == sorted([TEST_API_KEY.encode(), OTHER_API_KEY.encode()])
    assert {offered for offered, _ in compared} == {presented.encode()}


def test_keys_rotate_with_several_valid_at_once(app_with: Any) -> None:
    """Rotation: add the new key next to the old, move the clients, then drop the old key."""
    body_changes = {"tdp_w": 690.0}
    with TestClient(app_with(api_keys=Settings(api_keys=f"{TEST_API_KEY},{NEW_KEY}").api_keys)) as both:
        for key in (TEST_API_KEY, NEW_KEY):
            assert both.put("/v1/gpus/h100-sxm", json=gpu_body(both, **body_changes), headers=bearer(key)).status_code == 200
    with TestClient(app_with(api_keys=Settings(api_keys=NEW_KEY).api_keys), raise_server_exceptions=False) as rotated:
        assert rotated.put("/v1/gpus/h100-sxm", json=gpu_body(rotated), headers=bearer(NEW_KEY)).status_code == 200
        old = rotated.put("/v1/gpus/h100-sxm", json=gpu_body(rotated), headers=bearer(TEST_API_KEY))
        assert old.status_code == 401 and old.headers["content-type"] == "application/problem+json"


def test_without_configured_keys_no_write_is_possible(app_with: Any) -> None:
    with TestClient(app_with(api_keys=[]), raise_server_exceptions=False) as client:
        response = client.put("/v1/gpus/h100-sxm", json=gpu_body(client), headers=bearer(TEST_API_KEY))
        assert response.status_code == 401
        assert client.get("/v1/gpus/h100-sxm").status_code == 200  # reads need no key


@pytest.mark.parametrize("authorization", [
    b"Basic dXNlcjpwYXNzd29yZA==",  # another scheme
    b"Bearer",  # no key
    b"Bearer " + b"x" * 8000,  # far longer than any key
    b"Bearer \xff\xfe\x00",  # not text
    b"Bearer " + TEST_API_KEY.encode() + b"x",  # a configured key plus one character
    b"Bearer " + TEST_API_KEY[:-1].encode(),  # a configured key less one character
])
def test_malformed_or_wrong_credentials_are_401_problems(client: TestClient, authorization: bytes) -> None:
    response = client.put("/v1/gpus/h100-sxm", json=gpu_body(client), headers=[(b"authorization", authorization)])
    assert response.status_code == 401, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.headers["www-authenticate"].startswith('Bearer realm="llm-sizing"')
    assert TEST_API_KEY not in response.text


def test_keys_never_reach_the_logs(client: TestClient, captured_logs: io.StringIO,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """An authorized write, a refused key, and an authorized write that fails inside: the log
    has a line for each request and the failure's traceback, and no key anywhere."""
    assert client.put("/v1/gpus/h100-sxm", json=gpu_body(client), headers=bearer(TEST_API_KEY)).status_code == 200
    assert client.put("/v1/gpus/h100-sxm", json=gpu_body(client),
                      headers=bearer(OTHER_API_KEY + "-wrong")).status_code == 401

    def failing_put(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the write failed")

    monkeypatch.setattr(catalog_service, "put", failing_put)
    assert client.put("/v1/gpus/h100-sxm", json=gpu_body(client), headers=bearer(OTHER_API_KEY)).status_code == 500
    logged = captured_logs.getvalue()
    lines = [json.loads(line) for line in logged.splitlines()]
    writes = [line["status"] for line in lines if line["logger"] == "app.access" and line["method"] == "PUT"]
    assert writes == [200, 401, 500]
    assert "RuntimeError: the write failed" in logged
    for key in (TEST_API_KEY, OTHER_API_KEY):
        assert key not in logged
    assert "authorization" not in logged.lower()


def test_settings_refuse_keys_and_never_echo_them() -> None:
    with pytest.raises(ValidationError) as error:
        Settings(api_keys=f"{TEST_API_KEY},short")
    assert "#2" in str(error.value) and TEST_API_KEY not in str(error.value) and "short" not in str(error.value)


# CORS ----------------------------------------------------------------------------------------

ORIGIN = "https://tools.example.com"
PREFLIGHT = {"Origin": ORIGIN, "Access-Control-Request-Method": "PUT",
             "Access-Control-Request-Headers": "Authorization, If-Match"}


def test_cors_is_off_without_an_allowlist(client: TestClient) -> None:
    response = client.get("/v1/gpus/h100-sxm", headers={"Origin": ORIGIN})
    assert response.status_code == 200
    assert not [name for name in response.headers if name.startswith("access-control-")]
    preflight = client.options("/v1/gpus/h100-sxm", headers=PREFLIGHT)
    assert preflight.status_code == 405  # no CORS layer answers it
    assert "access-control-allow-origin" not in preflight.headers


def test_cors_answers_only_the_allowlisted_origins(app_with: Any) -> None:
    with TestClient(app_with(cors_origins=[ORIGIN]), raise_server_exceptions=False) as client:
        allowed = client.options("/v1/gpus/h100-sxm", headers=PREFLIGHT)
        assert allowed.status_code == 200
        assert allowed.headers["access-control-allow-origin"] == ORIGIN
        assert "access-control-allow-credentials" not in allowed.headers  # bearer keys, no cookies
        other = {**PREFLIGHT, "Origin": "https://evil.example"}
        refused = client.options("/v1/gpus/h100-sxm", headers=other)
        assert refused.status_code == 400 and "access-control-allow-origin" not in refused.headers
        simple = client.get("/v1/gpus/h100-sxm", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in simple.headers


@pytest.mark.parametrize("origins", ["*", "https://*.example.com", "https://tools.example.com/", "tools.example.com",
                                     "https://tools.example.com/app", "null"])
def test_cors_origins_must_be_exact_origins(origins: str) -> None:
    with pytest.raises(ValidationError):
        Settings(cors_origins=origins)


def test_cors_origins_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORS_ORIGINS", "https://tools.example.com, http://localhost:3000")
    assert Settings().cors_origins == ["https://tools.example.com", "http://localhost:3000"]


# Security headers ------------------------------------------------------------------------------

SECURITY_HEADERS = {
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "content-security-policy": "frame-ancestors 'none'",
    "referrer-policy": "no-referrer",
}


def test_security_headers_on_answers_and_problems(client: TestClient) -> None:
    responses = {
        "sizing": client.post("/v1/kv-cache", json=KV),
        "catalog": client.get("/v1/gpus/h100-sxm"),
        "docs": client.get("/docs"),
        "404": client.get("/v1/gpus/h900"),
        "405": client.delete("/v1/kv-cache"),
        "422": client.post("/v1/kv-cache", json={**KV, "context_tokens": 0}),
        "413": client.post("/v1/kv-cache", content=b" " * (2 << 20), headers={"Content-Type": "application/json"}),
    }
    for name, response in responses.items():
        for header, value in SECURITY_HEADERS.items():
            assert response.headers.get(header) == value, (name, header)
        if response.status_code >= 400:
            assert response.headers["cache-control"] == "no-store", name
            assert response.headers["content-type"] == "application/problem+json", name


# No internals in errors --------------------------------------------------------------------------

@pytest.mark.parametrize("error", [RuntimeError("secret detail in /work/main/app/estimates/service.py"),
                                   KeyError("secret_column"), ZeroDivisionError("secret division"),
                                   RecursionError("maximum recursion depth exceeded (secret)")])
def test_an_internal_error_is_a_500_problem_without_internals(client: TestClient, monkeypatch: pytest.MonkeyPatch,
                                                              captured_logs: io.StringIO, error: Exception) -> None:
    def failing_kv_cache(*args: Any, **kwargs: Any) -> Any:
        raise error

    monkeypatch.setattr(estimates, "kv_cache", failing_kv_cache)
    response = client.post("/v1/kv-cache", json=KV, headers={"X-Request-ID": "fault-7"})
    assert response.status_code == 500
    assert response.headers["content-type"] == "application/problem+json"
    assert response.headers["cache-control"] == "no-store"
    assert response.json() == {"type": "about:blank", "title": "Internal Server Error", "status": 500,
                               "detail": "Internal error; quote the request id", "instance": "/v1/kv-cache",
                               "request_id": "fault-7"}
    for leak in ("secret", "Traceback", "service.py", type(error).__name__):
        assert leak not in response.text
    # The operator has the whole story, under the same request id.
    logged = [json.loads(line) for line in captured_logs.getvalue().splitlines()]
    failure = next(line for line in logged if line["message"] == "unhandled error")
    assert failure["request_id"] == "fault-7" and type(error).__name__ in failure["exception"]
