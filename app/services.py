"""Orchestration: catalog reads and writes, the spec cache, and HF config import.

Sizing endpoints get domain specs through `get_model_spec`, `get_gpu_spec` and
`list_gpu_specs`; an unknown slug raises `NotFound` (a 404 problem).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

import numpy as np
from pydantic import BaseModel, ValidationError
from sqlalchemy import ColumnElement
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from sqlalchemy.orm.exc import StaleDataError

from app import repository
from app.catalog import (
    architecture_kind,
    attention_kind,
    gpu_spec_from_record,
    model_spec_from_record,
    reference_slugs,
)
from app.errors import Conflict, NotFound, PreconditionFailed, Unprocessable, json_pointer
from app.hf_config import ConfigError, normalize_hf_config
from app.orm import ORIGIN_USER, GpuRecord, ModelRecord
from app.profiles import resolve_efficiency
from app.schemas.capacity import (
    CapacityAssumptions,
    CapacityRequest,
    CapacityResponse,
    ConcurrencyOut,
    EngineOut,
    MaxConcurrencyOut,
    MemoryOut,
    OperatingPointOut,
    SuggestionOut,
)
from app.schemas.catalog import (
    GpuIn,
    GpuOut,
    ModelImport,
    ModelIn,
    ModelOut,
    gpu_spec_from_schema,
    model_spec_from_schema,
)
from app.schemas.sizing import (
    DEFAULT_SWEEP_BATCH_SIZES,
    AttentionTraffic,
    BatchSweepPoint,
    BatchSweepRequest,
    BatchSweepResponse,
    ComputeCurvePoint,
    EfficiencyOut,
    GpuRef,
    HumanSize,
    KvAssumptions,
    KvCacheRequest,
    KvCacheResponse,
    KvCurve,
    KvCurvePointOut,
    KvLayerGroupOut,
    KvSizesForPeople,
    ModelRef,
    OperatorOut,
    Precisions,
    RooflineAssumptions,
    RooflineRequest,
    RooflineResponse,
)
from app.schemas.slo_plan import (
    CandidatesIn,
    HistogramLengths,
    InfeasibleOut,
    LaunchOut,
    LoadPerReplicaOut,
    LognormalLengths,
    ParetoPointOut,
    PercentilesOut,
    PlanAssumptionsOut,
    PlanOut,
    PredictionOut,
    SearchOut,
    SloPlanAssumptions,
    SloPlanRequest,
    SloPlanResponse,
    SpeculativeIn,
    WorkloadIn,
)
from app.sizing import CALCULATION_VERSION
from app.sizing.engines import EngineConfig
from app.sizing.engines.base import LaunchSpec
from app.sizing.engines.launch import launch_command
from app.sizing.hardware.efficiency import Efficiency
from app.sizing.hardware.roofline import (
    COMPUTE,
    MEMORY,
    default_compute_dtype,
    knee_batch_size,
    ridge_point,
    roofline,
)
from app.sizing.hardware.step_time import build_step_time_model
from app.sizing.model.flops import ATTENTION, PREFILL, decode_cost, prefill_cost
from app.sizing.model.kv import (
    KvCacheSize,
    kv_breakpoints,
    kv_bytes_per_token_per_layer,
    kv_cache_size,
    kv_curve,
    mha_equivalent_bytes_per_sequence,
)
from app.sizing.model.params import ceil_div
from app.sizing.model.weights import weight_bytes_per_gpu
from app.sizing.serving import capacity as capacity_core
from app.sizing.serving import plan as plan_core
from app.sizing.serving.speculative import SpeculativeDecoding
from app.sizing.serving.workload import Fixed, Histogram, LengthDistribution, LogNormal, Workload
from app.sizing.specs import COMPUTE_DTYPES, WEIGHT_DTYPES, GpuSpec, ModelSpec, bits_per_value

# Representations and ETags ---------------------------------------------------------------


def representation(model: BaseModel) -> bytes:
    """The canonical JSON body of a response: sorted keys, no spaces, UTF-8."""
    return json.dumps(model.model_dump(mode="json"), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode()


def etag_of(model: BaseModel) -> str:
    """Strong ETag of a representation. It covers slug, version and every field, so any write
    (which bumps the version and updated_at) changes it."""
    return '"' + hashlib.sha256(representation(model)).hexdigest()[:32] + '"'


@dataclass(frozen=True, slots=True)
class Preconditions:
    """Parsed If-Match / If-None-Match headers: None = header absent; ("*",) = any version."""

    if_match: tuple[str, ...] | None = None
    if_none_match: tuple[str, ...] | None = None

    def check(self, current_etag: str | None) -> None:
        """Raise PreconditionFailed unless the stored row (None = absent) satisfies them."""
        if self.if_match is not None:
            if current_etag is None:
                raise PreconditionFailed("If-Match was sent but the row does not exist")
            # Strong comparison (RFC 9110 13.1.1): weak tags never match.
            if "*" not in self.if_match and current_etag not in self.if_match:
                raise PreconditionFailed("The row changed since you read it (stale If-Match ETag); "
                                         "GET it again and reapply your change")
        if self.if_none_match is not None and current_etag is not None and (
                "*" in self.if_none_match or current_etag in self.if_none_match):
            raise PreconditionFailed("The row already exists (If-None-Match)")


# Spec cache ------------------------------------------------------------------------------

class SpecCache:
    """Domain specs built from catalog rows, valid for one catalog revision.

    Each lookup reads the one-row revision counter (bumped in the same transaction as every
    catalog write, by any replica) and drops everything when it moved.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._revision: int | None = None
        self._specs: dict[tuple[str, str], Any] = {}

    def get(self, revision: int, key: tuple[str, str]) -> Any | None:
        with self._lock:
            if revision != self._revision:
                self._specs.clear()
                self._revision = revision
            return self._specs.get(key)

    def put(self, revision: int, key: tuple[str, str], spec: Any) -> None:
        with self._lock:
            if revision == self._revision:
                self._specs[key] = spec


def _spec_cache(session: Session) -> SpecCache:
    # The application's session factory puts one cache into every session's info.
    return session.info.setdefault("spec_cache", SpecCache())


def _cached(session: Session, key: tuple[str, str], build: Any) -> Any:
    cache = _spec_cache(session)
    revision = repository.catalog_revision(session)
    spec = cache.get(revision, key)
    if spec is None:
        spec = build()
        cache.put(revision, key, spec)
    return spec


