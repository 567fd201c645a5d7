"""The cheapest deployment that meets a latency SLO, with simulated percentiles (SIZING.md sections 6-9).

`plan` takes a model, a workload, an SLO and the configurations to consider (GPU, tensor and pipeline
parallel degrees, weight and KV precisions, engine knobs `max_num_seqs` / `max_num_batched_tokens`),
and returns the cheapest fleets that meet the SLO at the requested percentile, ranked, with a
cost-latency frontier and, for every configuration that cannot work, the reasons.

How it stays fast (well under a second over the whole catalog):

1. Analytic screening of every configuration, no simulation:
   - memory, by the engine's own accounting (`capacity.py`): the weights must leave room for a KV
     cache, and the longest request (prompt + answer) must fit in it alone;
   - TPOT floor: one decode step at batch 1 attending the median prompt. Every decode step of a
     request attends at least its prompt, and more sequences or prompt tokens in a step never make it
     shorter, so at any percentile >= 50 the TPOT is at least this;
   - TTFT floor: the prefill of the percentile prompt alone, chunked as the engine chunks it;
   - E2E floor (with an E2E SLO): the larger of the TTFT floor and (percentile answer − 1) decode steps
     at batch 1;
   - a throughput ceiling per replica (`_Planner._ceiling`): the best batch is the largest whose TPOT,
     decode step plus the prefills riding along, meets the SLO within KV capacity and max_num_seqs.
2. Branch and bound: configurations are visited by a cost lower bound (the replicas the ceiling x
   CEILING_MARGIN allows, x GPUs x price) and simulated only while that bound can still beat the
   PLANS_KEPT-th cheapest plan found, at most PLANS_PER_GPU plans per GPU type and MAX_SIMULATED in all, but
   for a configuration that could be the cheapest plan (its bound at or below the cheapest plan's cost), which
   is simulated whatever those caps, up to MAX_SIMULATED_FOR_CHEAPEST in all (the plan notes any left over).
   Then the cheapest plan's configuration at the next larger TP degree is simulated too (when the
   budget allows): more money for lower latency, so the cost-latency frontier has a next point.
3. For each simulated configuration, the fewest replicas whose share of the peak meets the SLO
   (`_Planner.settle`): a replica count R means a per-replica load of rate x peak-to-mean / (R x max
   utilization), simulated with the seeded simulator. The search starts at the count the ceiling
   implies; when that meets the SLO it tries the bound (CEILING_MARGIN), else it steps up (by the
   miss ratio, at least LOAD_STEP; after a TTFT or E2E miss of a replica that fell behind its
   arrivals, at most to the replicas its finishing rate carries, once: held again, the light load is run
   next and decides whether any count meets the SLO); then it bisects until R passes and
   R − 1 fails, or the loads are within LOAD_TOLERANCE. Searching the replica count rather than the
   exact limit stops as soon as the cost is settled, usually after one or two runs. Every run draws the
   same requests (one seed, arrival times scaled to the load: common random numbers), so configurations
   and loads are compared on the same requests and the answer is deterministic. Every run uses the full
   request count: short runs were measured to be optimistic near saturation, where the queue has not had
   time to build.

Fleet arithmetic, for a load λ (requests/s, or users), a peak-to-mean ratio p, a utilization cap u
and N+k spare replicas: replicas = R + k, R = ceil(λ·p / (max load per replica · u)). Two separate
knobs describe a bursty workload: the peak-to-mean ratio p scales the rate the fleet is sized for
(peaks above the mean rate), and the workload's `arrival_cv` says how arrivals bunch at a given rate
(Gamma gaps; 1 = Poisson) in the stream the fleet receives. A balancer deals it out at random over the fleet's
schedulers (replicas x attention-DP ranks x pipeline micro-batches), so each replica's scheduler is simulated with
its share of the stream so thinned (`workload.dealt_out_arrivals`).
TPOT is (E2E − TTFT)/(OSL − 1), the mean gap between output tokens after the first.

Longer than 600 lines because the search is one algorithm over shared state (screen by analytic
bounds, simulate what can win, size the fleet, rank): its steps read each other's intermediate results.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Protocol

import numpy as np

from app.sizing.engines import (
    ENGINES,
    EngineConfig,
    dense_over_attention_dp,
    gpu_problems,
    host_adjusted,
    layout_problems,
    pipeline_split,
    resolve_engine,
    with_running_limit,
)
from app.sizing.engines.base import DRAFT_MODEL, NGRAM, ResolvedEngine
from app.sizing.hardware.efficiency import Efficiency
from app.sizing.hardware.roofline import default_compute_dtype
from app.sizing.hardware.step_time import StepTimeModel, build_step_time_model
from app.sizing.layout import Layout, valid_tensor_parallel
from app.sizing.model.kv import layer_mix
from app.sizing.model.recipes import WeightRecipe, published_recipe
from app.sizing.model.weights import weight_bytes_per_gpu
from app.sizing.serving.memory import (
    KvBudget,
    kv_bytes_per_token_per_gpu,
    kv_token_capacity,
    memory_budget,
    stage_budgets,
)
from app.sizing.serving.simulate import (
    FULL,
    ON_DEMAND,
    KvCapacityError,
    SchedulerConfig,
    SimulationLimitError,
    SimulationResult,
    StepTimeFn,
    micro_batch_config,
    simulate,
)
from app.sizing.serving.speculative import SpeculativeDecoding, SpeculativeStepTime
from app.sizing.serving.workload import (
    Requests,
    Workload,
    dealt_out_arrivals,
    sample_requests,
    ways_to_poisson_like,
)
from app.sizing.specs import WEIGHT_DTYPES, GpuSpec, ModelSpec

OPEN_LOOP = "requests_per_s"
CLOSED_LOOP = "concurrent_users"

MAX_CONFIGURATIONS = 512  # GPUs x TP x PP x weight dtypes x KV dtypes x knob values, per request
# The default search's pipelines across nodes (`cross_node_pipelines`): stage counts tried, and the share of a
# GPU's memory its weights may take before one node cannot hold the model: vLLM's default
# gpu_memory_utilization, 0.90 (ENGINES.md section 1.1), is all the memory an engine budgets at all, so weights
# at or above it leave no KV cache.
PIPELINE_STAGES = (2, 4, 8)
PIPELINE_WEIGHT_SHARE = 0.90
# Its attention DP + EP layouts across nodes (`cross_node_expert_layouts`): whole nodes tried.
EXPERT_LAYOUT_NODES = (2, 4, 8)
DEFAULT_SIMULATED_REQUESTS = 2000
PLANS_KEPT = 3  # plans returned per price class; also what a configuration's bound must beat
PLANS_PER_GPU = 2  # the cheapest few per GPU type, for a meaningful frontier
MAX_SIMULATED = 6  # configurations simulated per request, at most, but for those that could be the cheapest ...
MAX_SIMULATED_FOR_CHEAPEST = 16  # ... which are simulated up to this many in all (past it, the plan says so)
UNPRICED_PLANS_KEPT = 1  # GPU types without a price, ranked by GPU count after the priced plans

CEILING_MARGIN = 1.1  # the analytic ceiling may be beaten a little: the replica-count bound allows for it
LOAD_STEP = 1.25  # after a miss, add replicas by at least this factor ...
MAX_LOAD_STEP = 4.0  # ... and at most this one (the factor is the miss ratio in between)
LIGHT_LOAD_FRACTION = 0.05  # a configuration missing the SLO at this fraction of its ceiling is given up ...
# ... and, where arrivals bunch (arrival_cv > 1), only once the fleet is large enough for each scheduler's share to be
# nearly Poisson (its CV^2 within this of 1, `workload.ways_to_poisson_like`): a bunched stream thins as replicas are
# added, so a miss at a light load of a small fleet proves nothing (CV 4 at 5 req/s, p99 TTFT 150 ms: Llama-3.1-8B
# on H100 missed at 9 replicas and met at 60).
POISSON_LIKE = 0.1
LOAD_TOLERANCE = 1.08  # replica counts within 8 % of each other are not told apart
OFFERED_LOAD_RETRIES = 3  # extra replicas tried when the offered load itself misses (simulation noise)
CLOSED_LOOP_REQUESTS_PER_USER = 3  # a closed-loop run needs several requests per user to reach steady state
MAX_CLOSED_LOOP_REQUESTS = 20_000  # ... up to this many (a replica of thousands of users)

PERCENTILES_REPORTED = (50.0, 95.0, 99.0)

BINDING_TTFT = "ttft"
BINDING_TPOT = "tpot"
BINDING_E2E = "e2e"
BINDING_GOODPUT = "goodput"

MAX_MODEL_LEN_SOURCE = "the workload's longest prompt + longest answer"

# What a configuration serves: both phases, or one pool of a disaggregated deployment.
AGGREGATED = "aggregated"
PREFILL_POOL = "prefill"
DECODE_POOL = "decode"

PRICE_FROM_REQUEST = "request"
PRICE_FROM_CATALOG = "catalog"


class SearchSpaceTooLarge(ValueError):
    """More configurations than MAX_CONFIGURATIONS."""


# Inputs ------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Slo:
    """Latency targets at one percentile, and an optional goodput target (share of requests meeting
    every target)."""

    ttft_s: float
    tpot_s: float
    e2e_s: float | None = None
    percentile: float = 95.0
    goodput_ratio: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s", "e2e_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number")
        if not 50 <= self.percentile <= 99.9:
            raise ValueError("percentile must be in [50, 99.9]")
        if self.goodput_ratio is not None and not 0 < self.goodput_ratio <= 1:
            raise ValueError("goodput_ratio must be in (0, 1]")


# The lowest load cap a plan sizes for: 1% of what meets the SLO already means a fleet of 100 times the
# load. Lower caps size fleets past any arithmetic of counts and costs (a cap of 1e-300 asked for 10^300
# replicas, whose bisection overflowed a float).
MIN_UTILIZATION_RATIO = 0.01


@dataclass(frozen=True, slots=True)
class HaPolicy:
    """Spare replicas (N+k) and a cap on each replica's load as a fraction of what meets the SLO."""

    extra_replicas: int = 0
    max_utilization_ratio: float = 1.0

    def __post_init__(self) -> None:
        if self.extra_replicas < 0:
            raise ValueError("extra_replicas must be >= 0")
        if not MIN_UTILIZATION_RATIO <= self.max_utilization_ratio <= 1:
            raise ValueError(f"max_utilization_ratio must be in [{MIN_UTILIZATION_RATIO}, 1]")


