"""/v1/quotes: saved plans that never change, idempotent creation, listing, and repricing.

Most quotes plan Llama-3.1-8B on one or two GPUs at TP1 with a light load, so each plan is quick.
Why one replica on one GPU is enough for them (worked by hand, at 100 % of HBM bandwidth, which is
an upper bound on speed, and comfortably inside it at any realistic efficiency):
  weights  = 8.03e9 parameters x 2 bytes (bf16) = 16.06e9 bytes (fits in 80 GB with room for KV);
  decode step at batch 1 reads the weights once: 16.06e9 / 3.35e12 B/s (H100 SXM) = 4.8 ms,
  so even at 50 % bandwidth a step is ~10 ms, far under the 100 ms TPOT target;
  the load is 1 request/s x 100 answer tokens = 100 tokens/s, a few sequences in flight.
Prices are the catalog's per GPU-hour (app/data/gpus.csv): H100 SXM $3.64, H200 SXM $4.59.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, delete
from sqlalchemy.orm import Session

from app.catalog.schemas import GpuIn, ModelArchitecture
from app.main import create_app
from app.quotes import service as quotes
from app.quotes.tables import QuoteRecord
from app.settings import Settings
from tests.conftest import OTHER_API_KEY, TEST_API_KEY

H100_PRICE_USD = 3.64
H200_PRICE_USD = 4.59

PLAN: dict[str, Any] = {
    "model": "llama-3.1-8b",
    "workload": {"input_tokens": 500, "output_tokens": 100, "requests_per_s": 1},
    "slo": {"ttft_ms": 2000, "tpot_ms": 100, "percentile": 95},
    "candidates": {"gpus": ["h100-sxm"], "tensor_parallel": [1]},
    "simulated_requests": 500,
}
TWO_GPUS = {**PLAN, "candidates": {"gpus": ["h100-sxm", "h200-sxm"], "tensor_parallel": [1]}}
# One decode step of Llama-3.1-8B reads at least its 16.06e9 weight bytes: >= 4.8 ms on an H100
# even at full bandwidth, so a 2 ms TPOT cannot be met by any plan.
IMPOSSIBLE = {**PLAN, "slo": {"ttft_ms": 2000, "tpot_ms": 2, "percentile": 95}}


@pytest.fixture
def client(client: TestClient, write_headers: dict[str, str]) -> TestClient:
    """Quotes are read with a key (quotes:read): this client sends the test key, which has every scope,
    on every request (tests of refusals remove it)."""
    client.headers.update(write_headers)
    return client


@pytest.fixture(autouse=True)
def no_quotes(engine: Engine) -> Iterator[None]:
    """Each test starts with an empty quote table (the catalog is reset by the `client` fixture)."""
    with Session(engine) as session, session.begin():
        session.execute(delete(QuoteRecord))
    yield


def _create(client: TestClient, write_headers: dict[str, str], body: dict[str, Any] = PLAN,
            key: str | None = None) -> Any:
    headers = {**write_headers, **({"Idempotency-Key": key} if key is not None else {})}
    return client.post("/v1/quotes", json=body, headers=headers)


def _canonical_sha256(document: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON: keys sorted, no spaces, UTF-8 (as documented)."""
    return hashlib.sha256(json.dumps(document, sort_keys=True, separators=(",", ":"),
                                     ensure_ascii=False).encode()).hexdigest()


def _gpu_body(client: TestClient, slug: str, **changes: Any) -> dict[str, Any]:
    """The PUT body that rewrites a catalog GPU with some fields changed."""
    current = client.get(f"/v1/gpus/{slug}").json()
    return {**{name: current[name] for name in GpuIn.model_fields}, **changes}


def _stored_rows(engine: Engine) -> int:
    with Session(engine) as session:
        return session.query(QuoteRecord).count()


# Creating and reading ------------------------------------------------------------------------

