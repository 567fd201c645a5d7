"""Request and response shapes of /v1/slo-plan: the cheapest deployment that meets a latency SLO.

Inputs are strict (JSON numbers for numbers), reject unknown fields, NaN and infinities, and bound
every list, so a request can neither reach the core unchecked nor ask for an unbounded search.

Longer than 600 lines because it is one endpoint's whole contract, request and response, each field with its
description and bounds beside the examples that exercise them: split, the examples would live apart from the
fields they show.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationError, ValidationInfo, field_validator, model_validator

from app.calibration.held_out_schemas import HELD_OUT_ERROR_EXAMPLE, HeldOutErrorOut
from app.catalog.schemas import GPU_SPEC_EXAMPLE, INPUT_CONFIG, GpuSpecIn, ModelSlug
from app.common import Slug, schema_examples
from app.estimates.schemas import (
    EFFICIENCY_EXAMPLE,
    KV_TRANSFER_EXAMPLE,
    RUNNING_LIMIT_DESCRIPTION,
    STEP_TOKENS_DESCRIPTION,
    CalibrationRef,
    DataParallel,
    Deployment,
    EfficiencyOut,
    ExpertParallel,
    KvDtype,
    KvTransferOut,
    ModelRef,
    PipelineParallel,
    TensorParallel,
    WeightDtype,
)
from app.sizing.serving.plan import MIN_UTILIZATION_RATIO
from app.sizing.serving.workload import MAX_ARRIVAL_CV, MAX_THINK_TIME_S, MIN_ARRIVAL_CV

Engine = Literal["vllm", "sglang", "trtllm", "generic"]
# A cloud SKU not in the catalog: H100 SXM figures at a negotiated price.
INLINE_GPU_EXAMPLE: dict[str, Any] = {**GPU_SPEC_EXAMPLE, "slug": "h100-sxm-negotiated",
                                      "name": "NVIDIA H100 SXM5 80GB (negotiated)", "price_per_hour_usd": 2.1}
Binding = Literal["ttft", "tpot", "e2e", "goodput"]

TokenCount = Annotated[int, Field(ge=1, le=10_000_000)]
TokenStatistic = Annotated[float, Field(gt=0, le=10_000_000)]


# Request -----------------------------------------------------------------------------------

class LognormalLengths(BaseModel):
    """Lengths drawn from a lognormal fitted to two or more statistics (mean with p50, or p50 with p90
    and/or p99, or p90 with p99, or the mean with one tail percentile). Statistics that no lognormal
    reproduces within 10 % are rejected: give a histogram instead."""

    model_config = INPUT_CONFIG | schema_examples({"kind": "lognormal", "mean": 1000, "p50": 800, "p90": 1800})

    kind: Literal["lognormal"]
    mean: TokenStatistic | None = None
    p50: TokenStatistic | None = None
    p90: TokenStatistic | None = None
    p99: TokenStatistic | None = None


class HistogramLengths(BaseModel):
    """Explicit lengths: [tokens, weight] pairs (weights need not sum to 1)."""

    model_config = INPUT_CONFIG | schema_examples({"kind": "histogram", "bins": [[200, 0.3], [1000, 0.5], [4000, 0.2]]})

    kind: Literal["histogram"]
    bins: list[Annotated[list[Annotated[float, Field(ge=0, le=1e12)]], Field(min_length=2, max_length=2)]] = Field(
        min_length=1, max_length=1000, description="[tokens, weight] pairs; tokens are whole numbers >= 1")

    @model_validator(mode="after")
    def _whole_tokens(self) -> HistogramLengths:
        for index, (tokens, _) in enumerate(self.bins):
            if tokens != int(tokens) or not 1 <= tokens <= 10_000_000:
                raise ValueError(f"bins[{index}]: tokens must be a whole number in 1..10,000,000, got {tokens:g}")
        if not any(weight > 0 for _, weight in self.bins):
            raise ValueError("at least one bin needs a positive weight")
        return self


Lengths = TokenCount | Annotated[LognormalLengths | HistogramLengths, Field(discriminator="kind")]
_DISTRIBUTIONS: dict[str, type[BaseModel]] = {"lognormal": LognormalLengths, "histogram": HistogramLengths}


def _message(error: Any) -> str:
    """A nested error as "where: what", without pydantic's "Value error, " prefix (it is added once)."""
    what = str(error["ctx"]["error"]) if error["type"] == "value_error" else error["msg"]
    return "/".join(str(part) for part in error["loc"]) + ": " + what if error["loc"] else what


