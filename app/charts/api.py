"""Charts as SVG images: /v1/roofline/chart, /v1/roofline/batch-sweep/chart, /v1/slo-plan/chart.

POST takes the JSON endpoint's own body; GET takes its scalar fields (and lists of scalars, repeated)
as query parameters, so a chart can be an `<img src>` or a link. The query parameters are derived
from the request schema itself, flattening the nested objects of /v1/slo-plan, and validated by it:
the bounds and rules are those of the JSON endpoint, and a bad value is a 422 problem whose pointer
names the query parameter.
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Request
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, create_model
from pydantic_core import PydanticUndefined
from starlette.responses import Response

from app.charts import service as charts
from app.errors import NotFound, Unprocessable, error_message, json_pointer, problem_responses
from app.estimates.schemas import AGGREGATED_ROOFLINE_EXAMPLES, BatchSweepRequest, RooflineRequest
from app.planning.schemas import SloPlanRequest
from app.web import KeyFirstRoute, SessionDep, SizingRead, plan_offload

router = APIRouter(tags=["charts"], dependencies=[SizingRead], route_class=KeyFirstRoute)


# Query parameters from a request schema ----------------------------------------------------

def _query_type(annotation: Any) -> Any:
    """The part of a field's type a query string can carry (scalars and lists of scalars), or None.

    `int | LognormalLengths | HistogramLengths` keeps `int`; `X | None` keeps `X`; nested models and
    dicts have no query form."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        base, *metadata = typing.get_args(annotation)
        narrowed = _query_type(base)
        return None if narrowed is None else _annotated(narrowed, metadata)
    if origin in (typing.Union, types.UnionType):
        members = [member for member in map(_query_type, typing.get_args(annotation))
                   if member is not None and member is not type(None)]
        return typing.Union[tuple(members)] if members else None  # noqa: UP007 (a runtime-built union)
    if origin is list:
        (item,) = typing.get_args(annotation)
        item_type = _query_type(item)
        if item_type is None or typing.get_origin(item_type) is list:
            return None  # a list of lists has no query form
        return list[item_type]  # type: ignore[valid-type]
    if origin is dict or (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
        return None
    if annotation is int:
        return QueryInteger
    return annotation


def _decimal_integer(value: Any) -> Any:
    """A query string's integer: digits, an optional sign (not 12.0, " 12" or 1_000, which a lax integer would turn
    into numbers the JSON body refuses; a leading + or 0 is read as the number it writes)."""
    if isinstance(value, str) and not re.fullmatch(r"[+-]?[0-9]+", value):
        raise ValueError("Input should be a valid integer")
    return value


DECIMAL_INTEGER = BeforeValidator(_decimal_integer)
QueryInteger = Annotated[int, DECIMAL_INTEGER]


def _annotated(base: Any, metadata: Sequence[Any]) -> Any:
    """`base` with a field's constraints; a query integer's check of its text outside them, so that they stay the
    integer's own (minimum and maximum in the schema)."""
    if base is QueryInteger:
        return Annotated[(int, *metadata, DECIMAL_INTEGER)]  # type: ignore[valid-type]
    return Annotated[(base, *metadata)] if metadata else base  # type: ignore[valid-type]


def _without_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


def _model_class(annotation: Any) -> type[BaseModel]:
    """The model class of a nested field typed `Model` or `Model | None`."""
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    raise TypeError(f"{annotation!r} is not a nested model")


@dataclass(frozen=True)
class QueryForm:
    """The query-parameter form of a JSON request schema: every scalar field of the schema and of the
    nested objects named in `nested`, flat (their names must not clash)."""

    request_model: type[BaseModel]
    parameters: type[BaseModel]  # the query parameters, for FastAPI
    parents: dict[str, str | None]  # query parameter -> the nested object it belongs to (None: top level)

    @classmethod
    def of(cls, request_model: type[BaseModel], *, nested: Sequence[str] = (), required: Sequence[str] = (),
           examples: dict[str, Any] | None = None, extra: dict[str, Any] | None = None,
           omitted: Sequence[str] = ()) -> QueryForm:
        """`required`: parameters the query form cannot do without (the slugs: there is no inline
        spec in a query string). `examples`: one value per parameter, for Swagger UI's "Try it out".
        `extra`: parameters of the chart itself, not of the request. `omitted`: fields the chart does
        not take (their defaults apply)."""
        examples = examples or {}
        fields: dict[str, Any] = dict(extra or {})
        parents: dict[str, str | None] = {}
        sources: list[tuple[str | None, type[BaseModel], bool]] = [(None, request_model, True)]
        for parent in nested:
            info = request_model.model_fields[parent]
            sources.append((parent, _model_class(info.annotation), info.is_required()))
        for parent, model, parent_required in sources:
            for name, info in model.model_fields.items():
                annotation = _query_type(info.annotation)
                if annotation is None or (parent is None and (name in nested or name in omitted)):
                    continue
                if name in fields:
                    raise ValueError(f"query parameter {name!r} would be ambiguous")
                if name in required or (info.is_required() and parent_required):
                    default: Any = ...
                else:
                    default = None if info.default is PydanticUndefined else info.default
                typed = _annotated(annotation, info.metadata)
                example = [examples[name]] if name in examples else info.examples
                # A parameter left out is not null: the JSON endpoint's default applies, so show none.
                schema_extra = _without_default if default is None else None
                fields[name] = (typed, Field(default, description=info.description, examples=example,
                                             json_schema_extra=schema_extra))
                parents[name] = parent
        parameters = create_model(f"{request_model.__name__}Query", __config__=ConfigDict(extra="forbid", allow_inf_nan=False),
                                  **fields)
        return cls(request_model, parameters, parents)

    def request(self, query: BaseModel) -> Any:
        """The JSON request the given parameters stand for, validated by its schema; parameters not
        given are left out, so the schema's own defaults apply."""
        body: dict[str, Any] = {}
        for name in sorted(query.model_fields_set & self.parents.keys()):
            parent = self.parents[name]
            target = body if parent is None else body.setdefault(parent, {})
            target[name] = getattr(query, name)
        try:
            return self.request_model.model_validate(body)
        except ValidationError as exc:
            errors = [(self.pointer(error["loc"]), error_message(error)) for error in exc.errors()]
            noun = "input" if len(errors) == 1 else "inputs"
            raise Unprocessable(f"{len(errors)} invalid {noun}", errors=errors) from None

    def pointer(self, location: Sequence[Any]) -> str:
        """A location in the JSON request as a pointer to the query parameter that carries it."""
        location = list(location)
        if len(location) > 1 and location[0] not in self.parents and location[1] in self.parents:
            location = location[1:]  # a nested object's field is a top-level parameter
        if not location or location[0] not in self.parents:
            return "/query"  # the request as a whole (e.g. a rule across several parameters)
        return json_pointer(["query", *location])

    @contextmanager
    def query_pointers(self) -> Iterator[None]:
        """Services name fields by their place in the JSON body (a bad value's 422, an unknown slug's or
        calibration profile's 404); point at the query parameters instead."""
        try:
            yield
        except (Unprocessable, NotFound) as exc:
            exc.errors = [(self.pointer(_body_location(pointer)) if pointer.startswith("/body") else pointer,
                           text) for pointer, text in exc.errors]
            raise


def _body_location(pointer: str) -> list[str]:
    parts = pointer.split("/")[2:]  # "", "body", ...
    return [part.replace("~1", "/").replace("~0", "~") for part in parts]


# Routes ------------------------------------------------------------------------------------

SVG_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "The chart, an 800 x 500 SVG image",
          "content": {charts.SVG_MEDIA_TYPE: {"schema": {"type": "string"}}}},
    **problem_responses(404, 413, 422, 503),
}
METRIC_DESCRIPTION = "Latency on the x axis: TPOT or TTFT, at the SLO's percentile"
PlanMetricQuery = Annotated[charts.PlanMetric, Query(description=METRIC_DESCRIPTION)]