@dataclass(frozen=True, slots=True)
class Configuration:
    """One way to serve the model: hardware, layout, precisions and engine knobs (None = default)."""

    gpu: GpuSpec
    tensor_parallel: int
    pipeline_parallel: int
    weight_dtype: str
    kv_dtype: str
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    data_parallel: int = 1  # attention data-parallel ranks (app.sizing.layout)
    expert_parallel: int = 1

    @property
    def layout(self) -> Layout:
        return Layout(self.tensor_parallel, self.pipeline_parallel, self.data_parallel, self.expert_parallel)

    @property
    def gpus_per_replica(self) -> int:
        return self.layout.gpus

    @property
    def label(self) -> str:
        knobs = "".join(f", {name} {value}" for name, value in (
            ("max_num_seqs", self.max_num_seqs), ("max_num_batched_tokens", self.max_num_batched_tokens))
            if value is not None)
        return (f"{self.gpu.slug or self.gpu.name} {self.layout.label}, "
                f"{self.weight_dtype} weights, {self.kv_dtype} KV{knobs}")


@dataclass(frozen=True, slots=True)
class DraftModel:
    """Speculative decoding's draft model: it runs on the target's GPUs, at the target's TP degree when
    that divides its heads, else on one GPU."""

    model: ModelSpec
    weight_dtype: str

    def tensor_parallel(self, target_tensor_parallel: int) -> int:
        return target_tensor_parallel if self.model.num_attention_heads % target_tensor_parallel == 0 else 1


@dataclass(frozen=True, slots=True)
class PlanInputs:
    """Everything `plan` needs besides the configurations.

    `efficiencies` maps (GPU slug, compute dtype) to the calibrated efficiency to use there (the
    service resolves them); a configuration whose pair is missing is reported infeasible.
    `prices` overrides the catalog price per GPU-hour by GPU slug. `peak_to_mean_ratio` multiplies
    the rate the fleet is sized for; the workload's `arrival_cv` shapes the simulated arrivals.
    """

    model: ModelSpec
    workload: Workload
    slo: Slo
    efficiencies: Mapping[tuple[str, str], Efficiency]
    engine: str = "vllm"
    peak_to_mean_ratio: float = 1.0
    policy: HaPolicy = HaPolicy()
    prices: Mapping[str, float] = field(default_factory=dict)
    speculative: SpeculativeDecoding | None = None
    draft: DraftModel | None = None
    seed: int = 0
    simulated_requests: int = DEFAULT_SIMULATED_REQUESTS

    def __post_init__(self) -> None:
        if not (math.isfinite(self.peak_to_mean_ratio) and self.peak_to_mean_ratio >= 1):
            raise ValueError("peak_to_mean_ratio must be >= 1")
        if self.workload.is_closed_loop and self.peak_to_mean_ratio != 1:
            raise ValueError("peak_to_mean_ratio applies to requests_per_s (open loop) only")
        if self.simulated_requests < 100:
            raise ValueError("simulated_requests must be >= 100")
        if (self.speculative is not None and self.speculative.has_draft_model) != (self.draft is not None):
            raise ValueError("give a draft model exactly when the speculation uses one")
        if self.draft is not None and self.draft.weight_dtype not in WEIGHT_DTYPES:
            raise ValueError(f"unknown draft weight dtype {self.draft.weight_dtype!r}")
        if any(not (math.isfinite(price) and price >= 0) for price in self.prices.values()):
            raise ValueError("prices must be finite and >= 0")
        longest = _Lengths.of(self.workload, self.slo.percentile).longest_request
        if longest > self.model.max_position_embeddings:
            raise ValueError(f"the longest request (prompt + answer up to {longest:,} tokens) exceeds the model's "
                             f"{self.model.max_position_embeddings:,} positions")

    @property
    def speculative_kind(self) -> str | None:
        """What the engine runs beside the model (`EngineConfig.speculative`): a draft model or n-gram lookup."""
        if self.speculative is None:
            return None
        return DRAFT_MODEL if self.speculative.has_draft_model else NGRAM


# Results -----------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Percentiles:
    p50_s: float
    p95_s: float
    p99_s: float
    at_slo_percentile_s: float


@dataclass(frozen=True, slots=True)
class Prediction:
    """What the simulator predicts for one replica at a load (NaN TPOT when every answer is 1 token)."""

    load: float  # requests/s (open loop) or users (closed loop) per replica
    ttft: Percentiles
    tpot: Percentiles
    e2e: Percentiles
    goodput_ratio: float  # share of measured requests meeting every SLO
    requests_per_s: float
    output_tokens_per_s: float
    preemptions: int


@dataclass(frozen=True, slots=True)
class Plan:
    configuration: Configuration
    compute_dtype: str
    efficiency: Efficiency
    engine: ResolvedEngine  # every engine setting used, max_num_seqs resolved
    kv_tokens_per_replica: int
    load_kind: str  # OPEN_LOOP or CLOSED_LOOP
    max_load_per_replica: float  # the highest load simulated that meets the SLO (it settled the replicas)
    failing_load_per_replica: float | None  # the lowest load seen to miss it (None: none tried)
    ceiling_load_per_replica: float  # the analytic throughput ceiling
    offered_load_per_replica: float
    replicas: int  # including extra_replicas
    extra_replicas: int
    gpus: int
    nodes: int
    price_per_gpu_hour_usd: float | None
    price_source: str | None  # PRICE_FROM_REQUEST or PRICE_FROM_CATALOG; None when unpriced
    cost_per_hour_usd: float | None
    cost_per_million_output_tokens_usd: float | None
    output_tokens_per_s: float  # the whole fleet at the stated peak load
    output_tokens_per_s_per_gpu: float
    utilization_ratio: float  # offered / max load per replica
    predicted: Prediction  # one replica at the offered load
    meets_slo: bool  # the prediction meets every SLO (a plan is only made when it does)
    binding_constraint: str  # which SLO limits a replica's load
    binding_detail: str
    tokens_per_pass: float | None  # speculative decoding's expected tokens per target pass

    @property
    def e2e_at_slo_percentile_s(self) -> float:
        return self.predicted.e2e.at_slo_percentile_s


@dataclass(frozen=True, slots=True)
class Infeasible:
    configuration: Configuration
    reasons: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SearchStats:
    configurations: int  # considered
    screened_out: int  # infeasible by the analytic bounds (memory, floors)
    bounded_out: int  # feasible as far as the bounds tell, but unable to beat the plans found
    simulated: int  # configurations simulated
    infeasible_in_simulation: int  # simulated, but no load met the SLO
    simulations: int  # simulator runs
    simulated_requests: int  # requests simulated, all runs together
    requests_per_run: int
    seed: int


@dataclass(frozen=True, slots=True)
class PlanResult:
    feasible: bool
    plans: tuple[Plan, ...]  # priced cheapest first, then unpriced by GPU count
    infeasible: tuple[Infeasible, ...]
    stats: SearchStats
    max_model_len: int
    notes: tuple[str, ...]


def max_model_len(inputs: PlanInputs) -> int:
    """The context every replica is configured for: the workload's longest prompt + longest answer."""
    return _Lengths.of(inputs.workload, inputs.slo.percentile).longest_request


# Configuration space -----------------------------------------------------------------------------

def default_tensor_parallel(model: ModelSpec, gpu: GpuSpec) -> tuple[int, ...]:
    """Degrees the model's heads, KV heads and widths split evenly over, inside one node of this GPU."""
    return valid_tensor_parallel(model, gpu.gpus_per_node)


def expert_layouts(model: ModelSpec, gpu: GpuSpec, engine: str | None = None) -> tuple[tuple[int, int, int], ...]:
    """The (tp, dp, ep) layouts searched besides plain TP for an MoE model: at each GPU count g of a valid TP
    degree, attention DP with one EP rank per GPU ("DEP g": tp 1, dp g, ep g) and TP with EP (tp g, ep g),
    the layouts TensorRT-LLM, SGLang and vLLM serve DeepSeek, Qwen3-MoE and gpt-oss with; those the engine
    or the model refuse are left out. Dense models: none."""
    return _expert_layouts(model, gpu.gpus_per_node, engine) if model.is_moe else ()


