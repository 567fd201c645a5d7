"""Disaggregated prefill/decode: separate prefill and decode workers, the prompt's KV moved between them.

A request is prefilled by a prefill worker (its first token comes out there), its prompt KV cache moves to
a decode worker, and the decode worker generates the rest. Prefill never stalls a decode step, and each
pool gets its own GPU, layout and worker count.

- **KV transfer** (ENGINES.md section 3: "bytes ≈ prompt tokens × per-token KV bytes"): every decode GPU
  receives its own shard of the prompt's KV over its own link, in parallel, so one transfer takes
  `latency + bytes on the most loaded decode GPU / per-GPU link bandwidth`. The link is NVLink when the
  whole deployment sits in one NVLink domain (`gpus_per_node`: 8 in an HGX node, 72 in a GB200 NVL72)
  and the engine moves the KV over it there, else the scale-out network (NIXL/Mooncake over RDMA). SGLang's
  default Mooncake engine uses RDMA inside one node too, and NVLink only across an NVL72 with the variables
  its launch then sets (`Engine.kv_transfer_over_nvlink`, ENGINES.md section 3). The latency is NCCL's own
  model of one point-to-point message (ENGINES.md section 5, NCCL `tuning.cc`, Simple protocol): base
  8.4 µs + one NVLink hop 3.4 µs = 11.8 µs, or + one network hop 14 µs = 22.4 µs.
- **Time to first token** = prefill queueing + prefill + KV transfer + the wait for the decode worker's
  first step that carries the request (the decode worker streams the first token with its first step).
  TPOT comes from the decode workers' batch alone.
- **Simulation** (an open loop; a closed loop's users: `disaggregated_loop.py`): one prefill worker and one
  decode worker are simulated at their share of the load (each pool's arrivals the workload's stream dealt out
  over the pool's schedulers: `workload.dealt_out_arrivals`), with the same requests (common random numbers). A prefill worker's request ends with its first token (output of 1); a decode worker's request
  arrives with its prompt cached except the last token, whose step emits the first streamed token, and
  generates the remaining OSL − 1 tokens (at least one). Request i's latencies combine its two parts:
  TTFT_i = prefill TTFT_i + transfer_i + decode first-step delay_i; E2E_i = TTFT_i + decode time after it.
  Each decode worker's step costs the profile's `decode_worker_step_overhead_s` more than an aggregated
  worker's (its loop tracks the KV transfers in flight; fitted on published disaggregated runs), which the
  engine rules charge on decode pools alone (`engines.host_adjusted`, decode_pool).
- **Spare workers** (`ha_policy.extra_replicas` = k): N + k per pool. Either pool losing k workers must still
  meet the SLO, so both pools are sized and checked at the offered load without the spares (over the link of
  the whole deployment, spares included: their GPUs may take it past one NVLink domain), then each gets k more.
  The prediction is that of the pools without their spares: what the plan guarantees with k workers of either
  pool down; with every worker up, each carries less. (Predicted afresh with every worker up, the two pools'
  simulations at their new loads combined request by request came out a few ms over a TTFT SLO that the pools
  without spares met, 2026-12-06: simulation noise, where a guarantee is wanted.)
- **Memory per pool** (`pool_capacity`, /v1/capacity): each pool's workers under the engine's accounting
  of an aggregated replica, charged what a worker of the role holds per request.

Longer than 600 lines because it is the whole disaggregated model of an open loop in one place: the transfer,
the per-pool memory, the per-request composition and the two-pool planner share their definitions of the roles
(a closed loop's estimate and planner, `disaggregated_loop.py`, build on them).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

import numpy as np

from app.sizing.engines import ENGINES, EngineConfig, pipeline_split
from app.sizing.engines.base import ResolvedEngine
from app.sizing.hardware.efficiency import Efficiency
from app.sizing.layout import Layout
from app.sizing.model.kv import kv_cache_size
from app.sizing.model.recipes import WeightRecipe
from app.sizing.serving.capacity import (
    LIMIT_KV_CACHE,
    CapacityResult,
    ConcurrencyView,
    capacity,
)
from app.sizing.serving.memory import requests_fitting
from app.sizing.serving.plan import (
    BINDING_E2E,
    BINDING_GOODPUT,
    BINDING_TPOT,
    BINDING_TTFT,
    DECODE_POOL,
    PERCENTILES_REPORTED,
    PREFILL_POOL,
    Configuration,
    Infeasible,
    Percentiles,
    PlanInputs,
    Prediction,
    Slo,
    _describe,
    _Planner,
    _Screened,
    cached_prompt_tokens,
    cost_per_million_tokens,
    prefill_time_s,
    replica_nodes,
)
from app.sizing.serving.simulate import (
    KvCapacityError,
    SimulationLimitError,
    SimulationResult,
    simulate,
)
from app.sizing.serving.workload import Requests
from app.sizing.specs import GpuSpec, ModelSpec

NVLINK = "nvlink"
PCIE = "pcie"  # the GPUs' own link in a node of PCIe cards (`GpuSpec.pcie_links`): no NVLink domain
NETWORK = "network"

# NCCL's latency model of one message (NVIDIA/nccl src/graph/tuning.cc @5067397c, Simple protocol; model
# constants, not measurements): base 8.4 µs, plus a hop of 3.4 µs over NVLink or 14 µs over the network.
NVLINK_TRANSFER_LATENCY_S = (8.4 + 3.4) * 1e-6
NETWORK_TRANSFER_LATENCY_S = (8.4 + 14.0) * 1e-6
TRANSFER_LATENCY_SOURCE = ("NCCL tuner latency model, Simple protocol: base 8.4 us + one hop (NVLink 3.4 us, "
                           "network 14 us); NVIDIA/nccl src/graph/tuning.cc; between PCIe cards the NVLink hop "
                           "stands in (the reference gives NCCL's no PCIe hop; microseconds beside the transfer)")


Seconds = TypeVar("Seconds", float, np.ndarray)  # one request, or one per request


@dataclass(frozen=True, slots=True)
class KvTransfer:
    """Moving one prompt's KV cache from its prefill worker to its decode worker."""

    prompt_tokens: int
    bytes_per_request: int  # the whole prompt's KV, unsharded (what the model caches for it)
    bytes_per_gpu: int  # what the most loaded decode GPU receives (its shard; MLA's latent is whole on each)
    link: str  # NVLINK, PCIE or NETWORK
    bandwidth_bytes_per_s: float  # per GPU, per direction
    latency_s: float
    time_s: float


