"""Catalog writes and sizing reads under real concurrency, and a database outage with recovery.

Requests go to a live uvicorn server from several threads, each with its own HTTP client and so
its own database connection from the server's pool: what happens in production. Catalog writers
run one at a time (`repository.lock_catalog`: the revision row's lock on PostgreSQL, the file's
write lock on SQLite, taken before the row is read), so the later of two racing writers reads
what the earlier committed: exactly one of two conditional writes wins, the other's condition
fails against the row it sees (412), an unconditional write never fails for a race it cannot see,
and no write is ever half-applied or undone. The outage tests need PostgreSQL: the service reaches it through a
TCP proxy the test can cut and restore.
"""

from __future__ import annotations

import os
import socket
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from app.catalog import repository
from app.catalog.reference import load_reference_catalog
from app.main import create_app
from app.settings import Settings
from tests.api.test_quotes_concurrency import server_url  # noqa: F401  (the live-server fixture)
from tests.conftest import TEST_API_KEY, reset_catalog

WRITE_HEADERS = {"Authorization": f"Bearer {TEST_API_KEY}"}
BOOKKEEPING = ("slug", "origin", "version", "created_at", "updated_at", "written_by")  # set by the service, not the client
KV = {"model": "llama-3-70b", "context_tokens": 8192, "batch_size": 32}
# Llama-3-70B, bf16: 2 (K and V) x 80 layers x 8 KV heads x 128 head_dim x 2 bytes = 327,680 bytes
# per token; x 8192 tokens = 2,684,354,560 bytes per sequence; x 32 sequences = 85,899,345,920.
KV_TOTAL_BYTES = 85_899_345_920
ON_POSTGRES = os.environ.get("TEST_DATABASE_URL", "").startswith("postgresql")


@pytest.fixture(autouse=True)
def clean(engine: Engine) -> None:
    reset_catalog(engine)


def writable(row: dict[str, Any]) -> dict[str, Any]:
    """A GET representation as a PUT body."""
    return {key: value for key, value in row.items() if key not in BOOKKEEPING}


def revision(engine: Engine) -> int:
    with Session(engine) as session:
        return repository.catalog_revision(session)


def at_once(url: str, calls: list[Callable[[httpx.Client], httpx.Response]]) -> list[httpx.Response]:
    """Run each call from its own thread and HTTP client, all released together."""
    start = threading.Barrier(len(calls))

    def run(call: Callable[[httpx.Client], httpx.Response]) -> httpx.Response:
        with httpx.Client(base_url=url, timeout=30) as client:
            start.wait(timeout=30)
            return call(client)

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return list(pool.map(run, calls))


# Conditional writes --------------------------------------------------------------------------

def test_two_puts_with_the_same_if_match_one_wins_the_other_gets_412(
        server_url: str, engine: Engine) -> None:  # noqa: F811
    with httpx.Client(base_url=server_url) as client:
        current = client.get("/v1/gpus/h100-sxm")
    etag, row = current.headers["etag"], current.json()
    revision_before = revision(engine)
    bodies = [{**writable(row), "name": "Writer A", "tdp_w": 650.0},
              {**writable(row), "name": "Writer B", "tdp_w": 600.0}]
    responses = at_once(server_url, [
        lambda client, body=body: client.put("/v1/gpus/h100-sxm", json=body,
                                             headers={**WRITE_HEADERS, "If-Match": etag})
        for body in bodies])
    assert sorted(response.status_code for response in responses) == [200, 412]
    loser = next(response for response in responses if response.status_code == 412)
    assert loser.headers["content-type"] == "application/problem+json"
    assert "If-Match" in loser.json()["detail"]
    winner_body = bodies[[response.status_code for response in responses].index(200)]
    with httpx.Client(base_url=server_url) as client:
        stored = client.get("/v1/gpus/h100-sxm").json()
    # Every field is the winner's (none of the loser's), the version moved by exactly one, and the
    # catalog revision was bumped once: one write, applied whole.
    assert writable(stored) == winner_body
    assert stored["version"] == row["version"] + 1
    assert revision(engine) == revision_before + 1


def test_a_put_and_a_delete_with_the_same_if_match_one_wins(
        server_url: str, engine: Engine) -> None:  # noqa: F811
    with httpx.Client(base_url=server_url) as client:
        current = client.get("/v1/models/llama-3-8b")
    etag, row = current.headers["etag"], current.json()
    revision_before = revision(engine)
    body = {**writable(row), "name": "Llama 3 8B (renamed)"}
    for derived in ("architecture", "attention_type"):  # computed by the service, not writable
        body.pop(derived)
    put, delete = at_once(server_url, [
        lambda client: client.put("/v1/models/llama-3-8b", json=body, headers={**WRITE_HEADERS, "If-Match": etag}),
        lambda client: client.delete("/v1/models/llama-3-8b", headers={**WRITE_HEADERS, "If-Match": etag}),
    ])
    assert sorted([put.status_code, delete.status_code]) in ([200, 412], [204, 412])
    with httpx.Client(base_url=server_url) as client:
        after = client.get("/v1/models/llama-3-8b")
    if put.status_code == 200:
        assert after.status_code == 200 and after.json()["name"] == "Llama 3 8B (renamed)"
    else:
        assert after.status_code == 404
    assert revision(engine) == revision_before + 1