# A pure function of its arguments, asked for every GPU of a plan's search twice (its configurations and their
# count), each time checking two layouts per valid TP degree against the model's and the engine's rules.
@lru_cache(maxsize=512)
def _expert_layouts(model: ModelSpec, gpus_per_node: int, engine: str | None) -> tuple[tuple[int, int, int], ...]:
    found = []
    for size in valid_tensor_parallel(model, gpus_per_node):
        for tp, dp in ((1, size), (size, 1)):
            if size > 1 and size <= model.num_experts:
                layout = Layout(tp, 1, dp, size)
                if not layout_problems(model, layout, engine, gpus_per_node):
                    found.append((tp, dp, size))
    return tuple(found)


def _layouts(model: ModelSpec, gpu: GpuSpec, tensor_parallel: Sequence[int] | None,
             data_parallel: Sequence[int] | None, expert_parallel: Sequence[int] | None,
             engine: str | None) -> list[tuple[int, int, int]]:
    """(tp, dp, ep) per GPU: the given degrees combined (those that make no layout dropped), or by default the
    valid TP degrees and, for MoE models, `expert_layouts`."""
    if data_parallel is None and expert_parallel is None:
        if tensor_parallel is not None:
            return [(tp, 1, 1) for tp in tensor_parallel]
        return ([(tp, 1, 1) for tp in default_tensor_parallel(model, gpu)]
                + list(expert_layouts(model, gpu, engine)))
    return [(tp, dp, ep)
            for tp in (tensor_parallel if tensor_parallel is not None else default_tensor_parallel(model, gpu))
            for dp in (data_parallel or (1,)) for ep in (expert_parallel or (1,)) if (tp * dp) % ep == 0]


def cross_node_pipelines(model: ModelSpec, gpu: GpuSpec, weight_dtype: str, tensor_parallel: Sequence[int] | None,
                         engine: str | None = None) -> tuple[tuple[int, int], ...]:
    """(tp, pp) layouts the default search adds for a model one node of this GPU cannot hold: tensor
    parallelism beyond one node's NVLink domain would send its two all-reduces per layer through the nodes'
    NICs, each paying NCCL's inter-node steps (`comm.tp_network_latency_s`), where a pipeline crosses
    between nodes once per stage boundary (SIZING.md section 6), so such a model is split into pipeline
    stages across nodes, each stage a full node's TP (the largest searched degree). "Cannot hold": its
    weights per GPU at that TP reach `PIPELINE_WEIGHT_SHARE` of the GPU's memory. Then the fewest stages (of
    `PIPELINE_STAGES`) whose weights per GPU fall below that share, and twice as many (more room for the KV
    cache) where the layout is valid; () when the node holds the model."""
    beyond = _beyond_one_node(model, gpu, weight_dtype, tensor_parallel)
    if beyond is None:
        return ()
    tp, weights, checkpoint = beyond
    layouts = [Layout(tp, pp) for pp in PIPELINE_STAGES]
    return tuple((layout.tensor_parallel, layout.pipeline_parallel)
                 for layout in _fewest_that_hold(model, gpu, weights, checkpoint, layouts, engine))


def cross_node_expert_layouts(model: ModelSpec, gpu: GpuSpec, weight_dtype: str,
                              tensor_parallel: Sequence[int] | None,
                              engine: str | None = None) -> tuple[tuple[int, int, int], ...]:
    """(tp, dp, ep) layouts the default search adds for an MoE model one node of this GPU cannot hold (as
    `cross_node_pipelines` judges it): attention DP with one EP rank per GPU over whole nodes ("DEP g", g =
    nodes x the node's GPUs), the wide expert parallelism DeepSeek-V3 is served with across nodes. No tensor
    parallelism crosses a node; each GPU keeps its own requests' attention and KV, its share of the routed
    experts, and a copy of everything else, and the experts' exchange crosses the scale-out network
    (`comm.py`). The fewest nodes (of `EXPERT_LAYOUT_NODES`) whose weights per GPU fall below
    `PIPELINE_WEIGHT_SHARE` of its memory, and twice as many, where the model (every EP rank owns an expert)
    and the engine accept the layout; () for dense models and models one node holds."""
    if not model.is_moe:
        return ()
    beyond = _beyond_one_node(model, gpu, weight_dtype, tensor_parallel)
    if beyond is None:
        return ()
    _, weights, checkpoint = beyond
    layouts = [Layout(1, 1, size, size) for size in (nodes * gpu.gpus_per_node for nodes in EXPERT_LAYOUT_NODES)]
    return tuple((layout.tensor_parallel, layout.data_parallel, layout.expert_parallel)
                 for layout in _fewest_that_hold(model, gpu, weights, checkpoint, layouts, engine))


def _beyond_one_node(model: ModelSpec, gpu: GpuSpec, weight_dtype: str, tensor_parallel: Sequence[int] | None,
                     ) -> tuple[int, str | WeightRecipe, WeightRecipe | None] | None:
    """(a full node's TP, the weights as planned, their published checkpoint or None) when one node of this GPU
    cannot hold the model: its weights per GPU at the largest searched TP degree reach `PIPELINE_WEIGHT_SHARE` of
    the GPU's memory; None when it can (or no degree is valid)."""
    degrees = tensor_parallel if tensor_parallel is not None else default_tensor_parallel(model, gpu)
    if not degrees:
        return None
    checkpoint = published_recipe(model.slug, weight_dtype)
    weights = checkpoint or weight_dtype
    if weight_bytes_per_gpu(model, weights, max(degrees)) < PIPELINE_WEIGHT_SHARE * gpu.memory_bytes:
        return None
    return max(degrees), weights, checkpoint


def _fewest_that_hold(model: ModelSpec, gpu: GpuSpec, weights: str | WeightRecipe, checkpoint: WeightRecipe | None,
                      layouts: Sequence[Layout], engine: str | None) -> list[Layout]:
    """Of `layouts`, ever more GPUs, the valid ones (the model's, the engine's and the node's rules) with the fewest
    GPUs whose weights per GPU fall below `PIPELINE_WEIGHT_SHARE` of the GPU's memory, and with twice as many."""
    valid = [layout for layout in layouts
             if not layout_problems(model, layout, engine, gpu.gpus_per_node, checkpoint)]
    fitting = [layout.gpus for layout in valid
               if weight_bytes_per_gpu(model, weights, layout.tensor_parallel, layout.pipeline_parallel,
                                       layout.expert_parallel, layout.data_parallel, pipeline_split(engine),
                                       dense_over_attention_dp(engine))
               < PIPELINE_WEIGHT_SHARE * gpu.memory_bytes]
    if not fitting:
        return []
    return [layout for layout in valid if layout.gpus in (fitting[0], 2 * fitting[0])]


def search_space_size(model: ModelSpec, gpus: Sequence[GpuSpec], tensor_parallel: Sequence[int] | None,
                      pipeline_parallel: Sequence[int] | None, weight_dtypes: Sequence[str], kv_dtypes: Sequence[str],
                      max_num_seqs: Sequence[int | None] = (None,),
                      max_num_batched_tokens: Sequence[int | None] = (None,), *,
                      data_parallel: Sequence[int] | None = None, expert_parallel: Sequence[int] | None = None,
                      engine: str | None = None) -> int:
    """How many configurations `configurations` would list (counted, not listed)."""
    per_gpu = sum(len(_layouts(model, gpu, tensor_parallel, data_parallel, expert_parallel, engine)) for gpu in gpus)
    stages = len(pipeline_parallel or (1,))
    across_nodes = 0 if not adds_pipelines_across_nodes(pipeline_parallel, data_parallel, expert_parallel) else sum(
        len(cross_node_pipelines(model, gpu, weight_dtype, tensor_parallel, engine))
        for gpu in gpus for weight_dtype in weight_dtypes)
    if searches_layouts_across_nodes(tensor_parallel, pipeline_parallel, data_parallel, expert_parallel):
        across_nodes += sum(len(cross_node_expert_layouts(model, gpu, weight_dtype, tensor_parallel, engine))
                            for gpu in gpus for weight_dtype in weight_dtypes)
    return ((per_gpu * stages * len(weight_dtypes) + across_nodes) * len(kv_dtypes) * len(max_num_seqs)
            * len(max_num_batched_tokens))