def transfer_link(gpu: GpuSpec, deployment_gpus: int, engine: str | None = None,
                  as_launched: bool = True) -> tuple[str, float, float]:
    """(link, per-GPU bandwidth, latency) the KV moves over: NVLink when the deployment's GPUs fit in one
    NVLink domain of this GPU and `engine` moves the KV over it there (`kv_transfer_over_nvlink`, with the
    settings its launch command adds when `as_launched`, else its defaults; None: an engine-neutral estimate,
    which does), else the scale-out network. PCIe cards have no NVLink domain: inside one node their own link
    is PCIe (PCIE, at the card's PCIe rate, the NVLink hop's latency standing in)."""
    if deployment_gpus < 1:
        raise ValueError("deployment_gpus must be >= 1")
    over_nvlink = engine is None or ENGINES[engine].kv_transfer_over_nvlink(gpu, as_launched)
    if deployment_gpus <= gpu.gpus_per_node and over_nvlink:
        return (PCIE if gpu.pcie_links else NVLINK), gpu.interconnect_bandwidth_bytes_per_s, NVLINK_TRANSFER_LATENCY_S
    return NETWORK, gpu.scale_out_bandwidth_bytes_per_s, NETWORK_TRANSFER_LATENCY_S


def kv_transfer(model: ModelSpec, prompt_tokens: int, kv_dtype: str, *, decode_tensor_parallel: int,
                decode_pipeline_parallel: int, link: str, bandwidth_bytes_per_s: float,
                latency_s: float) -> KvTransfer:
    """One prompt's KV transfer: latency + bytes on the most loaded decode GPU / bandwidth."""
    if prompt_tokens < 1:
        raise ValueError("prompt_tokens must be >= 1")
    if not (math.isfinite(bandwidth_bytes_per_s) and bandwidth_bytes_per_s > 0):
        raise ValueError("bandwidth_bytes_per_s must be positive")
    if not (math.isfinite(latency_s) and latency_s >= 0):
        raise ValueError("latency_s must be >= 0")
    if link not in (NVLINK, PCIE, NETWORK):
        raise ValueError(f"link must be {NVLINK!r}, {PCIE!r} or {NETWORK!r}")
    size = kv_cache_size(model, prompt_tokens, kv_dtype, tensor_parallel=decode_tensor_parallel,
                         pipeline_parallel=decode_pipeline_parallel)
    per_gpu = size.bytes_per_sequence_per_gpu
    return KvTransfer(prompt_tokens=prompt_tokens, bytes_per_request=size.bytes_per_sequence,
                      bytes_per_gpu=per_gpu, link=link, bandwidth_bytes_per_s=bandwidth_bytes_per_s,
                      latency_s=latency_s, time_s=latency_s + per_gpu / bandwidth_bytes_per_s)


def transfer_times_s(model: ModelSpec, prompt_tokens: np.ndarray, kv_dtype: str, *, decode_tensor_parallel: int,
                     decode_pipeline_parallel: int, bandwidth_bytes_per_s: float, latency_s: float) -> np.ndarray:
    """`kv_transfer(...).time_s` for each prompt length (the per-GPU bytes are linear in the tokens for
    full-attention and MLA layers, and bounded by the window for windowed ones: computed per distinct
    length)."""
    lengths, inverse = np.unique(np.asarray(prompt_tokens, dtype=np.int64), return_inverse=True)
    per_gpu = np.array([kv_cache_size(model, int(n), kv_dtype, tensor_parallel=decode_tensor_parallel,
                                      pipeline_parallel=decode_pipeline_parallel).bytes_per_sequence_per_gpu
                        for n in lengths], dtype=float)
    return (latency_s + per_gpu / bandwidth_bytes_per_s)[inverse]


# One pool's memory -------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class PoolCapacity:
    """One pool's workers under their engine's memory accounting: the rules of an aggregated replica
    (`capacity.capacity`; ENGINES.md section 3 gives neither role memory defaults of its own), at what a
    worker of the role holds per request:

    - prefill: the prompt, from its prefill until its KV transfer completes (the request ends there with
      its first token, whose KV the prefill worker never writes: `prefill_role_requests`). The requests in
      flight are what the KV cache holds, not capped by max_num_seqs: a request waiting for its transfer
      has left the running batch but keeps its blocks (vLLM's NIXL prefiller until the decode worker reads
      them, at most kv_lease_duration; ENGINES.md section 3).
    - decode: the prompt and the whole answer (the admission view, capped by max_num_seqs); the worker's
      operating point times decode steps alone (`capacity.operating_point`, decode_only).
    """

    role: str  # PREFILL_POOL or DECODE_POOL
    workers: int
    layout: Layout  # of one worker
    worker: CapacityResult  # one worker, at the role's request lengths
    tokens_per_request: int
    requests_per_worker: ConcurrencyView

    @property
    def gpus(self) -> int:
        return self.workers * self.layout.gpus


