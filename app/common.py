"""Shapes shared by every resource: problem details, list pages, constrained strings."""

from __future__ import annotations

from typing import Annotated, Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field


def schema_examples(*examples: dict[str, Any]) -> ConfigDict:
    """A model's `model_config` that shows these examples in its OpenAPI schema (and so in Swagger UI)."""
    return ConfigDict(json_schema_extra={"examples": list(examples)})


SLUG_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}$"
# Any text without NUL bytes (PostgreSQL cannot store them, and no honest client sends them).
NO_NUL_PATTERN = r"^[^\x00]*$"

Slug = Annotated[
    str,
    Field(pattern=SLUG_PATTERN, max_length=64, description="Catalog key: lower-case, digits, . _ -",
          examples=["h100-sxm"]),
]


# Bounded, NUL-free strings.
Name = Annotated[str, Field(min_length=1, max_length=200, pattern=NO_NUL_PATTERN)]
Label = Annotated[str, Field(max_length=200, pattern=NO_NUL_PATTERN)]
LongText = Annotated[str, Field(max_length=20_000, pattern=NO_NUL_PATTERN)]


class FieldProblem(BaseModel):
    pointer: str = Field(description="JSON pointer to the offending input, e.g. /body/num_hidden_layers")
    detail: str

    model_config = schema_examples({"pointer": "/query/limit", "detail": "Input should be less than or equal to 200"})


class Problem(BaseModel):
    """RFC 9457 problem details, the body of every error response."""

    type: str = Field("about:blank", description="Problem type URI; about:blank means: see the status")
    title: str = Field(description="Short summary of the status")
    status: int = Field(ge=100, le=599)
    detail: str = Field(description="What went wrong with this request, in words")
    instance: str = Field(description="The request path")
    request_id: str | None = Field(None, description="Echo of X-Request-ID, for support requests")
    errors: list[FieldProblem] | None = Field(None, description="Each invalid input, for 422 responses")

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "type": "about:blank",
                    "title": "Unprocessable Content",
                    "status": 422,
                    "detail": "1 invalid input",
                    "instance": "/v1/gpus",
                    "request_id": "3f2b8c1e9a7d4e60b1c2d3e4f5a6b7c8",
                    "errors": [{"pointer": "/query/limit", "detail": "Input should be less than or equal to 200"}],
                }
            ]
        }
    )


T = TypeVar("T")


class Page(BaseModel, Generic[T]):
    """One page of a list ordered by slug."""

    items: list[T]
    total: int = Field(ge=0, description="Rows matching the filters, over all pages")
    limit: int = Field(ge=1, le=200)
    offset: int = Field(ge=0)


class Health(BaseModel):
    status: str = Field(description="ok while the process serves requests")

    model_config = schema_examples({"status": "ok"})


class Readiness(BaseModel):
    status: str = Field(description="ready when the database is reachable and at the migration head")
    database: str = Field(description="Backend name")
    migration: str = Field(description="Current Alembic revision (the head)")

    model_config = schema_examples({"status": "ready", "database": "sqlite", "migration": "0001"})
