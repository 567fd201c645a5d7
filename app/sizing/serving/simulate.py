"""Discrete-event simulation of an iteration-level continuous-batching scheduler (vLLM-style).

One engine iteration ("step") runs every admitted request forward together; its duration comes from
a caller-supplied `StepTimeFn` (the roofline model, a calibrated fit, or a constant in tests). The
scheduler reproduces the engine behaviour that decides latency under load:

- Chunked prefill (vLLM V1): each step carries every running decode (one token each), then prompt
  chunks FCFS (partially prefilled requests first, then newly admitted ones) up to
  `max_num_batched_tokens` tokens in all. A request's first token comes out of the step that
  completes its prompt. With `chunked_prefill=False` (vLLM V0, SGLang): when a waiting request can
  be admitted the step prefills whole prompts only and the decodes pause for it; otherwise the step
  is decode-only.
- Admission, FCFS with head-of-line blocking: the oldest waiting request enters when a sequence
  slot is free (`max_num_seqs`), the step has token budget left, and the KV cache has free blocks:
  for its prompt (`"on_demand"`, vLLM) or for its prompt plus its whole answer (`"full"`,
  TensorRT-LLM's default reservation).
- KV in blocks of `block_size` tokens. On demand, a decoding request takes a new block whenever its
  last one is full; when a step cannot get the blocks it needs, the most recently admitted running
  request is preempted (blocks freed, back to the front of the queue; when readmitted it recomputes
  its prompt plus the tokens generated so far, which produces its next token). "full" never
  preempts.
- Prefix cache: a request's `cached_prefix_tokens` skip prefill compute but are attended. The
  shared prefix (`Requests.shared_prefix_tokens`) occupies ceil(P/block_size) blocks once, pinned
  for the whole run; each request holds blocks for its own tokens only (context minus its share of
  the shared prefix). Other cached tokens (e.g. earlier turns of the same conversation) count as
  the request's own KV.
- Livelock guard: a request whose prompt plus answer cannot fit in the KV cache on its own would be
  preempted forever; `simulate` rejects it up front with `KvCapacityError` (nothing is simulated).
- Closed loop: all users send their first request at t = 0 (not staggered) and each sends its next
  request the instant the previous one finishes (zero think time).

Speed: the scheduler keeps aggregate state (decoding count, sum of their contexts, a heap of finish
steps, decoders per KV-block phase), so a step costs O(1) plus O(log n) per event. Between events
(an arrival, a finish, a KV block shortage) the decode steps have a known composition — batch B
with contexts growing by B per step — so a run of them is timed with one vectorized `step_time`
call and a cumulative sum (jump ahead), or in closed form when the step-time function offers
`decode_run` (the step-time model does: between kinks its decode steps sum as an arithmetic series).

Measurement: the first `warmup_fraction` of requests (in arrival order, 10% by default) are left
out of percentiles and goodput; rates are measured over the window from the first measured
request's arrival to the last arrival (while the offered load is on, before the drain), or to the
last finish when every request arrives at once.

Longer than 600 lines because the scheduler's event loop and its vectorised fast path must stay
side by side: the fast path is only valid while it reproduces the loop step for step.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, replace
from typing import Literal, Protocol

import numpy as np

from app.sizing.serving.workload import Requests, Workload, sample_requests

ON_DEMAND = "on_demand"
FULL = "full"
KV_RESERVATIONS = (ON_DEMAND, FULL)

MAX_REQUESTS = 1_000_000  # per simulate() call
MAX_STEPS = 50_000_000  # engine iterations per call: ~25 hours of simulated 2 ms steps
DEFAULT_WARMUP_FRACTION = 0.1

# Jump-ahead tuning. A run of this many decode steps or more is timed with one vectorized call; shorter
# runs step by step on Python numbers. The step-time model answers a scalar step in ~3.5 us and a short
# array in ~20 us (numpy overhead dominates), so below ~8 steps scalar calls are cheaper: measured
# 106 -> 72 ms for the 2,000-request bench simulation. Windows are capped so the arrays stay small.
_VECTOR_MIN_STEPS = 8
_MAX_WINDOW_STEPS = 65_536

METRICS = ("ttft", "tpot", "e2e")


class StepTimeFn(Protocol):
    """Expected seconds of ONE engine iteration.

    `decode_seqs` sequences each decode one token, with `decode_context_tokens` cached tokens summed
    over them; plus `prefill_tokens` prompt tokens prefilled this step whose attention spans
    `prefill_context_tokens` positions in all (sum over those tokens of positions attended, cached
    prefix included). Takes Python numbers, or same-shape numpy arrays (vectorized, one step per
    element), and returns a float or an array of that shape. It must be a pure function: runs of
    decode steps are timed ahead, possibly past the next event, and the extra values are discarded.
    """

    def __call__(self, decode_seqs, decode_context_tokens, prefill_tokens, prefill_context_tokens): ...


class KvCapacityError(ValueError):
    """A request cannot be served: it does not fit in the KV cache even alone."""


class SimulationLimitError(RuntimeError):
    """The simulation hit its work cap (MAX_STEPS / MAX_REQUESTS)."""


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Engine scheduler limits. Defaults are vLLM's for smaller GPUs (SIZING.md section 7)."""

    kv_capacity_tokens: int
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    chunked_prefill: bool = True
    kv_tokens_reserved_per_request: Literal["on_demand", "full"] = ON_DEMAND

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError("block_size must be >= 1")
        if self.kv_capacity_tokens < self.block_size:
            raise ValueError("kv_capacity_tokens must hold at least one block")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.max_num_batched_tokens < self.max_num_seqs:
            # vLLM refuses the same: every running sequence must be able to decode in one step.
            raise ValueError("max_num_batched_tokens must be >= max_num_seqs")
        if self.kv_tokens_reserved_per_request not in KV_RESERVATIONS:
            raise ValueError(f"kv_tokens_reserved_per_request must be one of {KV_RESERVATIONS}")

    @property
    def kv_blocks(self) -> int:
        return self.kv_capacity_tokens // self.block_size


