"""Request and response shapes of the sizing endpoints (/v1/kv-cache, /v1/roofline,
/v1/roofline/batch-sweep), and the request pieces every sizing endpoint shares.

Reusable pieces (compose a request body from them):
- `ModelRef`: `model` (catalog slug) or `model_spec` (an inline architecture), exactly one;
- `GpuRef`: `gpu` (catalog slug) or `gpu_spec` (an inline accelerator), exactly one;
- `CalibrationRef`: the optional `calibration` profile name behind every expected time;
- `Precisions`: optional `weight_dtype`, `kv_dtype`, `compute_dtype` (`inputs.resolve_precisions` fills
  the nulls and rejects a compute dtype the GPU cannot run);
- `WeightRecipeRef`: the optional `weight_recipe`, a published checkpoint's quantization recipe
  (`inputs.checkpoint_recipe` resolves it, or the model's published checkpoint of `weight_dtype`);
- the bounded scalar types (`ContextTokens`, `BatchSize`, `TensorParallel`, ...) and dtype literals;
- `EfficiencyOut`, `HumanSize` (and their `*_EXAMPLE`s): how responses echo efficiencies and show sizes
  to people.
The matching service helpers are `resolve_model`, `resolve_gpu`, `check_parallelism`,
`resolve_precisions` and `efficiency_out` in app/estimates/inputs.py.

Inputs are strict (JSON numbers for numbers), reject unknown fields, NaN and infinities, and bound
every size to physical sense, so nothing a client sends reaches the core unchecked.

Longer than 600 lines because the request pieces every sizing endpoint shares (the disaggregated pools'
`PoolsRef` and `KvTransferOut` among them) live next to the /v1/kv-cache and /v1/roofline shapes built from
them: one module to read for what a sizing request may say.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationInfo, field_validator

from app.calibration.held_out_schemas import HeldOutErrorOut
from app.catalog.schemas import (
    GPU_SPEC_EXAMPLE,
    INPUT_CONFIG,
    MODEL_ARCHITECTURE_EXAMPLE,
    GpuSpecIn,
    ModelArchitecture,
    ModelSlug,
)
from app.common import SLUG_PATTERN, Slug, schema_examples
from app.sizing.model.recipes import RECIPE_NAMES
from app.sizing.specs import COMPUTE_DTYPES, KV_DTYPES, WEIGHT_DTYPES

# Scalars -----------------------------------------------------------------------------------

WeightDtype = Literal[WEIGHT_DTYPES]  # type: ignore[valid-type]
KvDtype = Literal[KV_DTYPES]  # type: ignore[valid-type]
ComputeDtype = Literal[COMPUTE_DTYPES]  # type: ignore[valid-type]
Phase = Literal["prefill", "decode"]
Bound = Literal["memory", "compute"]

ContextTokens = Annotated[int, Field(ge=1, le=10_000_000, description="Tokens per sequence")]
CachedTokens = Annotated[int, Field(ge=0, le=10_000_000, description="Tokens already in the KV cache")]
BatchSize = Annotated[int, Field(ge=1, le=1_000_000, description="Concurrent sequences")]
TensorParallel = Annotated[int, Field(ge=1, le=1024, description="Tensor-parallel degree; must divide the "
                                                                   "attention heads")]
PipelineParallel = Annotated[int, Field(ge=1, le=1000, description="Pipeline stages; at most the layers")]
DataParallel = Annotated[int, Field(
    ge=1, le=1024, description="Attention data-parallel ranks of tensor_parallel GPUs each: each rank holds the "
                               "attention weights and the KV cache of its own requests (1 = plain TP)")]
ExpertParallel = Annotated[int, Field(
    ge=1, le=1024, description="Expert-parallel ranks the routed experts are dealt to; must divide "
                               "tensor_parallel x data_parallel (each expert splits over the rest)")]
BlockSize = Annotated[int, Field(ge=1, le=65_536, description="Paged-KV block in tokens (vLLM 16, "
                                                               "TensorRT-LLM 32)")]
ProfileName = Annotated[str, Field(pattern=SLUG_PATTERN, max_length=64,
                                   description="Calibration profile; null = the default profile",
                                   examples=["builtin"])]

MAX_SWEEP_POINTS = 64
DEFAULT_SWEEP_BATCH_SIZES = tuple(2**i for i in range(11))  # 1, 2, 4, ..., 1024


def _exactly_one(slug_field: str, inline_field: str, value: Any, info: ValidationInfo) -> Any:
    """Validator body: either the catalog slug or the inline spec, never both, never neither."""
    if slug_field not in info.data:
        return value  # the slug itself was invalid; that error already names it
    if (info.data[slug_field] is None) == (value is None):
        raise ValueError(f"give exactly one of {slug_field} (a catalog slug) and {inline_field} "
                         "(an inline specification)")
    return value


# Shared request pieces ---------------------------------------------------------------------

class ModelRef(BaseModel):
    """The model to size: a catalog slug, or an inline architecture for a hypothetical model."""

    model_config = INPUT_CONFIG

    model: ModelSlug | None = Field(None, description="Catalog slug of the model (or give model_spec)",
                               examples=["llama-3-70b"])
    model_spec: ModelArchitecture | None = Field(
        None, validate_default=True,
        description="Inline architecture in the catalog's shape (Hugging Face config.json names)")

    @field_validator("model_spec")
    @classmethod
    def _one_model(cls, value: ModelArchitecture | None, info: ValidationInfo) -> ModelArchitecture | None:
        return _exactly_one("model", "model_spec", value, info)


class GpuRef(BaseModel):
    """The accelerator: a catalog slug, or an inline spec for a chip not in the catalog."""

    model_config = INPUT_CONFIG

    gpu: Slug | None = Field(None, description="Catalog slug of the GPU (or give gpu_spec)",
                             examples=["h100-sxm"])
    gpu_spec: GpuSpecIn | None = Field(None, validate_default=True,
                                       description="Inline accelerator spec (dense TFLOP/s)")

    @field_validator("gpu_spec")
    @classmethod
    def _one_gpu(cls, value: GpuSpecIn | None, info: ValidationInfo) -> GpuSpecIn | None:
        return _exactly_one("gpu", "gpu_spec", value, info)


class CalibrationRef(BaseModel):
    model_config = INPUT_CONFIG

    calibration: ProfileName | None = None


class Precisions(BaseModel):
    """Weight, KV-cache and compute precisions; each null one is resolved and echoed."""

    model_config = INPUT_CONFIG

    weight_dtype: WeightDtype | None = Field(None, description=(
        "null = the model's published dtype. A dtype the model ships in one checkpoint is sized as that checkpoint "
        "(gpt-oss in fp4: OpenAI's MXFP4 experts with bf16 attention, recipe gpt_oss_mxfp4); defaults_used says so"))
    kv_dtype: KvDtype | None = Field(
        None, description="null = the model's 16-bit dtype (bf16 for fp8/fp4/int4-quantized checkpoints)")
    compute_dtype: ComputeDtype | None = Field(
        None, description="null = the weight dtype where the GPU has that tensor rate, else bf16/fp16")


WeightRecipeName = Literal[RECIPE_NAMES]  # type: ignore[valid-type]


WEIGHT_RECIPE_OUT = Field(description="The recipe the weight bytes follow (a plain dtype's name when none was "
                                      "asked for and the model publishes no checkpoint of it), its formats and its "
                                      "source")
PLAIN_BF16_RECIPE = ("bf16: every linear matrix of the decoder layers in bf16; embedding, LM head, routers, norms and "
                     "biases in bf16 (the service's plain weight dtype)")


class WeightRecipeRef(BaseModel):
    """A published checkpoint's quantization recipe, in place of one weight dtype for every linear layer."""

    model_config = INPUT_CONFIG

    weight_recipe: WeightRecipeName | None = Field(
        None, description="A published checkpoint's quantization recipe: each parameter group (attention, dense "
                          "MLP, experts, router, embedding, LM head) in its own format, e.g. gpt_oss_mxfp4 (MXFP4 "
                          "experts, bf16 rest), meta_fp8, modelopt_fp8, modelopt_nvfp4 (4.5 bits), deepseek_fp8, "
                          "awq_int4. Overrides weight_dtype for the weight bytes; null = the model's one published "
                          "checkpoint of weight_dtype where it ships one (gpt-oss in fp4: gpt_oss_mxfp4), else "
                          "weight_dtype for every linear layer")


