"""Catalog shapes: the model architecture and GPU shapes (also reused inline by sizing
endpoints as `model_spec` / `gpu_spec`), the catalog rows as stored, pages, and import results.

Inputs are strict (no "80" for 80, no true for 1), reject unknown fields, NaN and infinities, and
bound every number to physical sense. Architecture fields use Hugging Face `config.json` names.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import fields as dataclass_fields
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from app.catalog.hf_config import MAX_LAYERS, named_field
from app.catalog.reference import gpu_spec_from_record, model_spec_from_record, reference_model_rows
from app.common import NO_NUL_PATTERN, Label, LongText, Name, Page, Slug, schema_examples
from app.errors import Unprocessable
from app.sizing.specs import BITS_PER_VALUE, LAYER_TYPES, GpuSpec, ModelSpec

INPUT_CONFIG = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)

WeightDtype = Literal[tuple(BITS_PER_VALUE)]  # type: ignore[valid-type]
LayerType = Literal[LAYER_TYPES]  # type: ignore[valid-type]
Origin = Literal["reference", "user"]

Layers = Annotated[int, Field(ge=1, le=MAX_LAYERS)]
Width = Annotated[int, Field(ge=1, le=1_000_000)]  # hidden, head and projection widths
Heads = Annotated[int, Field(ge=1, le=10_000)]
Tokens = Annotated[int, Field(ge=1, le=1 << 30)]  # context lengths and windows
Params = Annotated[int, Field(ge=1, le=10**14)]
# Sanity bounds of a datasheet rate: below 1 GFLOP/s (a thousandth of a TFLOP/s) or 1 MB/s nothing is an
# accelerator, and a step's seconds would overflow to infinity (a rate of 5e-324 TFLOP/s did).
Tflops = Annotated[float, Field(ge=1e-3, le=1e6, description="Dense peak, TFLOP/s (TOP/s for int8)")]
BytesPerS = Annotated[float, Field(ge=1e6, le=1e15)]


def _as_utc(value: datetime) -> datetime:
    # SQLite hands timestamps back without a zone; they were written as UTC.
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


UtcDatetime = Annotated[datetime, AfterValidator(_as_utc)]

# Examples: Llama-3-70B and H100 SXM, values as in the reference catalog.
MODEL_ARCHITECTURE_EXAMPLE: dict[str, Any] = {
    "num_hidden_layers": 80, "hidden_size": 8192, "num_attention_heads": 64, "num_key_value_heads": 8,
    "head_dim": 128, "vocab_size": 128256, "intermediate_size": 28672, "mlp_gated": True,
    "tie_word_embeddings": False, "max_position_embeddings": 8192, "attention_bias": False,
    "num_experts": 0, "num_experts_per_tok": 0, "n_shared_experts": 0, "moe_intermediate_size": None,
    "shared_expert_intermediate_size": None, "first_k_dense_replace": 0, "moe_layers": None,
    "kv_lora_rank": None, "q_lora_rank": None, "qk_rope_head_dim": None, "qk_nope_head_dim": None,
    "v_head_dim": None, "layer_types": None, "sliding_window": None, "attention_chunk_size": None,
    "dtype": "bf16", "total_params_published": 70000000000, "active_params_published": 70000000000,
}
MODEL_IN_EXAMPLE = {
    **MODEL_ARCHITECTURE_EXAMPLE, "name": "Llama-3-70B", "hf_id": "meta-llama/Meta-Llama-3-70B",
    "source": "LitGPT config.py (Llama-3-70B)", "notes": "head_dim derived as hidden_size / num_attention_heads",
}
ROW_EXAMPLE = {"origin": "reference", "version": 1, "created_at": "2026-11-29T09:00:00Z",
               "updated_at": "2026-11-29T09:00:00Z", "written_by": None}
WRITTEN_BY_DESCRIPTION = ("Name of the API key that last wrote this row, at updated_at (never the secret); "
                          "null for rows from the reference data")
MODEL_OUT_EXAMPLE = {**MODEL_IN_EXAMPLE, "slug": "llama-3-70b", "architecture": "dense",
                     "attention_type": "gqa", **ROW_EXAMPLE}
GPU_SPEC_EXAMPLE: dict[str, Any] = {
    "name": "NVIDIA H100 SXM5 80GB", "family": "hopper", "vendor": "NVIDIA", "memory_bytes": 85520809984,
    "cuda_memory_bytes": 85029615043,
    "memory_bandwidth_bytes_per_s": 3.35e12, "interconnect_bandwidth_bytes_per_s": 4.5e11,
    "gpus_per_node": 8, "scale_out_bandwidth_bytes_per_s": 5e10, "fp32_tflops": 67.0,
    "tf32_tflops": 494.5, "bf16_tflops": 989.5, "fp16_tflops": 989.5, "fp8_tflops": 1979.0,
    "int8_tops": 1979.0, "fp4_tflops": None, "tdp_w": 700.0, "price_per_hour_usd": 3.64,
}
GPU_IN_EXAMPLE = {
    **GPU_SPEC_EXAMPLE, "form_factor": "SXM5",
    "interconnect": "NVLink 4 (18 links) + PCIe Gen5 x16",
    "price_source": "median(Lambda 3.99, RunPod 3.29); list price per GPU-hour",
    "source": "NVIDIA H100 datasheet", "notes": "Dense = datasheet sparse/2.",
}
GPU_OUT_EXAMPLE = {**GPU_IN_EXAMPLE, "slug": "h100-sxm", **ROW_EXAMPLE}


def _not_a_repository_id(value: object) -> object:
    """A model slug that is a Hugging Face repository id ("org/name") gets a message saying where the
    catalog slug is, or how to import the model, instead of a bare pattern mismatch."""
    if not (isinstance(value, str) and value.count("/") == 1 and len(value) <= 200):
        return value
    raise ValueError(repository_id_hint(value))


# What a fine-tuned release adds to its base model's repository name (Llama-3.1-8B-Instruct, gemma-2-9b-it,
# Llama-2-7b-chat-hf), stripped to find the base model in the catalog.
FINE_TUNE_SUFFIX = r"(-(instruct|chat|it|hf|base))+$"


def repository_id_hint(value: str) -> str:
    """What a Hugging Face repository id ("org/name") given where a model slug belongs should have been: the
    reference catalog's slug of that id, the catalog model a slug made of its name stands for, or how to import it
    (a request body's field, and a /v1/models path: `app.errors`)."""
    suggested = re.sub(r"[^a-z0-9._-]+", "-", value.split("/")[-1].lower()).strip("-._")[:64] or "my-model"
    rows = reference_model_rows()
    for row in rows:
        if row["hf_id"].lower() == value.lower():
            return f"{value!r} is a Hugging Face repository id; its catalog slug is {row['slug']!r}"
    for row in rows:
        if row["slug"] == suggested:
            return (f"{value!r} is a Hugging Face repository id, not a catalog slug; the catalog's "
                    f"{suggested!r} is {row['hf_id']!r}")
    base = re.sub(r"^meta-", "", re.sub(FINE_TUNE_SUFFIX, "", suggested))
    for row in rows:
        if row["slug"] == base:
            return (f"{value!r} is a Hugging Face repository id, not a catalog slug; its base model is the catalog's "
                    f"{base!r} ({row['hf_id']!r}), whose architecture a fine-tune such as this keeps (compare the "
                    f"two config.json files, or import this one with POST /v1/models/import?slug={suggested})")
    return (f"{value!r} is a Hugging Face repository id, not a catalog slug. GET /v1/models lists "
            f"each model's hf_id; a model not in the catalog can be imported from its config.json "
            f"with POST /v1/models/import?slug={suggested} (or sized inline with model_spec)")


ModelSlug = Annotated[Slug, BeforeValidator(_not_a_repository_id)]


class ModelArchitecture(BaseModel):
    """A decoder-only transformer, in Hugging Face `config.json` field names."""

    model_config = INPUT_CONFIG | schema_examples(MODEL_ARCHITECTURE_EXAMPLE)

    num_hidden_layers: Layers
    hidden_size: Width
    num_attention_heads: Heads
    num_key_value_heads: Heads = Field(description="1 = multi-query; = num_attention_heads for MHA")
    vocab_size: Annotated[int, Field(ge=1, le=10_000_000)]
    head_dim: Width | None = Field(None, description="null = hidden_size // num_attention_heads")
    intermediate_size: Annotated[int, Field(ge=1, le=10_000_000)] | None = Field(
        None, description="Dense MLP width; null = 4 * hidden_size (GPT-J, Falcon)")
    mlp_gated: bool = Field(True, description="SwiGLU/GeGLU (3 matrices) vs a plain 2-matrix MLP")
    tie_word_embeddings: bool = False
    max_position_embeddings: Tokens = 4096
    attention_bias: bool = Field(False, description="Q/K/V projection biases (Qwen2, gpt-oss, OPT)")
    num_experts: Annotated[int, Field(ge=0, le=100_000)] = Field(0, description="Routed experts; 0 = dense")
    num_experts_per_tok: Annotated[int, Field(ge=0, le=100_000)] = 0
    n_shared_experts: Annotated[int, Field(ge=0, le=1000)] = 0
    moe_intermediate_size: Annotated[int, Field(ge=1, le=10_000_000)] | None = Field(
        None, description="Routed-expert width; null = intermediate_size")
    shared_expert_intermediate_size: Annotated[int, Field(ge=1, le=10_000_000)] | None = Field(
        None, description="Width of each shared expert; null = the routed-expert width")
    first_k_dense_replace: Annotated[int, Field(ge=0, le=1000)] = 0
    moe_layers: list[Annotated[int, Field(ge=0, le=999)]] | None = Field(
        None, max_length=1000, description="Indices of MoE layers; null = every layer from first_k_dense_replace")
    kv_lora_rank: Width | None = Field(None, description="MLA latent width; set = MLA (DeepSeek-V2/V3)")
    q_lora_rank: Width | None = None
    qk_rope_head_dim: Width | None = None
    qk_nope_head_dim: Width | None = None
    v_head_dim: Width | None = None
    layer_types: list[LayerType] | None = Field(
        None, max_length=1000, description="Attention kind of each layer; null = all full_attention")
    sliding_window: Tokens | None = Field(None, description="Tokens a sliding_attention layer caches")
    attention_chunk_size: Tokens | None = Field(None, description="Tokens a chunked_attention layer caches")
    dtype: WeightDtype = Field("bf16", description="Default weight precision")
    total_params_published: Params | None = None
    active_params_published: Params | None = None


class ModelIn(ModelArchitecture):
    """A catalog model as written with PUT: the architecture plus identity and provenance."""

    model_config = schema_examples(MODEL_IN_EXAMPLE)

    name: Name
    hf_id: Label = Field("", description="Hugging Face repository id")
    source: LongText = ""
    notes: LongText = ""


class ModelOut(ModelIn):
    """A catalog model as stored."""

    model_config = schema_examples(MODEL_OUT_EXAMPLE)

    slug: Slug
    architecture: Literal["dense", "moe"]
    attention_type: Literal["mha", "mqa", "gqa", "mla"]
    origin: Origin
    version: int = Field(ge=1, description="Bumped by every write")
    created_at: UtcDatetime
    updated_at: UtcDatetime
    written_by: str | None = Field(None, description=WRITTEN_BY_DESCRIPTION)


class GpuSpecIn(BaseModel):
    """One accelerator. Peak rates are dense (no structured sparsity), in TFLOP/s."""

    model_config = INPUT_CONFIG | schema_examples(GPU_SPEC_EXAMPLE)

    name: Label = ""
    family: Annotated[str, Field(pattern=r"^[a-z0-9-]{0,32}$")] = Field(
        "", description=("Generation used to group calibration: ampere, hopper, blackwell, blackwell-sm120, ada, "
                         "cdna3, ..."))
    vendor: Annotated[str, Field(max_length=64, pattern=NO_NUL_PATTERN)] = Field(
        "", description=("Its maker (NVIDIA, AMD, ...): where a calibration profile has no entry for the family, "
                         "its efficiencies come from the maker's entry before the global one"))
    memory_bytes: Annotated[int, Field(ge=1, le=10**13)] = Field(description="Total as the driver reports it")
    cuda_memory_bytes: Annotated[int, Field(ge=1, le=10**13)] | None = Field(
        None, description="Total as CUDA reports it (torch.cuda.mem_get_info), what vLLM and TensorRT-LLM size "
                          "their KV cache from; null = not measured (memory_bytes is used, and says so)")
    memory_bandwidth_bytes_per_s: BytesPerS
    interconnect_bandwidth_bytes_per_s: BytesPerS = Field(description="Per GPU, per direction, inside a node")
    gpus_per_node: Annotated[int, Field(ge=1, le=100_000)] = Field(8, description="GPUs in one fast-interconnect domain")
    scale_out_bandwidth_bytes_per_s: BytesPerS = Field(50e9, description="Per GPU, per direction, between nodes")
    fp32_tflops: Tflops | None = None
    tf32_tflops: Tflops | None = None
    bf16_tflops: Tflops | None = None
    fp16_tflops: Tflops | None = None
    fp8_tflops: Tflops | None = None
    int8_tops: Tflops | None = None
    fp4_tflops: Tflops | None = None
    tdp_w: Annotated[float, Field(gt=0, le=100_000)] | None = None
    price_per_hour_usd: Annotated[float, Field(ge=0, le=100_000)] | None = Field(
        None, description="List price per GPU-hour; null where no public price exists")


class GpuIn(GpuSpecIn):
    """A catalog GPU as written with PUT: the spec plus identity and provenance."""

    model_config = schema_examples(GPU_IN_EXAMPLE)

    name: Name
    vendor: Annotated[str, Field(min_length=1, max_length=64, pattern=NO_NUL_PATTERN)]  # its column's width
    form_factor: Label = ""
    interconnect: Label = Field("", description="Interconnect kind, in words")
    price_source: LongText = ""
    source: LongText = ""
    notes: LongText = ""


class GpuOut(GpuIn):
    """A catalog GPU as stored."""

    model_config = schema_examples(GPU_OUT_EXAMPLE)

    slug: Slug
    origin: Origin
    version: int = Field(ge=1, description="Bumped by every write")
    created_at: UtcDatetime
    updated_at: UtcDatetime
    written_by: str | None = Field(None, description=WRITTEN_BY_DESCRIPTION)


# PUT accepts what GET returns: the read-only fields may be sent back (a client edits the row it
# read and sends it whole). They are checked against the stored row, never written.
READ_ONLY_FIELDS = ("slug", "origin", "version", "created_at", "updated_at", "written_by", "architecture",
                    "attention_type")
_ECHO = "Read-only, as GET returns it: may be sent back unchanged (or omitted); never written."
# Strictness off for these: a datetime arrives as its JSON string, as GET wrote it.
EchoedDatetime = Annotated[UtcDatetime | None, Field(None, strict=False, description=_ECHO)]


class RowEcho(BaseModel):
    """The read-only fields of a stored row, optional on input."""

    slug: Slug | None = Field(None, description=_ECHO + " A different slug than the URL's is a 422.")
    origin: Origin | None = Field(None, description=_ECHO)
    version: Annotated[int, Field(ge=1)] | None = Field(
        None, description=_ECHO + " Not the stored version: 412, as a stale If-Match.")
    created_at: EchoedDatetime
    updated_at: EchoedDatetime
    written_by: str | None = Field(None, max_length=200, description=_ECHO)


class GpuPut(GpuIn, RowEcho):
    """The body of PUT /v1/gpus/{slug}: a GPU as written, or as read with GET."""


class ModelPut(ModelIn, RowEcho):
    """The body of PUT /v1/models/{slug}: a model as written, or as read with GET."""

    architecture: Literal["dense", "moe"] | None = Field(None, description=_ECHO + " Derived from the architecture.")
    attention_type: Literal["mha", "mqa", "gqa", "mla"] | None = Field(None, description=_ECHO)


def split_read_only(body: BaseModel) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the writable fields, the read-only fields the client sent back)."""
    echoed = body.model_dump(include=set(READ_ONLY_FIELDS), exclude_none=True)
    return body.model_dump(exclude=set(READ_ONLY_FIELDS)), echoed


class GpuPage(Page[GpuOut]):
    model_config = schema_examples({"items": [GPU_OUT_EXAMPLE], "total": 34, "limit": 50, "offset": 0})


class ModelPage(Page[ModelOut]):
    model_config = schema_examples({"items": [MODEL_OUT_EXAMPLE], "total": 38, "limit": 50, "offset": 0})


class ModelImport(BaseModel):
    """A Hugging Face config.json, normalized to the catalog shape (and stored unless dry_run)."""

    slug: Slug
    stored: bool = Field(description="false for a dry run")
    version: int | None = Field(None, description="Catalog version after storing; null for a dry run")
    model: ModelIn
    architecture: Literal["dense", "moe"]
    attention_type: Literal["mha", "mqa", "gqa", "mla"]
    defaults_applied: list[str] = Field(description="Fields the config omitted, filled from library defaults")
    notes: list[str] = Field(description="Other observations, e.g. keys that were ignored and why")

    model_config = schema_examples({
        "slug": "falcon-7b", "stored": False, "version": None,
        "model": {**MODEL_IN_EXAMPLE, "name": "tiiuae/falcon-7b", "hf_id": "tiiuae/falcon-7b",
                  "num_hidden_layers": 32, "hidden_size": 4544, "num_attention_heads": 71,
                  "num_key_value_heads": 1, "head_dim": None, "vocab_size": 65024, "intermediate_size": None,
                  "mlp_gated": False, "tie_word_embeddings": True, "max_position_embeddings": 2048,
                  "total_params_published": None, "active_params_published": None,
                  "source": "Imported from a Hugging Face config.json", "notes": ""},
        "architecture": "dense", "attention_type": "mqa",
        "defaults_applied": ["max_position_embeddings = 2048 (FalconConfig default)"],
        "notes": ["num_kv_heads 71 ignored: multi_query"],
    })


# Schema -> domain spec, with construction errors as 422 problems ---------------------------

S = TypeVar("S")


def _spec_or_problem(build: Callable[[], S], field_names: set[str], pointer: str) -> S:
    try:
        return build()
    except ValueError as exc:
        message = str(exc)
        field = named_field(message, field_names)  # point at the field the message names, where it names one
        raise Unprocessable(message, errors=[(f"{pointer}/{field}" if field else pointer, message)]) from None


def model_spec_from_schema(model: ModelArchitecture, *, pointer: str = "/body/model_spec",
                           slug: str = "", name: str = "") -> ModelSpec:
    """The domain `ModelSpec`; an inconsistent architecture is a 422 naming the field."""
    names = {f.name for f in dataclass_fields(ModelSpec)}
    return _spec_or_problem(lambda: model_spec_from_record(model, slug=slug, name=name), names, pointer)


def gpu_spec_from_schema(gpu: GpuSpecIn, *, pointer: str = "/body/gpu_spec", slug: str = "") -> GpuSpec:
    """The domain `GpuSpec` (TFLOP/s -> FLOP/s); an inconsistent spec is a 422 naming the field."""
    names = set(GpuSpecIn.model_fields)
    return _spec_or_problem(lambda: gpu_spec_from_record(gpu, slug=slug), names, pointer)

