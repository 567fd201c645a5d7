"""Catalog tables: gpus, models, the catalog revision counter, tombstones of deleted reference rows.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    revision_table = op.create_table(
        "catalog_revision",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("revision", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_catalog_revision")),
    )
    # The counter's only row: every catalog write bumps it (see app.repository).
    op.bulk_insert(revision_table, [{"id": 1, "revision": 0}])
    op.create_table(
        "catalog_tombstones",
        sa.Column("kind", sa.String(length=8), nullable=False),
        sa.Column("slug", sa.String(length=64), nullable=False),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("kind", "slug", name=op.f("pk_catalog_tombstones")),
    )
    op.create_table(
        "gpus",
        sa.Column("slug", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("vendor", sa.String(length=64), nullable=False),
        sa.Column("family", sa.String(length=32), nullable=False),
        sa.Column("form_factor", sa.String(length=200), nullable=False),
        sa.Column("memory_bytes", sa.BigInteger(), nullable=False),
        sa.Column("memory_bandwidth_bytes_per_s", sa.Double(), nullable=False),
        sa.Column("fp32_tflops", sa.Double(), nullable=True),
        sa.Column("tf32_tflops", sa.Double(), nullable=True),
        sa.Column("bf16_tflops", sa.Double(), nullable=True),
        sa.Column("fp16_tflops", sa.Double(), nullable=True),
        sa.Column("fp8_tflops", sa.Double(), nullable=True),
        sa.Column("int8_tops", sa.Double(), nullable=True),
        sa.Column("fp4_tflops", sa.Double(), nullable=True),
        sa.Column("interconnect", sa.String(length=200), nullable=False),
        sa.Column("interconnect_bandwidth_bytes_per_s", sa.Double(), nullable=False),
        sa.Column("gpus_per_node", sa.Integer(), nullable=False),
        sa.Column("scale_out_bandwidth_bytes_per_s", sa.Double(), nullable=False),
        sa.Column("tdp_w", sa.Double(), nullable=True),
        sa.Column("price_per_hour_usd", sa.Double(), nullable=True),
        sa.Column("price_source", sa.Text(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("notes", sa.Text(), nullable=False),
        sa.Column("origin", sa.String(length=16), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("origin IN ('reference', 'user')", name=op.f("ck_gpus_origin")),
        sa.PrimaryKeyConstraint("slug", name=op.f("pk_gpus")),
    )
    op.create_table(
        "models",
        sa.Column("slug", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("hf_id", sa.String(length=200), nullable=False),
        sa.Column("architecture", sa.String(length=8), nullable=False),
        sa.Column("attention_type", sa.String(length=8), nullable=False),
        sa.Column("num_hidden_layers", sa.Integer(), nullable=False),
        sa.Column("hidden_size", sa.Integer(), nullable=False),
        sa.Column("num_attention_heads", sa.Integer(), nullable=False),
        sa.Column("num_key_value_heads", sa.Integer(), nullable=False),
        sa.Column("head_dim", sa.Integer(), nullable=True),
        sa.Column("vocab_size", sa.Integer(), nullable=False),
        sa.Column("intermediate_size", sa.Integer(), nullable=True),
        sa.Column("mlp_gated", sa.Boolean(), nullable=False),
        sa.Column("attention_bias", sa.Boolean(), nullable=False),
        sa.Column("tie_word_embeddings", sa.Boolean(), nullable=False),
        sa.Column("max_position_embeddings", sa.Integer(), nullable=False),
        sa.Column("num_experts", sa.Integer(), nullable=False),
        sa.Column("num_experts_per_tok", sa.Integer(), nullable=False),
        sa.Column("n_shared_experts", sa.Integer(), nullable=False),
        sa.Column("moe_intermediate_size", sa.Integer(), nullable=True),
        sa.Column("shared_expert_intermediate_size", sa.Integer(), nullable=True),
        sa.Column("first_k_dense_replace", sa.Integer(), nullable=False),
        sa.Column("moe_layers", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("kv_lora_rank", sa.Integer(), nullable=True),
        sa.Column("q_lora_rank", sa.Integer(), nullable=True),
        sa.Column("qk_rope_head_dim", sa.Integer(), nullable=True),
        sa.Column("qk_nope_head_dim", sa.Integer(), nullable=True),
        sa.Column("v_head_dim", sa.Integer(), nullable=True),
        sa.Column("layer_types", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("sliding_window", sa.Integer(), nullable=True),
        sa.Column("attention_chunk_size", sa.Integer(), nullable=True),
        sa.Column("dtype", sa.String(length=8), nullable=False),
        sa.Column("total_params_published", sa.BigInteger(), nullable=True),
        sa.Column("active_params_published", sa.BigInteger(), nullable=True),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("notes", sa.Text(), nullable=False),
        sa.Column("origin", sa.String(length=16), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("origin IN ('reference', 'user')", name=op.f("ck_models_origin")),
        sa.PrimaryKeyConstraint("slug", name=op.f("pk_models")),
    )


def downgrade() -> None:
    op.drop_table("models")
    op.drop_table("gpus")
    op.drop_table("catalog_tombstones")
    op.drop_table("catalog_revision")