DISAGGREGATED = "disaggregated"
Deployment = Literal["aggregated", "disaggregated"]
MAX_POOL_WORKERS = 4096  # app.sizing.serving.disaggregation's limit on a planned pool
POOL_EXAMPLE_IN = {"tensor_parallel": 4, "workers": 2}


class PoolIn(BaseModel):
    """One pool of a disaggregated deployment, in the names /v1/slo-plan's disaggregated plans use
    (`disaggregation.prefill` / `.decode`): its GPU, one worker's layout, and how many workers."""

    model_config = INPUT_CONFIG | schema_examples(POOL_EXAMPLE_IN, {"gpu": "h200-sxm", "tensor_parallel": 8})

    gpu: Slug | None = Field(None, description="Catalog slug of the pool's GPU; null = the request's gpu "
                                                "(or gpu_spec)")
    tensor_parallel: TensorParallel = 1
    pipeline_parallel: PipelineParallel = 1
    data_parallel: DataParallel = 1
    expert_parallel: ExpertParallel = 1
    workers: Annotated[int, Field(ge=1, le=MAX_POOL_WORKERS)] = Field(
        1, description="Workers of this layout (each an engine instance of its own): the pool's totals, and "
                       "whether the KV moves over NVLink (both pools on one GPU type, all their GPUs inside one "
                       "NVLink domain) or the scale-out network")


class PoolsRef(BaseModel):
    """An aggregated deployment (every replica prefills and decodes, the request's own layout fields), or a
    disaggregated one: a prefill pool and a decode pool, each with its own GPU, layout and workers, the
    prompt's KV cache moved from one to the other. Left out, the request means what it always meant."""

    model_config = INPUT_CONFIG

    deployment: Deployment = Field(
        "aggregated", description=(
            "aggregated: one replica of the request's layout prefills and decodes; disaggregated: separate "
            "prefill and decode pools (give both; the request's own tensor_parallel and other layout fields "
            "stay at 1), the prompt's KV cache moved between them. The answer then describes a decode worker "
            "in its top-level fields, as /v1/slo-plan's disaggregated plans do, and both pools and the KV "
            "transfer in `disaggregation`"))
    prefill: PoolIn | None = Field(None, validate_default=True,
                                   description="deployment disaggregated only: the pool that prefills prompts")
    decode: PoolIn | None = Field(None, validate_default=True,
                                  description="deployment disaggregated only: the pool that generates the answers")

    @field_validator("prefill", "decode")
    @classmethod
    def _pools_with_disaggregated(cls, value: PoolIn | None, info: ValidationInfo) -> PoolIn | None:
        deployment = info.data.get("deployment")
        if deployment == DISAGGREGATED and value is None:
            raise ValueError("required with deployment disaggregated: the pool's gpu, layout and workers")
        if deployment != DISAGGREGATED and value is not None:
            raise ValueError("a pool applies only with deployment disaggregated")
        return value

    @field_validator("tensor_parallel", "pipeline_parallel", "data_parallel", "expert_parallel", check_fields=False)
    @classmethod
    def _layout_per_pool(cls, value: int, info: ValidationInfo) -> int:
        if info.data.get("deployment") == DISAGGREGATED and value != 1:
            raise ValueError(f"with deployment disaggregated each pool has its own layout: set {info.field_name} "
                             "in prefill and decode")
        return value


# Shared response pieces --------------------------------------------------------------------

