"""Every bad request gets the right 4xx as RFC 9457 problem+json, with JSON pointers for 422s."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.problems import assert_problem

GPU = {
    "name": "Example Accelerator 64GB",
    "vendor": "Example",
    "memory_bytes": 68_719_476_736,
    "memory_bandwidth_bytes_per_s": 2.0e12,
    "interconnect_bandwidth_bytes_per_s": 64e9,
    "bf16_tflops": 400.0,
}


@pytest.mark.parametrize(("change", "pointer"), [
    # wrong types: no coercion of strings, booleans or fractional numbers into integers
    ({"memory_bytes": "68719476736"}, "/body/memory_bytes"),
    ({"memory_bytes": True}, "/body/memory_bytes"),
    ({"memory_bytes": 6.5e10}, "/body/memory_bytes"),
    ({"bf16_tflops": "fast"}, "/body/bf16_tflops"),
    ({"name": 42}, "/body/name"),
    ({"gpus_per_node": [8]}, "/body/gpus_per_node"),
    # negative and zero quantities
    ({"memory_bytes": -1}, "/body/memory_bytes"),
    ({"memory_bandwidth_bytes_per_s": 0}, "/body/memory_bandwidth_bytes_per_s"),
    ({"price_per_hour_usd": -0.5}, "/body/price_per_hour_usd"),
    ({"gpus_per_node": 0}, "/body/gpus_per_node"),
    # beyond physical sense
    ({"memory_bytes": 10**100}, "/body/memory_bytes"),
    ({"bf16_tflops": 1e9}, "/body/bf16_tflops"),
    # NUL bytes and oversize strings
    ({"name": "H100\u0000"}, "/body/name"),
    ({"vendor": "x" * 201}, "/body/vendor"),
    ({"family": "Hopper Gen!"}, "/body/family"),
    # unknown fields are refused, not ignored (a typo must not silently fall back to a default)
    ({"gpus_per_nod": 4}, "/body/gpus_per_nod"),
])
def test_bad_gpu_bodies(client: TestClient, write_headers: dict[str, str], change: dict[str, Any],
                        pointer: str) -> None:
    response = client.put("/v1/gpus/example", json={**GPU, **change}, headers=write_headers)
    assert_problem(response, 422, pointer)


@pytest.mark.parametrize("missing", ["name", "vendor", "memory_bytes", "memory_bandwidth_bytes_per_s"])
def test_missing_required_field(client: TestClient, write_headers: dict[str, str], missing: str) -> None:
    body = {key: value for key, value in GPU.items() if key != missing}
    assert_problem(client.put("/v1/gpus/example", json=body, headers=write_headers), 422, f"/body/{missing}")


@pytest.mark.parametrize("raw", [
    b'{"name": "x", ',  # truncated
    b"{'name': 'x'}",  # not JSON quoting
    json.dumps(GPU)[:-1].encode() + b', "tdp_w": NaN}',
    json.dumps(GPU)[:-1].encode() + b', "tdp_w": Infinity}',
    json.dumps(GPU)[:-1].encode() + b', "tdp_w": 1e400}',  # overflows to infinity
    b"[]",
    b"null",
    b"\x0e#\x7f\xff\xfe",  # not UTF-8 at all
])
def test_malformed_or_non_finite_json_body(client: TestClient, write_headers: dict[str, str], raw: bytes) -> None:
    response = client.put("/v1/gpus/example", content=raw,
                          headers={**write_headers, "Content-Type": "application/json"})
    problem = assert_problem(response, 422)
    assert all(error["pointer"].startswith("/body") for error in problem["errors"])


def test_non_json_content_type_is_a_422_not_a_500(client: TestClient, write_headers: dict[str, str]) -> None:
    response = client.put("/v1/gpus/example", content=b"name=x",
                          headers={**write_headers, "Content-Type": "application/x-www-form-urlencoded"})
    assert_problem(response, 422)


@pytest.mark.parametrize(("path", "pointer"), [
    ("/v1/gpus?limit=201", "/query/limit"),
    ("/v1/gpus?limit=0", "/query/limit"),
    ("/v1/gpus?limit=1000000000000000000000000000000", "/query/limit"),
    ("/v1/gpus?limit=ten", "/query/limit"),
    ("/v1/gpus?offset=-1", "/query/offset"),
    ("/v1/gpus?vendor=%00", "/query/vendor"),
    ("/v1/gpus?vendor=", "/query/vendor"),
    ("/v1/models?architecture=hybrid", "/query/architecture"),
    ("/v1/models?attention=linear", "/query/attention"),
    ("/v1/gpus/H100-SXM", "/path/slug"),  # slugs are lower-case
    ("/v1/gpus/h100%00", "/path/slug"),
    ("/v1/models/" + "a" * 65, "/path/slug"),
])
def test_bad_query_and_path_parameters(client: TestClient, path: str, pointer: str) -> None:
    assert_problem(client.get(path), 422, pointer)


def test_bad_model_import_query(client: TestClient) -> None:
    assert_problem(client.post("/v1/models/import", json={}), 422, "/query/slug")
    assert_problem(client.post("/v1/models/import?slug=x&dry_run=maybe", json={}), 422, "/query/dry_run")


def test_nested_too_deep_import_body_is_a_422(client: TestClient) -> None:
    response = client.post("/v1/models/import", params={"slug": "deep"}, content=b"[" * 100_000,
                           headers={"Content-Type": "application/json"})
    assert_problem(response, 422, "/body")


def test_bad_model_bodies(client: TestClient, write_headers: dict[str, str]) -> None:
    model = {"name": "m", "num_hidden_layers": 4, "hidden_size": 512, "num_attention_heads": 8,
             "num_key_value_heads": 8, "vocab_size": 32000}
    cases = [
        ({"num_hidden_layers": 1001}, "/body/num_hidden_layers"),
        ({"num_hidden_layers": -4}, "/body/num_hidden_layers"),
        ({"hidden_size": 2_000_000}, "/body/hidden_size"),
        ({"layer_types": ["linear_attention"] * 4}, "/body/layer_types/0"),
        ({"dtype": "fp64"}, "/body/dtype"),
        ({"moe_layers": [-1]}, "/body/moe_layers/0"),
        ({"mlp_gated": "yes"}, "/body/mlp_gated"),
    ]
    for change, pointer in cases:
        response = client.put("/v1/models/m", json={**model, **change}, headers=write_headers)
        assert_problem(response, 422, pointer)


def test_unknown_slugs_are_404(client: TestClient, write_headers: dict[str, str]) -> None:
    assert_problem(client.get("/v1/gpus/h900"), 404)
    assert_problem(client.get("/v1/models/gpt-7"), 404)
    assert_problem(client.delete("/v1/gpus/h900", headers=write_headers), 404)
    assert_problem(client.delete("/v1/models/gpt-7", headers=write_headers), 404)


def test_unknown_route_and_wrong_method(client: TestClient) -> None:
    assert_problem(client.get("/v2/gpus"), 404)
    assert_problem(client.get("/"), 404)
    response = client.post("/v1/gpus/h100-sxm", json={})
    assert_problem(response, 405)
    assert set(response.headers["allow"].replace(" ", "").split(",")) == {"GET", "PUT", "DELETE"}


def test_missing_or_wrong_key(client: TestClient) -> None:
    problem = assert_problem(client.put("/v1/gpus/example", json=GPU), 401)
    assert "Authorization" in problem["detail"]
    response = client.put("/v1/gpus/example", json=GPU, headers={"Authorization": "Bearer not-a-real-key-123456"})
    assert_problem(response, 401)
    assert 'error="invalid_token"' in response.headers["www-authenticate"]


def test_stale_etag(client: TestClient, write_headers: dict[str, str]) -> None:
    response = client.put("/v1/gpus/h100-sxm", json=GPU, headers={**write_headers, "If-Match": '"stale"'})
    assert_problem(response, 412)
    # A weak tag never satisfies If-Match (strong comparison), even when it names the current version.
    current = client.get("/v1/gpus/h100-sxm").headers["etag"]
    response = client.put("/v1/gpus/h100-sxm", json=GPU, headers={**write_headers, "If-Match": f"W/{current}"})
    assert_problem(response, 412)


def test_oversize_body_is_413_with_or_without_content_length(client: TestClient,
                                                             write_headers: dict[str, str]) -> None:
    big = json.dumps({**GPU, "notes": "x" * (1 << 20)}).encode()
    assert_problem(client.put("/v1/gpus/example", content=big,
                              headers={**write_headers, "Content-Type": "application/json"}), 413)

    def chunks() -> Iterator[bytes]:  # streamed: no Content-Length to trust
        for start in range(0, len(big), 65536):
            yield big[start:start + 65536]

    response = client.post("/v1/models/import", params={"slug": "big"}, content=chunks(),
                           headers={"Content-Type": "application/json"})
    assert "content-length" not in response.request.headers
    assert_problem(response, 413)
    response = client.put("/v1/gpus/example", content=chunks(),
                          headers={**write_headers, "Content-Type": "application/json"})
    assert_problem(response, 413)


@pytest.mark.parametrize("header", ["If-Match", "If-None-Match"])
def test_malformed_conditional_header_is_a_422(client: TestClient, write_headers: dict[str, str], header: str) -> None:
    response = client.put("/v1/gpus/example", json=GPU, headers={**write_headers, header: "not-an-etag"})
    assert_problem(response, 422, f"/header/{header.lower()}")
