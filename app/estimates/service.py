"""/v1/kv-cache, /v1/roofline and /v1/roofline/batch-sweep: the core's answers as responses (/v1/capacity:
capacity_service.py)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from sqlalchemy.orm import Session

from app.calibration.held_out_schemas import HeldOutErrorOut
from app.calibration.profiles import resolve_efficiency
from app.errors import Unprocessable
from app.estimates.inputs import (
    ResolvedPool,
    ResolvedPrecisions,
    check_parallelism,
    checkpoint_recipe,
    core_problem,
    default_kv_dtype,
    efficiency_out,
    held_out_errors,
    human_size,
    kv_transfer_out,
    pools_kv_transfer,
    recipe_out,
    resolve_gpu,
    resolve_model,
    resolve_pools,
    resolve_precisions,
    sequence_warnings,
)
from app.estimates.schemas import (
    DEFAULT_SWEEP_BATCH_SIZES,
    DISAGGREGATED,
    AttentionTraffic,
    BatchSweepPoint,
    BatchSweepRequest,
    BatchSweepResponse,
    KvAssumptions,
    KvCacheRequest,
    KvCacheResponse,
    KvCurve,
    KvCurvePointOut,
    KvLayerGroupOut,
    KvSizesForPeople,
    OperatorOut,
    PoolStepOut,
    RooflineAssumptions,
    RooflineDisaggregationOut,
    RooflineRequest,
    RooflineResponse,
)
from app.sizing import CALCULATION_VERSION
from app.sizing.engines import host_adjusted, total_memory
from app.sizing.hardware.efficiency import Efficiency
from app.sizing.hardware.roofline import (
    COMPUTE,
    MEMORY,
    knee_batch_size,
    ridge_point,
    roofline,
)
from app.sizing.hardware.step_time import build_step_time_model
from app.sizing.layout import KIND_DISAGGREGATED, Layout
from app.sizing.model.flops import ATTENTION, DECODE, PREFILL, decode_cost, prefill_cost, score_matrix_bytes
from app.sizing.model.kv import (
    KvCacheSize,
    kv_breakpoints,
    kv_bytes_per_token_per_layer,
    kv_cache_size,
    kv_curve,
    mha_equivalent_bytes_per_sequence,
)
from app.sizing.model.params import ceil_div
from app.sizing.model.recipes import WeightRecipe
from app.sizing.model.weights import weight_bytes_per_gpu
from app.sizing.serving.disaggregation import first_token_s
from app.sizing.specs import GpuSpec, ModelSpec, bits_per_value

# /v1/kv-cache

KV_FORMULAS = (
    ("MHA/GQA/MQA: 2 (K and V) x ceil(num_key_value_heads / tp) x head_dim x bytes per value, per token per "
     "layer per GPU (KV heads are replicated when tp > num_key_value_heads)"),
    ("MLA: (kv_lora_rank + qk_rope_head_dim) x bytes per value per token per layer: one latent, replicated on "
     "every tensor-parallel rank"),
    "window layers (sliding or chunked attention of w tokens) cache min(context, w) tokens",
    ("paged: each layer holds whole blocks, ceil(context / block) x block tokens; a window layer the blocks its "
     "window can straddle, ceil((w - 1) / block) + 1"),
    ("per sequence = sum over layers of bytes per token x tokens cached; total = per sequence x batch; "
     "per GPU = the most loaded pipeline stage's layers at tp"),
)


def kv_cache(session: Session, request: KvCacheRequest) -> KvCacheResponse:
    """/v1/kv-cache: the KV cache of `batch_size` sequences of `context_tokens`, explained."""
    model, label = resolve_model(session, request)
    check_parallelism(model, request.tensor_parallel, request.pipeline_parallel)
    defaults = []
    if request.kv_dtype is not None:
        kv_dtype, kv_source = request.kv_dtype, "requested"
    else:
        kv_dtype, why = default_kv_dtype(model)
        kv_source = f"default: {why}"
        defaults.append(f"kv_dtype = {kv_dtype} ({why})")
    context, batch = request.context_tokens, request.batch_size
    try:
        size = kv_cache_size(model, context, kv_dtype, request.tensor_parallel, request.pipeline_parallel,
                             request.block_size)
        unpaged = size if request.block_size is None else kv_cache_size(model, context, kv_dtype)
        mha_equivalent = mha_equivalent_bytes_per_sequence(model, context, kv_dtype)
        per_gpu_per_token_per_layer = kv_bytes_per_token_per_layer(model, 0, kv_dtype, request.tensor_parallel)
        curve = _kv_curve(model, kv_dtype, context)
    except ValueError as exc:
        raise core_problem(exc) from None
    total = size.bytes_per_sequence * batch
    # All sequences have the same length, so the most loaded GPU holds `batch` times one sequence's share.
    per_gpu = size.bytes_per_sequence_per_gpu * batch
    return KvCacheResponse(
        model=label, kv_dtype=kv_dtype, context_tokens=context, tokens_cached_per_sequence=size.tokens_cached_max,
        batch_size=batch, tensor_parallel=request.tensor_parallel, pipeline_parallel=request.pipeline_parallel,
        block_size=request.block_size,
        bytes_per_sequence=size.bytes_per_sequence, total_bytes=total,
        bytes_per_sequence_per_gpu=size.bytes_per_sequence_per_gpu, bytes_per_gpu=per_gpu,
        bytes_per_token=size.bytes_per_sequence / context,
        breakdown=[KvLayerGroupOut(kind=group.kind, window_tokens=group.window, layers=group.layers,
                                   bytes_per_token_per_layer=group.bytes_per_token_per_layer,
                                   tokens_cached=group.tokens_cached, bytes_per_sequence=group.bytes)
                   for group in size.groups],
        formula=_kv_formula(model, kv_dtype, size, batch, request.tensor_parallel, request.pipeline_parallel,
                            per_gpu_per_token_per_layer),
        sizes_for_people=KvSizesForPeople(bytes_per_sequence=human_size(size.bytes_per_sequence),
                                          total_bytes=human_size(total), bytes_per_gpu=human_size(per_gpu)),
        mha_equivalent_bytes_per_sequence=mha_equivalent,
        mha_saving_ratio=1 - unpaged.bytes_per_sequence / mha_equivalent,
        curve=curve,
        warnings=sequence_warnings(model, context, "context_tokens"),
        assumptions=KvAssumptions(kv_dtype=kv_dtype, kv_dtype_source=kv_source, formulas=list(KV_FORMULAS),
                                  defaults_used=defaults),
        calculation_version=CALCULATION_VERSION,
    )


def _kv_formula(model: ModelSpec, kv_dtype: str, size: KvCacheSize, batch: int, tensor_parallel: int,
                pipeline_parallel: int, per_gpu_per_token_per_layer: int) -> str:
    """The arithmetic of this answer, in words."""
    value_bytes = int(bits_per_value(kv_dtype)) // 8
    logical = size.groups[0].bytes_per_token_per_layer
    if model.is_mla:
        per_token = (f"({model.kv_lora_rank} kv_lora_rank + {model.qk_rope_head_dim} qk_rope_head_dim) x "
                     f"{value_bytes} bytes ({kv_dtype}) = {logical:,} B (one latent, no factor 2)")
    else:
        per_token = (f"2 (K and V) x {model.num_key_value_heads} KV heads x {model.resolved_head_dim} head_dim x "
                     f"{value_bytes} bytes ({kv_dtype}) = {logical:,} B")
    groups = "; ".join(
        f"{group.layers} {group.kind} layers"
        + (f" (window {group.window:,})" if group.window is not None else "")
        + f" x {group.bytes_per_token_per_layer:,} B x {group.tokens_cached:,} tokens = {group.bytes:,} B"
        for group in size.groups)
    parts = [f"per token per layer: {per_token}", f"per sequence: {groups}"]
    if len(size.groups) > 1:
        parts.append(f"sum {size.bytes_per_sequence:,} B per sequence")
    if size.block_size is not None:
        parts.append(f"paged in blocks of {size.block_size} tokens")
    parts.append(f"x {batch:,} sequences = {size.bytes_per_sequence * batch:,} B")
    if tensor_parallel > 1:
        if model.is_mla:
            parts.append(f"under TP{tensor_parallel} the latent is replicated on every GPU: "
                         f"{per_gpu_per_token_per_layer:,} B per token per layer per GPU")
        else:
            kv_heads = ceil_div(model.num_key_value_heads, tensor_parallel)
            replicated = " (KV heads replicated)" if tensor_parallel > model.num_key_value_heads else ""
            parts.append(f"under TP{tensor_parallel} each GPU holds ceil({model.num_key_value_heads}/{tensor_parallel})"
                         f" = {kv_heads} KV heads{replicated}: {per_gpu_per_token_per_layer:,} B per token per layer")
    if pipeline_parallel > 1:
        parts.append(f"the most loaded of {pipeline_parallel} pipeline stages holds "
                     f"{size.bytes_per_sequence_per_gpu:,} B per sequence per GPU")
    return "; ".join(parts)


def _kv_curve(model: ModelSpec, kv_dtype: str, context_tokens: int) -> KvCurve | None:
    """Windowed models: bytes per sequence (unpaged) at 0, every window, the requested context and the
    model's maximum context; linear between points."""
    breakpoints = kv_breakpoints(model)
    if not breakpoints:
        return None
    end = max(context_tokens, model.max_position_embeddings, breakpoints[-1] + 1)
    points = kv_curve(model, kv_dtype, sorted({0, *breakpoints, context_tokens, end}))
    bytes_at = dict(points)
    edges = [0, *breakpoints, end]
    segments = []
    for start, stop in itertools.pairwise(edges):
        slope = (bytes_at[stop] - bytes_at[start]) // (stop - start)
        segments.append(f"{start:,}-{stop:,} tokens: {slope:,} B per token" if stop != end
                        else f"beyond {start:,} tokens: {slope:,} B per token")
    note = ("No single bytes-per-token slope: window layers stop growing at their window. "
            + "; ".join(segments) + ". Points are unpaged; interpolate linearly between them.")
    return KvCurve(points=[KvCurvePointOut(context_tokens=c, bytes_per_sequence=b) for c, b in points],
                   breakpoints_tokens=list(breakpoints), note=note)


