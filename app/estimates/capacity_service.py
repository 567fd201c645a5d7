"""/v1/capacity: the engine's memory accounting, concurrency and speed of a deployment as a response; of
each pool and the KV transfer between them for a disaggregated one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session

from app.calibration.held_out_schemas import HeldOutErrorOut
from app.calibration.profiles import resolve_efficiency
from app.errors import Unprocessable
from app.estimates.capacity_schemas import (
    CapacityAssumptions,
    CapacityDisaggregationOut,
    CapacityRequest,
    CapacityResponse,
    ConcurrencyOut,
    EngineOut,
    MaxConcurrencyOut,
    MemoryOut,
    OperatingPointOut,
    PipelineStageOut,
    PoolCapacityOut,
    SuggestionOut,
    WeightGroupOut,
)
from app.estimates.inputs import (
    ResolvedPool,
    ResolvedPrecisions,
    check_parallelism,
    checkpoint_recipe,
    core_problem,
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
    served_dtype,
)
from app.estimates.schemas import DISAGGREGATED
from app.sizing import CALCULATION_VERSION
from app.sizing.engines import ENGINES, EngineConfig, resolve_version
from app.sizing.engines.base import ResolvedEngine
from app.sizing.engines.vllm import ACTIVATION_FIT
from app.sizing.hardware.efficiency import Efficiency
from app.sizing.layout import KIND_DISAGGREGATED, Layout
from app.sizing.model.recipes import WeightRecipe
from app.sizing.serving import capacity as capacity_core
from app.sizing.serving import disaggregation
from app.sizing.specs import KV_DTYPES, ModelSpec

# /v1/capacity

CAPACITY_FORMULAS = (
    ("per GPU: kv_budget = usable - weights - activation - overhead (non-torch + CUDA graphs + reserve); "
     "vllm and generic: usable = gpu_memory_utilization x total memory; sglang: mem_fraction_static x total "
     "holds weights + KV only; trtllm: KV = 0.9 x (total - weights - activation - overhead)"),
    (f"activation peak: vllm from 0.8 (V1) = {ACTIVATION_FIT.base_bytes / 2**30:.3f} GiB + max(max_num_batched_tokens "
     "x live values per token of one layer x model dtype bytes, max_num_seqs x vocab x (model dtype bytes + "
     f"{ACTIVATION_FIT.float32_bytes_per_logit:.1f} B of float32 copies per logit)) (fitted on vLLM 0.19 H100 "
     "runs); vllm before 0.8 and trtllm = 4.76 GiB (measured: Llama-3.1-8B, "
     "8192 batched tokens, TP1, H100) x batched tokens / 8192 x live values per token of one layer / 61,440 "
     "(that model's); live values per token: 2h + attention projections + 3 x MLP width, per GPU; MoE: k x "
     "(3 x expert width + h)"),
    ("KV blocks = kv_budget // (block_size x bytes per token in every layer of the most loaded GPU); window "
     "layers take only the blocks their window spans (vLLM's hybrid allocator); MLA's latent is not divided "
     "by TP"),
    ("worst case = requests of max_model_len; admission = requests of input + output (reserved up front); "
     "steady state = budget / mean KV of a request over its decode (input + t tokens, block-rounded, "
     "t = 1..output); each capped by max_num_seqs"),
    ("operating point: tpot = decode step (batch/(dp x pp) requests at mean context, all stages) + batch/dp x "
     "prefill / (pp x output), prefill = one prompt's: its chunks of max_num_batched_tokens, or 1/k of a step of "
     "the k = max_num_batched_tokens // input_tokens >= 2 whole prompts one step holds; tokens/s per user = 1/tpot, "
     "aggregate = batch/tpot, requests/s = aggregate/output"),
    ("attention data parallelism: each of the dp ranks keeps its own requests' KV at the per-GPU bytes of its "
     "tensor-parallel split (replica KV = dp x one rank's) and holds the attention weights, and the dense and "
     "shared-expert ones (sglang: split over all tp x dp GPUs, its TP group); routed experts are dealt to the "
     "expert-parallel ranks and split over tp x dp / ep GPUs"),
    ("MoE exchange per MoE layer (dp > 1): dispatch + combine, each alpha + bytes / link; ep > 1: k x "
     "(ep-1)/ep x hidden x 2 B per token / tp (each token to its experts: trtllm), without ep or in vllm "
     "(its default allgather_reducescatter): (dp-1) x hidden x 2 B per token; sglang (no a2a backend: every "
     "feed-forward block spans the tp x dp GPUs) gathers and scatters so around every layer, dense ones too; "
     "NVLink inside a node, the scale-out link across nodes. With dp = 1 (TP attention, with or without ep) every "
     "GPU already holds every token and the TP all-reduce sums the experts' outputs: no exchange"),
    ("TP beyond one node's GPUs: each all-reduce's ring leaves a node through all its GPUs' NICs (min(NVLink, "
     "GPUs per node x NIC) per GPU) and, by NCCL's ring model, its 2 x (nodes - 1) inter-node steps take the 2.7 us "
     "NET hop and its other 2 x (tp - nodes) steps the host's 1 us network overhead instead of a 0.6 us NVLink hop"),
)


DISAGGREGATED_CAPACITY_FORMULAS = (
    ("disaggregated: each pool's worker under the same engine accounting as an aggregated replica (ENGINES.md "
     "section 3 gives neither role memory defaults of its own); a prefill worker holds each prompt's KV "
     "(input_tokens) until its transfer completes, in-flight prompts = its KV blocks // the prompt's blocks; a "
     "decode worker holds prompt + answer (input + output) and times decode steps alone"),
    ("pool rates (no latency SLO): a prefill worker sustains dp x pp / prefill prompts/s (prefill: one prompt's, "
     "as in the operating point); a decode worker its operating point's requests/s; a pool = workers x a "
     "worker's; the deployment = the lower pool's (limited_by)"),
    ("KV transfer = latency + the prompt's KV on the most loaded decode GPU / per-GPU bandwidth: NVLink when both "
     "pools are one GPU type and all their GPUs fit one NVLink domain, else the scale-out network; latency "
     "11.8 us (NVLink) or 22.4 us (network), NCCL's model of one message"),
)


def plan_capacity(session: Session, request: CapacityRequest) -> CapacityResponse:
    """/v1/capacity: concurrency and speed of a deployment under its engine's memory accounting; for a
    disaggregated deployment, of each pool (`disaggregation.pool_capacity`) and the KV transfer between."""
    model, model_label = resolve_model(session, request)
    gpu, gpu_label = resolve_gpu(session, request)
    recipe, recipe_lines = checkpoint_recipe(model, model_label, request.weight_dtype, request.weight_recipe)
    pools, layout = None, None
    if request.deployment == DISAGGREGATED:
        pools = resolve_pools(session, model, request, gpu, gpu_label, request.engine, weights=recipe)
    else:
        layout = check_parallelism(model, request.tensor_parallel, request.pipeline_parallel,
                                   data_parallel=request.data_parallel, expert_parallel=request.expert_parallel,
                                   engine=request.engine, weights=recipe)
    if request.max_model_len is not None and request.max_model_len > model.max_position_embeddings:
        raise Unprocessable(
            f"max_model_len {request.max_model_len} exceeds the model's {model.max_position_embeddings} positions",
            errors=[("/body/max_model_len",
                     f"must be at most max_position_embeddings ({model.max_position_embeddings})")])
    engine = EngineConfig(
        engine=request.engine, engine_version=request.engine_version,
        gpu_memory_utilization=request.gpu_memory_utilization,
        reserved_bytes_per_gpu=request.reserved_bytes_per_gpu,
        activation_bytes_per_gpu=request.activation_bytes_per_gpu,
        non_torch_bytes_per_gpu=request.non_torch_bytes_per_gpu,
        cuda_graph_bytes_per_gpu=request.cuda_graph_bytes_per_gpu, max_num_seqs=request.max_num_seqs,
        max_num_batched_tokens=request.max_num_batched_tokens, block_size=request.block_size,
        max_model_len=request.max_model_len)
    kv_dtype, kv_source = request.kv_dtype, "given"
    if kv_dtype is None:
        version, _ = resolve_version(engine)
        # 'auto' caches in the dtype the model runs in: an fp32 checkpoint is served in bf16 (`served_dtype`).
        kv_dtype, kv_source = ENGINES[request.engine].kv_dtype(version, recipe, served_dtype(model))
        if kv_dtype not in KV_DTYPES:
            kv_dtype, kv_source = "bf16", f"{kv_source}; served in bf16"
    requested = request.model_copy(update={
        "weight_dtype": recipe.dtype if recipe is not None else request.weight_dtype, "kv_dtype": kv_dtype})
    arguments = {"engine": engine, "input_tokens": request.input_tokens, "output_tokens": request.output_tokens,
                 "weight_recipe": recipe}
    if pools is not None:
        return _disaggregated_capacity(session, request, model, model_label, pools, requested, kv_source, arguments,
                                       recipe_lines)
    assert layout is not None
    precisions = resolve_precisions(model, gpu, gpu_label, requested)
    efficiency, profile = resolve_efficiency(session, gpu, precisions.compute_dtype, request.calibration)
    try:
        result = capacity_core.capacity(
            model, gpu, tensor_parallel=layout.tensor_parallel, pipeline_parallel=layout.pipeline_parallel,
            data_parallel=layout.data_parallel, expert_parallel=layout.expert_parallel,
            efficiency=efficiency, **_precision_arguments(precisions), **arguments)
    except ValueError as exc:
        raise core_problem(exc) from None
    held_out = held_out_errors(session, request, request.calibration, request.engine).out(layout.kind, [gpu.slug])
    return _capacity_out(request, model_label, gpu_label, layout, result, precisions, efficiency, profile,
                         kv_source, CAPACITY_FORMULAS, held_out, recipe, recipe_lines)


def _disaggregated_capacity(session: Session, request: CapacityRequest, model: ModelSpec, model_label: str,
                            pools: tuple[ResolvedPool, ResolvedPool], requested: CapacityRequest, kv_source: str,
                            arguments: dict[str, Any], recipe_lines: Sequence[str]) -> CapacityResponse:
    """Each pool's workers under the engine's accounting (`disaggregation.pool_capacity`, each on its own GPU
    with its own precisions and efficiencies) and one prompt's KV transfer; one decode worker on top."""
    answers: list[tuple[disaggregation.PoolCapacity, ResolvedPrecisions, Efficiency, str]] = []
    for pool in pools:
        precisions = resolve_precisions(model, pool.gpu, pool.gpu_label, requested)
        efficiency, profile = resolve_efficiency(session, pool.gpu, precisions.compute_dtype, request.calibration)
        try:
            answer = disaggregation.pool_capacity(pool.role, model, pool.gpu, workers=pool.workers,
                                                  layout=pool.layout, efficiency=efficiency,
                                                  **_precision_arguments(precisions), **arguments)
        except ValueError as exc:
            raise core_problem(exc) from None
        answers.append((answer, precisions, efficiency, profile))
    prefill_pool, decode_pool = pools
    try:
        transfer = pools_kv_transfer(model, request.input_tokens, answers[1][1].kv_dtype, prefill_pool, decode_pool,
                                     request.engine)
    except ValueError as exc:
        raise core_problem(exc) from None
    (prefill, prefill_precisions, _, prefill_profile), (decode, precisions, efficiency, profile) = answers
    reasons = [f"{answer.role} pool: {reason}" for answer, *_ in answers for reason in answer.worker.reasons]
    held_out = held_out_errors(session, request, request.calibration, request.engine).out(
        KIND_DISAGGREGATED, [prefill_pool.gpu.slug, decode_pool.gpu.slug])
    top = _capacity_out(request, model_label, decode_pool.gpu_label, decode_pool.layout, decode.worker, precisions,
                        efficiency, profile, kv_source, (*CAPACITY_FORMULAS, *DISAGGREGATED_CAPACITY_FORMULAS),
                        held_out, arguments["weight_recipe"], recipe_lines)
    if prefill_pool.gpu != decode_pool.gpu:
        top.assumptions.defaults_used.append(
            f"prefill pool on {prefill_pool.gpu_label}: compute_dtype = {prefill_precisions.compute_dtype}, "
            f"calibration = {prefill_profile}")
    env = ENGINES[request.engine].disaggregation_env(transfer.link == disaggregation.NVLINK)
    if env:  # a setting the transfer assumes that the engine's defaults lack (SGLang's MNNVL across an NVL72)
        top.assumptions.defaults_used.append(
            f"KV transfer over {transfer.link} with {' '.join(env)} set for both pools' workers")
    pool_outs = _pool_capacity_out(prefill, prefill_pool), _pool_capacity_out(decode, decode_pool)
    rates = [(out.expected_requests_per_s, out.role) for out in pool_outs]
    rate, limited_by = min(rates) if all(value is not None for value, _ in rates) else (None, None)
    return top.model_copy(update={
        "fits": not reasons, "reasons": reasons, "deployment": DISAGGREGATED,
        "disaggregation": CapacityDisaggregationOut(
            prefill=pool_outs[0], decode=pool_outs[1], kv_transfer=kv_transfer_out(transfer),
            expected_requests_per_s=rate, limited_by=limited_by)})


