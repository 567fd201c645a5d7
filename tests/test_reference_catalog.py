"""The reference catalog matches the sourced data row for row; derived fields follow their rules;
the loader is idempotent and leaves users' rows alone; specs and their cache behave."""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, select
from sqlalchemy.orm import Session

from app import web
from app.catalog import service as catalog_service
from app.catalog.reference import (
    DATA_DIR,
    GPU_FAMILY,
    gpu_spec_from_record,
    load_reference_catalog,
    model_spec_from_record,
)
from app.catalog.repository import catalog_revision
from app.catalog.schemas import GpuIn
from app.catalog.tables import CatalogTombstone, GpuRecord, ModelRecord
from app.db import MEMORY_ONLY, NeedsDatabase, make_session_factory
from app.errors import NotFound

SHARED_DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
COPIED_FILES = ("gpus.csv", "models.json", "catalog-notes.md", "gpu-prices.csv", "gpu-prices.md")

# The slugs listed in the shared data README ("Catalog slugs"), copied verbatim.
README_GPU_SLUGS = """a100-40gb-sxm a100-80gb-sxm a100-80gb-pcie h100-sxm h100-pcie h100-nvl h200-sxm h200-nvl h20
gh200-96gb gh200-144gb b200 b300 gb200 gb300 l4 l40s a10g a10 t4 v100-sxm2-32gb v100-pcie-32gb
rtx-4090 rtx-6000-ada rtx-pro-6000 mi250x mi300x mi325x mi355x gaudi2 gaudi3 tpu-v5e tpu-v5p tpu-v6e""".split()  # noqa: SIM905
README_MODEL_SLUGS = """llama-2-7b llama-2-13b llama-2-70b llama-3-8b llama-3-70b llama-3.1-8b llama-3.1-70b
llama-3.1-405b llama-3.2-1b llama-3.2-3b llama-3.3-70b mistral-7b-v0.1 mistral-7b-v0.3
mistral-nemo-12b mistral-large-2407 mixtral-8x7b mixtral-8x22b qwen2.5-7b qwen2.5-14b qwen2.5-32b
qwen2.5-72b qwen3-8b qwen3-32b qwen3-30b-a3b qwen3-235b-a22b deepseek-v3 deepseek-r1 gemma-2-9b
gemma-2-27b falcon-7b falcon-40b falcon-180b gpt-oss-20b gpt-oss-120b gpt-j-6b opt-13b
llama-4-scout llama-4-maverick""".split()  # noqa: SIM905


def _csv_rows() -> list[dict[str, str]]:
    with (DATA_DIR / "gpus.csv").open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def _json_models() -> list[dict]:
    return json.loads((DATA_DIR / "models.json").read_text(encoding="utf-8"))


def _optional(row: dict[str, str], column: str) -> float | None:
    return float(row[column]) if row[column] else None


def _gpu(session: Session, slug: str) -> GpuRecord:
    record = session.get(GpuRecord, slug)
    assert record is not None, slug
    return record


def _model(session: Session, slug: str) -> ModelRecord:
    record = session.get(ModelRecord, slug)
    assert record is not None, slug
    return record


# The data files ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", COPIED_FILES)
def test_app_data_is_a_byte_identical_copy_of_the_shared_data(name: str) -> None:
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is not beside this checkout")
    assert (DATA_DIR / name).read_bytes() == (SHARED_DATA / name).read_bytes()


def test_catalog_holds_exactly_the_readme_slugs(db_session: Session) -> None:
    gpu_slugs = db_session.scalars(select(GpuRecord.slug)).all()
    model_slugs = db_session.scalars(select(ModelRecord.slug)).all()
    assert sorted(gpu_slugs) == sorted(README_GPU_SLUGS) and len(gpu_slugs) == 34
    assert sorted(model_slugs) == sorted(README_MODEL_SLUGS) and len(model_slugs) == 38
    assert {r.origin for r in db_session.scalars(select(GpuRecord))} == {"reference"}


# Row for row ------------------------------------------------------------------------------