@dataclass(frozen=True, slots=True)
class Goodput:
    """Requests meeting every SLO: their share, and the rate they are served at."""

    fraction: float
    requests_per_s: float
    output_tokens_per_s: float


@dataclass(frozen=True, slots=True)
class SimulationResult:
    """Per-request timings (arrival order) and whole-run counters.

    TPOT is (E2E − TTFT)/(OSL − 1): the mean gap between tokens after the first; NaN when OSL = 1.
    `trace_time_s`/`trace_output_tokens` are the cumulative output tokens at step-event boundaries,
    interpolated linearly in between to measure throughput over a window.
    """

    arrival_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    ttft_s: np.ndarray
    tpot_s: np.ndarray
    e2e_s: np.ndarray
    preemptions: int
    steps: int
    sim_time_s: float  # simulated clock when the last request finished
    makespan_s: float  # last finish − first arrival
    warmup_fraction: float
    trace_time_s: np.ndarray
    trace_output_tokens: np.ndarray

    @property
    def warmup_requests(self) -> int:
        """How many of the earliest requests percentiles and goodput leave out."""
        return int(self.warmup_fraction * len(self.arrival_s))

    @property
    def measurement_window_s(self) -> tuple[float, float]:
        start = float(self.arrival_s[self.warmup_requests])
        end = float(self.arrival_s[-1])
        if end <= start:  # everything arrived at once (offline batch): measure to the last finish
            end = float(self.finish_s.max())
        return start, end

    def percentile(self, metric: str, q: float) -> float:
        """q-th percentile (0..100) of "ttft", "tpot" or "e2e" in seconds, over measured requests.

        TPOT leaves out one-token answers (no gap to measure).
        """
        if metric not in METRICS:
            raise ValueError(f"metric must be one of {METRICS}")
        if not 0 <= q <= 100:
            raise ValueError("q is a percentile in [0, 100]")
        values = getattr(self, f"{metric}_s")[self.warmup_requests:]
        values = values[~np.isnan(values)]
        return float(np.percentile(values, q)) if len(values) else math.nan

    @property
    def output_tokens_per_s(self) -> float:
        """Output tokens per second produced during the measurement window (all requests)."""
        start, end = self.measurement_window_s
        produced = np.interp([start, end], self.trace_time_s, self.trace_output_tokens)
        return float(produced[1] - produced[0]) / (end - start)

    @property
    def requests_per_s(self) -> float:
        """Requests finishing per second during the measurement window."""
        start, end = self.measurement_window_s
        finished = np.count_nonzero((self.finish_s > start) & (self.finish_s <= end))
        return finished / (end - start)

    @property
    def mean_concurrency(self) -> float:
        """Time-average number of requests in the system (queued or running) over the window."""
        start, end = self.measurement_window_s
        overlap = np.minimum(self.finish_s, end) - np.maximum(self.arrival_s, start)
        return float(np.clip(overlap, 0, None).sum()) / (end - start)

    def goodput(self, ttft_s: float, tpot_s: float, e2e_s: float | None = None) -> Goodput:
        """Share of measured requests meeting every SLO, and that share of the served rates.

        A one-token answer meets any TPOT SLO (it has no inter-token gap).
        """
        skip = self.warmup_requests
        tpot = self.tpot_s[skip:]
        meets = (self.ttft_s[skip:] <= ttft_s) & (np.isnan(tpot) | (tpot <= tpot_s))
        if e2e_s is not None:
            meets &= self.e2e_s[skip:] <= e2e_s
        fraction = float(meets.mean())
        tokens = self.output_tokens[skip:]
        token_share = float(tokens[meets].sum()) / float(tokens.sum())
        return Goodput(fraction, fraction * self.requests_per_s, token_share * self.output_tokens_per_s)


