"""TensorRT-LLM: memory accounting, scheduler defaults and `trtllm-serve` flags (ENGINES.md, TensorRT-LLM).

The KV cache gets 0.9 (`free_gpu_memory_fraction`) of the memory FREE after the weights, the profiled
activation peak and the non-torch memory: kv = 0.9 × (total − weights − activation − overhead). CUDA
graphs are captured after the KV cache, inside the 10% left free. The scheduler reserves each request's
input + full output at admission (no eviction).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.sizing.engines.base import (
    DEFAULT_GRAPH_SETUP,
    DYNAMO_PODS,
    OF_FREE,
    PREFILL_ROLE,
    RESERVE_AT_ADMISSION,
    Default,
    GraphSetup,
    LaunchSpec,
    model_dtype_kv,
    non_torch_default,
    parse_version,
)
from app.sizing.hardware.comm import PER_EXPERT
from app.sizing.layout import EXPERT_PARALLEL, TENSOR_PARALLEL, Layout, LayoutProblem
from app.sizing.model.activations import ACTIVATION_SOURCE, activation_peak_bytes
from app.sizing.model.params import SPLIT_FIRST
from app.sizing.model.recipes import WeightRecipe
from app.sizing.specs import GpuSpec, ModelSpec

if TYPE_CHECKING:
    from app.sizing.engines import EngineConfig

TRTLLM_FREE_GPU_MEMORY_FRACTION = 0.9
PYTORCH_BACKEND_FROM = (1, 0, 0)  # the PyTorch backend is the default from 1.0
# TensorRT-LLM LLM-API build defaults: max_batch_size 2048, max_num_tokens 8192, tokens_per_block 32.
TRTLLM_MAX_BATCH_SIZE = 2048
TRTLLM_MAX_NUM_TOKENS = 8192
TRTLLM_MAX_INPUT_LEN = 1024  # the LLM-API default max_input_len (ENGINES.md 1.3, TRT@0004396 BaseLlmArgs)
TRTLLM_BLOCK_SIZE = 32
# The YAML of LLM-API options a launch passes (`--extra_llm_api_options`): what trtllm-serve has no flag for.
LLM_API_OPTIONS_FILE = "extra_llm_api_options.yaml"
_FRACTION_SOURCE = ("TensorRT-LLM default free_gpu_memory_fraction 0.9 of the memory free after "
                    "weights and the profiled peak")


class Trtllm:
    name = "trtllm"
    default_version = "1.0.0"
    # ENGINES.md 1.3 describes the PyTorch backend at a 2026 commit of main, naming no release: the first release
    # whose default that backend is (PYTORCH_BACKEND_FROM).
    default_version_source = ("the first TensorRT-LLM release whose default is the PyTorch backend, which the engine "
                              "reference describes (at a commit, naming no release)")
    covered_versions = ("", "")
    # NVIDIA's published fp8/fp4 TensorRT-LLM runs serve its ModelOpt checkpoints (perf-overview.md).
    published_checkpoints = (("fp8", "modelopt_fp8"), ("fp4", "modelopt_nvfp4"))
    # aiconfigurator 0.12.0 `generator/rule_plugin/benchmark/trtllm.rule`: "decode max_num_tokens = ((max_batch_size
    # + tokens_per_block - 1) // tokens_per_block) * tokens_per_block", tokens_per_block 32 (its default) unless the
    # run sets one.
    published_decode_worker_block: int | None = TRTLLM_BLOCK_SIZE
    utilization_of = OF_FREE
    kv_allocation = RESERVE_AT_ADMISSION
    speculative_flags = False
    divides_limits_by_dp = False
    # ENGINES.md states no default MoE exchange for it under DP + EP: each token goes to its experts, as DeepEP
    # sends them (with top-8 routing at dp = ep, the same bytes as an all-gather).
    moe_exchange = PER_EXPERT
    # TensorRT-LLM builds on CUDA and TensorRT: NVIDIA GPUs only (NVIDIA/TensorRT-LLM README).
    gpu_vendors = ("NVIDIA",)
    pipeline_split = SPLIT_FIRST  # `mapping.py` splits the layers with `tensor_split`: the first ranks get one more

    def defaults(self, config: EngineConfig, model: ModelSpec, gpu: GpuSpec, tensor_parallel: int,
                 pipeline_parallel: int, version: str, model_dtype_bytes: int,
                 data_parallel: int = 1) -> dict[str, Default]:
        batched = config.max_num_batched_tokens or TRTLLM_MAX_NUM_TOKENS
        return {
            "gpu_memory_utilization": (TRTLLM_FREE_GPU_MEMORY_FRACTION, _FRACTION_SOURCE),
            "max_num_seqs": (TRTLLM_MAX_BATCH_SIZE, "TensorRT-LLM default max_batch_size 2048"),
            "max_num_batched_tokens": (batched, "TensorRT-LLM default max_num_tokens 8192"),
            "block_size": (TRTLLM_BLOCK_SIZE, "TensorRT-LLM default tokens_per_block 32"),
            "activation_bytes_per_gpu": (activation_peak_bytes(model, batched, tensor_parallel),
                                         ACTIVATION_SOURCE),
            "non_torch_bytes_per_gpu": non_torch_default(tensor_parallel * pipeline_parallel * data_parallel),
            "cuda_graph_bytes_per_gpu": (0, "captured after the KV cache, inside the 10% left free"),
            "reserved_bytes_per_gpu": (0, "none"),
        }

    def kv_dtype(self, version: str, recipe: WeightRecipe | None, model_dtype: str) -> tuple[str, str]:
        """kv_cache_config.dtype 'auto' keeps the checkpoint's kv_cache_quant_algo (TRT@0004396
        llm_args.py): a ModelOpt FP8/NVFP4 export with FP8 KV caches in fp8."""
        if recipe is None or recipe.checkpoint_kv_dtype is None:
            return model_dtype_kv(model_dtype)
        return recipe.checkpoint_kv_dtype, (f"the {recipe.name} checkpoint declares an {recipe.checkpoint_kv_dtype} "
                                            "KV cache; TensorRT-LLM's kv_cache_config.dtype 'auto' keeps it")

    def running_limit(self, given: int | None, kv_tokens: int, max_model_len: int) -> int | None:
        return given  # max_batch_size: given or a fixed default, never derived nor capped

    def mixes_prefill_into_decode(self) -> bool:
        return True

    def overlaps_host_work(self, version: str) -> bool:
        return True  # the executor prepares the next step while the GPU runs this one (the overlap scheduler)

    def overlaps_host_work_in_pipeline(self, version: str) -> bool:
        """No on the PyTorch backend (the default from 1.0): with pipeline stages its executor runs a loop of
        its own (`PyExecutor._executor_loop_pp`, tensorrt_llm/_torch/pyexecutor/py_executor.py) instead of the
        overlap loop, which it selects only for one stage. The published runs bear it out: TensorRT-LLM 1.0 on
        RTX PRO 6000 gains 3.6x from PP1 to PP8 at 128 in / 128 out, where a hidden per-step overhead would
        give about 6x, and 8.1x at 20,000 in / 2,000 out, whose long steps hide the overhead either way
        (TRTLLM_PERF_V10). The TensorRT engines before 1.0 ran in the C++ executor: as without stages."""
        return not _pytorch_backend(version)

    def overlaps_host_work_in_prefill_pool(self, version: str) -> bool:
        """No: its disaggregation recipe starts the context servers with `disable_overlap_scheduler: True`
        (ENGINES.md section 3; NVIDIA/TensorRT-LLM `examples/disaggregated/README.md` @c3c3d76e), the launch
        this service prints for them (`disaggregation_notes`)."""
        return False

    def graphs_prefill_steps(self, version: str, setup: GraphSetup = DEFAULT_GRAPH_SETUP) -> bool:
        """The PyTorch backend (the default from 1.0) replays CUDA graphs for generation-only batches and runs
        a batch with context requests eagerly; the TensorRT engines before it ran every step as one
        compiled engine (no per-layer host work)."""
        return not _pytorch_backend(version)

    def start_refusals(self, max_model_len: int, max_context_tokens: int, kv_tokens: int) -> tuple[str, ...]:
        return ()

    def launch_words(self, spec: LaunchSpec) -> list[str] | None:
        # TensorRT-LLM's tp_size spans the attention data-parallel ranks (world = tp·pp); attention DP itself
        # is an LLM-API option (`launch_notes`).
        words = ["trtllm-serve", spec.model_id, "--tp_size", str(spec.tensor_parallel * spec.data_parallel),
                 "--pp_size", str(spec.pipeline_parallel)]
        if spec.expert_parallel > 1:
            words += ["--ep_size", str(spec.expert_parallel)]
        if spec.max_num_seqs is not None:
            words += ["--max_batch_size", str(spec.max_num_seqs)]
        words += ["--max_num_tokens", str(spec.max_num_batched_tokens),
                  "--max_seq_len", str(spec.max_model_len),
                  "--kv_cache_free_gpu_memory_fraction", f"{spec.gpu_memory_utilization:g}",
                  "--extra_llm_api_options", LLM_API_OPTIONS_FILE]
        return words

    def launch_notes(self, spec: LaunchSpec) -> list[str]:
        """What the options file must hold (the LLM-API options that have no trtllm-serve flag), and which
        checkpoint to serve. The plan's simulation splits a prompt over steps whenever it does not fit the
        step's max_num_tokens beside the running decodes; TensorRT-LLM does so only with
        `enable_chunked_prefill: true` (its LLM-API default is false, ENGINES.md 1.3), so the file sets it."""
        options, why = ["enable_chunked_prefill: true"], ["chunked prefill, as simulated: its default is false"]
        if spec.data_parallel > 1:
            options += ["enable_attention_dp: true", f"moe_expert_parallel_size: {spec.expert_parallel}"]
        if spec.kv_dtype == "fp8":  # `auto` keeps the checkpoint's KV dtype; fp8 overrides it (ENGINES.md 1.3)
            options.append("kv_cache_config: {dtype: fp8}")
            why.append("the fp8 KV cache planned, whatever the checkpoint declares")
        if spec.max_model_len > TRTLLM_MAX_INPUT_LEN:  # a prompt may be as long as the context, less one token
            options.append(f"max_input_len: {spec.max_model_len}")
            why.append(f"prompts past its default max_input_len of {TRTLLM_MAX_INPUT_LEN} tokens")
        notes = [f"{LLM_API_OPTIONS_FILE} holds {', '.join(options)} ({'; '.join(why)})"]
        if spec.weight_dtype == "fp8" and spec.model_dtype != "fp8":
            notes.append("TensorRT-LLM takes fp8 weights from a checkpoint quantized with NVIDIA ModelOpt")
        if spec.weight_dtype != spec.model_dtype and spec.weight_dtype in ("fp8", "fp4") and spec.kv_dtype != "fp8":
            notes.append(f"the plan caches {spec.kv_dtype} KV: serve a checkpoint exported without an FP8 KV cache "
                         "(kv_cache_quant_algo null), as kv_cache_config's dtype auto keeps a checkpoint's FP8 one")
        if spec.kv_dtype == "int8":
            notes.append("int8 KV cache: TensorRT-LLM takes it from a checkpoint quantized with it (kv_cache_config's "
                         "dtype overrides are fp8, fp8_ds_mla and nvfp4)")
        return notes

    def disaggregation_words(self, role: str) -> list[str]:
        return []  # a worker's role is in its options file and the router's configuration

    def disaggregation_notes(self, role: str) -> list[str]:
        options = "cache_transceiver_config: {backend: DEFAULT}"
        if role == PREFILL_ROLE:  # the context servers of the disaggregation recipe
            options += ", disable_overlap_scheduler: true"
        return [(f"{LLM_API_OPTIONS_FILE} also holds {options} (DEFAULT: NIXL unless TRTLLM_USE_*_KVCACHE "
                 "selects another)")]

    def kv_transfer_over_nvlink(self, gpu: GpuSpec, as_launched: bool) -> bool:
        return True  # its DEFAULT cache transceiver is NIXL over UCX, as vLLM's (ENGINES.md section 3)

    def disaggregation_env(self, kv_over_nvlink: bool) -> list[str]:
        return []

    def disaggregation_router(self) -> str:
        return ("trtllm-serve disaggregated -c disagg_config.yaml (context_servers and generation_servers URLs), "
                f"or {DYNAMO_PODS}")

    def layout_problems(self, model: ModelSpec, layout: Layout, weights: WeightRecipe | None = None,
                        speculative: str | None = None) -> list[LayoutProblem]:
        """Each EP rank takes `num_experts // moe_ep` contiguous experts (`mapping.py` @05ebebb2), so ep must
        divide the experts. `enable_attention_dp` makes every GPU of `tp_size` its own attention rank, holding
        all the KV heads of its own requests (the KV per token is sized with tp_size 1, ENGINES.md section 2):
        attention data parallelism comes with tensor_parallel 1, never with attention split over GPUs."""
        problems = []
        ep = layout.expert_parallel
        if model.is_moe and ep > 1 and model.num_experts % ep:
            problems.append(LayoutProblem(EXPERT_PARALLEL, f"expert_parallel {ep} must divide the "
                                          f"{model.num_experts} routed experts (TensorRT-LLM gives each rank E // ep)"))
        if layout.data_parallel > 1 and layout.tensor_parallel > 1:
            problems.append(LayoutProblem(TENSOR_PARALLEL, (
                f"TensorRT-LLM's attention data parallelism gives every GPU its own attention rank: data_parallel "
                f"{layout.data_parallel} needs tensor_parallel 1, not {layout.tensor_parallel} (data_parallel "
                f"{layout.data_parallel * layout.tensor_parallel} with tensor_parallel 1 is the layout "
                f"--tp_size {layout.data_parallel * layout.tensor_parallel} with enable_attention_dp runs)")))
        return problems


def _pytorch_backend(version: str) -> bool:
    """Whether `version` runs the PyTorch backend (from 1.0; a year: from 2025)."""
    if version.isdigit():  # only the year of the install is known: 1.0 came in 2025
        return int(version) >= 2025
    return parse_version(version) >= PYTORCH_BACKEND_FROM


ENGINE = Trtllm()