# /v1/roofline and /v1/roofline/batch-sweep

ROOFLINE_FORMULAS = (
    "ideal time = max(FLOPs / peak FLOP/s, bytes / HBM bandwidth), per GPU of the tensor-parallel group",
    ("expected time = sum over operators of max(FLOPs / (peak x compute fraction at this step's tokens), "
     "bytes / (bandwidth x bandwidth fraction)) + 2 all-reduces per layer under TP (alpha + 2(tp-1)/tp x "
     "message / link bandwidth; across nodes the link is min(NVLink, GPUs per node x NIC) and alpha adds "
     "NCCL's multi-node ring: 2 x (nodes - 1) steps at 2.7 us instead of 0.6, the other 2 x (tp - nodes) at "
     "1 us instead of 0.6) + per-step and per-layer overhead"),
    ("linear layers: 2 FLOPs per weight per token; attention: 2 x heads x (qk width + v width) FLOPs per "
     "attended position; prefill is causal: n new tokens after p cached attend n x (p + (n+1)/2) positions"),
    "LM head: 2 x hidden x vocab FLOPs per sampled position (the last prompt token in prefill)",
    ("MoE: FLOPs of the k active experts per token; bytes of the E x (1 - (1 - k/E)^T) distinct experts the "
     "step's T tokens touch"),
    ("bytes: weights once per step + the KV of every attended cached token + the new tokens' KV + "
     "activations; FlashAttention keeps the score matrix on chip"),
    "arithmetic intensity = FLOPs / bytes; ridge point = peak FLOP/s / HBM bandwidth; below it: memory-bound",
)
KNEE_FORMULA = (
    "knee: smallest batch B whose ideal decode step is compute-bound: B x (t x bw - s) >= W + X x D(B), with t "
    "one sequence's compute time at peak, s its own bytes (KV, activations), W the weights read once per step, "
    "X one routed expert's bytes and D(B) the distinct experts touched; none when t x bw <= s. Under expert "
    "parallelism the most loaded rank's routed tokens are B times a load factor that falls with B: the smallest "
    "compute-bound B is searched on the roofline instead"
)
ATTENTION_TRAFFIC_NOTE = (
    "HBM bytes of this step's attention on one GPU. FlashAttention tiles Q, K and V through on-chip SRAM, so "
    "the score matrix (heads x new tokens x attended tokens per layer) never reaches HBM; naive attention "
    "writes it and reads it back. Same FLOPs, less data moved."
)


