"""Capacity: how many concurrent requests fit on a deployment, and how fast they go (SIZING.md section 7).

The engine's memory accounting per GPU and the KV blocks it leaves are `memory.py`'s; this module turns them
into concurrency and a decode operating point, and answers a configuration that does not fit with its reasons
and the smallest change that does.

Three concurrency views, each capped by `max_num_seqs`, with the binding limit named:
- worst case: every request holds `max_model_len` tokens (what vLLM logs at start-up);
- admission: every request holds input + output (what a no-evict scheduler, TensorRT-LLM's default,
  reserves at admission);
- steady state: every request holds its time-averaged live tokens, input + the output generated so far,
  rounded up to blocks (what on-demand paged allocation, vLLM's and SGLang's, sustains).
The engine runs at its own view (vLLM, SGLang: steady state; TensorRT-LLM, generic: admission), and the
decode operating point is evaluated there with the step-time model (`hardware/step_time.py`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from app.sizing.engines import (
    ENGINES,
    EngineConfig,
    dense_over_attention_dp,
    gpu_problems,
    host_adjusted,
    pipeline_split,
    resolve_engine,
    with_running_limit,
)
from app.sizing.engines.base import ADMISSION, ResolvedEngine
from app.sizing.hardware.comm import PER_EXPERT
from app.sizing.hardware.efficiency import Efficiency
from app.sizing.hardware.roofline import default_compute_dtype
from app.sizing.hardware.step_time import build_step_time_model
from app.sizing.layout import Layout
from app.sizing.model.kv import kv_breakpoints, kv_cache_bytes_per_stage
from app.sizing.model.params import ceil_div, pipeline_stages
from app.sizing.model.recipes import EMBEDDING, WeightRecipe, resolve_recipe
from app.sizing.model.weights import (
    GroupWeights,
    weight_bytes,
    weight_bytes_per_gpu,
    weight_groups_per_gpu,
)
from app.sizing.serving.memory import (
    MemoryBudget,
    kv_bytes_per_token_per_gpu,
    kv_token_capacity,
    longest_context,
    memory_budget,
    requests_fitting,
    stage_kv_blocks,
    steady_state_kv_bytes_per_stage,
)
from app.sizing.specs import KV_DTYPES, WEIGHT_DTYPES, GpuSpec, ModelSpec, bits_per_value

LIMIT_KV_CACHE = "kv_cache"
LIMIT_MAX_NUM_SEQS = "max_num_seqs"

# Prefill chunks timed one by one; a longer prompt is timed from an even sample of its chunks.
MAX_PREFILL_CHUNKS_TIMED = 256

# Cheaper weight precisions tried, in order, when the requested one does not fit.
CHEAPER_WEIGHT_DTYPES = ("fp8", "int4")


@dataclass(frozen=True, slots=True)
class ConcurrencyView:
    """Concurrent requests under one assumption about the tokens each holds."""

    sequences: int  # min(kv_limited_sequences, max_num_seqs)
    kv_limited_sequences: int  # what the KV cache alone allows
    limit: str  # LIMIT_KV_CACHE or LIMIT_MAX_NUM_SEQS: which one binds
    # Context charged to each request (before block rounding for worst/admission); with window layers in
    # full-attention-equivalent tokens, block-rounded, in every view (`_account`)
    tokens_per_request: float


@dataclass(frozen=True, slots=True)
class MaxConcurrency:
    worst_case: ConcurrencyView  # max_model_len per request (vLLM's start-up log)
    admission: ConcurrencyView  # input + output per request (no-evict reservation)
    steady_state: ConcurrencyView  # mean live tokens per request (on-demand paged allocation)

    def view(self, name: str) -> ConcurrencyView:
        return self.admission if name == ADMISSION else self.steady_state


def _capped(kv_limited: int, max_num_seqs: int | None, tokens_per_request: float,
            ranks: int = 1) -> ConcurrencyView:
    """One rank's KV-limited sequences against its max_num_seqs, for `ranks` data-parallel ranks."""
    if max_num_seqs is not None and max_num_seqs < kv_limited:
        return ConcurrencyView(ranks * max_num_seqs, ranks * kv_limited, LIMIT_MAX_NUM_SEQS, tokens_per_request)
    return ConcurrencyView(ranks * kv_limited, ranks * kv_limited, LIMIT_KV_CACHE, tokens_per_request)