def get_model_spec(session: Session, slug: str) -> ModelSpec:
    def build() -> ModelSpec:
        return model_spec_from_record(_record_or_404(session, MODELS, slug))

    return _cached(session, ("model", slug), build)


def get_gpu_spec(session: Session, slug: str) -> GpuSpec:
    def build() -> GpuSpec:
        return gpu_spec_from_record(_record_or_404(session, GPUS, slug))

    return _cached(session, ("gpu", slug), build)


def list_gpu_specs(session: Session) -> list[GpuSpec]:
    """Every catalog GPU as a spec, ordered by slug."""
    def build() -> tuple[GpuSpec, ...]:
        return tuple(gpu_spec_from_record(record) for record in repository.all_rows(session, GpuRecord))

    return list(_cached(session, ("gpus", "*"), build))


# Catalog reads and writes ----------------------------------------------------------------

OutT = TypeVar("OutT", GpuOut, ModelOut)


@dataclass(frozen=True)
class CatalogKind(Generic[OutT]):
    """What differs between the GPU and the model catalogs."""

    name: str  # "gpu" | "model": messages and tombstones
    record: type[GpuRecord | ModelRecord]
    out: type[OutT]
    path: str  # collection URL

    def to_out(self, record: Any) -> OutT:
        return self.out.model_validate(record, from_attributes=True)


GPUS = CatalogKind("gpu", GpuRecord, GpuOut, "/v1/gpus")
MODELS = CatalogKind("model", ModelRecord, ModelOut, "/v1/models")


def _record_or_404(session: Session, kind: CatalogKind[Any], slug: str) -> Any:
    record = repository.get(session, kind.record, slug)
    if record is None:
        raise NotFound(f"No {kind.name} with slug {slug!r} in the catalog")
    return record


def read_one(session: Session, kind: CatalogKind[OutT], slug: str) -> OutT:
    return kind.to_out(_record_or_404(session, kind, slug))


def read_page(session: Session, kind: CatalogKind[OutT], filters: Sequence[ColumnElement[bool]],
              limit: int, offset: int) -> tuple[list[OutT], int]:
    records, total = repository.page(session, kind.record, filters, limit, offset)
    return [kind.to_out(record) for record in records], total


def gpu_filters(vendor: str | None, family: str | None) -> list[ColumnElement[bool]]:
    filters = []
    if vendor is not None:
        filters.append(repository.equals_ignoring_case(GpuRecord.vendor, vendor))
    if family is not None:
        filters.append(repository.equals_ignoring_case(GpuRecord.family, family))
    return filters


def model_filters(architecture: str | None, attention: str | None) -> list[ColumnElement[bool]]:
    filters = []
    if architecture is not None:
        filters.append(ModelRecord.architecture == architecture)
    if attention is not None:
        filters.append(ModelRecord.attention_type == attention)
    return filters


def gpu_columns(slug: str, body: GpuIn) -> dict[str, Any]:
    gpu_spec_from_schema(body, pointer="/body", slug=slug)  # cross-field invariants -> 422
    return body.model_dump()


def model_columns(slug: str, body: ModelIn, pointer: str = "/body") -> dict[str, Any]:
    spec = model_spec_from_schema(body, pointer=pointer, slug=slug, name=body.name)
    return {**body.model_dump(), "architecture": architecture_kind(spec), "attention_type": attention_kind(spec)}


def put(session: Session, kind: CatalogKind[OutT], slug: str, columns: dict[str, Any],
        preconditions: Preconditions) -> tuple[OutT, bool]:
    """Create or replace a row (origin 'user'); returns the stored row and whether it was created."""
    record = repository.get(session, kind.record, slug)
    preconditions.check(None if record is None else etag_of(kind.to_out(record)))
    now = datetime.now(UTC)
    created = record is None
    if record is None:
        record = kind.record(slug=slug, **columns, origin=ORIGIN_USER, created_at=now, updated_at=now)
        session.add(record)
        repository.remove_tombstone(session, kind.name, slug)
    else:
        for column, value in columns.items():
            setattr(record, column, value)
        record.origin = ORIGIN_USER
        record.updated_at = now
    _flush_or_conflict(session, kind, slug)
    repository.bump_catalog_revision(session)
    return kind.to_out(record), created


def delete(session: Session, kind: CatalogKind[Any], slug: str, preconditions: Preconditions) -> None:
    record = _record_or_404(session, kind, slug)
    preconditions.check(etag_of(kind.to_out(record)))
    if slug in reference_slugs(kind.name):
        # Remember the deletion, or the next reference load would bring the row back.
        repository.add_tombstone(session, kind.name, slug, datetime.now(UTC))
    session.delete(record)
    _flush_or_conflict(session, kind, slug)
    repository.bump_catalog_revision(session)


def _flush_or_conflict(session: Session, kind: CatalogKind[Any], slug: str) -> None:
    try:
        session.flush()
    except StaleDataError:
        # The UPDATE/DELETE carried `WHERE version = <version read>` and matched nothing:
        # another writer got there first. Exactly one of two racing writers wins.
        raise PreconditionFailed(f"The {kind.name} {slug!r} was changed by another writer; "
                                 "GET it again and reapply your change") from None
    except IntegrityError:
        raise Conflict(f"The {kind.name} {slug!r} was created by another writer at the same time") from None


# Hugging Face config import --------------------------------------------------------------

IMPORT_SOURCE = "Imported from a Hugging Face config.json"