def test_every_gpu_row_matches_gpus_csv(db_session: Session) -> None:
    for row in _csv_rows():
        record = _gpu(db_session, row["slug"])

        assert record.name == row["name"]
        assert record.vendor == row["vendor"]
        assert record.form_factor == row["form_factor"]
        assert record.memory_bytes == int(row["memory_bytes"])
        # TB/s and GB/s are decimal: x 1e12 and x 1e9, exactly.
        assert record.memory_bandwidth_bytes_per_s == float(Decimal(row["hbm_bandwidth_tb_s"]) * 10**12)
        assert record.interconnect_bandwidth_bytes_per_s == float(
            Decimal(row["interconnect_bw_gb_s_unidirectional"]) * 10**9)
        assert record.fp32_tflops == _optional(row, "fp32_tflops")
        assert record.tf32_tflops == _optional(row, "tf32_tflops_dense")
        assert record.bf16_tflops == _optional(row, "bf16_tflops_dense")
        assert record.fp16_tflops == _optional(row, "fp16_tflops_dense")
        assert record.fp8_tflops == _optional(row, "fp8_tflops_dense")
        assert record.int8_tops == _optional(row, "int8_tops_dense")
        assert record.fp4_tflops == _optional(row, "fp4_tflops_dense")
        assert record.interconnect == row["interconnect"]
        assert record.tdp_w == _optional(row, "tdp_w")
        assert record.price_per_hour_usd == _optional(row, "price_per_hour_usd")
        assert record.price_source == row["price_source"]
        assert record.source == row["source"]
        assert record.notes.startswith(row["notes"])
        assert "Derived (not in gpus.csv)" in record.notes
        # memory_gib in the data is memory_bytes / 2^30, to 3 decimals.
        assert round(record.memory_bytes / 2**30, 3) == pytest.approx(float(row["memory_gib"]), abs=1e-3)


def test_every_model_row_matches_models_json(db_session: Session) -> None:
    same_name = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                 "vocab_size", "intermediate_size", "tie_word_embeddings", "moe_intermediate_size",
                 "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
                 "layer_types", "moe_layers", "sliding_window", "architecture", "attention_type")
    null_is_zero = ("num_experts", "num_experts_per_tok", "n_shared_experts", "first_k_dense_replace")
    for entry in _json_models():
        record = _model(db_session, entry["slug"])
        for field in same_name:
            assert getattr(record, field) == entry[field], (entry["slug"], field)
        for field in null_is_zero:
            assert getattr(record, field) == (entry[field] or 0), (entry["slug"], field)
        assert record.attention_chunk_size == entry.get("attention_chunk_size")
        if entry["max_position_embeddings"] is None:
            # Only Falcon omits it; FalconConfig's default is 2048.
            assert entry["slug"].startswith("falcon-") and record.max_position_embeddings == 2048
        else:
            assert record.max_position_embeddings == entry["max_position_embeddings"]
        assert record.name == entry["name"]
        assert record.hf_id == entry["hf_id"]
        assert record.total_params_published == entry["total_params"]
        assert record.active_params_published == entry["active_params"]
        assert entry["source"] in record.source
        assert entry["params_source"] in record.source
        assert record.notes.startswith(entry["notes"])
        assert record.shared_expert_intermediate_size is None


# Derived fields, checked by hand ------------------------------------------------------------

@pytest.mark.parametrize(
    ("slug", "family", "gpus_per_node", "scale_out"),
    [
        # SXM baseboard: 8 per node; one 400 Gb/s NIC per GPU = 400e9 / 8 = 50e9 B/s.
        ("h100-sxm", "hopper", 8, 50e9),
        ("mi300x", "cdna3", 8, 50e9),
        # NVL72: the NVLink domain is the whole rack.
        ("gb200", "blackwell", 72, 50e9),
        # GH200 superchip module: one GPU per node.
        ("gh200-96gb", "hopper", 1, 50e9),
        # TPU v5p: "TPU chip (4 per host)"; ICI 1200 GB/s bidirectional = 600e9 B/s per direction.
        ("tpu-v5p", "tpu", 4, 600e9),
        # TPU v5e: 8 per host; ICI 400 GB/s bidirectional = 200e9 per direction.
        ("tpu-v5e", "tpu", 8, 200e9),
        # Gaudi 2: 3 scale-out ports x 100 Gb/s = 300 Gb/s = 37.5e9 B/s.
        ("gaudi2", "gaudi", 8, 37.5e9),
        # Gaudi 3: 3 x 200 Gb/s = 600 Gb/s = 75e9 B/s.
        ("gaudi3", "gaudi", 8, 75e9),
        # NVLink-bridged PCIe cards: the bridge group is the fast domain; PCIe Gen5 x16 = 64e9 beyond.
        ("h100-nvl", "hopper", 2, 64e9),
        ("h200-nvl", "hopper", 4, 64e9),
        # PCIe Gen4 x16 card: 32e9 B/s per direction caps scale-out below the 50e9 NIC.
        ("l4", "ada", 8, 32e9),
        # PCIe Gen3 x16: 16e9.
        ("t4", "turing", 8, 16e9),
        # PCIe Gen5 x16 (64e9) does not cap the 50e9 NIC.
        ("rtx-pro-6000", "blackwell-sm120", 8, 50e9),
    ],
)
def test_derived_gpu_topology(db_session: Session, slug: str, family: str, gpus_per_node: int,
                              scale_out: float) -> None:
    record = _gpu(db_session, slug)
    assert (record.family, record.gpus_per_node, record.scale_out_bandwidth_bytes_per_s) == (
        family, gpus_per_node, scale_out)
    assert f"gpus_per_node = {gpus_per_node}" in record.notes