# Decode operating point -------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class OperatingPoint:
    """Steady-state continuous batching at `batch_size` running requests of the given lengths.

    Each running request advances one token per decode step; the prompts of the requests that replace
    finished ones are prefilled in between (chunks of max_num_batched_tokens). Per output token every
    running request therefore waits one decode step plus its share of prefill work:
        tpot = decode_step + batch · prefill / (pp · output_tokens)
    (with pp pipeline stages, pp micro-batches of batch/pp are in flight, each stepping once per period of
    the full pipeline, `step_time.pipeline_period_scales`, and each stage carries 1/pp of a prefill). Then
    per-user tokens/s = 1/tpot, aggregate = batch/tpot, requests/s = aggregate/output.
    Ideal figures use the roofline without efficiencies, communication or overheads; expected ones the
    calibrated step-time model.
    """

    batch_size: int
    concurrency_view: str  # which MaxConcurrency view the engine runs at
    mean_context_tokens: float  # cached tokens per running request during decode
    ideal_decode_step_s: float
    expected_decode_step_s: float
    ideal_prefill_s: float  # one request's prompt (`prompt_prefill_s`)
    expected_prefill_s: float
    ideal_tpot_s: float
    expected_tpot_s: float
    ideal_tokens_per_s_per_user: float
    expected_tokens_per_s_per_user: float
    ideal_output_tokens_per_s: float  # all running requests together
    expected_output_tokens_per_s: float
    ideal_requests_per_s: float
    expected_requests_per_s: float
    # The prompts per second the deployment's prefill alone sustains: its dp x pp lanes (attention data-parallel
    # ranks, pipeline micro-batches in flight, each stage carrying 1/pp of a step, as tpot counts them) over one
    # prompt's prefill; 0 for a disaggregated decode worker, which prefills nothing. A prefill worker's limit.
    ideal_prefill_requests_per_s: float = 0.0
    expected_prefill_requests_per_s: float = 0.0


def prompt_prefill_s(step_time: Callable[..., Any], input_tokens: int, max_num_batched_tokens: int,
                     chunks_s: float) -> float:
    """One prompt's prefill at the engine's token budget: alone, in chunks (`chunks_s`), when the budget holds at
    most one prompt; else its 1/k share of a step of the k = budget // prompt whole prompts the budget holds (each
    sampling its last position), so the step's fixed costs (weights read, per-step and per-MoE-layer overheads)
    are shared as a busy engine shares them, not paid by every short prompt."""
    per_step = max_num_batched_tokens // input_tokens
    if per_step <= 1:
        return chunks_s
    tokens = per_step * input_tokens
    return float(step_time(0.0, 0.0, float(tokens), tokens * (input_tokens + 1) / 2, float(per_step))) / per_step


