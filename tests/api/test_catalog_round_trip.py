"""GET -> modify -> PUT: a catalog row as read can be written back whole.

The read-only fields (slug, origin, version, timestamps; a model's derived architecture and
attention type) are accepted when they describe the stored row and never written; another slug
is a 422, another version a 412 (the row changed since it was read).
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.api.problems import assert_problem

ROWS = [("/v1/gpus/h100-sxm", "price_per_hour_usd", 2.5), ("/v1/models/llama-3-8b", "max_position_embeddings", 16384)]


@pytest.mark.parametrize(("path", "field", "value"), ROWS)
def test_a_row_as_read_can_be_put_back_modified(client: TestClient, write_headers: dict[str, str],
                                                path: str, field: str, value: object) -> None:
    read = client.get(path)
    row = read.json()
    assert row["version"] == 1 and row["origin"] == "reference"
    written = client.put(path, json={**row, field: value}, headers={**write_headers, "If-Match": read.headers["etag"]})
    assert written.status_code == 200, written.text
    stored = written.json()
    assert stored[field] == value
    # Read-only fields are the server's: a new version, origin user, created_at kept, updated_at moved.
    assert (stored["version"], stored["origin"], stored["created_at"]) == (2, "user", row["created_at"])
    assert stored["updated_at"] >= row["updated_at"]
    # The written row, read again, round-trips unchanged (only the server's fields move).
    again = client.put(path, json=stored, headers=write_headers)
    assert again.status_code == 200, again.text
    assert {k: v for k, v in again.json().items() if k not in ("version", "updated_at")} == \
        {k: v for k, v in stored.items() if k not in ("version", "updated_at")}
    assert again.json()["version"] == 3


@pytest.mark.parametrize("path", [path for path, _, _ in ROWS])
def test_a_stale_version_in_the_body_is_a_412(client: TestClient, write_headers: dict[str, str], path: str) -> None:
    row = client.get(path).json()
    assert client.put(path, json=row, headers=write_headers).status_code == 200  # now version 2
    stale = client.put(path, json=row, headers=write_headers)  # still says version 1
    assert_problem(stale, 412)
    assert "version 1" in stale.json()["detail"] and "version 2" in stale.json()["detail"]
    assert client.get(path).json()["version"] == 2


def test_another_slug_in_the_body_is_a_422(client: TestClient, write_headers: dict[str, str]) -> None:
    row = client.get("/v1/gpus/h100-sxm").json()
    response = client.put("/v1/gpus/my-h100", json=row, headers=write_headers)
    assert_problem(response, 422, pointer="/body/slug")
    assert client.get("/v1/gpus/my-h100").status_code == 404
    # Copying a row under a new slug: send it without the slug and version.
    copy = {k: v for k, v in row.items() if k not in ("slug", "version")}
    created = client.put("/v1/gpus/my-h100", json=copy, headers=write_headers)
    assert created.status_code == 201, created.text
    assert (created.json()["slug"], created.json()["version"], created.json()["origin"]) == ("my-h100", 1, "user")


def test_a_version_for_a_row_that_does_not_exist_is_a_412(client: TestClient, write_headers: dict[str, str]) -> None:
    row = client.get("/v1/gpus/h100-sxm").json()
    response = client.put("/v1/gpus/my-h100", json={**row, "slug": "my-h100"}, headers=write_headers)
    assert_problem(response, 412)


@pytest.mark.parametrize(("field", "value"), [
    ("origin", "user"),  # stored: reference
    ("created_at", "2020-01-01T00:00:00Z"),
    ("architecture", "moe"),  # stored: dense
    ("attention_type", "mha"),  # stored: gqa
])
def test_other_read_only_fields_must_match_the_stored_row(client: TestClient, write_headers: dict[str, str],
                                                          field: str, value: str) -> None:
    row = client.get("/v1/models/llama-3-8b").json()
    response = client.put("/v1/models/llama-3-8b", json={**row, field: value}, headers=write_headers)
    assert_problem(response, 422, pointer=f"/body/{field}")
    assert client.get("/v1/models/llama-3-8b").json()["version"] == 1


def test_read_only_fields_are_not_open_to_any_value(client: TestClient, write_headers: dict[str, str]) -> None:
    row = client.get("/v1/gpus/h100-sxm").json()
    response = client.put("/v1/gpus/h100-sxm", json={**row, "version": "1", "unknown": 1}, headers=write_headers)
    problem = assert_problem(response, 422, pointer="/body/version")
    assert "/body/unknown" in [error["pointer"] for error in problem["errors"]]
