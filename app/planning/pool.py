"""The planner's worker processes: a search is up to a second of CPU, so it runs outside the serving
process, a bounded number at a time, and never holds the event loop (nor the interpreter lock) that
every other request of the process needs.

`PlanPool.call(search, *arguments)` runs a search (`plan_core.plan`, `plan_disaggregated`) in an idle worker:
the function and its arguments are pickled to it, the result back. A search that outlives the request deadline
(whose request has been answered 503 by then) is stopped with its worker, which a fresh one replaces. The workers start on first use, or when
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
import queue
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
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


class SearchTimedOut(RuntimeError):
    """A search outlived the request's deadline; its worker was stopped and replaced."""


class PlanPool:
    """`workers` worker processes, each its own one-process executor, so that a search that outlives the request's
    deadline (`deadline_s`: the request has been answered 503 by then) is stopped by stopping its worker alone,
    and a fresh one takes its place: a runaway search never holds a worker that later searches wait for."""

    def __init__(self, workers: int, deadline_s: float | None = None) -> None:
        self.workers = workers
        self.deadline_s = deadline_s
        self._lock = threading.Lock()
        self._executors: list[ProcessPoolExecutor] | None = None
        self._idle: queue.Queue[ProcessPoolExecutor] = queue.Queue()

    def call(self, search: Callable[..., ResultT], *arguments: Any) -> ResultT:
        """`search(*arguments)` in an idle worker process (blocks the calling thread until one is free and the
        search is done); SearchTimedOut after `deadline_s`."""
        self._started()
        executor = self._idle.get()
        try:
            result = executor.submit(search, *arguments).result(timeout=self.deadline_s)
        except FuturesTimeout:
            self._replace(executor)  # stops the runaway search; a fresh worker takes its place
            raise SearchTimedOut(f"the search did not finish within {self.deadline_s:g} s; its worker was "
                                 "stopped") from None
        except BrokenProcessPool:
            self._replace(executor)  # a worker died (killed, out of memory): the next search starts anew
            raise
        self._idle.put(executor)
        return result

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
        # ProcessPoolExecutor stops an idle worker only (Python 3.14 adds kill_workers): its process is killed.
        for process in list(getattr(executor, "_processes", {}).values()):
            process.kill()
        executor.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            if self._executors is None or executor not in self._executors:
                return  # shut down meanwhile
            fresh = self._new_executor()
            self._executors[self._executors.index(executor)] = fresh
        self._idle.put(fresh)

    def shutdown(self) -> None:
        with self._lock:
            executors, self._executors = self._executors or [], None
            self._idle = queue.Queue()
        for executor in executors:
            executor.shutdown(wait=True, cancel_futures=True)
