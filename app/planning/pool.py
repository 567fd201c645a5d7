"""The planner's worker processes: a search is up to a second of CPU, so it runs outside the serving
process, a bounded number at a time, and never holds the event loop (nor the interpreter lock) that
every other request of the process needs.

`PlanPool.call(search, *arguments)` runs a search (`plan_core.plan`, `plan_disaggregated`) in a worker:
the function and its arguments are pickled to it, the result back. The workers start on first use, or when
the application starts (`prestart`, PLAN_WORKERS_PRESTART), spawned: a fresh interpreter, not a fork of a
threaded server; a search beyond `workers` waits for one to be free. Each worker keeps the core's caches
(step-time models) from search to search.

The workers run at a lower CPU priority (`WORKER_NICENESS`): a search takes whatever CPU the serving
processes leave, and when the cores are busy the scheduler gives the requests first call, so a burst of
plans does not stretch every other request's latency (it stretches the plans instead).
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

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


class PlanPool:
    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._lock = threading.Lock()
        self._executor: ProcessPoolExecutor | None = None

    def call(self, search: Callable[..., ResultT], *arguments: Any) -> ResultT:
        """`search(*arguments)` in a worker process (blocks the calling thread until it is done)."""
        executor = self._started()
        try:
            return executor.submit(search, *arguments).result()
        except BrokenProcessPool:
            self._discard(executor)  # a worker died (killed, out of memory): the next search starts anew
            raise

    def prestart(self, module: str) -> None:
        """Start every worker now, each importing `module` (the searches' code), so that the first searches of
        the process do not wait for fresh interpreters to start and import it. Returns at once: the workers
        start in the background, and a search submitted meanwhile queues behind a warm-up, never fails by it."""
        executor = self._started()
        for _ in range(self.workers):  # each submission with no idle worker starts one
            executor.submit(_import, module)

    def _started(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                                     initializer=_lower_priority)
            return self._executor

    def _discard(self, executor: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._executor is executor:
                self._executor = None
        executor.shutdown(wait=False, cancel_futures=True)

    def shutdown(self) -> None:
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
