"""Abuse limits: body size, numeric bounds, malformed and oversized JSON, search-space and
simulation bounds, the request timeout and the per-process request slots.

Every refusal is an RFC 9457 problem (413, 422 or 503), never a 500 and never a hang.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import ValidationError
from sqlalchemy import Engine, delete, func, select
from sqlalchemy.exc import DataError
from sqlalchemy.orm import Session

from app.calibration import service as calibration
from app.catalog import service as catalog_service
from app.catalog.repository import catalog_revision
from app.catalog.schemas import GPU_SPEC_EXAMPLE
from app.errors import MAX_LISTED_ERRORS
from app.estimates import service as estimates
from app.main import MAX_BODY_BYTES, create_app
from app.planning import service as planning
from app.quotes.tables import QuoteRecord
from app.settings import Settings
from tests.api.problems import assert_problem
from tests.api.test_calibrations import SAMPLE_ROWS

KV = {"model": "llama-3-70b", "context_tokens": 8192}
JSON_HEADERS = {"Content-Type": "application/json"}
# A small plan, for the bounds of /v1/slo-plan.
PLAN = {"model": "llama-3.1-8b",
        "workload": {"input_tokens": 1000, "output_tokens": 200, "requests_per_s": 2},
        "slo": {"ttft_ms": 1000, "tpot_ms": 50}}


def padded(body: dict[str, Any], size: int) -> bytes:
    """`body` as JSON followed by spaces (still valid JSON), exactly `size` bytes long."""
    raw = json.dumps(body).encode()
    assert len(raw) <= size
    return raw + b" " * (size - len(raw))


# Body size ------------------------------------------------------------------------------------

def test_the_body_limit_is_one_mebibyte_exactly(client: TestClient) -> None:
    """1 MiB = 2**20 = 1,048,576 bytes is accepted; one byte more is a 413."""
    assert MAX_BODY_BYTES == 1_048_576
    accepted = client.post("/v1/kv-cache", content=padded(KV, 1_048_576), headers=JSON_HEADERS)
    assert accepted.status_code == 200, accepted.text
    problem = assert_problem(client.post("/v1/kv-cache", content=padded(KV, 1_048_577), headers=JSON_HEADERS), 413)
    assert "1 MiB" in problem["detail"]


def test_an_oversize_streamed_body_is_413(client: TestClient) -> None:
    """Chunked transfer: no Content-Length to check, so the bytes are counted as they arrive."""
    big = padded(KV, 3 * MAX_BODY_BYTES)

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(big), 65_536):
            yield big[start:start + 65_536]

    response = client.post("/v1/kv-cache", content=chunks(), headers=JSON_HEADERS)
    assert "content-length" not in response.request.headers
    assert_problem(response, 413)


def test_a_content_length_that_understates_the_body_is_413(client: TestClient) -> None:
    """The header claims 100 bytes; 2 MiB arrive. The count of received bytes decides."""
    response = client.post("/v1/kv-cache", content=padded(KV, 2 * MAX_BODY_BYTES),
                           headers={**JSON_HEADERS, "Content-Length": "100"})
    assert response.request.headers["content-length"] == "100"
    assert_problem(response, 413)


def test_a_content_length_over_the_limit_is_refused_before_reading(client: TestClient) -> None:
    """A declared 2 GiB body is refused from the header alone (a 44-byte body is all that is sent)."""
    response = client.post("/v1/kv-cache", content=json.dumps(KV).encode(),
                           headers={**JSON_HEADERS, "Content-Length": str(2**31)})
    assert_problem(response, 413)


# Numeric bounds --------------------------------------------------------------------------------

def test_the_largest_context_and_batch_are_answered_exactly(client: TestClient) -> None:
    """context 10,000,000 tokens x batch 1,000,000, Llama-3-70B in bf16 (80 layers, 8 KV heads,
    head_dim 128; meta-llama/Meta-Llama-3-70B config.json):
    K and V per token = 2 x 80 x 8 x 128 x 2 bytes = 327,680 bytes;
    per sequence = 327,680 x 10,000,000 = 3,276,800,000,000 bytes;
    batch = x 1,000,000 = 3,276,800,000,000,000,000 bytes (above 2**53: exact integers, no floats)."""
    response = client.post("/v1/kv-cache", json={**KV, "context_tokens": 10_000_000, "batch_size": 1_000_000})
    assert response.status_code == 200, response.text
    assert response.json()["bytes_per_sequence"] == 3_276_800_000_000
    assert response.json()["total_bytes"] == 3_276_800_000_000_000_000


@pytest.mark.parametrize(("raw_value", "pointer"), [
    ("10000001", "/body/context_tokens"),  # one token above 10 M
    ("1000000000000000000000000000000", "/body/context_tokens"),  # 10**30
    ("1e400", "/body/context_tokens"),  # overflows a double
    ("NaN", "/body/context_tokens"),
    ("Infinity", "/body/context_tokens"),
    ("-Infinity", "/body/context_tokens"),
    ("8192.0", "/body/context_tokens"),  # a float for an integer: no coercion
    ('"8192"', "/body/context_tokens"),  # a string for an integer: no coercion
    ("0", "/body/context_tokens"),
])
def test_out_of_range_and_non_finite_context_is_422(client: TestClient, raw_value: str, pointer: str) -> None:
    raw = '{"model": "llama-3-70b", "context_tokens": ' + raw_value + "}"
    assert_problem(client.post("/v1/kv-cache", content=raw, headers=JSON_HEADERS), 422, pointer)


def test_a_batch_above_one_million_is_422(client: TestClient) -> None:
    assert_problem(client.post("/v1/kv-cache", json={**KV, "batch_size": 1_000_001}), 422, "/body/batch_size")


@pytest.mark.parametrize("raw_value", ["NaN", "Infinity", "1e400", "-1"])
def test_non_finite_or_negative_rates_are_422(client: TestClient, raw_value: str) -> None:
    body = json.dumps(PLAN).replace('"requests_per_s": 2', '"requests_per_s": ' + raw_value)
    assert raw_value in body
    assert_problem(client.post("/v1/slo-plan", content=body, headers=JSON_HEADERS), 422,
                   "/body/workload/requests_per_s")


@pytest.mark.parametrize("ratio", [1e-300, 0.009, 0.0])
def test_a_load_cap_below_one_percent_is_422(client: TestClient, ratio: float) -> None:
    """A cap of 1e-300 asked for 5 req/s / 1e-300 = 5e300 req/s of fleet: 10^300 replicas, and the replica
    search overflowed a float (a 500). Below 0.01 (a fleet of 100 times the load) the cap is refused."""
    body = {**PLAN, "ha_policy": {"max_utilization_ratio": ratio}}
    assert_problem(client.post("/v1/slo-plan", json=body), 422, "/body/ha_policy/max_utilization_ratio")


def test_a_load_cap_of_one_percent_is_planned(client: TestClient) -> None:
    """The lowest cap accepted: 2 req/s sized as 2 / 0.01 = 200 req/s, so replicas = ceil(200 / max_verified)
    and each replica is offered 2 / replicas, at most 1% of its verified maximum."""
    body = {**PLAN, "ha_policy": {"max_utilization_ratio": 0.01}, "candidates": {"gpus": ["h100-sxm"]}}
    response = client.post("/v1/slo-plan", json=body)
    assert response.status_code == 200, response.text
    plans = response.json()["plans"]
    assert plans
    for plan in plans:
        load = plan["load_per_replica"]
        assert plan["replicas"] == math.ceil(200 / load["max_verified"] - 1e-9)
        assert plan["utilization_ratio"] <= 0.01 + 1e-12


@pytest.mark.parametrize(("field", "value"), [("fp8_tflops", 5e-324), ("fp8_tflops", 0.0009),
                                            ("memory_bandwidth_bytes_per_s", 999_999.0)])
def test_a_datasheet_rate_below_a_gflop_or_a_megabyte_per_second_is_422(client: TestClient, field: str,
                                                                        value: float) -> None:
    """An inline GPU at 5e-324 TFLOP/s made a step's compute time overflow to infinity and the roofline's own
    check fail (a 500). Rates start at 0.001 TFLOP/s (1 GFLOP/s) and 1 MB/s."""
    gpu = {**GPU_SPEC_EXAMPLE, field: value}
    body = {"model": "llama-3-8b", "gpu_spec": gpu, "phase": "decode", "batch_size": 8, "context_tokens": 1024,
            "weight_dtype": "fp8", "kv_dtype": "fp8"}
    assert_problem(client.post("/v1/roofline", json=body), 422, f"/body/gpu_spec/{field}")


def test_an_integer_with_thousands_of_digits_is_a_422_not_a_500(client: TestClient) -> None:
    """Python refuses to parse integers of more than 4300 digits (a CPU-exhaustion guard)."""
    raw = '{"model": "llama-3-70b", "context_tokens": 1' + "0" * 5000 + "}"
    assert_problem(client.post("/v1/kv-cache", content=raw, headers=JSON_HEADERS), 422, "/body")


# Malformed and oversized JSON -----------------------------------------------------------------

@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_deeply_nested_json_is_422(client: TestClient, depth: int) -> None:
    raw = '{"model": "llama-3-70b", "context_tokens": 8, "x": ' + "[" * depth + "]" * depth + "}"
    assert len(raw) < MAX_BODY_BYTES
    assert_problem(client.post("/v1/kv-cache", content=raw, headers=JSON_HEADERS), 422, "/body")


def test_a_body_of_thousands_of_unknown_fields_gets_a_bounded_answer(client: TestClient) -> None:
    """50,000 unknown keys are 50,000 errors: the count is given, the first 100 are listed."""
    body = {**KV, **{f"k{index}": 1 for index in range(50_000)}}
    response = client.post("/v1/kv-cache", json=body)
    problem = assert_problem(response, 422, "/body/k0")
    assert MAX_LISTED_ERRORS == 100
    assert len(problem["errors"]) == 100
    assert problem["detail"] == "50000 invalid inputs (the first 100 are listed)"
    assert len(response.content) < 20_000


def test_a_huge_array_in_the_body_is_413(client: TestClient) -> None:
    """150,000 numbers of 1 to 6 digits plus separators are over 1 MiB: refused before parsing."""
    raw = json.dumps({**KV, "x": list(range(150_000))}).encode()
    assert len(raw) > MAX_BODY_BYTES
    assert_problem(client.post("/v1/kv-cache", content=raw, headers=JSON_HEADERS), 413)


def test_a_value_the_database_refuses_is_a_422_not_an_outage(client: TestClient, write_headers: dict[str, str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL refuses a string longer than its column (SQLite stores it): that is the
    client's input, so a 422 problem, never the 503 of a database outage."""
    row = client.get("/v1/gpus/h100-sxm").json()
    body = {key: value for key, value in row.items()
            if key not in ("slug", "origin", "version", "created_at", "updated_at", "written_by")}

    def refusing_put(*args: Any, **kwargs: Any) -> Any:
        raise DataError("UPDATE gpus SET vendor=%(vendor)s", {}, Exception("value too long for type "
                                                                            "character varying(64)"))

    monkeypatch.setattr(catalog_service, "put", refusing_put)
    problem = assert_problem(client.put("/v1/gpus/h100-sxm", json=body, headers=write_headers), 422, "/body")
    assert "varying" not in json.dumps(problem)  # the database's wording stays in the log