def pool_capacity(role: str, model: ModelSpec, gpu: GpuSpec, *, workers: int, layout: Layout, input_tokens: int,
                  output_tokens: int, weight_dtype: str, kv_dtype: str, compute_dtype: str | None,
                  engine: EngineConfig, efficiency: Efficiency, activation_dtype: str = "bf16",
                  weight_recipe: WeightRecipe | None = None) -> PoolCapacity:
    """`PoolCapacity` of `workers` workers of `layout` on `gpu` serving requests of `input_tokens` +
    `output_tokens` in the `role` pool."""
    if role not in (PREFILL_POOL, DECODE_POOL):
        raise ValueError(f"role must be {PREFILL_POOL!r} or {DECODE_POOL!r}")
    if workers < 1:
        raise ValueError("workers must be >= 1")
    prefill = role == PREFILL_POOL
    worker = capacity(
        model, gpu, tensor_parallel=layout.tensor_parallel, pipeline_parallel=layout.pipeline_parallel,
        weight_dtype=weight_dtype, kv_dtype=kv_dtype, compute_dtype=compute_dtype,
        engine=replace(engine, disaggregated=True),
        input_tokens=input_tokens, output_tokens=1 if prefill else output_tokens, efficiency=efficiency,
        activation_dtype=activation_dtype, data_parallel=layout.data_parallel,
        expert_parallel=layout.expert_parallel, weight_recipe=weight_recipe, decode_only=not prefill,
        prefill_only=prefill)
    if not prefill:
        return PoolCapacity(role, workers, layout, worker, input_tokens + output_tokens,
                            worker.max_concurrency.admission)
    in_flight = layout.data_parallel * requests_fitting(
        model, worker.memory.kv_budget_bytes_per_stage, input_tokens, kv_dtype,
        tensor_parallel=layout.tensor_parallel, pipeline_parallel=layout.pipeline_parallel,
        block_size=worker.engine.block_size, split=pipeline_split(worker.engine.engine))
    return PoolCapacity(role, workers, layout, worker, input_tokens,
                        ConcurrencyView(in_flight, in_flight, LIMIT_KV_CACHE, float(input_tokens)))


# Per-request composition ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class PoolTimes:
    """Request i's timings in each pool, relative to its arrival there (arrival order, same requests)."""

    prefill_ttft_s: np.ndarray  # queueing + prefill on the prefill worker
    transfer_s: np.ndarray
    decode_first_s: np.ndarray  # arrival at the decode worker to its first step (the first streamed token)
    decode_rest_s: np.ndarray  # first streamed token to the last token, on the decode worker
    output_tokens: np.ndarray


@dataclass(frozen=True, slots=True)
class Combined:
    """End-to-end per-request latencies of a disaggregated deployment."""

    ttft_s: np.ndarray
    tpot_s: np.ndarray  # (E2E − TTFT) / (OSL − 1); NaN for one-token answers
    e2e_s: np.ndarray

    def percentile(self, metric: str, q: float) -> float:
        values = getattr(self, f"{metric}_s")
        values = values[~np.isnan(values)]
        return float(np.percentile(values, q)) if len(values) else math.nan


def first_token_s(prefill_ttft_s: Seconds, transfer_s: Seconds, decode_first_s: Seconds) -> Seconds:
    """A disaggregated request's TTFT: its time on the prefill worker (queueing + prefill) + the KV transfer +
    the decode worker's delay to its first step. Numbers or arrays."""
    return prefill_ttft_s + transfer_s + decode_first_s


def combine(times: PoolTimes) -> Combined:
    """TTFT (`first_token_s`); E2E = TTFT + the rest of the decode."""
    ttft = first_token_s(times.prefill_ttft_s, times.transfer_s, times.decode_first_s)
    e2e = ttft + times.decode_rest_s
    gaps = times.output_tokens - 1
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(gaps > 0, (e2e - ttft) / np.maximum(gaps, 1), np.nan)
    return Combined(ttft, tpot, e2e)


def prefill_role_requests(requests: Requests) -> Requests:
    """What a prefill worker serves: the same prompts, each ending with its first token."""
    return replace(requests, output_tokens=np.ones_like(requests.output_tokens))


def decode_role_requests(requests: Requests) -> Requests:
    """What a decode worker serves: the prompt arrives cached but for its last token, and the worker generates
    the OSL − 1 tokens after the prefill worker's first (at least one step), the first of them with that step,
    which streams the prefill worker's token too: a two-token answer's tokens arrive together (TPOT 0)."""
    return replace(requests, cached_prefix_tokens=requests.input_tokens - 1,
                   output_tokens=np.maximum(requests.output_tokens - 1, 1), shared_prefix_tokens=0)



def fewest_workers(meets: Callable[[int], bool], lowest: int, most: int, guess: int | None = None) -> int | None:
    """The fewest workers in [lowest, most] for which `meets` holds (it holds for all counts above one
    that meets; `lowest` is a lower bound, never undercut); None when even `most` misses. From `lowest`: doubling,
    then bisection. From a `guess` near the answer: steps of 1, 2, 4, ... away from it (down while the counts
    meet, up while they miss) until the answer is bracketed, then bisection: 2 tries where the guess is right,
    about 2 log2(d) where it is d off."""
    if lowest < 1 or most < lowest:
        raise ValueError("need 1 <= lowest <= most")
    failing, passing = lowest - 1, None  # counts below `lowest` miss: never tried
    if guess is None or guess <= lowest:
        if meets(lowest):
            return lowest
        failing = lowest
        while passing is None:
            candidate = min(most, failing * 2)
            if meets(candidate):
                passing = candidate
            elif candidate >= most:
                return None
            else:
                failing = candidate
    else:
        start, step = min(guess, most), 1
        if meets(start):
            passing = start
            while passing - step >= lowest and meets(passing - step):
                passing, step = passing - step, step * 2
            failing = max(failing, passing - step)
        else:
            failing = start
            while passing is None:
                candidate = min(most, failing + step)
                if meets(candidate):
                    passing = candidate
                elif candidate >= most:
                    return None
                else:
                    failing, step = candidate, step * 2
    while passing - failing > 1:
        middle = (passing + failing) // 2
        if meets(middle):
            passing = middle
        else:
            failing = middle
    return passing


