"""Who may call what: every route of the OpenAPI description against every API-key scope.

The table below is the decision for each route. A route the application serves but the table does
not list fails the first test, so no route ships without someone deciding who may call it.

- "public": operations endpoints, never behind a key.
- "catalog:read" / "sizing:read": open by default; with OPEN_READS=false they need that scope.
- any other scope: always needs a key with that scope (401 without a known key, 403 without the scope).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import SCOPES, Settings

PUBLIC = "public"
OPEN_READS = ("catalog:read", "sizing:read")

ACCESS: dict[tuple[str, str], str] = {
    ("GET", "/healthz"): PUBLIC,
    ("GET", "/readyz"): PUBLIC,
    ("GET", "/metrics"): PUBLIC,
    ("GET", "/v1/gpus"): "catalog:read",
    ("GET", "/v1/gpus/{slug}"): "catalog:read",
    ("PUT", "/v1/gpus/{slug}"): "catalog:write",
    ("DELETE", "/v1/gpus/{slug}"): "catalog:write",
    ("GET", "/v1/models"): "catalog:read",
    ("GET", "/v1/models/{slug}"): "catalog:read",
    ("PUT", "/v1/models/{slug}"): "catalog:write",
    ("DELETE", "/v1/models/{slug}"): "catalog:write",
    ("POST", "/v1/models/import"): "catalog:write",  # storing; a dry run is a catalog read (tested below)
    ("GET", "/v1/calibrations"): "catalog:read",
    ("GET", "/v1/calibrations/{name}"): "catalog:read",
    ("POST", "/v1/calibrations"): "calibrations:write",
    ("POST", "/v1/validate"): "sizing:read",
    ("POST", "/v1/kv-cache"): "sizing:read",
    ("POST", "/v1/roofline"): "sizing:read",
    ("POST", "/v1/roofline/batch-sweep"): "sizing:read",
    ("POST", "/v1/capacity"): "sizing:read",
    ("POST", "/v1/slo-plan"): "sizing:read",
    ("GET", "/v1/roofline/chart"): "sizing:read",
    ("POST", "/v1/roofline/chart"): "sizing:read",
    ("GET", "/v1/roofline/batch-sweep/chart"): "sizing:read",
    ("POST", "/v1/roofline/batch-sweep/chart"): "sizing:read",
    ("GET", "/v1/slo-plan/chart"): "sizing:read",
    ("POST", "/v1/slo-plan/chart"): "sizing:read",
    ("POST", "/v1/quotes"): "quotes:write",
    ("GET", "/v1/quotes"): "quotes:read",
    ("GET", "/v1/quotes/{quote_id}"): "quotes:read",
    ("POST", "/v1/quotes/{quote_id}/reprice"): "quotes:read",
    ("POST", "/v1/quotes/{quote_id}/reproduce"): "quotes:read",
}

# Path parameters that name nothing stored: a request that passes the key check ends in a 404 or
# 422 and changes nothing (a DELETE with the right scope deletes no row).
PATH_VALUES = {"slug": "no-such-row", "quote_id": "0b7c9d6e-3f4a-4e2b-9c1d-5a6b7c8d9e0f", "name": "no-such-profile"}
# Query parameters a route needs to reach its write (the import stores only with dry_run=false).
QUERY = {("POST", "/v1/models/import"): {"dry_run": "false", "slug": "no-such-row"}}


def secret(scope: str) -> str:
    return "secret-for-" + scope.replace(":", "-") + "-0123456789"


def key_name(scope: str) -> str:
    return "only-" + scope.replace(":", "-")


# One key per scope, each holding that scope alone.
KEYS = ",".join(f"{key_name(scope)}:{secret(scope)}:{scope}" for scope in SCOPES)


@pytest.fixture
def clients(settings: Settings, app: FastAPI, fresh_catalog: None) -> Iterator[dict[bool, TestClient]]:
    """Clients of two applications on the test database: reads open (the default) and closed."""
    built = {open_reads: create_app(settings.model_copy(update={
        "api_keys": Settings(api_keys=KEYS).api_keys, "open_reads": open_reads})) for open_reads in (True, False)}
    with TestClient(built[True], raise_server_exceptions=False) as opened, \
            TestClient(built[False], raise_server_exceptions=False) as closed:
        yield {True: opened, False: closed}
    for application in built.values():
        application.state.engine.dispose()


def call(client: TestClient, method: str, path: str, scope: str | None, body: bytes = b"{}") -> Any:
    url = path.format(**PATH_VALUES)
    headers = {"content-type": "application/json",
               **({} if scope is None else {"Authorization": f"Bearer {secret(scope)}"})}
    return client.request(method, url, params=QUERY.get((method, path)), content=body, headers=headers)


def test_every_route_has_an_access_decision(app: FastAPI) -> None:
    served = {(method.upper(), path) for path, operations in app.openapi()["paths"].items() for method in operations}
    assert served - ACCESS.keys() == set(), "decide who may call these routes (add them to ACCESS)"
    assert ACCESS.keys() - served == set(), "these routes are gone; remove them from ACCESS"


# A body that is JSON, and one that is not JSON at all (FastAPI decodes a JSON body before it checks any key:
# that was a 422 where a key was missing).
BODIES = {"json": b"{}", "not-json": b"{"}


@pytest.mark.parametrize("body", sorted(BODIES))
@pytest.mark.parametrize("open_reads", [True, False], ids=["reads-open", "reads-closed"])
@pytest.mark.parametrize(("method", "path"), sorted(ACCESS))
def test_route_against_every_scope(clients: dict[bool, TestClient], open_reads: bool, method: str,
                                   path: str, body: str) -> None:
    """Without a key: 401 where a key is needed. With a key holding one scope: 403 unless it is the
    route's scope. A request let through is answered by the route (404/422 here), never 401/403. The body
    is not looked at before the key: the same answers when it is not even JSON."""
    needed = ACCESS[(method, path)]
    client = clients[open_reads]
    protected = needed != PUBLIC and not (open_reads and needed in OPEN_READS)
    anonymous = call(client, method, path, None, BODIES[body])
    if protected:
        assert anonymous.status_code == 401, anonymous.text
        assert anonymous.headers["content-type"] == "application/problem+json"
    else:
        assert anonymous.status_code not in (401, 403), anonymous.text
    for scope in SCOPES:
        response = call(client, method, path, scope, BODIES[body])
        if protected and scope != needed:
            assert response.status_code == 403, (scope, response.text)
            assert needed in response.json()["detail"] and secret(scope) not in response.text
        else:
            assert response.status_code not in (401, 403), (scope, response.text)


def test_a_dry_run_import_is_a_catalog_read(clients: dict[bool, TestClient]) -> None:
    body = ["not", "a", "config"]  # a 422 once past the key check
    assert clients[True].post("/v1/models/import?slug=x", json=body).status_code == 422
    assert clients[False].post("/v1/models/import?slug=x", json=body).status_code == 401
    reader = {"Authorization": f"Bearer {secret('catalog:read')}"}
    assert clients[False].post("/v1/models/import?slug=x", json=body, headers=reader).status_code == 422


def test_quotes_need_a_key_and_catalog_reads_do_not(client: TestClient, write_headers: dict[str, str]) -> None:
    """The default application: quote list, read and reprice are 401 without a key, while catalog and
    sizing reads still answer."""
    created = client.post("/v1/quotes", headers=write_headers, json={
        "model": "llama-3.1-8b", "workload": {"input_tokens": 500, "output_tokens": 100, "requests_per_s": 1},
        "slo": {"ttft_ms": 2000, "tpot_ms": 100}, "candidates": {"gpus": ["h100-sxm"], "tensor_parallel": [1]},
        "simulated_requests": 500})
    assert created.status_code == 201, created.text
    location = created.headers["location"]
    for response in (client.get("/v1/quotes"), client.get(location), client.post(f"{location}/reprice")):
        assert response.status_code == 401
        assert "llama" not in response.text  # nothing of the quote's content
    assert client.get("/v1/gpus/h100-sxm").status_code == 200
    assert client.get("/v1/models").status_code == 200
    assert client.post("/v1/kv-cache", json={"model": "llama-3-70b", "context_tokens": 8192}).status_code == 200
    assert client.get(location, headers=write_headers).status_code == 200


# Key configuration ---------------------------------------------------------------------------

def test_named_keys_with_scopes_and_the_older_bare_form() -> None:
    """A bare key is named `key-` + the first 12 hex digits of its secret's SHA-256 (worked here with hashlib)."""
    settings = Settings(api_keys="sales:sales-secret-0123456789:quotes:read+quotes:write,"
                                 "bare-secret-0123456789abcdef,ops:ops-secret-0123456789ab:*")
    keys = {key.name: key for key in settings.api_keys}
    bare = "key-" + hashlib.sha256(b"bare-secret-0123456789abcdef").hexdigest()[:12]
    assert set(keys) == {"sales", bare, "ops"}
    assert keys["sales"].scopes == {"quotes:read", "quotes:write"}
    assert keys["sales"].secret.get_secret_value() == "sales-secret-0123456789"
    assert keys[bare].scopes == keys["ops"].scopes == set(SCOPES)
    assert "sales-secret" not in repr(settings)