# Search space and simulation work of /v1/slo-plan ----------------------------------------------

def test_a_search_space_over_512_configurations_is_422_naming_the_limit(client: TestClient) -> None:
    """1 GPU x 4 TP degrees x 1 PP x 3 weight dtypes x 3 KV dtypes x 8 max_num_seqs x 2
    max_num_batched_tokens = 4 x 3 x 3 x 8 x 2 = 576 configurations > 512."""
    candidates = {"gpus": ["h100-sxm"], "tensor_parallel": [1, 2, 4, 8],
                  "weight_dtypes": ["bf16", "fp8", "int8"], "kv_dtypes": ["bf16", "fp8", "int8"],
                  "max_num_seqs": [8, 16, 32, 64, 128, 256, 512, 1024],
                  "max_num_batched_tokens": [4096, 8192]}
    problem = assert_problem(client.post("/v1/slo-plan", json={**PLAN, "candidates": candidates}), 422,
                             "/body/candidates")
    assert problem["detail"].startswith("576 configurations")
    assert "limit of 512" in problem["detail"]


@pytest.mark.parametrize(("candidates", "pointer"), [
    ({"gpus": ["h100-sxm"] * 65}, "/body/candidates/gpus"),  # at most 64 GPUs
    ({"tensor_parallel": list(range(1, 18))}, "/body/candidates/tensor_parallel"),  # at most 16 degrees
    ({"max_num_seqs": list(range(1, 10))}, "/body/candidates/max_num_seqs"),  # at most 8 values
])
def test_each_candidate_list_is_bounded(client: TestClient, candidates: dict[str, Any], pointer: str) -> None:
    assert_problem(client.post("/v1/slo-plan", json={**PLAN, "candidates": candidates}), 422, pointer)


