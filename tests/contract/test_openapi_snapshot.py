"""The committed openapi/openapi.json is exactly the spec the application serves."""

from __future__ import annotations

import json
import re

from fastapi.testclient import TestClient

from scripts.export_openapi import OUTPUT, render, served_spec


def test_committed_spec_matches_the_served_spec() -> None:
    assert OUTPUT.is_file(), "openapi/openapi.json is missing: run `make openapi`"
    committed = OUTPUT.read_text(encoding="utf-8")
    assert committed == render(served_spec()), "openapi/openapi.json is stale: run `make openapi` and commit it"


def test_rendering_is_deterministic() -> None:
    assert render(served_spec()) == render(served_spec())


def test_the_http_endpoint_serves_the_same_spec(client: TestClient) -> None:
    assert client.get("/openapi.json").json() == json.loads(OUTPUT.read_text(encoding="utf-8"))


def test_every_error_response_is_a_documented_problem() -> None:
    spec = served_spec()
    assert "Problem" in spec["components"]["schemas"]
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            statuses = operation["responses"]
            assert "500" in statuses, (method, path)
            for status, response in statuses.items():
                if status.startswith(("4", "5")):
                    content = response["content"]
                    assert list(content) == ["application/problem+json"], (method, path, status)
                    assert content["application/problem+json"]["schema"] == {"$ref": "#/components/schemas/Problem"}


def test_every_schema_has_an_example() -> None:
    schemas = served_spec()["components"]["schemas"]
    missing = [name for name, schema in schemas.items()
               if "examples" not in schema and "example" not in schema]
    assert missing == []


def test_operation_ids_are_short_stable_snake_case_names() -> None:
    """A client generated from the spec names its functions after these ids: `kv_cache`, not
    FastAPI's default `kv_cache_v1_kv_cache_post`. Renaming one breaks every generated client."""
    ids = [operation["operationId"] for operations in served_spec()["paths"].values()
           for operation in operations.values()]
    assert len(ids) == len(set(ids))
    for operation_id in ids:
        assert re.fullmatch(r"[a-z][a-z0-9]*(_[a-z0-9]+)*", operation_id), operation_id
        assert "v1" not in operation_id.split("_"), operation_id
    assert {"kv_cache", "list_gpus", "get_gpu", "put_gpu", "import_model", "create_quote", "get_quote",
            "slo_plan", "create_calibration", "validate_rows"} <= set(ids)