def test_create_stores_request_snapshot_and_result(client: TestClient, write_headers: dict[str, str]) -> None:
    created = _create(client, write_headers)
    assert created.status_code == 201
    quote = created.json()
    assert created.headers["location"] == f"/v1/quotes/{quote['id']}"
    assert created.headers["etag"].startswith('"')
    assert quote["calculation_version"] == "2026.12.07.7"
    assert quote["created_at"].endswith("Z")

    # The request as validated: the body's values plus every default, spelled out.
    request = quote["request"]
    assert request["model"] == "llama-3.1-8b" and request["model_spec"] is None
    assert request["candidates"]["gpus"] == ["h100-sxm"]
    assert request["candidates"]["pipeline_parallel"] is None  # default: the planner adds stages only where needed
    assert request["candidates"]["engine"] == "vllm"  # default
    assert request["ha_policy"] == {"extra_replicas": 0, "max_utilization_ratio": 1.0}  # defaults
    assert request["seed"] == 0 and request["speculative"] is None
    assert quote["request_sha256"] == _canonical_sha256(request)

    # The snapshot: exactly the catalog rows the plan read, with their versions.
    snapshot = quote["catalog_snapshot"]
    assert snapshot["gpus"] == {"h100-sxm": client.get("/v1/gpus/h100-sxm").json()}
    assert snapshot["models"] == {"llama-3.1-8b": client.get("/v1/models/llama-3.1-8b").json()}
    h100 = snapshot["gpus"]["h100-sxm"]
    # gpus.csv: the driver reports 81,559 MiB = 81,559 x 2^20 = 85,520,809,984 bytes; $3.64 per GPU-hour.
    assert (h100["version"], h100["memory_bytes"], h100["price_per_hour_usd"]) == (1, 85_520_809_984, 3.64)

    # The result: the plan, feasible on one H100 (see the module docstring).
    result = quote["result"]
    assert result["feasible"] is True
    cheapest = result["plans"][0]
    assert (cheapest["gpu"], cheapest["tensor_parallel"], cheapest["replicas"], cheapest["gpus"]) == (
        "h100-sxm", 1, 1, 1)
    assert cheapest["cost_per_hour_usd"] == pytest.approx(1 * H100_PRICE_USD)  # 1 GPU x $3.64


def test_the_result_is_what_slo_plan_answers_for_the_same_request(client: TestClient,
                                                                  write_headers: dict[str, str]) -> None:
    quote = _create(client, write_headers).json()
    plan = client.post("/v1/slo-plan", json=PLAN)
    assert plan.status_code == 200
    assert quote["result"] == plan.json()


def test_get_returns_the_stored_bytes_and_etag(client: TestClient, write_headers: dict[str, str]) -> None:
    created = _create(client, write_headers)
    read = client.get(created.headers["location"])
    assert read.status_code == 200
    assert read.content == created.content
    assert read.headers["etag"] == created.headers["etag"]
    again = client.get(created.headers["location"], headers={"If-None-Match": read.headers["etag"]})
    assert again.status_code == 304 and again.content == b""


def test_a_quote_never_changes_when_the_catalog_does(client: TestClient,
                                                     write_headers: dict[str, str]) -> None:
    created = _create(client, write_headers, TWO_GPUS)
    location = created.headers["location"]
    assert client.put("/v1/gpus/h100-sxm", json=_gpu_body(client, "h100-sxm", price_per_hour_usd=1.0),
                      headers=write_headers).status_code == 200
    model = client.get("/v1/models/llama-3.1-8b").json()
    assert client.delete("/v1/models/llama-3.1-8b", headers=write_headers).status_code == 204
    assert client.delete("/v1/gpus/h200-sxm", headers=write_headers).status_code == 204
    read = client.get(location)
    assert read.content == created.content and read.headers["etag"] == created.headers["etag"]
    # The snapshot still has the rows as they were when the quote was made.
    snapshot = read.json()["catalog_snapshot"]
    assert snapshot["gpus"]["h100-sxm"]["price_per_hour_usd"] == H100_PRICE_USD
    assert snapshot["models"]["llama-3.1-8b"] == model
    assert set(snapshot["gpus"]) == {"h100-sxm", "h200-sxm"}


