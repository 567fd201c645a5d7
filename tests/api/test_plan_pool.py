"""/v1/slo-plan never stalls the other requests of its process: the endpoint is a coroutine that only
awaits, its catalog reads run in a worker thread and the search in the application's bounded pool of
worker processes (structural checks, no timing)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.planning import api as planning_api
from app.planning import service as planning
from app.planning.pool import WORKER_NICENESS, PlanPool
from app.planning.schemas import SloPlanRequest

PLAN = {
    "model": "llama-3.1-8b",
    "workload": {"input_tokens": 1000, "output_tokens": 200, "requests_per_s": 2},
    "slo": {"ttft_ms": 1000, "tpot_ms": 50, "percentile": 95},
    "candidates": {"gpus": ["h100-sxm", "l40s"]},
    "simulated_requests": 500,
}


class RecordingPool(PlanPool):
    def __init__(self, workers: int) -> None:
        super().__init__(workers)
        self.searches: list[str] = []

    def call(self, search: Callable[..., Any], *arguments: Any) -> Any:
        self.searches.append(search.__name__)
        return super().call(search, *arguments)


def test_the_endpoint_only_awaits() -> None:
    assert asyncio.iscoroutinefunction(planning_api.slo_plan)


@pytest.mark.parametrize("deployment", ["aggregated", "both"])
def test_a_search_runs_in_the_bounded_process_pool_and_answers_as_in_process(
        app: FastAPI, client: TestClient, deployment: str) -> None:
    """The answer computed in worker processes is the one computed in this process, field for field;
    with deployment "both", the aggregated and the disaggregated searches each run in the pool."""
    body = {**PLAN, "candidates": {**PLAN["candidates"], "deployment": deployment}}
    pool = RecordingPool(workers=2)
    original, app.state.plan_pool = app.state.plan_pool, pool
    try:
        response = client.post("/v1/slo-plan", json=body)
        assert response.status_code == 200, response.text
        assert pool.searches == (["plan"] if deployment == "aggregated" else ["plan", "plan_disaggregated"])
        assert pool._started()._max_workers == 2  # bounded: a third search at once waits for a worker
    finally:
        app.state.plan_pool = original
        pool.shutdown()
    with app.state.session_factory() as session:
        in_process = planning.plan_slo(session, SloPlanRequest.model_validate(body))
    assert response.json() == json.loads(in_process.model_dump_json())


def test_the_default_pool_size_comes_from_the_settings(app: FastAPI) -> None:
    assert app.state.plan_pool.workers == app.state.settings.plan_workers >= 1


def _own_niceness() -> int:
    return os.nice(0)


def test_the_workers_yield_the_cpu_to_the_serving_processes() -> None:
    """A worker's niceness is the serving process's plus WORKER_NICENESS (10): under contention the
    requests get the CPU first and the searches what is left."""
    pool = PlanPool(workers=1)
    try:
        assert pool.call(_own_niceness) == min(os.nice(0) + WORKER_NICENESS, 19)
    finally:
        pool.shutdown()