def _precision_arguments(precisions: ResolvedPrecisions) -> dict[str, str]:
    return {"weight_dtype": precisions.weight_dtype, "kv_dtype": precisions.kv_dtype,
            "compute_dtype": precisions.compute_dtype, "activation_dtype": precisions.activation_dtype}


# Field names of the response models built from core results field by field (read once, not per request).
_SUGGESTION_FIELDS = tuple(SuggestionOut.model_fields)
_CONCURRENCY_VIEWS = tuple(MaxConcurrencyOut.model_fields)
_CONCURRENCY_FIELDS = tuple(ConcurrencyOut.model_fields)
_OPERATING_POINT_FIELDS = tuple(name for name in OperatingPointOut.model_fields if name != "users_at_think_time")


def _capacity_out(request: CapacityRequest, model_label: str, gpu_label: str, layout: Layout,
                  result: capacity_core.CapacityResult, precisions: ResolvedPrecisions, efficiency: Efficiency,
                  profile: str, kv_source: str, formulas: Sequence[str],
                  held_out_error: HeldOutErrorOut | None, recipe: WeightRecipe | None,
                  recipe_lines: Sequence[str]) -> CapacityResponse:
    """One replica's (or one decode worker's) capacity answer; `recipe`: the checkpoint's, given or the model's
    published one (`recipe_lines` say so), None for the plain dtype."""
    resolved = result.engine
    defaults = [*precisions.defaults_used, *recipe_lines]
    if request.kv_dtype is None:
        defaults.append(f"kv_dtype = {precisions.kv_dtype} ({kv_source})")
    if request.calibration is None:
        defaults.append(f"calibration = {profile}")
    defaults += [f"{name} = {getattr(resolved, name)} ({source})" for name, source in resolved.sources
                 if source != "given"]
    return CapacityResponse(
        model=model_label, gpu=gpu_label, tensor_parallel=layout.tensor_parallel,
        pipeline_parallel=layout.pipeline_parallel, data_parallel=layout.data_parallel,
        expert_parallel=layout.expert_parallel, moe_tensor_parallel=layout.moe_tensor_parallel,
        num_gpus=layout.gpus,
        input_tokens=request.input_tokens, output_tokens=request.output_tokens,
        fits=result.fits, reasons=list(result.reasons),
        suggestion=None if result.suggestion is None else SuggestionOut(
            **{name: getattr(result.suggestion, name) for name in _SUGGESTION_FIELDS}),
        memory=_memory_out(result),
        kv_bytes_per_token_per_gpu=result.kv_bytes_per_token_per_gpu, kv_tokens=result.kv_tokens,
        kv_blocks=result.kv_blocks,
        max_concurrency=MaxConcurrencyOut(**{
            view: _concurrency_out(getattr(result.max_concurrency, view)) for view in _CONCURRENCY_VIEWS}),
        max_context_tokens=result.max_context_tokens,
        operating_point=(None if result.operating_point is None
                         else _operating_point_out(result.operating_point, request.think_time_s)),
        engine=_engine_out(resolved),
        assumptions=CapacityAssumptions(
            weight_dtype=precisions.weight_dtype,
            weight_recipe=recipe_out(recipe, precisions.weight_dtype),
            kv_dtype=precisions.kv_dtype, kv_dtype_source=kv_source,
            compute_dtype=precisions.compute_dtype, activation_dtype=precisions.activation_dtype,
            efficiency=efficiency_out(efficiency, profile), formulas=list(formulas),
            defaults_used=defaults, held_out_error=held_out_error),
        calculation_version=CALCULATION_VERSION,
    )


