"""Request and response shapes of /v1/capacity: how many concurrent requests fit, and how fast they go."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from app.calibration.held_out_schemas import HeldOutErrorOut
from app.catalog.schemas import GPU_SPEC_EXAMPLE, MODEL_ARCHITECTURE_EXAMPLE
from app.common import schema_examples
from app.estimates.schemas import (
    EFFICIENCY_EXAMPLE,
    KV_TRANSFER_EXAMPLE,
    PLAIN_BF16_RECIPE,
    RUNNING_LIMIT_DESCRIPTION,
    STEP_TOKENS_DESCRIPTION,
    WEIGHT_RECIPE_OUT,
    BatchSize,
    BlockSize,
    CalibrationRef,
    ContextTokens,
    DataParallel,
    Deployment,
    EfficiencyOut,
    ExpertParallel,
    GpuRef,
    HumanSize,
    KvTransferOut,
    ModelRef,
    PipelineParallel,
    PoolsRef,
    Precisions,
    TensorParallel,
    WeightDtype,
    WeightRecipeRef,
)
from app.sizing.model.recipes import FORMATS, GROUPS
from app.sizing.serving.workload import MAX_THINK_TIME_S

Engine = Literal["vllm", "sglang", "trtllm", "generic"]
EngineVersion = Annotated[str, Field(pattern=r"^v?[0-9]{1,4}\.[0-9]{1,4}(\.[0-9]{1,4})?$", max_length=20)]
WeightGroup = Literal[GROUPS]  # type: ignore[valid-type]
WeightFormat = Literal[tuple(FORMATS)]  # type: ignore[valid-type]
BytesPerGpu = Annotated[int, Field(ge=0, le=10**13,
                                   description="Bytes on each GPU; null = the engine's default")]
Limit = Literal["kv_cache", "max_num_seqs"]
View = Literal["steady_state", "admission"]


# Examples: vLLM, Llama-3.1-8B on one H100, utilization 0.9, max_model_len 16384, 1000 in / 500 out.
PIPELINE_STAGE_EXAMPLE: dict[str, Any] = {"first_layer": 0, "layers": 32, "weights_bytes_per_gpu": 16060522496,
                                          "kv_budget_bytes_per_gpu": 57204632754, "kv_blocks": 27277}
MEMORY_EXAMPLE: dict[str, Any] = {
    "total_bytes_per_gpu": 85029615043, "usable_bytes_per_gpu": 76526653538,
    "weights_bytes_per_gpu": 16060522496,
    "activation_bytes_per_gpu": 2058907445, "overhead_bytes_per_gpu": 1202590843,
    "non_torch_bytes_per_gpu": 268435456, "cuda_graph_bytes_per_gpu": 934155387, "reserved_bytes_per_gpu": 0,
    "kv_budget_bytes_per_gpu": 57204632754, "weights_bytes_total": 16060522496,
    "kv_budget_per_gpu": {"gb": 57.204633, "gib": 53.275966},
    "weights_total": {"gb": 16.060522, "gib": 14.957527},
    "weight_groups_per_gpu": [
        {"group": "attention", "format": "bf16", "params": 1_342_177_280, "bytes": 2_684_354_560},
        {"group": "dense_mlp", "format": "bf16", "params": 5_637_144_576, "bytes": 11_274_289_152},
        {"group": "embedding", "format": "bf16", "params": 525_336_576, "bytes": 1_050_673_152},
        {"group": "lm_head", "format": "bf16", "params": 525_336_576, "bytes": 1_050_673_152},
        {"group": "norms_and_biases", "format": "bf16", "params": 266_240, "bytes": 532_480}],
    "pipeline_stages": [PIPELINE_STAGE_EXAMPLE],
}
CONCURRENCY_EXAMPLE: dict[str, Any] = {"sequences": 290, "kv_limited_sequences": 290, "limit": "kv_cache",
                                       "tokens_per_request": 1500}
MAX_CONCURRENCY_EXAMPLE: dict[str, Any] = {
    "worst_case": {"sequences": 26, "kv_limited_sequences": 26, "limit": "kv_cache",
                   "tokens_per_request": 16384},
    "admission": CONCURRENCY_EXAMPLE,
    "steady_state": {"sequences": 346, "kv_limited_sequences": 346, "limit": "kv_cache",
                     "tokens_per_request": 1257.984},
}
OPERATING_POINT_EXAMPLE: dict[str, Any] = {
    "batch_size": 346, "concurrency_view": "steady_state", "mean_context_tokens": 1249.0,
    "ideal_decode_step_ms": 21.86, "expected_decode_step_ms": 35.73, "ideal_prefill_ms": 14.37,
    "expected_prefill_ms": 27.57, "ideal_tpot_ms": 31.81, "expected_tpot_ms": 54.8,
    "ideal_tokens_per_s_per_user": 31.44, "expected_tokens_per_s_per_user": 18.25,
    "ideal_output_tokens_per_s": 10876.8, "expected_output_tokens_per_s": 6313.4,
    "ideal_requests_per_s": 21.75, "expected_requests_per_s": 12.63, "users_at_think_time": None,
}
SUGGESTION_EXAMPLE: dict[str, Any] = {
    "tensor_parallel": 8, "pipeline_parallel": 1, "weight_dtype": "fp8", "num_gpus": 8, "kv_tokens": 333856,
    "sequences": 265,
    "summary": ("TP8 x PP1 on 8 GPUs with fp8 weights fits: 333856 KV tokens, 265 concurrent requests "
                "(steady state)"),
}
ENGINE_EXAMPLE: dict[str, Any] = {
    "engine": "vllm", "engine_version": "0.33.0", "total_bytes_per_gpu": 85029615043,
    "gpu_memory_utilization": 0.9, "utilization_of": "total_memory", "max_num_seqs": 1024,
    "max_num_batched_tokens": 8192, "block_size": 16, "max_model_len": 16384, "kv_allocation": "on_demand",
    "sources": {"gpu_memory_utilization": "given", "max_model_len": "given",
                "max_num_seqs": "vLLM 0.33.0 default on GPUs with >= 70 GiB other than A100",
                "cuda_graph_bytes_per_gpu": ("median CUDA-graph memory of the vLLM 0.19 llm-d runs on H100 (0.87 "
                                             "GiB; range 0.64-1.85); subtracted before the KV cache from v0.20")},
}
ASSUMPTIONS_EXAMPLE: dict[str, Any] = {
    "weight_dtype": "bf16",
    "weight_recipe": PLAIN_BF16_RECIPE,
    "kv_dtype": "bf16", "kv_dtype_source": "the model's dtype: the engine's 'auto' KV dtype",
    "compute_dtype": "bf16", "activation_dtype": "bf16",
    "efficiency": EFFICIENCY_EXAMPLE,
    "formulas": ["per GPU: kv_budget = usable - weights - activation - overhead"],
    "defaults_used": ["weight_dtype = bf16 (the model's published dtype)", "calibration = builtin"],
    "held_out_error": None,
}


class CapacityRequest(PoolsRef, ModelRef, GpuRef, CalibrationRef, Precisions, WeightRecipeRef):
    """A deployment (model, GPU, parallel layout, precisions, serving engine) and a workload's mean
    prompt and answer lengths. Every engine setting left null takes the engine's own default, and
    the response says which one and why. Disaggregated, the engine settings apply to the workers of both
    pools (ENGINES.md gives neither role memory defaults of its own)."""

    model_config = schema_examples(
        {"model": "llama-3.1-8b", "gpu": "h100-sxm", "engine": "vllm", "gpu_memory_utilization": 0.9,
         "max_model_len": 16384, "input_tokens": 1000, "output_tokens": 500},
        {"model": "llama-3-70b", "gpu": "h100-sxm", "tensor_parallel": 4, "weight_dtype": "fp16",
         "kv_dtype": "fp16", "engine": "generic", "gpu_memory_utilization": 1.0,
         "reserved_bytes_per_gpu": 7500000000, "input_tokens": 1000, "output_tokens": 500},
        {"model": "deepseek-v3", "gpu": "h200-sxm", "tensor_parallel": 8, "weight_dtype": "fp8",
         "engine": "sglang", "input_tokens": 2000, "output_tokens": 1000},
        {"model_spec": MODEL_ARCHITECTURE_EXAMPLE, "gpu_spec": GPU_SPEC_EXAMPLE, "tensor_parallel": 8,
         "kv_dtype": "fp8", "engine": "trtllm", "input_tokens": 4000, "output_tokens": 1000},
        {"model": "llama-3.1-70b", "gpu": "h100-sxm", "weight_dtype": "fp8", "kv_dtype": "fp8",
         "deployment": "disaggregated", "prefill": {"tensor_parallel": 4, "workers": 2},
         "decode": {"tensor_parallel": 8}, "input_tokens": 8192, "output_tokens": 1024},
    )

    tensor_parallel: TensorParallel = 1
    pipeline_parallel: PipelineParallel = 1
    data_parallel: DataParallel = 1
    expert_parallel: ExpertParallel = 1
    engine: Engine = Field("vllm", description="Whose memory accounting decides capacity: vllm, sglang, "
                                               "trtllm, or generic (only what you give is subtracted)")
    engine_version: EngineVersion | None = Field(
        None, description="major.minor[.patch] of the engine, where its rules changed between versions (vLLM: "
                          "utilization 0.90 -> 0.92 and CUDA graphs charged from 0.20, KV dtype from a ModelOpt "
                          "checkpoint from 0.14; SGLang: from 0.5.5); null = the engine's default release "
                          "(engine.sources.engine_version says which and why: vLLM's latest the service's engine "
                          "reference covers)")
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1,
        description="vllm/generic: fraction of TOTAL memory the engine may use (vLLM 0.92, generic 0.9); "
                    "sglang: mem_fraction_static (weights + KV pool; default from the GPU size, as SGLang "
                    "derives it); trtllm: fraction of the memory free after weights and activations given to "
                    "the KV cache (0.9)")
    reserved_bytes_per_gpu: BytesPerGpu | None = Field(
        None, description="Extra memory kept back on each GPU (generic engine: everything not weights or KV)")
    activation_bytes_per_gpu: BytesPerGpu | None = Field(
        None, description="Activation peak of a max_num_batched_tokens forward; null = estimate (vllm, "
                          "trtllm) or 0 (sglang: outside its static fraction; generic)")
    non_torch_bytes_per_gpu: BytesPerGpu | None = Field(
        None, description="CUDA context, NCCL and cuBLAS workspaces; null = the engine's measured default: vllm "
                          "0.25 GiB (1 GPU) or 2.07 GiB (2+ GPUs: NCCL and custom all-reduce buffers), trtllm 0.13 "
                          "or 0.6 GiB, 0 otherwise (engine.sources states the one applied)")
    cuda_graph_bytes_per_gpu: BytesPerGpu | None = Field(
        None, description="CUDA-graph memory subtracted before the KV cache; null = the engine's default: vllm "
                          "from 0.20 0.87 GiB (the median measured; earlier releases capture them after sizing "
                          "the KV cache: 0), 0 otherwise (engine.sources states the one applied)")
    max_model_len: ContextTokens | None = Field(
        None, description="Longest request the engine accepts; null = the model's max_position_embeddings")
    max_num_seqs: BatchSize | None = Field(
        None, description="Cap on running requests as the engine is launched with it (sglang divides it among "
                          "attention data-parallel ranks and caps each rank's at its request pool; the other "
                          "engines give each rank the whole of it); null = the engine's default")
    max_num_batched_tokens: ContextTokens | None = Field(
        None, description="Tokens per engine step (prefill chunk) as the engine is launched with it (sglang "
                          "divides it among attention data-parallel ranks); null = the engine's default")
    block_size: BlockSize | None = Field(
        None, description="KV block (page) in tokens; null = vllm 16, trtllm 32, sglang 1, generic 16")
    input_tokens: ContextTokens = Field(description="Mean prompt tokens per request")
    output_tokens: ContextTokens = Field(description="Mean generated tokens per request")
    think_time_s: Annotated[float, Field(ge=0, le=MAX_THINK_TIME_S)] | None = Field(
        None, description="Mean time a user reads and types between an answer and the next request: the operating "
                          "point then states the users it carries (users_at_think_time); null = not asked")


class WeightGroupOut(BaseModel):
    """One parameter group in one storage format."""

    model_config = schema_examples({"group": "experts", "format": "mxfp4", "params": 114_661_785_600,
                              "bytes": 60_914_073_600})

    group: WeightGroup
    format: WeightFormat
    params: int
    bytes: int = Field(description="params x the format's bits (scales included) / 8, rounded up")


class PipelineStageOut(BaseModel):
    """One GPU of a pipeline stage. Stages hold different layers and weights (the first the embedding, the
    last the LM head, the engine's split of the leftover layers), so each has a KV budget of its own; one
    scheduler hands out the same blocks on every stage, so the replica's kv_blocks are the fewest any stage fits
    (times data_parallel)."""

    model_config = schema_examples(PIPELINE_STAGE_EXAMPLE)

    first_layer: int = Field(description="Index of its first decoder layer (0-based)")
    layers: int = Field(description="Decoder layers it holds")
    weights_bytes_per_gpu: int
    kv_budget_bytes_per_gpu: int = Field(description="By the engine's rule, with this stage's weights")
    kv_blocks: int = Field(description="kv_budget_bytes_per_gpu // (block_size x bytes of one token in its layers): "
                                       "what this stage alone fits, for one data-parallel rank")


class MemoryOut(BaseModel):
    """One GPU's memory by the engine's accounting (the most loaded GPU of the layout):
    kv_budget = usable − weights − activation − overhead."""

    model_config = schema_examples(MEMORY_EXAMPLE)

    total_bytes_per_gpu: int = Field(description="What the driver reports")
    usable_bytes_per_gpu: int = Field(description="What the engine lets itself use")
    weights_bytes_per_gpu: int
    activation_bytes_per_gpu: int
    overhead_bytes_per_gpu: int = Field(description="non-torch + CUDA graphs + reserve")
    non_torch_bytes_per_gpu: int
    cuda_graph_bytes_per_gpu: int
    reserved_bytes_per_gpu: int
    kv_budget_bytes_per_gpu: int = Field(description="Left for the KV cache; <= 0 means nothing is")
    weights_bytes_total: int = Field(description="The whole model's weights, stored once")
    kv_budget_per_gpu: HumanSize
    weights_total: HumanSize
    weight_groups_per_gpu: list[WeightGroupOut] = Field(
        description="weights_bytes_per_gpu by parameter group and format (the most loaded GPU)")
    pipeline_stages: list[PipelineStageOut] = Field(
        description="Each pipeline stage's GPU, first to last (one entry without pipeline parallelism); the "
                    "figures above are the heaviest stage's")


class ConcurrencyOut(BaseModel):

    model_config = schema_examples(CONCURRENCY_EXAMPLE)
    sequences: int = Field(description="Concurrent requests: the smaller of the KV limit and max_num_seqs")
    kv_limited_sequences: int = Field(description="What the KV cache alone allows")
    limit: Limit = Field(description="Which of the two binds")
    tokens_per_request: float = Field(description="Tokens each request is charged (before block rounding "
                                                  "for worst_case and admission); for a model with window layers, "
                                                  "full-attention-equivalent tokens, block-rounded (its bytes over "
                                                  "kv_bytes_per_token_per_gpu), as kv_tokens counts them")


class MaxConcurrencyOut(BaseModel):

    model_config = schema_examples(MAX_CONCURRENCY_EXAMPLE)
    worst_case: ConcurrencyOut = Field(description="Every request at max_model_len (vLLM's start-up log)")
    admission: ConcurrencyOut = Field(description="Every request reserving input + output (a no-evict "
                                                  "scheduler, TensorRT-LLM's default)")
    steady_state: ConcurrencyOut = Field(description="Every request holding its mean live tokens (paged "
                                                     "on-demand allocation, vLLM and SGLang)")


class OperatingPointOut(BaseModel):
    """Continuous batching at the engine's own concurrency: per output token each running request waits
    one decode step plus its share of the prefill of the requests that replace finished ones."""

    model_config = schema_examples(OPERATING_POINT_EXAMPLE)

    batch_size: int = Field(description="Running requests")
    concurrency_view: View = Field(description="The max_concurrency view the engine runs at")
    mean_context_tokens: float = Field(description="Cached tokens per running request during decode")
    ideal_decode_step_ms: float
    expected_decode_step_ms: float
    ideal_prefill_ms: float = Field(description="One request's prompt: in max_num_batched_tokens chunks, or, where a "
                                                "step holds k >= 2 whole prompts, its 1/k share of such a step (0 on a "
                                                "disaggregated decode worker: its prompts arrive prefilled)")
    expected_prefill_ms: float
    ideal_tpot_ms: float = Field(description="decode step + batch x prefill / (pp x output_tokens); a "
                                             "disaggregated decode worker: the decode step")
    expected_tpot_ms: float
    ideal_tokens_per_s_per_user: float
    expected_tokens_per_s_per_user: float
    ideal_output_tokens_per_s: float = Field(description="All running requests together")
    expected_output_tokens_per_s: float
    ideal_requests_per_s: float
    expected_requests_per_s: float
    users_at_think_time: float | None = Field(None, description=(
        "With the request's think_time_s: the users this operating point carries when each pauses that long "
        "between requests, batch_size + expected_requests_per_s x think_time_s (Little's law: those being answered "
        "and those thinking); its throughput limit, no latency SLO checked (/v1/slo-plan sizes for one). Null "
        "without think_time_s"))


class SuggestionOut(BaseModel):
    """The smallest change that fits: a layout inside one node, else a cheaper weight precision."""

    model_config = schema_examples(SUGGESTION_EXAMPLE)

    tensor_parallel: int
    pipeline_parallel: int
    weight_dtype: WeightDtype
    num_gpus: int
    kv_tokens: int
    sequences: int = Field(description="Concurrent requests at the engine's running view")
    summary: str


class EngineOut(BaseModel):
    """The engine settings the accounting used, each with its source ("given" when you set it)."""

    model_config = schema_examples(ENGINE_EXAMPLE)

    engine: Engine
    engine_version: str = Field(description="The version whose rules were applied (empty for generic)")
    total_bytes_per_gpu: int = Field(description="The memory the engine sizes from: what CUDA reports where the "
                                                 "catalog has it, else the driver's total (sglang's default "
                                                 "fraction is picked by the driver's total all the same)")
    gpu_memory_utilization: float
    utilization_of: Literal["total_memory", "free_memory_after_weights_and_activations"]
    max_num_seqs: int | None = Field(description=RUNNING_LIMIT_DESCRIPTION)
    max_num_batched_tokens: int = Field(description=STEP_TOKENS_DESCRIPTION)
    block_size: int
    max_model_len: int
    kv_allocation: Literal["on_demand", "reserve_at_admission"]
    sources: dict[str, str]


class CapacityAssumptions(BaseModel):

    model_config = schema_examples(ASSUMPTIONS_EXAMPLE)
    weight_dtype: str
    weight_recipe: str = WEIGHT_RECIPE_OUT
    kv_dtype: str
    kv_dtype_source: str = Field(description="given, or the engine and checkpoint rule that picked it")
    compute_dtype: str
    activation_dtype: str
    efficiency: EfficiencyOut
    formulas: list[str]
    defaults_used: list[str]
    held_out_error: HeldOutErrorOut | None = Field(None, description=(
        "How far predictions made with these efficiencies were from published measurements their calibration "
        "never saw, for this layout family, GPU, model family and engine: the validator's predictions of measured "
        "runs (the same step-time model, with the simulator's schedule of each run), not of this steady-state "
        "operating point, whose arithmetic is an approximation of its own. by_metric.throughput is the error of "
        "throughputs such as expected_output_tokens_per_s; tpot_itl is of the time between tokens after the "
        "first, which is not expected_tpot_ms (that spreads each request's prompt over its output tokens, as "
        "e2e / output_tokens does). Null when the profile has no cross-validation (builtin, one fitted by POST "
        "/v1/calibrations or by `python -m app.calibrate --no-cross-validation`)"))


POOL_CAPACITY_EXAMPLE: dict[str, Any] = {
    "role": "decode", "gpu": "h100-sxm", "tensor_parallel": 1, "pipeline_parallel": 1, "data_parallel": 1,
    "expert_parallel": 1, "moe_tensor_parallel": 1, "layout": "TP1 PP1", "workers": 1, "gpus_per_worker": 1, "gpus": 1, "fits": True, "reasons": [],
    "memory": MEMORY_EXAMPLE, "kv_bytes_per_token_per_gpu": 131072, "kv_tokens_per_worker": 436432,
    "kv_blocks_per_worker": 27277, "tokens_per_request": 1500, "requests_per_worker": CONCURRENCY_EXAMPLE,
    "requests": 290, "engine": ENGINE_EXAMPLE,
}


class PoolCapacityOut(BaseModel):
    """One pool of a disaggregated deployment under its engine's memory accounting (the same rules as an
    aggregated replica: ENGINES.md gives neither role memory defaults of its own), charged what its worker
    holds per request: a prefill worker the prompt, from its prefill until its KV transfer completes; a
    decode worker the prompt and the whole answer."""

    model_config = schema_examples(POOL_CAPACITY_EXAMPLE)

    role: Literal["prefill", "decode"]
    gpu: str
    tensor_parallel: int
    pipeline_parallel: int
    data_parallel: int
    expert_parallel: int
    moe_tensor_parallel: int = Field(description="GPUs each routed expert is split over")
    layout: str = Field(description='A worker\'s layout in short, e.g. "TP1 DP8 EP8 PP1"')
    workers: int
    gpus_per_worker: int = Field(description="tensor_parallel x pipeline_parallel x data_parallel")
    gpus: int = Field(description="workers x gpus_per_worker")
    fits: bool
    reasons: list[str] = Field(description="Why a worker cannot serve (empty when it can)")
    memory: MemoryOut = Field(description="One worker's most loaded GPU")
    kv_bytes_per_token_per_gpu: int
    kv_tokens_per_worker: int = Field(description="KV capacity of one worker, in tokens")
    kv_blocks_per_worker: int
    tokens_per_request: int = Field(description="prefill: input_tokens (its prompt's KV until the transfer "
                                                "completes); decode: input_tokens + output_tokens")
    requests_per_worker: ConcurrencyOut = Field(
        description="prefill: prompts its KV cache holds in flight (being prefilled or waiting for their "
                    "transfer; not capped by max_num_seqs: a prompt waiting for its transfer has left the running "
                    "batch but keeps its blocks); decode: concurrent requests of prompt + answer (capped by "
                    "max_num_seqs)")
    requests: int = Field(description="requests_per_worker.sequences x workers: the whole pool")
    expected_requests_per_s_per_worker: float | None = Field(
        None, description="Requests one worker sustains, no latency SLO checked (null when a worker does not fit): "
                          "prefill: the prompts it prefills per second at its token budget (as many whole prompts "
                          "as max_num_batched_tokens holds in one step, else one prompt in chunks; each attention "
                          "data-parallel rank its own, each pipeline stage 1/pp of a step); decode: its operating "
                          "point's expected_requests_per_s")
    expected_requests_per_s: float | None = Field(
        None, description="expected_requests_per_s_per_worker x workers: the whole pool")
    engine: EngineOut


class CapacityDisaggregationOut(BaseModel):
    """Both pools of a disaggregated deployment and the KV transfer of one prompt between them."""

    model_config = schema_examples({"prefill": {**POOL_CAPACITY_EXAMPLE, "role": "prefill", "tokens_per_request": 1000},
                              "decode": POOL_CAPACITY_EXAMPLE, "kv_transfer": KV_TRANSFER_EXAMPLE})

    prefill: PoolCapacityOut
    decode: PoolCapacityOut
    kv_transfer: KvTransferOut = Field(description="At input_tokens, from app.sizing.serving.disaggregation")
    expected_requests_per_s: float | None = Field(
        None, description="What the deployment sustains, no latency SLO checked: the lower of its pools' "
                          "expected_requests_per_s (null when a pool does not fit)")
    limited_by: Literal["prefill", "decode"] | None = Field(
        None, description="The pool whose rate that is: with prefill, the decode pool's workers run below the "
                          "operating point above (top-level fields), and the prompts queue beyond this rate")


class CapacityResponse(BaseModel):
    model: str = Field(description="Catalog slug, or the inline architecture's label")
    gpu: str
    tensor_parallel: int
    pipeline_parallel: int
    data_parallel: int
    expert_parallel: int
    moe_tensor_parallel: int = Field(description="GPUs each routed expert is split over: tensor_parallel x "
                                                 "data_parallel / expert_parallel")
    num_gpus: int = Field(description="Per replica: tensor_parallel x pipeline_parallel x data_parallel")
    input_tokens: int
    output_tokens: int
    fits: bool
    reasons: list[str] = Field(description="Why it does not fit (empty when it does)")
    suggestion: SuggestionOut | None = Field(
        description="When it does not fit: the smallest change that does")
    memory: MemoryOut
    kv_bytes_per_token_per_gpu: int = Field(description="One token in every layer of the most loaded GPU")
    kv_tokens: int = Field(description="KV capacity per replica, in tokens (full-attention-equivalent for "
                                       "models with window layers)")
    kv_blocks: int
    max_concurrency: MaxConcurrencyOut
    max_context_tokens: int = Field(description="Longest context one request can reach alone")
    operating_point: OperatingPointOut | None = Field(
        description="null when it does not fit (disaggregated: when the decode worker does not; `fits` covers both "
                    "pools)")
    engine: EngineOut
    assumptions: CapacityAssumptions
    calculation_version: str
    deployment: Deployment = Field("aggregated", description=(
        "disaggregated: fits and reasons cover both pools (each reason names its pool); every other top-level "
        "field describes one decode worker (layout, memory, concurrency of prompt + answer, and an operating "
        "point of decode steps alone: its prompts arrive prefilled), as /v1/slo-plan's disaggregated plans do"))
    disaggregation: CapacityDisaggregationOut | None = Field(
        None, description="deployment disaggregated: both pools and the KV transfer between them")

    model_config = schema_examples({
        "model": "llama-3.1-8b", "gpu": "h100-sxm", "tensor_parallel": 1, "pipeline_parallel": 1,
        "data_parallel": 1, "expert_parallel": 1, "moe_tensor_parallel": 1, "num_gpus": 1, "input_tokens": 1000, "output_tokens": 500, "fits": True, "reasons": [],
        "suggestion": None,
        "memory": MEMORY_EXAMPLE, "kv_bytes_per_token_per_gpu": 131072, "kv_tokens": 436432,
        "kv_blocks": 27277, "max_concurrency": MAX_CONCURRENCY_EXAMPLE, "max_context_tokens": 16384,
        "operating_point": OPERATING_POINT_EXAMPLE, "engine": ENGINE_EXAMPLE,
        "assumptions": ASSUMPTIONS_EXAMPLE,
        "calculation_version": "2026.12.07.7",
    })