def simulate(step_time: StepTimeFn, config: SchedulerConfig, requests: Requests | None = None, *,
             workload: Workload | None = None, closed_loop_users: int | None = None,
             num_requests: int = 2000, seed: int = 0,
             warmup_fraction: float = DEFAULT_WARMUP_FRACTION) -> SimulationResult:
    """Run the scheduler over `requests`, or over `num_requests` drawn from `workload` with `seed`.

    Closed loop when `closed_loop_users` is given or the workload has `concurrent_users`: request
    arrival times are then set by the simulation (the given ones are ignored).
    Raises KvCapacityError for a request that cannot fit in the KV cache alone, ValueError for a
    prompt longer than max_num_batched_tokens without chunked prefill, SimulationLimitError past
    MAX_REQUESTS / MAX_STEPS.
    """
    if (requests is None) == (workload is None):
        raise ValueError("give either requests or a workload")
    if requests is None:
        requests = sample_requests(workload, num_requests, seed)
        if workload.concurrent_users is not None and closed_loop_users is None:
            closed_loop_users = workload.concurrent_users
    if not 0 <= warmup_fraction < 1:
        raise ValueError("warmup_fraction must be in [0, 1)")
    n = len(requests)
    if n < 1:
        raise ValueError("nothing to simulate: no requests")
    if n > MAX_REQUESTS:
        raise SimulationLimitError(f"{n} requests exceed the cap of {MAX_REQUESTS} per simulation")
    if closed_loop_users is not None and closed_loop_users < 1:
        raise ValueError("closed_loop_users must be >= 1")
    if closed_loop_users is None and np.isnan(requests.arrival_s[0]):
        raise ValueError("these requests have no arrival times (closed loop): give closed_loop_users")
    _check_servable(requests, config)

    scheduler = _Scheduler(step_time, config, requests, closed_loop_users)
    scheduler.run()
    return scheduler.result(warmup_fraction)