def test_simulated_requests_are_capped_at_20000(client: TestClient) -> None:
    assert_problem(client.post("/v1/slo-plan", json={**PLAN, "simulated_requests": 20_001}), 422,
                   "/body/simulated_requests")


# Request timeout and request slots --------------------------------------------------------------

@pytest.fixture
def app_with(settings: Settings, app: FastAPI, fresh_catalog: None) -> Iterator[Any]:
    """Build an application on the test database with some settings changed."""
    def build(**changes: Any) -> FastAPI:
        return create_app(settings.model_copy(update=changes))
    yield build


SERVICE_MODULES = {"kv_cache": estimates, "put": catalog_service, "plan_slo": planning}


def slow(monkeypatch: pytest.MonkeyPatch, name: str, seconds: float) -> None:
    """Make the service function `name` take `seconds` longer (after doing its work)."""
    module = SERVICE_MODULES[name]
    real = getattr(module, name)

    def slowed(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        time.sleep(seconds)
        return result

    monkeypatch.setattr(module, name, slowed)


def test_a_slow_request_times_out_with_a_503_problem(app_with: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    slow(monkeypatch, "kv_cache", 3.0)
    with TestClient(app_with(request_timeout_s=0.2), raise_server_exceptions=False) as client:
        started = time.perf_counter()
        response = client.post("/v1/kv-cache", json=KV, headers={"X-Request-ID": "slow-1"})
        elapsed = time.perf_counter() - started
        assert client.get("/healthz").status_code == 200  # the process still serves
    problem = assert_problem(response, 503)
    assert problem["detail"] == "The request did not finish within 0.2 s; retry later"
    assert problem["request_id"] == "slow-1"
    assert response.headers["retry-after"] == "5"
    assert elapsed < 2.5  # answered at the deadline, not when the 3 s of work ends


def test_a_write_that_times_out_is_not_applied(app_with: Any, engine: Engine, client: TestClient,
                                               write_headers: dict[str, str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The row and the catalog revision are as before: the late transaction rolls back whole."""
    before = client.get("/v1/gpus/h100-sxm").json()
    with Session(engine) as session:
        revision = catalog_revision(session)
    body = {key: value for key, value in before.items()
            if key not in ("slug", "origin", "version", "created_at", "updated_at", "written_by")}
    slow(monkeypatch, "put", 1.0)
    with TestClient(app_with(request_timeout_s=0.2), raise_server_exceptions=False) as slow_client:
        response = slow_client.put("/v1/gpus/h100-sxm", json={**body, "name": "Renamed"}, headers=write_headers)
        assert_problem(response, 503)
        time.sleep(1.5)  # the abandoned work finishes (and rolls back) in its thread
    assert client.get("/v1/gpus/h100-sxm").json() == before
    with Session(engine) as session:
        assert catalog_revision(session) == revision


def test_a_quote_whose_request_times_out_is_not_stored(app_with: Any, engine: Engine,
                                                       write_headers: dict[str, str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The quote is written in its own transaction, after the plan: a request already answered 503
    must not store one afterwards (a retry without an Idempotency-Key would otherwise duplicate it)."""
    plan = {"model": "llama-3.1-8b", "simulated_requests": 500,
            "workload": {"input_tokens": 500, "output_tokens": 100, "requests_per_s": 1},
            "slo": {"ttft_ms": 2000, "tpot_ms": 100, "percentile": 95},
            "candidates": {"gpus": ["h100-sxm"], "tensor_parallel": [1]}}
    with Session(engine) as session, session.begin():
        session.execute(delete(QuoteRecord))
    slow(monkeypatch, "plan_slo", 1.0)
    with TestClient(app_with(request_timeout_s=0.2), raise_server_exceptions=False) as slow_client:
        assert_problem(slow_client.post("/v1/quotes", json=plan, headers=write_headers), 503)
        time.sleep(1.5)  # the abandoned plan finishes in its thread and reaches the write
    with Session(engine) as session:
        assert session.scalar(select(func.count()).select_from(QuoteRecord)) == 0


@contextmanager
def the_one_slot_held(app_with: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    """A client of a process with one request slot and a 0.3 s deadline, its slot held by a 1.5 s request
    until the block ends (then the holder is joined)."""
    slow(monkeypatch, "kv_cache", 1.5)
    application = app_with(request_timeout_s=0.3, max_concurrent_requests=1)
    with TestClient(application, raise_server_exceptions=False) as client:
        holder = threading.Thread(target=client.post, args=("/v1/kv-cache",), kwargs={"json": KV})
        holder.start()
        time.sleep(0.1)  # the first request has taken the slot
        yield client
        holder.join()


def test_requests_over_the_slots_wait_and_time_out_rather_than_pile_up(
        app_with: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """One slot, held by a 1.5 s request: a second request waits for it and gets a 503 at its
    0.3 s deadline (readiness too: a saturated process reads as not ready); once the slot is free again
    requests are served."""
    with the_one_slot_held(app_with, monkeypatch) as client:
        waiting = client.get("/v1/gpus/h100-sxm")
        readiness = client.get("/readyz")
        time.sleep(1.5)  # the first request's work ends and frees the slot
        assert client.get("/v1/gpus/h100-sxm").status_code == 200
    assert_problem(waiting, 503)
    assert_problem(readiness, 503)


def test_liveness_and_metrics_answer_while_every_slot_is_busy(
        app_with: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The one slot is held for 1.5 s, past the 0.3 s deadline: queued for it, /healthz would be a 503 (and
    an orchestrator would restart a busy, healthy process); it answers 200 at once, as /metrics does, with
    the request id and security headers of every answer."""
    with the_one_slot_held(app_with, monkeypatch) as client:
        alive = client.get("/healthz", headers={"X-Request-ID": "probe-1"})
        scraped = client.get("/metrics")
    assert (alive.status_code, alive.json(), alive.headers["x-request-id"]) == (200, {"status": "ok"}, "probe-1")
    assert alive.headers["x-content-type-options"] == "nosniff"
    assert scraped.status_code == 200
    assert 'http_requests_total{method="GET",route="/healthz",status="200"} 1.0' in scraped.text


@contextmanager
def slow_preparation(monkeypatch: pytest.MonkeyPatch, seconds: float) -> Iterator[list[str]]:
    """Each row's preparation for prediction (`predict.prepare`, as the upload service calls it) made `seconds`
    slower; yields the list of rows prepared, by model, as they are."""
    real, prepared = calibration.prepare, []

    def slowed(measurement: Any, model: Any, gpu: Any) -> Any:
        time.sleep(seconds)
        prepared.append(model.slug)
        return real(measurement, model, gpu)

    monkeypatch.setattr(calibration, "prepare", slowed)
    yield prepared


@pytest.mark.parametrize(("path", "extra"), [("/v1/validate", {}), ("/v1/calibrations", {"name": "late-fit"})])
def test_an_upload_past_its_deadline_stops_at_its_next_row_and_frees_its_slot(
        app_with: Any, monkeypatch: pytest.MonkeyPatch, write_headers: dict[str, str], path: str,
        extra: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    """The 35 rows of examples/calibration-sample.csv, each made 0.2 s slower to prepare for prediction: 7 s of
    work. One request slot, a 0.5 s deadline: the 503 comes at 0.5 s and the work stops at its next row's check,
    after at most 4 rows (begun at 0, 0.2, 0.4 and, with a late tick, 0.6 s; 35 if it ran to its end), so a
    request sent 0.7 s after the 503 finds the slot free and is served; work running to its end would hold it
    until 7 s, and that request would wait its own 0.5 s deadline out. The stop is logged as a warning
    ("timed-out work stopped"), not as a failure."""
    logger = logging.getLogger("app")
    logger.addHandler(caplog.handler)  # the app's logger does not propagate to the root
    try:
        with slow_preparation(monkeypatch, 0.2) as prepared, TestClient(
                app_with(request_timeout_s=0.5, max_concurrent_requests=1), raise_server_exceptions=False) as client:
            late = client.post(path, json={"rows": SAMPLE_ROWS, **extra}, headers=write_headers)
            time.sleep(0.7)
            served = client.get("/v1/gpus/h100-sxm")
            stopped_after = len(prepared)
            time.sleep(0.5)
            assert len(prepared) == stopped_after  # nothing more was prepared
    finally:
        logger.removeHandler(caplog.handler)
    assert_problem(late, 503)
    assert served.status_code == 200
    assert 1 <= stopped_after <= 4
    assert [record.levelno for record in caplog.records if record.getMessage() == "timed-out work stopped"] == [
        logging.WARNING]
    assert not [record for record in caplog.records if record.getMessage() == "timed-out request failed later"]


@pytest.mark.parametrize(("name", "value"), [
    ("REQUEST_TIMEOUT_S", "0"), ("REQUEST_TIMEOUT_S", "-1"), ("REQUEST_TIMEOUT_S", "nan"),
    ("REQUEST_TIMEOUT_S", "inf"), ("REQUEST_TIMEOUT_S", "3601"), ("REQUEST_TIMEOUT_S", "soon"),
    ("MAX_CONCURRENT_REQUESTS", "0"), ("MAX_CONCURRENT_REQUESTS", "41"),
])
def test_bad_limit_settings_stop_the_start(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError):
        Settings()


def test_limit_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REQUEST_TIMEOUT_S", "2.5")
    monkeypatch.setenv("MAX_CONCURRENT_REQUESTS", "8")
    settings = Settings()
    assert (settings.request_timeout_s, settings.max_concurrent_requests) == (2.5, 8)
    monkeypatch.delenv("REQUEST_TIMEOUT_S")
    monkeypatch.delenv("MAX_CONCURRENT_REQUESTS")
    assert (Settings().request_timeout_s, Settings().max_concurrent_requests) == (30.0, 40)
