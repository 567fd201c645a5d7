"""Every request example the committed OpenAPI document shows (Swagger UI's "Try it out" sends them as they
are) gets the answer its operation promises for a valid request: a 2xx, never a 422 the example cannot avoid.

An example is what a newcomer tries first: the calibration upload's two-row example could never fit (a GPU
family and precision needs 12 rows for an entry of its own), and /v1/roofline/chart showed /v1/roofline's
disaggregated example, which the chart refuses. The examples are read from the spec, so an example added later is
covered without a change here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from fastapi.testclient import TestClient

from scripts.export_openapi import OUTPUT

SPEC = json.loads(OUTPUT.read_text(encoding="utf-8"))


def _schema_examples(schema: dict[str, Any]) -> list[Any]:
    while "$ref" in schema:
        schema = SPEC["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return list(schema.get("examples", []))


def _examples() -> Iterator[tuple[str, str, str, Any]]:
    """(method, path, what, body) for each JSON request example: the media type's own examples where it has
    them (they are what Swagger UI offers), else its schema's. A required query parameter (the slug an import
    stores under) is in the path as {name}, as a path parameter is."""
    for path, operations in SPEC["paths"].items():
        for method, operation in operations.items():
            content = operation.get("requestBody", {}).get("content", {}).get("application/json")
            if content is None:
                continue
            if "examples" in content:
                examples = [(name, entry["value"]) for name, entry in content["examples"].items()]
            elif "example" in content:
                examples = [("example", content["example"])]
            else:
                examples = [(f"example {index}", example)
                            for index, example in enumerate(_schema_examples(content["schema"]), 1)]
            required = [parameter["name"] for parameter in operation.get("parameters", [])
                        if parameter["in"] == "query" and parameter.get("required")]
            query = "?" + "&".join(f"{name}={{{name}}}" for name in required) if required else ""
            for what, body in examples:
                yield method, path + query, what, body


def test_the_spec_has_request_examples() -> None:
    """Every sizing, planning, calibration and catalog write shows at least one (a test that reads none cannot
    fail)."""
    operations = {(method, path.split("?")[0]) for method, path, _, _ in _examples()}
    with_body = {(method, path) for path, operations_ in SPEC["paths"].items()
                 for method, operation in operations_.items()
                 if "application/json" in operation.get("requestBody", {}).get("content", {})}
    assert operations == with_body
    assert len(with_body) >= 14


def test_every_request_example_gets_a_success(client: TestClient, write_headers: dict[str, str],
                                             default_profile_loaded: None) -> None:
    """One test, its examples in a loop (the catalog is reset once), against the catalog and default profile
    `make run` loads. A catalog write's path takes a slug of its own, so each creates its row; a quote takes an
    Idempotency-Key of its own."""
    failures, sent = [], 0
    for number, (method, path, what, body) in enumerate(_examples()):
        headers = {**write_headers, "Idempotency-Key": f"example-{number}"}
        response = client.request(method, path.format(slug=f"example-{number}"), json=body, headers=headers)
        sent += 1
        if not 200 <= response.status_code < 300:
            failures.append(f"{method.upper()} {path} {what}: {response.status_code} {response.text[:300]}")
    assert sent and not failures, "\n".join(failures)