@pytest.mark.parametrize(
    ("slug", "pcie"),
    [
        ("l40s", True),  # "PCIe Gen4 x16 (64 GB/s bidir; no NVLink)"
        ("rtx-pro-6000", True),  # "PCIe Gen5 x16 (no NVLink; GPUDirect P2P over PCIe)"
        ("a100-80gb-pcie", True),  # "PCIe Gen4 x16 (optional 2-GPU NVLink bridge ...)": the catalog counts no bridge
        ("h100-nvl", False),  # "PCIe Gen5 x16 + NVLink bridge": the bridged pair is the node (300e9 B/s)
        ("h200-nvl", False),
        ("h100-sxm", False),  # "NVLink 4 (18 links) + PCIe Gen5 x16"
        ("mi300x", False),  # "AMD Infinity Fabric ..."
        ("gaudi2", False),  # "24x 100 GbE RoCE v2 on-die ..."
    ],
)
def test_gpus_whose_node_talks_over_pcie(db_session: Session, slug: str, pcie: bool) -> None:
    assert gpu_spec_from_record(_gpu(db_session, slug)).pcie_links is pcie


def test_every_gpu_has_a_known_family() -> None:
    assert set(GPU_FAMILY) == set(README_GPU_SLUGS)
    assert set(GPU_FAMILY.values()) <= {"ampere", "hopper", "blackwell", "blackwell-sm120", "ada", "turing",
                                        "volta", "cdna2", "cdna3", "cdna4", "gaudi", "tpu"}


@pytest.mark.parametrize(
    ("slug", "mlp_gated", "attention_bias", "dtype"),
    [
        ("llama-3-70b", True, False, "bf16"),
        ("falcon-7b", False, False, "bf16"),  # plain GELU MLP, no biases
        ("gpt-j-6b", False, False, "bf16"),
        ("opt-13b", False, True, "bf16"),  # GELU MLP; OPTConfig enable_bias defaults to true
        ("qwen2.5-7b", True, True, "bf16"),  # QKV bias
        ("gpt-oss-120b", True, True, "fp4"),  # attention_bias true; experts ship in MXFP4
        ("deepseek-v3", True, False, "fp8"),  # FP8 block-quantized weights
    ],
)
def test_derived_model_fields(db_session: Session, slug: str, mlp_gated: bool, attention_bias: bool,
                              dtype: str) -> None:
    record = _model(db_session, slug)
    assert (record.mlp_gated, record.attention_bias, record.dtype) == (mlp_gated, attention_bias, dtype)


# Specs built from catalog rows -------------------------------------------------------------

def test_h100_spec_is_in_si_units(db_session: Session) -> None:
    spec = gpu_spec_from_record(_gpu(db_session, "h100-sxm"))
    assert spec.memory_bytes == 85_520_809_984  # 81,559 MiB x 2^20
    assert spec.memory_bandwidth_bytes_per_s == 3.35e12
    assert spec.interconnect_bandwidth_bytes_per_s == 450e9  # NVLink 4: 900 GB/s bidirectional / 2
    assert spec.bf16_flops_per_s == 989.5e12
    assert spec.fp8_flops_per_s == 1979e12
    assert spec.int8_ops_per_s == 1979e12
    assert spec.fp4_flops_per_s is None  # Hopper has no FP4 tensor cores
    assert spec.slug == "h100-sxm" and spec.family == "hopper"
    # SIZING.md: the H100 SXM bf16 ridge point is about 295 FLOP/byte (989.5e12 / 3.35e12 = 295.4).
    assert round(spec.bf16_flops_per_s / spec.memory_bandwidth_bytes_per_s) == 295


