"""Capacity: how many concurrent requests fit on a deployment, and how fast they go (SIZING.md section 7).

Capacity is decided by the serving engine's memory accounting, so each engine's rule is modelled by
name. Per GPU, every engine leaves the KV cache

    kv_budget = usable − weights − activation − overhead        (overhead = non-torch + CUDA graphs + reserve)

and differs in what `usable` is and which parts it subtracts by default:

- `vllm`: usable = gpu_memory_utilization (0.92 since v0.11, 0.90 before) × TOTAL memory; activation =
  peak of a dummy forward of `max_num_batched_tokens` tokens; non-torch memory (CUDA context, NCCL,
  cuBLAS workspaces); the CUDA-graph estimate that vLLM >= 0.11 subtracts before sizing the KV cache.
- `sglang`: usable = mem_fraction_static × total, which holds weights + KV pool only; activations,
  CUDA graphs and the context live in the (1 − fraction) that SGLang's own default rule sets aside, so
  they default to 0 here. The default fraction reproduces SGLang 0.5's
  `ServerArgs._handle_gpu_memory_settings` (see `sglang_mem_fraction_static`).
- `trtllm`: the KV cache gets 0.9 (`free_gpu_memory_fraction`) of the memory FREE after weights, the
  profiled activation peak and the non-torch memory: kv = 0.9 × (total − weights − activation − overhead).
- `generic`: usable = gpu_memory_utilization (default 0.9) × total, minus `reserved_bytes_per_gpu`
  (default 0); nothing else unless given.

KV capacity is counted in blocks, as paged engines allocate it: one block holds `block_size` tokens in
every layer. Models whose layers all attend the full context (and MLA models, whose one latent per token
is the same on every TP rank) get exactly `blocks = kv_budget // (block_size × KV bytes per token per
GPU)`. Models mixing sliding-window and global layers are counted as vLLM's hybrid allocator counts them:
one shared pool, each layer group taking its own blocks and window groups only the blocks their window
spans; the pool's size is reported in full-attention-equivalent blocks (a block of tokens in every
layer, vLLM's "GPU KV cache size" for hybrid models), and every concurrency figure charges each request
what its layers really hold (`kv.kv_cache_bytes_for_batch`, which also picks the most loaded pipeline
stage).

Three concurrency views, each capped by `max_num_seqs`, with the binding limit named:
- worst case: every request holds `max_model_len` tokens (what vLLM logs at start-up);
- admission: every request holds input + output (what a no-evict scheduler, TensorRT-LLM's default,
  reserves at admission);
- steady state: every request holds its time-averaged live tokens, input + the output generated so far,
  rounded up to blocks (what on-demand paged allocation, vLLM's and SGLang's, sustains).
The engine runs at its own view (vLLM, SGLang: steady state; TensorRT-LLM, generic: admission), and the
decode operating point is evaluated there with the step-time model (`perf.py`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from fractions import Fraction
from functools import lru_cache
from typing import Any

import numpy as np

from app.sizing.efficiency import Efficiency
from app.sizing.kv import kv_bytes_per_token_per_layer, kv_cache_bytes_for_batch, kv_cache_size
from app.sizing.params import ceil_div, pipeline_stages
from app.sizing.perf import build_step_time_model
from app.sizing.roofline import default_compute_dtype
from app.sizing.specs import KV_DTYPES, WEIGHT_DTYPES, GpuSpec, ModelSpec, bits_per_value
from app.sizing.weights import weight_bytes, weight_bytes_per_gpu

GIB = 1 << 30
MIB = 1 << 20

VLLM = "vllm"
SGLANG = "sglang"
TRTLLM = "trtllm"
GENERIC = "generic"
ENGINES = (VLLM, SGLANG, TRTLLM, GENERIC)

# What `gpu_memory_utilization` is a fraction of.
OF_TOTAL = "total_memory"
OF_FREE = "free_memory_after_weights_and_activations"

# How an engine holds a running request's KV, i.e. which concurrency view it runs at.
ON_DEMAND = "on_demand"  # blocks allocated as tokens arrive (vLLM, SGLang): steady state
RESERVE_AT_ADMISSION = "reserve_at_admission"  # input + full output reserved up front: admission

LIMIT_KV_CACHE = "kv_cache"
LIMIT_MAX_NUM_SEQS = "max_num_seqs"

STEADY_STATE = "steady_state"
ADMISSION = "admission"

# Measured on H100 80 GB, vLLM, Llama-3.1-8B bf16, TP1, max_num_batched_tokens 8192 (SIZING.md s7):
# weights 14.99 GiB, activation peak 4.76 GiB, non-torch 0.13 GiB, CUDA graphs 0.45 GiB.
ACTIVATION_ANCHOR_BYTES = round(4.76 * GIB)  # 5,111,011,082
ACTIVATION_ANCHOR_TOKENS = 8192
# `activation_values_per_token` of Llama-3.1-8B at TP1: 2·4096 + (2·32 + 2·8)·128 + 3·14336.
ACTIVATION_ANCHOR_VALUES = 61_440
NON_TORCH_BYTES_SINGLE_GPU = round(0.13 * GIB)  # measured at TP1 (0.13-0.15 GiB)
# With 2+ GPUs NCCL adds its buffers: 0.55-0.6 GiB measured; the upper end, to stay on the safe side.
NON_TORCH_BYTES_MULTI_GPU = round(0.6 * GIB)
VLLM_CUDA_GRAPH_BYTES = round(0.45 * GIB)  # the measured example's estimate; vLLM >= 0.11 subtracts it

VLLM_GPU_MEMORY_UTILIZATION = 0.92
GENERIC_GPU_MEMORY_UTILIZATION = 0.9
TRTLLM_FREE_GPU_MEMORY_FRACTION = 0.9
# TensorRT-LLM LLM-API build defaults: max_batch_size 2048, max_num_tokens 8192, tokens_per_block 32.
TRTLLM_MAX_BATCH_SIZE = 2048
TRTLLM_MAX_NUM_TOKENS = 8192
TRTLLM_BLOCK_SIZE = 32
VLLM_BLOCK_SIZE = 16
GENERIC_BLOCK_SIZE = 16
GENERIC_MAX_NUM_BATCHED_TOKENS = 8192
SGLANG_PAGE_SIZE = 1  # SGLang's default page_size: the radix cache allocates token by token

# Prefill chunks timed one by one; a longer prompt is timed from an even sample of its chunks.
MAX_PREFILL_CHUNKS_TIMED = 256

# Cheaper weight precisions tried, in order, when the requested one does not fit.
CHEAPER_WEIGHT_DTYPES = ("fp8", "int4")


# Engine configuration --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class EngineConfig:
    """What the caller set; None = the engine's default (filled in by `resolve_engine`)."""

    engine: str = VLLM
    gpu_memory_utilization: float | None = None
    reserved_bytes_per_gpu: int | None = None
    activation_bytes_per_gpu: int | None = None
    non_torch_bytes_per_gpu: int | None = None
    cuda_graph_bytes_per_gpu: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    block_size: int | None = None
    max_model_len: int | None = None

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"unknown engine {self.engine!r}; expected one of {list(ENGINES)}")
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        for name in ("reserved_bytes_per_gpu", "activation_bytes_per_gpu", "non_torch_bytes_per_gpu",
                     "cuda_graph_bytes_per_gpu"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0")
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "max_model_len"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1")


@dataclass(frozen=True, slots=True)
class ResolvedEngine:
    """Every setting the accounting uses, with where each value came from (`sources`)."""

    engine: str
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


def activation_values_per_token(model: ModelSpec, tensor_parallel: int = 1) -> int:
    """16-bit values one token keeps live inside one decoder layer's forward, on one GPU.

    - residual stream and its normalized copy: 2·h (replicated under TP);
    - attention: Q, K, V projections and the attention output, (2·⌈H/tp⌉ + 2·⌈Hkv/tp⌉)·d; MLA: q
      (⌈H/tp⌉·(d_nope+d_rope)), the replicated latent (kv_lora + d_rope), the up-projected k_nope and v
      (⌈H/tp⌉·(d_nope+d_v)) and the output (⌈H/tp⌉·d_v);
    - dense MLP: gate+up output and the activated product, 3·⌈F/tp⌉;
    - MoE layer (vLLM's fused-MoE intermediate caches): per routed expert chosen, 3·⌈F_e/tp⌉ + h (the
      down projection's output is kept per expert before the weighted sum), i.e. k·(3·⌈F_e/tp⌉ + h),
      plus the shared experts 3·⌈S·F_s/tp⌉ and the router logits E.
    The largest layer kind counts (layers run one after another and free their buffers).
    """
    if tensor_parallel < 1:
        raise ValueError("tensor_parallel must be >= 1")
    tp, h = tensor_parallel, model.hidden_size
    heads = ceil_div(model.num_attention_heads, tp)
    if model.is_mla:
        assert model.kv_lora_rank is not None and model.qk_rope_head_dim is not None
        assert model.qk_nope_head_dim is not None and model.v_head_dim is not None
        attention = (heads * (model.qk_nope_head_dim + model.qk_rope_head_dim)
                     + model.kv_lora_rank + model.qk_rope_head_dim
                     + heads * (model.qk_nope_head_dim + model.v_head_dim) + heads * model.v_head_dim)
    else:
        attention = (2 * heads + 2 * ceil_div(model.num_key_value_heads, tp)) * model.resolved_head_dim
    mlp_widths = []
    if len(model.moe_layer_indices) < model.num_hidden_layers:
        mlp_widths.append(3 * ceil_div(model.dense_intermediate_size, tp))
    if model.is_moe:
        shared_width = model.shared_expert_intermediate_size or model.expert_intermediate_size
        mlp_widths.append(model.num_experts_per_tok * (3 * ceil_div(model.expert_intermediate_size, tp) + h)
                          + 3 * ceil_div(model.n_shared_experts * shared_width, tp) + model.num_experts)
    return 2 * h + attention + max(mlp_widths)


def activation_peak_bytes(model: ModelSpec, batched_tokens: int, tensor_parallel: int = 1) -> int:
    """Estimated activation peak of a forward over `batched_tokens` tokens on one GPU (vLLM's profile run).

    The measured point (4.76 GiB for Llama-3.1-8B at 8192 tokens, TP1, H100) scaled linearly in the
    batched tokens and in `activation_values_per_token`, so it grows with the hidden and intermediate
    widths and with the experts a token visits, and shrinks where TP shards. Scaling the measured peak
    rather than summing buffers keeps what the measurement holds that no formula sees (allocator
    fragmentation, the sampler's dummy run, torch.compile scratch). It puts Mixtral-8x7B at TP1 near
    8.7 GiB, in line with the ~8 GiB measured for MoE models.
    """
    if batched_tokens < 1:
        raise ValueError("batched_tokens must be >= 1")
    values = activation_values_per_token(model, tensor_parallel)
    return ACTIVATION_ANCHOR_BYTES * batched_tokens * values // (ACTIVATION_ANCHOR_TOKENS
                                                                 * ACTIVATION_ANCHOR_VALUES)