def import_model(session: Session, slug: str, config: object, *, dry_run: bool,
                 preconditions: Preconditions) -> tuple[ModelImport, bool]:
    """Normalize a raw config.json to the catalog shape; store it unless `dry_run`.

    Returns the result and whether a new row was created.
    """
    try:
        normalized = normalize_hf_config(config)
    except ConfigError as exc:
        raise Unprocessable(
            f"The config cannot be read as a model architecture ({len(exc.problems)} problems)",
            errors=[("/body" + pointer, message) for pointer, message in exc.problems],
        ) from None
    fields = {name: list(value) if isinstance(value, tuple) else value
              for name, value in normalized.fields.items() if name not in ("name", "slug")}
    hf_id = config.get("_name_or_path") if isinstance(config, dict) else None
    hf_id = hf_id if isinstance(hf_id, str) and 0 < len(hf_id) <= 200 and "\x00" not in hf_id else ""
    remarks = [*normalized.defaults_applied, *normalized.notes]
    try:
        body = ModelIn.model_validate({
            **fields,
            "name": normalized.fields.get("name") or hf_id or slug,
            "hf_id": hf_id,
            "source": IMPORT_SOURCE + (f" ({hf_id})" if hf_id else ""),
            "notes": "\n".join(remarks),
        })
    except ValidationError as exc:
        raise Unprocessable(
            "The config's values are out of range for a model architecture",
            errors=[(json_pointer(("body", *error["loc"])), error["msg"]) for error in exc.errors()],
        ) from None
    columns = model_columns(slug, body)
    version = None
    created = False
    if not dry_run:
        stored, created = put(session, MODELS, slug, columns, preconditions)
        version = stored.version
    result = ModelImport(
        slug=slug, stored=not dry_run, version=version, model=body,
        architecture=columns["architecture"], attention_type=columns["attention_type"],
        defaults_applied=list(normalized.defaults_applied), notes=list(normalized.notes),
    )
    return result, created


# Sizing endpoints: /v1/kv-cache, /v1/roofline, /v1/roofline/batch-sweep ------------------
#
# `resolve_model`, `resolve_gpu`, `check_parallelism` and `resolve_precisions` turn the shared
# request pieces (app.schemas.sizing) into specs and dtypes, with 404/422 problems that name the
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


def check_parallelism(model: ModelSpec, tensor_parallel: int, pipeline_parallel: int = 1) -> None:
    """422 unless tp splits the attention heads evenly and pp gives every stage a layer."""
    heads = model.num_attention_heads
    if heads % tensor_parallel:
        raise Unprocessable(
            f"tensor_parallel {tensor_parallel} does not divide the model's {heads} attention heads",
            errors=[("/body/tensor_parallel", f"must divide num_attention_heads ({heads})")])
    layers = model.num_hidden_layers
    if pipeline_parallel > layers:
        raise Unprocessable(
            f"pipeline_parallel {pipeline_parallel} exceeds the model's {layers} layers",
            errors=[("/body/pipeline_parallel", f"must be at most num_hidden_layers ({layers})")])


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


def resolve_precisions(model: ModelSpec, gpu: GpuSpec, gpu_label: str, requested: Precisions) -> ResolvedPrecisions:
    """Fill each precision the request left null, and 422 on a compute dtype the GPU cannot run."""
    defaults = []
    weight_dtype = requested.weight_dtype
    if weight_dtype is None:
        if model.dtype in WEIGHT_DTYPES:
            weight_dtype = model.dtype
            defaults.append(f"weight_dtype = {weight_dtype} (the model's published dtype)")
        else:  # fp32 checkpoints are served in bf16
            weight_dtype = "bf16"
            defaults.append(f"weight_dtype = bf16 (the model's {model.dtype} weights, served in bf16)")
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


def efficiency_out(efficiency: Efficiency, profile: str) -> EfficiencyOut:
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
        source=efficiency.source,
    )


def _human_size(size_bytes: int) -> HumanSize:
    return HumanSize(gb=round(size_bytes / 1e9, 6), gib=round(size_bytes / 2**30, 6))


def _core_problem(exc: ValueError) -> Unprocessable:
    """A combination the request checks let through but the core rejects: still the client's input."""
    return Unprocessable(str(exc), errors=[("/body", str(exc))])


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
        raise _core_problem(exc) from None
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
        sizes_for_people=KvSizesForPeople(bytes_per_sequence=_human_size(size.bytes_per_sequence),
                                          total_bytes=_human_size(total), bytes_per_gpu=_human_size(per_gpu)),
        mha_equivalent_bytes_per_sequence=mha_equivalent,
        mha_saving_ratio=1 - unpaged.bytes_per_sequence / mha_equivalent,
        curve=curve,
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
     "message / link bandwidth) + per-step and per-layer overhead"),
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
    "X one routed expert's bytes and D(B) the distinct experts touched; none when t x bw <= s"
)
ATTENTION_TRAFFIC_NOTE = (
    "HBM bytes of this step's attention on one GPU. FlashAttention tiles Q, K and V through on-chip SRAM, so "
    "the score matrix (heads x new tokens x attended tokens per layer) never reaches HBM; naive attention "
    "writes it and reads it back. Same FLOPs, less data moved."
)


def roofline_step(session: Session, request: RooflineRequest) -> RooflineResponse:
    """/v1/roofline: one prefill or decode step on one GPU of the tensor-parallel group."""
    model, model_label = resolve_model(session, request)
    gpu, gpu_label = resolve_gpu(session, request)
    check_parallelism(model, request.tensor_parallel)
    precisions = resolve_precisions(model, gpu, gpu_label, request)
    efficiency, profile = resolve_efficiency(session, gpu, precisions.compute_dtype, request.calibration)
    defaults = list(precisions.defaults_used)
    if request.calibration is None:
        defaults.append(f"calibration = {profile}")
    cached = request.context_tokens or 0
    new_tokens = request.prompt_tokens if request.phase == PREFILL else 1
    assert new_tokens is not None  # RooflineRequest requires prompt_tokens for prefill
    if request.phase == PREFILL and request.context_tokens is None:
        defaults.append("context_tokens = 0 (no cached prefix)")
    dtypes = {"weight_dtype": precisions.weight_dtype, "kv_dtype": precisions.kv_dtype,
              "activation_dtype": precisions.activation_dtype, "tensor_parallel": request.tensor_parallel}
    try:
        if request.phase == PREFILL:
            cost = prefill_cost(model, new_tokens, cached, request.batch_size, **dtypes)
        else:
            cost = decode_cost(model, cached, request.batch_size, **dtypes)
        result = roofline(cost, gpu, precisions.compute_dtype, efficiency, request.tensor_parallel, model)
        # A decode step is a one-token prefill after the cached context: the same step, naive attention.
        naive = prefill_cost(model, new_tokens, cached, request.batch_size, **dtypes, flash_attention=False)
    except ValueError as exc:
        raise _core_problem(exc) from None
    flash_bytes = cost.operator(ATTENTION).bytes
    naive_bytes = naive.operator(ATTENTION).bytes
    return RooflineResponse(
        model=model_label, gpu=gpu_label, phase=request.phase, batch_size=request.batch_size,
        prompt_tokens=request.prompt_tokens, context_tokens=cached, tensor_parallel=request.tensor_parallel,
        tokens=result.tokens, compute_dtype=precisions.compute_dtype,
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
                                           score_matrix_bytes=naive_bytes - flash_bytes,
                                           naive_to_flash_ratio=naive_bytes / flash_bytes,
                                           note=ATTENTION_TRAFFIC_NOTE),
        assumptions=_roofline_assumptions(precisions, efficiency, profile, ROOFLINE_FORMULAS, defaults),
        calculation_version=CALCULATION_VERSION,
    )


