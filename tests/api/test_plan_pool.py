"""/v1/slo-plan never stalls the other requests of its process: the endpoint is a coroutine that only
awaits, its catalog reads run in a worker thread and the search in the application's bounded pool of
worker processes (structural checks, no timing)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.errors import ServiceUnavailable
from app.main import create_app
from app.planning import api as planning_api
from app.planning import service as planning
from app.planning.pool import WORKER_NICENESS, PlanPool, SearchTimedOut
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

    def call(self, search: Callable[..., Any], *arguments: Any, due: float | None = None) -> Any:
        self.searches.append(search.__name__)
        assert due is not None  # bounded by the request's deadline
        return super().call(search, *arguments, due=due)


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
        assert len(pool._started()) == 2  # bounded: a third search at once waits for an idle worker
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
            executors = application.state.plan_pool._executors
            if prestart:
                assert executors is not None and [len(executor._processes) for executor in executors] == [1, 1]
                for executor in executors:  # the warm-ups ran in live workers
                    assert all(worker.is_alive() for worker in executor._processes.values())
            else:
                assert executors is None


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


def test_a_search_past_the_deadline_is_stopped_with_its_worker_and_a_fresh_one_serves_the_next() -> None:
    """A search that would run 60 s due 1 s from now (its request's deadline): SearchTimedOut, its worker process is
    killed (not left to run for the next search to wait behind), and the next search runs at once in a fresh
    worker, the pool still one worker strong."""
    pool = PlanPool(workers=1)
    try:
        pool.call(_own_niceness)  # the worker is up (starting it is no part of the deadline below)
        [old] = pool._started()
        [process] = old._processes.values()
        with pytest.raises(SearchTimedOut, match="did not finish before the request's deadline"):
            pool.until(time.monotonic() + 1.0)(time.sleep, 60)
        process.join(timeout=10)
        assert not process.is_alive()
        [fresh] = pool._started()
        assert fresh is not old
        assert pool.call(_own_niceness) == min(os.nice(0) + WORKER_NICENESS, 19)
    finally:
        pool.shutdown()


def test_a_search_waiting_for_a_worker_past_its_deadline_never_runs() -> None:
    """Every search of a request is bounded by the request's deadline (`until`): one that is still waiting for the
    only worker when it passes gives up (SearchTimedOut) instead of running after its request's 503; the worker,
    busy meanwhile with another request's search, serves the next one."""
    pool = PlanPool(workers=1)
    try:
        pool.call(_own_niceness)
        busy = threading.Thread(target=pool.call, args=(time.sleep, 2))
        busy.start()
        time.sleep(0.5)  # the sleep runs in the worker
        with pytest.raises(SearchTimedOut, match="no plan worker was free"):
            pool.until(time.monotonic() + 0.2)(_own_niceness)
        busy.join()
        assert pool.call(_own_niceness) == min(os.nice(0) + WORKER_NICENESS, 19)
    finally:
        pool.shutdown()


def test_a_search_that_raises_gives_its_worker_back() -> None:
    """An error in a search reaches its caller; the worker is fine and serves the next search (it had been
    kept out of the pool: two such errors in a pool of two hung every later search)."""
    pool = PlanPool(workers=1)
    try:
        for _ in range(2):
            with pytest.raises(ValueError):
                pool.call(int, "not a number")
        assert pool.call(_own_niceness) == min(os.nice(0) + WORKER_NICENESS, 19)
    finally:
        pool.shutdown()


def test_a_worker_that_dies_during_a_search_is_a_503_and_is_replaced() -> None:
    pool = PlanPool(workers=1)
    try:
        [executor] = pool._started()
        pool.call(_own_niceness)
        [process] = executor._processes.values()
        killer = threading.Timer(0.5, process.kill)
        killer.start()
        with pytest.raises(ServiceUnavailable, match="a plan worker stopped during the search"):
            pool.call(time.sleep, 60)
        assert pool.call(_own_niceness) == min(os.nice(0) + WORKER_NICENESS, 19)
    finally:
        pool.shutdown()


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
