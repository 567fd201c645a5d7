"""What every serving engine module provides (`Engine`), and the vocabulary they share.

An engine module holds everything the service knows about one engine: its memory accounting defaults
(with their sources), its scheduler defaults, the reasons it refuses to start, and the flags of its
launch command. The capacity, planning and prediction code ask the engine through this protocol and
never test an engine's name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from app.sizing.layout import Layout, LayoutProblem
from app.sizing.model.recipes import WeightRecipe
from app.sizing.specs import GpuSpec, ModelSpec

if TYPE_CHECKING:
    from app.sizing.engines import EngineConfig

GIB = 1 << 30
MIB = 1 << 20

# What `gpu_memory_utilization` is a fraction of.
OF_TOTAL = "total_memory"
OF_FREE = "free_memory_after_weights_and_activations"

# How an engine holds a running request's KV, i.e. which concurrency view it runs at.
ON_DEMAND = "on_demand"  # blocks allocated as tokens arrive (vLLM, SGLang): steady state
RESERVE_AT_ADMISSION = "reserve_at_admission"  # input + full output reserved up front: admission

STEADY_STATE = "steady_state"
ADMISSION = "admission"

# Kinds of speculative decoding an engine may run beside the model (`EngineConfig.speculative`).
DRAFT_MODEL = "draft_model"  # a separate, smaller model drafts (SGLang's STANDALONE)
EAGLE = "eagle"  # a draft head on the model's own hidden states (EAGLE, MTP)
NGRAM = "ngram"  # prompt lookup: no model drafts
SPECULATIVE_KINDS = (DRAFT_MODEL, EAGLE, NGRAM)

# Measured on H100 80 GB, vLLM, Llama-3.1-8B, TP1 and TP2+ (SIZING.md s7).
NON_TORCH_BYTES_SINGLE_GPU = round(0.13 * GIB)  # measured at TP1 (0.13-0.15 GiB)
# With 2+ GPUs NCCL adds its buffers: 0.55-0.6 GiB measured; the upper end, to stay on the safe side.
NON_TORCH_BYTES_MULTI_GPU = round(0.6 * GIB)

SIXTEEN_BIT = ("bf16", "fp16")

Default = tuple[int | float | None, str]  # (value, where it comes from)


_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str) -> tuple[int, int, int]:
    """'0.19.0', 'v0.19', '0.19.0 (vllm/vllm-openai:v0.19.0, V1 engine)' -> (0, 19, 0)."""
    match = _VERSION.match(text.strip())
    if match is None:
        raise ValueError(f"engine version {text!r} is not major.minor[.patch]")
    return int(match[1]), int(match[2]), int(match[3] or 0)


def model_dtype_kv(model_dtype: str) -> tuple[str, str]:
    """`--kv-cache-dtype auto` without a checkpoint KV scheme: the model's 16-bit (or fp32) dtype."""
    if model_dtype in ("bf16", "fp16", "fp32"):
        return model_dtype, "the model's dtype: the engine's 'auto' KV dtype"
    return "bf16", (f"the model's weights are {model_dtype}, but activations and the KV cache stay 16-bit "
                    "unless KV quantization is asked for")


def checkpoint_kv(engine: str, version: str, recipe: WeightRecipe | None, model_dtype: str,
                  since: tuple[int, int, int] | None) -> tuple[str, str]:
    """The KV dtype of an engine whose 'auto' adopts a ModelOpt checkpoint's `kv_cache_quant_algo` from
    version `since` (None: never), and the rule it followed."""
    declared = recipe.checkpoint_kv_dtype if recipe is not None else None
    if recipe is None or declared is None:
        return model_dtype_kv(model_dtype)
    checkpoint = f"the {recipe.name} checkpoint declares an {declared} KV cache (kv_cache_quant_algo)"
    if recipe.producer == "modelopt" and since is not None and parse_version(version) >= since:
        first = ".".join(map(str, since))
        return declared, f"{checkpoint}; {engine} {first}+ resolves 'auto' from a ModelOpt config"
    dtype, _ = model_dtype_kv(model_dtype)
    return dtype, f"{checkpoint}, but {engine} {version} 'auto' ignores it: the model's dtype"