def _roofline_assumptions(precisions: ResolvedPrecisions, efficiency: Efficiency, profile: str,
                          formulas: Sequence[str], defaults: Sequence[str]) -> RooflineAssumptions:
    return RooflineAssumptions(
        weight_dtype=precisions.weight_dtype, kv_dtype=precisions.kv_dtype,
        compute_dtype=precisions.compute_dtype, activation_dtype=precisions.activation_dtype,
        efficiency=efficiency_out(efficiency, profile), formulas=list(formulas), defaults_used=list(defaults),
    )


@dataclass(frozen=True, slots=True)
class DecodeSweep:
    """Decode step times of one deployment at several batch sizes (seconds, one entry per batch)."""

    batch_sizes: tuple[int, ...]
    ideal_step_time_s: tuple[float, ...]
    expected_step_time_s: tuple[float, ...]
    knee_batch_size: int | None

    def bound(self, batch_size: int) -> str:
        # Compute-boundness is monotone in the batch (knee_batch_size's docstring), so the knee decides it.
        return COMPUTE if self.knee_batch_size is not None and batch_size >= self.knee_batch_size else MEMORY


def decode_batch_sweep(model: ModelSpec, gpu: GpuSpec, context_tokens: int, batch_sizes: Sequence[int], *,
                       weight_dtype: str, kv_dtype: str, compute_dtype: str, activation_dtype: str,
                       tensor_parallel: int, efficiency: Efficiency) -> DecodeSweep:
    """The batch-sweep's pure calculation: every batch evaluated at once by the vectorized step-time
    model (which reproduces roofline(decode_cost(...)) for a uniform batch), plus the analytic knee."""
    step_model = build_step_time_model(model, gpu, tensor_parallel=tensor_parallel, weight_dtype=weight_dtype,
                                       kv_dtype=kv_dtype, compute_dtype=compute_dtype, efficiency=efficiency,
                                       activation_dtype=activation_dtype)
    sequences = np.asarray(batch_sizes, dtype=float)
    contexts = sequences * context_tokens
    ideal = np.atleast_1d(step_model.ideal_step_time_s(sequences, contexts, 0, 0))
    expected = np.atleast_1d(step_model.step_time_s(sequences, contexts, 0, 0))
    knee = knee_batch_size(model, gpu, context_tokens, weight_dtype, kv_dtype, compute_dtype, tensor_parallel,
                           activation_dtype)
    return DecodeSweep(tuple(batch_sizes), tuple(ideal.tolist()), tuple(expected.tolist()), knee)


def batch_sweep(session: Session, request: BatchSweepRequest) -> BatchSweepResponse:
    """/v1/roofline/batch-sweep: decode step time and throughput against batch size, and the knee."""
    model, model_label = resolve_model(session, request)
    gpu, gpu_label = resolve_gpu(session, request)
    tp = request.tensor_parallel
    check_parallelism(model, tp)
    precisions = resolve_precisions(model, gpu, gpu_label, request)
    efficiency, profile = resolve_efficiency(session, gpu, precisions.compute_dtype, request.calibration)
    defaults = list(precisions.defaults_used)
    if request.calibration is None:
        defaults.append(f"calibration = {profile}")
    if request.batch_sizes is None:
        defaults.append("batch_sizes = " + ", ".join(str(b) for b in DEFAULT_SWEEP_BATCH_SIZES))
    batch_sizes = sorted(set(request.batch_sizes or DEFAULT_SWEEP_BATCH_SIZES))
    context = request.context_tokens
    try:
        sweep = decode_batch_sweep(
            model, gpu, context, batch_sizes, weight_dtype=precisions.weight_dtype, kv_dtype=precisions.kv_dtype,
            compute_dtype=precisions.compute_dtype, activation_dtype=precisions.activation_dtype,
            tensor_parallel=tp, efficiency=efficiency)
        weights = weight_bytes_per_gpu(model, precisions.weight_dtype, tp)
        # The KV each sequence holds once this step has written its token.
        kv_per_sequence = kv_cache_size(model, context + 1, precisions.kv_dtype, tp).bytes_per_sequence_per_gpu
        explanation = _knee_explanation(model, gpu, context, sweep, precisions, tp, efficiency,
                                        weights, kv_per_sequence)
    except ValueError as exc:
        raise _core_problem(exc) from None
    points = []
    for batch, ideal, expected in zip(sweep.batch_sizes, sweep.ideal_step_time_s, sweep.expected_step_time_s,
                                      strict=True):
        kv = kv_per_sequence * batch
        points.append(BatchSweepPoint(
            batch_size=batch, bound=sweep.bound(batch),
            ideal_step_time_ms=ideal * 1e3, expected_step_time_ms=expected * 1e3,
            ideal_tokens_per_s=batch / ideal, expected_tokens_per_s=batch / expected,
            ideal_tokens_per_s_per_user=1 / ideal, expected_tokens_per_s_per_user=1 / expected,
            kv_bytes_per_gpu=kv, weights_and_kv_bytes_per_gpu=weights + kv,
            fits_in_gpu_memory=weights + kv <= gpu.memory_bytes,
        ))
    return BatchSweepResponse(
        model=model_label, gpu=gpu_label, context_tokens=context, tensor_parallel=tp,
        compute_dtype=precisions.compute_dtype, ridge_point=ridge_point(gpu, precisions.compute_dtype),
        points=points, knee_batch_size=sweep.knee_batch_size, knee_explanation=explanation,
        assumptions=_roofline_assumptions(precisions, efficiency, profile, (*ROOFLINE_FORMULAS, KNEE_FORMULA),
                                          defaults),
        calculation_version=CALCULATION_VERSION,
    )