def test_a_quote_survives_a_restart(client: TestClient, write_headers: dict[str, str],
                                    settings: Settings) -> None:
    created = _create(client, write_headers)
    restarted = create_app(settings)  # a new application with a new engine on the same database
    try:
        with TestClient(restarted) as other:
            read = other.get(created.headers["location"], headers=write_headers)
            assert read.status_code == 200
            assert read.content == created.content and read.headers["etag"] == created.headers["etag"]
    finally:
        restarted.state.engine.dispose()


def test_an_infeasible_plan_is_stored_too(client: TestClient, write_headers: dict[str, str]) -> None:
    created = _create(client, write_headers, IMPOSSIBLE)
    assert created.status_code == 201
    assert created.json()["result"]["feasible"] is False
    summary = client.get("/v1/quotes").json()["items"][0]
    assert (summary["feasible"], summary["cheapest_gpu"], summary["cheapest_cost_per_hour_usd"]) == (
        False, None, None)


def test_an_inline_model_has_no_model_row_in_the_snapshot(client: TestClient,
                                                          write_headers: dict[str, str]) -> None:
    row = client.get("/v1/models/llama-3.1-8b").json()
    architecture = {name: row[name] for name in ModelArchitecture.model_fields}
    body = {**{key: value for key, value in PLAN.items() if key != "model"}, "model_spec": architecture}
    quote = _create(client, write_headers, body).json()
    assert quote["catalog_snapshot"]["models"] == {}
    assert set(quote["catalog_snapshot"]["gpus"]) == {"h100-sxm"}
    assert client.get("/v1/quotes").json()["items"][0]["model"] is None


def test_default_candidates_snapshot_every_catalog_gpu(client: TestClient,
                                                       write_headers: dict[str, str]) -> None:
    # No candidate list and an SLO no plan can meet: the plan screens every catalog GPU out quickly.
    body = {key: value for key, value in IMPOSSIBLE.items() if key != "candidates"}
    quote = _create(client, write_headers, body).json()
    assert len(quote["catalog_snapshot"]["gpus"]) == 34  # the reference catalog's 34 accelerators
    # gpus.csv: the B200 driver reports 183,359 MiB = 183,359 x 2^20 = 192,265,846,784 bytes.
    assert quote["catalog_snapshot"]["gpus"]["b200"]["memory_bytes"] == 192_265_846_784


# Errors --------------------------------------------------------------------------------------

def test_creating_needs_a_write_key(client: TestClient, engine: Engine) -> None:
    del client.headers["Authorization"]
    response = client.post("/v1/quotes", json=PLAN)
    assert response.status_code == 401
    assert response.headers["content-type"] == "application/problem+json"
    assert _stored_rows(engine) == 0


def test_unknown_gpu_is_a_404_and_stores_nothing(client: TestClient, write_headers: dict[str, str],
                                                 engine: Engine) -> None:
    body = {**PLAN, "candidates": {"gpus": ["h900"], "tensor_parallel": [1]}}
    response = _create(client, write_headers, body)
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/problem+json"
    assert _stored_rows(engine) == 0


def test_invalid_request_is_a_422_and_stores_nothing(client: TestClient, write_headers: dict[str, str],
                                                     engine: Engine) -> None:
    body = {**PLAN, "workload": {**PLAN["workload"], "concurrent_users": 10}}  # both rate and users
    response = _create(client, write_headers, body)
    assert response.status_code == 422
    assert response.json()["errors"][0]["pointer"].startswith("/body/workload")
    assert _stored_rows(engine) == 0


@pytest.mark.parametrize("path", [
    "/v1/quotes/not-a-uuid",
    "/v1/quotes/0B7C9D6E-3F4A-4E2B-9C1D-5A6B7C8D9E0F",  # upper case: not the canonical form
    "/v1/quotes/0b7c9d6e3f4a4e2b9c1d5a6b7c8d9e0f",  # no hyphens
])
def test_a_malformed_id_is_a_422_naming_the_path(client: TestClient, path: str) -> None:
    for response in (client.get(path), client.post(f"{path}/reprice")):
        assert response.status_code == 422
        assert response.json()["errors"][0]["pointer"] == "/path/quote_id"