def non_torch_default(gpus: int) -> Default:
    """Memory outside PyTorch's allocator (CUDA context, cuBLAS workspaces, NCCL buffers), measured."""
    if gpus > 1:
        return NON_TORCH_BYTES_MULTI_GPU, ("measured on H100: 0.55-0.6 GiB with 2+ GPUs (NCCL buffers), "
                                          "upper end")
    return NON_TORCH_BYTES_SINGLE_GPU, "measured on H100: 0.13 GiB on one GPU (CUDA context, cuBLAS)"


@dataclass(frozen=True, slots=True)
class ResolvedEngine:
    """Every setting the accounting uses, with where each value came from (`sources`)."""

    engine: str
    engine_version: str  # the version whose rules were applied ("" for the generic engine)
    total_bytes_per_gpu: int  # the memory the engine sizes from (what CUDA reports, for vLLM and TRT-LLM)
    gpu_memory_utilization: float
    utilization_of: str  # OF_TOTAL or OF_FREE
    reserved_bytes_per_gpu: int
    activation_bytes_per_gpu: int
    non_torch_bytes_per_gpu: int
    cuda_graph_bytes_per_gpu: int
    max_num_seqs: int | None  # None: no limit (generic), or SGLang's, derived from the KV pool by `capacity`
    max_num_batched_tokens: int
    block_size: int
    max_model_len: int
    kv_allocation: str  # ON_DEMAND or RESERVE_AT_ADMISSION
    sources: tuple[tuple[str, str], ...]  # (setting, where its value came from)

    @property
    def overhead_bytes_per_gpu(self) -> int:
        return self.non_torch_bytes_per_gpu + self.cuda_graph_bytes_per_gpu + self.reserved_bytes_per_gpu

    @property
    def running_view(self) -> str:
        """The concurrency view the engine's scheduler runs at."""
        return STEADY_STATE if self.kv_allocation == ON_DEMAND else ADMISSION


# The roles of a disaggregated deployment's workers (ENGINES.md section 3).
PREFILL_ROLE = "prefill"
DECODE_ROLE = "decode"


@dataclass(frozen=True, slots=True)
class GraphSetup:
    """What of a deployment, beyond the engine release, decides whether its prompt steps replay CUDA graphs
    (`Engine.graphs_prefill_steps`)."""

    data_parallel: int = 1  # attention data-parallel ranks
    pipeline_parallel: int = 1
    speculative: str | None = None  # SPECULATIVE_KINDS, or None
    vendor: str = "NVIDIA"  # the GPU's maker (the catalog's `vendor`)
    disaggregated: bool = False  # a prefill or decode worker of a disaggregated deployment


DEFAULT_GRAPH_SETUP = GraphSetup()


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """What a launch command must set; `speculative_*` only with speculative decoding."""

    engine: str
    model_id: str  # Hugging Face repository id (or a placeholder for an inline model)
    model_dtype: str  # the checkpoint's own weight precision
    tensor_parallel: int
    pipeline_parallel: int
    weight_dtype: str
    kv_dtype: str
    max_num_seqs: int | None
    max_num_batched_tokens: int
    max_model_len: int
    gpu_memory_utilization: float
    draft_tokens: int | None = None
    draft_model_id: str | None = None  # None with draft_tokens: n-gram (prompt lookup) proposals
    data_parallel: int = 1  # attention data-parallel ranks (`layout.Layout`)
    expert_parallel: int = 1
    nodes: int = 1  # the nodes one replica (or disaggregated worker) spans