def roofline_step(session: Session, request: RooflineRequest) -> RooflineResponse:
    """/v1/roofline: one prefill or decode step on one GPU of the tensor-parallel group (of one attention
    data-parallel rank, whose `batch_size` sequences every rank matches); disaggregated, the prefill pool's
    step of one prompt and the decode pool's step at `batch_size`, and the KV transfer between them."""
    model, model_label = resolve_model(session, request)
    gpu, gpu_label = resolve_gpu(session, request)
    if request.deployment == DISAGGREGATED:
        return _disaggregated_roofline(session, request, model, model_label, gpu, gpu_label)
    layout = check_parallelism(model, request.tensor_parallel, data_parallel=request.data_parallel,
                               expert_parallel=request.expert_parallel)
    assert request.phase is not None  # RooflineRequest requires it unless disaggregated
    held_out = held_out_errors(session, request, request.calibration, None).out(layout.kind, [gpu.slug])
    return _roofline_answer(session, request, model, model_label, gpu, gpu_label, layout, request.phase,
                            request.batch_size, request.prompt_tokens, request.context_tokens, held_out=held_out)


def _roofline_answer(session: Session, request: RooflineRequest, model: ModelSpec, model_label: str, gpu: GpuSpec,
                     gpu_label: str, layout: Layout, phase: str, batch_size: int, prompt_tokens: int | None,
                     context_tokens: int | None, defaults_used: Sequence[str] = (),
                     held_out: HeldOutErrorOut | None = None) -> RooflineResponse:
    """One step of `phase` on `gpu` with `layout`, as /v1/roofline answers it, with the `held_out` errors of
    predictions like it."""
    recipe, weight_lines = checkpoint_recipe(model, model_label, request.weight_dtype, request.weight_recipe)
    precisions = resolve_precisions(model, gpu, gpu_label, request if recipe is None else
                                    request.model_copy(update={"weight_dtype": recipe.dtype}))
    weights = recipe or precisions.weight_dtype
    efficiency, profile = resolve_efficiency(session, gpu, precisions.compute_dtype, request.calibration)
    defaults = [*precisions.defaults_used, *weight_lines, *defaults_used]
    if request.calibration is None:
        defaults.append(f"calibration = {profile}")
    cached = context_tokens or 0
    new_tokens = prompt_tokens if phase == PREFILL else 1
    assert new_tokens is not None  # RooflineRequest requires prompt_tokens for prefill
    if phase == PREFILL and context_tokens is None:
        defaults.append("context_tokens = 0 (no cached prefix)")
    tp = layout.tensor_parallel
    dtypes = {"weight_dtype": weights, "kv_dtype": precisions.kv_dtype,
              "activation_dtype": precisions.activation_dtype, "tensor_parallel": tp,
              "data_parallel": layout.data_parallel, "expert_parallel": layout.expert_parallel}
    try:
        if phase == PREFILL:
            cost = prefill_cost(model, new_tokens, cached, batch_size, **dtypes)
        else:
            cost = decode_cost(model, cached, batch_size, **dtypes)
        result = roofline(cost, gpu, precisions.compute_dtype, efficiency, tp, model)
        # A decode step is a one-token prefill after the cached context: naive attention adds its scores.
        score_bytes = score_matrix_bytes(model, new_tokens, cached, batch_size, **dtypes)
    except ValueError as exc:
        raise core_problem(exc) from None
    flash_bytes = cost.operator(ATTENTION).bytes
    naive_bytes = flash_bytes + score_bytes
    return RooflineResponse(
        model=model_label, gpu=gpu_label, phase=phase, batch_size=batch_size,
        prompt_tokens=prompt_tokens if phase == PREFILL else None, context_tokens=cached, tensor_parallel=tp,
        data_parallel=layout.data_parallel, expert_parallel=layout.expert_parallel, tokens=result.tokens,
        compute_dtype=precisions.compute_dtype,
        flops=result.flops, bytes=result.bytes, arithmetic_intensity=result.arithmetic_intensity,
        ridge_point=result.ridge_point, bound=result.bound,
        compute_time_ms=result.compute_time_s * 1e3, memory_time_ms=result.memory_time_s * 1e3,
        ideal_time_ms=result.ideal_time_s * 1e3, expected_time_ms=result.expected_time_s * 1e3,
        comm_time_ms=result.comm_time_s * 1e3, overhead_time_ms=result.overhead_time_s * 1e3,
        ideal_tokens_per_s=result.ideal_tokens_per_s, expected_tokens_per_s=result.expected_tokens_per_s,
        operators=[
            OperatorOut(name=op.name, flops=op.flops, bytes=op.bytes,
                        arithmetic_intensity=op.arithmetic_intensity if math.isfinite(op.arithmetic_intensity)
                        else None,
                        bound=op.bound, ideal_time_ms=op.ideal_time_s * 1e3, expected_time_ms=op.expected_time_s * 1e3)
            for op in result.operators
        ],
        attention_traffic=AttentionTraffic(flash_bytes=flash_bytes, naive_bytes=naive_bytes,
                                           score_matrix_bytes=score_bytes,
                                           naive_to_flash_ratio=naive_bytes / flash_bytes,
                                           note=ATTENTION_TRAFFIC_NOTE),
        warnings=sequence_warnings(model, cached + new_tokens, "The sequence (context_tokens + this step's "
                                                              "new tokens)"),
        assumptions=_roofline_assumptions(precisions, recipe, efficiency, profile, ROOFLINE_FORMULAS, defaults, held_out),
        calculation_version=CALCULATION_VERSION,
    )


