"""The request pieces every sizing endpoint shares (model and GPU references, parallelism, precisions,
efficiencies), turned into specs and dtypes with 404/422 problems that name the field."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from sqlalchemy.orm import Session

from app.calibration.profiles import HeldOutErrors, cross_validation
from app.catalog.schemas import (
    gpu_spec_from_schema,
    model_spec_from_schema,
)
from app.catalog.service import get_gpu_spec, get_model_hf_id, get_model_spec
from app.errors import Unprocessable
from app.estimates.schemas import (
    ComputeCurvePoint,
    EfficiencyOut,
    GpuRef,
    HumanSize,
    KvTransferOut,
    ModelRef,
    PoolsRef,
    Precisions,
)
from app.sizing.engines import layout_problems
from app.sizing.hardware.efficiency import Efficiency
from app.sizing.hardware.roofline import (
    default_compute_dtype,
)
from app.sizing.layout import Layout
from app.sizing.model.recipes import (
    RECIPES,
    SIXTEEN_BIT_OR_WIDER,
    WeightRecipe,
    published_recipe,
    uniform_recipe,
)
from app.sizing.model.weights import weight_groups_per_gpu
from app.sizing.serving.disaggregation import KvTransfer, deployment_link, kv_transfer
from app.sizing.serving.plan import DECODE_POOL, PREFILL_POOL
from app.sizing.specs import COMPUTE_DTYPES, WEIGHT_DTYPES, GpuSpec, ModelSpec

# Sizing endpoints: /v1/kv-cache, /v1/roofline, /v1/roofline/batch-sweep ------------------
#
# `resolve_model`, `resolve_gpu`, `check_parallelism` and `resolve_precisions` turn the shared
# request pieces (app.estimates.schemas) into specs and dtypes, with 404/422 problems that name the
# field; every sizing endpoint can reuse them.

INLINE_MODEL_LABEL = "model_spec (inline)"
INLINE_GPU_LABEL = "gpu_spec (inline)"
SIXTEEN_BIT_DTYPES = ("bf16", "fp16")


def resolve_model(session: Session, ref: ModelRef) -> tuple[ModelSpec, str]:
    """The request's model as a spec, and how responses name it (its slug, or the inline label)."""
    if ref.model_spec is not None:
        return model_spec_from_schema(ref.model_spec, pointer="/body/model_spec"), INLINE_MODEL_LABEL
    assert ref.model is not None  # ModelRef guarantees exactly one of the two
    return get_model_spec(session, ref.model), ref.model


def resolve_gpu(session: Session, ref: GpuRef) -> tuple[GpuSpec, str]:
    """The request's GPU as a spec, and how responses name it (its slug, or the inline spec's name)."""
    if ref.gpu_spec is not None:
        return gpu_spec_from_schema(ref.gpu_spec, pointer="/body/gpu_spec"), ref.gpu_spec.name or INLINE_GPU_LABEL
    assert ref.gpu is not None  # GpuRef guarantees exactly one of the two
    return get_gpu_spec(session, ref.gpu), ref.gpu


def check_parallelism(model: ModelSpec, tensor_parallel: int, pipeline_parallel: int = 1, *,
                      data_parallel: int = 1, expert_parallel: int = 1, engine: str | None = None,
                      pointer: str = "/body", weights: WeightRecipe | None = None) -> Layout:
    """The request's layout, or a 422 naming every rule it breaks (`app.sizing.layout`, and the engine's own
    for the checkpoint's recipe `weights`)."""
    try:
        layout = Layout(tensor_parallel, pipeline_parallel, data_parallel, expert_parallel)
    except ValueError as exc:
        raise Unprocessable(str(exc), errors=[(f"{pointer}/expert_parallel", str(exc))]) from None
    problems = layout_problems(model, layout, engine, weights=weights)
    if problems:
        raise Unprocessable("; ".join(problem.rule for problem in problems),
                            errors=[(f"{pointer}/{problem.field}", problem.rule) for problem in problems])
    return layout


@dataclass(frozen=True, slots=True)
class ResolvedPool:
    """One pool of a disaggregated request: its GPU (and how answers name it), one worker's layout, workers."""

    role: str  # PREFILL_POOL or DECODE_POOL
    gpu: GpuSpec
    gpu_label: str
    layout: Layout
    workers: int

    @property
    def gpus(self) -> int:
        return self.workers * self.layout.gpus