HUMAN_SIZE_EXAMPLE = {"gb": 2.684355, "gib": 2.5}
COMPUTE_CURVE_POINT_EXAMPLE = {"tokens": 128, "compute_fraction_ratio": 0.62}
EFFICIENCY_EXAMPLE: dict[str, Any] = {
    "calibration_profile": "builtin", "bandwidth_fraction_ratio": 0.7,
    "compute_curve": [{"tokens": 64, "compute_fraction_ratio": 0.33}, COMPUTE_CURVE_POINT_EXAMPLE,
                      {"tokens": 256, "compute_fraction_ratio": 0.78}, {"tokens": 4096, "compute_fraction_ratio": 0.89},
                      {"tokens": 16384, "compute_fraction_ratio": 0.93}],
    "compute_scale_ratio": 1.0, "per_step_overhead_ms": 0.3, "per_layer_overhead_ms": 0.003,
    "allreduce_latency_ms": 0.0075, "pcie_link_fraction_ratio": 0.84, "per_sequence_overhead_ms": 0.0,
    "serial_step_overhead_ms": 0.3, "overlapped_host_per_sequence_ms": 0.0, "prefill_moe_layer_overhead_ms": 0.0,
    "decode_worker_step_overhead_ms": 0.0,
    "source": "defaults: compute curve = published A100 fp16 GEMM sweep (33% of peak at M=64 ... 93% at 16k); "
              "bandwidth 0.70 = batch-1 decode on A100-80GB; overhead 0.3 ms/step + 3 us/layer; two-GPU all-reduce "
              "alpha 7.5 us; PCIe links at 0.84 of their rate. Uncalibrated for this GPU and precision.",
}


KV_TRANSFER_EXAMPLE = {
    "link": "network", "mean_prompt_tokens": 8000, "bytes_per_request": 1310720000, "bytes_per_gpu": 655360000,
    "bandwidth_bytes_per_s": 5e10, "latency_ms": 0.0224, "time_ms": 13.13,
}


class KvTransferOut(BaseModel):
    """One prompt's KV cache moved from its prefill worker to its decode worker (at the mean prompt)."""

    model_config = schema_examples(KV_TRANSFER_EXAMPLE)

    link: Literal["nvlink", "pcie", "network"] = Field(
        description="nvlink when the deployment fits in one NVLink domain of its GPU and the engine moves the KV over "
                    "it there (SGLang's default Mooncake engine uses RDMA inside a node, NVLink only across an "
                    "NVL72, with the variables its launch command then sets); pcie for cards without NVLink whose "
                    "deployment fits in one node; else the scale-out network")
    mean_prompt_tokens: int
    bytes_per_request: int = Field(description="The prompt's whole KV cache")
    bytes_per_gpu: int = Field(description="What the most loaded decode GPU receives (each GPU its own shard)")
    bandwidth_bytes_per_s: float = Field(description="Per GPU, per direction")
    latency_ms: float
    time_ms: float = Field(description="latency + bytes_per_gpu / bandwidth")


class HumanSize(BaseModel):
    model_config = schema_examples(HUMAN_SIZE_EXAMPLE)

    gb: float = Field(description="Decimal gigabytes (1e9 bytes)")
    gib: float = Field(description="Binary gibibytes (2^30 bytes)")


class ComputeCurvePoint(BaseModel):
    model_config = schema_examples(COMPUTE_CURVE_POINT_EXAMPLE)

    tokens: int
    compute_fraction_ratio: float = Field(description="Achieved fraction of peak FLOP/s at this many tokens")


RUNNING_LIMIT_DESCRIPTION = (
    "Running requests of one scheduler at most. Under attention data parallelism each rank has its own: sglang "
    "divides the --max-running-requests it is launched with among the ranks (and caps each rank's at its request "
    "pool), the other engines give each rank the whole of it; null = no limit (the generic engine)")
STEP_TOKENS_DESCRIPTION = (
    "Tokens per step of one scheduler (prefill chunk). Under attention data parallelism each rank has its own "
    "scheduler: sglang divides the --chunked-prefill-size it is launched with among the ranks, the other engines "
    "give each rank the whole of it")


# The fields of an efficiency, as a response echoes it and as a calibration profile's entry lists it.
BandwidthFractionRatio = Annotated[float, Field(description="Achieved fraction of HBM bandwidth")]
ComputeCurve = Annotated[list[ComputeCurvePoint], Field(
    description="Achieved fraction of peak compute vs tokens per step")]
ComputeScaleRatio = Annotated[float, Field(description="Multiplies the compute curve (a fitted correction)")]
PerStepOverheadMs = Annotated[float, Field(description=(
    "The profile's fixed cost of an engine step: added to the step's time, except in an engine that prepares the "
    "next step while the GPU runs this one (TensorRT-LLM, SGLang, vLLM from 0.8), where it is host work: a step "
    "lasts at least this plus the overlapped host work of its sequences, and no more when the GPU takes longer. "
    "TensorRT-LLM from 1.0 with pipeline stages runs without that overlap and adds it to each micro-batch's step"))]
PerLayerOverheadMs = Annotated[float, Field(description=(
    "The profile's fixed cost of each decoder layer of an engine step (kernel launches and small operations)"))]
AllreduceLatencyMs = Annotated[float, Field(description=(
    "Fixed cost (alpha) of one communication call between two GPUs: a two-GPU all-reduce, a pipeline hand-off, "
    "an MoE exchange. A ring all-reduce over n GPUs takes NCCL's ratio (6.6 + 1.2 (n - 1)) / 7.8 times it "
    "(15.0 / 7.8 at 8 GPUs), plus NCCL's inter-node steps when the ring spans nodes"))]
PcieLinkFractionRatio = Annotated[float, Field(description=(
    "Achieved fraction of the PCIe link's per-direction rate in the layout's collectives (tensor-parallel "
    "all-reduce, pipeline hand-off, MoE exchange) on GPUs that talk over PCIe (no NVLink): 1 = the catalog's "
    "interconnect rate; NVLink and other scale-up fabrics always run at their catalog rate"))]