def _pool_capacity_out(answer: disaggregation.PoolCapacity, pool: ResolvedPool) -> PoolCapacityOut:
    worker, layout, point = answer.worker, answer.layout, answer.worker.operating_point
    per_worker = None if point is None else (
        point.expected_prefill_requests_per_s if answer.role == disaggregation.PREFILL_POOL
        else point.expected_requests_per_s)
    return PoolCapacityOut(
        role=answer.role, gpu=pool.gpu_label, tensor_parallel=layout.tensor_parallel,
        pipeline_parallel=layout.pipeline_parallel, data_parallel=layout.data_parallel,
        expert_parallel=layout.expert_parallel, moe_tensor_parallel=layout.moe_tensor_parallel, layout=layout.label,
        workers=answer.workers, gpus_per_worker=layout.gpus,
        gpus=answer.gpus, fits=worker.fits, reasons=list(worker.reasons), memory=_memory_out(worker),
        kv_bytes_per_token_per_gpu=worker.kv_bytes_per_token_per_gpu, kv_tokens_per_worker=worker.kv_tokens,
        kv_blocks_per_worker=worker.kv_blocks, tokens_per_request=answer.tokens_per_request,
        requests_per_worker=_concurrency_out(answer.requests_per_worker),
        requests=answer.requests_per_worker.sequences * answer.workers,
        expected_requests_per_s_per_worker=per_worker,
        expected_requests_per_s=None if per_worker is None else per_worker * answer.workers,
        engine=_engine_out(worker.engine))


