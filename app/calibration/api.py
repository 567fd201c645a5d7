"""/v1/calibrations and /v1/validate: calibration profiles fitted to measurements, and error reports.

Rows come as JSON (`{"rows": [...]}`) or as a CSV upload (`multipart/form-data` with a `file` part in the
measured-calibration.csv schema, other fields as form fields).
"""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Path, Request
from pydantic import BaseModel, ValidationError
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.responses import Response

from app.calibration import service as calibration
from app.calibration.rows import RowsInvalid, rows_from_csv
from app.calibration.schemas import (
    CSV_UPLOAD_DESCRIPTION,
    CalibrationRequest,
    CalibrationResponse,
    ProfileList,
    ProfileOut,
    ValidationRequest,
    ValidationResponse,
)
from app.common import SLUG_PATTERN
from app.errors import Unprocessable, error_message, json_pointer, problem_responses
from app.sizing.calibration.fit import MIN_ROWS_PER_ENTRY
from app.web import (
    CalibrationWriter,
    CatalogRead,
    DeadlineCheck,
    Limit,
    Offset,
    SessionDep,
    SizingRead,
    representation,
)

router = APIRouter(tags=["calibrations"])

ProfilePath = Annotated[str, Path(pattern=SLUG_PATTERN, max_length=64, description="Profile name",
                                  examples=["default"])]
Upload = TypeVar("Upload", ValidationRequest, CalibrationRequest)


def _inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """A model's JSON schema with its `$defs` written in place (an inline request-body schema)."""
    definitions = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return resolve(definitions[node["$ref"].rsplit("/", 1)[-1]])
            return {key: resolve(value) for key, value in node.items()}
        if isinstance(node, list):
            return [resolve(item) for item in node]
        return node

    return resolve(schema)


def _body_docs(model: type[BaseModel], form_fields: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    """OpenAPI request body: the JSON model, or a multipart form with the CSV file."""
    example = model.model_config["json_schema_extra"]["examples"][0]  # type: ignore[index]
    csv_description = CSV_UPLOAD_DESCRIPTION.format(rows=model.max_rows)  # type: ignore[attr-defined]
    form = {"type": "object", "required": ["file", *required],
            "properties": {"file": {"type": "string", "format": "binary", "description": csv_description},
                           **form_fields}}
    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": _inline_refs(model.model_json_schema()), "example": example},
        "multipart/form-data": {"schema": form},
    }}}


def _parse(model: type[Upload], data: dict[str, Any] | bytes) -> Upload:
    try:
        if isinstance(data, bytes):
            return model.model_validate_json(data)
        return model.model_validate(data)
    except ValidationError as exc:
        errors = [(json_pointer(("body", *error["loc"])), error_message(error)) for error in exc.errors()]
        raise Unprocessable(f"{len(errors)} invalid input{'s' if len(errors) > 1 else ''}", errors=errors) from None


