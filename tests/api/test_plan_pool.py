"""/v1/slo-plan never stalls the other requests of its process: the endpoint is a coroutine that only
awaits, its catalog reads run in a worker thread and the search in the application's bounded pool of
worker processes (structural checks, no timing)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.planning import api as planning_api
from app.planning import service as planning
from app.planning.pool import PlanPool
from app.planning.schemas import SloPlanRequest
from app.sizing.serving import plan as plan_core

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
        self.searches: list[int] = []

    def run(self, inputs: plan_core.PlanInputs,
            candidates: Sequence[plan_core.Configuration]) -> plan_core.PlanResult:
        self.searches.append(len(candidates))
        return super().run(inputs, candidates)


def test_the_endpoint_only_awaits() -> None:
    assert asyncio.iscoroutinefunction(planning_api.slo_plan)


def test_a_search_runs_in_the_bounded_process_pool_and_answers_as_in_process(app: FastAPI, client: TestClient) -> None:
    """The answer computed in a worker process is the one computed in this process, byte for byte."""
    pool = RecordingPool(workers=2)
    original, app.state.plan_pool = app.state.plan_pool, pool
    try:
        response = client.post("/v1/slo-plan", json=PLAN)
        assert response.status_code == 200, response.text
        assert len(pool.searches) == 1 and pool.searches[0] > 0
        executor = pool._started()
        assert executor._max_workers == 2  # bounded: a third search waits for a worker
    finally:
        app.state.plan_pool = original
        pool.shutdown()
    with app.state.session_factory() as session:
        in_process = planning.plan_slo(session, SloPlanRequest.model_validate(PLAN))
    assert response.json() == json.loads(in_process.model_dump_json())


def test_the_default_pool_size_comes_from_the_settings(app: FastAPI) -> None:
    assert app.state.plan_pool.workers == app.state.settings.plan_workers >= 1