def _memory_out(result: capacity_core.CapacityResult) -> MemoryOut:
    memory = result.memory
    return MemoryOut(
        total_bytes_per_gpu=memory.total_bytes_per_gpu, usable_bytes_per_gpu=memory.usable_bytes_per_gpu,
        weights_bytes_per_gpu=memory.weights_bytes_per_gpu,
        activation_bytes_per_gpu=memory.activation_bytes_per_gpu,
        overhead_bytes_per_gpu=memory.overhead_bytes_per_gpu,
        non_torch_bytes_per_gpu=memory.non_torch_bytes_per_gpu,
        cuda_graph_bytes_per_gpu=memory.cuda_graph_bytes_per_gpu,
        reserved_bytes_per_gpu=memory.reserved_bytes_per_gpu,
        kv_budget_bytes_per_gpu=memory.kv_budget_bytes_per_gpu, weights_bytes_total=result.weights_bytes_total,
        kv_budget_per_gpu=human_size(memory.kv_budget_bytes_per_gpu),
        weights_total=human_size(result.weights_bytes_total),
        weight_groups_per_gpu=[WeightGroupOut(group=g.group, format=g.format, params=g.params, bytes=g.bytes)
                               for g in result.weight_groups_per_gpu],
        pipeline_stages=[PipelineStageOut(**{name: getattr(stage, name) for name in PipelineStageOut.model_fields})
                         for stage in result.pipeline_stages])


