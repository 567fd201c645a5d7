"""Catalog tables: accelerators, model architectures, and the catalog revision counter.

Units live in column names: bytes and bytes/s for sizes and bandwidths, TFLOP/s (dense, as the
reference data gives them) for compute; conversion to FLOP/s happens when a spec is built.
Model architecture columns use Hugging Face `config.json` names.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, CheckConstraint, DateTime, Double, Integer, String, Text
from sqlalchemy.orm import Mapped, declared_attr, mapped_column

from app.db import Base

ORIGIN_REFERENCE = "reference"  # loaded from app/data; the loader may update it
ORIGIN_USER = "user"  # created or edited through the API; the loader never touches it


class CatalogRow:
    """Columns every catalog table has: identity, provenance, optimistic-concurrency version."""

    slug: Mapped[str] = mapped_column(String(64), primary_key=True, sort_order=-2)
    name: Mapped[str] = mapped_column(String(200), sort_order=-1)
    source: Mapped[str] = mapped_column(Text, default="")
    notes: Mapped[str] = mapped_column(Text, default="")
    origin: Mapped[str] = mapped_column(String(16))
    # Bumped by every UPDATE, which carries `WHERE version = <version read>`: of two writers
    # that read the same version, only one can win (SQLAlchemy raises StaleDataError for the other).
    version: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # Name of the API key that last wrote the row (at updated_at); null for reference data.
    written_by: Mapped[str | None] = mapped_column(String(64))

    @declared_attr.directive
    def __table_args__(cls) -> tuple[Any, ...]:
        return (CheckConstraint("origin IN ('reference', 'user')", name="origin"),)

    @declared_attr.directive
    def __mapper_args__(cls) -> dict[str, Any]:
        return {"version_id_col": cls.__table__.c.version}


class GpuRecord(CatalogRow, Base):
    __tablename__ = "gpus"

    vendor: Mapped[str] = mapped_column(String(64))
    family: Mapped[str] = mapped_column(String(32), default="")
    form_factor: Mapped[str] = mapped_column(String(200), default="")
    memory_bytes: Mapped[int] = mapped_column(BigInteger)  # what the driver reports as total
    # What CUDA reports as total (torch.cuda.mem_get_info), below the driver's total; null = not measured.
    cuda_memory_bytes: Mapped[int | None] = mapped_column(BigInteger)
    memory_bandwidth_bytes_per_s: Mapped[float] = mapped_column(Double)
    fp32_tflops: Mapped[float | None] = mapped_column(Double)
    tf32_tflops: Mapped[float | None] = mapped_column(Double)
    bf16_tflops: Mapped[float | None] = mapped_column(Double)
    fp16_tflops: Mapped[float | None] = mapped_column(Double)
    fp8_tflops: Mapped[float | None] = mapped_column(Double)
    int8_tops: Mapped[float | None] = mapped_column(Double)
    fp4_tflops: Mapped[float | None] = mapped_column(Double)
    interconnect: Mapped[str] = mapped_column(String(200), default="")  # kind, in words
    interconnect_bandwidth_bytes_per_s: Mapped[float] = mapped_column(Double)  # per GPU, per direction
    gpus_per_node: Mapped[int] = mapped_column(Integer)
    scale_out_bandwidth_bytes_per_s: Mapped[float] = mapped_column(Double)  # per GPU, per direction
    tdp_w: Mapped[float | None] = mapped_column(Double)
    price_per_hour_usd: Mapped[float | None] = mapped_column(Double)
    price_source: Mapped[str] = mapped_column(Text, default="")


class ModelRecord(CatalogRow, Base):
    __tablename__ = "models"

    hf_id: Mapped[str] = mapped_column(String(200), default="")
    # Derived from the fields below on every write (filters for the list endpoint).
    architecture: Mapped[str] = mapped_column(String(8))  # dense | moe
    attention_type: Mapped[str] = mapped_column(String(8))  # mha | mqa | gqa | mla
    num_hidden_layers: Mapped[int] = mapped_column(Integer)
    hidden_size: Mapped[int] = mapped_column(Integer)
    num_attention_heads: Mapped[int] = mapped_column(Integer)
    num_key_value_heads: Mapped[int] = mapped_column(Integer)
    head_dim: Mapped[int | None] = mapped_column(Integer)
    vocab_size: Mapped[int] = mapped_column(Integer)
    intermediate_size: Mapped[int | None] = mapped_column(Integer)
    mlp_gated: Mapped[bool]
    attention_bias: Mapped[bool]
    tie_word_embeddings: Mapped[bool]
    max_position_embeddings: Mapped[int] = mapped_column(Integer)
    # MoE
    num_experts: Mapped[int] = mapped_column(Integer)
    num_experts_per_tok: Mapped[int] = mapped_column(Integer)
    n_shared_experts: Mapped[int] = mapped_column(Integer)
    moe_intermediate_size: Mapped[int | None] = mapped_column(Integer)
    shared_expert_intermediate_size: Mapped[int | None] = mapped_column(Integer)
    first_k_dense_replace: Mapped[int] = mapped_column(Integer)
    moe_layers: Mapped[list[int] | None] = mapped_column(JSON(none_as_null=True))
    # MLA
    kv_lora_rank: Mapped[int | None] = mapped_column(Integer)
    q_lora_rank: Mapped[int | None] = mapped_column(Integer)
    qk_rope_head_dim: Mapped[int | None] = mapped_column(Integer)
    qk_nope_head_dim: Mapped[int | None] = mapped_column(Integer)
    v_head_dim: Mapped[int | None] = mapped_column(Integer)
    # Attention layout: one entry per layer, null = all full attention
    layer_types: Mapped[list[str] | None] = mapped_column(JSON(none_as_null=True))
    sliding_window: Mapped[int | None] = mapped_column(Integer)
    attention_chunk_size: Mapped[int | None] = mapped_column(Integer)
    # Published sizes and the default weight precision
    dtype: Mapped[str] = mapped_column(String(8))
    total_params_published: Mapped[int | None] = mapped_column(BigInteger)
    active_params_published: Mapped[int | None] = mapped_column(BigInteger)


class CatalogRevision(Base):
    """One row, bumped in the same transaction as every catalog write.

    Each replica compares it with the revision its spec cache was filled at, so a write made
    through any replica invalidates the caches of all of them.
    """

    __tablename__ = "catalog_revision"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    revision: Mapped[int] = mapped_column(BigInteger)


class CatalogTombstone(Base):
    """A reference row a user deleted, so the reference loader does not bring it back."""

    __tablename__ = "catalog_tombstones"

    kind: Mapped[str] = mapped_column(String(8), primary_key=True)  # gpu | model
    slug: Mapped[str] = mapped_column(String(64), primary_key=True)
    deleted_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


def column_values(record: Any) -> dict[str, Any]:
    """The mapped column values of a record, by attribute name."""
    return {column.key: getattr(record, column.key) for column in record.__mapper__.column_attrs}