PerSequenceOverheadMs = Annotated[float, Field(description=(
    "The profile's host work per sequence per engine step, charged only where the engine does not overlap "
    "it with the GPU (vLLM before 0.8, the V0 engine): never in a roofline, not for current engine versions"))]
SerialStepOverheadMs = Annotated[float, Field(description=(
    "The profile's per-step overhead of an engine that does not overlap host work with the GPU (vLLM before 0.8, "
    "the V0 engine), charged there in place of per_step_overhead_ms: never in a roofline, not for current engine "
    "versions"))]
OverlappedHostPerSequenceMs = Annotated[float, Field(description=(
    "The profile's host work per sequence per engine step where the engine prepares the next step while the GPU "
    "runs this one (TensorRT-LLM, SGLang, vLLM from 0.8): hidden while the GPU takes longer, so a step lasts at "
    "least this times the sequences it samples (TensorRT-LLM from 1.0 with pipeline stages does not hide it: "
    "added to each micro-batch's step); never in a roofline"))]
PrefillMoeLayerOverheadMs = Annotated[float, Field(description=(
    "The profile's cost per MoE layer of an engine step that carries prompt tokens, charged only where the "
    "engine runs such steps outside CUDA graphs (TensorRT-LLM's PyTorch backend, SGLang before 0.5.10): "
    "never in a roofline, never for a dense model"))]
DecodeWorkerStepOverheadMs = Annotated[float, Field(description=(
    "The profile's cost of each step of a disaggregated deployment's decode worker beyond an aggregated worker's "
    "(its loop tracks the KV transfers in flight), one value for every GPU and engine fitted on published "
    "disaggregated runs: charged on decode pools only, never in a roofline"))]


class EfficiencyOut(BaseModel):
    """The efficiencies an expected time used, and where they came from."""

    model_config = schema_examples(EFFICIENCY_EXAMPLE)

    calibration_profile: str
    bandwidth_fraction_ratio: BandwidthFractionRatio
    compute_curve: ComputeCurve
    compute_scale_ratio: ComputeScaleRatio
    per_step_overhead_ms: PerStepOverheadMs
    per_layer_overhead_ms: PerLayerOverheadMs
    allreduce_latency_ms: AllreduceLatencyMs
    pcie_link_fraction_ratio: PcieLinkFractionRatio = 1.0
    per_sequence_overhead_ms: PerSequenceOverheadMs = 0.0
    serial_step_overhead_ms: SerialStepOverheadMs | None = None  # None: a quote's result stored before it
    overlapped_host_per_sequence_ms: OverlappedHostPerSequenceMs = 0.0
    prefill_moe_layer_overhead_ms: PrefillMoeLayerOverheadMs = 0.0
    decode_worker_step_overhead_ms: DecodeWorkerStepOverheadMs = 0.0
    source: str



# /v1/kv-cache ------------------------------------------------------------------------------

class KvCacheRequest(ModelRef):
    """How much KV cache a model keeps for a batch of sequences of one length."""

    model_config = schema_examples(
        {"model": "llama-3-70b", "context_tokens": 8192, "batch_size": 32},
        {"model": "deepseek-v3", "kv_dtype": "bf16", "context_tokens": 10000, "tensor_parallel": 8},
        {"model": "gemma-2-9b", "context_tokens": 8192, "block_size": 16},
        {"model_spec": MODEL_ARCHITECTURE_EXAMPLE, "kv_dtype": "fp8", "context_tokens": 32768},
    )

    kv_dtype: KvDtype | None = Field(
        None, description="null = the model's 16-bit dtype (bf16 for fp8/fp4/int4-quantized checkpoints)")
    context_tokens: ContextTokens = Field(description="Tokens each sequence holds: prompt + generated so far")
    batch_size: BatchSize = 1
    tensor_parallel: TensorParallel = 1
    pipeline_parallel: PipelineParallel = 1
    block_size: BlockSize | None = Field(None, description="Paged KV: round each sequence up to whole blocks; "
                                                           "null = unpaged")


KV_GROUP_EXAMPLE = {"kind": "full_attention", "window_tokens": None, "layers": 80, "bytes_per_token_per_layer": 4096,
                    "tokens_cached": 8192, "bytes_per_sequence": 2684354560}
KV_SIZES_FOR_PEOPLE_EXAMPLE = {"bytes_per_sequence": HUMAN_SIZE_EXAMPLE, "total_bytes": {"gb": 85.899346, "gib": 80.0},
                               "bytes_per_gpu": {"gb": 85.899346, "gib": 80.0}}
KV_CURVE_POINT_EXAMPLE = {"context_tokens": 4096, "bytes_per_sequence": 1409286144}
KV_CURVE_EXAMPLE = {  # Gemma-2-9B: 21 sliding layers (window 4096) and 21 global ones
    "points": [{"context_tokens": 0, "bytes_per_sequence": 0}, KV_CURVE_POINT_EXAMPLE,
               {"context_tokens": 8192, "bytes_per_sequence": 2113929216}],
    "breakpoints_tokens": [4096],
    "note": "No single bytes-per-token slope: window layers stop growing at their window. 0-4,096 tokens: "
            "344,064 B per token; beyond 4,096 tokens: 172,032 B per token. Points are unpaged; interpolate "
            "linearly between them.",
}
KV_ASSUMPTIONS_EXAMPLE = {
    "kv_dtype": "bf16", "kv_dtype_source": "default: the model's dtype",
    "formulas": [("MHA/GQA/MQA: 2 (K and V) x ceil(num_key_value_heads / tp) x head_dim x bytes per value, per "
                 "token per layer per GPU (KV heads are replicated when tp > num_key_value_heads)")],
    "defaults_used": ["kv_dtype = bf16 (the model's dtype)"],
}


class KvLayerGroupOut(BaseModel):
    """Layers that share an attention kind and window."""

    model_config = schema_examples(KV_GROUP_EXAMPLE)

    kind: Literal["full_attention", "sliding_attention", "chunked_attention", "mla"]
    window_tokens: int | None = Field(description="Tokens these layers cache at most; null = the whole context")
    layers: int
    bytes_per_token_per_layer: int = Field(description="Unsharded (tensor_parallel = 1)")
    tokens_cached: int = Field(description="Per sequence, after the window and block rounding")
    bytes_per_sequence: int = Field(description="layers x bytes_per_token_per_layer x tokens_cached")


