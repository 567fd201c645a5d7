"""Memory: an engine's budget per GPU and the KV cache it holds (SIZING.md section 7).

Capacity is decided by the serving engine's memory accounting (each engine's rule lives in its module
under `app.sizing.engines`). Per GPU, every engine leaves the KV cache

    kv_budget = usable − weights − activation − overhead        (overhead = non-torch + CUDA graphs + reserve)

and differs in what `usable` is (a fraction of total memory, or for TensorRT-LLM of the memory free after
everything else) and which parts it subtracts by default. "Total" is what the engine sizes from
(`ResolvedEngine.total_bytes_per_gpu`: the total CUDA reports, below nvidia-smi's).
Weights are counted by parameter group in the checkpoint's recipe when one is given (`model.recipes`).

KV capacity is counted in blocks, as paged engines allocate it: one block holds `block_size` tokens in
every layer. Models whose layers all attend the full context (and MLA models, whose one latent per token
is the same on every TP rank) get exactly `blocks = kv_budget // (block_size × KV bytes per token per
GPU)`. Models mixing sliding-window and global layers are counted as vLLM's hybrid allocator counts them:
one shared pool, each layer group taking its own blocks and window groups only the blocks their window
spans; the pool's size is reported in full-attention-equivalent blocks (a block of tokens in every
layer, vLLM's "GPU KV cache size" for hybrid models), and every concurrency figure charges each request
what its layers really hold (`kv.kv_cache_bytes_per_stage`).

Pipeline stages hold different weights and layers (the engine deals them: `params.pipeline_stages`), so each
stage's GPU has its own KV budget (`MemoryBudget.kv_budget_bytes_per_stage`) and its own bytes per block. One
scheduler hands out the same blocks on every stage, so a replica holds the fewest blocks any stage fits, and
every concurrency figure is the smallest over the stages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from app.sizing.engines import dense_over_attention_dp, pipeline_split
from app.sizing.engines.base import OF_FREE, ResolvedEngine
from app.sizing.model.kv import (
    kv_bytes_per_token_per_layer,
    kv_cache_bytes_per_stage,
    window_layers_per_stage,
    window_slot_caps,
)
from app.sizing.model.params import SPLIT_BEFORE_LAST, pipeline_stages
from app.sizing.model.recipes import WeightRecipe
from app.sizing.model.weights import weight_bytes_per_stage
from app.sizing.specs import GpuSpec, ModelSpec

# Memory budget ---------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class MemoryBudget:
    """One GPU's memory, by the engine's accounting (the most loaded GPU of the layout).

    kv_budget = usable − weights − activation − overhead; <= 0 means the KV cache gets nothing. Pipeline
    stages hold different weights (their own layers, the first the embedding, the last the LM head), so each
    stage's GPU has a KV budget of its own (`kv_budget_bytes_per_stage`, first to last, by the same rule);
    the top-level figures are the heaviest stage's, whose budget is the smallest.
    """

    total_bytes_per_gpu: int
    usable_bytes_per_gpu: int  # what the engine lets itself use (for trtllm: all but 10% of the free part)
    weights_bytes_per_gpu: int
    activation_bytes_per_gpu: int
    non_torch_bytes_per_gpu: int
    cuda_graph_bytes_per_gpu: int
    reserved_bytes_per_gpu: int
    kv_budget_bytes_per_gpu: int
    weights_bytes_per_stage: tuple[int, ...]  # one GPU of each pipeline stage, first to last
    kv_budget_bytes_per_stage: tuple[int, ...]

    @property
    def overhead_bytes_per_gpu(self) -> int:
        return self.non_torch_bytes_per_gpu + self.cuda_graph_bytes_per_gpu + self.reserved_bytes_per_gpu


def memory_budget(model: ModelSpec, gpu: GpuSpec, engine: ResolvedEngine, *, tensor_parallel: int,
                  pipeline_parallel: int, weight_dtype: str | WeightRecipe, data_parallel: int = 1,
                  expert_parallel: int = 1) -> MemoryBudget:
    """The per-GPU memory budget of `engine` (see the module docstring for each engine's rule), with
    weights placed by the layout (`weights.weight_bytes_per_stage`: attention replicated on every
    data-parallel rank, routed experts split by expert parallelism); `weight_dtype` is a plain dtype or
    the checkpoint's recipe."""
    stage_weights = weight_bytes_per_stage(model, weight_dtype, tensor_parallel, pipeline_parallel, expert_parallel,
                                           data_parallel, pipeline_split(engine.engine),
                                           dense_over_attention_dp(engine.engine))
    budgets = [_usable_and_kv_budget(engine, weights) for weights in stage_weights]
    heaviest = max(range(len(stage_weights)), key=stage_weights.__getitem__)  # the first of equals
    usable, kv_budget = budgets[heaviest]
    return MemoryBudget(
        total_bytes_per_gpu=engine.total_bytes_per_gpu, usable_bytes_per_gpu=usable,
        weights_bytes_per_gpu=stage_weights[heaviest], activation_bytes_per_gpu=engine.activation_bytes_per_gpu,
        non_torch_bytes_per_gpu=engine.non_torch_bytes_per_gpu, cuda_graph_bytes_per_gpu=engine.cuda_graph_bytes_per_gpu,
        reserved_bytes_per_gpu=engine.reserved_bytes_per_gpu, kv_budget_bytes_per_gpu=kv_budget,
        weights_bytes_per_stage=stage_weights, kv_budget_bytes_per_stage=tuple(kv for _, kv in budgets),
    )


def _usable_and_kv_budget(engine: ResolvedEngine, weights: int) -> tuple[int, int]:
    """(usable, KV budget) of one GPU holding `weights` bytes, by the engine's rule (module docstring)."""
    total, activation, overhead = engine.total_bytes_per_gpu, engine.activation_bytes_per_gpu, engine.overhead_bytes_per_gpu
    if engine.utilization_of == OF_FREE:
        free = total - weights - activation - overhead
        kv_budget = int(engine.gpu_memory_utilization * free) if free > 0 else free
        return kv_budget + weights + activation + overhead, kv_budget
    usable = max(int(engine.gpu_memory_utilization * total), 0)  # a fraction <= 0 leaves the engine nothing
    return usable, usable - weights - activation - overhead


# KV capacity and concurrency -------------------------------------------------------------------

def kv_bytes_per_token_per_gpu(model: ModelSpec, kv_dtype: str, *, tensor_parallel: int,
                               pipeline_parallel: int) -> int:
    """Bytes one token costs when every layer of the most loaded stage caches it (a full-attention-
    equivalent token: what one block slot holds)."""
    per_layer = kv_bytes_per_token_per_layer(model, 0, kv_dtype, tensor_parallel)
    stages = pipeline_stages(model.num_hidden_layers, pipeline_parallel)
    return per_layer * max(len(stage) for stage in stages)


KvBudget = int | Sequence[int]  # bytes per GPU: one for every pipeline stage, or each stage's (first to last)


def stage_budgets(kv_budget: KvBudget, pipeline_parallel: int) -> tuple[int, ...]:
    """Each pipeline stage's KV budget per GPU: a single figure holds for every stage."""
    if isinstance(kv_budget, int):
        return (kv_budget,) * pipeline_parallel
    if len(kv_budget) != pipeline_parallel:
        raise ValueError(f"{len(kv_budget)} stage budgets for {pipeline_parallel} pipeline stages")
    return tuple(kv_budget)


def kv_token_capacity(model: ModelSpec, kv_budget: KvBudget, kv_dtype: str, *, tensor_parallel: int,
                      pipeline_parallel: int, block_size: int, data_parallel: int = 1,
                      split: str = SPLIT_BEFORE_LAST) -> tuple[int, int]:
    """(kv_tokens, kv_blocks) per replica: blocks = budget // (block_size × per-token bytes per GPU),
    tokens = blocks × block_size, in full-attention-equivalent blocks for window models (module docstring).

    Pipeline stages: a block holds its tokens in every layer, so each stage's GPU fits
    budget_s // (block_size × per-layer bytes × its layers) of them (`split`: how the engine deals the
    layers), and the replica has the fewest any stage fits: one scheduler hands out the same blocks on every
    stage.

    Attention data parallelism: each of the `data_parallel` ranks caches only its own requests, at the
    per-GPU bytes of its tensor-parallel split, so the replica holds `data_parallel` times one rank's
    tokens (under plain TP an MLA latent is instead copied onto every GPU of the replica)."""
    blocks = min(stage_kv_blocks(model, kv_budget, kv_dtype, tensor_parallel=tensor_parallel,
                                 pipeline_parallel=pipeline_parallel, block_size=block_size, split=split))
    return blocks * data_parallel * block_size, blocks * data_parallel


def stage_kv_blocks(model: ModelSpec, kv_budget: KvBudget, kv_dtype: str, *, tensor_parallel: int,
                    pipeline_parallel: int, block_size: int, split: str = SPLIT_BEFORE_LAST) -> tuple[int, ...]:
    """Blocks each pipeline stage's budget fits on its own (first to last, one rank): budget_s // (block_size ×
    per-layer bytes × the stage's layers); 0 where the budget is not positive."""
    if block_size < 1:
        raise ValueError("block_size must be >= 1")
    per_layer = kv_bytes_per_token_per_layer(model, 0, kv_dtype, tensor_parallel)
    stages = pipeline_stages(model.num_hidden_layers, pipeline_parallel, split)
    return tuple(max(budget, 0) // (block_size * per_layer * len(stage))
                 for budget, stage in zip(stage_budgets(kv_budget, pipeline_parallel), stages, strict=True))


def requests_fitting(model: ModelSpec, kv_budget: KvBudget, context_tokens: int, kv_dtype: str, *,
                     tensor_parallel: int, pipeline_parallel: int, block_size: int,
                     split: str = SPLIT_BEFORE_LAST) -> int:
    """Requests of `context_tokens` each whose KV (block-rounded, windows applied) fits the budget of every
    pipeline stage's GPU (`kv_token_capacity`).

    For all-full models this is kv_blocks // ceil(context / block_size) (nested floor division).
    """
    budgets = stage_budgets(kv_budget, pipeline_parallel)
    if min(budgets) <= 0:
        return 0
    per_request = kv_cache_bytes_per_stage(model, (context_tokens,), kv_dtype, tensor_parallel, pipeline_parallel,
                                           block_size, split)
    fitting = [budget // held for budget, held in zip(budgets, per_request, strict=True) if held]
    return min(fitting) if fitting else 0


def _cached_slots_sum(tokens: int, block_size: int, cap_slots: int | None) -> int:
    """Σ over contexts c = 1..tokens of the token slots one layer holds: ceil(c/b)·b, capped at
    `cap_slots` for a window layer (the blocks its window can straddle, from `kv.window_slot_caps`).

    Σ_{c=1..n} ceil(c/b) = b·q(q+1)/2 + r·(q+1) with q = n // b, r = n % b; past the cap every
    context holds `cap_slots`.
    """
    def staircase(n: int) -> int:
        q, r = divmod(n, block_size)
        return block_size * (block_size * q * (q + 1) // 2 + r * (q + 1))

    if cap_slots is None or tokens <= cap_slots:
        return staircase(tokens)
    return staircase(cap_slots) + (tokens - cap_slots) * cap_slots


def steady_state_kv_bytes_per_stage(model: ModelSpec, input_tokens: int, output_tokens: int, kv_dtype: str, *,
                                    tensor_parallel: int, pipeline_parallel: int, block_size: int,
                                    split: str = SPLIT_BEFORE_LAST) -> tuple[Fraction, ...]:
    """Mean KV bytes one request holds over its decode on one GPU of each pipeline stage (first to last), with
    blocks allocated on demand.

    The request holds input + t tokens (block-rounded, windows applied) while producing its t-th output
    token, t = 1..output, each for one step; the mean over those steps is exact (a Fraction).
    """
    per_layer = kv_bytes_per_token_per_layer(model, 0, kv_dtype, tensor_parallel)
    window_caps = window_slot_caps(model, block_size)
    slot_sums = {
        window: _cached_slots_sum(input_tokens + output_tokens, block_size, cap)
        - _cached_slots_sum(input_tokens, block_size, cap)
        for window, cap in window_caps
    }
    return tuple(Fraction(per_layer * sum(layers * slot_sums[window] for window, layers in stage), output_tokens)
                 for stage in window_layers_per_stage(model, pipeline_parallel, split))


def longest_context(model: ModelSpec, kv_budget: KvBudget, kv_dtype: str, *, tensor_parallel: int,
                    pipeline_parallel: int, block_size: int, max_model_len: int, split: str = SPLIT_BEFORE_LAST) -> int:
    """Longest context one request can reach alone: the largest c <= max_model_len whose KV fits every
    pipeline stage's budget (bisection; the KV of one sequence never shrinks as it grows)."""
    budgets = stage_budgets(kv_budget, pipeline_parallel)

    def fits(context: int) -> bool:
        held = kv_cache_bytes_per_stage(model, (context,), kv_dtype, tensor_parallel, pipeline_parallel,
                                        block_size, split)
        return all(bytes_ <= budget for bytes_, budget in zip(held, budgets, strict=True))

    if min(budgets) <= 0 or not fits(1):
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