def test_an_unknown_id_is_a_404(client: TestClient) -> None:
    unknown = "/v1/quotes/0b7c9d6e-3f4a-4e2b-9c1d-5a6b7c8d9e0f"
    for response in (client.get(unknown), client.post(f"{unknown}/reprice")):
        assert response.status_code == 404
        assert response.headers["content-type"] == "application/problem+json"


def test_an_unknown_calibration_profile_is_a_404_naming_the_field(client: TestClient, write_headers: dict[str, str],
                                                                  engine: Engine) -> None:
    response = _create(client, write_headers, {**PLAN, "calibration": "nope"})
    assert response.status_code == 404, response.text
    assert [error["pointer"] for error in response.json()["errors"]] == ["/body/calibration"]
    assert _stored_rows(engine) == 0


# Idempotency ---------------------------------------------------------------------------------

def test_a_retry_with_the_same_key_returns_the_stored_quote(client: TestClient, write_headers: dict[str, str],
                                                            engine: Engine) -> None:
    first = _create(client, write_headers, key="order-42")
    retry = _create(client, write_headers, key="order-42")
    assert (first.status_code, retry.status_code) == (201, 200)
    assert retry.content == first.content and retry.headers["etag"] == first.headers["etag"]
    assert "location" not in retry.headers
    assert _stored_rows(engine) == 1


def test_the_same_request_spelled_differently_is_the_same_body(client: TestClient,
                                                              write_headers: dict[str, str]) -> None:
    """Defaults written out, keys reordered: the validated request is the same, so is its hash."""
    first = _create(client, write_headers, key="order-43")
    spelled_out = {"simulated_requests": 500, "seed": 0, "speculative": None, "calibration": None,
                   **PLAN, "candidates": {**PLAN["candidates"], "pipeline_parallel": None, "engine": "vllm"}}
    retry = _create(client, write_headers, spelled_out, key="order-43")
    assert retry.status_code == 200 and retry.json()["id"] == first.json()["id"]


def test_a_retry_after_an_upgrade_that_added_a_default_field_returns_the_stored_quote(
        client: TestClient, write_headers: dict[str, str], engine: Engine) -> None:
    """A quote stored before `workload.think_time_s` existed: its request document has no such field and its
    digest is that document's. The same body retried with its key today validates with the field at its default
    (another document, another digest), and is still the same request: the stored quote (200), nothing new stored.
    A body that differs (another seed) is still a 422."""
    first = _create(client, write_headers, key="order-45")
    with Session(engine) as session, session.begin():
        record = session.get(QuoteRecord, first.json()["id"])
        before = json.loads(json.dumps(record.request))
        del before["workload"]["think_time_s"]
        record.request, record.request_sha256 = before, _canonical_sha256(before)
    retry = _create(client, write_headers, key="order-45")
    assert retry.status_code == 200 and retry.json()["id"] == first.json()["id"]
    assert retry.json()["request_sha256"] == _canonical_sha256(before)
    assert _create(client, write_headers, {**PLAN, "seed": 7}, key="order-45").status_code == 422
    assert _stored_rows(engine) == 1


def test_the_same_key_with_another_body_is_a_422_naming_the_header(client: TestClient,
                                                                   write_headers: dict[str, str],
                                                                   engine: Engine) -> None:
    first = _create(client, write_headers, key="order-44")
    other = _create(client, write_headers, {**PLAN, "seed": 7}, key="order-44")
    assert other.status_code == 422
    assert other.headers["content-type"] == "application/problem+json"
    assert other.json()["errors"] == [{"pointer": "/header/idempotency-key",
                                       "detail": "already used with another request body"}]
    assert _stored_rows(engine) == 1
    assert client.get(first.headers["location"]).content == first.content