def micro_batch_config(config: SchedulerConfig, schedulers: int) -> SchedulerConfig:
    """One of `schedulers` micro-batch schedulers of a pipeline: its share of the KV blocks (whole blocks)
    and of `max_num_seqs` (rounded up), the same per-step token budget."""
    if schedulers < 1:
        raise ValueError("schedulers must be >= 1")
    if schedulers == 1:
        return config
    return replace(config, kv_capacity_tokens=config.kv_blocks // schedulers * config.block_size,
                   max_num_seqs=-(-config.max_num_seqs // schedulers))


def simulate_pipeline(step_time: StepTimeFn, config: SchedulerConfig, requests: Requests, pipeline_parallel: int,
                      *, closed_loop_users: int | None = None,
                      warmup_fraction: float = DEFAULT_WARMUP_FRACTION) -> SimulationResult:
    """A pipeline of `pipeline_parallel` stages with as many micro-batches in flight.

    `step_time` is one micro-batch's trip through every stage, hand-offs included (`perf.py` with pp > 1):
    what a token waits for, so TTFT and TPOT pay every stage. While one micro-batch is in stage s the others
    are in the other stages, so in steady state each stage serves the pp micro-batches in turn and every
    micro-batch steps once per trip: pp schedulers run side by side (vLLM V0 runs one scheduler per
    "virtual engine"; V1 keeps pp batches in flight from one). Each gets 1/pp of the KV blocks and of
    `max_num_seqs` (`micro_batch_config`) and the requests in turn, in arrival order (closed loop: the
    users in turn). Their first steps are not staggered by a stage: the first requests' TTFT comes out up
    to one trip shorter than a real pipeline's fill. Results are merged in arrival order.
    """
    if pipeline_parallel < 1:
        raise ValueError("pipeline_parallel must be >= 1")
    if pipeline_parallel == 1:
        return simulate(step_time, config, requests, closed_loop_users=closed_loop_users,
                        warmup_fraction=warmup_fraction)
    share = micro_batch_config(config, pipeline_parallel)
    runs = []
    for index in range(min(pipeline_parallel, len(requests))):
        users = None
        if closed_loop_users is not None:
            users = closed_loop_users // pipeline_parallel + (index < closed_loop_users % pipeline_parallel)
            if users == 0:
                continue
        runs.append(simulate(step_time, share, _every(requests, index, pipeline_parallel), closed_loop_users=users,
                             warmup_fraction=warmup_fraction))
    return _merged(runs, warmup_fraction)


def _every(requests: Requests, start: int, step: int) -> Requests:
    picked = slice(start, None, step)
    return replace(requests, arrival_s=requests.arrival_s[picked], input_tokens=requests.input_tokens[picked],
                   output_tokens=requests.output_tokens[picked],
                   cached_prefix_tokens=requests.cached_prefix_tokens[picked])


def _merged(runs: list[SimulationResult], warmup_fraction: float) -> SimulationResult:
    """Side-by-side runs as one: requests in arrival order, output tokens summed over time."""
    names = ("arrival_s", "first_token_s", "finish_s", "input_tokens", "output_tokens", "ttft_s", "tpot_s", "e2e_s")
    joined = {name: np.concatenate([getattr(run, name) for run in runs]) for name in names}
    order = np.argsort(joined["arrival_s"], kind="stable")
    arrays = {name: values[order] for name, values in joined.items()}
    times = np.unique(np.concatenate([run.trace_time_s for run in runs]))
    tokens = sum(np.interp(times, run.trace_time_s, run.trace_output_tokens) for run in runs)
    arrays |= {"trace_time_s": times, "trace_output_tokens": np.asarray(tokens, dtype=np.float64)}
    for array in arrays.values():
        array.setflags(write=False)
    return SimulationResult(
        **arrays, preemptions=sum(run.preemptions for run in runs), steps=sum(run.steps for run in runs),
        sim_time_s=max(run.sim_time_s for run in runs),
        makespan_s=float(arrays["finish_s"].max() - arrays["arrival_s"].min()), warmup_fraction=warmup_fraction)


def _shared_tokens(requests: Requests) -> np.ndarray:
    """Each request's share of the one stored shared prefix."""
    return np.minimum(requests.shared_prefix_tokens, requests.cached_prefix_tokens)


def _pinned_blocks(requests: Requests, block_size: int) -> int:
    """Blocks the shared prefix keeps for the whole run (none when no request uses it)."""
    if requests.shared_prefix_tokens and np.any(_shared_tokens(requests) > 0):
        return -(-requests.shared_prefix_tokens // block_size)
    return 0


def _check_servable(requests: Requests, config: SchedulerConfig) -> None:
    """Reject up front what would never finish (the livelock guard)."""
    bs = config.block_size
    usable_blocks = config.kv_blocks - _pinned_blocks(requests, bs)
    if usable_blocks < 1:
        raise KvCapacityError(
            f"the shared prefix of {requests.shared_prefix_tokens} tokens fills the KV cache "
            f"({config.kv_blocks} blocks of {bs} tokens)")
    # Most KV a request can hold: its prompt and its whole answer, less its share of the shared prefix.
    own_tokens = requests.input_tokens + requests.output_tokens - _shared_tokens(requests)
    own_blocks = -(-own_tokens // bs)
    worst = int(np.argmax(own_blocks))
    if own_blocks[worst] > usable_blocks:
        raise KvCapacityError(
            f"request {worst} ({requests.input_tokens[worst]} prompt + {requests.output_tokens[worst]} "
            f"output tokens) needs {own_blocks[worst]} KV blocks of {bs} tokens, but the cache has "
            f"{usable_blocks}: it could never finish; lower the lengths or add KV capacity")
    if not config.chunked_prefill:
        # Without chunking a prompt is prefilled in one step; after a preemption the prompt to
        # recompute includes the answer so far.
        longest = requests.input_tokens.copy()
        if config.kv_tokens_reserved_per_request == ON_DEMAND:
            longest += requests.output_tokens - 1
        worst = int(np.argmax(longest))
        if longest[worst] > config.max_num_batched_tokens:
            raise ValueError(
                f"request {worst} needs a {longest[worst]}-token prefill in one step, above "
                f"max_num_batched_tokens {config.max_num_batched_tokens}; enable chunked prefill or "
                f"raise the limit")


# Request states
_PENDING, _WAITING, _PREFILLING, _DECODING, _DONE = range(5)


class _Scheduler:
    """The simulation state and loop. Per-request state lives in Python lists (fast scalar access).

    Decode bookkeeping is lazy: a decoding request joined at decode step `ds0` with `c0` tokens
    cached and `g0` generated; at decode step ds it has c0 + (ds − ds0) cached and has produced
    g0 + (ds − ds0) tokens. `ds` counts steps that carry decodes (every step with chunked prefill).
    """

    # Slots: the loop reads and writes these attributes a few dozen times per event (measured: the
    # scheduler's own time about 15% lower than with an instance dict).
    __slots__ = ("arrival", "block_size", "c0", "cached", "chunked", "closed_loop", "decode_context",
                 "decode_run", "decoders_by_phase", "decoding", "done", "ds", "ds0", "finish", "finish_heap",
                 "finish_step", "first_token", "free_blocks", "generated", "held", "input", "issued",
                 "last_step_s", "max_num_seqs", "n", "next_arrival", "on_demand", "output", "phase",
                 "position", "preemptions", "prefilling", "prompt", "running", "shared", "state", "step_time",
                 "steps", "t", "token_budget", "tokens_out", "trace_time", "trace_tokens", "waiting")

    def __init__(self, step_time: StepTimeFn, config: SchedulerConfig, requests: Requests,
                 closed_loop_users: int | None) -> None:
        self.step_time = step_time
        # A step-time model may time a run of decode steps in closed form (StepTimeModel.decode_run).
        self.decode_run = getattr(step_time, "decode_run", None)
        self.block_size = config.block_size
        self.max_num_seqs = config.max_num_seqs
        self.token_budget = config.max_num_batched_tokens
        self.chunked = config.chunked_prefill
        self.on_demand = config.kv_tokens_reserved_per_request == ON_DEMAND
        self.closed_loop = closed_loop_users is not None

        n = len(requests)
        self.n = n
        self.input = requests.input_tokens.tolist()
        self.output = requests.output_tokens.tolist()
        self.cached = requests.cached_prefix_tokens.tolist()
        self.shared = _shared_tokens(requests).tolist()
        if self.closed_loop:  # the users' first requests at t = 0, the rest sent as these finish
            self.issued = min(closed_loop_users, n)
            self.arrival = [0.0] * self.issued + [math.inf] * (n - self.issued)
        else:
            self.issued = n
            self.arrival = requests.arrival_s.tolist()

        self.state = [_PENDING] * n
        self.prompt = list(self.input)  # tokens to have in KV when the (re)prefill completes
        self.position = list(self.cached)  # prompt tokens in KV so far
        self.generated = [0] * n
        self.held = [0] * n  # blocks held while prefilling (on demand) or reserved (full)
        self.c0 = [0] * n
        self.ds0 = [0] * n
        self.phase = [0] * n
        self.finish_step = [0] * n
        self.first_token = [math.nan] * n
        self.finish = [math.nan] * n

        self.t = 0.0
        self.steps = 0
        self.ds = 0
        self.free_blocks = config.kv_blocks - _pinned_blocks(requests, config.block_size)
        self.next_arrival = 0  # index of the next request not yet in the system
        self.waiting: deque[int] = deque()
        self.running: dict[int, None] = {}  # admission order; the last key is the newest
        self.prefilling: list[int] = []  # running requests with prompt left, admission order
        self.decoding = 0
        self.decode_context = 0  # cached tokens summed over decoding requests
        self.decoders_by_phase = [0] * config.block_size  # on demand: who needs a block when
        self.finish_heap: list[tuple[int, int]] = []  # (decode step of last token, request)
        self.done = 0
        self.preemptions = 0
        self.tokens_out = 0
        self.last_step_s = 0.0
        self.trace_time = [0.0]
        self.trace_tokens = [0]

    # The loop -------------------------------------------------------------------------------

    def run(self) -> None:
        # Names that never change bound once: this loop turns two to three times per request.
        arrival, waiting, state, n, chunked = self.arrival, self.waiting, self.state, self.n, self.chunked
        max_num_seqs, token_budget, running = self.max_num_seqs, self.token_budget, self.running
        trace_time, trace_tokens = self.trace_time.append, self.trace_tokens.append
        while self.done < n:
            next_arrival, t = self.next_arrival, self.t
            while next_arrival < n and arrival[next_arrival] <= t:
                waiting.append(next_arrival)
                state[next_arrival] = _WAITING
                next_arrival += 1
            self.next_arrival = next_arrival
            if self.steps >= MAX_STEPS:
                raise SimulationLimitError(
                    f"simulation passed {MAX_STEPS} engine steps with {n - self.done} requests "
                    f"unfinished; simulate fewer requests")
            # The oldest waiting request can enter now: a free sequence slot, token budget left after the
            # decodes (chunked prefill), and KV blocks for it.
            head_admissible = (bool(waiting) and len(running) < max_num_seqs
                               and not (chunked and self.decoding >= token_budget)
                               and self._admission_blocks(waiting[0]) <= self.free_blocks)
            if self.prefilling or head_admissible:
                self._step(with_decodes=chunked or not head_admissible)
            elif self.decoding:
                self._jump()
            elif next_arrival < n:  # idle until the next arrival
                self.t = max(t, arrival[next_arrival])
                continue
            else:  # cannot happen after _check_servable; fail loudly rather than spin
                raise RuntimeError("scheduler stalled with requests waiting and nothing running")
            trace_time(self.t)
            trace_tokens(self.tokens_out)

    def _admission_blocks(self, j: int) -> int:
        own = (self.prompt[j] if self.on_demand else self.input[j] + self.output[j]) - self.shared[j]
        return -(-own // self.block_size)

    def _decoder_blocks(self, j: int) -> int:
        """Blocks a decoding request holds at the current decode step."""
        if not self.on_demand:
            return self.held[j]
        return -(-(self.c0[j] - self.shared[j] + self.ds - self.ds0[j]) // self.block_size)

    # One step -------------------------------------------------------------------------------

    def _step(self, with_decodes: bool) -> None:
        preempted = False
        if with_decodes and self.on_demand and self.decoding:
            phase_now = -self.ds % self.block_size
            need = self.decoders_by_phase[phase_now]
            while need > self.free_blocks:
                victim = next(reversed(self.running))
                if self.state[victim] == _DECODING and self.phase[victim] == phase_now:
                    need -= 1
                self._preempt(victim)
                preempted = True
            self.free_blocks -= need  # running decodes get their blocks before any admission
        decodes = self.decoding if with_decodes else 0
        budget = self.token_budget - decodes
        prefill_tokens = prefill_context = 0
        completed: list[int] = []

        position, prompt = self.position, self.prompt
        for j in self.prefilling:
            if budget <= 0:
                break
            chunk = min(prompt[j] - position[j], budget)
            prefill_tokens += chunk
            prefill_context += chunk * position[j] + chunk * (chunk + 1) // 2
            position[j] += chunk
            budget -= chunk
            if position[j] == prompt[j]:
                completed.append(j)
        if completed:
            self.prefilling = [j for j in self.prefilling if position[j] < prompt[j]]

        if not preempted and (self.chunked or not with_decodes):
            waiting, running, chunked, max_num_seqs = self.waiting, self.running, self.chunked, self.max_num_seqs
            while waiting and budget > 0 and len(running) < max_num_seqs:
                j = waiting[0]
                blocks = self._admission_blocks(j)
                at = position[j]
                remaining = prompt[j] - at
                if blocks > self.free_blocks or (not chunked and remaining > budget):
                    break
                waiting.popleft()
                running[j] = None
                self.free_blocks -= blocks
                self.held[j] = blocks
                chunk = remaining if remaining < budget else budget  # noqa: FURB136 (min(), as a call, costs more)
                prefill_tokens += chunk
                prefill_context += chunk * at + chunk * (chunk + 1) // 2
                at = position[j] = at + chunk
                budget -= chunk
                if at == prompt[j]:
                    completed.append(j)
                else:
                    self.state[j] = _PREFILLING
                    self.prefilling.append(j)

        context = self.decode_context if decodes else 0
        dt = float(self.step_time(decodes, context, prefill_tokens, prefill_context))
        if not 0 < dt < math.inf:
            raise ValueError(f"step_time must return a positive finite time, got {dt}")
        self.last_step_s = dt
        self.t += dt
        self.steps += 1
        if decodes:
            self._advance_decodes(1)
        self.tokens_out += len(completed)
        for j in completed:
            self._prefill_done(j)

    def _preempt(self, j: int) -> None:
        """Free a running request's KV and put it back at the front of the queue."""
        if self.state[j] == _DECODING:
            self.generated[j] += self.ds - self.ds0[j]
            self._stop_decoding(j)
        else:
            self.prefilling.remove(j)
            self.free_blocks += self.held[j]
        del self.running[j]
        self.prompt[j] = self.input[j] + self.generated[j]
        self.position[j] = self.cached[j]
        self.state[j] = _WAITING
        self.waiting.appendleft(j)
        self.preemptions += 1

    def _stop_decoding(self, j: int) -> None:
        self.free_blocks += self._decoder_blocks(j)
        self.decoding -= 1
        self.decode_context -= self.c0[j] + self.ds - self.ds0[j]
        if self.on_demand:
            self.decoders_by_phase[self.phase[j]] -= 1

    def _prefill_done(self, j: int) -> None:
        """The step that completed j's prompt produced its next token."""
        generated = self.generated[j] = self.generated[j] + 1
        if math.isnan(self.first_token[j]):
            self.first_token[j] = self.t
        if generated == self.output[j]:
            self.free_blocks += self.held[j]
            self._finish(j)
            return
        ds, prompt = self.ds, self.prompt[j]
        self.state[j] = _DECODING
        self.c0[j] = prompt
        self.ds0[j] = ds
        self.decoding += 1
        self.decode_context += prompt
        if self.on_demand:
            phase = (prompt - self.shared[j] - ds) % self.block_size
            self.phase[j] = phase
            self.decoders_by_phase[phase] += 1
        last = ds + self.output[j] - generated - 1
        self.finish_step[j] = last
        heapq.heappush(self.finish_heap, (last, j))

    def _finish(self, j: int) -> None:
        self.state[j] = _DONE
        del self.running[j]
        self.finish[j] = self.t
        self.done += 1
        if self.closed_loop and self.issued < self.n:  # the user sends the next request now
            self.arrival[self.issued] = self.t
            self.issued += 1

    def _advance_decodes(self, steps: int) -> None:
        """Account `steps` decode steps just run (clock and KV blocks already advanced), then finish
        who is done."""
        ds = self.ds = self.ds + steps
        produced = self.decoding * steps
        self.decode_context += produced
        self.tokens_out += produced
        heap, state, finish_step = self.finish_heap, self.state, self.finish_step
        while heap and heap[0][0] < ds:
            last, j = heapq.heappop(heap)
            if state[j] == _DECODING and finish_step[j] == last:
                self.generated[j] = self.output[j]
                self._stop_decoding(j)
                self._finish(j)

    def _blocks_needed(self, steps: int) -> int:
        """New KV blocks the decoders take over the next `steps` decode steps (on demand).

        A decoder of phase p needs one at decode step d when (d + p) % block_size == 0: at step
        ds + i that is phase (−ds − i) % block_size. Each full cycle of block_size steps costs one
        block per decoder; the `rest` steps after the cycles take phases a, a − 1, ..., a − rest + 1
        (mod block_size) with a = (−ds) % block_size, summed as at most two slices.
        """
        bs, by_phase = self.block_size, self.decoders_by_phase
        cycles, rest = divmod(steps, bs)
        a = -self.ds % bs
        if rest <= a + 1:
            partial = sum(by_phase[a - rest + 1:a + 1])
        else:
            partial = sum(by_phase[:a + 1]) + sum(by_phase[bs - (rest - a - 1):])
        return cycles * self.decoding + partial

    # Jump ahead over decode-only steps -------------------------------------------------------

    def _jump(self) -> None:
        heap, state, finish_step = self.finish_heap, self.state, self.finish_step
        last, j = heap[0]
        while not (state[j] == _DECODING and finish_step[j] == last):
            heapq.heappop(heap)  # stale: preempted since
            last, j = heap[0]
        t, ds, decodes = self.t, self.ds, self.decoding
        steps = min(last - ds + 1, _MAX_WINDOW_STEPS, MAX_STEPS - self.steps)

        # An arrival matters only if it could be admitted: empty queue and a free sequence slot.
        next_arrival = math.inf
        if not self.waiting and len(self.running) < self.max_num_seqs and self.next_arrival < self.n:
            next_arrival = self.arrival[self.next_arrival]
            last_step_s = self.last_step_s
            if last_step_s > 0 and next_arrival < math.inf:
                # size the window to reach about the arrival, not far beyond it
                steps = min(steps, int((next_arrival - t) / last_step_s * 1.25) + 2)

        if self.on_demand and self.free_blocks < decodes * -(-steps // self.block_size):
            steps = self._steps_before_kv_shortage(steps)
            if steps == 0:  # this very step needs blocks it cannot get: preempt in a normal step
                self._step(with_decodes=True)
                return

        context, step_time = self.decode_context, self.step_time
        ran = None if self.decode_run is None else self.decode_run(decodes, context, steps, next_arrival - t)
        if ran is not None:
            run, elapsed, dt = ran
            t += elapsed
        elif steps < _VECTOR_MIN_STEPS:
            run = 0
            while run < steps:
                dt = float(step_time(decodes, context + decodes * run, 0, 0))
                if not 0 < dt < math.inf:
                    raise ValueError(f"step_time must return a positive finite time, got {dt}")
                t += dt
                run += 1
                if t >= next_arrival:
                    break
        else:
            contexts = np.arange(context, context + decodes * steps, decodes, dtype=np.float64)
            # The batch size and the (absent) prompt as numbers: the step time's decode-only fast path.
            dts = np.asarray(step_time(decodes, contexts, 0, 0), dtype=np.float64)
            if dts.shape != (steps,):  # a step time that ignores its inputs may return one number
                dts = np.full(steps, float(dts))
            ends = np.cumsum(dts)
            ends += t
            if not (dts.min() > 0 and ends[-1] < math.inf):
                raise ValueError("step_time must return positive finite times")
            run = steps
            if ends[-1] >= next_arrival:
                run = int(np.searchsorted(ends, next_arrival, side="left")) + 1
            t = float(ends[run - 1])
            dt = float(dts[run - 1])
        self.last_step_s = dt
        self.t = t
        self.steps += run
        if self.on_demand:
            self.free_blocks -= self._blocks_needed(run)
        self._advance_decodes(run)

    def _steps_before_kv_shortage(self, steps: int) -> int:
        """How many of the next `steps` decode steps get their blocks (on demand)."""
        bs = self.block_size
        # Each block_size steps cost one block per decoder, so a shortage comes within this many.
        steps = min(steps, (self.free_blocks // self.decoding + 2) * bs)
        by_phase = np.asarray(self.decoders_by_phase)
        need = by_phase[-(self.ds + np.arange(steps)) % bs]
        return int(np.searchsorted(np.cumsum(need), self.free_blocks, side="right"))

    # Result ---------------------------------------------------------------------------------

    def result(self, warmup_fraction: float) -> SimulationResult:
        arrival = np.array(self.arrival)
        first_token = np.array(self.first_token)
        finish = np.array(self.finish)
        output = np.array(self.output, dtype=np.int64)
        ttft = first_token - arrival
        e2e = finish - arrival
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(output > 1, (e2e - ttft) / (output - 1), np.nan)
        arrays = {
            "arrival_s": arrival, "first_token_s": first_token, "finish_s": finish,
            "input_tokens": np.array(self.input, dtype=np.int64), "output_tokens": output,
            "ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e, "trace_time_s": np.array(self.trace_time),
            "trace_output_tokens": np.array(self.trace_tokens, dtype=np.float64),
        }
        for array in arrays.values():
            array.setflags(write=False)
        return SimulationResult(
            **arrays, preemptions=self.preemptions, steps=self.steps, sim_time_s=self.t,
            makespan_s=float(finish.max() - arrival.min()), warmup_fraction=warmup_fraction)