DISAGGREGATED_ROOFLINE_FORMULA = (
    "disaggregated: the prefill pool prefills one prompt of prompt_tokens alone, the decode pool decodes "
    "batch_size sequences of context_tokens; KV transfer = latency + the prompt's KV on the most loaded decode GPU "
    "/ per-GPU bandwidth (NVLink when both pools are one GPU type and all their GPUs fit one NVLink domain, else "
    "the scale-out network); ttft = prefill step + transfer + decode step"
)


def _disaggregated_roofline(session: Session, request: RooflineRequest, model: ModelSpec, model_label: str,
                            gpu: GpuSpec, gpu_label: str) -> RooflineResponse:
    """Both pools' steps (`_roofline_answer` per pool) and the KV transfer; the decode pool's step on top."""
    prefill_pool, decode_pool = resolve_pools(session, model, request, gpu, gpu_label)
    for pool in (prefill_pool, decode_pool):
        if pool.layout.pipeline_parallel > 1:
            raise Unprocessable(
                f"{pool.role} pool: /v1/roofline times one step of a tensor-parallel group, without pipeline "
                "stages", errors=[(f"/body/{pool.role}/pipeline_parallel",
                                   "must be 1 here (/v1/capacity sizes pipeline-parallel pools)")])
    prompt = request.prompt_tokens
    assert prompt is not None  # RooflineRequest requires it with deployment disaggregated
    context = prompt if request.context_tokens is None else request.context_tokens
    prefill = _roofline_answer(session, request, model, model_label, prefill_pool.gpu, prefill_pool.gpu_label,
                               prefill_pool.layout, PREFILL, 1, prompt, 0)
    defaults = [] if request.context_tokens is not None else [
        f"context_tokens = {prompt} (prompt_tokens: the decode pool's first step after the transfer)"]
    held_out = held_out_errors(session, request, request.calibration, None).out(
        KIND_DISAGGREGATED, [prefill_pool.gpu.slug, decode_pool.gpu.slug])
    decode = _roofline_answer(session, request, model, model_label, decode_pool.gpu, decode_pool.gpu_label,
                              decode_pool.layout, DECODE, request.batch_size, None, context, defaults, held_out)
    try:
        transfer = pools_kv_transfer(model, prompt, decode.assumptions.kv_dtype, prefill_pool, decode_pool)
    except ValueError as exc:
        raise core_problem(exc) from None
    if prefill_pool.gpu != decode_pool.gpu:
        decode.assumptions.defaults_used.append(
            f"prefill pool on {prefill_pool.gpu_label}: compute_dtype = {prefill.compute_dtype}, calibration = "
            f"{prefill.assumptions.efficiency.calibration_profile}")
    decode.assumptions.formulas.append(DISAGGREGATED_ROOFLINE_FORMULA)
    return decode.model_copy(update={"deployment": DISAGGREGATED, "disaggregation": RooflineDisaggregationOut(
        prefill=_pool_step_out(prefill, prefill_pool), decode=_pool_step_out(decode, decode_pool),
        kv_transfer=kv_transfer_out(transfer),
        ttft_ms=first_token_s(prefill.expected_time_ms / 1e3, transfer.time_s, decode.expected_time_ms / 1e3) * 1e3)})