def resolve_pools(session: Session, model: ModelSpec, request: PoolsRef, gpu: GpuSpec, gpu_label: str,
                  engine: str | None = None, weights: WeightRecipe | None = None) -> tuple[ResolvedPool, ResolvedPool]:
    """(prefill, decode) pools of a disaggregated request: each pool's GPU (404 naming the pool's gpu when
    the catalog lacks it; null = the request's `gpu`, `gpu_label`) and layout (422 naming the pool's field
    that breaks a rule of the model or of `engine`, for the checkpoint's recipe `weights`)."""
    pools = []
    for role in (PREFILL_POOL, DECODE_POOL):
        pool = getattr(request, role)
        assert pool is not None  # PoolsRef requires both pools with deployment disaggregated
        pointer = f"/body/{role}"
        pool_gpu, label = ((get_gpu_spec(session, pool.gpu, f"{pointer}/gpu"), pool.gpu) if pool.gpu is not None
                           else (gpu, gpu_label))
        layout = check_parallelism(model, pool.tensor_parallel, pool.pipeline_parallel,
                                   data_parallel=pool.data_parallel, expert_parallel=pool.expert_parallel,
                                   engine=engine, pointer=pointer, weights=weights)
        pools.append(ResolvedPool(role, pool_gpu, label, layout, pool.workers))
    return pools[0], pools[1]


def pools_kv_transfer(model: ModelSpec, prompt_tokens: int, kv_dtype: str, prefill: ResolvedPool,
                      decode: ResolvedPool, engine: str | None = None) -> KvTransfer:
    """One prompt's KV moved from a prefill worker to a decode worker over the link the pools have, as `engine`
    moves it (None: engine-neutral, `disaggregation.transfer_link`)."""
    link, bandwidth, latency = deployment_link(prefill.gpu, prefill.gpus, decode.gpu, decode.gpus, engine)
    return kv_transfer(model, prompt_tokens, kv_dtype, decode_tensor_parallel=decode.layout.tensor_parallel,
                       decode_pipeline_parallel=decode.layout.pipeline_parallel, link=link,
                       bandwidth_bytes_per_s=bandwidth, latency_s=latency)


def kv_transfer_out(transfer: KvTransfer) -> KvTransferOut:
    return KvTransferOut(
        link=transfer.link, mean_prompt_tokens=transfer.prompt_tokens, bytes_per_request=transfer.bytes_per_request,
        bytes_per_gpu=transfer.bytes_per_gpu, bandwidth_bytes_per_s=transfer.bandwidth_bytes_per_s,
        latency_ms=transfer.latency_s * 1e3, time_ms=transfer.time_s * 1e3)


def sequence_warnings(model: ModelSpec, sequence_tokens: int, what: str) -> list[str]:
    """A warning when a sequence is longer than the model's positions. vLLM's max_model_len defaults
    to max_position_embeddings and refuses more (unless VLLM_ALLOW_LONG_MAX_MODEL_LEN is set; vLLM
    config `_get_and_verify_max_len`); the arithmetic itself still holds."""
    limit = model.max_position_embeddings
    if sequence_tokens <= limit:
        return []
    return [(f"{what} is {sequence_tokens:,} tokens, beyond the model's max_position_embeddings ({limit:,}): "
             f"serving engines refuse such sequences (vLLM's max_model_len stops at {limit:,}) and the model was "
             "not trained on them; the figures extrapolate the formulas")]


def default_kv_dtype(model: ModelSpec) -> tuple[str, str]:
    """The KV dtype engines use unless told otherwise ("auto": the model's 16-bit dtype), and why.

    Quantized checkpoints (fp8, int8, int4, fp4 weights) still compute and cache in bf16: KV
    quantization is a separate, opt-in switch.
    """
    if model.dtype in SIXTEEN_BIT_DTYPES:
        return model.dtype, "the model's dtype"
    return "bf16", (f"the model's weights are {model.dtype}, but activations and the KV cache stay 16-bit "
                    "unless KV quantization is asked for")