ROOFLINE_QUERY = QueryForm.of(RooflineRequest, required=("model", "gpu"), omitted=("deployment",), examples={
    "model": "llama-3-8b", "gpu": "h100-sxm", "phase": "decode", "context_tokens": 1024})
BATCH_SWEEP_QUERY = QueryForm.of(BatchSweepRequest, required=("model", "gpu"), examples={
    "model": "llama-3-8b", "gpu": "h100-sxm", "context_tokens": 128})
SLO_PLAN_QUERY = QueryForm.of(
    SloPlanRequest, nested=("workload", "slo", "candidates", "speculative", "ha_policy"), required=("model",),
    examples={"model": "llama-3.1-8b", "input_tokens": 1000, "output_tokens": 250, "requests_per_s": 5,
              "ttft_ms": 1000, "tpot_ms": 50, "gpus": ["h100-sxm", "l40s"], "simulated_requests": 500},
    extra={"metric": (charts.PlanMetric, Field("tpot", description=METRIC_DESCRIPTION))})
RooflineQuery = ROOFLINE_QUERY.parameters
BatchSweepQuery = BATCH_SWEEP_QUERY.parameters
SloPlanQuery = SLO_PLAN_QUERY.parameters


def svg(image: bytes) -> Response:
    return Response(image, media_type=charts.SVG_MEDIA_TYPE)


