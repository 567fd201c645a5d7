"""Discrete-event simulation of an iteration-level continuous-batching scheduler (vLLM-style).

One engine iteration ("step") runs every admitted request forward together; its duration comes from
a caller-supplied `StepTimeFn` (the roofline model, a calibrated fit, or a constant in tests). The
scheduler reproduces the engine behaviour that decides latency under load:

- Prompt work, FCFS (partially prefilled requests first, then newly admitted ones), up to
  `max_num_batched_tokens` tokens a step; a request's first token comes out of the step that
  completes its prompt. Two engine choices shape it:
  - `mixed_prefill` (vLLM V1, TensorRT-LLM): each step carries every running decode (one token each)
    and the prompt work in what is left of the budget. Without it (SGLang, whose mixed chunks are off
    by default; vLLM V0): a step with prompt work to do (a prompt part done, or a waiting request that
    can be admitted) carries prompts only and the decodes pause for it; otherwise the step is
    decode-only.
  - `chunked_prefill` (vLLM V1, SGLang): a prompt may be split over several steps, the budget's worth
    at a time. Without it (vLLM V0) a prompt is prefilled whole in one step, so it waits for a step
    with room for all of it.
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
- Closed loop: without think times, all users send their first request at t = 0 (not staggered) and each
  sends its next request the instant the previous one finishes; with them (`Requests.think_s`, drawn from the
  workload's `think_time_s`), each user sends its next request a pause after its last answer ended (its first
  a pause after t = 0), requests arrive in the order their sends fall due, and sends after the last request
  has arrived are not made (so the users keep their pace to the last arrival).

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

The scheduler's state and event loop live in `scheduler.py` (compiled with mypyc when installed); this
module validates, runs it and measures the result.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal, Protocol

import numpy as np

from app.sizing.serving.scheduler import Scheduler
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
# 106 -> 72 ms for the 2,000-request bench simulation. Windows are capped so the arrays stay small
# (scheduler.py).
_VECTOR_MIN_STEPS = 8

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
    chunked_prefill: bool = True  # a prompt may be split over steps
    kv_tokens_reserved_per_request: Literal["on_demand", "full"] = ON_DEMAND
    # A model mixing full-attention and window layers (`kv.layer_mix`): the layers that cache the
    # whole context, and per window (its layers, the token slots one sequence holds there at most). The
    # pool, `kv_capacity_tokens` in full-attention-equivalent tokens as capacity reports it, is then
    # counted in blocks of the full layers (`pool_blocks`), and a request also holds its window layers'
    # blocks at its final length, reserved at admission (`window_blocks`). Empty: every layer full.
    full_layers: int = 0
    window_layers: tuple[tuple[int, int], ...] = ()
    mixed_prefill: bool = True  # decodes ride in the steps that carry prompt work

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError("block_size must be >= 1")
        if self.window_layers and (self.full_layers < 1 or min(min(pair) for pair in self.window_layers) < 1):
            raise ValueError("window_layers need full_layers >= 1 and positive layers and slots")
        if self.kv_capacity_tokens < self.block_size:
            raise ValueError("kv_capacity_tokens must hold at least one block")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.mixed_prefill and self.max_num_batched_tokens < self.max_num_seqs:
            # vLLM refuses the same: every running sequence must be able to decode in one step. Decodes that
            # run in steps of their own (SGLang's) are not bounded by the prompt chunk.
            raise ValueError("max_num_batched_tokens must be >= max_num_seqs when decodes share the steps")
        if self.kv_tokens_reserved_per_request not in KV_RESERVATIONS:
            raise ValueError(f"kv_tokens_reserved_per_request must be one of {KV_RESERVATIONS}")

    @property
    def kv_blocks(self) -> int:
        return self.kv_capacity_tokens // self.block_size

    @property
    def pool_blocks(self) -> int:
        """The pool in blocks of the full-attention layers: every layer's share of the equivalent blocks
        goes to them once the window layers' blocks are counted per request (`window_blocks`)."""
        if not self.window_layers:
            return self.kv_blocks
        return self.kv_blocks * (self.full_layers + sum(layers for layers, _ in self.window_layers)) // self.full_layers

    def window_blocks(self, final_tokens: np.ndarray) -> np.ndarray:
        """Per request, its window layers' blocks at its final length `final_tokens` (capped by each
        window), in blocks of the full layers (rounded up); zeros without window layers."""
        if not self.window_layers:
            return np.zeros(len(final_tokens), dtype=np.int64)
        bs = self.block_size
        blocks = -(-np.asarray(final_tokens, dtype=np.int64) // bs)
        held = sum(layers * np.minimum(blocks, -(-slots // bs)) for layers, slots in self.window_layers)
        return -(-held // self.full_layers)


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
        return self.percentiles(metric, (q,))[0]

    def percentiles(self, metric: str, qs: Sequence[float]) -> tuple[float, ...]:
        """`percentile` at each of `qs`, from one partition of the values (each as a call of its own gives)."""
        if metric not in METRICS:
            raise ValueError(f"metric must be one of {METRICS}")
        if not all(0 <= q <= 100 for q in qs):
            raise ValueError("q is a percentile in [0, 100]")
        values = getattr(self, f"{metric}_s")[self.warmup_requests:]
        values = values[~np.isnan(values)]
        return tuple(np.percentile(values, qs).tolist()) if len(values) else (math.nan,) * len(qs)

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

    scheduler = Scheduler(step_time, config, requests, closed_loop_users,
                          on_demand=config.kv_tokens_reserved_per_request == ON_DEMAND,
                          shared_tokens=_shared_tokens(requests).tolist(),
                          window_blocks=config.window_blocks(requests.input_tokens + requests.output_tokens).tolist(),
                          free_blocks=config.pool_blocks - _pinned_blocks(requests, config.block_size),
                          max_steps=MAX_STEPS, vector_min_steps=_VECTOR_MIN_STEPS)
    if not scheduler.run():
        raise SimulationLimitError(f"simulation passed {MAX_STEPS} engine steps with {n - scheduler.done} requests "
                                   f"unfinished; simulate fewer requests")
    return _result(scheduler, warmup_fraction)


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
                   cached_prefix_tokens=requests.cached_prefix_tokens[picked],
                   think_s=None if requests.think_s is None else requests.think_s[picked])


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
    usable_blocks = config.pool_blocks - _pinned_blocks(requests, bs)
    if usable_blocks < 1:
        raise KvCapacityError(
            f"the shared prefix of {requests.shared_prefix_tokens} tokens fills the KV cache "
            f"({config.pool_blocks} blocks of {bs} tokens)")
    # Most KV a request can hold: its prompt and its whole answer, less its share of the shared prefix, and
    # its window layers' blocks.
    own_tokens = requests.input_tokens + requests.output_tokens - _shared_tokens(requests)
    own_blocks = -(-own_tokens // bs) + config.window_blocks(requests.input_tokens + requests.output_tokens)
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


def _result(scheduler: Scheduler, warmup_fraction: float) -> SimulationResult:
    arrival = np.array(scheduler.arrival)
    first_token = np.array(scheduler.first_token)
    finish = np.array(scheduler.finish)
    output = np.array(scheduler.output, dtype=np.int64)
    ttft = first_token - arrival
    e2e = finish - arrival
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(output > 1, (e2e - ttft) / (output - 1), np.nan)
    arrays = {
        "arrival_s": arrival, "first_token_s": first_token, "finish_s": finish,
        "input_tokens": np.array(scheduler.input, dtype=np.int64), "output_tokens": output,
        "ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e, "trace_time_s": np.array(scheduler.trace_time),
        "trace_output_tokens": np.array(scheduler.trace_tokens, dtype=np.float64),
    }
    for array in arrays.values():
        array.setflags(write=False)
    return SimulationResult(
        **arrays, preemptions=scheduler.preemptions, steps=scheduler.steps, sim_time_s=scheduler.t,
        makespan_s=float(finish.max() - arrival.min()), warmup_fraction=warmup_fraction)