def test_two_creates_of_one_new_row_one_wins(server_url: str, engine: Engine) -> None:  # noqa: F811
    """Both create only (If-None-Match: *): the later reads the earlier's row, so its condition fails (412, as
    a create of an existing row gets; was a 409 "retry" when both had read no row), and the stored row is
    entirely the winner's."""
    with httpx.Client(base_url=server_url) as client:
        template = writable(client.get("/v1/gpus/h100-sxm").json())
    bodies = [{**template, "name": "New accelerator A"}, {**template, "name": "New accelerator B"}]
    responses = at_once(server_url, [
        lambda client, body=body: client.put("/v1/gpus/new-accelerator", json=body,
                                             headers={**WRITE_HEADERS, "If-None-Match": "*"})
        for body in bodies])
    assert sorted(response.status_code for response in responses) == [201, 412]
    winner_body = bodies[[response.status_code for response in responses].index(201)]
    with httpx.Client(base_url=server_url) as client:
        stored = client.get("/v1/gpus/new-accelerator").json()
    assert writable(stored) == winner_body and stored["version"] == 1


def test_unconditional_writes_of_one_row_all_succeed_one_after_another(server_url: str, engine: Engine) -> None:  # noqa: F811
    """Six PUTs of one new row with no condition: each replaces what the one before it wrote (one 201, five 200;
    was: 412s and 409s for a race no request had asked to be told of), the version counts every one; then six
    DELETEs of it: one 204, five 404 (the row is gone; was: 412)."""
    with httpx.Client(base_url=server_url) as client:
        template = writable(client.get("/v1/gpus/h100-sxm").json())
    revision_before = revision(engine)
    responses = at_once(server_url, [
        lambda client, number=number: client.put("/v1/gpus/raced", json={**template, "name": f"Writer {number}"},
                                                 headers=WRITE_HEADERS)
        for number in range(6)])
    assert sorted(response.status_code for response in responses) == [200] * 5 + [201]
    with httpx.Client(base_url=server_url) as client:
        assert client.get("/v1/gpus/raced").json()["version"] == 6
    assert revision(engine) == revision_before + 6
    deletes = at_once(server_url, [lambda client: client.delete("/v1/gpus/raced", headers=WRITE_HEADERS)] * 6)
    assert sorted(response.status_code for response in deletes) == [204] + [404] * 5