@pytest.mark.parametrize(
    ("slug", "kv_bytes_per_token_bf16"),
    [
        ("llama-3-70b", 327_680),  # 2 x 80 layers x 8 KV heads x 128 x 2 B (SIZING.md check value)
        ("llama-3-8b", 131_072),  # 2 x 32 x 8 x 128 x 2
        ("mixtral-8x7b", 131_072),  # 2 x 32 x 8 x 128 x 2
        ("llama-2-7b", 524_288),  # 2 x 32 x 32 x 128 x 2 (full MHA)
    ],
)
def test_catalog_geometry_reproduces_the_kv_check_values(db_session: Session, slug: str,
                                                         kv_bytes_per_token_bf16: int) -> None:
    spec = model_spec_from_record(_model(db_session, slug))
    per_token = 2 * spec.num_hidden_layers * spec.num_key_value_heads * spec.resolved_head_dim * 2
    assert per_token == kv_bytes_per_token_bf16


def test_deepseek_v3_spec_is_mla_with_58_moe_layers(db_session: Session) -> None:
    spec = model_spec_from_record(_model(db_session, "deepseek-v3"))
    assert spec.is_mla and spec.is_moe
    # MLA caches (kv_lora_rank + qk_rope_head_dim) per layer: (512 + 64) x 61 x 2 B = 70,272 B/token.
    assert (spec.kv_lora_rank + spec.qk_rope_head_dim) * spec.num_hidden_layers * 2 == 70_272
    # first_k_dense_replace = 3: layers 3..60 are MoE, 61 - 3 = 58.
    assert spec.moe_layer_indices == frozenset(range(3, 61))
    assert (spec.num_experts, spec.num_experts_per_tok, spec.n_shared_experts) == (256, 8, 1)


def test_gemma_2_9b_alternates_sliding_and_global_layers(db_session: Session) -> None:
    spec = model_spec_from_record(_model(db_session, "gemma-2-9b"))
    # 42 layers: even indices slide over 4096 tokens, odd indices are global (21 each).
    assert spec.layer_types == tuple("sliding_attention" if i % 2 == 0 else "full_attention" for i in range(42))
    assert spec.sliding_window == 4096
    assert spec.head_dim == 256  # 16 heads x 256 = 4096 != hidden_size 3584


# The loader ---------------------------------------------------------------------------------

def test_loader_is_idempotent(engine: Engine, fresh_catalog: None) -> None:
    with Session(engine) as session, session.begin():
        before = catalog_revision(session)
        report = load_reference_catalog(session)
        assert (report.inserted, report.updated, report.unchanged, report.kept_user_rows) == (0, 0, 72, 0)
        assert catalog_revision(session) == before  # nothing changed: caches stay valid


def test_loader_updates_changed_reference_rows_and_bumps_their_version(engine: Engine, fresh_catalog: None) -> None:
    with Session(engine) as session, session.begin():
        _gpu(session, "l4").memory_bytes = 1  # a stale reference value
    with Session(engine) as session, session.begin():
        before = catalog_revision(session)
        report = load_reference_catalog(session)
        assert (report.inserted, report.updated) == (0, 1)
        record = _gpu(session, "l4")
        assert record.memory_bytes == 24_152_899_584  # 23,034 MiB x 2^20, from gpus.csv
        assert record.version == 3  # 1 on insert, 2 for the stale edit, 3 for the reload
        assert catalog_revision(session) == before + 1


def test_loader_never_touches_user_rows_nor_brings_back_deleted_ones(engine: Engine, fresh_catalog: None) -> None:
    with Session(engine) as session, session.begin():
        edited = _gpu(session, "a10")
        edited.origin, edited.price_per_hour_usd = "user", 9.99
        session.delete(_model(session, "opt-13b"))
        session.add(CatalogTombstone(kind="model", slug="opt-13b", deleted_at=edited.updated_at))
    with Session(engine) as session, session.begin():
        report = load_reference_catalog(session)
        assert (report.inserted, report.updated, report.kept_user_rows) == (0, 0, 2)
        assert _gpu(session, "a10").price_per_hour_usd == 9.99
        assert session.get(ModelRecord, "opt-13b") is None


# Specs through the service, and the spec cache ---------------------------------------------

