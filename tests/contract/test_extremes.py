"""Every numeric field of every documented request example, set to the lowest and the highest value its
schema allows, one field at a time: the answer is a 200, a 201 or a 4xx problem, never a 5xx.

Random contract fuzzing (test_schemathesis.py) rarely draws a bound exactly; a bound is where the
arithmetic behind a field breaks (a load cap of 1e-300 once sized 10^300 replicas and overflowed a float
in the replica search). The bounds and the examples are read from the committed spec, so a field added
later is covered without a change here.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from scripts.export_openapi import OUTPUT

SPEC = json.loads(OUTPUT.read_text(encoding="utf-8"))
# The sizing and planning requests, and the catalog writes.
OPERATIONS = (("post", "/v1/kv-cache"), ("post", "/v1/roofline"), ("post", "/v1/roofline/batch-sweep"),
              ("post", "/v1/capacity"), ("post", "/v1/slo-plan"), ("put", "/v1/gpus/{slug}"),
              ("put", "/v1/models/{slug}"))


def _resolve(schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = SPEC["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def _branches(schema: dict[str, Any]) -> Iterator[dict[str, Any]]:
    schema = _resolve(schema)
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            for branch in schema[key]:
                yield from _branches(branch)
            return
    yield schema


def _extremes(schema: dict[str, Any]) -> list[float]:
    """The lowest and highest value a numeric schema allows (the side without a bound is left out)."""
    integer = schema["type"] == "integer"
    values: list[float] = []
    if "minimum" in schema:
        values.append(schema["minimum"])
    elif "exclusiveMinimum" in schema:
        low = schema["exclusiveMinimum"]
        values.append(math.floor(low) + 1 if integer else math.nextafter(low, math.inf))
    if "maximum" in schema:
        values.append(schema["maximum"])
    elif "exclusiveMaximum" in schema:
        high = schema["exclusiveMaximum"]
        values.append(math.ceil(high) - 1 if integer else math.nextafter(high, -math.inf))
    return [int(value) if integer else float(value) for value in values]


def _numeric_fields(schema: dict[str, Any], example: Any,
                    path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], float]]:
    """(path, value) for each numeric field of the example's objects: each field of an object the example
    has, set or left out (an object it leaves out would be sent with one field only: refused as a whole)."""
    for branch in _branches(schema):
        kind = branch.get("type")
        if kind in ("integer", "number"):
            for value in _extremes(branch):
                yield path, value
        elif (kind == "object" or "properties" in branch) and isinstance(example, dict):
            for name, sub in branch.get("properties", {}).items():
                yield from _numeric_fields(sub, example.get(name), (*path, name))


def _with(example: dict[str, Any], path: tuple[str, ...], value: float) -> dict[str, Any]:
    body = copy.deepcopy(example)
    node = body
    for name in path[:-1]:
        node = node.setdefault(name, {})
    node[path[-1]] = value
    return body


def _cases(method: str, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(what, body) for each numeric field at each of its bounds, in the first example that reaches it."""
    content = SPEC["paths"][path][method]["requestBody"]["content"]["application/json"]
    schema = _resolve(content["schema"])
    seen = set()
    for index, example in enumerate(schema.get("examples", [])):
        for field, value in _numeric_fields(schema, example):
            if (field, value) not in seen:
                seen.add((field, value))
                yield f"example {index} {'.'.join(field)}={value!r}", _with(example, field, value)


@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{method} {path}" for method, path in OPERATIONS])
def test_each_field_at_a_bound_of_its_schema_gets_an_answer(client: TestClient, write_headers: dict[str, str],
                                                            method: str, path: str) -> None:
    """One test per operation, its cases in a loop: the catalog is reset once per test, not per case. Each
    write gets a slug of its own, so each one creates its row."""
    failures, cases = [], 0
    for number, (what, body) in enumerate(_cases(method, path)):
        response = client.request(method, path.format(slug=f"extreme-values-{number}"), json=body,
                                  headers=write_headers)
        cases += 1
        if response.status_code >= 500:
            failures.append(f"{what}: {response.status_code} {response.text[:200]}")
    assert cases and not failures, failures