def _concurrency_out(view: capacity_core.ConcurrencyView) -> ConcurrencyOut:
    return ConcurrencyOut(**{name: getattr(view, name) for name in _CONCURRENCY_FIELDS})


def _engine_out(resolved: ResolvedEngine) -> EngineOut:
    return EngineOut(
        engine=resolved.engine, engine_version=resolved.engine_version,
        total_bytes_per_gpu=resolved.total_bytes_per_gpu,
        gpu_memory_utilization=resolved.gpu_memory_utilization,
        utilization_of=resolved.utilization_of, max_num_seqs=resolved.max_num_seqs,
        max_num_batched_tokens=resolved.max_num_batched_tokens, block_size=resolved.block_size,
        max_model_len=resolved.max_model_len, kv_allocation=resolved.kv_allocation,
        sources=dict(resolved.sources))


def _operating_point_out(point: capacity_core.OperatingPoint, think_time_s: float | None) -> OperatingPointOut:
    """The core's seconds as milliseconds: `x_ms` is `x_s` x 1000; other fields carry over; with a think time, the
    users the point carries: those being answered (the batch) and those thinking (the rate x the pause)."""
    return OperatingPointOut(**{
        name: getattr(point, name[:-3] + "_s") * 1e3 if name.endswith("_ms") else getattr(point, name)
        for name in _OPERATING_POINT_FIELDS}, users_at_think_time=(
            None if think_time_s is None else point.batch_size + point.expected_requests_per_s * think_time_s))