def test_get_specs_and_unknown_slugs(db_session: Session) -> None:
    assert catalog_service.get_gpu_spec(db_session, "a100-80gb-sxm").memory_bytes == 85_899_345_920  # 80 GiB
    assert catalog_service.get_model_spec(db_session, "llama-3.1-405b").num_hidden_layers == 126
    with pytest.raises(NotFound):
        catalog_service.get_gpu_spec(db_session, "h900")
    with pytest.raises(NotFound):
        catalog_service.get_model_spec(db_session, "llama-9")
    specs = catalog_service.list_gpu_specs(db_session)
    assert [spec.slug for spec in specs] == sorted(README_GPU_SLUGS)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _reprice(session: Session, slug: str, price: float) -> None:
    record = _gpu(session, slug)
    body = catalog_service.GPUS.out.model_validate(record, from_attributes=True)
    columns = {**body.model_dump(include=set(GpuIn.model_fields)), "price_per_hour_usd": price}
    catalog_service.put(session, catalog_service.GPUS, slug, columns, web.Preconditions(), written_by="key-1")


def test_spec_cache_serves_repeats_and_sees_another_replicas_write_within_its_bound(
        engine: Engine, fresh_catalog: None) -> None:
    """Replica A checks the catalog revision at most every max_age_s (0.25 s here): another replica's
    write is not seen before that (answers come from memory), and is seen once it has passed."""
    clock = FakeClock()
    replica_a = catalog_service.SpecCache(max_age_s=0.25, clock=clock)
    with Session(engine, info={"spec_cache": replica_a}) as session:
        first = catalog_service.get_gpu_spec(session, "h100-sxm")
        assert catalog_service.get_gpu_spec(session, "h100-sxm") is first  # served from the cache
    # Another replica (its own cache) replaces the row and commits.
    with Session(engine, info={"spec_cache": catalog_service.SpecCache()}) as session, session.begin():
        _reprice(session, "h100-sxm", 1.23)
    clock.now += 0.2  # within the bound: A answers from memory, without reading the revision
    with Session(engine, info={"spec_cache": replica_a}) as session:
        assert catalog_service.get_gpu_spec(session, "h100-sxm") is first
    clock.now += 0.06  # 0.26 s since A's last check: past the bound
    with Session(engine, info={"spec_cache": replica_a}) as session:
        assert catalog_service.get_gpu_spec(session, "h100-sxm").price_per_hour_usd == 1.23


def test_spec_cache_sees_its_own_replicas_write_at_once(engine: Engine, fresh_catalog: None) -> None:
    """A write through a session of the replica's own factory invalidates its cache when it commits:
    the next lookup reads the revision again, however recent the last check (the clock never moves)."""
    clock = FakeClock()
    cache = catalog_service.SpecCache(max_age_s=0.25, clock=clock)
    factory = make_session_factory(engine, info={"spec_cache": cache})
    cache.watch_writes(factory)
    with factory() as session:
        assert catalog_service.get_gpu_spec(session, "h100-sxm").price_per_hour_usd != 1.23
    with factory() as session, session.begin():
        _reprice(session, "h100-sxm", 1.23)
    with factory() as session:
        assert catalog_service.get_gpu_spec(session, "h100-sxm").price_per_hour_usd == 1.23


def test_a_rolled_back_write_leaves_the_cache_trusted(engine: Engine, fresh_catalog: None) -> None:
    """Only a committed write invalidates: a rolled-back one leaves the cache answering from memory."""
    clock = FakeClock()
    cache = catalog_service.SpecCache(max_age_s=0.25, clock=clock)
    factory = make_session_factory(engine, info={"spec_cache": cache})
    cache.watch_writes(factory)
    with factory() as session:
        first = catalog_service.get_gpu_spec(session, "h100-sxm")
    with factory() as session:
        _reprice(session, "h100-sxm", 1.23)
        session.rollback()
    with Session(engine, info={"spec_cache": cache, MEMORY_ONLY: True}) as session:
        assert catalog_service.get_gpu_spec(session, "h100-sxm") is first  # no database needed


