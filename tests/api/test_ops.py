"""Operations: liveness, readiness, metrics, request ids, logs, security headers, CORS, 500s,
database outages, and settings validation."""

from __future__ import annotations

import gc
import io
import json
import logging
import re
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import ValidationError

from app.db import migration_heads
from app.main import JsonFormatter, create_app
from app.settings import Settings
from tests.conftest import TEST_API_KEY

UNREACHABLE_DATABASE = "postgresql+psycopg://postgres@127.0.0.1:1/nowhere"  # nothing listens on port 1


def test_a_running_app_keeps_what_it_started_with_out_of_full_collections(settings: Settings) -> None:
    """A full collection walked every object of the started process (about 200,000: 110-120 ms with the event
    loop held); while the app runs they are frozen (`gc.freeze`), and released when it shuts down."""
    with TestClient(create_app(settings)) as client:
        assert client.get("/healthz").status_code == 200
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0


def test_healthz(client: TestClient) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


def test_readyz_when_migrated(client: TestClient) -> None:
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json()["status"] == "ready"
    assert response.json()["migration"] == ", ".join(sorted(migration_heads()))


def test_readyz_is_503_before_migrations(tmp_path: Path) -> None:
    app = create_app(Settings(database_url=f"sqlite:///{tmp_path / 'empty.db'}", log_level="warning"))
    with TestClient(app) as client:
        response = client.get("/readyz")
        assert response.status_code == 503
        assert response.headers["content-type"] == "application/problem+json"
        assert "alembic upgrade head" in response.json()["detail"]
        assert client.get("/healthz").status_code == 200  # alive, just not ready
        assert client.head("/readyz").status_code == 503 and client.head("/healthz").status_code == 200


def test_database_outage_is_503_never_500() -> None:
    app = create_app(Settings(database_url=UNREACHABLE_DATABASE, log_level="critical"))
    with TestClient(app, raise_server_exceptions=False) as client:
        for path in ("/readyz", "/v1/gpus", "/v1/models/llama-3-70b"):
            response = client.get(path)
            assert response.status_code == 503, path
            assert response.headers["content-type"] == "application/problem+json"
        assert client.get("/v1/gpus").headers["retry-after"] == "5"
        assert client.get("/healthz").status_code == 200


def test_request_id_is_echoed_generated_or_replaced(client: TestClient) -> None:
    assert client.get("/healthz", headers={"X-Request-ID": "abc-123.run:7"}).headers["x-request-id"] == "abc-123.run:7"
    generated = client.get("/healthz").headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", generated)
    for bad in ("x" * 129, "has space", "semi;colon", ""):
        replaced = client.get("/healthz", headers={"X-Request-ID": bad}).headers["x-request-id"]
        assert replaced != bad and re.fullmatch(r"[0-9a-f]{32}", replaced)
    # Problems carry it too, for support requests.
    missing = client.get("/v1/gpus/h900", headers={"X-Request-ID": "trace-42"})
    assert missing.json()["request_id"] == "trace-42" and missing.headers["x-request-id"] == "trace-42"


def test_security_headers(client: TestClient) -> None:
    for response in (client.get("/v1/gpus/h100-sxm"), client.get("/nowhere")):
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["x-frame-options"] == "DENY"
        assert response.headers["referrer-policy"] == "no-referrer"