# Planning ---------------------------------------------------------------------------------------------

# Per pool, the options sized by simulation (`_size_pools`): the cheapest few by the analytic bound, then each next
# one that could still be cheaper than every pool sized so far, up to the most. A prefill option's bound (prompts
# back to back) ranks one- and two-GPU workers first, whose TTFTs under load then need many of them: with four,
# Llama-3.1-70B fp8 at 8k/1k, 3 req/s, p95 TTFT 2 s, never sized B200 at TP4 and planned $49.88/h over H100, H200 and
# B200 where B200 alone gave $40.44/h (and $74.10 against $46.80 over the whole catalog, 0.6 -> 0.9 s of plan).
POOL_CONFIGURATIONS_SIMULATED = 2
MAX_POOL_CONFIGURATIONS_SIMULATED = 8
TTFT_RETRIES = 3  # prefill workers added when the combined TTFT misses at the sized counts


@dataclass(frozen=True, slots=True)
class Pool:
    """One pool of a disaggregated deployment: a worker's configuration and how many workers."""

    role: str  # PREFILL_POOL or DECODE_POOL
    configuration: Configuration
    compute_dtype: str
    efficiency: Efficiency
    engine: ResolvedEngine
    kv_tokens_per_worker: int
    workers: int
    load_per_worker: float  # requests/s, its share of the sized load (a closed loop's: of its users' sized rate)
    gpus: int
    price_per_gpu_hour_usd: float | None
    price_source: str | None
    cost_per_hour_usd: float | None
    users_per_worker: float | None = None  # a closed loop's users over the workers; None: an open loop
    extra_workers: int = 0  # spare workers (ha_policy.extra_replicas), included in `workers`
    # A decode worker's analytic ceiling: `_Planner._ceiling` of its decode steps alone, requests/s (a closed loop's
    # plan: users, `disaggregated_loop`); 0 for a prefill worker
    ceiling_per_worker: float = 0.0


@dataclass(frozen=True, slots=True)
class DisaggregatedPlan:
    prefill: Pool
    decode: Pool
    transfer: KvTransfer  # of the mean prompt
    gpus: int
    cost_per_hour_usd: float | None
    cost_per_million_output_tokens_usd: float | None
    output_tokens_per_s: float  # the whole deployment at the peak load
    predicted: Prediction  # per request, end to end, at the offered load (load = the deployment's requests/s)
    meets_slo: bool
    binding_constraint: str
    binding_detail: str
    mean_e2e_s: float  # a request's mean time, first token to last (what a closed loop's users wait per request)
    # Prefill's share of the GPU time a request takes: GPU-seconds of a prefill worker busy with the mean prompt,
    # against the decode workers' GPU-seconds per request (`_prefill_share`): why aggregated wins or loses
    prefill_share: float

    @property
    def e2e_at_slo_percentile_s(self) -> float:
        return self.predicted.e2e.at_slo_percentile_s

    @property
    def decode_worker_prediction(self) -> Prediction:
        """`predicted` as one decode worker's: its share of the load, requests and tokens (of the decode workers
        the prediction is timed with: any spares down); the percentiles are every request's."""
        timed, whole = self.decode.workers - self.decode.extra_workers, self.predicted
        return replace(whole, load=whole.load / timed, requests_per_s=whole.requests_per_s / timed,
                       output_tokens_per_s=whole.output_tokens_per_s / timed)

    @property
    def label(self) -> str:
        return (f"{self.prefill.workers} x prefill {self.prefill.configuration.label} + "
                f"{self.decode.workers} x decode {self.decode.configuration.label}")