def test_a_delete_during_a_reference_load_stays_deleted(server_url: str, engine: Engine,  # noqa: F811
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica deletes the reference GPU l4 while `make load-catalog` runs, between the loader's read of the
    deletions users made and its read of the rows: the delete waits for the load's commit (was: it committed in
    between, the loader saw neither the row nor its deletion and inserted it again, undoing a 204), and the
    next load keeps it deleted."""
    real_tombstones = repository.tombstones
    deleting: dict[str, Any] = {}

    def tombstones_then_a_delete(session: Session) -> set[tuple[str, str]]:
        found = real_tombstones(session)

        def delete() -> None:
            deleting["response"] = httpx.delete(f"{server_url}/v1/gpus/l4", headers=WRITE_HEADERS, timeout=30)

        deleting["thread"] = threading.Thread(target=delete)
        deleting["thread"].start()
        deleting["thread"].join(timeout=2)  # a delete the load does not hold back commits meanwhile
        return found

    monkeypatch.setattr(repository, "tombstones", tombstones_then_a_delete)
    with Session(engine) as session, session.begin():
        load_reference_catalog(session)
    deleting["thread"].join(timeout=30)
    monkeypatch.undo()
    assert deleting["response"].status_code == 204
    with Session(engine) as session, session.begin():
        report = load_reference_catalog(session)
    assert report.inserted == 0
    with httpx.Client(base_url=server_url) as client:
        assert client.get("/v1/gpus/l4").status_code == 404


# Many clients at once -------------------------------------------------------------------------

def test_many_concurrent_clients_are_all_served(server_url: str) -> None:  # noqa: F811
    """80 keep-alive clients at once: more requests than worker threads (40) plus pooled database
    connections (15). A request keeps its connection while it waits for a thread to serialize its
    answer, so without the per-process request slots every thread could end up waiting for a
    connection held by a request waiting for a thread: a stall until the pool times out."""
    def session_of_requests(client: httpx.Client) -> httpx.Response:
        responses = [client.post("/v1/kv-cache", json=KV) for _ in range(5)]
        assert {response.status_code for response in responses} == {200}, responses[-1].text
        assert {response.json()["total_bytes"] for response in responses} == {KV_TOTAL_BYTES}
        return responses[-1]

    responses = at_once(server_url, [session_of_requests] * 80)
    assert Counter(response.status_code for response in responses) == {200: 80}


# Database outage -------------------------------------------------------------------------------

class TcpProxy:
    """A loopback TCP forwarder to the database server that a test can cut and restore.

    Cut: every open connection is dropped, and new ones are accepted and closed at once (the
    database "went away"). Restored: connections are forwarded again.
    """

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.up = True
        self.open: set[socket.socket] = set()
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            if not self.up:
                client.close()
                continue
            server = socket.create_connection(self.target)
            with self.lock:
                self.open |= {client, server}
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65_536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                self._close(end)

    def _close(self, end: socket.socket) -> None:
        with self.lock:
            self.open.discard(end)
        try:
            end.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        end.close()

    def cut(self) -> None:
        self.up = False
        with self.lock:
            ends = list(self.open)
        for end in ends:
            self._close(end)

    def restore(self) -> None:
        self.up = True

    def close(self) -> None:
        self.cut()
        self.listener.close()


@pytest.fixture
def proxied_client(settings: Settings, app: FastAPI) -> Iterator[tuple[TestClient, TcpProxy]]:
    """The service on the test database, reached through a TcpProxy (PostgreSQL only)."""
    if not ON_POSTGRES:
        pytest.skip("the outage tests need PostgreSQL (TEST_DATABASE_URL=postgresql+psycopg://...)")
    url = make_url(settings.database_url)
    proxy = TcpProxy(url.host or "127.0.0.1", url.port or 5432)
    proxied = url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    # CATALOG_MAX_AGE_S 0: every sizing request reads the catalog revision, so it needs the database
    # (with the default, one within 0.25 s of the last check would answer from memory through an outage).
    application = create_app(settings.model_copy(update={"database_url": proxied, "log_level": "critical",
                                                         "catalog_max_age_s": 0.0}))
    try:
        with TestClient(application, raise_server_exceptions=False) as client:
            yield client, proxy
    finally:
        proxy.close()
        application.state.engine.dispose()


def assert_unavailable(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.headers["retry-after"] == "5"
    assert "Traceback" not in response.text


def test_an_outage_is_503_and_the_service_recovers_by_itself(
        proxied_client: tuple[TestClient, TcpProxy]) -> None:
    client, proxy = proxied_client
    assert client.get("/readyz").status_code == 200
    assert client.post("/v1/kv-cache", json=KV).json()["total_bytes"] == KV_TOTAL_BYTES
    etag = client.get("/v1/gpus/h100-sxm").headers["etag"]

    proxy.cut()
    assert_unavailable(client.get("/readyz"))
    assert_unavailable(client.post("/v1/kv-cache", json=KV))
    assert_unavailable(client.get("/v1/gpus"))
    assert_unavailable(client.delete("/v1/gpus/h100-sxm", headers={**WRITE_HEADERS, "If-Match": etag}))
    assert client.get("/healthz").status_code == 200  # alive, not ready

    proxy.restore()  # no restart: the pool's pre-ping replaces the dead connections
    assert client.get("/readyz").status_code == 200
    assert client.post("/v1/kv-cache", json=KV).json()["total_bytes"] == KV_TOTAL_BYTES
    assert client.get("/v1/gpus/h100-sxm").headers["etag"] == etag  # the refused delete changed nothing


def test_a_write_cut_off_mid_transaction_is_not_applied(
        proxied_client: tuple[TestClient, TcpProxy], engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """The row's UPDATE has reached the server when the connection drops (before the catalog
    revision is bumped and before the commit): the server rolls it all back."""
    client, proxy = proxied_client
    before = client.get("/v1/gpus/h100-sxm").json()
    revision_before = revision(engine)
    real_bump = repository.bump_catalog_revision

    def cut_then_bump(session: Session) -> None:
        proxy.cut()
        real_bump(session)

    monkeypatch.setattr(repository, "bump_catalog_revision", cut_then_bump)
    response = client.put("/v1/gpus/h100-sxm", json={**writable(before), "name": "Half written"},
                          headers=WRITE_HEADERS)
    assert_unavailable(response)
    monkeypatch.setattr(repository, "bump_catalog_revision", real_bump)
    proxy.restore()
    assert client.get("/v1/gpus/h100-sxm").json() == before
    assert revision(engine) == revision_before


def test_a_write_that_fails_after_its_update_is_not_applied(client: TestClient, engine: Engine,
                                                            write_headers: dict[str, str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The row's UPDATE is flushed, then the service fails before the revision bump: a 500, and
    the transaction rolls back whole (the row and the revision are as before)."""
    before = client.get("/v1/gpus/h100-sxm").json()
    revision_before = revision(engine)

    def failing_bump(session: Session) -> None:
        raise RuntimeError("failure between the row and the revision")

    monkeypatch.setattr(repository, "bump_catalog_revision", failing_bump)
    response = client.put("/v1/gpus/h100-sxm", json={**writable(before), "name": "Half written"},
                          headers=write_headers)
    assert response.status_code == 500 and response.headers["content-type"] == "application/problem+json"
    monkeypatch.undo()
    assert client.get("/v1/gpus/h100-sxm").json() == before
    assert revision(engine) == revision_before