def _pool_step_out(step: RooflineResponse, pool: ResolvedPool) -> PoolStepOut:
    own = {"role": pool.role, "workers": pool.workers, "gpus": pool.gpus,
           "moe_tensor_parallel": pool.layout.moe_tensor_parallel, "layout": pool.layout.stage_label}
    return PoolStepOut(**own, **{name: getattr(step, name) for name in PoolStepOut.model_fields if name not in own})


def _roofline_assumptions(precisions: ResolvedPrecisions, recipe: WeightRecipe | None, efficiency: Efficiency,
                          profile: str, formulas: Sequence[str], defaults: Sequence[str],
                          held_out: HeldOutErrorOut | None) -> RooflineAssumptions:
    return RooflineAssumptions(
        weight_dtype=precisions.weight_dtype, weight_recipe=recipe_out(recipe, precisions.weight_dtype),
        kv_dtype=precisions.kv_dtype, compute_dtype=precisions.compute_dtype,
        activation_dtype=precisions.activation_dtype,
        efficiency=efficiency_out(efficiency, profile), formulas=list(formulas), defaults_used=list(defaults),
        held_out_error=held_out,
    )


@dataclass(frozen=True, slots=True)
class DecodeSweep:
    """Decode step times of one deployment at several batch sizes (seconds, one entry per batch)."""

    batch_sizes: tuple[int, ...]
    ideal_step_time_s: tuple[float, ...]
    expected_step_time_s: tuple[float, ...]
    knee_batch_size: int | None

    def bound(self, batch_size: int) -> str:
        # Compute-boundness is monotone in the batch (knee_batch_size's docstring: proved without expert parallelism,
        # taken so and checked by the tests with it), so the knee decides it.
        return COMPUTE if self.knee_batch_size is not None and batch_size >= self.knee_batch_size else MEMORY