def test_a_memory_only_lookup_needs_the_database_when_stale_or_missing(engine: Engine, fresh_catalog: None) -> None:
    clock = FakeClock()
    cache = catalog_service.SpecCache(max_age_s=0.25, clock=clock)
    memory_only = Session(info={"spec_cache": cache, MEMORY_ONLY: True})
    with pytest.raises(NeedsDatabase):  # never checked
        catalog_service.get_gpu_spec(memory_only, "h100-sxm")
    with Session(engine, info={"spec_cache": cache}) as session:
        first = catalog_service.get_gpu_spec(session, "h100-sxm")
    assert catalog_service.get_gpu_spec(memory_only, "h100-sxm") is first
    with pytest.raises(NeedsDatabase):  # fresh, but not cached yet
        catalog_service.get_gpu_spec(memory_only, "h200-sxm")
    clock.now += 0.25
    with pytest.raises(NeedsDatabase):  # cached, but due for its revision check
        catalog_service.get_gpu_spec(memory_only, "h100-sxm")


def test_one_revision_check_at_a_time(engine: Engine, fresh_catalog: None) -> None:
    """The first memory-only lookup that finds the cache due claims the check (NeedsDatabase: it goes to
    the database); the lookups after it answer from the cached revision until that check lands or its
    claim is CHECK_CLAIM_S (1 s) old. Another replica's write meanwhile is therefore seen within
    max_age_s + 1 s; a write of this replica's is never answered from before it."""
    clock = FakeClock()
    cache = catalog_service.SpecCache(max_age_s=0.25, clock=clock)
    factory = make_session_factory(engine, info={"spec_cache": cache})
    cache.watch_writes(factory)
    memory_only = Session(info={"spec_cache": cache, MEMORY_ONLY: True})
    with factory() as session:
        first = catalog_service.get_gpu_spec(session, "h100-sxm")
    clock.now += 0.25  # due
    with pytest.raises(NeedsDatabase):  # claims the check
        catalog_service.get_gpu_spec(memory_only, "h100-sxm")
    assert catalog_service.get_gpu_spec(memory_only, "h100-sxm") is first  # the check is under way
    with Session(engine, info={"spec_cache": catalog_service.SpecCache()}) as other, other.begin():
        _reprice(other, "h100-sxm", 1.23)  # another replica writes
    clock.now += 0.9  # the claim is 0.9 s old: still answered from the cache
    assert catalog_service.get_gpu_spec(memory_only, "h100-sxm") is first
    clock.now += 0.2  # 1.1 s: the claim has lapsed, the next lookup claims again
    with pytest.raises(NeedsDatabase):
        catalog_service.get_gpu_spec(memory_only, "h100-sxm")
    with factory() as session:  # the check lands
        assert catalog_service.get_gpu_spec(session, "h100-sxm").price_per_hour_usd == 1.23
    second = catalog_service.get_gpu_spec(memory_only, "h100-sxm")
    assert second.price_per_hour_usd == 1.23
    with factory() as session, session.begin():  # this replica writes
        _reprice(session, "h100-sxm", 2.34)
    with pytest.raises(NeedsDatabase):  # its own write: claims the check ...
        catalog_service.get_gpu_spec(memory_only, "h100-sxm")
    with pytest.raises(NeedsDatabase):  # ... and no lookup answers from before the write meanwhile
        catalog_service.get_gpu_spec(memory_only, "h100-sxm")
    with factory() as session:
        assert catalog_service.get_gpu_spec(session, "h100-sxm").price_per_hour_usd == 2.34