class KvSizesForPeople(BaseModel):
    model_config = schema_examples(KV_SIZES_FOR_PEOPLE_EXAMPLE)

    bytes_per_sequence: HumanSize
    total_bytes: HumanSize
    bytes_per_gpu: HumanSize


class KvCurvePointOut(BaseModel):
    model_config = schema_examples(KV_CURVE_POINT_EXAMPLE)

    context_tokens: int
    bytes_per_sequence: int


class KvCurve(BaseModel):
    """Bytes per sequence against context for a model with window layers: piecewise linear, with a
    kink at every window; linear interpolation between these points is exact."""

    model_config = schema_examples(KV_CURVE_EXAMPLE)

    points: list[KvCurvePointOut]
    breakpoints_tokens: list[int] = Field(description="Contexts where the slope changes (the windows)")
    note: str


class KvAssumptions(BaseModel):
    model_config = schema_examples(KV_ASSUMPTIONS_EXAMPLE)

    kv_dtype: str
    kv_dtype_source: str
    formulas: list[str]
    defaults_used: list[str]


class KvCacheResponse(BaseModel):
    model: str = Field(description="Catalog slug, or \"model_spec (inline)\"")
    kv_dtype: KvDtype
    context_tokens: int
    tokens_cached_per_sequence: int = Field(description="The most tokens any layer holds, after windows and "
                                                        "block rounding")
    batch_size: int
    tensor_parallel: int
    pipeline_parallel: int
    block_size: int | None
    bytes_per_sequence: int = Field(description="One sequence, whole model, unsharded")
    total_bytes: int = Field(description="bytes_per_sequence x batch_size")
    bytes_per_sequence_per_gpu: int = Field(description="One sequence on the most loaded GPU")
    bytes_per_gpu: int = Field(description="The whole batch's KV on the most loaded GPU")
    bytes_per_token: float = Field(description="bytes_per_sequence / context_tokens (an average for "
                                               "windowed models: see curve)")
    breakdown: list[KvLayerGroupOut]
    formula: str = Field(description="The arithmetic, in words")
    sizes_for_people: KvSizesForPeople
    mha_equivalent_bytes_per_sequence: int = Field(
        description="What the same model would cache with one K and one V head per query head (unpaged)")
    mha_saving_ratio: float = Field(description="Fraction of the MHA-equivalent size that GQA/MQA/MLA saves")
    curve: KvCurve | None = Field(description="Windowed models only: bytes against context (no single slope)")
    warnings: list[str] = Field(default_factory=list, description=(
        "Inputs beyond what the model or a serving engine supports, e.g. a sequence longer than the model's "
        "max_position_embeddings; the figures still follow the formulas"))
    assumptions: KvAssumptions
    calculation_version: str

    model_config = schema_examples({
        "model": "llama-3-70b", "kv_dtype": "bf16", "context_tokens": 8192, "tokens_cached_per_sequence": 8192,
        "batch_size": 32, "tensor_parallel": 1, "pipeline_parallel": 1, "block_size": None,
        "bytes_per_sequence": 2684354560, "total_bytes": 85899345920, "bytes_per_sequence_per_gpu": 2684354560,
        "bytes_per_gpu": 85899345920, "bytes_per_token": 327680.0,
        "breakdown": [KV_GROUP_EXAMPLE],
        "formula": "per token per layer: 2 (K and V) x 8 KV heads x 128 head_dim x 2 bytes (bf16) = 4,096 B; "
                   "per sequence: 80 full_attention layers x 4,096 B x 8,192 tokens = 2,684,354,560 B; "
                   "x 32 sequences = 85,899,345,920 B",
        "sizes_for_people": KV_SIZES_FOR_PEOPLE_EXAMPLE,
        "mha_equivalent_bytes_per_sequence": 21474836480, "mha_saving_ratio": 0.875, "curve": None,
        "assumptions": KV_ASSUMPTIONS_EXAMPLE,
        "calculation_version": "2026.12.03.4",
    })


# /v1/roofline ------------------------------------------------------------------------------

# One GPU's step (what /v1/roofline/chart draws too), and a disaggregated deployment's two pools.
AGGREGATED_ROOFLINE_EXAMPLES: tuple[dict[str, Any], ...] = (
    {"model": "llama-3-8b", "gpu": "h100-sxm", "phase": "decode", "batch_size": 1, "context_tokens": 1024},
    {"model": "llama-3-70b", "gpu": "h100-sxm", "phase": "prefill", "prompt_tokens": 2048, "tensor_parallel": 4},
    {"model": "mixtral-8x7b", "gpu_spec": GPU_SPEC_EXAMPLE, "phase": "decode", "batch_size": 64,
     "context_tokens": 2048, "weight_dtype": "fp8", "kv_dtype": "fp8"},
)
DISAGGREGATED_ROOFLINE_EXAMPLE: dict[str, Any] = {
    "model": "llama-3.1-70b", "gpu": "h100-sxm", "weight_dtype": "fp8", "kv_dtype": "fp8",
    "deployment": "disaggregated", "prefill": {"tensor_parallel": 4}, "decode": {"tensor_parallel": 8},
    "prompt_tokens": 8192, "batch_size": 64}