def test_an_idempotency_key_is_one_api_keys(client: TestClient, write_headers: dict[str, str],
                                            engine: Engine) -> None:
    """Another API key sending the same Idempotency-Key with the same body was answered with the first key's
    stored quote (its id, creator, time and result, whether or not it may read quotes), and with another body
    a 422 telling it the key was taken. Each API key's Idempotency-Keys are its own: the second key gets a quote
    of its own, and its own retry finds that one."""
    other = {"Authorization": f"Bearer {OTHER_API_KEY}"}
    first = _create(client, write_headers, key="order-45")
    theirs = _create(client, other, key="order-45")
    assert (first.status_code, theirs.status_code) == (201, 201)
    assert theirs.json()["id"] != first.json()["id"]
    # Both test keys are bare secrets, each named from its own SHA-256.
    assert (first.json()["created_by"], theirs.json()["created_by"]) == (
        "key-" + hashlib.sha256(TEST_API_KEY.encode()).hexdigest()[:12],
        "key-" + hashlib.sha256(OTHER_API_KEY.encode()).hexdigest()[:12])
    assert _create(client, other, {**PLAN, "seed": 7}, key="order-46").status_code == 201
    retry = _create(client, other, key="order-45")
    assert retry.status_code == 200 and retry.json()["id"] == theirs.json()["id"]
    assert _stored_rows(engine) == 3


def test_without_a_key_every_post_is_a_new_quote(client: TestClient, write_headers: dict[str, str]) -> None:
    first, second = _create(client, write_headers), _create(client, write_headers)
    assert first.status_code == second.status_code == 201
    assert first.json()["id"] != second.json()["id"]
    assert first.json()["result"] == second.json()["result"]  # same request, same answer


@pytest.mark.parametrize("key", [
    "",  # empty
    "   ",  # spaces only
    "k" * 256,  # one character too long
    "tab\tinside",  # a control character
    "caf\u00e9",  # not ASCII
])
def test_a_bad_idempotency_key_is_a_422(client: TestClient, write_headers: dict[str, str], engine: Engine,
                                        key: str) -> None:
    headers = [*write_headers.items(), ("Idempotency-Key", key.encode("latin-1"))]
    response = client.post("/v1/quotes", json=PLAN, headers=headers)
    assert response.status_code == 422
    assert response.json()["errors"][0]["pointer"] == "/header/idempotency-key"
    assert _stored_rows(engine) == 0


def test_the_longest_key_is_accepted(client: TestClient, write_headers: dict[str, str]) -> None:
    assert _create(client, write_headers, key="~" * 255).status_code == 201


# Listing -------------------------------------------------------------------------------------

def test_list_is_newest_first_with_summaries(client: TestClient, write_headers: dict[str, str]) -> None:
    ids = [_create(client, write_headers, body).json()["id"] for body in (PLAN, IMPOSSIBLE, TWO_GPUS)]
    page = client.get("/v1/quotes").json()
    assert (page["total"], page["limit"], page["offset"]) == (3, 50, 0)
    assert [item["id"] for item in page["items"]] == ids[::-1]
    newest = page["items"][0]
    # Both GPUs fit the model on one GPU; the cheaper per hour wins: H100 $3.64 < H200 $4.59.
    assert newest == {**newest, "model": "llama-3.1-8b", "feasible": True, "cheapest_gpu": "h100-sxm",
                      "calculation_version": "2026.12.07.7"}
    assert newest["cheapest_cost_per_hour_usd"] == pytest.approx(H100_PRICE_USD)
    assert page["items"][1]["feasible"] is False

    second_page = client.get("/v1/quotes", params={"limit": 2, "offset": 1}).json()
    assert [item["id"] for item in second_page["items"]] == [ids[1], ids[0]]
    assert client.get("/v1/quotes", params={"offset": 3}).json()["items"] == []