@dataclass(frozen=True, slots=True)
class DisaggregatedResult:
    plans: tuple[DisaggregatedPlan, ...]  # cheapest first (at most one per prefill x decode GPU pair)
    infeasible: tuple[Infeasible, ...]  # per pool configuration, reasons prefixed with the pool
    simulations: int
    simulated_requests: int
    # Workers per request/s of sized load of each pool sized, by (configuration, role): where a search at another
    # rate starts (`plan_disaggregated`'s `guesses`)
    workers_per_load: Mapping[tuple[Configuration, str], float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _PoolOption:
    screened: _Screened
    workers: int  # workers needed if each ran at its analytic throughput (the search's lower bound)
    bound: float  # their cost (`_cost_units`): a lower bound


def plan_disaggregated(inputs: PlanInputs, candidates: Sequence[Configuration],
                       guesses: Mapping[tuple[Configuration, str], float] | None = None,
                       pairing: tuple[Configuration, Configuration] | None = None) -> DisaggregatedResult:
    """The cheapest disaggregated deployments over `candidates` (each may serve either pool), or with
    `pairing` (prefill, decode) that pair's deployment alone.

    Open-loop workloads (a closed loop's: `disaggregated_loop.plan_closed_loop`). The pools are sized
    one after the other: decode workers by the TPOT SLO (a decode worker's TPOT does not depend on the
    prefill pool), then prefill workers by the TTFT SLO of the combined request (prefill + transfer +
    the decode worker's first step at its sized load).

    A pool's worker search starts from `guesses` (workers per request/s of sized load, by
    configuration and role, e.g. a plan at another rate's `workers_per_load`) where it has one.
    """
    if inputs.workload.is_closed_loop:
        raise ValueError("disaggregated plans are sized for an open-loop load (requests_per_s)")
    planner = _Planner(inputs)
    infeasible: list[Infeasible] = []
    options: dict[str, list[_PoolOption]] = {PREFILL_POOL: [], DECODE_POOL: []}
    roles = ((pairing[0], PREFILL_POOL), (pairing[1], DECODE_POOL)) if pairing else (
        (configuration, role) for configuration in candidates for role in (PREFILL_POOL, DECODE_POOL))
    for configuration, role in roles:
        outcome = planner.screen(configuration, role)
        if isinstance(outcome, Infeasible):
            infeasible.append(Infeasible(configuration, tuple(f"{role} pool: {r}" for r in outcome.reasons)))
        else:
            options[role].append(_pool_option(planner, outcome, role))
    requests = planner._unit_requests(inputs.simulated_requests)
    plans = []
    prefill_floor = min((_prefill_floor_s(planner, option.screened) for option in options[PREFILL_POOL]),
                        default=math.inf)
    guesses, prefills = guesses or {}, []
    decodes = _size_pools(planner, options[DECODE_POOL], DECODE_POOL, requests, prefill_floor, infeasible, guesses)
    if decodes:  # the prefill pools are sized behind the cheapest decode pool
        decode_pool, decode_result = min(decodes, key=lambda sized: _cost_key(sized[0]))
        prefills = _size_pools(planner, options[PREFILL_POOL], PREFILL_POOL, requests,
                               (decode_pool, decode_result), infeasible, guesses)
        for prefill_pool, _ in prefills:
            built = _deployment(planner, prefill_pool, decode_pool, requests, decode_result)
            (infeasible if isinstance(built, Infeasible) else plans).append(built)
    plans.sort(key=plan_order)
    sized = {(pool.configuration, pool.role): pool.workers / planner.sized_load
             for pool, _ in (*decodes, *prefills)}
    return DisaggregatedResult(tuple(plans), tuple(infeasible), planner.simulations, planner.simulated_requests,
                               sized)


def _pool_option(planner: _Planner, screened: _Screened, role: str) -> _PoolOption:
    """The workers the pool needs if each ran at its analytic throughput: back-to-back prefills of the
    mean prompt, or decode steps at the largest batch the engine runs, on each of its schedulers (attention
    data-parallel ranks x pipeline micro-batches), and what they cost."""
    lengths, step_time = planner.lengths, screened.step_time
    if role == PREFILL_POOL:
        rate = 1 / max(_prefill_busy_s(planner, screened), 1e-12)
    else:
        batch = screened.scheduler.max_num_seqs
        step = float(step_time(batch, batch * (lengths.input_mean + lengths.output_mean / 2), 0, 0))
        rate = batch / (step * max(lengths.output_mean - 1, 1.0))
    workers = max(1, math.ceil(planner.sized_load / (rate * screened.schedulers) * (1 - 1e-9)))
    gpus = workers * screened.configuration.gpus_per_replica
    return _PoolOption(screened, workers, _cost_units(gpus, screened.price))


def _prefill_busy_s(planner: _Planner, screened: _Screened) -> float:
    """One scheduler of a prefill worker busy with the mean prompt alone."""
    prompt = max(1, round(planner.lengths.input_mean))
    return prefill_time_s(screened.step_time, prompt, cached_prompt_tokens(planner.workload, prompt),
                          screened.scheduler.max_num_batched_tokens)


def _simulate_role(planner: _Planner, screened: _Screened, role: str, requests: Requests,
                   load: float, workers: int) -> SimulationResult:
    """One scheduler of one of `workers` workers at `load` (requests/s per worker): one of its attention
    data-parallel ranks' pipeline micro-batches (`_Planner.screen`), at its share of the worker's load, the
    stream dealt out over every scheduler of the pool (`_Planner.arrivals`). Each request runs on one of them,
    so its times are that scheduler's."""
    role_requests = prefill_role_requests(requests) if role == PREFILL_POOL else decode_role_requests(requests)
    arrivals = planner.arrivals(len(requests), workers * screened.schedulers)
    role_requests = replace(role_requests, arrival_s=arrivals / (load / screened.schedulers))
    planner.simulations += 1
    planner.simulated_requests += len(role_requests)
    return simulate(screened.step_time, screened.scheduler, role_requests)


def _prefill_floor_s(planner: _Planner, screened: _Screened) -> float:
    """The p-th percentile prompt prefilled alone on this configuration."""
    prompt = planner.lengths.input_at_percentile
    return prefill_time_s(screened.step_time, prompt, cached_prompt_tokens(planner.workload, prompt),
                          screened.scheduler.max_num_batched_tokens)


def _size_pools(planner: _Planner, options: list[_PoolOption], role: str, requests: Requests,
                behind: float | tuple[Pool, SimulationResult], infeasible: list[Infeasible],
                guesses: Mapping[tuple[Configuration, str], float]) -> list[tuple[Pool, SimulationResult]]:
    """Pool options of `role` in the order of their analytic bound, each sized by simulation: the first
    POOL_CONFIGURATIONS_SIMULATED, then each next one whose bound is below the cost of the cheapest pool sized so
    far (or while none is), MAX_POOL_CONFIGURATIONS_SIMULATED in all at most. An option with a low bound that sizes
    dear (a pipeline's workers) thus does not keep a cheaper one from being sized."""
    sized: list[tuple[Pool, SimulationResult]] = []
    for tried, option in enumerate(sorted(options, key=lambda o: o.bound)[:MAX_POOL_CONFIGURATIONS_SIMULATED]):
        if tried >= POOL_CONFIGURATIONS_SIMULATED and sized and option.bound >= min(
                _cost_units(pool.gpus, pool.price_per_gpu_hour_usd) for pool, _ in sized):
            break
        outcome = _size_pool(planner, option, role, requests, behind, guesses)
        (infeasible if isinstance(outcome, Infeasible) else sized).append(outcome)
    return sized


def _cost_units(gpus: int, price: float | None) -> float:
    """What `gpus` GPUs cost in the units pool options are ranked by: $/h when priced, else past every priced
    option, by GPU count."""
    return gpus * price if price is not None else 1e12 + gpus


def _size_pool(planner: _Planner, option: _PoolOption, role: str, requests: Requests,
               behind: float | tuple[Pool, SimulationResult],
               guesses: Mapping[tuple[Configuration, str], float]) -> tuple[Pool, SimulationResult] | Infeasible:
    """The fewest workers of this configuration meeting the pool's SLO. Decode: the TPOT, and a wait for
    the first decode step within what the TTFT SLO leaves after the fastest prefill (`behind`, the p-th
    prompt prefilled alone) and the KV transfer: a decode pool short of KV or sequence slots queues the
    requests. Prefill: the TTFT (and E2E) of the whole request with the sized decode pool (`behind`). The
    search never goes below the analytic worker count, and starts from the workers `guesses` give this
    configuration and role at the sized load where it has them, else from a decode pool's `_decode_guess` (a
    prefill pool's from the analytic count: the guesses tried for it came out far off)."""
    slo, screened = planner.slo, option.screened
    if role == DECODE_POOL:
        assert isinstance(behind, float)
        prompt = planner.lengths.input_at_percentile
        configuration = screened.configuration
        transfer = transfer_times_s(planner.inputs.model, np.array([prompt]), configuration.kv_dtype,
                                    decode_tensor_parallel=configuration.tensor_parallel,
                                    decode_pipeline_parallel=configuration.pipeline_parallel,
                                    bandwidth_bytes_per_s=configuration.gpu.scale_out_bandwidth_bytes_per_s,
                                    latency_s=NETWORK_TRANSFER_LATENCY_S)[0]
        first_step_budget = slo.ttft_s - behind - transfer
    results: dict[int, SimulationResult] = {}

    def run(workers: int) -> SimulationResult:
        if workers not in results:
            results[workers] = _simulate_role(planner, screened, role, requests, planner.sized_load / workers,
                                              workers)
        return results[workers]

    def meets(workers: int) -> bool:
        try:
            result = run(workers)
        except (KvCapacityError, SimulationLimitError, ValueError):
            return False
        if role == DECODE_POOL:
            tpot = result.percentile("tpot", slo.percentile)
            return ((math.isnan(tpot) or tpot <= slo.tpot_s)
                    and result.percentile("ttft", slo.percentile) <= first_step_budget)
        assert not isinstance(behind, float)
        decode_pool, decode_result = behind
        combined = combine(_pool_times(planner, result, decode_result, decode_pool, requests))
        checks = _combined_checks(combined, slo, result.warmup_requests)
        return all(ratio <= 1 for name, _, _, ratio in checks if name != BINDING_TPOT)

    per_load = guesses.get((screened.configuration, role))
    guess = None if per_load is None else math.ceil(per_load * planner.sized_load * (1 - 1e-9))
    if guess is None and role == DECODE_POOL:
        guess = _decode_guess(planner, screened)
    workers = fewest_workers(meets, min(option.workers, MAX_POOL_WORKERS), MAX_POOL_WORKERS, guess)
    if workers is None:
        slo_name = "TPOT (or its share of the TTFT)" if role == DECODE_POOL else "TTFT"
        return Infeasible(screened.configuration, (
            (f"{role} pool: misses the {slo_name} SLO at every worker count up to {MAX_POOL_WORKERS}, the most "
            "the search sizes a pool with"),))
    return _pool(planner, screened, role, workers), run(workers)


MAX_POOL_WORKERS = 4096
DECODE_GUESS_BATCHES = 2 ** np.arange(13)  # the batches `_decode_guess` times (up to the engine's largest)


def _decode_guess(planner: _Planner, screened: _Screened) -> int:
    """Decode workers if each ran, back to back, the largest batch (a power of two, at most the engine's) whose
    step takes at most the TPOT SLO: b / (step(b) x (mean answer - 1)) requests/s on each scheduler. A step over
    the SLO keeps the batch below b, so this is about what the SLO lets a worker carry, and no fewer than the
    analytic count at the engine's largest batch (`_pool_option`)."""
    lengths, largest = planner.lengths, screened.scheduler.max_num_seqs
    batches = DECODE_GUESS_BATCHES[DECODE_GUESS_BATCHES <= largest] if largest else DECODE_GUESS_BATCHES
    steps = np.asarray(screened.step_time(batches, batches * (lengths.input_mean + lengths.output_mean / 2), 0, 0),
                       dtype=float)
    fitting = steps <= planner.slo.tpot_s
    batch, step = (batches[fitting][-1], steps[fitting][-1]) if fitting.any() else (batches[0], steps[0])
    rate = batch / (step * max(lengths.output_mean - 1, 1.0))
    return max(1, math.ceil(planner.sized_load / (rate * screened.schedulers) * (1 - 1e-9)))


def plan_order(plan: DisaggregatedPlan) -> tuple[bool, float, int, float]:
    """How plans rank: priced before unpriced, cheaper first, then fewer GPUs, then the shorter E2E at the SLO
    percentile."""
    return plan.cost_per_hour_usd is None, plan.cost_per_hour_usd or 0.0, plan.gpus, plan.e2e_at_slo_percentile_s


def _cost_key(pool: Pool) -> tuple[bool, float, int]:
    return pool.cost_per_hour_usd is None, pool.cost_per_hour_usd or 0.0, pool.gpus


def _pool(planner: _Planner, screened: _Screened, role: str, workers: int, extra_workers: int = 0) -> Pool:
    gpus = workers * screened.configuration.gpus_per_replica
    return Pool(role=role, configuration=screened.configuration, compute_dtype=screened.compute_dtype,
                efficiency=screened.efficiency, engine=screened.engine,
                kv_tokens_per_worker=screened.kv_tokens_per_replica, workers=workers, extra_workers=extra_workers,
                load_per_worker=planner.sized_load / workers, gpus=gpus,
                ceiling_per_worker=screened.ceiling if role == DECODE_POOL else 0.0,
                price_per_gpu_hour_usd=screened.price, price_source=screened.price_source,
                cost_per_hour_usd=None if screened.price is None else gpus * screened.price)


def deployment_nodes(prefill: Pool, decode: Pool) -> int:
    """Nodes both pools take. Of one GPU type, workers that fit in a node share nodes across the pools, largest
    first, each into the first node with room for it (a TP4 prefill and a TP4 decode worker take one 8-GPU node,
    as the NVLink transfer between them, `deployment_link`, assumes); a worker larger than a node, or pools of two
    GPU types, take nodes of their own (`replica_nodes`)."""
    if prefill.configuration.gpu != decode.configuration.gpu:
        return sum(replica_nodes(pool.configuration, pool.workers) for pool in (prefill, decode))
    per_node = decode.configuration.gpu.gpus_per_node
    nodes, sizes = 0, []
    for pool in (prefill, decode):
        size = pool.configuration.gpus_per_replica
        if size > per_node:
            nodes += replica_nodes(pool.configuration, pool.workers)
        else:
            sizes += [size] * pool.workers
    room: list[int] = []  # free GPUs of each node the workers that fit in one have opened
    for size in sorted(sizes, reverse=True):
        node = next((i for i, free in enumerate(room) if free >= size), None)
        if node is None:
            room.append(per_node - size)
        else:
            room[node] -= size
    return nodes + len(room)


def deployment_link(prefill_gpu: GpuSpec, prefill_gpus: int, decode_gpu: GpuSpec, decode_gpus: int,
                    engine: str | None = None) -> tuple[str, float, float]:
    """(link, per-GPU bandwidth, latency) between the pools: NVLink when both pools are one GPU type, the
    deployment fits in one of its NVLink domains and `engine` moves the KV over it (`transfer_link`), else
    the slower GPU's scale-out network."""
    if prefill_gpu == decode_gpu:
        return transfer_link(decode_gpu, prefill_gpus + decode_gpus, engine)
    return NETWORK, min(prefill_gpu.scale_out_bandwidth_bytes_per_s,
                        decode_gpu.scale_out_bandwidth_bytes_per_s), NETWORK_TRANSFER_LATENCY_S


def _link(prefill: Pool, decode: Pool) -> tuple[str, float, float]:
    return deployment_link(prefill.configuration.gpu, prefill.gpus, decode.configuration.gpu, decode.gpus,
                           decode.engine.engine)


def _pool_times(planner: _Planner, prefill_result: SimulationResult, decode_result: SimulationResult,
                decode: Pool, requests: Requests, link: tuple[str, float, float] | None = None) -> PoolTimes:
    gpu = decode.configuration.gpu
    _, bandwidth, latency = link or (NETWORK, gpu.scale_out_bandwidth_bytes_per_s, NETWORK_TRANSFER_LATENCY_S)
    transfer = transfer_times_s(planner.inputs.model, requests.input_tokens, decode.configuration.kv_dtype,
                                decode_tensor_parallel=decode.configuration.tensor_parallel,
                                decode_pipeline_parallel=decode.configuration.pipeline_parallel,
                                bandwidth_bytes_per_s=bandwidth, latency_s=latency)
    return PoolTimes(prefill_ttft_s=prefill_result.ttft_s, transfer_s=transfer,
                     decode_first_s=decode_result.ttft_s, decode_rest_s=decode_result.e2e_s - decode_result.ttft_s,
                     output_tokens=requests.output_tokens)


def _deployment(planner: _Planner, prefill: Pool, decode: Pool, requests: Requests,
                decode_result: SimulationResult) -> DisaggregatedPlan | Infeasible:
    """Both pools at the offered (peak) load, with the link the deployment really has: with its spare workers
    (module docstring), whose GPUs count toward an NVLink domain though the pools are checked without them."""
    slo, inputs = planner.slo, planner.inputs
    prefill_screened = planner.screen(prefill.configuration, PREFILL_POOL)
    assert isinstance(prefill_screened, _Screened)
    decode_screened = planner.screen(decode.configuration, DECODE_POOL) if inputs.policy.extra_replicas else None
    for _ in range(TTFT_RETRIES + 1):
        link = _link(_spared(planner, prefill, prefill_screened), _spared(planner, decode, decode_screened))
        offered = planner.peak_load / prefill.workers
        prefill_result = _simulate_role(planner, prefill_screened, PREFILL_POOL, requests, offered, prefill.workers)
        times = _pool_times(planner, prefill_result, decode_result, decode, requests, link)
        combined = combine(times)
        checks = _combined_checks(combined, slo, prefill_result.warmup_requests)
        if all(ratio <= 1 for *_, ratio in checks):
            break
        prefill = _pool(planner, prefill_screened, PREFILL_POOL, prefill.workers + 1)
    else:
        worst = max(checks, key=lambda check: check[3])
        return Infeasible(decode.configuration, (f"disaggregated with {prefill.configuration.label} prefill: "
                                                 + _describe(worst, slo.percentile),))
    # The plan: its pools with their spares, its prediction theirs without (the guarantee).
    prefill, decode = _spared(planner, prefill, prefill_screened), _spared(planner, decode, decode_screened)
    gpus = prefill.gpus + decode.gpus
    priced = prefill.cost_per_hour_usd is not None and decode.cost_per_hour_usd is not None
    cost = prefill.cost_per_hour_usd + decode.cost_per_hour_usd if priced else None  # type: ignore[operator]
    tokens_per_s = planner.mean_load * planner.lengths.output_mean
    mean_prompt = max(1, round(planner.lengths.input_mean))
    transfer = kv_transfer(inputs.model, mean_prompt, decode.configuration.kv_dtype,
                           decode_tensor_parallel=decode.configuration.tensor_parallel,
                           decode_pipeline_parallel=decode.configuration.pipeline_parallel,
                           link=link[0], bandwidth_bytes_per_s=link[1], latency_s=link[2])
    skip = prefill_result.warmup_requests
    measured = Combined(combined.ttft_s[skip:], combined.tpot_s[skip:], combined.e2e_s[skip:])
    meets = _meets_all(measured, slo)
    prediction = Prediction(
        load=planner.peak_load,
        ttft=_combined_percentiles(measured, "ttft", slo.percentile),
        tpot=_combined_percentiles(measured, "tpot", slo.percentile),
        e2e=_combined_percentiles(measured, "e2e", slo.percentile),
        goodput_ratio=float(meets.mean()),
        requests_per_s=planner.peak_load,
        output_tokens_per_s=planner.peak_load * planner.lengths.output_mean,  # as sized
        preemptions=prefill_result.preemptions + decode_result.preemptions)
    worst = max(checks, key=lambda check: check[3])
    spares = f", {prefill.extra_workers} of each spare" if prefill.extra_workers else ""
    binding_detail = (f"closest to its limit: {_describe(worst, slo.percentile)} "
                      f"({prefill.workers} prefill and {decode.workers} decode workers{spares})")
    return DisaggregatedPlan(
        prefill=prefill, decode=decode, transfer=transfer, gpus=gpus, cost_per_hour_usd=cost,
        cost_per_million_output_tokens_usd=None if cost is None else cost_per_million_tokens(cost, tokens_per_s),
        output_tokens_per_s=tokens_per_s, predicted=prediction, meets_slo=True, binding_constraint=worst[0],
        binding_detail=binding_detail, mean_e2e_s=float(np.mean(measured.e2e_s)),
        prefill_share=_prefill_share(planner, prefill_screened, decode,
                                     float(np.mean(measured.e2e_s - measured.ttft_s))))


def _prefill_share(planner: _Planner, prefill: _Screened, decode: Pool, decoding_s: float) -> float:
    """Prefill's share of the GPU time a request takes (`DisaggregatedPlan.prefill_share`): a prefill worker's
    GPUs busy with the mean prompt (one of its schedulers' prefill time, its schedulers side by side), against
    the decode workers' (without spares: stepping while they hold requests) over the requests per second, or,
    where requests are too few to keep them stepping, one worker's GPUs for a request's `decoding_s` (its first
    token to its last: users thinking a day between requests leave the decode workers idle, which is no work)."""
    prefill_s = prefill.configuration.gpus_per_replica * _prefill_busy_s(planner, prefill) / prefill.schedulers
    gpus = decode.configuration.gpus_per_replica
    decode_s = min((decode.workers - decode.extra_workers) * gpus / planner.peak_load,
                   gpus * decoding_s)
    return prefill_s / (prefill_s + decode_s)


def _spared(planner: _Planner, pool: Pool, screened: _Screened | Infeasible | None) -> Pool:
    """The pool with `ha_policy.extra_replicas` spare workers (N + k per pool; `screened`: its configuration's)."""
    spares = planner.inputs.policy.extra_replicas
    if not spares:
        return pool
    assert isinstance(screened, _Screened)
    return _pool(planner, screened, pool.role, pool.workers + spares, spares)


def _combined_checks(combined: Combined, slo: Slo, skip: int) -> tuple[tuple[str, float, float, float], ...]:
    measured = Combined(combined.ttft_s[skip:], combined.tpot_s[skip:], combined.e2e_s[skip:])
    checks = []
    for name, limit in ((BINDING_TTFT, slo.ttft_s), (BINDING_TPOT, slo.tpot_s), (BINDING_E2E, slo.e2e_s)):
        if limit is None:
            continue
        value = measured.percentile(name, slo.percentile)
        if not math.isnan(value):
            checks.append((name, value, limit, value / limit))
    if slo.goodput_ratio is not None:
        fraction = float(_meets_all(measured, slo).mean())
        checks.append((BINDING_GOODPUT, fraction, slo.goodput_ratio,
                       slo.goodput_ratio / fraction if fraction > 0 else math.inf))
    return tuple(checks)


def _meets_all(combined: Combined, slo: Slo) -> np.ndarray:
    meets = (combined.ttft_s <= slo.ttft_s) & (np.isnan(combined.tpot_s) | (combined.tpot_s <= slo.tpot_s))
    if slo.e2e_s is not None:
        meets &= combined.e2e_s <= slo.e2e_s
    return meets


def _combined_percentiles(combined: Combined, metric: str, slo_percentile: float) -> Percentiles:
    p50, p95, p99 = (combined.percentile(metric, q) for q in PERCENTILES_REPORTED)
    return Percentiles(p50, p95, p99, combined.percentile(metric, slo_percentile))