def sglang_mem_fraction_static(gpu_memory_bytes: int, tensor_parallel: int, pipeline_parallel: int,
                               chunked_prefill_size: int | None) -> tuple[float, int, int]:
    """SGLang's default mem_fraction_static, with the chunked_prefill_size and cuda_graph_max_bs it implies.

    SGLang 0.5 (`ServerArgs._handle_gpu_memory_settings`), with GPU memory in MiB as the driver reports it:
    buckets by memory pick chunked_prefill_size and cuda_graph_max_bs (< 20 GiB: 2048 / 8; < 35: 2048 /
    16, 80 at tp >= 4; < 60: 4096 / 32, 160; < 90: 8192 / 256, 512; < 160: 8192 / 256, 512; else 16384 /
    512), then reserved = 512 + 1.5·max(chunked_prefill_size, 2048) + 2·cuda_graph_max_bs
    + tp·pp/8·1024 MiB, at least 10 GiB on GPUs over 60 GiB, and fraction = round((mem − reserved)/mem, 3).
    H100 (81,559 MiB) at TP1: reserved 13,440 MiB, fraction 0.835; H200 (143,771 MiB): 0.907.
    """
    memory_mib = gpu_memory_bytes / MIB
    small_tp = tensor_parallel < 4
    buckets = (  # (memory below, MiB; chunked_prefill_size; cuda_graph_max_bs at tp < 4; at tp >= 4)
        (20 * 1024, 2048, 8, 8),
        (35 * 1024, 2048, 16, 80),
        (60 * 1024, 4096, 32, 160),
        (90 * 1024, 8192, 256, 512),
        (160 * 1024, 8192, 256, 512),
        (float("inf"), 16384, 512, 512),
    )
    for limit, default_chunk, graph_bs_small_tp, graph_bs_large_tp in buckets:
        if memory_mib < limit:
            break
    chunk = chunked_prefill_size if chunked_prefill_size is not None else default_chunk
    graph_bs = graph_bs_small_tp if small_tp else graph_bs_large_tp
    reserved_mib = (512 + 1.5 * max(chunk, 2048) + 2 * graph_bs
                    + tensor_parallel * pipeline_parallel / 8 * 1024)
    if memory_mib > 60 * 1024:
        reserved_mib = max(reserved_mib, 10 * 1024)
    return round((memory_mib - reserved_mib) / memory_mib, 3), chunk, graph_bs