@pytest.mark.parametrize("params", [{"limit": 0}, {"limit": 201}, {"offset": -1}])
def test_list_bounds(client: TestClient, params: dict[str, int]) -> None:
    response = client.get("/v1/quotes", params=params)
    assert response.status_code == 422
    assert response.json()["errors"][0]["pointer"] == f"/query/{next(iter(params))}"


# Repricing -----------------------------------------------------------------------------------

def test_reprice_with_nothing_changed_has_no_differences(client: TestClient,
                                                         write_headers: dict[str, str]) -> None:
    quote = _create(client, write_headers).json()
    repriced = client.post(f"/v1/quotes/{quote['id']}/reprice")
    assert repriced.status_code == 200
    body = repriced.json()
    assert body["quote_id"] == quote["id"]
    assert body["differences"] == []
    assert body["repriced"] == quote["result"]  # same request, same catalog, same answer
    assert body["original"]["cheapest_gpu"] == "h100-sxm"


def test_reprice_after_a_price_change(client: TestClient, write_headers: dict[str, str],
                                      engine: Engine) -> None:
    quote = _create(client, write_headers).json()
    client.put("/v1/gpus/h100-sxm", json=_gpu_body(client, "h100-sxm", price_per_hour_usd=2.5),
               headers=write_headers)
    body = client.post(f"/v1/quotes/{quote['id']}/reprice").json()
    # One replica of one GPU either way (see the module docstring): $/hour = 1 x price per GPU-hour.
    # The PUT also made the reference row a user row (origin), in the same write (version 1 -> 2).
    assert body["differences"] == [
        {"kind": "catalog", "subject": "gpu h100-sxm", "field": "origin", "change": "changed",
         "before": "reference", "after": "user",
         "detail": "gpu h100-sxm origin: 'reference' -> 'user' (version 1 -> 2)"},
        {"kind": "catalog", "subject": "gpu h100-sxm", "field": "price_per_hour_usd", "change": "changed",
         "before": 3.64, "after": 2.5,
         "detail": "gpu h100-sxm price_per_hour_usd: 3.64 -> 2.5 (version 1 -> 2)"},
        {"kind": "outcome", "subject": "cheapest plan", "field": "cost_per_hour_usd", "change": "changed",
         "before": 3.64, "after": 2.5, "detail": "cheapest plan cost_per_hour_usd: 3.64 -> 2.5"},
    ]
    assert body["original"]["cheapest_cost_per_hour_usd"] == pytest.approx(H100_PRICE_USD)
    assert body["repriced"]["plans"][0]["cost_per_hour_usd"] == pytest.approx(2.5)
    assert _stored_rows(engine) == 1  # a reprice stores nothing


def test_reprice_after_the_cheapest_gpu_is_deleted(client: TestClient, write_headers: dict[str, str]) -> None:
    quote = _create(client, write_headers, TWO_GPUS).json()
    assert quote["result"]["plans"][0]["gpu"] == "h100-sxm"  # $3.64 < $4.59, one GPU each
    client.delete("/v1/gpus/h100-sxm", headers=write_headers)
    body = client.post(f"/v1/quotes/{quote['id']}/reprice").json()
    assert [plan["gpu"] for plan in body["repriced"]["plans"]] == ["h200-sxm"]
    assert body["differences"] == [
        {"kind": "catalog", "subject": "gpu h100-sxm", "field": None, "change": "deleted", "before": 1,
         "after": None,
         "detail": "gpu h100-sxm (version 1) was deleted from the catalog since; "
                   "the reprice plans without it"},
        {"kind": "outcome", "subject": "cheapest plan", "field": "gpu", "change": "changed",
         "before": "h100-sxm", "after": "h200-sxm", "detail": "cheapest plan gpu: 'h100-sxm' -> 'h200-sxm'"},
        {"kind": "outcome", "subject": "cheapest plan", "field": "cost_per_hour_usd", "change": "changed",
         "before": 3.64, "after": 4.59, "detail": "cheapest plan cost_per_hour_usd: 3.64 -> 4.59"},
    ]


