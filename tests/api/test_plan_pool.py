"""/v1/slo-plan never stalls the other requests of its process: the endpoint is a coroutine that only
awaits, its catalog reads run in a worker thread and the search in the application's bounded pool of
worker processes (structural checks, no timing)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.main import create_app
from app.planning import api as planning_api
from app.planning import service as planning
from app.planning.pool import WORKER_NICENESS, PlanPool
from app.planning.schemas import SloPlanRequest
from app.settings import Settings

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


def test_the_workers_start_with_the_application_when_prestarted(settings: Settings) -> None:
    """With PLAN_WORKERS_PRESTART (the default) the application's startup starts every worker, each importing
    the planner; without it none starts until the first search (structural: no timing)."""
    assert Settings.model_fields["plan_workers_prestart"].default is True
    for prestart in (True, False):
        application = create_app(settings.model_copy(update={"plan_workers": 2, "plan_workers_prestart": prestart}))
        with TestClient(application):
            executor = application.state.plan_pool._executor
            if prestart:
                assert executor is not None and len(executor._processes) == 2
                for worker in list(executor._processes.values()):  # the warm-ups ran in live workers
                    assert worker.is_alive()
            else:
                assert executor is None


def test_a_warm_up_imports_the_module_in_the_worker() -> None:
    """`prestart`'s task imports the module it names in each worker, and a search after it finds it loaded.
    (Shown with `wave`, which nothing here imports: the planner's module comes with this test module, which
    the worker imports to run `_loaded`.) A worker started by a search alone has not loaded it."""
    for prestart in (True, False):
        pool = PlanPool(workers=1)
        try:
            if prestart:
                pool.prestart("wave")
            assert pool.call(_loaded, "wave") is prestart
        finally:
            pool.shutdown()


def _loaded(module: str) -> bool:
    return module in sys.modules


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
