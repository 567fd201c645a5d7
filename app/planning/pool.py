"""The planner's worker processes: a search is up to a second of CPU, so it runs outside the serving
process, a bounded number at a time, and never holds the event loop (nor the interpreter lock) that
every other request of the process needs.

`PlanPool.call(search, *arguments)` runs a search (`plan_core.plan`, `plan_disaggregated`) in an idle worker:
the function and its arguments are pickled to it, the result back. No search outlives its request
(`PlanPool.until`, `app.web.plan_offload`): one still waiting for a worker at the request's deadline never starts,
and one still running is stopped with its worker, which a fresh one replaces. The workers start on first use, or when
the application starts (`prestart`, PLAN_WORKERS_PRESTART), spawned: a fresh interpreter, not a fork of a
threaded server; a search beyond `workers` waits for one to be free. Each worker keeps the core's caches
(step-time models) from search to search.

The workers run at a lower CPU priority (`WORKER_NICENESS`): a search takes whatever CPU the serving
processes leave, and when the cores are busy the scheduler gives the requests first call, so a burst of
plans does not stretch every other request's latency (it stretches the plans instead).
"""

from __future__ import annotations

import functools
import importlib
import multiprocessing
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from app.errors import ServiceUnavailable

ResultT = TypeVar("ResultT")

# Added to the workers' niceness (Linux CFS: each step of nice is about 1.25x less CPU share under
# contention, so 10 is about 9x): requests first, searches with what is left.
WORKER_NICENESS = 10


def _import(module: str) -> None:
    """A worker's warm-up (`PlanPool.prestart`): import the module its searches run."""
    importlib.import_module(module)


def _lower_priority() -> None:
    """Pool initializer: this worker yields the CPU to the serving processes when both want it."""
    if hasattr(os, "nice"):
        os.nice(WORKER_NICENESS)


class SearchTimedOut(ServiceUnavailable):
    """A search that could not finish before its request's deadline: it never started (no worker was free in
    time), or it was stopped with its worker, which a fresh one replaced."""


class PlanPool:
    """`workers` worker processes, each its own one-process executor, so that a search still running at its
    request's deadline is stopped by stopping its worker alone, and a fresh one takes its place: a search never
    outlives its request (`call`'s `due`)."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._lock = threading.Lock()
        self._executors: list[ProcessPoolExecutor] | None = None
        self._idle: queue.Queue[ProcessPoolExecutor] = queue.Queue()

    def call(self, search: Callable[..., ResultT], *arguments: Any, due: float | None = None) -> ResultT:
        """`search(*arguments)` in an idle worker process (blocks the calling thread until one is free and the
        search is done), by `due` (a `time.monotonic()` instant: the request's deadline; None: unbounded).
        SearchTimedOut when no worker was free in time or the search ran past it; a 503 when a worker died during
        the search (killed, out of memory: a fresh one replaces it)."""
        self._started()
        try:
            executor = self._idle.get(timeout=_remaining(due))
        except queue.Empty:
            raise SearchTimedOut("no plan worker was free before the request's deadline; retry later",
                                 headers=RETRY) from None
        replaced = False
        try:
            return executor.submit(search, *arguments).result(timeout=_remaining(due))
        except FuturesTimeout:
            self._replace(executor)  # stops the search: it would outlive its request
            replaced = True
            raise SearchTimedOut("the search did not finish before the request's deadline; its worker was "
                                 "stopped", headers=RETRY) from None
        except BrokenProcessPool:
            self._replace(executor)
            replaced = True
            raise ServiceUnavailable("a plan worker stopped during the search (killed, or out of memory); retry",
                                     headers=RETRY) from None
        finally:
            if not replaced:  # done, or the search raised: the worker is fine
                self._idle.put(executor)

    def until(self, due: float | None) -> Callable[..., Any]:
        """`call` with every search of one request bounded by that request's deadline (`due`)."""
        return functools.partial(self.call, due=due)

    def prestart(self, module: str) -> None:
        """Start every worker now, each importing `module` (the searches' code), so that the first searches of
        the process do not wait for fresh interpreters to start and import it. Returns at once: the workers
        start in the background, and a search submitted meanwhile queues behind a warm-up, never fails by it."""
        for executor in self._started():
            executor.submit(_import, module)

    def _started(self) -> list[ProcessPoolExecutor]:
        with self._lock:
            if self._executors is None:
                self._executors = [self._new_executor() for _ in range(self.workers)]
                for executor in self._executors:
                    self._idle.put(executor)
            return list(self._executors)

    @staticmethod
    def _new_executor() -> ProcessPoolExecutor:
        return ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=_lower_priority)

    def _replace(self, executor: ProcessPoolExecutor) -> None:
        """Stop `executor`'s worker (whatever it runs) and put a fresh executor in its place."""
        _stop(executor)
        with self._lock:
            if self._executors is None or executor not in self._executors:
                return  # shut down meanwhile
            fresh = self._new_executor()
            self._executors[self._executors.index(executor)] = fresh
        self._idle.put(fresh)

    def shutdown(self) -> None:
        """Stop every worker: a search still running belongs to a request already answered (503)."""
        with self._lock:
            executors, self._executors = self._executors or [], None
            self._idle = queue.Queue()
        for executor in executors:
            _stop(executor)


RETRY = {"Retry-After": "5"}


def _remaining(due: float | None) -> float | None:
    return None if due is None else max(due - time.monotonic(), 0.0)


def _stop(executor: ProcessPoolExecutor) -> None:
    """Kill the executor's worker process, whatever it runs, and release the executor. ProcessPoolExecutor stops only
    idle workers before Python 3.14 (which adds kill_workers); a killed worker's executor shuts down at once."""
    for process in list(getattr(executor, "_processes", {}).values()):
        process.kill()
    executor.shutdown(wait=True, cancel_futures=True)