def operating_point(model: ModelSpec, gpu: GpuSpec, *, batch_size: int, concurrency_view: str,
                    input_tokens: int, output_tokens: int, tensor_parallel: int, pipeline_parallel: int,
                    weight_dtype: str | WeightRecipe, kv_dtype: str, compute_dtype: str, efficiency: Efficiency,
                    max_num_batched_tokens: int, activation_dtype: str = "bf16", data_parallel: int = 1,
                    expert_parallel: int = 1, decode_only: bool = False,
                    moe_exchange: str = PER_EXPERT) -> OperatingPoint:
    """Decode step, prefill and the steady-state rates at `batch_size` running requests (see
    `OperatingPoint`), timed with the step-time model of this deployment. The requests are spread over the
    data-parallel ranks and, within a rank, over the pp micro-batches in flight; their MoE layers exchange
    tokens the engine's way (`moe_exchange`, `comm.moe_exchange_bytes_per_token`). `decode_only`: a
    disaggregated decode worker, whose prompts arrive prefilled (`disaggregation`): no prefill (0), tpot = the
    decode step."""
    if batch_size < 1 or input_tokens < 1 or output_tokens < 1:
        raise ValueError("batch_size, input_tokens and output_tokens must be >= 1")
    steps = build_step_time_model(model, gpu, tensor_parallel=tensor_parallel,
                                  pipeline_parallel=pipeline_parallel, weight_dtype=weight_dtype,
                                  kv_dtype=kv_dtype, compute_dtype=compute_dtype, efficiency=efficiency,
                                  activation_dtype=activation_dtype, data_parallel=data_parallel,
                                  expert_parallel=expert_parallel, moe_exchange=moe_exchange,
                                  pipeline_period=1 < pipeline_parallel <= batch_size / data_parallel)
    # The step producing output token t+1 reads the prompt and t-1 generated tokens, t = 1..output-1.
    mean_context = input_tokens + max(output_tokens - 2, 0) / 2
    rank_batch, micro_batch = batch_size / data_parallel, batch_size / data_parallel / pipeline_parallel
    # The prompt in chunks of at most max_num_batched_tokens; chunk k (n_k tokens after a prefix p_k)
    # attends n_k·(p_k + (n_k+1)/2) positions (causal). A chunk's time is piecewise linear in k, so beyond
    # MAX_PREFILL_CHUNKS_TIMED chunks an evenly spaced sample stands for all of them (its mean x count).
    # A handful of steps: timed one call each (the model's float path beats array set-up at this size).
    count = ceil_div(input_tokens, max_num_batched_tokens)
    index = (range(count) if count <= MAX_PREFILL_CHUNKS_TIMED  # every chunk: no numpy needed
             else np.unique(np.linspace(0, count - 1, MAX_PREFILL_CHUNKS_TIMED).round()))
    starts = [float(k * max_num_batched_tokens) for k in index]
    chunk_rows = [(0.0, 0.0, float(chunk), chunk * (start + (chunk + 1) / 2), 1.0)
                  for start, chunk in ((start, min(max_num_batched_tokens, input_tokens - start)) for start in starts)]
    decode_row = (micro_batch, micro_batch * mean_context, 0.0, 0.0)
    decode_ideal, decode_expected = float(steps.ideal_step_time_s(*decode_row)), float(steps.step_time_s(*decode_row))
    prefill_ideal, prefill_expected = (
        0.0 if decode_only else prompt_prefill_s(
            time, input_tokens, max_num_batched_tokens,
            math.fsum(float(time(*row)) for row in chunk_rows) / len(chunk_rows) * count)
        for time in (steps.ideal_step_time_s, steps.step_time_s))

    def tpot(decode: float, prefill: float) -> float:
        return decode + rank_batch * prefill / (pipeline_parallel * output_tokens)

    lanes = data_parallel * pipeline_parallel
    prefill_rates = (0.0, 0.0) if decode_only else (lanes / prefill_ideal, lanes / prefill_expected)

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
        ideal_prefill_requests_per_s=prefill_rates[0], expected_prefill_requests_per_s=prefill_rates[1],
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
class PipelineStage:
    """One GPU of a pipeline stage: its layers, weights and KV budget, and the blocks that budget fits on its own
    (one data-parallel rank's); the replica holds the fewest blocks of any stage."""

    first_layer: int
    layers: int
    weights_bytes_per_gpu: int
    kv_budget_bytes_per_gpu: int
    kv_blocks: int


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
    weight_groups_per_gpu: tuple[GroupWeights, ...]  # the most loaded GPU's weights by parameter group
    weight_groups_total: tuple[GroupWeights, ...]  # the whole model's
    pipeline_stages: tuple[PipelineStage, ...]  # first to last (one for pp = 1)


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
    stages: tuple[PipelineStage, ...]


def model_dtype_bytes(weights: str | WeightRecipe) -> int:
    """Bytes per value of the unquantized parts (embedding, LM head): what a model's logits come in."""
    return 4 if resolve_recipe(weights).format_of(EMBEDDING) == "fp32" else 2


@dataclass(frozen=True, slots=True)
class _Deployment:
    """A deployment's accounting whatever the lengths (`worst`: max_model_len requests fitting one rank)."""

    engine: ResolvedEngine
    memory: MemoryBudget
    kv_tokens: int
    kv_blocks: int
    worst: int
    per_token: int
    max_context_tokens: int
    stages: tuple[PipelineStage, ...]