def decode_batch_sweep(model: ModelSpec, gpu: GpuSpec, context_tokens: int, batch_sizes: Sequence[int], *,
                       weight_dtype: str | WeightRecipe, kv_dtype: str, compute_dtype: str, activation_dtype: str,
                       tensor_parallel: int, efficiency: Efficiency, data_parallel: int = 1,
                       expert_parallel: int = 1) -> DecodeSweep:
    """The batch-sweep's pure calculation: every batch evaluated at once by the vectorized step-time
    model (which reproduces roofline(decode_cost(...)) for a uniform batch), plus the knee (`knee_batch_size`:
    solved, or searched under expert parallelism). With attention data parallelism a batch is one rank's
    sequences, every rank decoding as many."""
    layout = {"tensor_parallel": tensor_parallel, "data_parallel": data_parallel, "expert_parallel": expert_parallel}
    step_model = build_step_time_model(model, gpu, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                                       compute_dtype=compute_dtype, activation_dtype=activation_dtype,
                                       efficiency=host_adjusted(efficiency, None),  # the GPU's time: no engine loop
                                       **layout)
    sequences = np.asarray(batch_sizes, dtype=float)
    contexts = sequences * context_tokens
    ideal = np.atleast_1d(step_model.ideal_step_time_s(sequences, contexts, 0, 0))
    expected = np.atleast_1d(step_model.step_time_s(sequences, contexts, 0, 0))
    knee = knee_batch_size(model, gpu, context_tokens, weight_dtype, kv_dtype, compute_dtype,
                           activation_dtype=activation_dtype, **layout)
    return DecodeSweep(tuple(batch_sizes), tuple(ideal.tolist()), tuple(expected.tolist()), knee)


