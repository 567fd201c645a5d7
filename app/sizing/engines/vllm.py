"""vLLM: memory accounting, scheduler defaults, start-up checks and `vllm serve` flags (ENGINES.md, vLLM).

usable = gpu_memory_utilization × the total CUDA reports (`torch.cuda.mem_get_info`, below nvidia-smi's);
the KV cache gets what is left after the weights, the profile run's activation peak, non-torch memory
(CUDA context, NCCL, cuBLAS workspaces) and, from v0.20, the CUDA-graph estimate. Blocks are allocated on
demand as tokens arrive. Rules that changed between versions (ENGINES.md 1.1):
- `gpu_memory_utilization` default 0.90 before v0.20, 0.92 from v0.20 (config/cache.py);
- CUDA graphs: captured after the KV cache is sized through 0.19 (opt-in estimate in 0.18-0.19 through
  VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS, default 0), subtracted before it from 0.20 (default 1);
- KV dtype 'auto' resolved from a ModelOpt checkpoint's kv_cache_quant_algo from 0.14 (utils/torch_utils.py);
- max_num_seqs and max_num_batched_tokens (`scheduler_defaults`): 256 sequences and whole prompts (chunks
  only above a 32k context) before V1, then tiers by the GPU's name (0.8.0), memory (0.8.5), A100 left out
  (0.9.0) and a >= 160 GiB tier (0.33) (engine/arg_utils.py);
- the V1 engine (0.8+) profile run: a dummy forward of `max_num_batched_tokens` tokens, then a sampler
  dummy run over `max_num_seqs` rows of logits (gpu_model_runner.py profile_run); the peak is the larger,
  which at default settings is the sampler's on every measured run (`activation_peak_bytes`). Before V1
  the 4.76 GiB measurement scaled by batched tokens (`model.activations`) stands in.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.sizing.engines.base import (
    DEFAULT_GRAPH_SETUP,
    DYNAMO_PODS,
    GIB,
    OF_TOTAL,
    ON_DEMAND,
    Default,
    GraphSetup,
    LaunchSpec,
    checkpoint_kv,
    one_byte_kv_note,
    online_fp8,
    parse_version,
)
from app.sizing.hardware.comm import ALL_GATHER
from app.sizing.layout import EXPERT_PARALLEL, Layout, LayoutProblem, split_widths
from app.sizing.model import activations
from app.sizing.model.activations import activation_values_per_token
from app.sizing.model.params import SPLIT_BEFORE_LAST
from app.sizing.model.recipes import FORMATS, WeightRecipe
from app.sizing.specs import GpuSpec, ModelSpec

if TYPE_CHECKING:
    from app.sizing.engines import EngineConfig

VLLM_BLOCK_SIZE = 16
DEFAULT_VERSION = "0.33.0"  # the latest vLLM release the engine reference (ENGINES.md 1.1) covers
UTILIZATION_092_FROM = (0, 20, 0)
CUDA_GRAPHS_CHARGED_FROM = (0, 20, 0)
KV_FROM_CHECKPOINT_FROM = (0, 14, 0)
V1_FROM = (0, 8, 0)
# Scheduler defaults of `vllm serve` by release (ENGINES.md 1.1, each wheel's engine/arg_utils.py).
V0_CHUNKED_ABOVE = 32768  # V0 turns chunked prefill on only for a longer max_model_len
V0_CHUNK_2048_FROM = (0, 7, 0)  # V0's chunked budget: 512 tokens in 0.6.x, 2048 in 0.7.x
LARGE_GPU_TIER_FROM = (0, 8, 5)  # >= 70 GiB: 8192 tokens, 1024 sequences (0.8.0-0.8.4: by the GPU's name)
# 0.8.0's FlashMLA backend forces blocks of 64 on an MLA model (ENGINES.md 1.1 defaults table, 0.8.0 column: "16
# (FlashMLA forces 64)"); the table's 0.8.5 column gives 16 again, with no backend named.
FLASHMLA_BLOCK_SIZE = 64
FLASHMLA_BLOCKS = ((0, 8, 0), (0, 8, 5))  # the releases it applies to: from 0.8.0, before 0.8.5
A100_EXCLUDED_FROM = (0, 9, 0)  # the large tier leaves A100 out
HUGE_GPU_TIER_FROM = (0, 33, 0)  # >= 160 GiB (B200, B300): 16384 tokens

# Measured on vLLM 0.19.0, H100 80GB HBM3: the llm-d planner capacity runs (measured-calibration-2.csv,
# LLMD_CAPACITY_V019) of models NOT in the catalog, so the catalog runs the capacity validation checks
# did not set these. Non-torch: TP1 runs 0.26, 0.25, 0.46, 0.25, 0.24 GiB (median 0.25); TP2/TP4 runs
# 2.21, 2.07, 2.07 GiB (median 2.07: NCCL and custom all-reduce buffers).
NON_TORCH_SINGLE_GPU = round(0.25 * GIB)
NON_TORCH_MULTI_GPU = round(2.07 * GIB)
_NON_TORCH_SOURCE = ("measured, vLLM 0.19 on H100 (llm-d planner runs of models outside the catalog): median "
                     "0.25 GiB on one GPU, 2.07 GiB with 2+ GPUs")
# CUDA-graph memory captured in all 21 of those runs (0.64-1.85 GiB): median 0.87 GiB. vLLM 0.19 does not
# subtract it, so no capacity row checks it; from 0.20 vLLM subtracts its estimate.
CUDA_GRAPH_BYTES = round(0.87 * GIB)
_CUDA_GRAPH_SOURCE = ("median CUDA-graph memory of the vLLM 0.19 llm-d runs on H100 (0.87 GiB; range "
                      "0.64-1.85); subtracted before the KV cache from v0.20")


@dataclass(frozen=True, slots=True)
class SamplerFit:
    """activation = base + max(forward, sampler): sampler = max_num_seqs x vocab x (model dtype bytes +
    float32 bytes per logit), forward = max_num_batched_tokens x live values per token x model dtype bytes.

    `float32_bytes_per_logit` counts the float32 copies the sampler makes of each logit (logits, softmax
    probabilities, sorted copies for top-k/top-p): physical, but fitted rather than read off the code.
    """

    base_bytes: int
    float32_bytes_per_logit: float


# Least squares on the single-GPU runs of catalog models in the vLLM 0.19 llm-d data (gemma-2-27b bf16,
# llama-3.1-8b fp32, qwen2.5-7b bf16, qwen3-8b bf16: one point per model and dtype); the multi-GPU runs
# are held out. `python -m app.validate ... --capacity tests/data/measured-capacity.csv` refits and prints
# it (app.calibration.capacity_runs); a test checks the two agree. 12.2 bytes: about three float32 copies.
ACTIVATION_FIT = SamplerFit(base_bytes=192_255_256, float32_bytes_per_logit=12.213)
_ACTIVATION_SOURCE = ("fitted on vLLM 0.19 H100 runs (single-GPU runs of catalog models; multi-GPU held out): "
                      "0.179 GiB + max(forward of max_num_batched_tokens, sampler over max_num_seqs x vocab logits)")


def activation_peak_bytes(model: ModelSpec, *, max_num_batched_tokens: int, max_num_seqs: int,
                          values_per_token: int, model_dtype_bytes: int, fit: SamplerFit = ACTIVATION_FIT) -> int:
    """vLLM V1's profile-run peak (see `SamplerFit`). The sampler's logits cover the whole vocabulary on
    every TP rank (gathered), so the peak does not shrink with TP (measured: Qwen2.5-7B 2.21 GiB at TP1,
    TP2 and TP4)."""
    forward = max_num_batched_tokens * values_per_token * model_dtype_bytes
    sampler = max_num_seqs * model.vocab_size * (model_dtype_bytes + fit.float32_bytes_per_logit)
    return fit.base_bytes + round(max(forward, sampler))


def scheduler_defaults(gpu: GpuSpec, at: tuple[int, int, int], max_model_len: int) -> tuple[int, int, str]:
    """`vllm serve`'s default max_num_seqs and max_num_batched_tokens at release `at`, and which rule gave them
    (ENGINES.md 1.1 defaults table; each wheel's `engine/arg_utils.py`):
    - before V1 (< 0.8.0): 256 sequences; chunked prefill only when max_model_len > 32768, with a budget of
      512 tokens (2048 from 0.7.0), else one whole prompt per step: max(max_model_len, 2048);
    - 0.8.0-0.8.4: 1024 sequences; 8192 tokens on a GPU whose name contains H100 or H200, else 2048;
    - 0.8.5-0.8.x: 1024 / 8192 on GPUs with >= 70 GiB, else 256 / 2048; from 0.9.0 the same but A100 (80 GB
      too) takes the small tier; from 0.33.0 GPUs with >= 160 GiB (B200, B300) get 16384 tokens."""
    if at < V1_FROM:
        if max_model_len > V0_CHUNKED_ABOVE:
            chunk = 2048 if at >= V0_CHUNK_2048_FROM else 512
            return 256, chunk, f"before V1 with max_model_len > {V0_CHUNKED_ABOVE} (chunked prefill)"
        return 256, max(max_model_len, 2048), "before V1 (no chunked prefill: max(max_model_len, 2048) tokens)"
    name = f"{gpu.name} {gpu.slug}".lower()
    if at < LARGE_GPU_TIER_FROM:
        return 1024, (8192 if "h100" in name or "h200" in name else 2048), "by the GPU's name (H100/H200: 8192)"
    large = gpu.memory_bytes >= 70 * GIB and (at < A100_EXCLUDED_FROM or "a100" not in name)
    if not large:
        return 256, 2048, "on GPUs under 70 GiB" + (" or A100" if at >= A100_EXCLUDED_FROM else "")
    if at >= HUGE_GPU_TIER_FROM and gpu.memory_bytes >= 160 * GIB:
        return 1024, 16384, "on GPUs with >= 160 GiB"
    return 1024, 8192, "on GPUs with >= 70 GiB" + (" other than A100" if at >= A100_EXCLUDED_FROM else "")


class Vllm:
    name = "vllm"
    default_version = DEFAULT_VERSION
    default_version_source = "the latest vLLM release the engine reference covers"
    covered_versions = ("0.6.0", DEFAULT_VERSION)  # ENGINES.md 1.1's tables
    published_checkpoints: tuple[tuple[str, str], ...] = ()
    published_decode_worker_block: int | None = None
    utilization_of = OF_TOTAL
    kv_allocation = ON_DEMAND
    speculative_flags = True
    divides_limits_by_dp = False
    moe_exchange = ALL_GATHER  # `--all2all-backend allgather_reducescatter` by default (ENGINES.md section 2)
    pipeline_split = SPLIT_BEFORE_LAST  # `get_pp_indices` (ENGINES.md section 2)
    # Only the MoE layers see the flattened DP x TP group; every other layer is each DP rank's own (ENGINES.md
    # section 2).
    gpu_vendors = ()  # CUDA and ROCm builds (the reference data's AMD runs are rocm/vllm images), other makers' plugins

    def defaults(self, config: EngineConfig, model: ModelSpec, gpu: GpuSpec, tensor_parallel: int,
                 pipeline_parallel: int, version: str, model_dtype_bytes: int,
                 data_parallel: int = 1) -> dict[str, Default]:
        at = parse_version(version)
        default_seqs, default_batched, which = scheduler_defaults(
            gpu, at, config.max_model_len or model.max_position_embeddings)
        batched = config.max_num_batched_tokens or default_batched
        seqs = config.max_num_seqs or default_seqs
        if at >= V1_FROM:
            activation: Default = (activation_peak_bytes(
                model, max_num_batched_tokens=batched, max_num_seqs=seqs, model_dtype_bytes=model_dtype_bytes,
                values_per_token=activation_values_per_token(model, tensor_parallel)), _ACTIVATION_SOURCE)
        else:
            activation = (activations.activation_peak_bytes(model, batched, tensor_parallel),
                          activations.ACTIVATION_SOURCE)
        utilization: Default = ((0.92, "vLLM default 0.92 from v0.20 (config/cache.py)") if at >= UTILIZATION_092_FROM
                                else (0.90, "vLLM default 0.90 before v0.20"))
        graphs: Default = ((CUDA_GRAPH_BYTES, _CUDA_GRAPH_SOURCE) if at >= CUDA_GRAPHS_CHARGED_FROM else
                           (0, f"vLLM {version} captures CUDA graphs after sizing the KV cache (charged from v0.20)"))
        return {
            "gpu_memory_utilization": utilization,
            "max_num_seqs": (default_seqs, f"vLLM {version} default {which}"),
            "max_num_batched_tokens": (default_batched, f"vLLM {version} server default {which}"),
            "block_size": ((FLASHMLA_BLOCK_SIZE, f"vLLM {version}: FlashMLA forces blocks of 64 tokens on an MLA model")
                           if model.is_mla and FLASHMLA_BLOCKS[0] <= at < FLASHMLA_BLOCKS[1]
                           else (VLLM_BLOCK_SIZE, "vLLM default block of 16 tokens")),
            "activation_bytes_per_gpu": activation,
            "non_torch_bytes_per_gpu": ((NON_TORCH_MULTI_GPU if tensor_parallel * pipeline_parallel * data_parallel
                                         > 1 else NON_TORCH_SINGLE_GPU), _NON_TORCH_SOURCE),
            "cuda_graph_bytes_per_gpu": graphs,
            "reserved_bytes_per_gpu": (0, "none"),
        }

    def kv_dtype(self, version: str, recipe: WeightRecipe | None, model_dtype: str) -> tuple[str, str]:
        return checkpoint_kv("vLLM", version, recipe, model_dtype, since=KV_FROM_CHECKPOINT_FROM)

    def running_limit(self, given: int | None, kv_tokens: int, max_model_len: int) -> int | None:
        return given  # max_num_seqs: given or a fixed default, never derived nor capped

    def mixes_prefill_into_decode(self) -> bool:
        """Yes: the V1 engine (0.8 on) always chunks prompts into steps that carry every running decode.
        The V0 engine before it chunked only when max_model_len exceeded 32,768 (ENGINES.md 1.1) and otherwise
        prefilled whole prompts first; that older schedule is not modelled, every version is scheduled as V1."""
        return True

    def overlaps_host_work(self, version: str) -> bool:
        """The V1 engine (the default from 0.8.0, March 2025) schedules in its own process and prepares the
        next step while the GPU runs; V0 (every release before, so every 2024 install) ran the scheduler,
        the sampler's bookkeeping and detokenization in the step loop, between GPU steps."""
        if version.isdigit():  # only the year of the install is known
            return int(version) > 2024
        return parse_version(version) >= V1_FROM

    def overlaps_host_work_in_pipeline(self, version: str) -> bool:
        return True  # V1 keeps pipeline_parallel batches in flight from its own process (no published run differs)

    def overlaps_host_work_in_prefill_pool(self, version: str) -> bool:
        return True  # a KV-connector prefiller runs the same engine loop (ENGINES.md section 3 sets nothing else)

    def graphs_prefill_steps(self, version: str, setup: GraphSetup = DEFAULT_GRAPH_SETUP) -> bool:
        """The V1 engine captures piecewise CUDA graphs around attention, which mixed and prefill steps
        replay too; V0 replayed graphs for decode-only batches alone.

        Not modelled: V1 captures steps of at most `max_cudagraph_capture_size` tokens, by default
        min(2 x max_num_seqs, max_num_batched_tokens, 512), and runs a larger step without CUDA graphs
        (vLLM 0.12.0 `config/vllm.py`, `v1/cudagraph_dispatcher.py` `dispatch`), as every step with a
        1,024-token prompt is. Charging such steps the cost per MoE layer fitted with the other engines'
        eager prompt steps (one value per GPU family for every engine) was tested on 2026-12-07, each of H100,
        H200, B200 and GB200 predicted by a fit without its rows: vLLM's aggregated MoE TTFT median error on
        B200 fell from 57.5% to 23.4% (H100: 33.1% to 20.4%), but the shared value moved TensorRT-LLM's, and
        the DP+EP TTFT error rose from 30.5% to 36.2%, its TPOT error from 10.4% to 12.2%. Charging vLLM half
        the value the other engines' rows fitted, and fitting it on theirs alone, brought the four GPUs' TTFT
        median error (TP only) from 37.8% to 33.7% and every row's from 18.5% to 17.8% (DP+EP: TTFT 30.5% to
        30.4%, TPOT 10.4% to 10.8%). A cost of vLLM's own per MoE layer, charged on prompt steps of more than 512
        tokens and refitted on vLLM's MoE rows after each entry's search (no other engine's prediction moving), then
        went through a whole refit and its three hold-outs: leaving one GPU out, TTFT 37.8% to 34.8% and every row
        22.8% to 22.3%; leaving one model family out, TTFT 35.7% to 38.3% (p90 96% to 172%) and every row 17.6% to
        17.8%, gpt-oss held out going from 26.1% to 32.9% (x0.90 to x1.23, p90 61% to 226%): its vLLM prompt steps
        cost far less per MoE layer than those of the other families' vLLM rows (Qwen3-235B's above all) that then fit
        the cost. A cost per MoE layer does not carry across model families, so none is charged; what does is still
        to be found."""
        return self.overlaps_host_work(version)  # both follow the engine generation (V1 from 0.8.0)

    def start_refusals(self, max_model_len: int, max_context_tokens: int, kv_tokens: int) -> tuple[str, ...]:
        if max_context_tokens < max_model_len:
            return ((f"vLLM refuses to start: max_model_len {max_model_len} needs more KV cache than the "
                    f"{kv_tokens} tokens that fit; lower max_model_len to {max_context_tokens} or add GPUs"),)
        return ()

    def launch_words(self, spec: LaunchSpec) -> list[str] | None:
        words = ["vllm", "serve", spec.model_id, "--tensor-parallel-size", str(spec.tensor_parallel)]
        if spec.pipeline_parallel > 1:
            words += ["--pipeline-parallel-size", str(spec.pipeline_parallel)]
        if spec.data_parallel > 1:
            words += ["--data-parallel-size", str(spec.data_parallel)]
        if spec.expert_parallel > 1:  # ep = dp x tp: `layout_problems` allows nothing else
            words += ["--enable-expert-parallel"]
        if spec.max_num_seqs is not None:
            words += ["--max-num-seqs", str(spec.max_num_seqs)]
        words += ["--max-num-batched-tokens", str(spec.max_num_batched_tokens),
                  "--max-model-len", str(spec.max_model_len),
                  "--gpu-memory-utilization", f"{spec.gpu_memory_utilization:g}"]
        if spec.kv_dtype in ("fp8", "int8"):  # int8: one byte a value, as fp8 (`one_byte_kv_note`)
            words += ["--kv-cache-dtype", "fp8"]
        if online_fp8(spec):
            words += ["--quantization", "fp8"]
        if spec.draft_tokens is not None:
            config: dict[str, object] = (
                {"model": spec.draft_model_id, "num_speculative_tokens": spec.draft_tokens}
                if spec.draft_model_id is not None else
                {"method": "ngram", "num_speculative_tokens": spec.draft_tokens, "prompt_lookup_max": 4})
            words += ["--speculative-config", json.dumps(config, separators=(",", ":"))]
        return words

    def launch_notes(self, spec: LaunchSpec) -> list[str]:
        return one_byte_kv_note(spec, "vLLM")

    def disaggregation_words(self, role: str) -> list[str]:
        # NixlConnector ignores kv_producer/kv_consumer: the proxy assigns the roles (ENGINES.md section 3).
        return ["--kv-transfer-config", json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"},
                                                   separators=(",", ":"))]

    def disaggregation_notes(self, role: str) -> list[str]:
        return [(f"{role} worker: the KV moves over NIXL (UCX; set UCX_TLS/UCX_NET_DEVICES for RDMA); "
                "VLLM_NIXL_SIDE_CHANNEL_HOST/PORT must be reachable from the other pool")]

    def kv_transfer_over_nvlink(self, gpu: GpuSpec, as_launched: bool) -> bool:
        return True  # NIXL over UCX (ENGINES.md section 3), which picks its transports: nothing keeps it off NVLink

    def disaggregation_env(self, kv_over_nvlink: bool) -> list[str]:
        return []

    def disaggregation_router(self) -> str:
        return ("vLLM's NIXL proxy (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py --prefiller-hosts "
                f"PREFILL_HOSTS --decoder-hosts DECODE_HOSTS), or llm-d / {DYNAMO_PODS}")

    def layout_problems(self, model: ModelSpec, layout: Layout, weights: WeightRecipe | None = None,
                        speculative: str | None = None) -> list[LayoutProblem]:
        """`--enable-expert-parallel` is all or nothing: ep = DP·TP and each rank owns whole experts;
        without it experts are TP-sharded over all DP·TP ranks (vLLM 0.13.0 `FusedMoEParallelConfig.make`).
        `E mod ep` need not be 0: the first ranks take one more expert (`determine_expert_map`). A checkpoint
        whose `weights` store a group in square blocks (FP8 128x128) loads only where each rank's share of
        every split width is whole blocks (`_block_problems`)."""
        ep = layout.expert_parallel
        if ep not in (1, layout.moe_group):
            return [LayoutProblem(EXPERT_PARALLEL, f"vLLM's --enable-expert-parallel sets expert_parallel = "
                                  f"data_parallel x tensor_parallel = {layout.moe_group}; {ep} is not possible")]
        return _block_problems(model, layout, weights) if weights is not None else []


def _block_problems(model: ModelSpec, layout: Layout, weights: WeightRecipe) -> list[LayoutProblem]:
    """Each rank's share of a width stored in square blocks must be whole blocks: "FP8-block weights need
    per-rank dims divisible by 128" (ENGINES.md section 2, vLLM rules: 0.19.0 `fp8_utils.py`
    `validate_fp8_block_shape`), for each width the layout splits over more than one rank (`split_widths`;
    one that does not split evenly is the generic rules' to report). So Qwen3-235B-A22B in FP8 blocks (expert
    width 1,536) loads at TP4 (384 per rank) but not at TP8 (192)."""
    problems = []
    for split in split_widths(model, layout):
        tile, share = FORMATS[weights.format_of(split.group)].tile, split.width // split.ranks
        if tile and split.ranks > 1 and split.width % split.ranks == 0 and share % tile:
            problems.append(LayoutProblem(split.field, (
                f"{split.name} {split.width:,} over {split.ranks} ranks is {share:,} per rank, not whole "
                f"{tile}x{tile} blocks of weight_recipe {weights.name} ({weights.format_of(split.group)} "
                f"{split.group}): vLLM loads a block format only in whole blocks per rank")))
    return problems


ENGINE = Vllm()
