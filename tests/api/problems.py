"""The one check of an RFC 9457 problem answer, shared by the API tests."""

from __future__ import annotations

from typing import Any


def assert_problem(response: Any, status: int, pointer: str | None = None) -> dict[str, Any]:
    """`response` is a problem+json of `status` that names its request, is never cached, and (when
    `pointer` is given) lists that JSON pointer among its field errors. Returns the problem."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.headers["cache-control"] == "no-store"
    problem = response.json()
    assert problem["status"] == status and problem["title"] and problem["detail"]
    assert problem["instance"] == response.request.url.path
    assert problem["request_id"] == response.headers["x-request-id"]
    if pointer is not None:
        assert pointer in [error["pointer"] for error in problem["errors"]], problem
    return problem