def batch_sweep(session: Session, request: BatchSweepRequest) -> BatchSweepResponse:
    """/v1/roofline/batch-sweep: decode step time and throughput against batch size, and the knee."""
    model, model_label = resolve_model(session, request)
    gpu, gpu_label = resolve_gpu(session, request)
    tp = request.tensor_parallel
    layout = check_parallelism(model, tp, data_parallel=request.data_parallel,
                               expert_parallel=request.expert_parallel)
    ranks = {"data_parallel": layout.data_parallel, "expert_parallel": layout.expert_parallel}
    recipe, weight_lines = checkpoint_recipe(model, model_label, request.weight_dtype, request.weight_recipe)
    precisions = resolve_precisions(model, gpu, gpu_label, request if recipe is None else
                                    request.model_copy(update={"weight_dtype": recipe.dtype}))
    weights = recipe or precisions.weight_dtype
    efficiency, profile = resolve_efficiency(session, gpu, precisions.compute_dtype, request.calibration)
    defaults = [*precisions.defaults_used, *weight_lines]
    if request.calibration is None:
        defaults.append(f"calibration = {profile}")
    if request.batch_sizes is None:
        defaults.append("batch_sizes = " + ", ".join(str(b) for b in DEFAULT_SWEEP_BATCH_SIZES))
    batch_sizes = sorted(set(request.batch_sizes or DEFAULT_SWEEP_BATCH_SIZES))
    context = request.context_tokens
    try:
        sweep = decode_batch_sweep(
            model, gpu, context, batch_sizes, weight_dtype=weights, kv_dtype=precisions.kv_dtype,
            compute_dtype=precisions.compute_dtype, activation_dtype=precisions.activation_dtype,
            tensor_parallel=tp, efficiency=efficiency, **ranks)
        weight_bytes = weight_bytes_per_gpu(model, weights, tp, **ranks)
        # The KV each sequence holds once this step has written its token.
        kv_per_sequence = kv_cache_size(model, context + 1, precisions.kv_dtype, tp).bytes_per_sequence_per_gpu
        explanation = _knee_explanation(model, gpu, context, sweep, precisions, layout, efficiency,
                                        weights, weight_bytes, kv_per_sequence)
    except ValueError as exc:
        raise core_problem(exc) from None
    points = []
    for batch, ideal, expected in zip(sweep.batch_sizes, sweep.ideal_step_time_s, sweep.expected_step_time_s,
                                      strict=True):
        kv = kv_per_sequence * batch
        points.append(BatchSweepPoint(
            batch_size=batch, bound=sweep.bound(batch),
            ideal_step_time_ms=ideal * 1e3, expected_step_time_ms=expected * 1e3,
            ideal_tokens_per_s=batch / ideal, expected_tokens_per_s=batch / expected,
            ideal_tokens_per_s_per_user=1 / ideal, expected_tokens_per_s_per_user=1 / expected,
            kv_bytes_per_gpu=kv, weights_and_kv_bytes_per_gpu=weight_bytes + kv,
            fits_in_gpu_memory=weight_bytes + kv <= total_memory(gpu)[0],
        ))
    return BatchSweepResponse(
        model=model_label, gpu=gpu_label, context_tokens=context, tensor_parallel=tp, **ranks,
        compute_dtype=precisions.compute_dtype, ridge_point=ridge_point(gpu, precisions.compute_dtype),
        points=points, knee_batch_size=sweep.knee_batch_size, knee_explanation=explanation,
        warnings=sequence_warnings(model, context + 1, "The sequence (context_tokens + the decoded token)"),
        assumptions=_roofline_assumptions(
            precisions, recipe, efficiency, profile, (*ROOFLINE_FORMULAS, KNEE_FORMULA), defaults,
            held_out_errors(session, request, request.calibration, None).out(layout.kind, [gpu.slug])),
        calculation_version=CALCULATION_VERSION,
    )


