"""`python -m app.loadtest` (the second table of `make bench`): the service under real HTTP load.

Starts the service itself, twice: one uvicorn process on a throwaway SQLite database, then
`POSTGRES_WORKERS` uvicorn processes, each with its own socket on one port (SO_REUSEPORT, so the
kernel spreads the connections; see NAGLE_NOTE), on a throwaway PostgreSQL database (created and
dropped through `PG_ADMIN_URL`, as `make test` does; skipped with a note when PostgreSQL is not
usable). Each run migrates, loads the reference catalog, waits for /readyz, and drives every
endpoint on loopback, after an unmeasured warm-up, for `DURATION_S` seconds with wrk (a Lua
script sends the POST body), or with locust headless when wrk is not installed. The table gives
requests/s, p50 and p99 latency, each endpoint's throughput as a ratio of /healthz in the same
run, the CPU time the service spent per request (steadier than the rates when other programs
compete for the cores), and the targets.

Targets: /v1/kv-cache, /v1/roofline and /v1/capacity at >= 70 % of the baseline's requests/s with a
p99 within 2x the baseline's, at 32 connections; a whole-catalog /v1/slo-plan (every catalog GPU, the
default candidates) for a dense 70B, an MoE and a windowed model with p50 <= 150 ms, one request at a
time (a plan is CPU-bound: 32 at once on one process would measure the queue, not the plan); and
/v1/kv-cache's p99 under 50 ms while `BACKGROUND_PLANS` whole-catalog plans run at once on the same
service (plans run in worker processes and must not stall other requests).
The load generator runs on the same machine and shares its CPU cores with the service: the
header says how many there are. A benchmark, not a test: nothing here fails on a missed target.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil  # installed with locust (dev dependency)
import uvicorn
from uvicorn.config import Config

ROOT = Path(__file__).resolve().parents[1]
CONNECTIONS = 32
DURATION_S = 5
POSTGRES_WORKERS = 2
PG_ADMIN_URL = os.environ.get("PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
READY_TIMEOUT_S = 60
WARM_UP_S = 1
BASELINE = "/healthz"


BACKGROUND_PLANS = 4


@dataclass(frozen=True, slots=True)
class Endpoint:
    path: str
    body: dict[str, Any] | None  # None: GET
    connections: int = CONNECTIONS
    min_ratio: float | None = None  # of the baseline's requests/s
    max_p50_ms: float | None = None
    max_p99_ms: float | None = None
    max_p99_to_baseline: float | None = None  # of the baseline's p99
    label: str = ""  # what the row measures, when the path alone does not say
    # Requests sent meanwhile, each by its own client in a loop (not measured): (body, clients) to `path`.
    background: tuple[str, dict[str, Any], int] | None = None

    @property
    def name(self) -> str:
        return self.path + (f" ({self.label})" if self.label else "")


def whole_catalog_plan(model: str) -> dict[str, Any]:
    """The issue example's workload and SLO over every catalog GPU with the default candidates."""
    return {"model": model, "workload": {"input_tokens": 1000, "output_tokens": 500, "requests_per_s": 5},
            "slo": {"ttft_ms": 1000, "tpot_ms": 50, "percentile": 95}}


# A dense 70B, an MoE and a model with sliding-window layers.
PLAN_MODELS = ("llama-3.1-70b", "mixtral-8x7b", "gemma-2-27b")
KV_CACHE_BODY = {"model": "llama-3-70b", "context_tokens": 8192, "batch_size": 32}


ENDPOINTS = (
    Endpoint(BASELINE, None),
    Endpoint("/v1/kv-cache", KV_CACHE_BODY, min_ratio=0.7, max_p99_to_baseline=2),
    Endpoint("/v1/roofline", {"model": "llama-3-8b", "gpu": "h100-sxm", "phase": "decode", "batch_size": 1,
                              "context_tokens": 1024}, min_ratio=0.7, max_p99_to_baseline=2),
    Endpoint("/v1/roofline/batch-sweep", {"model": "llama-3-8b", "gpu": "h100-sxm", "context_tokens": 1024}),
    Endpoint("/v1/capacity", {"model": "llama-3.1-8b", "gpu": "h100-sxm", "engine": "vllm",
                              "input_tokens": 1000, "output_tokens": 500}, min_ratio=0.7, max_p99_to_baseline=2),
    *(Endpoint("/v1/slo-plan", whole_catalog_plan(model), connections=1, max_p50_ms=150,
               label=f"{model}, whole catalog") for model in PLAN_MODELS),
    # A few clients, so that the latency is the request's own plus any stall, not a queue of 32.
    Endpoint("/v1/kv-cache", KV_CACHE_BODY, connections=4, max_p99_ms=50, label=f"while {BACKGROUND_PLANS} plans run",
             background=("/v1/slo-plan", whole_catalog_plan(PLAN_MODELS[0]), BACKGROUND_PLANS)),
)


