"""Contract fuzzing: schemathesis generates requests for every operation of the committed spec
(openapi/openapi.json) and sends them through the ASGI application.

Every answer must be a non-5xx with a documented status, content type and schema. Writes carry
a valid key, so the write paths are fuzzed too (on a fresh reference catalog). Deterministic:
Hypothesis derandomized, no example database. The operations that run the SLO planner (its
simulations take up to a second a request) get fewer examples, to keep the run short.
"""

from __future__ import annotations

import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, settings
from schemathesis import Case, checks

from scripts.export_openapi import OUTPUT
from tests.conftest import TEST_API_KEY

CHECKS = [checks.not_a_server_error, checks.response_schema_conformance, checks.status_code_conformance,
          checks.content_type_conformance]
WRITE_HEADERS = {"Authorization": f"Bearer {TEST_API_KEY}"}
PLANNING = r"^/v1/(slo-plan|quotes)"  # each request runs the planner's simulations
FUZZ = settings(derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))


spec = schemathesis.openapi.from_path(OUTPUT)
spec.config.update(base_url="http://testserver")  # the ASGI client's host; nothing goes on the network


def call_and_validate(case: Case, app: FastAPI) -> None:
    """Send the case through the ASGI application (in process) and run the checks."""
    case.operation.schema.app = app  # picks the ASGI transport
    case.call_and_validate(app=app, headers=WRITE_HEADERS, checks=CHECKS)


@spec.exclude(path_regex=PLANNING).parametrize()
@settings(FUZZ, max_examples=25)
def test_every_operation_keeps_the_contract(case: Case, app: FastAPI, fresh_catalog: None) -> None:
    call_and_validate(case, app)


@spec.include(path_regex=PLANNING).parametrize()
@settings(FUZZ, max_examples=5)
def test_planning_operations_keep_the_contract(case: Case, app: FastAPI, fresh_catalog: None) -> None:
    call_and_validate(case, app)