def test_a_bare_keys_name_survives_the_rotation_of_another() -> None:
    """Bare keys were named by position: removing the first renamed the second `key-1`, which then owned the
    first's quotes and Idempotency-Keys. Its name now stays the same whatever keys come before it."""
    old, new = "old-bare-secret-0123456789", "new-bare-secret-0123456789"
    before = [key.name for key in Settings(api_keys=f"{old},{new}").api_keys]
    after = [key.name for key in Settings(api_keys=new).api_keys]
    assert after == before[1:]
    assert before[0] != before[1]


@pytest.mark.parametrize(("value", "complaint"), [
    ("sales:sales-secret-0123456789:quotes:readd", "scopes must be"),
    ("sales:sales-secret-0123456789:", "scopes must be"),
    ("Sales!:sales-secret-0123456789:*", "the name must be"),
    ("sales:short:*", "16-256 characters"),
    ("a:a-secret-0123456789abc:*,a:another-secret-0123456789:*", "unique"),
    ("sales:sales-secret-0123456789", "name:secret:scope1+scope2"),
    # One secret under two names: which key (and scopes) a request had would depend on the match order.
    ("wide:shared-secret-0123456789:*,narrow:shared-secret-0123456789:quotes:read",
     "wide and narrow share one"),
    # A bare secret listed twice: said as such, not as two keys of one (derived) name.
    ("bare-secret-0123456789abcdef,bare-secret-0123456789abcdef", "must have different secrets"),
])
def test_bad_key_entries_stop_the_service_without_echoing_secrets(value: str, complaint: str) -> None:
    with pytest.raises(ValueError) as error:
        Settings(api_keys=value)
    assert complaint in str(error.value)
    assert "secret-0123456789" not in str(error.value)