def _knee_explanation(model: ModelSpec, gpu: GpuSpec, context_tokens: int, sweep: DecodeSweep,
                      precisions: ResolvedPrecisions, tensor_parallel: int, efficiency: Efficiency,
                      weights: int, kv_per_sequence: int) -> str:
    knee = sweep.knee_batch_size
    if knee is not None:
        text = (f"From {knee:,} sequences on, the ideal decode step is compute-bound: the weight read, paid once "
                "per step, is shared by enough sequences that their FLOPs outlast the step's memory traffic. Below "
                "the knee the step is memory-bound and each added sequence costs only its own KV and activation "
                "traffic.")
        if weights + knee * kv_per_sequence > gpu.memory_bytes:
            text += (f" But {knee:,} sequences of {context_tokens:,} tokens need "
                     f"{knee * kv_per_sequence / 1e9:,.1f} GB of KV cache per GPU next to the weights, more than "
                     f"the GPU's {gpu.memory_bytes / 1e9:,.1f} GB: KV memory caps the batch before the compute "
                     "roof does.")
        return text
    # Why never: compare what one more sequence adds to the ideal step's compute and memory times.
    one, two = (
        roofline(decode_cost(model, context_tokens, batch, precisions.weight_dtype, precisions.kv_dtype,
                             precisions.activation_dtype, tensor_parallel),
                 gpu, precisions.compute_dtype, efficiency)
        for batch in (1, 2))
    added_compute = two.compute_time_s - one.compute_time_s
    added_memory = two.memory_time_s - one.memory_time_s
    return (f"None: at {context_tokens:,} tokens of context every added sequence brings its own KV cache reads, "
            f"adding {added_memory * 1e6:,.2f} us of memory traffic but only {added_compute * 1e6:,.2f} us of "
            "compute at peak to the ideal step, so memory time grows faster than compute time and decode stays "
            "memory-bound at any batch size. Shorter contexts, a quantized KV cache or fewer KV heads bring the "
            "knee back.")


# /v1/capacity

CAPACITY_FORMULAS = (
    ("per GPU: kv_budget = usable - weights - activation - overhead (non-torch + CUDA graphs + reserve); "
     "vllm and generic: usable = gpu_memory_utilization x total memory; sglang: mem_fraction_static x total "
     "holds weights + KV only; trtllm: KV = 0.9 x (total - weights - activation - overhead)"),
    ("activation peak (vllm, trtllm) = 4.76 GiB (measured: Llama-3.1-8B, 8192 batched tokens, TP1, H100) x "
     "batched tokens / 8192 x live values per token of one layer / 61,440 (that model's: 2h + attention "
     "projections + 3 x MLP width, per GPU; MoE: k x (3 x expert width + h))"),
    ("KV blocks = kv_budget // (block_size x bytes per token in every layer of the most loaded GPU); window "
     "layers take only the blocks their window spans (vLLM's hybrid allocator); MLA's latent is not divided "
     "by TP"),
    ("worst case = requests of max_model_len; admission = requests of input + output (reserved up front); "
     "steady state = budget / mean KV of a request over its decode (input + t tokens, block-rounded, "
     "t = 1..output); each capped by max_num_seqs"),
    ("operating point: tpot = decode step (batch/pp requests at mean context, all stages) + batch x prefill "
     "/ (pp x output); tokens/s per user = 1/tpot, aggregate = batch/tpot, requests/s = aggregate/output"),
    "TP beyond one node's GPUs runs its all-reduces over the scale-out link",
)


def plan_capacity(session: Session, request: CapacityRequest) -> CapacityResponse:
    """/v1/capacity: concurrency and speed of a deployment under its engine's memory accounting."""
    model, model_label = resolve_model(session, request)
    gpu, gpu_label = resolve_gpu(session, request)
    check_parallelism(model, request.tensor_parallel, request.pipeline_parallel)
    if request.max_model_len is not None and request.max_model_len > model.max_position_embeddings:
        raise Unprocessable(
            f"max_model_len {request.max_model_len} exceeds the model's {model.max_position_embeddings} positions",
            errors=[("/body/max_model_len",
                     f"must be at most max_position_embeddings ({model.max_position_embeddings})")])
    precisions = resolve_precisions(model, gpu, gpu_label, request)
    efficiency, profile = resolve_efficiency(session, gpu, precisions.compute_dtype, request.calibration)
    engine = EngineConfig(
        engine=request.engine, gpu_memory_utilization=request.gpu_memory_utilization,
        reserved_bytes_per_gpu=request.reserved_bytes_per_gpu,
        activation_bytes_per_gpu=request.activation_bytes_per_gpu,
        non_torch_bytes_per_gpu=request.non_torch_bytes_per_gpu,
        cuda_graph_bytes_per_gpu=request.cuda_graph_bytes_per_gpu, max_num_seqs=request.max_num_seqs,
        max_num_batched_tokens=request.max_num_batched_tokens, block_size=request.block_size,
        max_model_len=request.max_model_len)
    try:
        result = capacity_core.capacity(
            model, gpu, tensor_parallel=request.tensor_parallel, pipeline_parallel=request.pipeline_parallel,
            weight_dtype=precisions.weight_dtype, kv_dtype=precisions.kv_dtype,
            compute_dtype=precisions.compute_dtype, engine=engine, input_tokens=request.input_tokens,
            output_tokens=request.output_tokens, efficiency=efficiency,
            activation_dtype=precisions.activation_dtype)
    except ValueError as exc:
        raise _core_problem(exc) from None
    resolved = result.engine
    defaults = [*precisions.defaults_used]
    if request.calibration is None:
        defaults.append(f"calibration = {profile}")
    defaults += [f"{name} = {getattr(resolved, name)} ({source})" for name, source in resolved.sources
                 if source != "given"]
    memory = result.memory
    return CapacityResponse(
        model=model_label, gpu=gpu_label, tensor_parallel=request.tensor_parallel,
        pipeline_parallel=request.pipeline_parallel, num_gpus=request.tensor_parallel * request.pipeline_parallel,
        input_tokens=request.input_tokens, output_tokens=request.output_tokens,
        fits=result.fits, reasons=list(result.reasons),
        suggestion=None if result.suggestion is None else SuggestionOut(
            **{name: getattr(result.suggestion, name) for name in SuggestionOut.model_fields}),
        memory=MemoryOut(
            total_bytes_per_gpu=memory.total_bytes_per_gpu, usable_bytes_per_gpu=memory.usable_bytes_per_gpu,
            weights_bytes_per_gpu=memory.weights_bytes_per_gpu,
            activation_bytes_per_gpu=memory.activation_bytes_per_gpu,
            overhead_bytes_per_gpu=memory.overhead_bytes_per_gpu,
            non_torch_bytes_per_gpu=memory.non_torch_bytes_per_gpu,
            cuda_graph_bytes_per_gpu=memory.cuda_graph_bytes_per_gpu,
            reserved_bytes_per_gpu=memory.reserved_bytes_per_gpu,
            kv_budget_bytes_per_gpu=memory.kv_budget_bytes_per_gpu, weights_bytes_total=result.weights_bytes_total,
            kv_budget_per_gpu=_human_size(memory.kv_budget_bytes_per_gpu),
            weights_total=_human_size(result.weights_bytes_total)),
        kv_bytes_per_token_per_gpu=result.kv_bytes_per_token_per_gpu, kv_tokens=result.kv_tokens,
        kv_blocks=result.kv_blocks,
        max_concurrency=MaxConcurrencyOut(**{
            view: ConcurrencyOut(**{name: getattr(getattr(result.max_concurrency, view), name)
                                    for name in ConcurrencyOut.model_fields})
            for view in MaxConcurrencyOut.model_fields}),
        max_context_tokens=result.max_context_tokens,
        operating_point=None if result.operating_point is None else _operating_point_out(result.operating_point),
        engine=EngineOut(
            engine=resolved.engine, gpu_memory_utilization=resolved.gpu_memory_utilization,
            utilization_of=resolved.utilization_of, max_num_seqs=resolved.max_num_seqs,
            max_num_batched_tokens=resolved.max_num_batched_tokens, block_size=resolved.block_size,
            max_model_len=resolved.max_model_len, kv_allocation=resolved.kv_allocation,
            sources=dict(resolved.sources)),
        assumptions=CapacityAssumptions(
            weight_dtype=precisions.weight_dtype, kv_dtype=precisions.kv_dtype,
            compute_dtype=precisions.compute_dtype, activation_dtype=precisions.activation_dtype,
            efficiency=efficiency_out(efficiency, profile), formulas=list(CAPACITY_FORMULAS),
            defaults_used=defaults),
        calculation_version=CALCULATION_VERSION,
    )