class RooflineRequest(PoolsRef, Precisions, WeightRecipeRef, CalibrationRef, GpuRef, ModelRef):
    """One prefill or decode step of a model on a GPU, against the roofline; or, disaggregated, the
    prefill pool's step of one prompt, the decode pool's step at a batch, and the KV transfer between."""

    model_config = schema_examples(*AGGREGATED_ROOFLINE_EXAMPLES, DISAGGREGATED_ROOFLINE_EXAMPLE)

    phase: Phase | None = Field(None, validate_default=True,
                                description="The step to time (required); omit with deployment disaggregated, "
                                            "which times the prefill pool's prefill and the decode pool's decode")
    batch_size: BatchSize = Field(1, description="Concurrent sequences in the step (disaggregated: in the decode "
                                                 "pool's step; the prefill pool prefills one prompt)")
    prompt_tokens: ContextTokens | None = Field(
        None, validate_default=True,
        description="Prefill only (required there): new prompt tokens per sequence. Disaggregated (required): "
                    "the prompt the prefill pool prefills and whose KV cache moves to the decode pool")
    context_tokens: CachedTokens | None = Field(
        None, validate_default=True,
        description="Decode: tokens already cached per sequence (required). Prefill: a cached prefix the "
                    "prompt follows (default 0). Disaggregated: cached per sequence in the decode pool's step "
                    "(default prompt_tokens: the first step after the transfer)")
    tensor_parallel: TensorParallel = 1
    data_parallel: DataParallel = 1
    expert_parallel: ExpertParallel = 1

    @field_validator("phase")
    @classmethod
    def _phase_unless_disaggregated(cls, value: str | None, info: ValidationInfo) -> str | None:
        deployment = info.data.get("deployment")
        if deployment == DISAGGREGATED and value is not None:
            raise ValueError("omit with deployment disaggregated: the prefill pool prefills and the decode pool "
                             "decodes")
        if deployment != DISAGGREGATED and value is None:
            raise ValueError("required: prefill or decode (or deployment disaggregated for both pools)")
        return value

    @field_validator("prompt_tokens")
    @classmethod
    def _prompt_for_prefill(cls, value: int | None, info: ValidationInfo) -> int | None:
        phase = info.data.get("phase")
        if info.data.get("deployment") == DISAGGREGATED and value is None:
            raise ValueError("required with deployment disaggregated: the prompt tokens per request")
        if phase == "prefill" and value is None:
            raise ValueError("required for phase prefill: the new prompt tokens per sequence")
        if phase == "decode" and value is not None:
            raise ValueError("applies to phase prefill only; a decode step adds one token per sequence after "
                             "context_tokens")
        return value

    @field_validator("context_tokens")
    @classmethod
    def _context_for_decode(cls, value: int | None, info: ValidationInfo) -> int | None:
        if info.data.get("phase") == "decode" and value is None:
            raise ValueError("required for phase decode: the tokens already cached per sequence")
        return value


OPERATOR_EXAMPLE = {"name": "mlp", "flops": 11274289152.0, "bytes": 11276648448.0, "arithmetic_intensity": 0.9998,
                    "bound": "memory", "ideal_time_ms": 3.366164, "expected_time_ms": 4.808805}
ATTENTION_TRAFFIC_EXAMPLE = {  # Llama-3-8B decode at 1,024 tokens: the score row is small next to the KV
    "flash_bytes": 135004160.0, "naive_bytes": 139202560.0, "score_matrix_bytes": 4198400.0,
    "naive_to_flash_ratio": 1.0311,
    "note": "HBM bytes of this step's attention on one GPU. FlashAttention tiles Q, K and V through on-chip "
            "SRAM, so the score matrix never reaches HBM; naive attention writes it and reads it back.",
}
ROOFLINE_ASSUMPTIONS_EXAMPLE = {
    "weight_dtype": "bf16", "weight_recipe": PLAIN_BF16_RECIPE, "kv_dtype": "bf16", "compute_dtype": "bf16", "activation_dtype": "bf16",
    "efficiency": EFFICIENCY_EXAMPLE,
    "formulas": [("ideal time = max(FLOPs / peak FLOP/s, bytes / HBM bandwidth), per GPU of the tensor-parallel "
                 "group")],
    "defaults_used": ["weight_dtype = bf16 (the model's published dtype)", "kv_dtype = bf16 (the model's dtype)",
                      "compute_dtype = bf16 (the weights' precision, which the GPU has a tensor rate for)",
                      "calibration = builtin"],
    "held_out_error": None,
}


class OperatorOut(BaseModel):
    model_config = schema_examples(OPERATOR_EXAMPLE)

    name: Literal["embedding", "qkv", "attention", "out", "mlp", "moe", "router", "norm", "lm_head"]
    flops: float
    bytes: float
    arithmetic_intensity: float | None = Field(description="FLOPs per byte; null when it moves no bytes")
    bound: Bound
    ideal_time_ms: float
    expected_time_ms: float


class AttentionTraffic(BaseModel):
    """HBM bytes of this step's attention with FlashAttention and with naive attention."""

    model_config = schema_examples(ATTENTION_TRAFFIC_EXAMPLE)

    flash_bytes: float
    naive_bytes: float
    score_matrix_bytes: float = Field(description="naive - flash: the score matrix written and read back")
    naive_to_flash_ratio: float
    note: str


class RooflineAssumptions(BaseModel):
    model_config = schema_examples(ROOFLINE_ASSUMPTIONS_EXAMPLE)

    weight_dtype: str
    weight_recipe: str = WEIGHT_RECIPE_OUT
    kv_dtype: str
    compute_dtype: str
    activation_dtype: str
    efficiency: EfficiencyOut
    formulas: list[str]
    defaults_used: list[str]
    held_out_error: HeldOutErrorOut | None = Field(None, description=(
        "How far predictions made with these efficiencies were from published measurements their calibration "
        "never saw, for this layout family, GPU (both pools' when disaggregated) and model family: the validator's "
        "predictions of measured runs, whose steps this step-time model times. A decode step's expected time is "
        "what by_metric.tpot_itl measures (the time between tokens, on runs whose decode steps also carry other "
        "requests' prompts); a prompt's, at light load, part of what ttft measures. `engine` is null: a roofline "
        "step has no engine (/v1/capacity and /v1/slo-plan name one). Null when the profile has no "
        "cross-validation (builtin, one fitted by POST /v1/calibrations or by `python -m app.calibrate "
        "--no-cross-validation`)"))