# Who wrote what ------------------------------------------------------------------------------

def test_writes_record_the_key_name_and_never_the_secret(clients: dict[bool, TestClient]) -> None:
    """A GPU row, a quote and their list pages name the key that wrote them, next to when."""
    client = clients[True]
    writer = {"Authorization": f"Bearer {secret('catalog:write')}"}
    row = client.get("/v1/gpus/a10").json()
    assert row["written_by"] is None  # reference data
    body = {key: value for key, value in row.items()
            if key not in ("slug", "origin", "version", "created_at", "updated_at", "written_by")}
    stored = client.put("/v1/gpus/a10", json={**body, "tdp_w": 151.0}, headers=writer)
    assert stored.status_code == 200, stored.text
    assert stored.json()["written_by"] == "only-catalog-write" and stored.json()["updated_at"]
    assert client.get("/v1/gpus/a10").json()["written_by"] == "only-catalog-write"
    assert secret("catalog:write") not in stored.text

    quote = client.post("/v1/quotes", headers={"Authorization": f"Bearer {secret('quotes:write')}"}, json={
        "model": "llama-3.1-8b", "workload": {"input_tokens": 500, "output_tokens": 100, "requests_per_s": 1},
        "slo": {"ttft_ms": 2000, "tpot_ms": 100}, "candidates": {"gpus": ["h100-sxm"], "tensor_parallel": [1]},
        "simulated_requests": 500})
    assert quote.status_code == 201, quote.text
    assert quote.json()["created_by"] == "only-quotes-write" and quote.json()["created_at"]
    reader = {"Authorization": f"Bearer {secret('quotes:read')}"}
    page = client.get("/v1/quotes", headers=reader).json()
    assert {item["id"]: item["created_by"] for item in page["items"]}[quote.json()["id"]] == "only-quotes-write"
