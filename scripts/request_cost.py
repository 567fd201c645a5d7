"""What one request costs the service, in process: CPU time, worker-thread hand-offs and SQL statements.

Drives the ASGI application directly on one event loop (no client, no sockets, no other traffic), on a
throwaway SQLite database migrated and loaded as `make run` does, with the load test's request bodies
(app.loadtest.ENDPOINTS). Steadier than a load test on a shared machine: it counts the process's own CPU
time. `--profile PATH` prints cProfile's top functions for one endpoint (`--sort cumulative` by what
they call too, `--top N` of them).

    .venv/bin/python scripts/request_cost.py [--requests 1000] [--profile /v1/capacity [--sort cumulative]]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio.to_thread
from sqlalchemy import event

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.loadtest import ENDPOINTS
from app.main import create_app
from app.settings import Settings

counts = {"hand-offs": 0, "statements": 0}
_run_sync = anyio.to_thread.run_sync


async def _counted_run_sync(*args: Any, **kwargs: Any) -> Any:
    counts["hand-offs"] += 1
    return await _run_sync(*args, **kwargs)


anyio.to_thread.run_sync = _counted_run_sync  # every worker-thread hand-off of Starlette and FastAPI


async def call(app: Any, path: str, body: dict[str, Any] | None) -> int:
    data = b"" if body is None else json.dumps(body).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "GET" if body is None else "POST", "scheme": "http", "path": path,
             "raw_path": path.encode(), "query_string": b"", "root_path": "", "state": {},
             "headers": [(b"host", b"bench"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(data)).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    delivered, status = False, []

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": data, "more_body": False}
        await asyncio.Event().wait()  # never disconnects
        raise AssertionError

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])

    await app(scope, receive, send)
    return status[0]


async def measure(app: Any, requests: int, profile: str | None, sort: str = "tottime", top: int = 30) -> None:
    endpoints = [endpoint for endpoint in ENDPOINTS if endpoint.connections > 1 and endpoint.background is None]
    for endpoint in endpoints:
        for _ in range(30):  # warm: caches filled, as in a long-running process
            assert await call(app, endpoint.path, endpoint.body) == 200, endpoint.path
        counts.update({"hand-offs": 0, "statements": 0})
        started = time.process_time()
        for _ in range(requests):
            await call(app, endpoint.path, endpoint.body)
        cpu_ms = (time.process_time() - started) / requests * 1e3
        print(f"{endpoint.path:26} {cpu_ms:6.3f} ms CPU  {counts['hand-offs'] / requests:4.1f} thread hand-offs  "
              f"{counts['statements'] / requests:5.2f} SQL statements  per request")
    if profile is not None:
        body = next(endpoint.body for endpoint in endpoints if endpoint.path == profile)
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(requests):
            await call(app, profile, body)
        profiler.disable()
        pstats.Stats(profiler).sort_stats(sort).print_stats(top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--profile", help="an endpoint path to profile")
    parser.add_argument("--sort", default="tottime", choices=("tottime", "cumulative"),
                        help="order of the profile's functions: own time, or with what they call")
    parser.add_argument("--top", type=int, default=30, help="functions the profile lists")
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{folder}/cost.db"
        env = {**os.environ, "DATABASE_URL": url}
        for command in (["-m", "alembic", "upgrade", "head"], ["-m", "app.load_catalog"]):
            subprocess.run([sys.executable, *command], cwd=ROOT, env=env, check=True, capture_output=True)
        app = create_app(Settings(database_url=url, log_level="warning"))
        event.listen(app.state.engine, "before_cursor_execute",
                     lambda *_: counts.__setitem__("statements", counts["statements"] + 1))
        asyncio.run(measure(app, arguments.requests, arguments.profile, arguments.sort, arguments.top))
        app.state.engine.dispose()


if __name__ == "__main__":
    main()