async def _read_upload(request: Request, model: type[Upload], form_fields: tuple[str, ...]) -> Upload:
    """The body as `model`: JSON as is; a multipart form's CSV file parsed into rows."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type == "application/json":
        return _parse(model, await request.body())
    if media_type != "multipart/form-data":
        raise Unprocessable("send the rows as application/json or as a CSV file in multipart/form-data",
                            errors=[("/header/content-type", f"unsupported media type {media_type or 'none'!r}")])
    try:
        form = await request.form(max_files=1, max_fields=len(form_fields) + 1)
    except HTTPException as exc:  # Starlette's answer to a form it cannot read (too many parts, broken framing)
        takes = f"one file part and at most the fields {', '.join(form_fields)}"
        raise Unprocessable(f"the multipart form cannot be read: {exc.detail}",
                            errors=[("/body", f"{str(exc.detail).rstrip('.')}; the upload takes {takes}")]) from None
    unknown = [name for name in form if name not in (*form_fields, "file")]
    if unknown:  # as a JSON body's unknown member is
        takes = f"not a field of this upload; it takes file, {', '.join(form_fields)}"
        raise Unprocessable(f"unknown form field{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)}",
                            errors=[(json_pointer(("body", name)), takes) for name in unknown])
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise Unprocessable("the form needs a `file` part with the CSV", errors=[("/body/file", "missing CSV file")])
    try:
        text = (await upload.read()).decode("utf-8-sig")
        rows = rows_from_csv(text, pointer="/body/file", max_rows=model.max_rows)
    except UnicodeDecodeError:
        raise Unprocessable("the CSV is not UTF-8 text", errors=[("/body/file", "not UTF-8")]) from None
    except RowsInvalid as exc:
        raise Unprocessable(str(exc), errors=exc.errors) from None
    fields = {name: value for name in form_fields if isinstance(value := form.get(name), str) and value != ""}
    return _parse(model, {**fields, "rows": rows})


async def validation_upload(request: Request) -> ValidationRequest:
    return await _read_upload(request, ValidationRequest, ("calibration",))


async def calibration_upload(request: Request) -> CalibrationRequest:
    return await _read_upload(request, CalibrationRequest, ("name", "description", "base_profile"))


_NAME_FIELD = {"type": "string", "pattern": SLUG_PATTERN, "maxLength": 64}


@router.get("/v1/calibrations", response_model=ProfileList, summary="List calibration profiles",
            dependencies=[CatalogRead],
            responses=problem_responses(422, 503))
def list_calibrations(session: SessionDep, limit: Limit = 50, offset: Offset = 0) -> ProfileList:
    """The profiles (builtin first, then the stored ones by name), and which one requests use when they
    name none."""
    return calibration.list_profiles(session, limit, offset)


@router.get("/v1/calibrations/{name}", response_model=ProfileOut, summary="Get one calibration profile",
            dependencies=[CatalogRead],
            responses=problem_responses(404, 422, 503))
def get_calibration(session: SessionDep, name: ProfilePath) -> ProfileOut:
    """Its efficiencies per GPU family and compute precision, and how they were fitted."""
    return calibration.read_profile(session, name)


@router.post(
    "/v1/calibrations", status_code=201, response_model=CalibrationResponse, summary="Fit a calibration profile",
    openapi_extra=_body_docs(CalibrationRequest, {
        "name": _NAME_FIELD, "description": {"type": "string", "maxLength": 20_000}, "base_profile": _NAME_FIELD},
        required=("name",)),
    responses={201: {"headers": {"Location": {"description": "URL of the new profile",
                                              "schema": {"type": "string"}}}},
               **problem_responses(400, 401, 403, 404, 409, 413, 422, 503)},
    description=(
        "Fit a named profile to your measurements (rows in the measured-calibration.csv schema, as JSON or a CSV "
        "upload), store it, and return its error on the rows before (the base profile) and after. The fit changes "
        "the efficiencies of each GPU family and compute precision with enough predictable rows "
        f"({MIN_ROWS_PER_ENTRY}: two per fitted parameter), starting from the base profile, which supplies "
        "everything else. Use the profile by naming it in any sizing request's `calibration`. Names are never "
        "reused (409)."),
)
def create_calibration(writer: CalibrationWriter, session: SessionDep, check: DeadlineCheck,
                       body: Annotated[CalibrationRequest, Depends(calibration_upload)]) -> Response:
    """Fit a profile and store it (the route's description says how). Work past the request's deadline
    stops at its next row or fitted entry (`check`)."""
    result = calibration.create_calibration(session, body, written_by=writer.name, check=check)
    return Response(representation(result), status_code=201, media_type="application/json",
                    headers={"Location": f"/v1/calibrations/{result.profile.name}"})


@router.post(
    "/v1/validate", response_model=ValidationResponse, summary="Validate predictions against measurements",
    dependencies=[SizingRead],
    openapi_extra=_body_docs(ValidationRequest, {"calibration": _NAME_FIELD}),
    responses=problem_responses(400, 404, 413, 422, 503),
)
def validate_rows(session: SessionDep, check: DeadlineCheck,
                  body: Annotated[ValidationRequest, Depends(validation_upload)]) -> ValidationResponse:
    """Predict each row under a profile (default: the default profile) and report the errors; nothing is
    stored. Rows that cannot be predicted carry the reason instead of a prediction. A request answered 503 at its
    deadline stops its work at the next row."""
    return calibration.validate_upload(session, body, check=check)