def test_a_claimed_check_runs_in_the_background_and_never_beyond_the_bound(
        engine: Engine, fresh_catalog: None, caplog: pytest.LogCaptureFixture) -> None:
    """With check_in_background (the service), the lookup that claims a due check answers from the cache
    too, and the check runs on its own (here: when the test runs it). Nothing answers from a revision
    last read more than max_age_s + CHECK_CLAIM_S (0.25 + 1 s) ago, a failed check is logged without
    its message and claimed again after CHECK_CLAIM_S, and this replica's own write is never answered
    from before it."""
    clock = FakeClock()
    cache = catalog_service.SpecCache(max_age_s=0.25, clock=clock)
    factory = make_session_factory(engine, info={"spec_cache": cache})
    cache.watch_writes(factory)
    checks: list[Callable[[], None]] = []
    cache.check_in_background(factory, start=checks.append)
    memory_only = Session(info={"spec_cache": cache, MEMORY_ONLY: True})
    with pytest.raises(NeedsDatabase):  # never checked: nothing to answer from
        catalog_service.get_gpu_spec(memory_only, "h100-sxm")
    with factory() as session:
        first = catalog_service.get_gpu_spec(session, "h100-sxm")
    with Session(engine, info={"spec_cache": catalog_service.SpecCache()}) as other, other.begin():
        _reprice(other, "h100-sxm", 1.23)  # another replica writes
    clock.now += 0.25  # due
    assert catalog_service.get_gpu_spec(memory_only, "h100-sxm") is first  # claims, answers from memory
    assert catalog_service.get_gpu_spec(memory_only, "h100-sxm") is first  # the check is under way
    assert len(checks) == 1
    checks.pop()()  # it lands: a new revision, so the spec is built again (on a database session) ...
    with pytest.raises(NeedsDatabase):
        catalog_service.get_gpu_spec(memory_only, "h100-sxm")
    with factory() as session:
        catalog_service.get_gpu_spec(session, "h100-sxm")
    assert catalog_service.get_gpu_spec(memory_only, "h100-sxm").price_per_hour_usd == 1.23  # ... with the write
    # A check that fails (here: its database is gone) is logged by its exception's class only.
    broken = make_session_factory(create_engine("sqlite:////nonexistent/folder/catalog.db"))
    cache.check_in_background(broken, start=checks.append)
    clock.now += 0.25
    second = catalog_service.get_gpu_spec(memory_only, "h100-sxm")  # claims, answers from memory
    assert second.price_per_hour_usd == 1.23
    logger = logging.getLogger("app.catalog")
    logger.addHandler(caplog.handler)  # the app's logger does not propagate to the root
    # Whatever level an earlier test's app left on the "app" logger (an outage test's is critical), the check's
    # warning is what this test reads.
    caplog.set_level(logging.WARNING, logger="app.catalog")
    try:
        checks.pop()()
    finally:
        logger.removeHandler(caplog.handler)
    assert "catalog revision check failed (OperationalError)" in caplog.text
    assert "nonexistent" not in caplog.text
    clock.now += 0.9  # 1.15 s since the last check landed; the claim 0.9 s old: still from memory
    assert catalog_service.get_gpu_spec(memory_only, "h100-sxm") is second
    assert not checks
    clock.now += 0.2  # 1.35 s: past max_age_s + CHECK_CLAIM_S, nothing is answered from memory
    with pytest.raises(NeedsDatabase):
        catalog_service.get_gpu_spec(memory_only, "h100-sxm")
    assert not checks  # that lookup reads the revision itself, on a database session
    with factory() as session:
        catalog_service.get_gpu_spec(session, "h100-sxm")
    cache.check_in_background(factory, start=checks.append)
    with factory() as session, session.begin():  # this replica writes
        _reprice(session, "h100-sxm", 2.34)
    with pytest.raises(NeedsDatabase):  # its own write: never answered from before it, nor deferred
        catalog_service.get_gpu_spec(memory_only, "h100-sxm")
    assert not checks


def test_max_age_zero_reads_the_revision_on_every_lookup(engine: Engine, fresh_catalog: None) -> None:
    """CATALOG_MAX_AGE_S 0: no lookup answers from memory, not even while a check is under way, and none
    is deferred to the background (so an outage is a 503 at once, not after CHECK_CLAIM_S)."""
    clock = FakeClock()
    cache = catalog_service.SpecCache(max_age_s=0.0, clock=clock)
    factory = make_session_factory(engine, info={"spec_cache": cache})
    checks: list[Callable[[], None]] = []
    cache.check_in_background(factory, start=checks.append)
    with factory() as session:
        catalog_service.get_gpu_spec(session, "h100-sxm")
    memory_only = Session(info={"spec_cache": cache, MEMORY_ONLY: True})
    for _ in range(2):
        with pytest.raises(NeedsDatabase):
            catalog_service.get_gpu_spec(memory_only, "h100-sxm")
    assert not checks


def test_consistent_reads_check_the_revision_in_their_own_transaction(engine: Engine, fresh_catalog: None) -> None:
    """A session flagged CONSISTENT_READS (quotes) never answers from a revision it did not read itself."""
    clock = FakeClock()
    cache = catalog_service.SpecCache(max_age_s=0.25, clock=clock)
    with Session(engine, info={"spec_cache": cache}) as session:
        catalog_service.get_gpu_spec(session, "h100-sxm")
    with Session(engine) as session, session.begin():
        _reprice(session, "h100-sxm", 1.23)
    with Session(engine, info={"spec_cache": cache, catalog_service.CONSISTENT_READS: True}) as session:
        assert catalog_service.get_gpu_spec(session, "h100-sxm").price_per_hour_usd == 1.23