@dataclass(frozen=True, slots=True)
class ResolvedPrecisions:
    weight_dtype: str
    kv_dtype: str
    compute_dtype: str
    activation_dtype: str  # activations and 16-bit operands (attention, LM head, router)
    defaults_used: tuple[str, ...]  # one line per precision that was not given


def served_dtype(model: ModelSpec) -> str:
    """The weight dtype a request that names none serves: the model's published dtype (an fp32 checkpoint is
    served in bf16)."""
    return model.dtype if model.dtype in WEIGHT_DTYPES else "bf16"


def published_checkpoint(model: ModelSpec, weight_dtype: str | None) -> tuple[WeightRecipe | None, list[str]]:
    """What `weight_dtype` weights of `model` (None: the dtype it serves) are where the request names no
    checkpoint recipe: the recipe of the model's one published checkpoint in that dtype
    (`recipes.published_recipe`: gpt-oss in fp4 is OpenAI's MXFP4 experts with bf16 attention) and the
    defaults_used line that says so; where the plain dtype stands for the weights, None and, for a quantized dtype,
    the line saying how it is stored (which fp4, what scales: a checkpoint's own format may differ)."""
    dtype = weight_dtype or served_dtype(model)
    recipe = published_recipe(model.slug, dtype)
    if recipe is None:
        if dtype in SIXTEEN_BIT_OR_WIDER:
            return None, []
        storage = (f"weight storage = {uniform_recipe(dtype).description} (the plain {dtype} dtype; a published "
                   "checkpoint's own format may differ)")
        return None, [storage]
    line = f"weight_recipe = {recipe.name} (the model's one published {dtype} checkpoint: {recipe.description})"
    return recipe, [line]


def checkpoint_recipe(model: ModelSpec, model_label: str, weight_dtype: str | None,
                      name: str | None) -> tuple[WeightRecipe | None, list[str]]:
    """The recipe a request's weights follow and the defaults_used lines that say why: the `weight_recipe` it
    names (`name`), else `published_checkpoint` of its `weight_dtype`. 422 on a recipe that stores none of the
    model's weights in its dtype (the groups it quantizes are absent), or on a `weight_dtype` that contradicts
    the recipe's."""
    if name is None:  # the model's one published checkpoint of the dtype (gpt-oss in fp4), else the plain dtype
        return published_checkpoint(model, weight_dtype)
    recipe = RECIPES[name]
    stored = {group.format for group in weight_groups_per_gpu(model, recipe) if group.params}
    if recipe.dtype not in SIXTEEN_BIT_OR_WIDER and stored <= set(SIXTEEN_BIT_OR_WIDER):
        raise Unprocessable(
            f"weight_recipe {recipe.name} quantizes none of {model_label}'s weights ({recipe.description}): "
            f"every one would stay {', '.join(sorted(stored))}, not {recipe.dtype}",
            errors=[("/body/weight_recipe", (f"{recipe.name} stores no group {model_label} has in {recipe.dtype}: "
                                             "choose a recipe for this model, or a weight_dtype"))])
    if weight_dtype not in (None, recipe.dtype):
        raise Unprocessable(
            f"weight_dtype {weight_dtype} contradicts weight_recipe {recipe.name} ({recipe.dtype})",
            errors=[("/body/weight_dtype", f"leave it null or set {recipe.dtype} with weight_recipe {recipe.name}")])
    return recipe, []


def recipe_out(recipe: WeightRecipe | None, weight_dtype: str) -> str:
    """How answers name the recipe the weight bytes follow: `recipe`, else the plain `weight_dtype`'s."""
    followed = recipe if recipe is not None else uniform_recipe(weight_dtype)
    return f"{followed.name}: {followed.description} ({followed.source})"