def configurations(model: ModelSpec, gpus: Sequence[GpuSpec], tensor_parallel: Sequence[int] | None,
                   pipeline_parallel: Sequence[int] | None, weight_dtypes: Sequence[str], kv_dtypes: Sequence[str],
                   max_num_seqs: Sequence[int | None] = (None,),
                   max_num_batched_tokens: Sequence[int | None] = (None,), *,
                   data_parallel: Sequence[int] | None = None, expert_parallel: Sequence[int] | None = None,
                   engine: str | None = None) -> list[Configuration]:
    """Every combination, GPU by GPU. Layouts: the given tensor-, data- and expert-parallel degrees combined;
    with none given, `default_tensor_parallel` and, for MoE models, `expert_layouts` (for `engine`). Pipeline
    stages: the given degrees with every layout; with none given, one stage, plus `cross_node_pipelines` for
    a model one node cannot hold where the given DP and EP degrees admit them (`adds_pipelines_across_nodes`;
    those layouts last, GPU by GPU), and for such an MoE model, when no layout
    degree is given either, `cross_node_expert_layouts` (after them).

    Raises SearchSpaceTooLarge beyond MAX_CONFIGURATIONS, before listing anything.
    """
    size = search_space_size(model, gpus, tensor_parallel, pipeline_parallel, weight_dtypes, kv_dtypes,
                             max_num_seqs, max_num_batched_tokens, data_parallel=data_parallel,
                             expert_parallel=expert_parallel, engine=engine)
    if size > MAX_CONFIGURATIONS:
        raise SearchSpaceTooLarge(
            f"{size} configurations (GPUs x layouts x pipeline_parallel x weight dtypes x KV dtypes x "
            f"max_num_seqs x max_num_batched_tokens) exceed the limit of {MAX_CONFIGURATIONS}; narrow the "
            "candidates")
    found = [
        Configuration(gpu, tp, pp, weight_dtype, kv_dtype, seqs, batched, dp, ep)
        for gpu in gpus
        for tp, dp, ep in _layouts(model, gpu, tensor_parallel, data_parallel, expert_parallel, engine)
        for pp in (pipeline_parallel or (1,))
        for weight_dtype in weight_dtypes
        for kv_dtype in kv_dtypes
        for seqs in max_num_seqs
        for batched in max_num_batched_tokens
    ]
    if adds_pipelines_across_nodes(pipeline_parallel, data_parallel, expert_parallel):
        found += [
            Configuration(gpu, tp, pp, weight_dtype, kv_dtype, seqs, batched)
            for gpu in gpus
            for weight_dtype in weight_dtypes
            for tp, pp in cross_node_pipelines(model, gpu, weight_dtype, tensor_parallel, engine)
            for kv_dtype in kv_dtypes
            for seqs in max_num_seqs
            for batched in max_num_batched_tokens
        ]
    if searches_layouts_across_nodes(tensor_parallel, pipeline_parallel, data_parallel, expert_parallel):
        found += [
            Configuration(gpu, tp, 1, weight_dtype, kv_dtype, seqs, batched, dp, ep)
            for gpu in gpus
            for weight_dtype in weight_dtypes
            for tp, dp, ep in cross_node_expert_layouts(model, gpu, weight_dtype, tensor_parallel, engine)
            for kv_dtype in kv_dtypes
            for seqs in max_num_seqs
            for batched in max_num_batched_tokens
        ]
    return found


def adds_pipelines_across_nodes(pipeline_parallel: Sequence[int] | None, data_parallel: Sequence[int] | None,
                                expert_parallel: Sequence[int] | None) -> bool:
    """Whether the search adds `cross_node_pipelines` (for a model one node cannot hold): when no pipeline degree
    is given, and the data- and expert-parallel degrees given, if any, admit those layouts' 1 (they have neither)."""
    return (pipeline_parallel is None and (data_parallel is None or 1 in data_parallel)
            and (expert_parallel is None or 1 in expert_parallel))


def searches_layouts_across_nodes(tensor_parallel: Sequence[int] | None, pipeline_parallel: Sequence[int] | None,
                             data_parallel: Sequence[int] | None, expert_parallel: Sequence[int] | None) -> bool:
    """Whether the search picks the layouts itself (no degree given), and so adds `cross_node_expert_layouts` for
    an MoE model one node cannot hold."""
    return tensor_parallel is None and pipeline_parallel is None and data_parallel is None and expert_parallel is None


# Fleet arithmetic --------------------------------------------------------------------------------

def replicas_needed(mean_load: float, max_load_per_replica: float, policy: HaPolicy,
                    peak_to_mean_ratio: float = 1.0) -> int:
    """ceil(load · peak-to-mean / (max load per replica · max utilization)) + extra replicas.

    A relative 1e-9 is forgiven before rounding up, so 6 / (2 · 1.0) is 3 replicas, not 4.
    """
    if mean_load <= 0 or max_load_per_replica <= 0:
        raise ValueError("loads must be positive")
    return _base_replicas(mean_load * peak_to_mean_ratio / policy.max_utilization_ratio,
                          max_load_per_replica) + policy.extra_replicas


def _base_replicas(sized_load: float, max_load_per_replica: float) -> int:
    return max(1, math.ceil(sized_load / max_load_per_replica * (1 - 1e-9)))


