"""Two replicas (two applications) on one database: sizing answers come from each one's cached catalog,
which sees its own writes at once and the other's within CATALOG_MAX_AGE_S (0.25 s by default)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.catalog.schemas import ModelIn
from app.main import create_app
from app.settings import Settings
from tests.conftest import TEST_API_KEY

WRITE = {"Authorization": f"Bearer {TEST_API_KEY}"}
KV = {"model": "llama-3-8b", "context_tokens": 1000, "batch_size": 1}
# Llama-3-8B, bf16: 2 (K and V) x 8 KV heads x 128 head_dim x 2 bytes = 4,096 bytes per token per layer;
# 32 layers x 1,000 tokens -> 131,072,000 bytes per sequence; with 16 layers, 65,536,000.
BYTES_32_LAYERS = 131_072_000
BYTES_16_LAYERS = 65_536_000


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


Replicas = tuple[TestClient, TestClient, FakeClock, list[Callable[[], None]]]


@pytest.fixture
def replicas(app: FastAPI, settings: Settings, fresh_catalog: None) -> Iterator[Replicas]:
    """Replica A (the suite's application) and replica B (a second application on the same database),
    B's cache on a clock the test moves, and B's revision checks held in a list until the test runs them
    (the service runs each on a thread of its own as soon as a request claims it)."""
    other = create_app(settings)
    clock = FakeClock()
    checks: list[Callable[[], None]] = []
    other.state.spec_cache.clock = clock
    other.state.spec_cache.check_in_background(other.state.session_factory, start=checks.append)
    try:
        with TestClient(app) as a, TestClient(other) as b:
            yield a, b, clock, checks
    finally:
        other.state.engine.dispose()


def _kv_bytes(client: TestClient) -> int:
    response = client.post("/v1/kv-cache", json=KV)
    assert response.status_code == 200, response.text
    return int(response.json()["bytes_per_sequence"])


def _writable(client: TestClient, slug: str) -> dict[str, Any]:
    """The model's GET representation as a PUT body."""
    row: dict[str, Any] = client.get(f"/v1/models/{slug}").json()
    return {name: row[name] for name in ModelIn.model_fields if name in row}


def _halve_layers(client: TestClient) -> None:
    body = _writable(client, "llama-3-8b")
    response = client.put("/v1/models/llama-3-8b", json={**body, "num_hidden_layers": 16}, headers=WRITE)
    assert response.status_code == 200, response.text


def test_a_replica_sees_its_own_write_at_once_and_anothers_within_the_bound(replicas: Replicas) -> None:
    a, b, clock, checks = replicas
    assert _kv_bytes(a) == BYTES_32_LAYERS
    assert _kv_bytes(b) == BYTES_32_LAYERS  # B has checked the revision and cached the spec
    _halve_layers(a)
    assert _kv_bytes(a) == BYTES_16_LAYERS  # A's own write: at once
    clock.now += 0.2
    assert _kv_bytes(b) == BYTES_32_LAYERS  # within B's bound: from memory
    assert not checks
    clock.now += 0.06  # 0.26 s after B's last check: due
    assert _kv_bytes(b) == BYTES_32_LAYERS  # this request starts B's check and answers from memory meanwhile
    assert _kv_bytes(b) == BYTES_32_LAYERS  # as does the next: one check at a time
    assert len(checks) == 1
    checks.pop()()  # the check lands
    assert _kv_bytes(b) == BYTES_16_LAYERS  # seen


def test_a_due_revision_check_runs_on_a_thread_of_its_own(app: FastAPI, settings: Settings,
                                                           fresh_catalog: None) -> None:
    """The service's own start: the check a due request claims runs on a thread, and the write is seen
    once it has landed (the request that claimed it may see it too, if the check landed first)."""
    other = create_app(settings)
    clock = FakeClock()
    other.state.spec_cache.clock = clock
    try:
        with TestClient(app) as a, TestClient(other) as b:
            assert _kv_bytes(b) == BYTES_32_LAYERS
            _halve_layers(a)
            clock.now += 0.26
            seen = [_kv_bytes(b)]
            deadline = time.monotonic() + 10
            while seen[-1] != BYTES_16_LAYERS and time.monotonic() < deadline:
                time.sleep(0.01)
                seen.append(_kv_bytes(b))
            assert seen[-1] == BYTES_16_LAYERS
    finally:
        other.state.engine.dispose()


def test_a_new_slug_written_elsewhere_is_found_at_once(replicas: tuple[TestClient, TestClient, FakeClock]) -> None:
    """A slug a replica has not cached is read from the database, whatever the bound."""
    a, b, _, _ = replicas
    body = _writable(a, "llama-3-8b")
    assert b.post("/v1/kv-cache", json={**KV, "model": "my-llama"}).status_code == 404
    assert a.put("/v1/models/my-llama", json=body, headers=WRITE).status_code == 201
    assert _kv_bytes_of(b, "my-llama") == BYTES_32_LAYERS


def _kv_bytes_of(client: TestClient, model: str) -> int:
    response = client.post("/v1/kv-cache", json={**KV, "model": model})
    assert response.status_code == 200, response.text
    return int(response.json()["bytes_per_sequence"])
