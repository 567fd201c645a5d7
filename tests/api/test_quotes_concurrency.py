"""Quote creation under real concurrency: a uvicorn server, many HTTP clients in threads at once.

Each request gets its own database connection from the server's pool, so this is what happens in
production: on PostgreSQL the UNIQUE index makes the losers of an insert race wait for the winner
and fail; on SQLite the file lock serializes the writers. Either way one key stores one quote.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from sqlalchemy import Engine, delete, select
from sqlalchemy.orm import Session

from app.catalog.repository import bump_catalog_revision
from app.catalog.tables import GpuRecord
from app.planning import service as planning
from app.quotes import service as quotes
from app.quotes.tables import QuoteRecord
from tests.api.test_quotes import PLAN
from tests.conftest import TEST_API_KEY, reset_catalog

CLIENTS = 8
WRITE_HEADERS = {"Authorization": f"Bearer {TEST_API_KEY}"}


@pytest.fixture(scope="module")
def server_url(app: FastAPI) -> Iterator[str]:
    """The application served by uvicorn on a free local port, for the whole module."""
    # lifespan off: the server must not dispose the engine the other tests share.
    config = uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="off", log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        threading.Event().wait(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(autouse=True)
def clean(engine: Engine) -> Iterator[None]:
    reset_catalog(engine)
    with Session(engine) as session, session.begin():
        session.execute(delete(QuoteRecord))
    yield


def _post_all(url: str, bodies: list[dict[str, Any]], key: str | None) -> list[httpx.Response]:
    """POST every body at once, each from its own client and thread, released together."""
    start = threading.Barrier(len(bodies))
    headers = {**WRITE_HEADERS, **({"Idempotency-Key": key} if key is not None else {})}

    def post(body: dict[str, Any]) -> httpx.Response:
        with httpx.Client(base_url=url, timeout=60) as client:
            start.wait()
            return client.post("/v1/quotes", json=body, headers=headers)

    with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
        return list(pool.map(post, bodies))


def _rows(engine: Engine) -> list[QuoteRecord]:
    with Session(engine) as session:
        return list(session.scalars(select(QuoteRecord)))


def _after_each_plan(monkeypatch: pytest.MonkeyPatch, hook: Callable[[], None]) -> list[int]:
    """Run `hook` after every plan the quote service makes; returns a list counting the plans."""
    plans: list[int] = []
    real = quotes.plan_with_snapshot

    def plan_then_hook(session: Session, request: Any, *args: Any, **kwargs: Any) -> Any:
        answer = real(session, request, *args, **kwargs)
        plans.append(1)
        hook()
        return answer

    monkeypatch.setattr(quotes, "plan_with_snapshot", plan_then_hook)
    return plans


def test_concurrent_retries_with_one_key_store_one_quote(server_url: str, engine: Engine) -> None:
    responses = _post_all(server_url, [PLAN] * CLIENTS, key="order-1001")
    assert Counter(response.status_code for response in responses) == {201: 1, 200: CLIENTS - 1}
    assert len({response.content for response in responses}) == 1  # the same quote, byte for byte
    rows = _rows(engine)
    assert len(rows) == 1 and rows[0].idempotency_key == "order-1001"
    assert rows[0].id == responses[0].json()["id"]


def test_an_insert_race_has_exactly_one_winner(server_url: str, engine: Engine,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Every client plans before any inserts (a barrier after the plan), so all of them pass the
    look-up of the key and race on the INSERT itself: the UNIQUE constraint picks one winner, and
    the others roll back and answer with the winner's quote."""
    all_planned = threading.Barrier(CLIENTS)
    plans = _after_each_plan(monkeypatch, lambda: all_planned.wait(timeout=60))
    responses = _post_all(server_url, [PLAN] * CLIENTS, key="order-1002")
    assert len(plans) == CLIENTS  # nobody found the key stored before inserting
    assert Counter(response.status_code for response in responses) == {201: 1, 200: CLIENTS - 1}
    assert len({response.json()["id"] for response in responses}) == 1
    assert len({response.content for response in responses}) == 1
    assert len(_rows(engine)) == 1


def test_an_insert_race_with_two_bodies_under_one_key(server_url: str, engine: Engine,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Half the clients send another body: whichever body wins, the other half get 422s."""
    all_planned = threading.Barrier(CLIENTS)
    _after_each_plan(monkeypatch, lambda: all_planned.wait(timeout=60))
    other = {**PLAN, "seed": 1}
    bodies = [PLAN, other] * (CLIENTS // 2)
    responses = _post_all(server_url, bodies, key="order-1003")
    rows = _rows(engine)
    assert len(rows) == 1
    won = [body for body, response in zip(bodies, responses, strict=True)
           if response.status_code in (200, 201)]
    lost = [response for response in responses if response.status_code == 422]
    assert len(won) == len(lost) == CLIENTS // 2
    assert all(body == won[0] for body in won)  # every success carried the winning body
    assert rows[0].request["seed"] == won[0].get("seed", 0)
    assert all(response.json()["errors"][0]["pointer"] == "/header/idempotency-key" for response in lost)


def test_concurrent_creates_without_a_key_are_separate_quotes(server_url: str, engine: Engine) -> None:
    responses = _post_all(server_url, [PLAN] * CLIENTS, key=None)
    assert [response.status_code for response in responses] == [201] * CLIENTS
    assert len({response.json()["id"] for response in responses}) == CLIENTS
    assert len(_rows(engine)) == CLIENTS


def test_a_catalog_write_during_the_plan_is_never_half_seen(app: FastAPI, engine: Engine,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The first plan is followed by a price change committed by another writer: the plan and the
    snapshot could now disagree, so the service plans again, and both show the new price."""
    calls: list[int] = []
    real_plan = planning.plan_slo

    def plan_then_write(session: Session, request: Any, *sources: Any, **options: Any) -> Any:
        answer = real_plan(session, request, *sources, **options)
        calls.append(1)
        if len(calls) == 1:
            with Session(engine) as writer, writer.begin():
                record = writer.get(GpuRecord, "h100-sxm")
                assert record is not None
                record.price_per_hour_usd = 2.0
                bump_catalog_revision(writer)  # as every catalog write does
        return answer

    monkeypatch.setattr(planning, "plan_slo", plan_then_write)
    stored, created = quotes.create_quote(app.state.session_factory,
                                          quotes.SloPlanRequest.model_validate(PLAN), None, "key-1")
    assert created and len(calls) == 2
    gpu = stored.catalog_snapshot["gpus"]["h100-sxm"]
    assert (gpu["price_per_hour_usd"], gpu["version"]) == (2.0, 2)
    # One replica of one GPU at the new $2.00 per GPU-hour.
    assert stored.result["plans"][0]["cost_per_hour_usd"] == pytest.approx(2.0)