def _operating_point_out(point: capacity_core.OperatingPoint) -> OperatingPointOut:
    """The core's seconds as milliseconds: `x_ms` is `x_s` x 1000; other fields carry over."""
    return OperatingPointOut(**{
        name: getattr(point, name[:-3] + "_s") * 1e3 if name.endswith("_ms") else getattr(point, name)
        for name in OperatingPointOut.model_fields})


# /v1/slo-plan

SLO_PLAN_FORMULAS = (
    ("replicas = ceil(peak x burst_factor / (max load per replica x max_utilization_ratio)) + extra_replicas; "
     "the max load is the highest simulated per-replica load meeting every SLO at the percentile"),
    ("GPUs = replicas x tensor_parallel x pipeline_parallel; nodes: tensor parallelism stays inside one node and "
     "replicas smaller than a node share nodes"),
    ("cost per hour = GPUs x price per GPU-hour; $ per million output tokens = cost per hour / (output tokens per "
     "hour at the peak load) x 1e6"),
    ("TPOT = (E2E - TTFT) / (output tokens - 1), per request; percentiles over the simulated requests after the "
     "first 10 % (warm-up)"),
    ("TPOT floor = one decode step at batch 1 attending the median prompt; TTFT floor = the percentile prompt "
     "prefilled alone; both prune configurations before any simulation"),
    ("speculative decoding: tokens per target pass = (1 - a^(k+1)) / (1 - a); a pass costs k draft decode steps "
     "plus one target pass over k + 1 tokens per sequence"),
)
SLO_PLAN_TPOT_DEFINITION = ("TPOT = (E2E - TTFT) / (output tokens - 1) per request: the mean gap between output "
                            "tokens after the first (harnesses that divide E2E by all output tokens report less)")
# Lognormal lengths are drawn up to this quantile: an unbounded tail would ask for absurd contexts.
LOGNORMAL_CLIP_QUANTILE = 0.9999
INLINE_MODEL_ID = "/path/to/model"  # an inline architecture has no repository id