def resolve_precisions(model: ModelSpec, gpu: GpuSpec, gpu_label: str, requested: Precisions) -> ResolvedPrecisions:
    """Fill each precision the request left null, and 422 on a compute dtype the GPU cannot run."""
    defaults = []
    weight_dtype = requested.weight_dtype
    if weight_dtype is None:
        weight_dtype = served_dtype(model)
        defaults.append(f"weight_dtype = {weight_dtype} (the model's published dtype)" if weight_dtype == model.dtype
                        else f"weight_dtype = bf16 (the model's {model.dtype} weights, served in bf16)")
    kv_dtype = requested.kv_dtype
    if kv_dtype is None:
        kv_dtype, why = default_kv_dtype(model)
        defaults.append(f"kv_dtype = {kv_dtype} ({why})")
    available = [dtype for dtype in COMPUTE_DTYPES if gpu.peak_flops_per_s(dtype)]
    compute_dtype = requested.compute_dtype
    if compute_dtype is None:
        try:
            compute_dtype = default_compute_dtype(gpu, weight_dtype)
        except ValueError as exc:
            raise Unprocessable(str(exc), errors=[("/body/compute_dtype", f"choose one of {available}")]) from None
        why = ("the weights' precision, which the GPU has a tensor rate for" if compute_dtype == weight_dtype
               else f"the GPU has no {weight_dtype} tensor rate: {weight_dtype} weights compute at its "
                    f"{compute_dtype} rate")
        defaults.append(f"compute_dtype = {compute_dtype} ({why})")
    elif not gpu.peak_flops_per_s(compute_dtype):
        raise Unprocessable(
            f"{gpu_label} has no {compute_dtype} tensor rate",
            errors=[("/body/compute_dtype", f"{gpu_label} cannot compute in {compute_dtype}; it has {available}")])
    if compute_dtype in SIXTEEN_BIT_DTYPES:
        activation_dtype = compute_dtype
    else:
        activation_dtype = "bf16" if gpu.peak_flops_per_s("bf16") or not gpu.peak_flops_per_s("fp16") else "fp16"
    return ResolvedPrecisions(weight_dtype, kv_dtype, compute_dtype, activation_dtype, tuple(defaults))


def held_out_errors(session: Session, request: ModelRef, calibration: str | None,
                    engine: str | None) -> HeldOutErrors:
    """The held-out errors of the request's model (and `engine`: None where the answer names none) under the
    cross-validation of its `calibration` profile (None: the default); an inline model has no family."""
    model_id = None if request.model is None else get_model_hf_id(session, request.model)
    return HeldOutErrors(cross_validation(session, calibration), model_id, engine)


@lru_cache(maxsize=256)
def efficiency_out(efficiency: Efficiency, profile: str) -> EfficiencyOut:
    """The efficiency as responses echo it; built once per (efficiency, profile) and shared by the responses
    that nest it (a nested model is kept, not copied, and nothing mutates a response)."""
    return EfficiencyOut(
        calibration_profile=profile,
        bandwidth_fraction_ratio=efficiency.bandwidth_fraction,
        compute_curve=[ComputeCurvePoint(tokens=tokens, compute_fraction_ratio=fraction)
                       for tokens, fraction in efficiency.compute_curve],
        compute_scale_ratio=efficiency.compute_scale,
        # Rounded to the nanosecond: seconds -> ms conversion noise (7.5e-6 s -> 0.007500000000000001 ms).
        per_step_overhead_ms=round(efficiency.per_step_overhead_s * 1e3, 6),
        per_layer_overhead_ms=round(efficiency.per_layer_overhead_s * 1e3, 6),
        allreduce_latency_ms=round(efficiency.allreduce_latency_s * 1e3, 6),
        pcie_link_fraction_ratio=efficiency.pcie_link_fraction,
        per_sequence_overhead_ms=round(efficiency.per_sequence_overhead_s * 1e3, 6),
        serial_step_overhead_ms=round(efficiency.serial_step_s * 1e3, 6),
        overlapped_host_per_sequence_ms=round(efficiency.overlapped_host_per_sequence_s * 1e3, 6),
        prefill_moe_layer_overhead_ms=round(efficiency.prefill_moe_layer_overhead_s * 1e3, 6),
        decode_worker_step_overhead_ms=round(efficiency.decode_worker_step_overhead_s * 1e3, 6),
        source=efficiency.source,
    )


def human_size(size_bytes: int) -> HumanSize:
    return HumanSize(gb=round(size_bytes / 1e9, 6), gib=round(size_bytes / 2**30, 6))


def core_problem(exc: ValueError) -> Unprocessable:
    """A combination the request checks let through but the core rejects: still the client's input."""
    return Unprocessable(str(exc), errors=[("/body", str(exc))])