def nodes_needed(replicas: int, tensor_parallel: int, pipeline_parallel: int, gpus_per_node: int) -> int:
    """Nodes for the fleet, tensor parallelism never crossing a node.

    Replicas that fit in a node share nodes (gpus_per_node // (tp·pp) replicas each); a larger replica
    puts gpus_per_node // tp pipeline stages in each node and needs ceil(pp / that) nodes.
    """
    if tensor_parallel > gpus_per_node:
        raise ValueError("tensor parallelism must stay inside one node")
    gpus = tensor_parallel * pipeline_parallel
    if gpus <= gpus_per_node:
        return math.ceil(replicas / (gpus_per_node // gpus))
    return replicas * math.ceil(pipeline_parallel / (gpus_per_node // tensor_parallel))


def replica_nodes(configuration: Configuration, replicas: int) -> int:
    """Nodes for `replicas` of this configuration (`nodes_needed`): its data-parallel ranks pack into nodes as
    pipeline stages do, whole tensor-parallel groups per node."""
    return nodes_needed(replicas, configuration.tensor_parallel,
                        configuration.pipeline_parallel * configuration.data_parallel, configuration.gpu.gpus_per_node)


def cost_per_million_tokens(cost_per_hour_usd: float, tokens_per_s: float) -> float:
    """$ per 1e6 tokens produced at `tokens_per_s`: cost per hour / (tokens per hour) x 1e6."""
    return cost_per_hour_usd / (tokens_per_s * 3600) * 1e6


def pareto_frontier(points: Sequence[tuple[float, float]]) -> tuple[int, ...]:
    """Indices of the (cost, latency) points no other point beats on both (ties kept once), by cost."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1], i))
    frontier: list[int] = []
    best_latency = math.inf
    for index in order:
        if points[index][1] < best_latency:
            frontier.append(index)
            best_latency = points[index][1]
    return tuple(frontier)


class CostedPlan(Protocol):
    """What the frontier reads of a plan, aggregated or disaggregated."""

    @property
    def cost_per_hour_usd(self) -> float | None: ...

    @property
    def gpus(self) -> int: ...

    @property
    def e2e_at_slo_percentile_s(self) -> float: ...


def plan_frontier(plans: Sequence[CostedPlan]) -> tuple[int, ...]:
    """Indices of the plans on the cost vs E2E frontier (at the SLO percentile), cheapest first: over the
    priced plans by $/hour, or by GPU count when none is priced."""
    priced = [i for i, p in enumerate(plans) if p.cost_per_hour_usd is not None]
    on_frontier = priced or list(range(len(plans)))
    axis = [(plans[i].cost_per_hour_usd if priced else plans[i].gpus, plans[i].e2e_at_slo_percentile_s)
            for i in on_frontier]
    return tuple(on_frontier[i] for i in pareto_frontier(axis))


# Workload statistics -----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class _Lengths:
    """The length statistics the bounds use."""

    input_mean: float
    output_mean: float
    input_median: int
    input_at_percentile: int
    output_at_percentile: int
    longest_request: int  # longest prompt + longest answer the workload can draw

    @classmethod
    def of(cls, workload: Workload, percentile: float) -> _Lengths:
        q = percentile / 100
        inputs, outputs = workload.input_tokens, workload.output_tokens
        return cls(
            input_mean=inputs.mean, output_mean=outputs.mean,
            input_median=math.ceil(inputs.quantile(0.5)),
            input_at_percentile=math.ceil(inputs.quantile(q)),
            output_at_percentile=math.ceil(outputs.quantile(q)),
            longest_request=math.ceil(inputs.quantile(1.0)) + math.ceil(outputs.quantile(1.0)),
        )


def cached_prompt_tokens(workload: Workload, prompt_tokens: int) -> int:
    """Prompt tokens a request of this length finds in the prefix cache (the rule of `Workload`)."""
    shared = min(workload.shared_prefix_tokens, prompt_tokens - 1)
    return max(shared, min(prompt_tokens - 1, round(workload.prefix_cache_hit_rate * prompt_tokens)))


def prefill_time_s(step_time: StepTimeFn, prompt_tokens: int, cached_tokens: int, chunk_tokens: int) -> float:
    """One prompt prefilled alone, in chunks of at most `chunk_tokens` after its cached prefix.

    A chunk of n tokens starting at position s attends n·s + n(n+1)/2 positions (causal).
    """
    if prompt_tokens - cached_tokens <= chunk_tokens:  # one chunk: the step time's scalar path
        new = prompt_tokens - cached_tokens
        return float(step_time(0, 0, new, new * cached_tokens + new * (new + 1) / 2))
    starts = np.arange(cached_tokens, prompt_tokens, chunk_tokens, dtype=float)
    chunks = np.minimum(chunk_tokens, prompt_tokens - starts)
    zeros = np.zeros_like(chunks)
    return float(np.sum(step_time(zeros, zeros, chunks, chunks * starts + chunks * (chunks + 1) / 2)))


# The planner -------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class _Screened:
    """A configuration that passed the analytic bounds, ready to simulate."""

    configuration: Configuration
    compute_dtype: str
    efficiency: Efficiency
    engine: ResolvedEngine
    scheduler: SchedulerConfig
    step_time: StepTimeFn
    ceiling: float  # max load per replica the analytic bound allows (requests/s or users)
    min_replicas: int  # base replicas (before extra_replicas) at CEILING_MARGIN x the ceiling
    price: float | None
    price_source: str | None
    cost_bound: tuple[int, float]  # (0, $/h) when priced, (1, GPUs) when not: a lower bound
    schedulers: int = 1  # side by side in a replica: dp ranks x pp micro-batches; `scheduler` is one of them
    kv_tokens_per_replica: int = 0


@dataclass(frozen=True, slots=True)
class _Run:
    load: float  # per replica
    result: SimulationResult  # one of the replica's schedulers
    checks: tuple[tuple[str, float, float, float], ...]  # (constraint, value, limit, > 1 = missed)
    schedulers: int = 1  # side by side in the replica

    @property
    def meets(self) -> bool:
        return all(ratio <= 1 for *_, ratio in self.checks)

    @property
    def worst(self) -> tuple[str, float, float, float]:
        return max(self.checks, key=lambda check: check[3])


@dataclass(frozen=True, slots=True)
class _Settled:
    replicas: int  # base replicas (before extra_replicas)
    passing: _Run  # at the load those replicas carry each
    failing: _Run | None  # at the load one replica fewer (or the lowest seen missing)


class _Planner:
    """One planning run: the shared inputs and the simulation counters."""

    def __init__(self, inputs: PlanInputs) -> None:
        self.inputs = inputs
        self.slo = inputs.slo
        self.workload = inputs.workload
        self.closed_loop = inputs.workload.is_closed_loop
        self.lengths = _Lengths.of(inputs.workload, inputs.slo.percentile)
        self.max_model_len = self.lengths.longest_request
        self.mean_load = float(inputs.workload.concurrent_users if self.closed_loop
                               else inputs.workload.requests_per_s)  # type: ignore[arg-type]
        self.peak_load = self.mean_load * inputs.peak_to_mean_ratio  # what the fleet is offered at its peak
        # What the base replicas must carry together: the peak load over the utilization cap.
        self.sized_load = self.peak_load / inputs.policy.max_utilization_ratio
        self.simulations = 0
        self.simulated_requests = 0
        self._requests: dict[int, Requests] = {}
        self._arrivals: dict[tuple[int, int], np.ndarray] = {}

    # Screening ---------------------------------------------------------------------------------

    def screen(self, configuration: Configuration, role: str = AGGREGATED) -> _Screened | Infeasible:
        """The configuration against the analytic bounds. A disaggregated pool (`role` "prefill" or
        "decode") is held only to the floors of its own phase. A replica runs dp x pp schedulers side by
        side (each attention data-parallel rank has its own, and a rank's pipeline keeps pp micro-batches in
        flight, `simulate.simulate_pipeline`): the scheduler simulated is one of them, with its share of
        the KV cache and of max_num_seqs, at its share of the replica's load."""
        inputs, model, gpu = self.inputs, self.inputs.model, configuration.gpu
        tp, pp = configuration.tensor_parallel, configuration.pipeline_parallel
        dp, ep = configuration.data_parallel, configuration.expert_parallel

        def infeasible(*reasons: str) -> Infeasible:
            return Infeasible(configuration, reasons)

        unsupported = gpu_problems(inputs.engine, gpu)
        if unsupported:
            return infeasible(*unsupported)
        checkpoint = published_recipe(model.slug, configuration.weight_dtype)  # None: the plain dtype throughout
        weights = checkpoint or configuration.weight_dtype
        problems = layout_problems(model, configuration.layout, inputs.engine, gpu.gpus_per_node, checkpoint,
                                   inputs.speculative_kind)
        if problems:
            return infeasible(*(f"{configuration.layout.label} on {gpu.slug or gpu.name}: {problem.rule}"
                                for problem in problems))
        try:
            compute_dtype = default_compute_dtype(gpu, configuration.weight_dtype)
        except ValueError as exc:
            return infeasible(str(exc))
        efficiency = inputs.efficiencies.get((gpu.slug, compute_dtype))
        if efficiency is None:
            return infeasible(f"no efficiency for {gpu.slug or gpu.name} at {compute_dtype}")
        config = EngineConfig(engine=inputs.engine, max_num_seqs=configuration.max_num_seqs,
                              max_num_batched_tokens=configuration.max_num_batched_tokens,
                              max_model_len=self.max_model_len, speculative=inputs.speculative_kind,
                              disaggregated=role != AGGREGATED)
        engine = resolve_engine(config, model, gpu, tp, pp, data_parallel=dp)
        efficiency = host_adjusted(efficiency, engine.engine, engine.engine_version, pp, role == PREFILL_POOL,
                                   role == DECODE_POOL, data_parallel=dp, speculative=inputs.speculative_kind,
                                   vendor=gpu.vendor)
        engine = replace(engine, sources=tuple(
            (name, MAX_MODEL_LEN_SOURCE if name == "max_model_len" else source) for name, source in engine.sources))
        memory = memory_budget(model, gpu, engine, tensor_parallel=tp, pipeline_parallel=pp,
                               weight_dtype=weights, data_parallel=dp, expert_parallel=ep)
        kv_budget: KvBudget = memory.kv_budget_bytes_per_stage
        draft_steps = None
        if inputs.draft is not None:  # placed beside the heaviest stage's weights, its share taken on every stage
            kv_budget, draft_steps = self._with_draft(configuration, memory.kv_budget_bytes_per_gpu)
            if draft_steps is None:
                return infeasible(f"{gpu.slug or gpu.name} has no tensor rate for the draft model's "
                                  f"{inputs.draft.weight_dtype} weights")
        if min(stage_budgets(kv_budget, pp)) <= 0:
            return infeasible(
                f"weights need {_gb(memory.weights_bytes_per_gpu)} per GPU "
                f"({checkpoint.name if checkpoint else configuration.weight_dtype}, "
                f"{_layout_text(configuration.layout)}); with {_gb(memory.activation_bytes_per_gpu)} of activations and "
                f"{_gb(memory.overhead_bytes_per_gpu)} of engine overhead"
                + (" and the draft model" if inputs.draft is not None else "")
                + f" that leaves no KV cache in {engine.engine}'s {_gb(memory.usable_bytes_per_gpu)} budget of a "
                f"{_gb(memory.total_bytes_per_gpu)} GPU")
        rank_tokens, _ = kv_token_capacity(model, kv_budget, configuration.kv_dtype, tensor_parallel=tp,
                                           pipeline_parallel=pp, block_size=engine.block_size,
                                           split=pipeline_split(engine.engine))
        engine = _resolve_max_num_seqs(engine, rank_tokens)
        shares_steps = ENGINES[engine.engine].mixes_prefill_into_decode()
        if shares_steps and engine.max_num_seqs is not None and engine.max_num_seqs > engine.max_num_batched_tokens:
            return infeasible(f"max_num_seqs {engine.max_num_seqs} exceeds max_num_batched_tokens "
                              f"{engine.max_num_batched_tokens}: a step could not decode every running "
                              "sequence (vLLM refuses this too)")
        blocks = rank_tokens // engine.block_size // pp  # one scheduler's share (simulate.micro_batch_config)
        kv_tokens = blocks * engine.block_size
        shared_prefix = self.workload.shared_prefix_tokens
        if -(-self.max_model_len // engine.block_size) + -(-shared_prefix // engine.block_size) > blocks:
            pinned = f" plus the shared prefix of {shared_prefix:,} kept for all" if shared_prefix else ""
            holder = ("per replica" if dp == pp == 1 else
                      f"per scheduler ({_layout_text(configuration.layout)}: {dp * pp} side by side)")
            return infeasible(
                f"the KV cache holds {kv_tokens:,} tokens {holder}, fewer than the longest request's "
                f"{self.max_model_len:,} (prompt + answer){pinned}")
        full_layers, window_layers = layer_mix(model, engine.block_size, pp, pipeline_split(engine.engine))
        scheduler = micro_batch_config(SchedulerConfig(
            kv_capacity_tokens=rank_tokens, block_size=engine.block_size,
            max_num_seqs=engine.max_num_seqs or engine.max_num_batched_tokens,
            max_num_batched_tokens=engine.max_num_batched_tokens,
            mixed_prefill=shares_steps,
            kv_tokens_reserved_per_request=ON_DEMAND if engine.kv_allocation == ON_DEMAND else FULL,
            full_layers=full_layers, window_layers=window_layers), pp)

        def timed(pipeline_period: bool) -> StepTimeFn:  # callable, and times runs of decode steps in closed form
            target = build_step_time_model(
                model, gpu, tensor_parallel=tp, pipeline_parallel=pp, weight_dtype=weights,
                kv_dtype=configuration.kv_dtype, compute_dtype=compute_dtype, efficiency=efficiency,
                data_parallel=dp, expert_parallel=ep, pipeline_period=pipeline_period,
                moe_exchange=ENGINES[engine.engine].moe_exchange)
            return target if inputs.speculative is None else SpeculativeStepTime(target, inputs.speculative,
                                                                                 draft_steps)

        # The floors are one request alone: its steps make one trip through the stages. Under load every
        # micro-batch of a pipeline is in flight and steps once per period (`step_time.pipeline_period_scales`).
        step_time = timed(False)
        reasons = self._floor_reasons(step_time, scheduler, role)
        if reasons:
            return infeasible(*reasons)
        if pp > 1:
            step_time = timed(True)
        schedulers = dp * pp
        ceiling = self._ceiling(step_time, scheduler, decode_only=role == DECODE_POOL) * schedulers
        price, source = self._price(gpu)
        min_replicas = _base_replicas(self.sized_load, ceiling * CEILING_MARGIN)
        gpus = (min_replicas + inputs.policy.extra_replicas) * configuration.gpus_per_replica
        bound = (0, gpus * price) if price is not None else (1, float(gpus))
        return _Screened(configuration, compute_dtype, efficiency, engine, scheduler, step_time, ceiling,
                         min_replicas, price, source, bound, schedulers, rank_tokens * dp)

    def _with_draft(self, configuration: Configuration, kv_budget: int) -> tuple[int, StepTimeModel | None]:
        """The target's share of the KV budget once the draft model's weights and KV are placed, and the
        draft's step times (None when the GPU cannot run the draft's precision).

        The draft's weights come off the budget; the rest is split between the two caches in proportion
        to their bytes per token, since every sequence keeps both.
        """
        draft, gpu = self.inputs.draft, configuration.gpu
        assert draft is not None
        draft_tp = draft.tensor_parallel(configuration.tensor_parallel)
        try:
            compute_dtype = default_compute_dtype(gpu, draft.weight_dtype)
        except ValueError:
            return kv_budget, None
        efficiency = self.inputs.efficiencies.get((gpu.slug, compute_dtype))
        if efficiency is None:
            return kv_budget, None
        remaining = kv_budget - weight_bytes_per_gpu(draft.model, draft.weight_dtype, draft_tp)
        target_per_token = kv_bytes_per_token_per_gpu(
            self.inputs.model, configuration.kv_dtype, tensor_parallel=configuration.tensor_parallel,
            pipeline_parallel=configuration.pipeline_parallel)
        draft_per_token = kv_bytes_per_token_per_gpu(draft.model, configuration.kv_dtype,
                                                     tensor_parallel=draft_tp, pipeline_parallel=1)
        share = remaining * target_per_token // (target_per_token + draft_per_token) if remaining > 0 else 0
        steps = build_step_time_model(  # the host loop's per-sequence work is the target's step's
            draft.model, gpu, tensor_parallel=draft_tp, weight_dtype=draft.weight_dtype,
            kv_dtype=configuration.kv_dtype, compute_dtype=compute_dtype, efficiency=host_adjusted(efficiency, None))
        return share, steps

    def _floor_reasons(self, step_time: StepTimeFn, scheduler: SchedulerConfig, role: str) -> list[str]:
        slo, lengths, p = self.slo, self.lengths, f"p{self.slo.percentile:g}"
        reasons = []
        tpot_floor = float(step_time(1, lengths.input_median, 0, 0))
        if role != PREFILL_POOL and lengths.output_at_percentile > 1 and tpot_floor > slo.tpot_s:
            reasons.append(f"TPOT floor {_ms(tpot_floor)} at batch 1 exceeds {_ms(slo.tpot_s)} (one decode "
                           f"step attending the median prompt of {lengths.input_median:,} tokens)")
        prompt = lengths.input_at_percentile
        ttft_floor = prefill_time_s(step_time, prompt, cached_prompt_tokens(self.workload, prompt),
                                    scheduler.max_num_batched_tokens)
        if role != DECODE_POOL and ttft_floor > slo.ttft_s:
            reasons.append(f"TTFT floor {_ms(ttft_floor)} exceeds {_ms(slo.ttft_s)} (the {p} prompt of "
                           f"{prompt:,} tokens prefilled alone)")
        if slo.e2e_s is not None and role == AGGREGATED:
            decode_floor = (lengths.output_at_percentile - 1) * float(step_time(1, 1, 0, 0))
            e2e_floor = max(ttft_floor, decode_floor)
            if e2e_floor > slo.e2e_s:
                answer = lengths.output_at_percentile
                reasons.append(f"E2E floor {_ms(e2e_floor)} exceeds {_ms(slo.e2e_s)} (the {p} prompt prefilled "
                               f"alone, or the {p} answer of {answer:,} token{'s' if answer != 1 else ''} decoded "
                               "at batch 1)")
        return reasons

    def _ceiling(self, step_time: StepTimeFn, scheduler: SchedulerConfig, decode_only: bool = False) -> float:
        """Max load per replica the step-time model allows (requests/s, or users in a closed loop).

        At a steady batch B every request spends (OSL − 1) decode steps, each shared by B requests,
        and its prompt is prefilled in chunks riding along decode steps, at the marginal cost p(B) of
        adding them. A running request's TPOT then includes the prefills of the requests that replace
        finished ones: TPOT(B) = decode(B) + B·p(B)/(OSL − 1). The best batch is the largest with
        TPOT(B) within the SLO (and within KV capacity and max_num_seqs); the ceiling is
        1 / ((OSL − 1)·decode(B)/B + p(B)) requests/s, or B users, B·(E + Z)/E of them (whole users, rounded
        down) when each thinks Z between its requests (`Workload.think_time_s`): a user then holds a sequence slot
        E = p(B) + (OSL − 1)·TPOT(B) of every E + Z.

        A disaggregated deployment's decode worker (`decode_only`) prefills nothing: p(B) = 0, its prompts'
        KV arrives from the prefill pool.

        B is found by bisection (a dozen step times, not one per batch size), which assumes TPOT(B)
        grows with B. It can dip where a chunk rides along a compute-bound step (the chunk then costs
        less beside a larger batch); the batch found then meets the SLO with the next one missing it,
        the largest batch when that one meets.
        """
        lengths = self.lengths
        mean_context = lengths.input_mean + lengths.output_mean / 2
        held = (lengths.input_mean + lengths.output_mean if scheduler.kv_tokens_reserved_per_request == FULL
                else mean_context)
        capacity = scheduler.kv_capacity_tokens
        if scheduler.window_layers:  # window layers counted apart, as the simulator counts them
            final = np.array([round(lengths.input_mean + lengths.output_mean)])
            held += scheduler.block_size * float(scheduler.window_blocks(final)[0])
            capacity = scheduler.pool_blocks * scheduler.block_size
        largest = max(1, min(scheduler.max_num_seqs, int(capacity / held)))
        prompt = max(1, round(lengths.input_mean))
        new_tokens = prompt - cached_prompt_tokens(self.workload, prompt)
        prefix = prompt - new_tokens
        decode_steps = max(lengths.output_mean - 1, 1.0)

        def at(batch: int) -> tuple[float, float, float]:
            """The decode step of `batch` sequences, a prompt's prefill riding along it, and TPOT(batch)."""
            context = batch * mean_context
            decode = float(step_time(batch, context, 0, 0))
            if decode_only:
                return decode, 0.0, decode
            chunk = float(max(1, min(new_tokens, scheduler.max_num_batched_tokens - batch)))
            with_chunk = float(step_time(batch, context, chunk, chunk * prefix + chunk * (chunk + 1) / 2))
            prefill = (with_chunk - decode) / chunk * new_tokens
            return decode, prefill, decode + batch * prefill / decode_steps

        batch, best = 1, at(1)
        if best[2] <= self.slo.tpot_s:
            top = at(largest)
            if top[2] <= self.slo.tpot_s:
                batch, best = largest, top
            else:
                failing = largest  # batch meets, failing does not
                while failing - batch > 1:
                    middle = (batch + failing) // 2
                    timed = at(middle)
                    if timed[2] <= self.slo.tpot_s:
                        batch, best = middle, timed
                    else:
                        failing = middle
        decode, prefill, tpot = best
        # A decode worker runs at least one step a request (`disaggregation.decode_role_requests`: the step that
        # streams the first token), even for a one-token answer; an aggregated replica none after the prefill.
        steps = decode_steps if decode_only else max(lengths.output_mean - 1, 0.0)
        if self.closed_loop:
            think, busy = self.workload.think_time_s, prefill + steps * tpot
            return float(math.floor(batch * (1 + think / busy) + 1e-9) if think and busy > 0 else batch)
        return float(1 / (steps * decode / batch + prefill))

    def _price(self, gpu: GpuSpec) -> tuple[float | None, str | None]:
        if gpu.slug in self.inputs.prices:
            return self.inputs.prices[gpu.slug], PRICE_FROM_REQUEST
        if gpu.price_per_hour_usd is not None:
            return gpu.price_per_hour_usd, PRICE_FROM_CATALOG
        return None, None

    # Simulation --------------------------------------------------------------------------------

    def run(self, screened: _Screened, load: float, replicas: int) -> _Run:
        """Simulate one of `replicas` replicas at `load` (requests/s, or users) with the full request count: one
        of its `schedulers` side-by-side schedulers at its share of the load (rates and tokens scale back up in
        `_prediction`), the open loop's stream dealt out over every scheduler of the fleet (`arrivals`)."""
        count = self.inputs.simulated_requests
        users = None
        share = load / screened.schedulers
        if self.closed_loop:
            users = max(1, math.ceil(share * (1 - 1e-9)))
            count = max(count, min(CLOSED_LOOP_REQUESTS_PER_USER * users, MAX_CLOSED_LOOP_REQUESTS))
        requests = self._unit_requests(count)
        if not self.closed_loop:
            requests = replace(requests, arrival_s=self.arrivals(count, replicas * screened.schedulers) / share)
        self.simulations += 1
        self.simulated_requests += count
        result = simulate(screened.step_time, screened.scheduler, requests, closed_loop_users=users)
        return _Run(load, result, _checks(result, self.slo), screened.schedulers)

    def _unit_requests(self, count: int) -> Requests:
        """`count` requests drawn with the plan's seed: arrivals at 1 request/s (scaled per run), or none
        (closed loop). The same draws for every configuration and load (common random numbers)."""
        if count not in self._requests:
            workload = self.workload
            if not self.closed_loop:
                workload = replace(workload, requests_per_s=1.0)  # keeps its arrival_cv
            self._requests[count] = sample_requests(workload, count, self.inputs.seed)
        return self._requests[count]

    def arrivals(self, count: int, ways: int) -> np.ndarray:
        """Unit-rate arrival times at one of the `ways` schedulers the fleet's stream is dealt out to: the
        workload's `arrival_cv` describes the stream a balancer receives, and each scheduler sees it thinned
        (`workload.dealt_out_arrivals`; the same lengths at every share, `sample_requests`). Poisson stays
        Poisson."""
        if self.workload.arrival_cv == 1:
            return self._unit_requests(count).arrival_s
        if (count, ways) not in self._arrivals:
            self._arrivals[count, ways] = dealt_out_arrivals(self.workload, ways, count, self.inputs.seed)
        return self._arrivals[count, ways]

    def load_per_replica(self, replicas: int) -> float:
        """Each of `replicas` base replicas' share of the sized load (whole users in a closed loop)."""
        share = self.sized_load / replicas
        return float(math.ceil(share * (1 - 1e-9))) if self.closed_loop else share

    def _replicas_served(self, run: _Run) -> int | None:
        """After a latency miss of a replica that finished fewer requests than it was sent (its queue grew
        through the run): the replicas that carry the sized load at the rate it did finish. The miss ratio
        overstates the shortfall then (a queue growing through the run makes p95 TTFT many times its SLO
        when the load is a few percent over what the replica serves). None (the miss ratio alone sets the
        step) otherwise: a closed loop, a TPOT miss, a replica that kept up."""
        served = run.result.requests_per_s * run.schedulers
        if self.closed_loop or run.worst[0] not in (BINDING_TTFT, BINDING_E2E) or not 0 < served < run.load:
            return None
        return _base_replicas(self.sized_load, served)

    def settle(self, screened: _Screened) -> _Settled | Infeasible:
        """The fewest base replicas whose per-replica load meets the SLO (module docstring, step 3)."""
        runs: dict[float, _Run] = {}

        def at(replicas: int) -> _Run:
            load = self.load_per_replica(replicas)
            if load not in runs:
                runs[load] = self.run(screened, load, replicas)
            return runs[load]

        lowest = screened.min_replicas
        start = max(lowest, _base_replicas(self.sized_load, screened.ceiling))
        passing: int | None = None
        failing: int | None = None
        if at(start).meets:
            passing = start
            if start > lowest:  # the bound allows fewer: try it, then bisect in between
                if at(lowest).meets:
                    passing = lowest
                else:
                    failing = lowest
        else:
            failing = start
            light = max(screened.ceiling * LIGHT_LOAD_FRACTION, 1.0 if self.closed_loop else 0.0)
            most = _base_replicas(self.sized_load, light)
            if not self.closed_loop and self.workload.arrival_cv > 1:  # bunching thins as the fleet grows
                ways = ways_to_poisson_like(self.workload.arrival_cv, POISSON_LIKE)
                most = max(most, math.ceil(ways / screened.schedulers))
            held = False  # whether a step was held to a replica's finishing rate already
            while passing is None:  # more replicas, by the miss ratio, until the SLO holds
                factor = min(max(at(failing).worst[3], LOAD_STEP), MAX_LOAD_STEP)
                step = math.ceil(failing * factor)
                served = self._replicas_served(at(failing))
                if served is not None and served < step:
                    # Held to the finishing rate once; held again, the replica still finishes a little short
                    # of what it is sent (a finite run's drain does, too) and may miss at every load (a p99.9
                    # TTFT above its SLO with each prompt alone): the light load decides, in one run, where
                    # steps of one replica at a time took 298 runs (gemma-2-27b on L40S, 2026-12-06).
                    step, held = (most, held) if held else (served, True)
                more = min(max(failing + 1, step), max(most, failing + 1))
                if at(more).meets:
                    passing = more
                elif more >= most:
                    return Infeasible(screened.configuration, (
                        _light_load_reason(at(more), self.closed_loop, self.slo.percentile),))
                else:
                    failing = more
        while failing is not None and passing - failing > 1 and passing / failing > LOAD_TOLERANCE:
            middle = min(max(round(math.sqrt(passing * failing)), failing + 1), passing - 1)
            if at(middle).meets:
                passing = middle
            else:
                failing = middle
        return _Settled(passing, at(passing), None if failing is None else at(failing))


def _checks(result: SimulationResult, slo: Slo) -> tuple[tuple[str, float, float, float], ...]:
    """Each SLO's measured value, its limit, and how close it is (> 1 = missed)."""
    q = slo.percentile
    checks = []
    for name, limit in ((BINDING_TTFT, slo.ttft_s), (BINDING_TPOT, slo.tpot_s), (BINDING_E2E, slo.e2e_s)):
        if limit is None:
            continue
        value = result.percentile(name, q)
        if not math.isnan(value):  # TPOT of one-token answers: no gap to measure
            checks.append((name, value, limit, value / limit))
    if slo.goodput_ratio is not None:
        fraction = result.goodput(slo.ttft_s, slo.tpot_s, slo.e2e_s).fraction
        checks.append((BINDING_GOODPUT, fraction, slo.goodput_ratio,
                       slo.goodput_ratio / fraction if fraction > 0 else math.inf))
    return tuple(checks)


def _describe(check: tuple[str, float, float, float], percentile: float) -> str:
    """"p95 TPOT 51.9 ms against 50 ms", or the goodput against its target."""
    name, value, limit, _ = check
    if name == BINDING_GOODPUT:
        return f"{value:.1%} of requests meet every SLO against a goodput target of {limit:.1%}"
    return f"p{percentile:g} {name.upper()} {_ms(value)} against {_ms(limit)}"


def _load_text(load: float, closed_loop: bool) -> str:
    if closed_loop:
        return f"{int(load)} user{'' if int(load) == 1 else 's'} per replica"
    return f"{load:.3g} req/s per replica"


def _light_load_reason(run: _Run, closed_loop: bool, percentile: float) -> str:
    return (f"misses the SLO even at light load ({_load_text(run.load, closed_loop)}): "
            f"{_describe(run.worst, percentile)}")


def _binding(settled: _Settled, slo: Slo, closed_loop: bool) -> tuple[str, str]:
    """The SLO that limits a replica's load: the one missed with one replica fewer, or else the one
    closest to its limit at the load that settled the replicas."""
    if settled.failing is not None:
        run = settled.failing
        return run.worst[0], (f"missed first with one replica fewer, at {_load_text(run.load, closed_loop)}: "
                              f"{_describe(run.worst, slo.percentile)}")
    run = settled.passing
    why = ("one replica carries the whole load" if settled.replicas == 1
           else "fewer replicas exceed the throughput ceiling")
    return run.worst[0], (f"closest to its limit at {_load_text(run.load, closed_loop)}: "
                          f"{_describe(run.worst, slo.percentile)} ({why})")


def _resolve_max_num_seqs(engine: ResolvedEngine, kv_tokens: int) -> ResolvedEngine:
    """An engine whose limit follows from the KV pool (SGLang) gets it, capped by a step's token budget where
    its decodes share the steps with prompt chunks (SGLang's do not: its decode batches are not chunked), and a
    given limit as the engine applies it (SGLang caps it at its request pool); an engine without a limit keeps
    none (a step's token budget is then the only cap on running sequences)."""
    limited = with_running_limit(engine, kv_tokens)
    derived = engine.max_num_seqs is None and limited.max_num_seqs is not None
    if derived and ENGINES[engine.engine].mixes_prefill_into_decode():
        return replace(limited, max_num_seqs=min(limited.max_num_seqs, engine.max_num_batched_tokens))
    return limited


def _percentiles(result: SimulationResult, metric: str, slo_percentile: float) -> Percentiles:
    p50, p95, p99, at_slo = result.percentiles(metric, (*PERCENTILES_REPORTED, slo_percentile))
    return Percentiles(p50, p95, p99, at_slo)


def _prediction(run: _Run, slo: Slo) -> Prediction:
    result = run.result
    return Prediction(
        load=run.load,
        ttft=_percentiles(result, "ttft", slo.percentile),
        tpot=_percentiles(result, "tpot", slo.percentile),
        e2e=_percentiles(result, "e2e", slo.percentile),
        goodput_ratio=result.goodput(slo.ttft_s, slo.tpot_s, slo.e2e_s).fraction,
        requests_per_s=result.requests_per_s * run.schedulers,
        output_tokens_per_s=result.output_tokens_per_s * run.schedulers,
        preemptions=result.preemptions,
    )


def _ms(seconds: float) -> str:
    """A latency to 3 significant figures: "62.1 ms", or "6.83 s" from a second on."""
    if seconds >= 1:
        return f"{seconds:.3g} s"
    return f"{seconds * 1e3:.3g} ms"


def _layout_text(layout: Layout) -> str:
    return " x ".join(layout.label.split())


def _gb(size_bytes: float) -> str:
    return f"{size_bytes / 1e9:.1f} GB"


# The plan ----------------------------------------------------------------------------------------

def plan(inputs: PlanInputs, candidates: Sequence[Configuration]) -> PlanResult:
    """The cheapest deployments of `inputs.model` meeting `inputs.slo`, over `candidates`."""
    if len(candidates) > MAX_CONFIGURATIONS:
        raise SearchSpaceTooLarge(f"{len(candidates)} configurations exceed the limit of {MAX_CONFIGURATIONS}")
    planner = _Planner(inputs)
    screened: list[_Screened] = []
    infeasible: list[Infeasible] = []
    for configuration in candidates:
        outcome = planner.screen(configuration)
        (infeasible if isinstance(outcome, Infeasible) else screened).append(outcome)
    screened_out = len(infeasible)

    found: list[Plan] = []
    failed = 0

    def simulate_candidate(candidate: _Screened) -> None:
        nonlocal failed
        try:
            settled = planner.settle(candidate)
            built = settled if isinstance(settled, Infeasible) else _fleet(planner, candidate, settled)
        except (KvCapacityError, SimulationLimitError, ValueError) as exc:
            # What the simulator refuses (a request that cannot fit, a run past its work cap) is an answer.
            built = Infeasible(candidate.configuration, (f"the simulation cannot run it: {exc}",))
        if isinstance(built, Infeasible):
            infeasible.append(built)
            failed += 1
        else:
            found.append(built)

    waiting = sorted(screened, key=lambda s: (s.cost_bound, s.configuration.gpus_per_replica))
    simulated = 0
    for candidate in list(waiting):
        if _worth_simulating(candidate, found, simulated):
            waiting.remove(candidate)
            simulated += 1
            simulate_candidate(candidate)
    faster = _faster_variant(found, waiting)
    if faster is not None and simulated < MAX_SIMULATED:
        waiting.remove(faster)
        simulated += 1
        simulate_candidate(faster)
    bounded_out = len(waiting)

    plans = tuple(sorted(found, key=_rank_key))
    notes = []
    unsearched = sum(1 for candidate in waiting if _could_be_cheapest(candidate, found))
    if unsearched and simulated >= MAX_SIMULATED_FOR_CHEAPEST:
        found_what = ("more could still be cheaper than the cheapest plan by their cost bounds" if plans else
                      "more were not simulated, with no plan found")
        notes.append(f"the search simulated {simulated} configurations, its limit, and {unsearched} {found_what}: "
                     "narrow the candidates (gpus, tensor_parallel) to have them simulated")
    if any(p.cost_per_hour_usd is None for p in plans):
        notes.append("some GPUs have no price (in the catalog or the request): their plans are ranked by GPU "
                     "count after the priced plans; give gpu_price_per_hour_usd to compare them on cost")
    stats = SearchStats(
        configurations=len(candidates), screened_out=screened_out, bounded_out=bounded_out, simulated=simulated,
        infeasible_in_simulation=failed, simulations=planner.simulations,
        simulated_requests=planner.simulated_requests, requests_per_run=inputs.simulated_requests,
        seed=inputs.seed)
    return PlanResult(feasible=bool(plans), plans=plans, infeasible=tuple(infeasible),
                      stats=stats, max_model_len=planner.max_model_len, notes=tuple(notes))


def _rank_key(plan_: Plan) -> tuple[int, float, int, float, str]:
    cost = plan_.cost_per_hour_usd
    return (int(cost is None), cost or 0.0, plan_.gpus, plan_.e2e_at_slo_percentile_s, plan_.configuration.label)


def _worth_simulating(candidate: _Screened, found: Sequence[Plan], simulated: int) -> bool:
    """Branch and bound: can this configuration still make the plans kept? One that could be the cheapest plan
    (`_could_be_cheapest`) is simulated past the per-GPU and MAX_SIMULATED caps, up to MAX_SIMULATED_FOR_CHEAPEST."""
    if simulated >= MAX_SIMULATED_FOR_CHEAPEST:
        return False
    if _could_be_cheapest(candidate, found):
        return True
    if simulated >= MAX_SIMULATED or sum(
            1 for p in found if p.configuration.gpu.slug == candidate.configuration.gpu.slug) >= PLANS_PER_GPU:
        return False
    unpriced, bound = candidate.cost_bound
    rivals = _rivals(candidate, found)
    priced_found = any(p.cost_per_hour_usd is not None for p in found)
    kept = UNPRICED_PLANS_KEPT if unpriced and priced_found else PLANS_KEPT
    return len(rivals) < kept or bound < rivals[kept - 1]


def _rivals(candidate: _Screened, found: Sequence[Plan]) -> list[float]:
    """What the candidate's cost bound competes with, cheapest first: the priced plans' costs, or the unpriced
    plans' GPU counts for an unpriced candidate."""
    unpriced = candidate.cost_bound[0]
    return sorted(float(p.gpus) if unpriced else p.cost_per_hour_usd  # type: ignore[misc]
                  for p in found if (p.cost_per_hour_usd is None) == bool(unpriced))


def _could_be_cheapest(candidate: _Screened, found: Sequence[Plan]) -> bool:
    """Its cost bound is at or below the cheapest plan's cost (a tie may rank first, on fewer GPUs or latency); an
    unpriced one's GPU count at or below the fewest of the unpriced plans, while no priced plan ranks before them."""
    unpriced, bound = candidate.cost_bound
    if unpriced and any(p.cost_per_hour_usd is not None for p in found):
        return False
    rivals = _rivals(candidate, found)
    return not rivals or bound <= rivals[0]


def _faster_variant(found: Sequence[Plan], waiting: Sequence[_Screened]) -> _Screened | None:
    """The cheapest plan's configuration at the next larger TP degree (same GPU, precisions, knobs):
    more money for lower latency, the frontier's next point. None when there is none to try."""
    priced = [p for p in found if p.cost_per_hour_usd is not None]
    if not priced:
        return None
    cheapest = min(priced, key=_rank_key).configuration
    larger = [s for s in waiting if s.configuration.tensor_parallel > cheapest.tensor_parallel
              and replace(s.configuration, tensor_parallel=cheapest.tensor_parallel) == cheapest]
    return min(larger, key=lambda s: s.configuration.tensor_parallel, default=None)


def _fleet(planner: _Planner, candidate: _Screened, settled: _Settled) -> Plan | Infeasible:
    """Replicas, GPUs, nodes and cost for the peak load, and the prediction at the offered load."""
    inputs, configuration = planner.inputs, candidate.configuration
    replicas = settled.replicas + inputs.policy.extra_replicas
    offered_run = None
    for _ in range(OFFERED_LOAD_RETRIES + 1):
        offered = planner.peak_load / replicas
        if planner.closed_loop:
            offered = float(math.ceil(offered * (1 - 1e-9)))
        offered_run = (settled.passing if offered == settled.passing.load
                       else planner.run(candidate, offered, replicas))
        if offered_run.meets:
            break
        replicas += 1
    assert offered_run is not None
    if not offered_run.meets:
        return Infeasible(configuration, (
            "the SLO is not met at the offered load either: "
            + _describe(offered_run.worst, inputs.slo.percentile),))
    gpus = replicas * configuration.gpus_per_replica
    nodes = replica_nodes(configuration, replicas)
    prediction = _prediction(offered_run, inputs.slo)
    if planner.closed_loop:
        # Each replica serves `offered` users at most; the fleet's users run at the simulated pace.
        fleet_tokens_per_s = prediction.output_tokens_per_s * planner.mean_load / offered_run.load
    else:
        fleet_tokens_per_s = planner.mean_load * planner.lengths.output_mean
    cost = None if candidate.price is None else gpus * candidate.price
    binding, detail = _binding(settled, inputs.slo, planner.closed_loop)
    return Plan(
        configuration=configuration, compute_dtype=candidate.compute_dtype, efficiency=candidate.efficiency,
        engine=candidate.engine, kv_tokens_per_replica=candidate.kv_tokens_per_replica,
        load_kind=CLOSED_LOOP if planner.closed_loop else OPEN_LOOP,
        max_load_per_replica=settled.passing.load,
        failing_load_per_replica=None if settled.failing is None else settled.failing.load,
        ceiling_load_per_replica=candidate.ceiling, offered_load_per_replica=offered_run.load,
        replicas=replicas, extra_replicas=inputs.policy.extra_replicas, gpus=gpus, nodes=nodes,
        price_per_gpu_hour_usd=candidate.price, price_source=candidate.price_source, cost_per_hour_usd=cost,
        cost_per_million_output_tokens_usd=None if cost is None else cost_per_million_tokens(cost, fleet_tokens_per_s),
        output_tokens_per_s=fleet_tokens_per_s, output_tokens_per_s_per_gpu=fleet_tokens_per_s / gpus,
        utilization_ratio=offered_run.load / settled.passing.load, predicted=prediction,
        meets_slo=offered_run.meets, binding_constraint=binding, binding_detail=detail,
        tokens_per_pass=None if inputs.speculative is None else inputs.speculative.tokens_per_pass,
    )