def test_a_gpu_deleted_while_the_reprice_plans_is_left_out_as_one_deleted_before(
        client: TestClient, write_headers: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """h100-sxm is deleted after the reprice left out the GPUs deleted before it and before its plan reads
    them: the plan's 404 under a catalog revision that moved is another attempt, which leaves h100-sxm out
    (was: a 404 for a quote that exists)."""
    quote = _create(client, write_headers, TWO_GPUS).json()
    real_plan = quotes.planning.plan_slo
    deletes: list[int] = []

    def delete_then_plan(*args: Any, **kwargs: Any) -> Any:
        if not deletes:
            deletes.append(client.delete("/v1/gpus/h100-sxm", headers=write_headers).status_code)
        return real_plan(*args, **kwargs)

    monkeypatch.setattr(quotes.planning, "plan_slo", delete_then_plan)
    response = client.post(f"/v1/quotes/{quote['id']}/reprice")
    assert deletes == [204]
    assert response.status_code == 200, response.text
    assert [plan["gpu"] for plan in response.json()["repriced"]["plans"]] == ["h200-sxm"]


def test_reprice_when_every_candidate_gpu_is_gone_is_a_409(client: TestClient,
                                                           write_headers: dict[str, str]) -> None:
    quote = _create(client, write_headers).json()
    client.delete("/v1/gpus/h100-sxm", headers=write_headers)
    response = client.post(f"/v1/quotes/{quote['id']}/reprice")
    assert response.status_code == 409
    assert "deleted" in response.json()["detail"]


SPECULATIVE = {"draft_model": "llama-3.2-1b", "acceptance_rate": 0.7, "draft_tokens": 4}


@pytest.mark.parametrize(("deleted", "extra"), [("llama-3.1-8b", {}), ("llama-3.2-1b", {"speculative": SPECULATIVE})])
def test_reprice_after_a_model_is_deleted_uses_its_stored_row(client: TestClient, write_headers: dict[str, str],
                                                               deleted: str, extra: dict[str, Any]) -> None:
    """The planned model, or the speculative draft model (that was a 409), deleted since: the reprice plans from
    the quote's copy of its row and lists the deletion. Same architecture, same GPU, same price: the same plan,
    named as quoted (its slug, and its Hugging Face id in the launch command, from the quote's copy of the row:
    not "model_spec (inline)" and a placeholder path)."""
    created = _create(client, write_headers, {**PLAN, **extra})
    assert created.status_code == 201, created.text
    quote = created.json()
    assert deleted in quote["catalog_snapshot"]["models"]
    assert client.delete(f"/v1/models/{deleted}", headers=write_headers).status_code == 204
    response = client.post(f"/v1/quotes/{quote['id']}/reprice")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["differences"] == [
        {"kind": "catalog", "subject": f"model {deleted}", "field": None, "change": "deleted", "before": 1,
         "after": None, "detail": f"model {deleted} (version 1) was deleted from the catalog since; "
                                  "the reprice plans with the architecture stored in the quote"},
    ]
    before, after = quote["result"]["plans"][0], body["repriced"]["plans"][0]
    for field in ("gpu", "replicas", "cost_per_hour_usd", "predicted", "launch"):
        assert after[field] == before[field]
    assert body["repriced"]["model"] == body["original"]["model"] == "llama-3.1-8b"


def test_reprice_after_the_snapshot_gpu_was_rewritten_unchanged(client: TestClient,
                                                                write_headers: dict[str, str]) -> None:
    quote = _create(client, write_headers).json()
    client.put("/v1/gpus/h100-sxm", json=_gpu_body(client, "h100-sxm"), headers=write_headers)
    body = client.post(f"/v1/quotes/{quote['id']}/reprice").json()
    # A PUT without a change is still a write (origin becomes 'user', version 2).
    assert [(d["subject"], d["field"], d["before"], d["after"]) for d in body["differences"]] == [
        ("gpu h100-sxm", "origin", "reference", "user")]