@lru_cache(maxsize=512)
def _deployment(model: ModelSpec, gpu: GpuSpec, config: EngineConfig, tp: int, pp: int,
                weight_dtype: str | WeightRecipe, kv_dtype: str, dp: int, ep: int) -> _Deployment:
    """`_account`'s length-independent part, memoized: requests to one deployment and suggestions reuse it."""
    engine = resolve_engine(config, model, gpu, tp, pp, model_dtype_bytes(weight_dtype), dp)
    memory = memory_budget(model, gpu, engine, tensor_parallel=tp, pipeline_parallel=pp,
                           weight_dtype=weight_dtype, data_parallel=dp, expert_parallel=ep)
    budget, split = memory.kv_budget_bytes_per_stage, pipeline_split(engine.engine)
    layout = {"tensor_parallel": tp, "pipeline_parallel": pp, "block_size": engine.block_size, "split": split}
    stages = tuple(
        PipelineStage(first_layer=layers.start, layers=len(layers), weights_bytes_per_gpu=weights,
                      kv_budget_bytes_per_gpu=stage_budget, kv_blocks=blocks)
        for layers, weights, stage_budget, blocks in zip(
            pipeline_stages(model.num_hidden_layers, pp, split), memory.weights_bytes_per_stage, budget,
            stage_kv_blocks(model, budget, kv_dtype, **layout), strict=True))
    kv_tokens, kv_blocks = kv_token_capacity(model, budget, kv_dtype, **layout, data_parallel=dp)
    engine = with_running_limit(engine, kv_tokens // dp)  # one rank's pool: every rank holds as many blocks
    return _Deployment(
        engine, memory, kv_tokens, kv_blocks, requests_fitting(model, budget, engine.max_model_len, kv_dtype, **layout),
        kv_bytes_per_token_per_gpu(model, kv_dtype, tensor_parallel=tp, pipeline_parallel=pp),
        longest_context(model, budget, kv_dtype, max_model_len=engine.max_model_len, **layout), stages)


def _account(model: ModelSpec, gpu: GpuSpec, config: EngineConfig, *, tensor_parallel: int,
             pipeline_parallel: int, weight_dtype: str | WeightRecipe, kv_dtype: str, input_tokens: int,
             output_tokens: int, data_parallel: int = 1, expert_parallel: int = 1) -> _Accounting:
    """Memory and concurrency of a replica. With attention data parallelism each of the dp ranks is an
    engine of its own (its KV cache, its scheduler and max_num_seqs): one rank's figures, times dp."""
    tp, pp, dp = tensor_parallel, pipeline_parallel, data_parallel
    deployment = _deployment(model, gpu, config, tp, pp, weight_dtype, kv_dtype, dp, expert_parallel)
    engine, memory, budget = deployment.engine, deployment.memory, deployment.memory.kv_budget_bytes_per_stage
    layout = {"tensor_parallel": tp, "pipeline_parallel": pp, "block_size": engine.block_size,
              "split": pipeline_split(engine.engine)}
    request_tokens = input_tokens + output_tokens
    admission = requests_fitting(model, budget, request_tokens, kv_dtype, **layout)
    mean_bytes = steady_state_kv_bytes_per_stage(model, input_tokens, output_tokens, kv_dtype, **layout)
    # Each stage's budget over what one request holds there on average (Fraction division: an exact floor).
    steady = 0 if min(budget) <= 0 else min(int(b / held) for b, held in zip(budget, mean_bytes, strict=True))
    mean_live_tokens = float(max(mean_bytes) / deployment.per_token)  # full-attention-equivalent tokens

    def charged(tokens: int) -> float:
        """A request of `tokens` as the views charge it: its tokens; with window layers, full-attention-equivalent
        tokens as the steady state and kv_tokens count them (its block-rounded bytes on the most loaded stage over
        a token in every layer), which its tokens are not."""
        if not kv_breakpoints(model):
            return float(tokens)
        held = kv_cache_bytes_per_stage(model, (tokens,), kv_dtype, tp, pp, engine.block_size, layout["split"])
        return float(max(held) / deployment.per_token)

    concurrency = MaxConcurrency(
        worst_case=_capped(deployment.worst, engine.max_num_seqs, charged(engine.max_model_len), dp),
        admission=_capped(admission, engine.max_num_seqs, charged(request_tokens), dp),
        steady_state=_capped(steady, engine.max_num_seqs, mean_live_tokens, dp),
    )
    max_context, kv_tokens = deployment.max_context_tokens, deployment.kv_tokens
    reasons = _reasons(model, engine, memory, weight_dtype, tp, pp, request_tokens, kv_tokens, admission, max_context)
    return _Accounting(engine, memory, kv_tokens, deployment.kv_blocks, concurrency, max_context, reasons,
                       deployment.stages)


def _gb(value: float) -> str:
    return f"{value / 1e9:.1f} GB"


def _reasons(model: ModelSpec, engine: ResolvedEngine, memory: MemoryBudget, weight_dtype: str | WeightRecipe,
             tp: int, pp: int, request_tokens: int, kv_tokens: int, admission: int,
             max_context: int) -> tuple[str, ...]:
    gpus = f"{tp * pp} x {_gb(memory.total_bytes_per_gpu)} (TP{tp}, PP{pp})"
    if engine.gpu_memory_utilization <= 0:  # SGLang's default fraction with a large prefill chunk: it cannot start
        source = dict(engine.sources).get("gpu_memory_utilization", "the engine's default")
        reason = (f"{engine.engine} sets aside all of the GPU's memory: its memory fraction is "
                  f"{engine.gpu_memory_utilization:g} ({source}); give gpu_memory_utilization, or a smaller "
                  "max_num_batched_tokens")
        return (reason,)
    if memory.kv_budget_bytes_per_gpu <= 0:
        weights = f"weights need {_gb(weight_bytes(model, weight_dtype))} ({resolve_recipe(weight_dtype).name})"
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
    reasons.extend(ENGINES[engine.engine].start_refusals(engine.max_model_len, max_context, kv_tokens))
    return tuple(reasons)


def _layouts(model: ModelSpec, gpu: GpuSpec) -> list[tuple[int, int]]:
    """(tp, pp) layouts inside one node, fewest GPUs first, then the most tensor parallelism: tp a divisor of the
    attention heads, pp at most the layers, tp x pp at most the node's GPUs. Built from the divisors and the
    stages, at most (divisors of the heads) x (layers) of them whatever the node's size (a node of 100,000
    GPUs, which the GPU schema allows, took O(gpus²) steps counting them one GPU count at a time)."""
    heads, layers, node = model.num_attention_heads, model.num_hidden_layers, gpu.gpus_per_node
    degrees = [tp for tp in range(1, min(heads, node) + 1) if heads % tp == 0]
    pairs = [(tp, pp) for tp in degrees for pp in range(1, min(layers, node // tp) + 1)]
    return sorted(pairs, key=lambda pair: (pair[0] * pair[1], -pair[0]))


def _suggest(model: ModelSpec, gpu: GpuSpec, config: EngineConfig, *, tensor_parallel: int,
             pipeline_parallel: int, weight_dtype: str | WeightRecipe, kv_dtype: str, input_tokens: int,
             output_tokens: int) -> Suggestion | None:
    """Smallest layout in one node with the requested weights (dtype or recipe), else cheaper plain
    precisions (fp8, int4), each at its smallest layout. None when nothing fits (e.g. a request longer
    than max_model_len)."""
    requested = resolve_recipe(weight_dtype)
    bits = bits_per_value(requested.dtype) if requested.dtype in WEIGHT_DTYPES else 32
    candidates: list[str | WeightRecipe] = [weight_dtype]
    candidates += [d for d in CHEAPER_WEIGHT_DTYPES if bits_per_value(d) < bits]
    for index, stored in enumerate(candidates):
        recipe = resolve_recipe(stored)
        for tp, pp in _layouts(model, gpu):
            if (tp, pp, stored) == (tensor_parallel, pipeline_parallel, weight_dtype):
                continue
            if weight_bytes_per_gpu(model, stored, tp, pp, pipeline_split=pipeline_split(config.engine)) \
                    >= gpu.memory_bytes:
                continue  # cannot fit under any engine: skip the full accounting
            accounting = _account(model, gpu, config, tensor_parallel=tp, pipeline_parallel=pp,
                                  weight_dtype=stored, kv_dtype=kv_dtype, input_tokens=input_tokens,
                                  output_tokens=output_tokens)
            if accounting.reasons:
                continue
            running = accounting.max_concurrency.view(accounting.engine.running_view)
            change = f"TP{tp} x PP{pp} on {tp * pp} GPUs"
            if index:
                change += f" with {recipe.name} weights"
            return Suggestion(
                tensor_parallel=tp, pipeline_parallel=pp, weight_dtype=recipe.dtype, num_gpus=tp * pp,
                kv_tokens=accounting.kv_tokens, sequences=running.sequences,
                summary=f"{change} fits: {accounting.kv_tokens} KV tokens, {running.sequences} concurrent "
                        f"requests ({accounting.engine.running_view.replace('_', ' ')})",
            )
    return None


def capacity(model: ModelSpec, gpu: GpuSpec, *, tensor_parallel: int, pipeline_parallel: int,
             weight_dtype: str, kv_dtype: str, compute_dtype: str | None, engine: EngineConfig,
             input_tokens: int, output_tokens: int, efficiency: Efficiency,
             activation_dtype: str = "bf16", data_parallel: int = 1, expert_parallel: int = 1,
             weight_recipe: WeightRecipe | None = None, decode_only: bool = False,
             prefill_only: bool = False) -> CapacityResult:
    """How many concurrent requests of `input_tokens` + `output_tokens` fit, and how fast they go.

    `weight_recipe`, when given, decides the weight bytes and the step-time model's weight reads (each parameter
    group in its own format); `weight_dtype` then only the default compute precision. `decode_only`: the
    operating point of a disaggregated decode worker (`operating_point`); `prefill_only`: of a prefill worker;
    each under its engine's rules for its pool (`engines.host_adjusted`, prefill_pool and decode_pool). Impossible configurations are
    answers (fits False, reasons, a suggestion), not errors; only inconsistent input (TP not dividing the
    heads, PP above the layers, unknown dtypes, a compute precision the GPU lacks, max_model_len beyond the
    model) raises ValueError.
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
    Layout(tensor_parallel, pipeline_parallel, data_parallel, expert_parallel)  # its invariants
    compute_dtype = compute_dtype or default_compute_dtype(gpu, weight_dtype)
    if not gpu.peak_flops_per_s(compute_dtype):
        raise ValueError(f"{gpu.name or gpu.slug} has no {compute_dtype} tensor rate")
    stored: str | WeightRecipe = weight_recipe if weight_recipe is not None else weight_dtype
    shape = {"tensor_parallel": tensor_parallel, "pipeline_parallel": pipeline_parallel,
             "weight_dtype": stored, "kv_dtype": kv_dtype, "input_tokens": input_tokens,
             "output_tokens": output_tokens}
    accounting = _account(model, gpu, engine, **shape, data_parallel=data_parallel,
                          expert_parallel=expert_parallel)
    unsupported = gpu_problems(engine.engine, gpu)
    reasons = (*unsupported, *accounting.reasons)
    fits, point = not reasons, None
    if fits:
        view, resolved = accounting.engine.running_view, accounting.engine
        point = operating_point(
            model, gpu, batch_size=accounting.max_concurrency.view(view).sequences, concurrency_view=view,
            input_tokens=input_tokens, output_tokens=output_tokens, tensor_parallel=tensor_parallel,
            pipeline_parallel=pipeline_parallel, weight_dtype=stored, kv_dtype=kv_dtype, compute_dtype=compute_dtype,
            efficiency=host_adjusted(efficiency, resolved.engine, resolved.engine_version, pipeline_parallel,
                                     prefill_pool=prefill_only, decode_pool=decode_only, data_parallel=data_parallel,
                                     speculative=engine.speculative, vendor=gpu.vendor),
            activation_dtype=activation_dtype, max_num_batched_tokens=resolved.max_num_batched_tokens,
            data_parallel=data_parallel, expert_parallel=expert_parallel, decode_only=decode_only,
            moe_exchange=ENGINES[resolved.engine].moe_exchange)
    return CapacityResult(
        fits=fits,
        reasons=reasons,
        suggestion=None if fits or unsupported else _suggest(model, gpu, engine, **shape),
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
        weights_bytes_total=weight_bytes(model, stored),
        weight_groups_per_gpu=weight_groups_per_gpu(model, stored, tensor_parallel, pipeline_parallel,
                                                     expert_parallel, data_parallel, pipeline_split(engine.engine),
                                                     dense_over_attention_dp(engine.engine)),
        weight_groups_total=weight_groups_per_gpu(model, stored),
        pipeline_stages=accounting.stages,
    )