def plan_slo(session: Session, request: SloPlanRequest) -> SloPlanResponse:
    """The cheapest deployments meeting the request's SLO (see `app.sizing.serving.plan`)."""
    model, label = resolve_model(session, request)
    candidates = request.candidates
    defaults: list[str] = []
    if candidates.gpus is None:
        gpus = list_gpu_specs(session)
        defaults.append(f"gpus = every catalog GPU ({len(gpus)})")
    else:
        gpus = [get_gpu_spec(session, slug) for slug in dict.fromkeys(candidates.gpus)]
    _check_plan_parallelism(model, candidates)
    weight_dtypes = candidates.weight_dtypes
    if weight_dtypes is None:
        weight_dtypes = [model.dtype if model.dtype in WEIGHT_DTYPES else "bf16"]
        defaults.append(f"weight_dtypes = [{weight_dtypes[0]}] (the model's published dtype)")
    kv_dtypes = candidates.kv_dtypes
    if kv_dtypes is None:
        kv_dtype, why = default_kv_dtype(model)
        kv_dtypes = [kv_dtype]
        defaults.append(f"kv_dtypes = [{kv_dtype}] ({why})")
    if candidates.tensor_parallel is None:
        defaults.append("tensor_parallel = every divisor of the attention heads up to each GPU's node size")
    for knob in ("max_num_seqs", "max_num_batched_tokens"):
        if getattr(candidates, knob) is None:
            defaults.append(f"{knob} = the {candidates.engine} default")
    prices = dict(candidates.gpu_price_per_hour_usd or {})
    for slug in prices.keys() - {gpu.slug for gpu in gpus}:
        raise Unprocessable(f"a price is given for {slug!r}, which is not among the candidate GPUs",
                            errors=[(f"/body/candidates/gpu_price_per_hour_usd/{slug}", "not a candidate GPU")])
    workload = _plan_workload(request.workload, model)
    speculative, draft, draft_id = _plan_speculation(session, request.speculative)
    try:
        configurations = plan_core.configurations(
            model, gpus, candidates.tensor_parallel, candidates.pipeline_parallel, weight_dtypes, kv_dtypes,
            candidates.max_num_seqs or [None], candidates.max_num_batched_tokens or [None])
    except plan_core.SearchSpaceTooLarge as exc:
        raise Unprocessable(str(exc), errors=[("/body/candidates", str(exc))]) from None
    compute_dtypes = [*weight_dtypes, *([draft.weight_dtype] if draft is not None else [])]
    efficiencies, profiles = _plan_efficiencies(session, gpus, compute_dtypes, request.calibration)
    slo = request.slo
    try:
        inputs = plan_core.PlanInputs(
            model=model, workload=workload, efficiencies=efficiencies, engine=candidates.engine,
            slo=plan_core.Slo(ttft_s=slo.ttft_ms / 1e3, tpot_s=slo.tpot_ms / 1e3,
                              e2e_s=None if slo.e2e_ms is None else slo.e2e_ms / 1e3,
                              percentile=slo.percentile, goodput_ratio=slo.goodput_ratio),
            burst_factor=request.workload.burst_factor,
            policy=plan_core.HaPolicy(request.ha_policy.extra_replicas, request.ha_policy.max_utilization_ratio),
            prices=prices, speculative=speculative, draft=draft, seed=request.seed,
            simulated_requests=request.simulated_requests)
    except ValueError as exc:
        raise Unprocessable(str(exc), errors=[("/body/workload", str(exc))]) from None
    result = plan_core.plan(inputs, configurations)
    model_id = INLINE_MODEL_ID if request.model is None else (read_one(session, MODELS, request.model).hf_id
                                                              or request.model)
    plans = [_plan_out(rank, plan, model, model_id, profiles, request, draft_id, result.max_model_len)
             for rank, plan in enumerate(result.plans, start=1)]
    return SloPlanResponse(
        feasible=result.feasible, model=label, slo=slo, plans=plans,
        pareto=[ParetoPointOut(rank=index + 1, cost_per_hour_usd=result.plans[index].cost_per_hour_usd,
                               gpus=result.plans[index].gpus,
                               e2e_ms_at_slo_percentile=result.plans[index].e2e_at_slo_percentile_s * 1e3)
                for index in result.pareto],
        infeasible=[InfeasibleOut(gpu=item.configuration.gpu.slug, tensor_parallel=item.configuration.tensor_parallel,
                                  pipeline_parallel=item.configuration.pipeline_parallel,
                                  weight_dtype=item.configuration.weight_dtype, kv_dtype=item.configuration.kv_dtype,
                                  max_num_seqs=item.configuration.max_num_seqs,
                                  max_num_batched_tokens=item.configuration.max_num_batched_tokens,
                                  reasons=list(item.reasons))
                    for item in result.infeasible],
        search=SearchOut(
            configurations_considered=result.stats.configurations, configuration_limit=plan_core.MAX_CONFIGURATIONS,
            screened_out=result.stats.screened_out, bounded_out=result.stats.bounded_out,
            simulated=result.stats.simulated, infeasible_in_simulation=result.stats.infeasible_in_simulation,
            simulator_runs=result.stats.simulations, simulated_requests=result.stats.simulated_requests,
            requests_per_run=result.stats.requests_per_run, seed=result.stats.seed),
        assumptions=SloPlanAssumptions(
            calibration_profiles=sorted(set(profiles.values())), engine=candidates.engine,
            load_model=_load_model_text(request.workload), tpot_definition=SLO_PLAN_TPOT_DEFINITION,
            formulas=list(SLO_PLAN_FORMULAS), defaults_used=defaults,
            notes=[*result.notes, *_workload_notes(request.workload)]),
        calculation_version=CALCULATION_VERSION,
    )


def _check_plan_parallelism(model: ModelSpec, candidates: CandidatesIn) -> None:
    """422 for a tensor-parallel degree that does not divide the heads, or more stages than layers."""
    heads, layers = model.num_attention_heads, model.num_hidden_layers
    for index, tp in enumerate(candidates.tensor_parallel or []):
        if heads % tp:
            raise Unprocessable(f"tensor_parallel {tp} does not divide the model's {heads} attention heads",
                                errors=[(f"/body/candidates/tensor_parallel/{index}",
                                         f"must divide num_attention_heads ({heads})")])
    for index, pp in enumerate(candidates.pipeline_parallel):
        if pp > layers:
            raise Unprocessable(f"pipeline_parallel {pp} exceeds the model's {layers} layers",
                                errors=[(f"/body/candidates/pipeline_parallel/{index}",
                                         f"must be at most num_hidden_layers ({layers})")])


def _plan_lengths(lengths: Any, pointer: str, cap: int) -> LengthDistribution:
    """The request's lengths as a core distribution; lognormals clipped at LOGNORMAL_CLIP_QUANTILE."""
    try:
        if isinstance(lengths, int):
            return Fixed(lengths)
        if isinstance(lengths, HistogramLengths):
            return Histogram(tuple(lengths.bins))
        statistics = {"mean": lengths.mean, "p50": lengths.p50, "p90": lengths.p90, "p99": lengths.p99}
        fitted = LogNormal(**statistics, max_tokens=cap)
        return LogNormal(**statistics, max_tokens=max(1, min(cap, math.ceil(fitted.quantile(LOGNORMAL_CLIP_QUANTILE)))))
    except ValueError as exc:
        raise Unprocessable(str(exc), errors=[(pointer, str(exc))]) from None


def _plan_workload(workload: WorkloadIn, model: ModelSpec) -> Workload:
    """The core workload; a lognormal answer keeps a position for the prompt, a lognormal prompt leaves
    room for the longest answer (a request longer than the model is a 422, from `PlanInputs`)."""
    positions = model.max_position_embeddings
    output_tokens = _plan_lengths(workload.output_tokens, "/body/workload/output_tokens", max(1, positions - 1))
    longest_answer = math.ceil(output_tokens.quantile(1.0))
    return Workload(
        input_tokens=_plan_lengths(workload.input_tokens, "/body/workload/input_tokens",
                                   max(1, positions - longest_answer)),
        output_tokens=output_tokens,
        requests_per_s=workload.requests_per_s, concurrent_users=workload.concurrent_users,
        prefix_cache_hit_rate=workload.prefix_cache_hit_rate, shared_prefix_tokens=workload.shared_prefix_tokens)


