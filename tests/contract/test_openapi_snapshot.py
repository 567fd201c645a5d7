"""The committed openapi/openapi.json is exactly the spec the application serves."""

from __future__ import annotations

import json

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