def one_byte_kv_note(spec: LaunchSpec, engine_name: str) -> list[str]:
    """vLLM and SGLang cache one-byte KV values as fp8 only: an int8 KV cache planned is launched as fp8, the same
    size (their `--kv-cache-dtype` flag is set for either, `launch_words`)."""
    if spec.kv_dtype != "int8":
        return []
    return [f"int8 KV cache: launched as fp8, the same size ({engine_name} caches one-byte values as fp8)"]


def online_fp8(spec: LaunchSpec) -> bool:
    """fp8 weights from a 16-bit checkpoint: quantized on load by vLLM and SGLang."""
    return spec.weight_dtype == "fp8" and spec.model_dtype in SIXTEEN_BIT


# NVIDIA Dynamo, which routes either engine's disaggregated workers, moves the KV between Kubernetes pods over
# RDMA only (ENGINES.md section 3; ai-dynamo/dynamo `docs/pages/kubernetes/disagg-communication-guide.md` @390ea9bb).
DYNAMO_PODS = "NVIDIA Dynamo (between Kubernetes pods it moves the KV over RDMA, never NVLink)"


class Engine(Protocol):
    """One serving engine's rules. Implemented once per engine module; listed in `engines.ENGINES`."""

    name: str  # the request value: "vllm", "sglang", "trtllm", "generic"
    default_version: str  # what a request without engine_version gets ("" where versions do not matter)
    default_version_source: str  # why that release: what a response names as its source
    # The first and last releases the engine reference (ENGINES.md section 1) states rules for ("" where it names
    # none): a release outside them gets the nearest one's rules, and the response says so.
    covered_versions: tuple[str, str]
    # The checkpoint recipe its published runs of a quantized weight dtype serve (measured runs that do
    # not state their checkpoint), by weight dtype.
    published_checkpoints: tuple[tuple[str, str], ...]
    # Its published disaggregated runs launch a decode worker with max_num_tokens = the worker's max batch rounded up
    # to a whole number of this many tokens (None: at the engine's default token budget).
    published_decode_worker_block: int | None
    utilization_of: str  # OF_TOTAL or OF_FREE: what its memory fraction is a fraction of
    kv_allocation: str  # ON_DEMAND or RESERVE_AT_ADMISSION
    speculative_flags: bool  # True when `launch_words` spells out speculative decoding
    # True when its max_num_batched_tokens (prefill chunk) and max_num_seqs, as launched, are the replica's,
    # split among the attention data-parallel ranks; False when each rank's scheduler gets the whole of each.
    divides_limits_by_dp: bool
    # How its feed-forward blocks move tokens between attention data-parallel ranks by default: `comm.PER_EXPERT`
    # or `comm.ALL_GATHER` (the MoE layers only), or `comm.FFN_ALL_GATHER` (every block, dense MLPs and shared
    # experts split over all tp·dp GPUs: `dense_over_attention_dp`) (`comm.moe_exchange_bytes_per_token`).
    moe_exchange: str
    # The GPU makers it runs on (the catalog's `vendor`); empty: any maker the catalog lists.
    gpu_vendors: tuple[str, ...]
    # Which pipeline stages take the L mod pp leftover layers (`params.SPLIT_BEFORE_LAST` or `SPLIT_FIRST`).
    pipeline_split: str

    def defaults(self, config: EngineConfig, model: ModelSpec, gpu: GpuSpec, tensor_parallel: int,
                 pipeline_parallel: int, version: str, model_dtype_bytes: int,
                 data_parallel: int = 1) -> dict[str, Default]:
        """The engine's default for every setting of `EngineConfig` but `max_model_len`, with its source, at
        `version`; `model_dtype_bytes` is the unquantized parts' dtype (4 for a model served in fp32);
        `data_parallel` attention ranks of `tensor_parallel` GPUs each share one process group."""
        ...

    def kv_dtype(self, version: str, recipe: WeightRecipe | None, model_dtype: str) -> tuple[str, str]:
        """The KV dtype `--kv-cache-dtype auto` (or its equivalent) picks for this checkpoint, and why."""
        ...

    def running_limit(self, given: int | None, kv_tokens: int, max_model_len: int) -> int | None:
        """One scheduler's limit on running sequences with `kv_tokens` in its KV pool: `given` (one rank's; None
        where the engine's default follows from the pool) as the engine applies it (None: no limit of its own)."""
        ...

    def mixes_prefill_into_decode(self) -> bool:
        """Whether the running decodes ride in the steps that carry prompt chunks by default (False: a step
        with prompt work pauses the decodes)."""
        ...

    def overlaps_host_work(self, version: str) -> bool:
        """Whether the engine prepares the next step on the host while the GPU runs this one (False: its
        per-sequence host work, `Efficiency.per_sequence_overhead_s`, adds to every step). `version` is
        major.minor[.patch], or a year ('2024') where a published run states only when it was installed."""
        ...

    def overlaps_host_work_in_pipeline(self, version: str) -> bool:
        """Whether an engine that overlaps host work (`overlaps_host_work`) still does with pipeline stages
        (False: each micro-batch's step pays its per-step overhead and per-sequence host work on top of the
        GPU's time). `version` as above."""
        ...

    def overlaps_host_work_in_prefill_pool(self, version: str) -> bool:
        """Whether an engine that overlaps host work (`overlaps_host_work`) still does on the prefill workers of
        a disaggregated deployment, as its disaggregation recipe launches them (False: each of their steps pays
        its per-step overhead and per-sequence host work on top of the GPU's time). `version` as above."""
        ...

    def graphs_prefill_steps(self, version: str, setup: GraphSetup = DEFAULT_GRAPH_SETUP) -> bool:
        """Whether a step that carries prompt tokens replays CUDA graphs too (False: it launches its kernels from
        the host, and pays `Efficiency.prefill_moe_layer_overhead_s` per MoE layer), at `version` (as above) in
        the deployment `setup`."""
        ...

    def start_refusals(self, max_model_len: int, max_context_tokens: int, kv_tokens: int) -> tuple[str, ...]:
        """Why the engine would refuse to start with this KV cache (empty: it starts)."""
        ...

    def launch_words(self, spec: LaunchSpec) -> list[str] | None:
        """The command line's words, or None where the engine has no command to give."""
        ...

    def launch_notes(self, spec: LaunchSpec) -> list[str]:
        """What the command line cannot say (which checkpoint to serve, ...)."""
        ...

    def disaggregation_words(self, role: str) -> list[str]:
        """Flags that make a worker a disaggregated `role` ("prefill" or "decode") worker."""
        ...

    def disaggregation_notes(self, role: str) -> list[str]:
        """What else a `role` worker needs (configuration files, transport)."""
        ...

    def disaggregation_router(self) -> str:
        """What sends each request to a prefill worker and then to a decode worker."""
        ...

    def kv_transfer_over_nvlink(self, gpu: GpuSpec, as_launched: bool) -> bool:
        """Whether the KV moves over NVLink between a prefill and a decode worker that share one of `gpu`'s
        NVLink domains (False: over the scale-out network's RDMA NICs, even inside one node): with the settings
        this service's launch command adds (`disaggregation_env`) when `as_launched`, else with the engine's
        defaults (a published run that states no such setting)."""
        ...

    def disaggregation_env(self, kv_over_nvlink: bool) -> list[str]:
        """Environment assignments (NAME=value) a disaggregated worker's command starts with, for the KV link the
        plan assumes (`kv_over_nvlink`)."""
        ...

    def layout_problems(self, model: ModelSpec, layout: Layout, weights: WeightRecipe | None = None,
                        speculative: str | None = None) -> list[LayoutProblem]:
        """The engine's own rules a parallel layout breaks, beyond `layout.layout_problems`' generic ones;
        with `weights`, a checkpoint's recipe, also the rules its storage formats put on the split; with
        `speculative` (`SPECULATIVE_KINDS`), those of the speculative decoding it runs beside the model."""
        ...