def _plan_speculation(session: Session, speculative: SpeculativeIn | None,
                      ) -> tuple[SpeculativeDecoding | None, plan_core.DraftModel | None, str | None]:
    """(speculation, draft model, the draft's Hugging Face id) from the request."""
    if speculative is None:
        return None, None, None
    spec = SpeculativeDecoding(speculative.draft_tokens, speculative.acceptance_rate,
                               has_draft_model=speculative.draft_model is not None)
    if speculative.draft_model is None:
        return spec, None, None
    draft_model = get_model_spec(session, speculative.draft_model)
    draft_dtype = draft_model.dtype if draft_model.dtype in WEIGHT_DTYPES else "bf16"
    draft_id = read_one(session, MODELS, speculative.draft_model).hf_id or speculative.draft_model
    return spec, plan_core.DraftModel(draft_model, draft_dtype), draft_id


def _plan_efficiencies(session: Session, gpus: Sequence[GpuSpec], weight_dtypes: Sequence[str],
                       profile: str | None) -> tuple[dict[tuple[str, str], Efficiency], dict[tuple[str, str], str]]:
    """The efficiency (and its profile's name) for every GPU x compute dtype the weights imply."""
    efficiencies: dict[tuple[str, str], Efficiency] = {}
    profiles: dict[tuple[str, str], str] = {}
    for gpu in gpus:
        for weight_dtype in weight_dtypes:
            try:
                compute_dtype = default_compute_dtype(gpu, weight_dtype)
            except ValueError:
                continue  # the plan reports the configuration infeasible, with the reason
            key = (gpu.slug, compute_dtype)
            if key not in efficiencies:
                efficiencies[key], profiles[key] = resolve_efficiency(session, gpu, compute_dtype, profile)
    return efficiencies, profiles


def _load_model_text(workload: WorkloadIn) -> str:
    if workload.concurrent_users is not None:
        return (f"closed loop: {workload.concurrent_users} users, each sending the next request the moment the "
                "last one finishes; every replica is simulated with its share of the users")
    return (f"open loop: the fleet is sized for {workload.requests_per_s:g} req/s x burst factor "
            f"{workload.burst_factor:g}; every replica is simulated with a Poisson stream of its share")


def _workload_notes(workload: WorkloadIn) -> list[str]:
    if any(isinstance(lengths, LognormalLengths) for lengths in (workload.input_tokens, workload.output_tokens)):
        return [(f"lognormal lengths are drawn up to their {LOGNORMAL_CLIP_QUANTILE:.2%} quantile (and the model's "
                 "context); max_model_len covers the longest prompt plus the longest answer")]
    return []


def _percentiles_out(percentiles: plan_core.Percentiles) -> PercentilesOut:
    def ms(seconds: float) -> float | None:
        return None if math.isnan(seconds) else seconds * 1e3

    return PercentilesOut(p50_ms=ms(percentiles.p50_s), p95_ms=ms(percentiles.p95_s), p99_ms=ms(percentiles.p99_s),
                          at_slo_percentile_ms=ms(percentiles.at_slo_percentile_s))


def _plan_out(rank: int, plan: plan_core.Plan, model: ModelSpec, model_id: str,
              profiles: dict[tuple[str, str], str], request: SloPlanRequest, draft_id: str | None,
              max_model_len: int) -> PlanOut:
    configuration, engine, predicted = plan.configuration, plan.engine, plan.predicted
    gpu = configuration.gpu
    speculative = request.speculative
    launch = launch_command(LaunchSpec(
        engine=engine.engine, model_id=model_id, model_dtype=model.dtype,
        tensor_parallel=configuration.tensor_parallel, pipeline_parallel=configuration.pipeline_parallel,
        weight_dtype=configuration.weight_dtype, kv_dtype=configuration.kv_dtype, max_num_seqs=engine.max_num_seqs,
        max_num_batched_tokens=engine.max_num_batched_tokens, max_model_len=max_model_len,
        gpu_memory_utilization=engine.gpu_memory_utilization,
        draft_tokens=None if speculative is None else speculative.draft_tokens, draft_model_id=draft_id))
    return PlanOut(
        rank=rank, gpu=gpu.slug, gpu_name=gpu.name, tensor_parallel=configuration.tensor_parallel,
        pipeline_parallel=configuration.pipeline_parallel, weight_dtype=configuration.weight_dtype,
        kv_dtype=configuration.kv_dtype, compute_dtype=plan.compute_dtype, engine=engine.engine,
        max_num_seqs=engine.max_num_seqs, max_num_batched_tokens=engine.max_num_batched_tokens,
        block_size=engine.block_size, gpu_memory_utilization_ratio=engine.gpu_memory_utilization,
        max_model_len=max_model_len, kv_tokens_per_replica=plan.kv_tokens_per_replica,
        load_per_replica=LoadPerReplicaOut(
            unit=plan.load_kind, offered=plan.offered_load_per_replica, max_verified=plan.max_load_per_replica,
            failing=plan.failing_load_per_replica, analytic_ceiling=plan.ceiling_load_per_replica),
        replicas=plan.replicas, extra_replicas=plan.extra_replicas,
        gpus_per_replica=configuration.gpus_per_replica, gpus=plan.gpus, nodes=plan.nodes,
        price_per_gpu_hour_usd=plan.price_per_gpu_hour_usd, price_source=plan.price_source,
        cost_per_hour_usd=plan.cost_per_hour_usd,
        cost_per_million_output_tokens_usd=plan.cost_per_million_output_tokens_usd,
        output_tokens_per_s=plan.output_tokens_per_s, output_tokens_per_s_per_gpu=plan.output_tokens_per_s_per_gpu,
        utilization_ratio=plan.utilization_ratio,
        predicted=PredictionOut(
            load_per_replica=predicted.load, ttft=_percentiles_out(predicted.ttft),
            tpot=_percentiles_out(predicted.tpot), e2e=_percentiles_out(predicted.e2e),
            goodput_ratio=predicted.goodput_ratio, requests_per_s=predicted.requests_per_s,
            output_tokens_per_s=predicted.output_tokens_per_s, preemptions=predicted.preemptions),
        meets_slo=plan.meets_slo, binding_constraint=plan.binding_constraint, binding_detail=plan.binding_detail,
        launch=LaunchOut(command=launch.command, notes=list(launch.notes)),
        assumptions=PlanAssumptionsOut(
            efficiency=efficiency_out(plan.efficiency, profiles[(gpu.slug, plan.compute_dtype)]),
            tokens_per_pass=plan.tokens_per_pass,
            engine_settings=[f"{name} = {getattr(engine, name)} ({source})" for name, source in engine.sources]),
    )