ROOFLINE_DESCRIPTION = (
    "Log-log roofline of one GPU of the tensor-parallel group at the compute dtype: the HBM bandwidth "
    "slope, the compute roof and the ridge point between them, with the request's prefill and decode "
    "steps at their arithmetic intensity and the FLOP/s their expected step time achieves (from "
    "/v1/roofline). The request describes one phase; the other is its companion: a prefill of p tokens "
    "after c cached is followed by decode at c + p tokens, and a decode at c tokens follows the prefill "
    "of a c-token prompt. One GPU's roofline: a disaggregated deployment's pools are drawn one at a time, each "
    "pool's layout as an aggregated request (the POST body's deployment is aggregated; the query form has no "
    "deployment). The query form takes catalog slugs only; inline specs need the POST body.")
BATCH_SWEEP_DESCRIPTION = (
    "Aggregate and per-user decode tokens/s against batch size (log scale), ideal and expected, from "
    "/v1/roofline/batch-sweep; the knee where decode turns compute-bound is marked, and batches whose "
    "weights and KV cache exceed one GPU's memory are shaded.")
SLO_PLAN_DESCRIPTION = (
    "Cost per hour of each plan from /v1/slo-plan against its TPOT (or TTFT, `metric=ttft`) at the SLO "
    "percentile; the Pareto plans (cost against E2E) highlighted and labelled, the SLO target as a line. "
    "The query form takes the workload, SLO, candidate and HA fields flat (fixed token lengths only; "
    "distributions and per-GPU prices need the POST body).")


@router.get("/v1/roofline/chart", response_class=Response, responses=SVG_RESPONSES,
            summary="Roofline chart (SVG), from query parameters", description=ROOFLINE_DESCRIPTION)
def roofline_chart_get(session: SessionDep,
                       query: Annotated[RooflineQuery, Query()]) -> Response:  # type: ignore[valid-type]
    with ROOFLINE_QUERY.query_pointers():
        return svg(charts.roofline_chart(session, ROOFLINE_QUERY.request(query)))


@router.post("/v1/roofline/chart", response_class=Response, responses=SVG_RESPONSES,
             summary="Roofline chart (SVG), from the /v1/roofline body", description=ROOFLINE_DESCRIPTION)
def roofline_chart_post(session: SessionDep, body: Annotated[RooflineRequest, Body(openapi_examples={
        f"example {number}": {"value": example}
        for number, example in enumerate(AGGREGATED_ROOFLINE_EXAMPLES, 1)})]) -> Response:
    return svg(charts.roofline_chart(session, body))


@router.get("/v1/roofline/batch-sweep/chart", response_class=Response, responses=SVG_RESPONSES,
            summary="Batching chart (SVG), from query parameters", description=BATCH_SWEEP_DESCRIPTION)
def batch_sweep_chart_get(session: SessionDep,
                          query: Annotated[BatchSweepQuery, Query()]) -> Response:  # type: ignore[valid-type]
    with BATCH_SWEEP_QUERY.query_pointers():
        return svg(charts.batch_sweep_chart(session, BATCH_SWEEP_QUERY.request(query)))


@router.post("/v1/roofline/batch-sweep/chart", response_class=Response, responses=SVG_RESPONSES,
             summary="Batching chart (SVG), from the /v1/roofline/batch-sweep body",
             description=BATCH_SWEEP_DESCRIPTION)
def batch_sweep_chart_post(session: SessionDep, body: BatchSweepRequest) -> Response:
    return svg(charts.batch_sweep_chart(session, body))


@router.get("/v1/slo-plan/chart", response_class=Response, responses=SVG_RESPONSES,
            summary="Plan frontier chart (SVG), from query parameters", description=SLO_PLAN_DESCRIPTION)
def slo_plan_chart_get(request: Request, session: SessionDep,
                       query: Annotated[SloPlanQuery, Query()]) -> Response:  # type: ignore[valid-type]
    with SLO_PLAN_QUERY.query_pointers():
        return svg(charts.slo_plan_chart(session, SLO_PLAN_QUERY.request(query), query.metric,
                                         offload=plan_offload(request)))


@router.post("/v1/slo-plan/chart", response_class=Response, responses=SVG_RESPONSES,
             summary="Plan frontier chart (SVG), from the /v1/slo-plan body",
             description=SLO_PLAN_DESCRIPTION)
def slo_plan_chart_post(request: Request, session: SessionDep, body: SloPlanRequest,
                        metric: PlanMetricQuery = "tpot") -> Response:
    return svg(charts.slo_plan_chart(session, body, metric, offload=plan_offload(request)))