def sglang_max_running_requests(kv_tokens: int, context_len: int) -> int:
    """SGLang's default max_running_requests: min(pool tokens // 2, request-pool size), the request
    pool holding min(max(⌊tokens / context_len · 512⌋, 2048), 4096) slots (SGLang 0.5 tp_worker and
    model_runner)."""
    pool_slots = min(max(int(kv_tokens / context_len * 512), 2048), 4096)
    return max(1, min(kv_tokens // 2, pool_slots))


_Default = tuple[int | float | None, str]  # (value, where it comes from)

_VLLM_CUDA_GRAPH_SOURCE = ("0.45 GiB measured (Llama-3.1-8B, H100); vLLM >= 0.11 subtracts its CUDA-graph "
                           "estimate before sizing the KV cache")
_SGLANG_FRACTION_SOURCE = "SGLang 0.5 default mem_fraction_static for this GPU size and TP x PP"
_SGLANG_MAX_RUNNING_SOURCE = ("SGLang default max_running_requests: min(KV tokens // 2, request pool of "
                              "clamp(KV tokens / context_len x 512, 2048, 4096))")
_TRTLLM_FRACTION_SOURCE = ("TensorRT-LLM default free_gpu_memory_fraction 0.9 of the memory free after "
                           "weights and the profiled peak")
_ACTIVATION_SOURCE = ("estimate: 4.76 GiB measured (vLLM, Llama-3.1-8B, 8192 batched tokens, TP1, H100) "
                      "scaled by batched tokens and per-token activation width")


def _non_torch_default(gpus: int) -> _Default:
    if gpus > 1:
        return NON_TORCH_BYTES_MULTI_GPU, ("measured on H100: 0.55-0.6 GiB with 2+ GPUs (NCCL buffers), "
                                          "upper end")
    return NON_TORCH_BYTES_SINGLE_GPU, "measured on H100: 0.13 GiB on one GPU (CUDA context, cuBLAS)"


def _engine_defaults(config: EngineConfig, model: ModelSpec, gpu: GpuSpec, tp: int,
                     pp: int) -> dict[str, _Default]:
    """Each engine's default for every setting, and its source."""
    none = (0, "none")
    if config.engine == VLLM:
        large_gpu = gpu.memory_bytes >= 70 * GIB and "a100" not in f"{gpu.name} {gpu.slug}".lower()
        which = "on GPUs with >= 70 GiB other than A100" if large_gpu else "on GPUs under 70 GiB or A100"
        batched = config.max_num_batched_tokens or (8192 if large_gpu else 2048)
        return {
            "gpu_memory_utilization": (VLLM_GPU_MEMORY_UTILIZATION,
                                       "vLLM default 0.92 (v0.11 and later; 0.90 before)"),
            "max_num_seqs": (1024 if large_gpu else 256, f"vLLM default {which}"),
            "max_num_batched_tokens": (batched, f"vLLM server default {which}"),
            "block_size": (VLLM_BLOCK_SIZE, "vLLM default block of 16 tokens"),
            "activation_bytes_per_gpu": (activation_peak_bytes(model, batched, tp), _ACTIVATION_SOURCE),
            "non_torch_bytes_per_gpu": _non_torch_default(tp * pp),
            "cuda_graph_bytes_per_gpu": (VLLM_CUDA_GRAPH_BYTES, _VLLM_CUDA_GRAPH_SOURCE),
            "reserved_bytes_per_gpu": none,
        }
    if config.engine == SGLANG:
        fraction, chunk, graph_bs = sglang_mem_fraction_static(gpu.memory_bytes, tp, pp,
                                                               config.max_num_batched_tokens)
        outside = (0, "outside mem_fraction_static, in the share SGLang's default fraction sets aside")
        return {
            "gpu_memory_utilization": (fraction, (f"{_SGLANG_FRACTION_SOURCE} (chunked_prefill_size {chunk}, "
                                                  f"cuda_graph_max_bs {graph_bs})")),
            "max_num_seqs": (None, _SGLANG_MAX_RUNNING_SOURCE),
            "max_num_batched_tokens": (chunk, "SGLang default chunked_prefill_size for this GPU size"),
            "block_size": (SGLANG_PAGE_SIZE, "SGLang default page_size 1"),
            "activation_bytes_per_gpu": outside,
            "non_torch_bytes_per_gpu": outside,
            "cuda_graph_bytes_per_gpu": outside,
            "reserved_bytes_per_gpu": none,
        }
    if config.engine == TRTLLM:
        batched = config.max_num_batched_tokens or TRTLLM_MAX_NUM_TOKENS
        return {
            "gpu_memory_utilization": (TRTLLM_FREE_GPU_MEMORY_FRACTION, _TRTLLM_FRACTION_SOURCE),
            "max_num_seqs": (TRTLLM_MAX_BATCH_SIZE, "TensorRT-LLM default max_batch_size 2048"),
            "max_num_batched_tokens": (batched, "TensorRT-LLM default max_num_tokens 8192"),
            "block_size": (TRTLLM_BLOCK_SIZE, "TensorRT-LLM default tokens_per_block 32"),
            "activation_bytes_per_gpu": (activation_peak_bytes(model, batched, tp), _ACTIVATION_SOURCE),
            "non_torch_bytes_per_gpu": _non_torch_default(tp * pp),
            "cuda_graph_bytes_per_gpu": (0, "captured after the KV cache, inside the 10% left free"),
            "reserved_bytes_per_gpu": none,
        }
    only_given = (0, "generic engine: only what is given is subtracted")
    return {
        "gpu_memory_utilization": (GENERIC_GPU_MEMORY_UTILIZATION, "generic default: 0.9 of total memory"),
        "max_num_seqs": (None, "generic engine: no limit"),
        "max_num_batched_tokens": (GENERIC_MAX_NUM_BATCHED_TOKENS, "generic default 8192 (prefill chunk)"),
        "block_size": (GENERIC_BLOCK_SIZE, "generic default block of 16 tokens"),
        "activation_bytes_per_gpu": only_given,
        "non_torch_bytes_per_gpu": only_given,
        "cuda_graph_bytes_per_gpu": only_given,
        "reserved_bytes_per_gpu": (0, "generic default: no reserve"),
    }


def resolve_engine(config: EngineConfig, model: ModelSpec, gpu: GpuSpec, tensor_parallel: int,
                   pipeline_parallel: int = 1) -> ResolvedEngine:
    """Fill in every default of `config` for this model, GPU and parallel layout, naming each source
    ("given" for what the caller set)."""
    if tensor_parallel < 1 or pipeline_parallel < 1:
        raise ValueError("tensor_parallel and pipeline_parallel must be >= 1")
    if config.max_model_len is not None and config.max_model_len > model.max_position_embeddings:
        raise ValueError(f"max_model_len {config.max_model_len} exceeds the model's "
                         f"{model.max_position_embeddings} positions")
    settings = _engine_defaults(config, model, gpu, tensor_parallel, pipeline_parallel)
    settings["max_model_len"] = (model.max_position_embeddings, "the model's max_position_embeddings")
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name, (default, source) in settings.items():
        given = getattr(config, name)
        values[name], sources[name] = (default, source) if given is None else (given, "given")
    return ResolvedEngine(
        engine=config.engine,
        gpu_memory_utilization=float(values["gpu_memory_utilization"]),
        utilization_of=OF_FREE if config.engine == TRTLLM else OF_TOTAL,
        reserved_bytes_per_gpu=int(values["reserved_bytes_per_gpu"]),
        activation_bytes_per_gpu=int(values["activation_bytes_per_gpu"]),
        non_torch_bytes_per_gpu=int(values["non_torch_bytes_per_gpu"]),
        cuda_graph_bytes_per_gpu=int(values["cuda_graph_bytes_per_gpu"]),
        max_num_seqs=None if values["max_num_seqs"] is None else int(values["max_num_seqs"]),
        max_num_batched_tokens=int(values["max_num_batched_tokens"]),
        block_size=int(values["block_size"]),
        max_model_len=int(values["max_model_len"]),
        kv_allocation=ON_DEMAND if config.engine in (VLLM, SGLANG) else RESERVE_AT_ADMISSION,
        sources=tuple(sources.items()),
    )


# Memory budget ---------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class MemoryBudget:
    """One GPU's memory, by the engine's accounting (the most loaded GPU of the layout).

    kv_budget = usable − weights − activation − overhead; <= 0 means the KV cache gets nothing.
    """

    total_bytes_per_gpu: int
    usable_bytes_per_gpu: int  # what the engine lets itself use (for trtllm: all but 10% of the free part)
    weights_bytes_per_gpu: int
    activation_bytes_per_gpu: int
    non_torch_bytes_per_gpu: int
    cuda_graph_bytes_per_gpu: int
    reserved_bytes_per_gpu: int
    kv_budget_bytes_per_gpu: int

    @property
    def overhead_bytes_per_gpu(self) -> int:
        return self.non_torch_bytes_per_gpu + self.cuda_graph_bytes_per_gpu + self.reserved_bytes_per_gpu


def memory_budget(model: ModelSpec, gpu: GpuSpec, engine: ResolvedEngine, *, tensor_parallel: int,
                  pipeline_parallel: int, weight_dtype: str) -> MemoryBudget:
    """The per-GPU memory budget of `engine` (see the module docstring for each engine's rule)."""
    total = gpu.memory_bytes
    weights = weight_bytes_per_gpu(model, weight_dtype, tensor_parallel, pipeline_parallel)
    activation = engine.activation_bytes_per_gpu
    overhead = engine.overhead_bytes_per_gpu
    if engine.utilization_of == OF_FREE:
        free = total - weights - activation - overhead
        kv_budget = int(engine.gpu_memory_utilization * free) if free > 0 else free
        usable = kv_budget + weights + activation + overhead
    else:
        usable = int(engine.gpu_memory_utilization * total)
        kv_budget = usable - weights - activation - overhead
    return MemoryBudget(
        total_bytes_per_gpu=total, usable_bytes_per_gpu=usable, weights_bytes_per_gpu=weights,
        activation_bytes_per_gpu=activation, non_torch_bytes_per_gpu=engine.non_torch_bytes_per_gpu,
        cuda_graph_bytes_per_gpu=engine.cuda_graph_bytes_per_gpu,
        reserved_bytes_per_gpu=engine.reserved_bytes_per_gpu, kv_budget_bytes_per_gpu=kv_budget,
    )


# KV capacity and concurrency -------------------------------------------------------------------

def kv_bytes_per_token_per_gpu(model: ModelSpec, kv_dtype: str, *, tensor_parallel: int,
                               pipeline_parallel: int) -> int:
    """Bytes one token costs when every layer of the most loaded stage caches it (a full-attention-
    equivalent token: what one block slot holds)."""
    per_layer = kv_bytes_per_token_per_layer(model, 0, kv_dtype, tensor_parallel)
    stages = pipeline_stages(model.num_hidden_layers, pipeline_parallel)
    return per_layer * max(len(stage) for stage in stages)


def kv_token_capacity(model: ModelSpec, kv_budget_bytes_per_gpu: int, kv_dtype: str, *, tensor_parallel: int,
                      pipeline_parallel: int, block_size: int) -> tuple[int, int]:
    """(kv_tokens, kv_blocks) per replica: blocks = budget // (block_size × per-token bytes per GPU),
    tokens = blocks × block_size, in full-attention-equivalent blocks for window models (module docstring)."""
    if block_size < 1:
        raise ValueError("block_size must be >= 1")
    if kv_budget_bytes_per_gpu <= 0:
        return 0, 0
    per_token = kv_bytes_per_token_per_gpu(model, kv_dtype, tensor_parallel=tensor_parallel,
                                           pipeline_parallel=pipeline_parallel)
    blocks = kv_budget_bytes_per_gpu // (block_size * per_token)
    return blocks * block_size, blocks


def requests_fitting(model: ModelSpec, kv_budget_bytes_per_gpu: int, context_tokens: int, kv_dtype: str, *,
                     tensor_parallel: int, pipeline_parallel: int, block_size: int) -> int:
    """Requests of `context_tokens` each whose KV (block-rounded, windows applied) fits the budget.

    For all-full models this is kv_blocks // ceil(context / block_size) (nested floor division).
    """
    if kv_budget_bytes_per_gpu <= 0:
        return 0
    per_request = kv_cache_bytes_for_batch(model, (context_tokens,), kv_dtype, tensor_parallel,
                                           pipeline_parallel, block_size)
    return kv_budget_bytes_per_gpu // per_request if per_request else 0


def _cached_slots_sum(tokens: int, block_size: int, cap_slots: int | None) -> int:
    """Σ over contexts c = 1..tokens of the token slots one layer holds: ceil(c/b)·b, capped at
    `cap_slots` for a window layer (the blocks its window can straddle, from `kv.kv_cache_size`).

    Σ_{c=1..n} ceil(c/b) = b·q(q+1)/2 + r·(q+1) with q = n // b, r = n % b; past the cap every
    context holds `cap_slots`.
    """
    def staircase(n: int) -> int:
        q, r = divmod(n, block_size)
        return block_size * (block_size * q * (q + 1) // 2 + r * (q + 1))

    if cap_slots is None or tokens <= cap_slots:
        return staircase(tokens)
    return staircase(cap_slots) + (tokens - cap_slots) * cap_slots


def steady_state_kv_bytes(model: ModelSpec, input_tokens: int, output_tokens: int, kv_dtype: str, *,
                          tensor_parallel: int, pipeline_parallel: int,
                          block_size: int) -> Fraction:
    """Mean KV bytes per GPU one request holds over its decode, with blocks allocated on demand.

    The request holds input + t tokens (block-rounded, windows applied) while producing its t-th output
    token, t = 1..output, each for one step; the mean over those steps is exact (a Fraction). The most
    loaded pipeline stage counts.
    """
    per_layer = kv_bytes_per_token_per_layer(model, 0, kv_dtype, tensor_parallel)
    window_caps = _window_slot_caps(model, block_size)
    slot_sums = {
        window: _cached_slots_sum(input_tokens + output_tokens, block_size, cap)
        - _cached_slots_sum(input_tokens, block_size, cap)
        for window, cap in window_caps
    }
    heaviest = max(sum(layers * slot_sums[window] for window, layers in stage)
                   for stage in _window_layers_per_stage(model, pipeline_parallel))
    return Fraction(per_layer * heaviest, output_tokens)


@lru_cache(maxsize=256)
def _window_layers_per_stage(model: ModelSpec,
                             pipeline_parallel: int) -> tuple[tuple[tuple[int | None, int], ...], ...]:
    """For each pipeline stage, (window, layers) pairs: how many of its layers cache at most that many
    tokens (None: the whole context)."""
    windows = [model.layer_window(layer_type) for layer_type in model.resolved_layer_types]
    return tuple(tuple(Counter(windows[stage.start:stage.stop]).items())
                 for stage in pipeline_stages(model.num_hidden_layers, pipeline_parallel))


@lru_cache(maxsize=256)
def _window_slot_caps(model: ModelSpec, block_size: int) -> tuple[tuple[int | None, int | None], ...]:
    """(window, token slots its layers hold at most per sequence; None: unbounded), read off
    `kv.kv_cache_size` at a context past every window."""
    windows = {model.layer_window(layer_type) for layer_type in model.resolved_layer_types}
    finite = [window for window in windows if window is not None]
    if not finite:
        return ((None, None),)
    beyond = 2 * max(finite) + 2 * block_size
    held = {group.window: group.tokens_cached
            for group in kv_cache_size(model, beyond, "bf16", block_size=block_size).groups}
    return tuple((window, None if window is None else held[window]) for window in windows)


@dataclass(frozen=True, slots=True)
class ConcurrencyView:
    """Concurrent requests under one assumption about the tokens each holds."""

    sequences: int  # min(kv_limited_sequences, max_num_seqs)
    kv_limited_sequences: int  # what the KV cache alone allows
    limit: str  # LIMIT_KV_CACHE or LIMIT_MAX_NUM_SEQS: which one binds
    tokens_per_request: float  # context charged to each request (before block rounding for worst/admission)


@dataclass(frozen=True, slots=True)
class MaxConcurrency:
    worst_case: ConcurrencyView  # max_model_len per request (vLLM's start-up log)
    admission: ConcurrencyView  # input + output per request (no-evict reservation)
    steady_state: ConcurrencyView  # mean live tokens per request (on-demand paged allocation)

    def view(self, name: str) -> ConcurrencyView:
        return self.admission if name == ADMISSION else self.steady_state


def _capped(kv_limited: int, max_num_seqs: int | None, tokens_per_request: float) -> ConcurrencyView:
    if max_num_seqs is not None and max_num_seqs < kv_limited:
        return ConcurrencyView(max_num_seqs, kv_limited, LIMIT_MAX_NUM_SEQS, tokens_per_request)
    return ConcurrencyView(kv_limited, kv_limited, LIMIT_KV_CACHE, tokens_per_request)


def longest_context(model: ModelSpec, kv_budget_bytes_per_gpu: int, kv_dtype: str, *, tensor_parallel: int,
                    pipeline_parallel: int, block_size: int, max_model_len: int) -> int:
    """Longest context one request can reach alone: the largest c <= max_model_len whose KV fits
    (bisection; the KV of one sequence never shrinks as it grows)."""
    def fits(context: int) -> bool:
        return kv_cache_bytes_for_batch(model, (context,), kv_dtype, tensor_parallel, pipeline_parallel,
                                        block_size) <= kv_budget_bytes_per_gpu

    if kv_budget_bytes_per_gpu <= 0 or not fits(1):
        return 0
    low, high = 1, max_model_len  # invariant: fits(low)
    if fits(high):
        return high
    while high - low > 1:  # invariant: fits(low), not fits(high)
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return low


# Decode operating point -------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class OperatingPoint:
    """Steady-state continuous batching at `batch_size` running requests of the given lengths.

    Each running request advances one token per decode step; the prompts of the requests that replace
    finished ones are prefilled in between (chunks of max_num_batched_tokens). Per output token every
    running request therefore waits one decode step plus its share of prefill work:
        tpot = decode_step + batch · prefill / (pp · output_tokens)
    (with pp pipeline stages, pp micro-batches of batch/pp are in flight and each stage carries 1/pp of
    a prefill). Then per-user tokens/s = 1/tpot, aggregate = batch/tpot, requests/s = aggregate/output.
    Ideal figures use the roofline without efficiencies, communication or overheads; expected ones the
    calibrated step-time model.
    """

    batch_size: int
    concurrency_view: str  # which MaxConcurrency view the engine runs at
    mean_context_tokens: float  # cached tokens per running request during decode
    ideal_decode_step_s: float
    expected_decode_step_s: float
    ideal_prefill_s: float  # one request's prompt
    expected_prefill_s: float
    ideal_tpot_s: float
    expected_tpot_s: float
    ideal_tokens_per_s_per_user: float
    expected_tokens_per_s_per_user: float
    ideal_output_tokens_per_s: float  # all running requests together
    expected_output_tokens_per_s: float
    ideal_requests_per_s: float
    expected_requests_per_s: float


def operating_point(model: ModelSpec, gpu: GpuSpec, *, batch_size: int, concurrency_view: str,
                    input_tokens: int, output_tokens: int, tensor_parallel: int, pipeline_parallel: int,
                    weight_dtype: str, kv_dtype: str, compute_dtype: str, efficiency: Efficiency,
                    max_num_batched_tokens: int, activation_dtype: str = "bf16") -> OperatingPoint:
    """Decode step, prefill and the steady-state rates at `batch_size` running requests (see
    `OperatingPoint`), timed with the step-time model of this deployment."""
    if batch_size < 1 or input_tokens < 1 or output_tokens < 1:
        raise ValueError("batch_size, input_tokens and output_tokens must be >= 1")
    steps = build_step_time_model(model, gpu, tensor_parallel=tensor_parallel,
                                  pipeline_parallel=pipeline_parallel, weight_dtype=weight_dtype,
                                  kv_dtype=kv_dtype, compute_dtype=compute_dtype, efficiency=efficiency,
                                  activation_dtype=activation_dtype)
    # The step producing output token t+1 reads the prompt and t-1 generated tokens, t = 1..output-1.
    mean_context = input_tokens + max(output_tokens - 2, 0) / 2
    micro_batch = batch_size / pipeline_parallel
    # The prompt in chunks of at most max_num_batched_tokens; chunk k (n_k tokens after a prefix p_k)
    # attends n_k·(p_k + (n_k+1)/2) positions (causal). Row 0 is the decode step, rows 1.. the chunks, so
    # one vectorized call times them all. A chunk's time is piecewise linear in k, so beyond
    # MAX_PREFILL_CHUNKS_TIMED chunks an evenly spaced sample stands for all of them (its mean x count).
    count = ceil_div(input_tokens, max_num_batched_tokens)
    index = np.unique(np.linspace(0, count - 1, min(count, MAX_PREFILL_CHUNKS_TIMED)).round())
    starts = index * max_num_batched_tokens
    chunks = np.minimum(max_num_batched_tokens, input_tokens - starts)
    zeros = np.zeros_like(chunks)
    rows = (np.concatenate(([micro_batch], zeros)), np.concatenate(([micro_batch * mean_context], zeros)),
            np.concatenate(([0.0], chunks)), np.concatenate(([0.0], chunks * (starts + (chunks + 1) / 2))),
            np.concatenate(([0.0], np.ones_like(chunks))))
    ideal = np.asarray(steps.ideal_step_time_s(*rows))
    expected = np.asarray(steps.step_time_s(*rows))
    decode_ideal, decode_expected = float(ideal[0]), float(expected[0])
    prefill_ideal, prefill_expected = (float(times[1:].mean() * count) for times in (ideal, expected))

    def tpot(decode: float, prefill: float) -> float:
        return decode + batch_size * prefill / (pipeline_parallel * output_tokens)

    tpot_ideal, tpot_expected = tpot(decode_ideal, prefill_ideal), tpot(decode_expected, prefill_expected)
    return OperatingPoint(
        batch_size=batch_size, concurrency_view=concurrency_view, mean_context_tokens=mean_context,
        ideal_decode_step_s=decode_ideal, expected_decode_step_s=decode_expected,
        ideal_prefill_s=prefill_ideal, expected_prefill_s=prefill_expected,
        ideal_tpot_s=tpot_ideal, expected_tpot_s=tpot_expected,
        ideal_tokens_per_s_per_user=1 / tpot_ideal,
        expected_tokens_per_s_per_user=1 / tpot_expected,
        ideal_output_tokens_per_s=batch_size / tpot_ideal,
        expected_output_tokens_per_s=batch_size / tpot_expected,
        ideal_requests_per_s=batch_size / (tpot_ideal * output_tokens),
        expected_requests_per_s=batch_size / (tpot_expected * output_tokens),
    )


# Capacity ---------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Suggestion:
    """The smallest change that fits: a parallel layout inside one node, else a cheaper weight precision."""

    tensor_parallel: int
    pipeline_parallel: int
    weight_dtype: str
    num_gpus: int
    kv_tokens: int
    sequences: int  # at the engine's running view
    summary: str


@dataclass(frozen=True, slots=True)
class CapacityResult:
    fits: bool
    reasons: tuple[str, ...]  # why it does not fit (empty when it does)
    suggestion: Suggestion | None  # only when it does not fit, and something does
    memory: MemoryBudget
    kv_bytes_per_token_per_gpu: int  # full-attention-equivalent token (one slot of every layer)
    kv_tokens: int  # per replica
    kv_blocks: int
    max_concurrency: MaxConcurrency
    max_context_tokens: int  # the longest context one request can reach alone
    operating_point: OperatingPoint | None  # None when it does not fit
    engine: ResolvedEngine
    compute_dtype: str
    weights_bytes_total: int  # the whole model's weights, stored once


@dataclass(frozen=True, slots=True)
class _Accounting:
    """Memory and concurrency of one configuration (no timing): what a fit check needs."""

    engine: ResolvedEngine
    memory: MemoryBudget
    kv_tokens: int
    kv_blocks: int
    max_concurrency: MaxConcurrency
    max_context_tokens: int
    reasons: tuple[str, ...]


def _account(model: ModelSpec, gpu: GpuSpec, config: EngineConfig, *, tensor_parallel: int,
             pipeline_parallel: int, weight_dtype: str, kv_dtype: str, input_tokens: int,
             output_tokens: int) -> _Accounting:
    tp, pp = tensor_parallel, pipeline_parallel
    engine = resolve_engine(config, model, gpu, tp, pp)
    memory = memory_budget(model, gpu, engine, tensor_parallel=tp, pipeline_parallel=pp,
                           weight_dtype=weight_dtype)
    budget, block = memory.kv_budget_bytes_per_gpu, engine.block_size
    layout = {"tensor_parallel": tp, "pipeline_parallel": pp, "block_size": block}
    kv_tokens, kv_blocks = kv_token_capacity(model, budget, kv_dtype, **layout)
    if engine.engine == SGLANG and config.max_num_seqs is None:
        engine = replace(engine, max_num_seqs=sglang_max_running_requests(kv_tokens, engine.max_model_len))
    request_tokens = input_tokens + output_tokens
    worst = requests_fitting(model, budget, engine.max_model_len, kv_dtype, **layout)
    admission = requests_fitting(model, budget, request_tokens, kv_dtype, **layout)
    mean_bytes = steady_state_kv_bytes(model, input_tokens, output_tokens, kv_dtype, **layout)
    steady = int(budget / mean_bytes) if budget > 0 else 0  # Fraction division: an exact floor
    per_token = kv_bytes_per_token_per_gpu(model, kv_dtype, tensor_parallel=tp, pipeline_parallel=pp)
    mean_live_tokens = float(mean_bytes / per_token)  # full-attention-equivalent tokens
    concurrency = MaxConcurrency(
        worst_case=_capped(worst, engine.max_num_seqs, engine.max_model_len),
        admission=_capped(admission, engine.max_num_seqs, request_tokens),
        steady_state=_capped(steady, engine.max_num_seqs, mean_live_tokens),
    )
    max_context = longest_context(model, budget, kv_dtype, max_model_len=engine.max_model_len, **layout)
    reasons = _reasons(model, engine, memory, weight_dtype, tp, pp, request_tokens, kv_tokens,
                       admission, max_context)
    return _Accounting(engine, memory, kv_tokens, kv_blocks, concurrency, max_context, reasons)


def _gb(value: float) -> str:
    return f"{value / 1e9:.1f} GB"


def _reasons(model: ModelSpec, engine: ResolvedEngine, memory: MemoryBudget, weight_dtype: str,
             tp: int, pp: int, request_tokens: int, kv_tokens: int, admission: int,
             max_context: int) -> tuple[str, ...]:
    gpus = f"{tp * pp} x {_gb(memory.total_bytes_per_gpu)} (TP{tp}, PP{pp})"
    if memory.kv_budget_bytes_per_gpu <= 0:
        weights = f"weights need {_gb(weight_bytes(model, weight_dtype))} ({weight_dtype})"
        placed = f"{gpus} puts {_gb(memory.weights_bytes_per_gpu)} on each GPU"
        usable = f"the {_gb(memory.usable_bytes_per_gpu)} {engine.engine} uses of it"
        if memory.weights_bytes_per_gpu >= memory.usable_bytes_per_gpu:
            return (f"{weights}; {placed}, more than {usable}",)
        others = (f"activations ({_gb(memory.activation_bytes_per_gpu)}) and overhead "
                  f"({_gb(memory.overhead_bytes_per_gpu)})")
        return (f"{weights}; {placed}, within {usable}, but {others} leave nothing for the KV cache",)
    reasons = []
    if request_tokens > engine.max_model_len:
        reasons.append(f"input + output = {request_tokens} tokens exceed max_model_len "
                       f"{engine.max_model_len}")
    elif admission < 1:
        reasons.append(f"one request of {request_tokens} tokens needs more KV cache than the "
                       f"{_gb(memory.kv_budget_bytes_per_gpu)} per GPU left ({kv_tokens} tokens) on {gpus}")
    if engine.engine == VLLM and max_context < engine.max_model_len:
        reasons.append(f"vLLM refuses to start: max_model_len {engine.max_model_len} needs more KV cache "
                       f"than the {kv_tokens} tokens that fit; lower max_model_len to {max_context} "
                       "or add GPUs")
    return tuple(reasons)


def _layouts(model: ModelSpec, gpu: GpuSpec) -> list[tuple[int, int]]:
    """(tp, pp) layouts inside one node, fewest GPUs first, then the most tensor parallelism."""
    return [
        (tp, gpus // tp)
        for gpus in range(1, gpu.gpus_per_node + 1)
        for tp in range(gpus, 0, -1)
        if gpus % tp == 0 and model.num_attention_heads % tp == 0 and gpus // tp <= model.num_hidden_layers
    ]


def _suggest(model: ModelSpec, gpu: GpuSpec, config: EngineConfig, *, tensor_parallel: int,
             pipeline_parallel: int, weight_dtype: str, kv_dtype: str, input_tokens: int,
             output_tokens: int) -> Suggestion | None:
    """Smallest layout in one node at the requested precision, else cheaper precisions (fp8, int4),
    each at its smallest layout. None when nothing fits (e.g. a request longer than max_model_len)."""
    bits = bits_per_value(weight_dtype)
    dtypes = [weight_dtype] + [d for d in CHEAPER_WEIGHT_DTYPES if bits_per_value(d) < bits]
    for dtype in dtypes:
        for tp, pp in _layouts(model, gpu):
            if (tp, pp, dtype) == (tensor_parallel, pipeline_parallel, weight_dtype):
                continue
            if weight_bytes_per_gpu(model, dtype, tp, pp) >= gpu.memory_bytes:
                continue  # cannot fit under any engine: skip the full accounting
            accounting = _account(model, gpu, config, tensor_parallel=tp, pipeline_parallel=pp,
                                  weight_dtype=dtype, kv_dtype=kv_dtype, input_tokens=input_tokens,
                                  output_tokens=output_tokens)
            if accounting.reasons:
                continue
            running = accounting.max_concurrency.view(accounting.engine.running_view)
            change = f"TP{tp} x PP{pp} on {tp * pp} GPUs"
            if dtype != weight_dtype:
                change += f" with {dtype} weights"
            return Suggestion(
                tensor_parallel=tp, pipeline_parallel=pp, weight_dtype=dtype, num_gpus=tp * pp,
                kv_tokens=accounting.kv_tokens, sequences=running.sequences,
                summary=f"{change} fits: {accounting.kv_tokens} KV tokens, {running.sequences} concurrent "
                        f"requests ({accounting.engine.running_view.replace('_', ' ')})",
            )
    return None


def capacity(model: ModelSpec, gpu: GpuSpec, *, tensor_parallel: int, pipeline_parallel: int,
             weight_dtype: str, kv_dtype: str, compute_dtype: str | None, engine: EngineConfig,
             input_tokens: int, output_tokens: int, efficiency: Efficiency,
             activation_dtype: str = "bf16") -> CapacityResult:
    """How many concurrent requests of `input_tokens` + `output_tokens` fit, and how fast they go.

    Impossible configurations are answers (fits False, reasons, a suggestion), not errors; only
    inconsistent input (TP not dividing the heads, PP above the layers, unknown dtypes, a compute
    precision the GPU lacks, max_model_len beyond the model) raises ValueError.
    """
    if weight_dtype not in WEIGHT_DTYPES:
        raise ValueError(f"unknown weight dtype {weight_dtype!r}")
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"unknown KV dtype {kv_dtype!r}")
    if tensor_parallel < 1 or model.num_attention_heads % tensor_parallel:
        raise ValueError(f"tensor_parallel {tensor_parallel} must divide the {model.num_attention_heads} "
                         "attention heads")
    if not 1 <= pipeline_parallel <= model.num_hidden_layers:
        raise ValueError(f"pipeline_parallel {pipeline_parallel} must be in 1..{model.num_hidden_layers} "
                         "(the layers)")
    if input_tokens < 1 or output_tokens < 1:
        raise ValueError("input_tokens and output_tokens must be >= 1")
    compute_dtype = compute_dtype or default_compute_dtype(gpu, weight_dtype)
    if not gpu.peak_flops_per_s(compute_dtype):
        raise ValueError(f"{gpu.name or gpu.slug} has no {compute_dtype} tensor rate")
    shape = {"tensor_parallel": tensor_parallel, "pipeline_parallel": pipeline_parallel,
             "weight_dtype": weight_dtype, "kv_dtype": kv_dtype, "input_tokens": input_tokens,
             "output_tokens": output_tokens}
    accounting = _account(model, gpu, engine, **shape)
    fits = not accounting.reasons
    point = None
    if fits:
        view = accounting.engine.running_view
        point = operating_point(
            model, gpu, batch_size=accounting.max_concurrency.view(view).sequences, concurrency_view=view,
            input_tokens=input_tokens, output_tokens=output_tokens, tensor_parallel=tensor_parallel,
            pipeline_parallel=pipeline_parallel, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
            compute_dtype=compute_dtype, efficiency=efficiency, activation_dtype=activation_dtype,
            max_num_batched_tokens=accounting.engine.max_num_batched_tokens)
    return CapacityResult(
        fits=fits,
        reasons=accounting.reasons,
        suggestion=None if fits else _suggest(model, gpu, engine, **shape),
        memory=accounting.memory,
        kv_bytes_per_token_per_gpu=kv_bytes_per_token_per_gpu(
            model, kv_dtype, tensor_parallel=tensor_parallel, pipeline_parallel=pipeline_parallel),
        kv_tokens=accounting.kv_tokens,
        kv_blocks=accounting.kv_blocks,
        max_concurrency=accounting.max_concurrency,
        max_context_tokens=accounting.max_context_tokens,
        operating_point=point,
        engine=accounting.engine,
        compute_dtype=compute_dtype,
        weights_bytes_total=weight_bytes(model, weight_dtype),
    )