def _knee_explanation(model: ModelSpec, gpu: GpuSpec, context_tokens: int, sweep: DecodeSweep,
                      precisions: ResolvedPrecisions, layout: Layout, efficiency: Efficiency,
                      weights: str | WeightRecipe, weight_bytes: int, kv_per_sequence: int) -> str:
    knee = sweep.knee_batch_size
    if knee is not None:
        rank = " on each attention data-parallel rank" if layout.data_parallel > 1 else ""
        text = (f"From {knee:,} sequences{rank} on, the ideal decode step is compute-bound: the weight read, paid once "
                "per step, is shared by enough sequences that their FLOPs outlast the step's memory traffic. Below "
                "the knee the step is memory-bound and each added sequence costs only its own KV and activation "
                "traffic.")
        total, _ = total_memory(gpu)
        if weight_bytes + knee * kv_per_sequence > total:
            text += (f" But {knee:,} sequences of {context_tokens:,} tokens need "
                     f"{knee * kv_per_sequence / 1e9:,.1f} GB of KV cache per GPU next to the weights, more than "
                     f"the GPU's {total / 1e9:,.1f} GB (its total as CUDA reports it, where the catalog has it): "
                     "KV memory caps the batch before the compute roof does.")
        return text
    # Why never: compare what one more sequence adds to the ideal step's compute and memory times.
    one, two = (
        roofline(decode_cost(model, context_tokens, batch, weights, precisions.kv_dtype,
                             precisions.activation_dtype, layout.tensor_parallel, layout.data_parallel,
                             layout.expert_parallel),
                 gpu, precisions.compute_dtype, efficiency)
        for batch in (1, 2))
    added_compute = two.compute_time_s - one.compute_time_s
    added_memory = two.memory_time_s - one.memory_time_s
    return (f"None: at {context_tokens:,} tokens of context every added sequence brings its own KV cache reads, "
            f"adding {added_memory * 1e6:,.2f} us of memory traffic but only {added_compute * 1e6:,.2f} us of "
            "compute at peak to the ideal step, so memory time grows faster than compute time and decode stays "
            "memory-bound at any batch size. Shorter contexts, a quantized KV cache or fewer KV heads bring the "
            "knee back.")