def _lengths(value: Any) -> Any:
    """One error at the field itself, whatever is wrong: a union reports every branch's complaint
    under made-up path segments."""
    if isinstance(value, dict):
        kind = value.get("kind")
        model = _DISTRIBUTIONS.get(kind) if isinstance(kind, str) else None
        if model is None:
            raise ValueError("a distribution needs \"kind\": \"lognormal\" or \"histogram\"")
        try:
            return model.model_validate(value)
        except ValidationError as exc:
            raise ValueError("; ".join(_message(error) for error in exc.errors(include_url=False))) from None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10_000_000:
        raise ValueError("a whole number of tokens in 1..10,000,000, or a distribution object "
                         "({\"kind\": \"lognormal\", ...} or {\"kind\": \"histogram\", ...})")
    return value


class WorkloadIn(BaseModel):
    """Prompt and answer lengths and the load: open loop (`requests_per_s`) or closed loop
    (`concurrent_users`, each sending the next request when the last one finishes, or `think_time_s` later).

    Two separate knobs describe a bursty open-loop workload: `peak_to_mean_ratio` scales the rate the
    fleet is sized for (the rate peaks above requests_per_s), and `arrival_cv` says how arrivals bunch
    at a given rate (Gamma-distributed gaps; 1 = Poisson). `burst_factor` is the old, deprecated name
    of `peak_to_mean_ratio`."""

    model_config = INPUT_CONFIG | schema_examples(
        {"input_tokens": 1000, "output_tokens": 500, "requests_per_s": 5},
        {"input_tokens": {"kind": "lognormal", "mean": 1000, "p50": 800, "p90": 1800},
         "output_tokens": {"kind": "histogram", "bins": [[100, 0.2], [500, 0.6], [1500, 0.2]]},
         "requests_per_s": 20, "peak_to_mean_ratio": 1.5, "arrival_cv": 2, "prefix_cache_hit_rate": 0.3, "shared_prefix_tokens": 200},
        {"input_tokens": 2000, "output_tokens": 300, "concurrent_users": 64},
        {"input_tokens": 1500, "output_tokens": 400, "concurrent_users": 2000, "think_time_s": 30},
    )

    input_tokens: Lengths = Field(description="Prompt tokens: a fixed number, or a distribution")
    output_tokens: Lengths = Field(description="Answer tokens: a fixed number, or a distribution")
    # >= 1e-5: 20,000 simulated arrivals span <= 2e9 s, where float times resolve 1 us (far below: 0 ms, NaN).
    requests_per_s: Annotated[float, Field(ge=1e-5, le=1_000_000)] | None = Field(
        None, description="Mean arrival rate (open loop), at least 1e-05 (about one request a day); or give "
                          "concurrent_users")
    concurrent_users: Annotated[int, Field(ge=1, le=1_000_000)] | None = Field(
        None, description="Users each waiting for their answer before the next request (closed loop)")
    think_time_s: Annotated[float, Field(ge=0, le=MAX_THINK_TIME_S)] = Field(
        0.0, description="Closed loop only: the mean time a user reads and types between an answer's last token and "
                         "the next request (each pause exponential); 0 = a benchmark's users, sending at once")
    peak_to_mean_ratio: Annotated[float, Field(ge=1, le=100)] = Field(
        1.0, description="Peak-to-mean scaling: the fleet is sized for requests_per_s x peak_to_mean_ratio "
                         "(open loop only)")
    arrival_cv: Annotated[float, Field(ge=MIN_ARRIVAL_CV, le=MAX_ARRIVAL_CV)] = Field(
        1.0, description="Arrival burstiness: coefficient of variation c of the gaps between the arrivals the "
                         "fleet receives, drawn from a Gamma distribution (1 = Poisson, 2 = clumped, below 1 = more "
                         "regular); dealt out at random over the fleet's N schedulers, each sees gaps of CV "
                         "sqrt(1 + (c^2 - 1) / N) (open loop only)")
    burst_factor: Annotated[float, Field(ge=1, le=100)] | None = Field(
        None, exclude=True, json_schema_extra={"deprecated": True},
        description="Deprecated: the old name of peak_to_mean_ratio (it never meant arrival burstiness; that is "
                    "arrival_cv)")
    prefix_cache_hit_rate: Annotated[float, Field(ge=0, le=1)] = Field(
        0.0, description="Share of each prompt's tokens found in the prefix cache (they skip prefill)")
    shared_prefix_tokens: Annotated[int, Field(ge=0, le=10_000_000)] = Field(
        0, description="A prefix every prompt starts with (system prompt), cached once")

    @field_validator("input_tokens", "output_tokens", mode="before")
    @classmethod
    def _one_error_per_length(cls, value: Any) -> Any:
        return _lengths(value)

    @field_validator("shared_prefix_tokens")
    @classmethod
    def _prefix_within_the_prompt(cls, value: int, info: ValidationInfo) -> int:
        prompt = info.data.get("input_tokens")  # (a distribution's prompts each cap it at their length)
        if isinstance(prompt, int) and value > prompt:
            raise ValueError(f"the shared prefix ({value} tokens) is part of every prompt: at most input_tokens ({prompt})")
        return value

    @model_validator(mode="after")
    def _one_load(self) -> WorkloadIn:
        if (self.requests_per_s is None) == (self.concurrent_users is None):
            raise ValueError("give exactly one of requests_per_s (open loop) and concurrent_users (closed loop)")
        if self.burst_factor is not None:
            if "peak_to_mean_ratio" in self.model_fields_set and self.peak_to_mean_ratio != self.burst_factor:
                raise ValueError("burst_factor is the deprecated name of peak_to_mean_ratio: give one of them")
            # One spelling in stored documents (burst_factor is excluded from dumps).
            self.peak_to_mean_ratio = self.burst_factor
            self.burst_factor = None
        return self

    @field_validator("think_time_s")
    @classmethod
    def _closed_loop_only(cls, value: float, info: ValidationInfo) -> float:
        if value and info.data.get("requests_per_s") is not None:  # (both loads, or neither: `_one_load` says so)
            raise ValueError("think_time_s applies to concurrent_users (closed loop) only")
        return value

    @field_validator("peak_to_mean_ratio", "arrival_cv", "burst_factor")
    @classmethod
    def _open_loop_only(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value not in (None, 1) and info.data.get("concurrent_users") is not None:
            raise ValueError(f"{info.field_name} applies to requests_per_s (open loop) only")
        return value


class SloIn(BaseModel):
    """Latency targets at one percentile; optionally the share of requests that must meet all of them."""

    model_config = INPUT_CONFIG | schema_examples({"ttft_ms": 1000, "tpot_ms": 50, "percentile": 95},
                                            {"ttft_ms": 500, "tpot_ms": 30, "e2e_ms": 20000, "percentile": 99,
                                             "goodput_ratio": 0.99})

    ttft_ms: Annotated[float, Field(gt=0, le=86_400_000)] = Field(description="Time to first token")
    tpot_ms: Annotated[float, Field(gt=0, le=86_400_000)] = Field(
        description="Time per output token after the first: (E2E - TTFT) / (output tokens - 1)")
    e2e_ms: Annotated[float, Field(gt=0, le=86_400_000)] | None = Field(None, description="End to end")
    percentile: Annotated[float, Field(ge=50, le=99.9)] = Field(95.0, description="Percentile the targets apply at")
    goodput_ratio: Annotated[float, Field(gt=0, le=1)] | None = Field(
        None, description="Share of requests that must meet every target (goodput)")


class InlineGpuIn(GpuSpecIn):
    """A GPU the catalog lacks (a new cloud SKU, a negotiated price), given inline: validated like a catalog
    row, planned beside the catalog GPUs, kept in a quote's request, never written to the catalog."""

    model_config = INPUT_CONFIG | schema_examples(INLINE_GPU_EXAMPLE)

    slug: Slug = Field(description="How plans name this GPU; not a slug among the candidate catalog GPUs")
    price_per_hour_usd: Annotated[float, Field(ge=0, le=100_000)] = Field(  # type: ignore[assignment]
        description="Price per GPU-hour (required: a plan ranks GPUs by cost)")


class CandidatesIn(BaseModel):
    """The configurations to search. Every list's values are combined; the product is bounded."""

    model_config = INPUT_CONFIG | schema_examples(
        {"gpus": ["h100-sxm", "h200-sxm"], "tensor_parallel": [2, 4, 8]},
        {"gpus": ["h100-sxm"], "tensor_parallel": [4], "weight_dtypes": ["bf16", "fp8"], "kv_dtypes": ["bf16", "fp8"],
         "engine": "vllm", "max_num_seqs": [64, 256], "gpu_price_per_hour_usd": {"h100-sxm": 2.49}},
    )

    gpus: list[Slug] | None = Field(None, max_length=64,
                                    description="Catalog GPU slugs; null = every GPU in the catalog; [] = none "
                                                "(only gpu_specs)")
    gpu_specs: list[InlineGpuIn] | None = Field(
        None, min_length=1, max_length=8,
        description="GPUs given inline (spec and price), planned beside the catalog GPUs; never stored in the catalog")
    tensor_parallel: list[TensorParallel] | None = Field(
        None, min_length=1, max_length=16,
        description="Degrees to try; null = every divisor of the attention heads up to the GPU's node size")
    pipeline_parallel: list[PipelineParallel] | None = Field(
        None, min_length=1, max_length=8,
        description="Pipeline stages to combine with every layout; null = one stage, plus, on a GPU one node of "
                    "which cannot hold the model's weights (they reach 90% of its memory at the largest "
                    "tensor-parallel degree), a full node's TP with the fewest stages across nodes that hold "
                    "them and twice as many")
    data_parallel: list[DataParallel] | None = Field(
        None, min_length=1, max_length=8,
        description="Attention data-parallel degrees to combine with tensor_parallel; null (with expert_parallel "
                    "null) = plain TP, plus for MoE models when tensor_parallel is null too the DP+EP and TP+EP "
                    "layouts of each valid GPU count, and, on a GPU one node of which cannot hold the model's "
                    "weights (when pipeline_parallel is null too), DP+EP over the fewest whole nodes that hold "
                    "them and twice as many")
    expert_parallel: list[ExpertParallel] | None = Field(
        None, min_length=1, max_length=8, description="Expert-parallel degrees to combine; see data_parallel")
    weight_dtypes: list[WeightDtype] | None = Field(None, min_length=1, max_length=6, description=(
        "null = the model's published dtype. A dtype the model ships in one checkpoint is planned as that checkpoint "
        "(gpt-oss in fp4: recipe gpt_oss_mxfp4, MXFP4 experts with bf16 attention); assumptions.defaults_used says "
        "so"))
    kv_dtypes: list[KvDtype] | None = Field(None, min_length=1, max_length=4,
                                            description="null = the model's 16-bit dtype")
    engine: Engine = Field("vllm", description="Whose memory accounting and scheduler to model")
    max_num_seqs: list[Annotated[int, Field(ge=1, le=65_536)]] | None = Field(
        None, min_length=1, max_length=8, description=(
            "Running-sequence limits to try, as the engine is launched with them (sglang divides one among "
            "attention data-parallel ranks); null = the engine default"))
    max_num_batched_tokens: list[Annotated[int, Field(ge=1, le=1_048_576)]] | None = Field(
        None, min_length=1, max_length=8, description="Tokens-per-step limits to try; null = the engine default")
    gpu_price_per_hour_usd: dict[Slug, Annotated[float, Field(ge=0, le=100_000)]] | None = Field(
        None, max_length=64, description="Price per GPU-hour by GPU slug, overriding the catalog's")
    deployment: Literal["aggregated", "disaggregated", "both"] = Field(
        "aggregated", description=(
            "aggregated: every replica prefills and decodes; disaggregated: separate prefill and decode workers "
            "(each pool its own GPU type, layout and worker count from these candidates: attention DP + EP and "
            "pipeline workers included), the prompt's KV cache moved between them; both: plans of either kind, "
            "ranked together. No speculative decoding; a closed loop's as the open loop of its users' rate."))

    @model_validator(mode="after")
    def _distinct_inline_gpus(self) -> CandidatesIn:
        slugs = [gpu.slug for gpu in self.gpu_specs or []]
        if len(set(slugs)) != len(slugs):
            raise ValueError("gpu_specs: each inline GPU needs its own slug")
        return self


class SpeculativeIn(BaseModel):
    """Speculative decoding: `draft_tokens` proposed per step, each accepted with `acceptance_rate`; by a
    catalog `draft_model`, or (null) by n-gram prompt lookup, whose drafting cost is taken as zero."""

    model_config = INPUT_CONFIG | schema_examples({"draft_model": "llama-3.2-1b", "acceptance_rate": 0.7, "draft_tokens": 4},
                                            {"acceptance_rate": 0.5, "draft_tokens": 3})

    draft_model: ModelSlug | None = Field(None, description="Catalog slug of the draft model; null = n-gram drafting")
    acceptance_rate: Annotated[float, Field(ge=0, le=1)] = Field(description="Per drafted token")
    draft_tokens: Annotated[int, Field(ge=1, le=16)] = Field(description="Tokens proposed per step (k)")


class HaPolicyIn(BaseModel):
    model_config = INPUT_CONFIG | schema_examples({"extra_replicas": 1, "max_utilization_ratio": 0.8})

    extra_replicas: Annotated[int, Field(ge=0, le=1000)] = Field(0, description="Spare replicas (N+k)")
    max_utilization_ratio: Annotated[float, Field(ge=MIN_UTILIZATION_RATIO, le=1)] = Field(
        1.0, description="Load each replica at most this fraction of what still meets the SLO (at least 0.01: "
                         "a fleet of at most 100 times the load)")


ISSUE_EXAMPLE = {
    "model": "llama-3.1-70b",
    "workload": {"input_tokens": 1000, "output_tokens": 500, "requests_per_s": 5},
    "slo": {"ttft_ms": 1000, "tpot_ms": 50, "percentile": 95},
}


class SloPlanRequest(ModelRef, CalibrationRef):
    """What to serve, under which load and latency targets, and which deployments to consider."""

    model_config = INPUT_CONFIG | schema_examples(
        ISSUE_EXAMPLE,
        {**ISSUE_EXAMPLE, "candidates": {"gpus": ["h100-sxm", "h200-sxm"], "weight_dtypes": ["bf16", "fp8"]},
         "ha_policy": {"extra_replicas": 1, "max_utilization_ratio": 0.8}},
        {"model": "llama-3.1-8b",
         "workload": {"input_tokens": {"kind": "lognormal", "p50": 600, "p90": 2000}, "output_tokens": 250,
                      "concurrent_users": 200},
         "slo": {"ttft_ms": 500, "tpot_ms": 25, "percentile": 99},
         "candidates": {"gpus": ["l40s", "h100-sxm"]},
         "speculative": {"acceptance_rate": 0.6, "draft_tokens": 3}},
    )

    workload: WorkloadIn
    slo: SloIn
    candidates: CandidatesIn = Field(default_factory=CandidatesIn)
    speculative: SpeculativeIn | None = None
    ha_policy: HaPolicyIn = Field(default_factory=HaPolicyIn)
    seed: Annotated[int, Field(ge=0, le=2**32 - 1)] = Field(
        0, description="Seed of the simulated requests; the same request always gives the same answer")
    simulated_requests: Annotated[int, Field(ge=500, le=20_000)] = Field(
        2000, description="Requests per simulation run (closed loop: at least 3 per user)")


# Response ----------------------------------------------------------------------------------
# Examples: the issue's request answered over H100/H200 (an H200 TP2 plan of two replicas).

PERCENTILES_EXAMPLE = {"p50_ms": 29.0, "p95_ms": 31.0, "p99_ms": 32.0, "at_slo_percentile_ms": 31.0}
PREDICTION_EXAMPLE = {
    "load_per_replica": 2.5,
    "ttft": {"p50_ms": 120.0, "p95_ms": 190.0, "p99_ms": 240.0, "at_slo_percentile_ms": 190.0},
    "tpot": PERCENTILES_EXAMPLE,
    "e2e": {"p50_ms": 14600.0, "p95_ms": 15500.0, "p99_ms": 16000.0, "at_slo_percentile_ms": 15500.0},
    "goodput_ratio": 1.0, "requests_per_s": 2.5, "output_tokens_per_s": 1250.0, "preemptions": 0,
}
LOAD_EXAMPLE = {"unit": "requests_per_s", "offered": 2.5, "max_verified": 2.5, "failing": 5.0, "analytic_ceiling": 4.86}
LAUNCH_EXAMPLE = {"command": ("vllm serve meta-llama/Meta-Llama-3.1-70B --tensor-parallel-size 2 --max-num-seqs 1024 "
                              "--max-num-batched-tokens 8192 --max-model-len 1500 --gpu-memory-utilization 0.92"),
                  "notes": []}
PLAN_ASSUMPTIONS_EXAMPLE = {
    "efficiency": EFFICIENCY_EXAMPLE, "tokens_per_pass": None,
    "engine_settings": ["gpu_memory_utilization = 0.92 (vLLM default 0.92 (v0.11 and later; 0.90 before))",
                        "max_model_len = 1500 (the workload's longest prompt + longest answer)"],
    "held_out_error": HELD_OUT_ERROR_EXAMPLE,
}
PLAN_EXAMPLE = {
    "rank": 1, "gpu": "h200-sxm", "gpu_name": "NVIDIA H200 SXM 141GB", "tensor_parallel": 2, "pipeline_parallel": 1,
    "data_parallel": 1, "expert_parallel": 1, "moe_tensor_parallel": 2, "layout": "TP2 PP1",
    "weight_dtype": "bf16", "kv_dtype": "bf16", "compute_dtype": "bf16", "engine": "vllm", "max_num_seqs": 1024,
    "max_num_batched_tokens": 8192, "block_size": 16, "gpu_memory_utilization_ratio": 0.92, "max_model_len": 1500,
    "kv_tokens_per_replica": 374160, "load_per_replica": LOAD_EXAMPLE, "replicas": 2, "extra_replicas": 0,
    "gpus_per_replica": 2, "gpus": 4, "nodes": 1, "price_per_gpu_hour_usd": 4.59, "price_source": "catalog",
    "cost_per_hour_usd": 18.36, "cost_per_million_output_tokens_usd": 2.04, "output_tokens_per_s": 2500.0,
    "output_tokens_per_s_per_gpu": 625.0, "utilization_ratio": 1.0, "predicted": PREDICTION_EXAMPLE,
    "meets_slo": True, "binding_constraint": "tpot",
    "binding_detail": "missed first with one replica fewer, at 5 req/s per replica: p95 TPOT 60 ms against 50 ms",
    "launch": LAUNCH_EXAMPLE, "assumptions": PLAN_ASSUMPTIONS_EXAMPLE,
}
PARETO_EXAMPLE = {"rank": 1, "cost_per_hour_usd": 18.36, "gpus": 4, "e2e_ms_at_slo_percentile": 15500.0}
INFEASIBLE_EXAMPLE = {
    "gpu": "h100-sxm", "tensor_parallel": 1, "pipeline_parallel": 1, "data_parallel": 1, "expert_parallel": 1,
    "weight_dtype": "bf16", "kv_dtype": "bf16", "max_num_seqs": None, "max_num_batched_tokens": None,
    "reasons": [("weights need 141.1 GB per GPU (bf16, TP1 x PP1); with 10.1 GB of activations and 1.1 GB of engine "
                 "overhead that leaves no KV cache in vllm's 78.7 GB budget of a 85.5 GB GPU")],
}
SEARCH_EXAMPLE = {"configurations_considered": 8, "configuration_limit": 512, "screened_out": 3, "bounded_out": 3,
                  "simulated": 2, "infeasible_in_simulation": 0, "simulator_runs": 3, "simulated_requests": 6000,
                  "requests_per_run": 2000, "seed": 0}
SLO_PLAN_ASSUMPTIONS_EXAMPLE = {
    "calibration_profiles": ["builtin"], "engine": "vllm",
    "load_model": ("open loop: the fleet is sized for 5 req/s x peak-to-mean ratio 1; every replica is simulated with a "
                   "Poisson stream of its share"),
    "tpot_definition": ("TPOT = (E2E - TTFT) / (output tokens - 1) per request: the mean gap between output tokens "
                        "after the first (harnesses that divide E2E by all output tokens report less)"),
    "formulas": [("replicas = ceil(requests_per_s x peak_to_mean_ratio / (max load per replica x "
                  "max_utilization_ratio)) + extra_replicas; the max load is the highest simulated per-replica load meeting every SLO at the "
                  "percentile")],
    "defaults_used": ["weight_dtypes = [bf16] (the model's published dtype)"], "notes": [],
}


class PercentilesOut(BaseModel):
    """Latency percentiles in ms (null where nothing is measured, e.g. TPOT of one-token answers)."""

    model_config = schema_examples(PERCENTILES_EXAMPLE)

    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    at_slo_percentile_ms: float | None


class PredictionOut(BaseModel):
    """One replica simulated at its offered load (disaggregated: a decode worker's share, any spares down)."""

    model_config = schema_examples(PREDICTION_EXAMPLE)

    load_per_replica: float = Field(description="requests/s (open loop) or users (closed loop)")
    ttft: PercentilesOut
    tpot: PercentilesOut = Field(description="(E2E - TTFT) / (output tokens - 1), per request")
    e2e: PercentilesOut
    goodput_ratio: float = Field(description="Share of requests meeting every SLO")
    requests_per_s: float
    output_tokens_per_s: float
    preemptions: int = Field(description="Requests evicted for KV space during the run (recomputed later)")


class LoadPerReplicaOut(BaseModel):
    """One replica's load, in requests/s (open loop) or concurrent users (closed loop)."""

    model_config = schema_examples(LOAD_EXAMPLE)

    unit: Literal["requests_per_s", "concurrent_users"]
    offered: float = Field(description="Its share of the load x peak-to-mean ratio, with every replica up")
    max_verified: float = Field(description="The highest load simulated that meets the SLO (it settled the "
                                            "replica count)")
    failing: float | None = Field(description="The lowest load simulated that misses it (one replica fewer); "
                                              "null when fewer replicas exceed the analytic ceiling")
    analytic_ceiling: float = Field(description="Upper bound from the step-time model at the best batch; a "
                                                "disaggregated plan's is one decode worker's, from its decode steps "
                                                "alone (a closed loop's: in users, at the plan's mean request and "
                                                "think time)")


class LaunchOut(BaseModel):
    model_config = schema_examples(LAUNCH_EXAMPLE)

    command: str | None = Field(description="Command line realizing the plan; null for the generic engine")
    notes: list[str]


class PlanAssumptionsOut(BaseModel):
    model_config = schema_examples(PLAN_ASSUMPTIONS_EXAMPLE)

    efficiency: EfficiencyOut
    tokens_per_pass: float | None = Field(description="Speculative decoding: expected tokens per target pass")
    engine_settings: list[str] = Field(description="Each engine setting and where its value came from")
    held_out_error: HeldOutErrorOut | None = Field(None, description=(
        "How far this kind of prediction was from measurements its calibration never saw; null when the profile "
        "has no cross-validation (builtin, one fitted by POST /v1/calibrations or by `python -m app.calibrate "
        "--no-cross-validation`)"))


POOL_EXAMPLE = {
    "gpu": "h100-sxm", "gpu_name": "NVIDIA H100 SXM5 80GB", "tensor_parallel": 2, "pipeline_parallel": 1,
    "data_parallel": 1, "expert_parallel": 1, "moe_tensor_parallel": 2, "layout": "TP2 PP1", "workers": 4,
    "extra_workers": 0, "gpus": 8, "load_per_worker_requests_per_s": 1.0, "users_per_worker": None,
    "kv_tokens_per_worker": 1050000, "max_num_seqs": 1024, "max_num_batched_tokens": 8192, "cost_per_hour_usd": 29.12,
    "launch": {"command": "vllm serve meta-llama/Llama-3.1-70B-Instruct --tensor-parallel-size 2 ...", "notes": []},
}


class PoolOut(BaseModel):
    """One pool of a disaggregated deployment."""

    model_config = schema_examples(POOL_EXAMPLE)

    gpu: str
    gpu_name: str
    tensor_parallel: int
    pipeline_parallel: int
    data_parallel: int = Field(description="Attention data-parallel ranks per worker (each its own requests and KV "
                                           "cache)")
    expert_parallel: int
    moe_tensor_parallel: int = Field(description="GPUs each routed expert is split over")
    layout: str = Field(description='A worker\'s layout in short, e.g. "TP1 DP8 EP8 PP1"')
    workers: int = Field(description="Including extra_workers")
    extra_workers: int = Field(description="Spares (ha_policy.extra_replicas): the SLO holds with these down")
    gpus: int = Field(description="workers x tensor_parallel x pipeline_parallel x data_parallel")
    load_per_worker_requests_per_s: float = Field(
        description="Its share of the rate sized for (open loop: peak x burst; closed loop: the users' rate)")
    users_per_worker: float | None = Field(None, description="Closed loop: the users over its workers; else null")
    kv_tokens_per_worker: int
    max_num_seqs: int | None = Field(description=RUNNING_LIMIT_DESCRIPTION)
    max_num_batched_tokens: int = Field(description=STEP_TOKENS_DESCRIPTION)
    cost_per_hour_usd: float | None
    launch: LaunchOut


class DisaggregationOut(BaseModel):
    """Both pools of a disaggregated plan and the KV transfer between them."""

    model_config = schema_examples({"prefill": POOL_EXAMPLE, "decode": POOL_EXAMPLE, "kv_transfer": KV_TRANSFER_EXAMPLE,
                              "router": "python -m sglang_router.launch_router --pd-disaggregation ..."})

    prefill: PoolOut
    decode: PoolOut
    kv_transfer: KvTransferOut
    router: str = Field(description="What routes requests to the prefill workers and on to the decode workers")


class PlanOut(BaseModel):
    model_config = schema_examples(PLAN_EXAMPLE)

    rank: int = Field(description="1 = cheapest")
    gpu: str
    gpu_name: str
    tensor_parallel: int
    pipeline_parallel: int
    data_parallel: int = Field(description="Attention data-parallel ranks (each its own requests and KV cache)")
    expert_parallel: int
    moe_tensor_parallel: int = Field(description="GPUs each routed expert is split over")
    layout: str = Field(description='The layout in short, e.g. "TP1 DP8 EP8 PP1"')
    weight_dtype: WeightDtype
    kv_dtype: KvDtype
    compute_dtype: str
    engine: Engine
    max_num_seqs: int | None = Field(description=RUNNING_LIMIT_DESCRIPTION)
    max_num_batched_tokens: int = Field(description=STEP_TOKENS_DESCRIPTION)
    block_size: int
    gpu_memory_utilization_ratio: float
    max_model_len: int
    kv_tokens_per_replica: int
    load_per_replica: LoadPerReplicaOut
    replicas: int = Field(description="Including extra_replicas (disaggregated: both pools' workers)")
    extra_replicas: int
    gpus_per_replica: int
    gpus: int
    nodes: int = Field(description="Tensor parallelism stays inside one node; small replicas share nodes")
    price_per_gpu_hour_usd: float | None = Field(description=(
        "The price of `gpu` (disaggregated: the decode worker's GPU; a prefill pool on another GPU is priced at its "
        "own: cost_per_hour_usd sums both pools' costs, each stated in its pool)"))
    price_source: Literal["request", "catalog"] | None = Field(description="null = no price known")
    cost_per_hour_usd: float | None
    cost_per_million_output_tokens_usd: float | None
    output_tokens_per_s: float = Field(description=(
        "The fleet's output at the workload's mean rate (requests_per_s x the mean answer; peak_to_mean_ratio sizes "
        "the fleet, predicted.output_tokens_per_s is at the load sized for), or a closed loop's users at their "
        "simulated pace: what cost_per_million_output_tokens_usd divides the cost by"))
    output_tokens_per_s_per_gpu: float
    utilization_ratio: float = Field(description="Offered / max verified load per replica (an upper bound: the "
                                                 "true limit lies between max_verified and failing)")
    predicted: PredictionOut
    meets_slo: bool
    binding_constraint: Binding = Field(description="The SLO a replica misses first when given more load")
    binding_detail: str
    launch: LaunchOut
    assumptions: PlanAssumptionsOut
    deployment: Deployment = Field("aggregated", description=(
        "disaggregated: the per-replica fields (GPU, layout, engine settings, KV tokens, load, launch) describe one "
        "decode worker, `replicas` counts the workers of both pools, and `gpus` and the costs cover both pools"))
    disaggregation: DisaggregationOut | None = Field(None, description="The pools of a disaggregated plan")


class ParetoPointOut(BaseModel):
    model_config = schema_examples(PARETO_EXAMPLE)

    rank: int = Field(description="Of the plan in `plans`")
    cost_per_hour_usd: float | None
    gpus: int
    e2e_ms_at_slo_percentile: float
    deployment: Deployment = "aggregated"


class InfeasibleOut(BaseModel):
    model_config = schema_examples(INFEASIBLE_EXAMPLE)

    gpu: str
    tensor_parallel: int
    pipeline_parallel: int
    data_parallel: int
    expert_parallel: int
    weight_dtype: WeightDtype
    kv_dtype: KvDtype
    max_num_seqs: int | None = Field(description="null = the engine default")
    max_num_batched_tokens: int | None = Field(description="null = the engine default")
    reasons: list[str]


class SearchOut(BaseModel):
    model_config = schema_examples(SEARCH_EXAMPLE)

    configurations_considered: int
    configuration_limit: int
    screened_out: int = Field(description="Infeasible by an analytic bound (memory, TPOT/TTFT/E2E floors)")
    bounded_out: int = Field(description="Could not beat the plans found (cost lower bound), not simulated")
    simulated: int = Field(description="Configurations simulated")
    infeasible_in_simulation: int
    simulator_runs: int
    simulated_requests: int = Field(description="All runs together")
    requests_per_run: int
    seed: int


class SloPlanAssumptions(BaseModel):
    model_config = schema_examples(SLO_PLAN_ASSUMPTIONS_EXAMPLE)

    calibration_profiles: list[str]
    engine: Engine
    load_model: str
    tpot_definition: str
    formulas: list[str]
    defaults_used: list[str]
    notes: list[str]


class SloPlanResponse(BaseModel):
    model_config = schema_examples({
        "feasible": True, "model": "llama-3.1-70b",
        "slo": {"ttft_ms": 1000, "tpot_ms": 50, "e2e_ms": None, "percentile": 95, "goodput_ratio": None},
        "plans": [PLAN_EXAMPLE], "pareto": [PARETO_EXAMPLE], "infeasible": [INFEASIBLE_EXAMPLE],
        "search": SEARCH_EXAMPLE, "assumptions": SLO_PLAN_ASSUMPTIONS_EXAMPLE, "calculation_version": "2026.12.03.4",
    })

    feasible: bool = Field(description="false when no configuration meets the SLO (see infeasible)")
    model: str
    slo: SloIn
    plans: list[PlanOut] = Field(description="Cheapest first; plans without a price follow, by GPU count")
    pareto: list[ParetoPointOut] = Field(description="Cost vs E2E at the SLO percentile: no plan is both cheaper "
                                                     "and faster than these")
    infeasible: list[InfeasibleOut]
    search: SearchOut
    assumptions: SloPlanAssumptions
    calculation_version: str