POOL_STEP_EXAMPLE = {
    "role": "decode", "gpu": "h100-sxm", "tensor_parallel": 8, "data_parallel": 1, "expert_parallel": 1,
    "moe_tensor_parallel": 8, "layout": "TP8", "workers": 1, "gpus": 8, "phase": "decode", "batch_size": 64, "prompt_tokens": None, "context_tokens": 8192,
    "tokens": 64, "compute_dtype": "fp8", "bound": "memory", "ideal_time_ms": 6.1, "expected_time_ms": 9.4,
    "comm_time_ms": 1.2, "overhead_time_ms": 0.54, "expected_tokens_per_s": 6808.5,
}


class PoolStepOut(BaseModel):
    """One pool's step on one GPU of a worker's tensor-parallel group (the full breakdown of this step:
    /v1/roofline with this pool's GPU and layout and its phase)."""

    model_config = schema_examples(POOL_STEP_EXAMPLE)

    role: Phase
    gpu: str
    tensor_parallel: int
    data_parallel: int
    expert_parallel: int
    moe_tensor_parallel: int = Field(description="GPUs each routed expert is split over")
    layout: str = Field(description='A worker\'s layout in short, e.g. "TP1 DP8 EP8" (no pipeline stages here)')
    workers: int
    gpus: int = Field(description="workers x tensor_parallel x data_parallel")
    phase: Phase = Field(description="prefill: one prompt alone (the compute in its TTFT); decode: batch_size "
                                     "sequences of context_tokens")
    batch_size: int
    prompt_tokens: int | None
    context_tokens: int
    tokens: int
    compute_dtype: ComputeDtype
    bound: Bound
    ideal_time_ms: float
    expected_time_ms: float
    comm_time_ms: float
    overhead_time_ms: float
    expected_tokens_per_s: float


class RooflineDisaggregationOut(BaseModel):
    """Both pools' steps of a disaggregated deployment and the KV transfer between them."""

    model_config = schema_examples({
        "prefill": {**POOL_STEP_EXAMPLE, "role": "prefill", "tensor_parallel": 4, "gpus": 4, "phase": "prefill",
                    "batch_size": 1, "prompt_tokens": 8192, "context_tokens": 0, "tokens": 8192,
                    "bound": "compute", "ideal_time_ms": 380.0, "expected_time_ms": 450.0,
                    "expected_tokens_per_s": 18204.4},
        "decode": POOL_STEP_EXAMPLE, "kv_transfer": {**KV_TRANSFER_EXAMPLE, "link": "nvlink"},
        "ttft_ms": 470.0})

    prefill: PoolStepOut
    decode: PoolStepOut
    kv_transfer: KvTransferOut = Field(description="Of prompt_tokens, from app.sizing.serving.disaggregation")
    ttft_ms: float = Field(description="One request through the pools without queueing: the prefill pool's "
                                       "expected step + the KV transfer + the decode pool's expected step (the "
                                       "decode worker streams the first token with its first step)")


class RooflineResponse(BaseModel):
    model: str = Field(description="Catalog slug, or \"model_spec (inline)\"")
    gpu: str = Field(description="Catalog slug, or the inline gpu_spec's name")
    phase: Phase
    batch_size: int
    prompt_tokens: int | None
    context_tokens: int
    tensor_parallel: int
    data_parallel: int
    expert_parallel: int
    tokens: int = Field(description="New tokens this step processes, all sequences")
    compute_dtype: ComputeDtype
    flops: float = Field(description="Per GPU")
    bytes: float = Field(description="HBM bytes moved per GPU")
    arithmetic_intensity: float = Field(description="FLOPs per byte")
    ridge_point: float = Field(description="Peak FLOP/s / HBM bandwidth at compute_dtype")
    bound: Bound
    compute_time_ms: float = Field(description="Every FLOP at peak")
    memory_time_ms: float = Field(description="Every byte at full bandwidth")
    ideal_time_ms: float = Field(description="max(compute_time_ms, memory_time_ms)")
    expected_time_ms: float = Field(description="Operators at achieved efficiency + all-reduces + overheads")
    comm_time_ms: float = Field(description="Tensor-parallel all-reduces, in the expected time")
    overhead_time_ms: float = Field(description="Per-step and per-layer overheads, in the expected time")
    ideal_tokens_per_s: float
    expected_tokens_per_s: float
    operators: list[OperatorOut]
    attention_traffic: AttentionTraffic
    warnings: list[str] = Field(default_factory=list, description=(
        "Inputs beyond what the model or a serving engine supports, e.g. a sequence longer than the model's "
        "max_position_embeddings; the figures still follow the formulas"))
    assumptions: RooflineAssumptions
    calculation_version: str
    deployment: Deployment = Field("aggregated", description=(
        "disaggregated: the top-level fields are the decode pool's step (its GPU, layout, batch_size at "
        "context_tokens), as /v1/slo-plan's disaggregated plans describe a decode worker; both pools' steps and "
        "the KV transfer are in `disaggregation`"))
    disaggregation: RooflineDisaggregationOut | None = Field(
        None, description="deployment disaggregated: both pools' steps and the KV transfer between them")

    model_config = schema_examples({
        "model": "llama-3-8b", "gpu": "h100-sxm", "phase": "decode", "batch_size": 1, "prompt_tokens": None,
        "context_tokens": 1024, "tensor_parallel": 1, "data_parallel": 1, "expert_parallel": 1, "tokens": 1,
        "compute_dtype": "bf16",
        "flops": 15546712064.0, "bytes": 15148673536.0, "arithmetic_intensity": 1.0263, "ridge_point": 295.3731,
        "bound": "memory", "compute_time_ms": 0.015712, "memory_time_ms": 4.521992, "ideal_time_ms": 4.521992,
        "expected_time_ms": 6.903746, "comm_time_ms": 0.0, "overhead_time_ms": 0.396,
        "ideal_tokens_per_s": 221.14, "expected_tokens_per_s": 144.85,
        "operators": [
            {"name": "attention", "flops": 537395200.0, "bytes": 135004160.0, "arithmetic_intensity": 3.9806,
             "bound": "memory", "ideal_time_ms": 0.0403, "expected_time_ms": 0.105328},
            OPERATOR_EXAMPLE,
        ],
        "attention_traffic": ATTENTION_TRAFFIC_EXAMPLE,
        "assumptions": ROOFLINE_ASSUMPTIONS_EXAMPLE,
        "calculation_version": "2026.12.03.4",
    })