def _count(metrics_text: str, labels: str) -> float:
    match = re.search(r"^http_requests_total\{" + re.escape(labels) + r"\} (\S+)$", metrics_text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_metrics_count_requests_by_route_template(client: TestClient) -> None:
    by_template = 'method="GET",route="/v1/gpus/{slug}",status="200"'
    before = _count(client.get("/metrics").text, by_template)
    client.get("/v1/gpus/h100-sxm")
    client.get("/v1/gpus/b200")
    client.get("/no/such/route")
    text = client.get("/metrics").text
    assert _count(text, by_template) == before + 2
    assert _count(text, 'method="GET",route="unmatched",status="404"') >= 1
    assert "/v1/gpus/h100-sxm" not in text  # raw paths never become label values
    assert "http_request_duration_seconds_bucket" in text


def test_the_probes_answer_head(client: TestClient) -> None:
    """RFC 9110 section 9.1: HEAD where GET is; some monitors probe with it (it was a 405)."""
    for path in ("/healthz", "/readyz"):
        response = client.head(path)
        assert response.status_code == 200 and response.content == b"", path


def test_a_request_answered_before_routing_counts_under_its_route(client: TestClient) -> None:
    """A declared body over the 1 MiB limit is refused before the router sees the request: it counted under
    "unmatched"; it counts under its route's template, as a 503 of a full queue does."""
    labels = 'method="POST",route="/v1/kv-cache",status="413"'
    before = _count(client.get("/metrics").text, labels)
    response = client.post("/v1/kv-cache", content=b" " * 1_048_577, headers={"content-type": "application/json"})
    assert response.status_code == 413 and "content-length" in response.request.headers
    assert _count(client.get("/metrics").text, labels) == before + 1


def test_logs_are_json_with_the_request_id_and_no_secrets(client: TestClient) -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("app")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        client.put("/v1/gpus/h100-sxm", json={"name": "x"}, headers={
            "Authorization": f"Bearer {TEST_API_KEY}", "X-Request-ID": "log-check-1"})
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    access = [line for line in lines if line["logger"] == "app.access"]
    assert access and access[-1]["request_id"] == "log-check-1"
    assert (access[-1]["route"], access[-1]["status"]) == ("/v1/gpus/{slug}", 422)
    assert TEST_API_KEY not in stream.getvalue()


def test_settings_never_show_keys() -> None:
    settings = Settings(api_keys=TEST_API_KEY)
    assert TEST_API_KEY not in repr(settings) and TEST_API_KEY not in str(settings.model_dump())


def test_unhandled_errors_are_500_problems_without_internals(settings: Settings) -> None:
    app = create_app(settings)

    def explode() -> None:
        raise RuntimeError("secret internal detail")

    app.add_api_route("/explode", explode)
    with TestClient(app, raise_server_exceptions=False) as client:
        response = client.get("/explode", headers={"X-Request-ID": "boom-1"})
    assert response.status_code == 500
    assert response.headers["content-type"] == "application/problem+json"
    assert response.headers["x-request-id"] == "boom-1"
    assert "secret" not in response.text and "Traceback" not in response.text


def test_cors_is_off_unless_configured(client: TestClient, settings: Settings) -> None:
    origin = {"Origin": "https://tools.example.com"}
    assert "access-control-allow-origin" not in client.get("/v1/gpus", headers=origin).headers
    app: FastAPI = create_app(settings.model_copy(update={"cors_origins": ["https://tools.example.com"]}))
    with TestClient(app) as cors_client:
        preflight = cors_client.options("/v1/gpus/h100-sxm", headers={
            **origin, "Access-Control-Request-Method": "PUT", "Access-Control-Request-Headers": "If-Match"})
        assert preflight.headers["access-control-allow-origin"] == "https://tools.example.com"
        assert "etag" in cors_client.get("/healthz", headers=origin).headers["access-control-expose-headers"].lower()


def test_docs_are_served(client: TestClient) -> None:
    assert client.get("/docs").status_code == 200
    assert client.get("/openapi.json").json()["info"]["title"] == "LLM inference sizing service"


# Settings ------------------------------------------------------------------------------------

def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgres://u@db.internal:5432/sizing")
    monkeypatch.setenv("API_KEYS", f" {TEST_API_KEY} , rotated-write-key-fedcba9876543210 ,")
    monkeypatch.setenv("HOST", "0.0.0.0")
    monkeypatch.setenv("PORT", "9000")
    monkeypatch.setenv("LOG_LEVEL", "DEBUG")
    monkeypatch.setenv("CORS_ORIGINS", "https://a.example,https://b.example")
    settings = Settings()
    assert settings.database_url == "postgresql+psycopg://u@db.internal:5432/sizing"  # psycopg 3 driver
    assert [key.secret.get_secret_value() for key in settings.api_keys] == [TEST_API_KEY, "rotated-write-key-fedcba9876543210"]
    assert (settings.host, settings.port, settings.log_level) == ("0.0.0.0", 9000, "debug")
    assert settings.cors_origins == ["https://a.example", "https://b.example"]


def test_settings_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DATABASE_URL", "API_KEYS", "HOST", "PORT", "LOG_LEVEL", "CORS_ORIGINS"):
        monkeypatch.delenv(name, raising=False)
    settings = Settings()
    assert settings.database_url == "sqlite:///./data/sizing.db"
    assert (settings.api_keys, settings.host, settings.port, settings.log_level, settings.cors_origins) == (
        [], "127.0.0.1", 8000, "info", [])


@pytest.mark.parametrize(("name", "value"), [
    ("PORT", "0"), ("PORT", "65536"), ("PORT", "http"),
    ("LOG_LEVEL", "verbose"),
    ("API_KEYS", "short"),  # under 16 characters
    ("API_KEYS", "has space in the middle of it"),
    ("DATABASE_URL", "not a url"),
    ("DATABASE_URL", "mysql://u@h/db"),
])
def test_bad_settings_stop_the_start(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError) as error:
        Settings()
    if name == "API_KEYS":
        assert value not in str(error.value)  # the message names the key's position, not the key
