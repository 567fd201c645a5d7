"""Errors that say what to do next: the closest slugs for a typo, JSON for a body of another type,
the catalog slug (or the import endpoint) for a Hugging Face repository id, and why writes are
refused on a server started without keys."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from tests.api.problems import assert_problem
from tests.conftest import TEST_API_KEY


@pytest.mark.parametrize(("method", "path", "body", "pointer", "suggested"), [
    ("GET", "/v1/gpus/h100", None, "/path/slug", ["h100-sxm", "h100-nvl", "h100-pcie"]),
    ("GET", "/v1/models/llama-3-8", None, "/path/slug", ["llama-3-8b"]),
    ("POST", "/v1/kv-cache", {"model": "llama3-70b", "context_tokens": 8}, "/body/model", ["llama-3-70b"]),
    ("POST", "/v1/roofline", {"model": "llama-3-8b", "gpu": "h100sxm", "phase": "decode", "context_tokens": 8},
     "/body/gpu", ["h100-sxm"]),
    ("POST", "/v1/slo-plan", {"model": "llama-3-8b", "workload": {"input_tokens": 100, "output_tokens": 10,
                                                                   "requests_per_s": 1},
                              "slo": {"ttft_ms": 1000, "tpot_ms": 100}, "candidates": {"gpus": ["l4", "a100-80gb-sxn"]}},
     "/body/candidates/gpus/1", ["a100-80gb-sxm"]),
])
def test_an_unknown_slug_suggests_the_closest_and_points_at_the_input(
        client: TestClient, method: str, path: str, body: dict[str, Any] | None, pointer: str,
        suggested: list[str]) -> None:
    problem = assert_problem(client.request(method, path, json=body), 404, pointer=pointer)
    for slug in suggested:
        assert repr(slug) in problem["detail"], problem


def test_a_slug_like_nothing_in_the_catalog_points_at_the_list(client: TestClient) -> None:
    problem = assert_problem(client.get("/v1/gpus/zzzzzz"), 404, pointer="/path/slug")
    assert "GET /v1/gpus" in problem["detail"]


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_a_body_that_is_not_sent_as_json_says_to_send_json(client: TestClient, content_type: str | None) -> None:
    headers = {} if content_type is None else {"Content-Type": content_type}
    response = client.post("/v1/kv-cache", content=b'{"model": "llama-3-8b", "context_tokens": 8}', headers=headers)
    problem = assert_problem(response, 422, pointer="/header/content-type")
    assert "Content-Type: application/json" in problem["detail"]
    assert (content_type or "no Content-Type") in problem["detail"]


def test_the_same_body_as_json_is_answered(client: TestClient) -> None:
    response = client.post("/v1/kv-cache", content=b'{"model": "llama-3-8b", "context_tokens": 8}',
                           headers={"Content-Type": "application/json; charset=utf-8"})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(("model", "says"), [
    ("meta-llama/Meta-Llama-3-8B", "its catalog slug is 'llama-3-8b'"),  # the catalog row's hf_id
    ("meta-llama/Llama-3.1-8B", "the catalog's 'llama-3.1-8b' is 'meta-llama/Meta-Llama-3.1-8B'"),  # renamed repo
    ("acme/Foo-Bar_7B", "POST /v1/models/import?slug=foo-bar_7b"),
    # Fine-tunes: the base model is named, as is how to import the fine-tune itself.
    ("meta-llama/Llama-3.1-8B-Instruct", "its base model is the catalog's 'llama-3.1-8b'"),
    ("meta-llama/Meta-Llama-3.1-8B-Instruct", "its base model is the catalog's 'llama-3.1-8b'"),
    ("Qwen/Qwen2.5-7B-Instruct", "import?slug=qwen2.5-7b-instruct"),
    ("google/gemma-2-9b-it", "its base model is the catalog's 'gemma-2-9b'"),
])
def test_a_hugging_face_id_as_a_model_slug_says_where_the_slug_is(client: TestClient, model: str, says: str) -> None:
    problem = assert_problem(client.post("/v1/kv-cache", json={"model": model, "context_tokens": 8}), 422,
                             pointer="/body/model")
    assert says in problem["errors"][0]["detail"], problem


@pytest.mark.parametrize(("model", "says"), [
    ("meta-llama/Meta-Llama-3-8B", "its catalog slug is 'llama-3-8b'"),
    ("meta-llama/Llama-3.1-8B", "the catalog's 'llama-3.1-8b' is 'meta-llama/Meta-Llama-3.1-8B'"),
    ("acme/Foo-Bar_7B", "POST /v1/models/import?slug=foo-bar_7b"),
])
def test_a_hugging_face_id_in_a_model_url_says_where_the_slug_is(client: TestClient, model: str, says: str) -> None:
    """As in a body field (a README review found the path's 404 naming no slug where the body's 422 did)."""
    problem = assert_problem(client.get(f"/v1/models/{model}"), 404)
    assert problem["detail"].startswith("No such resource: ") and says in problem["detail"], problem


def test_a_repository_id_in_a_gpu_url_says_slugs_have_no_slash(client: TestClient) -> None:
    problem = assert_problem(client.get("/v1/gpus/nvidia/h100"), 404)
    assert "looks like a Hugging Face repository id, and catalog slugs have no '/'" in problem["detail"]


def test_without_api_keys_the_401_and_the_start_up_log_say_writes_are_off(
        settings: Settings, caplog: pytest.LogCaptureFixture) -> None:
    unkeyed = settings.model_copy(update={"api_keys": []})
    logger = logging.getLogger("app")
    logger.addHandler(caplog.handler)  # the app's logger does not propagate to the root
    try:
        app = create_app(unkeyed)
    finally:
        logger.removeHandler(caplog.handler)
    assert any("API_KEYS is not set" in record.getMessage() and record.levelno == logging.WARNING
               for record in caplog.records)
    with TestClient(app, raise_server_exceptions=False) as client:
        response = client.put("/v1/gpus/h100-sxm", json={}, headers={"Authorization": f"Bearer {TEST_API_KEY}"})
    problem = assert_problem(response, 401)
    assert "started without API_KEYS" in problem["detail"]


# llama-3-8b: max_position_embeddings 8,192 (Meta-Llama-3-8B config.json).
@pytest.mark.parametrize(("path", "body", "tokens"), [
    ("/v1/kv-cache", {"model": "llama-3-8b", "context_tokens": 10_000_000}, "10,000,000"),
    # prefill: 8,000 cached + 500 new = 8,500 positions
    ("/v1/roofline", {"model": "llama-3-8b", "gpu": "h100-sxm", "phase": "prefill", "context_tokens": 8000,
                      "prompt_tokens": 500}, "8,500"),
    # decode: 8,192 cached + the decoded token = 8,193 positions, one too many
    ("/v1/roofline", {"model": "llama-3-8b", "gpu": "h100-sxm", "phase": "decode", "context_tokens": 8192}, "8,193"),
    ("/v1/roofline/batch-sweep", {"model": "llama-3-8b", "gpu": "h100-sxm", "context_tokens": 8192}, "8,193"),
])
def test_a_sequence_beyond_the_models_positions_is_answered_with_a_warning(
        client: TestClient, path: str, body: dict[str, Any], tokens: str) -> None:
    response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    [warning] = response.json()["warnings"]
    assert f"{tokens} tokens" in warning and "max_position_embeddings (8,192)" in warning


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/kv-cache", {"model": "llama-3-8b", "context_tokens": 8192}),
    ("/v1/roofline", {"model": "llama-3-8b", "gpu": "h100-sxm", "phase": "decode", "context_tokens": 8191}),
    ("/v1/roofline/batch-sweep", {"model": "llama-3-8b", "gpu": "h100-sxm", "context_tokens": 8191}),
])
def test_a_sequence_within_the_models_positions_has_no_warning(client: TestClient, path: str,
                                                               body: dict[str, Any]) -> None:
    assert client.post(path, json=body).json()["warnings"] == []


@pytest.mark.parametrize(("method", "path", "body", "pointer", "key"), [
    ("POST", "/v1/kv-cache", {"model": "Llama-3-70B", "context_tokens": 8}, "/body/model", "llama-3-70b"),
    ("GET", "/v1/gpus/H100-SXM", None, "/path/slug", "h100-sxm"),
    ("GET", "/v1/roofline/chart?model=llama-3-8b&gpu=H100-SXM&phase=decode&context_tokens=8", None, "/query/gpu",
     "h100-sxm"),
])
def test_a_catalog_key_with_capitals_names_the_lower_case_key(client: TestClient, method: str, path: str,
                                                              body: dict[str, Any] | None, pointer: str,
                                                              key: str) -> None:
    """Catalog keys are lower-case; one typed as the model card writes it gets the key it stands for, not the
    pattern alone (a newcomer's review typed 'H100-SXM' and 'Llama-3-70B')."""
    problem = assert_problem(client.request(method, path, json=body), 422, pointer=pointer)
    assert f"catalog keys are lower-case, {key!r}" in problem["errors"][0]["detail"], problem