@dataclass(frozen=True, slots=True)
class LoadResult:
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int  # non-2xx answers, timeouts and socket errors


@dataclass(frozen=True, slots=True)
class Measurement:
    load: LoadResult
    # CPU time the service's processes spent per request: what a request costs, whatever else
    # (the load generator, other programs) competes for the cores.
    server_cpu_ms_per_request: float


LoadGenerator = Callable[[str, Endpoint, float], LoadResult]


# Load generators ---------------------------------------------------------------------------

WRK_SCRIPT = """\
wrk.method = "{method}"
wrk.body = {body}
wrk.headers["Content-Type"] = "application/json"
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("LOADTEST %d %d %d %d %d\\n", summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(99), e.connect + e.read + e.write + e.status + e.timeout))
end
"""


def wrk_load(base_url: str, endpoint: Endpoint, seconds: float) -> LoadResult:
    body = "nil" if endpoint.body is None else "[==[" + json.dumps(endpoint.body) + "]==]"
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(WRK_SCRIPT.format(method="GET" if endpoint.body is None else "POST", body=body))
    try:
        output = subprocess.run(
            ["wrk", f"-t{min(2, endpoint.connections)}", f"-c{endpoint.connections}", f"-d{seconds:g}s",
             "--timeout", "10s", "-s", script.name, base_url + endpoint.path],
            capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(script.name)
    line = next(line for line in output.splitlines() if line.startswith("LOADTEST "))
    requests, duration_us, p50_us, p99_us, errors = (int(value) for value in line.split()[1:])
    return LoadResult(requests / (duration_us / 1e6), p50_us / 1e3, p99_us / 1e3, errors)


LOCUSTFILE = """\
import os
from locust import FastHttpUser, task

PATH, BODY = os.environ["LOADTEST_PATH"], os.environ.get("LOADTEST_BODY")


class Client(FastHttpUser):
    @task
    def call(self):
        if BODY is None:
            self.client.get(PATH)
        else:
            self.client.post(PATH, data=BODY, headers={"Content-Type": "application/json"})
"""


def locust_load(base_url: str, endpoint: Endpoint, seconds: float) -> LoadResult:
    with tempfile.TemporaryDirectory() as folder:
        locustfile = Path(folder) / "locustfile.py"
        locustfile.write_text(LOCUSTFILE)
        env = {**os.environ, "LOADTEST_PATH": endpoint.path}
        if endpoint.body is not None:
            env["LOADTEST_BODY"] = json.dumps(endpoint.body)
        users = str(endpoint.connections)
        subprocess.run([sys.executable, "-m", "locust", "-f", str(locustfile), "--headless", "--only-summary",
                        "-u", users, "-r", users, "-t", f"{seconds:g}s", "--host", base_url,
                        "--csv", str(Path(folder) / "load"), "--loglevel", "ERROR"],
                       env=env, capture_output=True, check=False)
        with open(Path(folder) / "load_stats.csv", newline="") as stats:
            row = next(row for row in csv.DictReader(stats) if row["Name"] == "Aggregated")
    return LoadResult(_locust_number(row["Requests/s"]), _locust_number(row["50%"]), _locust_number(row["99%"]),
                      int(row["Failure Count"]))


def _locust_number(cell: str) -> float:
    """A locust statistic; "N/A" (no request finished, as in a warm-up shorter than locust's start-up) is NaN."""
    return math.nan if cell == "N/A" else float(cell)


def pick_load_generator() -> tuple[str, LoadGenerator]:
    if shutil.which("wrk"):
        return "wrk", wrk_load
    return "locust (headless; wrk is not installed: `apt-get install -y wrk`)", locust_load


# The service under test --------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def prepare_database(database_url: str) -> None:
    """`alembic upgrade head`, then the reference catalog, as an operator would."""
    env = {**os.environ, "DATABASE_URL": database_url}
    for command in (["-m", "alembic", "upgrade", "head"], ["-m", "app.load_catalog"]):
        subprocess.run([sys.executable, *command], cwd=ROOT, env=env, check=True, capture_output=True)


def _status(url: str, body: dict[str, Any] | None = None) -> int:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except OSError:
        return 0


NAGLE_NOTE = ("Several workers: N uvicorn processes, each with its own listening socket on the port "
              "(SO_REUSEPORT), so the kernel spreads the connections over them; `uvicorn --workers N` shares "
              "one socket, and the keep-alive connections of a run then land on whichever worker accepts "
              "first (measured: 33/0, 13/29 and 34/8 of 32 on two workers), so a run measured that split, not "
              "the service. Each socket has TCP_NODELAY (asyncio only sets it on sockets it creates with "
              "proto=IPPROTO_TCP; without it every response waits ~40 ms for the client's delayed ACK).")


def _serve_one(port: int) -> None:
    """One uvicorn process on its own listening socket of `port` (SO_REUSEPORT, TCP_NODELAY)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    listener.bind(("127.0.0.1", port))
    config = Config("app.main:create_app", factory=True, access_log=False, log_level="warning")
    uvicorn.Server(config).run(sockets=[listener])


def serve_workers(port: int, workers: int) -> None:
    """`workers` uvicorn processes sharing the port through SO_REUSEPORT (see NAGLE_NOTE); stops them when
    terminated."""
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=_serve_one, args=(port,)) for _ in range(workers)]
    for process in processes:
        process.start()

    def stop(signum: int, frame: object) -> None:
        for process in processes:
            process.terminate()

    signal.signal(signal.SIGTERM, stop)
    for process in processes:
        process.join()


@dataclass(frozen=True, slots=True)
class Service:
    base_url: str
    pid: int

    def cpu_seconds(self) -> float:
        """User + system CPU time of the server and its worker processes so far."""
        server = psutil.Process(self.pid)
        return sum(sum(process.cpu_times()[:2]) for process in (server, *server.children(recursive=True)))


@contextmanager
def serve(database_url: str, workers: int) -> Iterator[Service]:
    """uvicorn (LOG_LEVEL info, as deployed) on a free loopback port, once ready: the `uvicorn`
    command for one process, `serve_workers` for several."""
    port = free_port()
    env = {**os.environ, "DATABASE_URL": database_url, "LOG_LEVEL": "info"}
    command = (["-m", "uvicorn", "--factory", "app.main:create_app", "--host", "127.0.0.1", "--port", str(port),
                "--no-access-log", "--log-level", "warning"] if workers == 1
               else ["-m", "app.loadtest", "--serve-workers", str(workers), "--port", str(port)])
    server = subprocess.Popen([sys.executable, *command], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while _status(base_url + "/readyz") != 200:
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the service did not become ready on {base_url}")
            time.sleep(0.2)
        yield Service(base_url, server.pid)
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@contextmanager
def sqlite_database() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as folder:
        yield f"sqlite:///{folder}/loadtest.db"


@contextmanager
def postgres_database() -> Iterator[str]:
    """A throwaway database on PG_ADMIN_URL's server (scripts/pgdb.py, as `make test-postgres`)."""
    name = f"sizing_load_{os.getpid()}"
    pgdb = [sys.executable, str(ROOT / "scripts" / "pgdb.py")]
    created = subprocess.run([*pgdb, "create", PG_ADMIN_URL, name], check=False, capture_output=True, text=True)
    if created.returncode != 0:
        raise RuntimeError(created.stderr.strip() or "cannot create the database")
    server_url = "postgresql+psycopg://" + PG_ADMIN_URL.split("://", 1)[1].rsplit("/", 1)[0]
    try:
        yield f"{server_url}/{name}"
    finally:
        subprocess.run([*pgdb, "drop", PG_ADMIN_URL, name], check=False, capture_output=True)


# The table ---------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Row:
    run: str
    endpoint: Endpoint
    measured: Measurement | None  # None: the endpoint did not answer 200 to the probe
    status: int
    baseline: LoadResult | None

    @property
    def baseline_requests_per_s(self) -> float | None:
        return None if self.baseline is None else self.baseline.requests_per_s

    @property
    def result(self) -> LoadResult | None:
        return None if self.measured is None else self.measured.load

    @property
    def ratio(self) -> float | None:
        """Requests/s against the baseline's, for rows loaded alike (same connections, nothing else running)."""
        if self.endpoint.connections != CONNECTIONS or self.endpoint.background is not None:
            return None
        if self.result is None or not self.baseline_requests_per_s:
            return None
        return self.result.requests_per_s / self.baseline_requests_per_s

    def verdict(self) -> str:
        if self.endpoint.path == BASELINE:
            return "baseline"
        if self.result is None:
            return f"not measured: the probe got HTTP {self.status or 'no answer'}"
        endpoint, result, checks = self.endpoint, self.result, []
        if result.requests_per_s == 0:
            return "not measured: no request completed within the run"
        if endpoint.min_ratio is not None:
            checks.append((f"ratio >= {endpoint.min_ratio:.2f}", (self.ratio or 0.0) >= endpoint.min_ratio))
        if endpoint.max_p50_ms is not None:
            checks.append((f"p50 <= {endpoint.max_p50_ms:g} ms", result.p50_ms <= endpoint.max_p50_ms))
        if endpoint.max_p99_ms is not None:
            checks.append((f"p99 < {endpoint.max_p99_ms:g} ms", result.p99_ms < endpoint.max_p99_ms))
        if endpoint.max_p99_to_baseline is not None and self.baseline is not None:
            limit = endpoint.max_p99_to_baseline
            checks.append((f"p99 <= {limit:g}x baseline's", result.p99_ms <= limit * self.baseline.p99_ms))
        return ", ".join(f"{text} {'met' if met else 'MISSED'}" for text, met in checks) or "-"


def measure(service: Service, endpoint: Endpoint, generate: LoadGenerator, seconds: float) -> Measurement:
    cpu_before = service.cpu_seconds()
    load = generate(service.base_url, endpoint, seconds)
    requests = max(1.0, load.requests_per_s * seconds)
    return Measurement(load, (service.cpu_seconds() - cpu_before) / requests * 1e3)


@contextmanager
def background_load(base_url: str, endpoint: Endpoint) -> Iterator[None]:
    """The endpoint's background requests, each client in a loop on its own thread, until the block ends."""
    if endpoint.background is None:
        yield
        return
    path, body, clients = endpoint.background
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            _status(base_url + path, body)

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(WARM_UP_S)  # every client's first plan under way
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join()


def load_run(run: str, service: Service, generate: LoadGenerator, seconds: float) -> list[Row]:
    rows: list[Row] = []
    baseline: LoadResult | None = None
    for endpoint in ENDPOINTS:
        status = _status(service.base_url + endpoint.path, endpoint.body)
        measured = None
        if status == 200:
            with background_load(service.base_url, endpoint):
                # An unmeasured burst first: every worker process opens its database connections and
                # fills its caches, as a long-running service has.
                generate(service.base_url, endpoint, WARM_UP_S)
                measured = measure(service, endpoint, generate, seconds)
        if endpoint.path == BASELINE and measured is not None:
            baseline = measured.load
        rows.append(Row(run, endpoint, measured, status, baseline))
    return rows


def format_table(rows: list[Row]) -> str:
    header = ("run", "endpoint", "conns", "req/s", "ratio", "p50 ms", "p99 ms", "errors", "cpu ms/req", "targets")
    cells = [header]
    for row in rows:
        result, measured = row.result, row.measured
        cells.append((row.run, row.endpoint.name, str(row.endpoint.connections),
                      _rate(result.requests_per_s) if result else "-",
                      f"{row.ratio:.2f}" if row.ratio is not None else "-",
                      f"{result.p50_ms:.1f}" if result else "-", f"{result.p99_ms:.1f}" if result else "-",
                      str(result.errors) if result else "-",
                      # (with background plans, the service's CPU is mostly theirs)
                      f"{measured.server_cpu_ms_per_request:.2f}" if measured and not row.endpoint.background
                      else "-", row.verdict()))
    widths = [max(len(line[column]) for line in cells) for column in range(len(header))]
    numeric = {2, 3, 4, 5, 6, 7, 8}
    return "\n".join("  ".join(cell.rjust(width) if column in numeric else cell.ljust(width)
                               for column, (cell, width) in enumerate(zip(line, widths, strict=True))).rstrip()
                     for line in cells)


def _rate(requests_per_s: float) -> str:
    return f"{requests_per_s:.0f}" if requests_per_s >= 10 else f"{requests_per_s:.2f}"


def run_load_tests(seconds: float = DURATION_S) -> str:
    """Both runs, as a printable report (header, table, notes)."""
    name, generate = pick_load_generator()
    lines = [(f"Load: {name} on loopback, {seconds:g} s per endpoint; the load generator shares the "
              f"machine's {os.cpu_count()} CPU cores with the service.")]
    rows: list[Row] = []
    with sqlite_database() as database_url:
        prepare_database(database_url)
        with serve(database_url, workers=1) as service:
            rows += load_run("1 process, SQLite", service, generate, seconds)
    try:
        with postgres_database() as database_url:
            prepare_database(database_url)
            with serve(database_url, workers=POSTGRES_WORKERS) as service:
                rows += load_run(f"{POSTGRES_WORKERS} workers, PostgreSQL", service, generate, seconds)
    except RuntimeError as exc:
        lines.append(f"PostgreSQL run skipped: {exc}")
    lines.append(format_table(rows))
    if any(row.run != rows[0].run for row in rows):
        lines.append(NAGLE_NOTE)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description="Load-test the service (or, internally, serve it with workers)")
    parser.add_argument("--seconds", type=float, default=DURATION_S, help="load per endpoint")
    parser.add_argument("--serve-workers", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.serve_workers:
        serve_workers(arguments.port, arguments.serve_workers)
    else:
        print(run_load_tests(arguments.seconds))


if __name__ == "__main__":
    main()