# /v1/roofline/batch-sweep ------------------------------------------------------------------

class BatchSweepRequest(Precisions, WeightRecipeRef, CalibrationRef, GpuRef, ModelRef):
    """Decode step time and throughput against batch size: the seed's money slide. With attention data
    parallelism each batch size is one rank's sequences, every rank decoding as many (as /v1/roofline)."""

    model_config = schema_examples(
        {"model": "llama-3-8b", "gpu": "h100-sxm", "context_tokens": 1024},
        {"model": "llama-3-70b", "gpu": "h100-sxm", "context_tokens": 4096, "tensor_parallel": 8,
         "batch_sizes": [1, 8, 32, 64, 128, 256]},
        {"model": "deepseek-v3", "gpu": "h200-sxm", "context_tokens": 2048, "weight_dtype": "fp8",
         "data_parallel": 8, "expert_parallel": 8},
    )

    context_tokens: CachedTokens = Field(description="Tokens already cached per sequence")
    batch_sizes: list[BatchSize] | None = Field(
        None, min_length=1, max_length=MAX_SWEEP_POINTS,
        description=f"Batch sizes to evaluate (at most {MAX_SWEEP_POINTS}); null = 1, 2, 4, ..., 1024")
    tensor_parallel: TensorParallel = 1
    data_parallel: DataParallel = 1
    expert_parallel: ExpertParallel = 1


SWEEP_POINT_EXAMPLE = {
    "batch_size": 32, "bound": "memory", "ideal_step_time_ms": 4.684814, "expected_step_time_ms": 7.088592,
    "ideal_tokens_per_s": 6830.58, "expected_tokens_per_s": 4514.3, "ideal_tokens_per_s_per_user": 213.46,
    "expected_tokens_per_s_per_user": 141.07, "kv_bytes_per_gpu": 541065216,
    "weights_and_kv_bytes_per_gpu": 16601587712, "fits_in_gpu_memory": True,
}


class BatchSweepPoint(BaseModel):
    model_config = schema_examples(SWEEP_POINT_EXAMPLE)

    batch_size: int
    bound: Bound = Field(description="Of the ideal step")
    ideal_step_time_ms: float
    expected_step_time_ms: float
    ideal_tokens_per_s: float = Field(description="Aggregate over the batch (one attention data-parallel rank's; "
                                                  "the replica's is data_parallel times it)")
    expected_tokens_per_s: float = Field(description="Aggregate over the batch (one attention data-parallel "
                                                     "rank's; the replica's is data_parallel times it)")
    ideal_tokens_per_s_per_user: float
    expected_tokens_per_s_per_user: float
    kv_bytes_per_gpu: int = Field(description="The batch's KV cache on one GPU")
    weights_and_kv_bytes_per_gpu: int = Field(description="Weights + KV on one GPU (before activations and "
                                                          "engine reserves)")
    fits_in_gpu_memory: bool = Field(description="weights_and_kv_bytes_per_gpu <= the GPU's memory as CUDA reports "
                                                 "it (SIZING.md section 7); a necessary condition only")


class BatchSweepResponse(BaseModel):
    model: str = Field(description="Catalog slug, or \"model_spec (inline)\"")
    gpu: str = Field(description="Catalog slug, or the inline gpu_spec's name")
    context_tokens: int
    tensor_parallel: int
    data_parallel: int
    expert_parallel: int
    compute_dtype: ComputeDtype
    ridge_point: float
    points: list[BatchSweepPoint]
    knee_batch_size: int | None = Field(
        description="Smallest batch whose ideal decode step is compute-bound (analytic); null = never")
    knee_explanation: str
    warnings: list[str] = Field(default_factory=list, description=(
        "Inputs beyond what the model or a serving engine supports, e.g. a sequence longer than the model's "
        "max_position_embeddings; the figures still follow the formulas"))
    assumptions: RooflineAssumptions
    calculation_version: str

    model_config = schema_examples({
        "model": "llama-3-8b", "gpu": "h100-sxm", "context_tokens": 128, "tensor_parallel": 1,
        "data_parallel": 1, "expert_parallel": 1, "compute_dtype": "bf16", "ridge_point": 295.3731,
        "points": [
            {"batch_size": 1, "bound": "memory", "ideal_step_time_ms": 4.486935, "expected_step_time_ms": 6.811674,
             "ideal_tokens_per_s": 222.87, "expected_tokens_per_s": 146.81, "ideal_tokens_per_s_per_user": 222.87,
             "expected_tokens_per_s_per_user": 146.81, "kv_bytes_per_gpu": 16908288,
             "weights_and_kv_bytes_per_gpu": 16077430784, "fits_in_gpu_memory": True},
            SWEEP_POINT_EXAMPLE,
            {"batch_size": 512, "bound": "compute", "ideal_step_time_ms": 7.801312,
             "expected_step_time_ms": 13.852326, "ideal_tokens_per_s": 65629.98, "expected_tokens_per_s": 36961.3,
             "ideal_tokens_per_s_per_user": 128.18, "expected_tokens_per_s_per_user": 72.19,
             "kv_bytes_per_gpu": 8657043456, "weights_and_kv_bytes_per_gpu": 24717565952,
             "fits_in_gpu_memory": True},
        ],
        "knee_batch_size": 507,
        "knee_explanation": "From 507 sequences on, the ideal decode step is compute-bound: the weight read, paid "
                            "once per step, is shared by enough sequences that their FLOPs outlast the step's "
                            "memory traffic.",
        "assumptions": ROOFLINE_ASSUMPTIONS_EXAMPLE,
        "calculation_version": "2026.12.03.4",
    })
