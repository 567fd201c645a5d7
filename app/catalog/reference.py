"""The reference catalog (app/data) and the record <-> domain-spec conversions.

`reference_gpu_rows()` / `reference_model_rows()` turn the sourced data files into catalog column
values: exactly the data's values, in SI units, plus the few fields the data does not carry
(GPU family, GPUs per node, scale-out bandwidth; model MLP gating, attention bias, default
dtype), each derived by a rule written here and into the row's `notes`.
`load_reference_catalog(session)` is idempotent and never touches rows a user created or edited.
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields
from datetime import UTC, datetime
from decimal import Decimal
from functools import cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.catalog import repository
from app.catalog.tables import ORIGIN_REFERENCE, GpuRecord, ModelRecord
from app.sizing.specs import MAX_GPUS_PER_HOST, GpuSpec, ModelSpec

DATA_DIR = Path(__file__).resolve().parents[1] / "data"

# Record -> spec --------------------------------------------------------------------------

TERA = 10**12
# Catalog compute columns (dense TFLOP/s, TOP/s for int8, as the data gives them) -> GpuSpec fields.
GPU_COMPUTE_COLUMNS = {
    "fp32_tflops": "fp32_flops_per_s",
    "tf32_tflops": "tf32_flops_per_s",
    "bf16_tflops": "bf16_flops_per_s",
    "fp16_tflops": "fp16_flops_per_s",
    "fp8_tflops": "fp8_flops_per_s",
    "int8_tops": "int8_ops_per_s",
    "fp4_tflops": "fp4_flops_per_s",
}
MODEL_ARCHITECTURE_FIELDS = tuple(f.name for f in dataclass_fields(ModelSpec) if f.name not in ("name", "slug"))


def gpu_spec_from_record(record: Any, *, slug: str | None = None) -> GpuSpec:
    """A `GpuSpec` from anything with the catalog's GPU attributes (a GpuRecord or GpuSpecIn).

    Raises ValueError when the values break the spec's invariants.
    """
    compute = {
        spec_field: None if (tflops := getattr(record, column)) is None else tflops * TERA
        for column, spec_field in GPU_COMPUTE_COLUMNS.items()
    }
    slug = slug if slug is not None else getattr(record, "slug", "")
    return GpuSpec(
        name=record.name,
        memory_bytes=record.memory_bytes,
        cuda_memory_bytes=getattr(record, "cuda_memory_bytes", None),
        memory_bandwidth_bytes_per_s=float(record.memory_bandwidth_bytes_per_s),
        interconnect_bandwidth_bytes_per_s=float(record.interconnect_bandwidth_bytes_per_s),
        gpus_per_node=record.gpus_per_node,
        scale_out_bandwidth_bytes_per_s=float(record.scale_out_bandwidth_bytes_per_s),
        tdp_w=record.tdp_w,
        price_per_hour_usd=record.price_per_hour_usd,
        slug=slug,
        family=record.family,
        vendor=getattr(record, "vendor", ""),
        pcie_links=links_over_pcie(slug, getattr(record, "interconnect", "")),
        **compute,
    )


def links_over_pcie(slug: str, interconnect: str) -> bool:
    """Whether a node's GPUs talk over PCIe: the interconnect, in words, is PCIe first (the catalog's
    PCIe cards: "PCIe Gen4 x16 (no NVLink)"), unless the card is one of the NVLink-bridged groups that
    `node_topology` takes as the node (H100 NVL, H200 NVL). An optional bridge the catalog does not count
    (A100/H100 PCIe: "optional NVLink bridge") leaves the link PCIe."""
    return interconnect.startswith("PCIe") and slug not in NVLINK_BRIDGE_CARDS


def model_spec_from_record(record: Any, *, slug: str | None = None, name: str | None = None) -> ModelSpec:
    """A `ModelSpec` from anything with the catalog's architecture attributes (a ModelRecord or
    ModelArchitecture). Raises ValueError when the values break the spec's invariants."""
    values = {field: getattr(record, field) for field in MODEL_ARCHITECTURE_FIELDS}
    for listed in ("moe_layers", "layer_types"):
        if values[listed] is not None:
            values[listed] = tuple(values[listed])
    return ModelSpec(
        **values,
        slug=slug if slug is not None else getattr(record, "slug", ""),
        name=name if name is not None else getattr(record, "name", ""),
    )


def architecture_kind(spec: ModelSpec) -> str:
    return "moe" if spec.is_moe else "dense"


def attention_kind(spec: ModelSpec) -> str:
    if spec.is_mla:
        return "mla"
    if spec.num_key_value_heads == spec.num_attention_heads:
        return "mha"
    if spec.num_key_value_heads == 1:
        return "mqa"
    return "gqa"


# Reference GPUs --------------------------------------------------------------------------

# Architecture generation, used to group calibration. From each part's datasheet/product page. Blackwell is
# two architectures: the data-center parts (B200/B300/GB200/GB300: HBM, NVLink; the B200 is sm_100) and
# the GB202 die of the RTX PRO 6000 (compute capability 12.0, "not the B200's sm_100", GDDR7, PCIe only; gpus.csv
# notes, from NVIDIA's MIG user guide and aiconfigurator's rtx_pro_6000_server.yaml). Kernels are built per
# compute capability, so one calibration entry for both would mix two kernel libraries and two memory systems.
GPU_FAMILY = {
    "a100-40gb-sxm": "ampere", "a100-80gb-sxm": "ampere", "a100-80gb-pcie": "ampere",
    "a10g": "ampere", "a10": "ampere",
    "h100-sxm": "hopper", "h100-pcie": "hopper", "h100-nvl": "hopper", "h200-sxm": "hopper",
    "h200-nvl": "hopper", "h20": "hopper", "gh200-96gb": "hopper", "gh200-144gb": "hopper",
    "b200": "blackwell", "b300": "blackwell", "gb200": "blackwell", "gb300": "blackwell",
    "rtx-pro-6000": "blackwell-sm120",
    "l4": "ada", "l40s": "ada", "rtx-4090": "ada", "rtx-6000-ada": "ada",
    "t4": "turing", "v100-sxm2-32gb": "volta", "v100-pcie-32gb": "volta",
    "mi250x": "cdna2", "mi300x": "cdna3", "mi325x": "cdna3", "mi355x": "cdna4",
    "gaudi2": "gaudi", "gaudi3": "gaudi",
    "tpu-v5e": "tpu", "tpu-v5p": "tpu", "tpu-v6e": "tpu",
}
# What CUDA reports as total memory (torch.cuda.mem_get_info), where a measurement is published.
# Other GPUs leave it null and the capacity answer says it used the driver's total instead.
CUDA_MEMORY = {
    # vLLM 0.19 start-up logs of the llm-d planner capacity runs on NVIDIA-H100-80GB-HBM3: "79.19 GiB"
    # (llm-d-incubation/llm-d-planner@d3121e05 accuracy/results/v0.19.0; SIZING.md section 7); the
    # GiB figure is rounded to 0.01 GiB, so this is good to +-5.4 MB.
    "h100-sxm": (round(79.19 * 2**30), ("vLLM 0.19 logs on NVIDIA-H100-80GB-HBM3: 79.19 GiB (llm-d planner "
                                        "capacity runs, llm-d-planner@d3121e05)")),
    "a100-80gb-sxm": (85_056_798_720, "PyTorch total_memory on A100-SXM4-80GB, as gpus.csv notes it"),
}
# One 400 Gb/s NIC per GPU (400e9 / 8 B/s per direction): the HGX/OAM node design, and the
# GpuSpec default. An assumption where the data gives no NIC figure; stated in each row's notes.
NIC_400G_BYTES_PER_S = 50e9
PCIE_GEN5_X16_BYTES_PER_S = 64e9
NVL72_SLUGS = ("gb200", "gb300")
# Cards whose data bandwidth is an NVLink bridge's: the bridge joins this many cards
# (H100 NVL: pairs; H200 NVL: the 4-way bridge named in the data).
NVLINK_BRIDGE_CARDS = {"h100-nvl": 2, "h200-nvl": 4}


@dataclass(frozen=True, slots=True)
class NodeTopology:
    gpus_per_node: int
    scale_out_bandwidth_bytes_per_s: float
    rule: str


def node_topology(slug: str, vendor: str, form_factor: str, interconnect: str,
                  interconnect_bandwidth_bytes_per_s: float) -> NodeTopology:
    """GPUs per fast-interconnect domain and per-GPU scale-out bandwidth, by documented rule."""
    nic = f"scale-out: one 400 Gb/s NIC per GPU assumed ({NIC_400G_BYTES_PER_S:.4g} B/s per direction)"
    if slug in NVL72_SLUGS:
        return NodeTopology(72, NIC_400G_BYTES_PER_S, f"NVL72: one NVLink domain of 72 GPUs; {nic}")
    if "Grace Hopper" in form_factor:
        return NodeTopology(1, NIC_400G_BYTES_PER_S, f"GH200 superchip: one GPU per node; {nic}")
    if vendor == "Google":
        chips = re.search(r"(\d+) per host", form_factor)
        if chips is None:
            raise ValueError(f"{slug}: form_factor does not say how many chips per host")
        return NodeTopology(
            int(chips.group(1)), interconnect_bandwidth_bytes_per_s,
            f"TPU: {chips.group(1)} chips per host (Google TPU docs); ICI links chips across hosts "
            "in a slice, so scale-out bandwidth = the ICI bandwidth per direction",
        )
    if vendor == "Intel":
        ports = re.search(r"(\d+)\s*GbE.*?(\d+) scale-out", interconnect)
        if ports is None:
            raise ValueError(f"{slug}: interconnect does not give the scale-out ports")
        port_gbit, count = int(ports.group(1)), int(ports.group(2))
        scale_out = count * port_gbit * 1e9 / 8
        return NodeTopology(
            MAX_GPUS_PER_HOST, scale_out,
            f"Gaudi: {MAX_GPUS_PER_HOST} OAMs per server; scale-out over the {count} on-die {port_gbit} GbE ports "
            f"({count} x {port_gbit} Gb/s / 8 = {scale_out:.4g} B/s per direction)",
        )
    if "SXM" in form_factor or "OAM" in form_factor:
        return NodeTopology(MAX_GPUS_PER_HOST, NIC_400G_BYTES_PER_S,
                            f"SXM/OAM baseboard: {MAX_GPUS_PER_HOST} GPUs per node; {nic}")
    if slug in NVLINK_BRIDGE_CARDS:
        cards = NVLINK_BRIDGE_CARDS[slug]
        return NodeTopology(
            cards, PCIE_GEN5_X16_BYTES_PER_S,
            f"PCIe cards joined by an NVLink bridge in groups of {cards}; groups talk over "
            f"PCIe Gen5 x16 ({PCIE_GEN5_X16_BYTES_PER_S:.4g} B/s per direction)",
        )
    scale_out = min(NIC_400G_BYTES_PER_S, interconnect_bandwidth_bytes_per_s)
    return NodeTopology(
        MAX_GPUS_PER_HOST, scale_out,
        f"PCIe card: {MAX_GPUS_PER_HOST} per server over PCIe; traffic leaving the server also crosses the card's "
        f"PCIe link, so scale-out = min(400 Gb/s NIC, PCIe) = {scale_out:.4g} B/s per direction",
    )


def _decimal_scaled(text: str, scale: int) -> float:
    # Decimal keeps "1.555" TB/s exact: 1555000000000, not 1554999999999.9998.
    return float(Decimal(text) * scale)


def _optional_float(text: str) -> float | None:
    return float(text) if text.strip() else None


def _gpu_row(row: dict[str, str]) -> dict[str, Any]:
    interconnect_bw = _decimal_scaled(row["interconnect_bw_gb_s_unidirectional"], 10**9)
    topology = node_topology(row["slug"], row["vendor"], row["form_factor"], row["interconnect"], interconnect_bw)
    family = GPU_FAMILY[row["slug"]]
    derived = (
        f"Derived (not in gpus.csv): family = {family}; gpus_per_node = {topology.gpus_per_node} and "
        f"scale_out_bandwidth_bytes_per_s = {topology.scale_out_bandwidth_bytes_per_s:.6g} ({topology.rule})."
    )
    cuda_memory, cuda_source = CUDA_MEMORY.get(row["slug"], (None, "not measured"))
    derived += f" cuda_memory_bytes = {cuda_memory} ({cuda_source})."
    return {
        "slug": row["slug"],
        "name": row["name"],
        "vendor": row["vendor"],
        "family": family,
        "form_factor": row["form_factor"],
        "memory_bytes": int(row["memory_bytes"]),
        "cuda_memory_bytes": cuda_memory,
        "memory_bandwidth_bytes_per_s": _decimal_scaled(row["hbm_bandwidth_tb_s"], TERA),
        "fp32_tflops": _optional_float(row["fp32_tflops"]),
        "tf32_tflops": _optional_float(row["tf32_tflops_dense"]),
        "bf16_tflops": _optional_float(row["bf16_tflops_dense"]),
        "fp16_tflops": _optional_float(row["fp16_tflops_dense"]),
        "fp8_tflops": _optional_float(row["fp8_tflops_dense"]),
        "int8_tops": _optional_float(row["int8_tops_dense"]),
        "fp4_tflops": _optional_float(row["fp4_tflops_dense"]),
        "interconnect": row["interconnect"],
        "interconnect_bandwidth_bytes_per_s": interconnect_bw,
        "gpus_per_node": topology.gpus_per_node,
        "scale_out_bandwidth_bytes_per_s": topology.scale_out_bandwidth_bytes_per_s,
        "tdp_w": _optional_float(row["tdp_w"]),
        "price_per_hour_usd": _optional_float(row["price_per_hour_usd"]),
        "price_source": row["price_source"],
        "source": row["source"],
        "notes": f"{row['notes']}\n{derived}",
    }


# Reference models ------------------------------------------------------------------------

# Plain (non-gated) GELU MLPs with 2 matrices: Falcon, GPT-J, OPT (their modeling code).
NON_GATED_MLP_PREFIXES = ("falcon-", "gpt-j-", "opt-")
# Q/K/V projection biases: Qwen2/Qwen2.5 (QKV bias), gpt-oss (attention_bias: true),
# OPT (enable_bias defaults to true in OPTConfig).
ATTENTION_BIAS_PREFIXES = ("qwen2.5-", "gpt-oss-", "opt-")
# Weights as published: DeepSeek-V3/R1 ship FP8 block-quantized weights; gpt-oss ships its MoE
# experts (nearly all parameters) in MXFP4. Everything else is served in bf16 by default.
PUBLISHED_DTYPE = {"deepseek-v3": "fp8", "deepseek-r1": "fp8", "gpt-oss-20b": "fp4", "gpt-oss-120b": "fp4"}
# Falcon configs omit max_position_embeddings; transformers' FalconConfig defaults it to 2048.
FALCON_MAX_POSITION_EMBEDDINGS = 2048


def _model_row(entry: dict[str, Any]) -> dict[str, Any]:
    slug = entry["slug"]
    derived = []
    mlp_gated = not slug.startswith(NON_GATED_MLP_PREFIXES)
    attention_bias = slug.startswith(ATTENTION_BIAS_PREFIXES)
    dtype = PUBLISHED_DTYPE.get(slug, "bf16")
    derived.append(f"mlp_gated = {str(mlp_gated).lower()}, attention_bias = {str(attention_bias).lower()} "
                   f"(modeling code of the family), dtype = {dtype} (weights as published)")
    max_positions = entry["max_position_embeddings"]
    if max_positions is None and slug.startswith("falcon-"):
        max_positions = FALCON_MAX_POSITION_EMBEDDINGS
        derived.append("max_position_embeddings = 2048 (absent from config.json; transformers FalconConfig default)")
    notes = [entry["notes"]]
    if entry["kv_cache_note"]:
        notes.append(f"KV cache: {entry['kv_cache_note']}")
    notes.append("Derived (not in models.json): " + "; ".join(derived) + ".")
    row = {
        "slug": slug,
        "name": entry["name"],
        "hf_id": entry["hf_id"],
        "source": f"{entry['source']}; config: {entry['config_provenance']}; parameters: {entry['params_source']}",
        "notes": "\n".join(notes),
        "num_hidden_layers": entry["num_hidden_layers"],
        "hidden_size": entry["hidden_size"],
        "num_attention_heads": entry["num_attention_heads"],
        "num_key_value_heads": entry["num_key_value_heads"],
        "head_dim": entry["head_dim"],
        "vocab_size": entry["vocab_size"],
        "intermediate_size": entry["intermediate_size"],
        "mlp_gated": mlp_gated,
        "attention_bias": attention_bias,
        "tie_word_embeddings": entry["tie_word_embeddings"],
        "max_position_embeddings": max_positions,
        # models.json writes null for the MoE counts of dense models; the catalog uses 0.
        "num_experts": entry["num_experts"] or 0,
        "num_experts_per_tok": entry["num_experts_per_tok"] or 0,
        "n_shared_experts": entry["n_shared_experts"] or 0,
        "moe_intermediate_size": entry["moe_intermediate_size"],
        "shared_expert_intermediate_size": None,
        "first_k_dense_replace": entry["first_k_dense_replace"] or 0,
        "moe_layers": entry["moe_layers"],
        "kv_lora_rank": entry["kv_lora_rank"],
        "q_lora_rank": entry["q_lora_rank"],
        "qk_rope_head_dim": entry["qk_rope_head_dim"],
        "qk_nope_head_dim": entry["qk_nope_head_dim"],
        "v_head_dim": entry["v_head_dim"],
        "layer_types": entry["layer_types"],
        "sliding_window": entry["sliding_window"],
        "attention_chunk_size": entry.get("attention_chunk_size"),
        "dtype": dtype,
        "total_params_published": entry["total_params"],
        "active_params_published": entry["active_params"],
    }
    spec = model_spec_from_record(SimpleNamespace(**row))  # converts like a record
    row["architecture"] = architecture_kind(spec)
    row["attention_type"] = attention_kind(spec)
    return row


@cache
def _reference_rows() -> tuple[tuple[dict[str, Any], ...], tuple[dict[str, Any], ...]]:
    with (DATA_DIR / "gpus.csv").open(newline="", encoding="utf-8") as handle:
        gpus = tuple(_gpu_row(row) for row in csv.DictReader(handle))
    with (DATA_DIR / "models.json").open(encoding="utf-8") as handle:
        models = tuple(_model_row(entry) for entry in json.load(handle))
    return gpus, models


def reference_gpu_rows() -> list[dict[str, Any]]:
    """Column values of every reference GPU, in data-file order (fresh copies)."""
    return [dict(row) for row in _reference_rows()[0]]


def reference_model_rows() -> list[dict[str, Any]]:
    """Column values of every reference model, in data-file order (fresh copies)."""
    return [{**row, "moe_layers": _copy(row["moe_layers"]), "layer_types": _copy(row["layer_types"])}
            for row in _reference_rows()[1]]


def _copy(values: list[Any] | None) -> list[Any] | None:
    return None if values is None else list(values)


def reference_slugs(kind: str) -> frozenset[str]:
    rows = _reference_rows()[0 if kind == "gpu" else 1]
    return frozenset(row["slug"] for row in rows)


# Loading ---------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class LoadReport:
    inserted: int
    updated: int
    unchanged: int
    kept_user_rows: int  # reference slugs a user created, edited or deleted: left alone


def load_reference_catalog(session: Session, *, now: datetime | None = None) -> LoadReport:
    """Insert missing reference rows and update changed ones; never touch a user's rows.

    Idempotent: a second run reports everything unchanged. Does not commit.
    """
    now = now or datetime.now(UTC)
    repository.lock_catalog(session)  # a user's write commits before these reads or after this load
    deleted_by_user = repository.tombstones(session)
    inserted = updated = unchanged = kept = 0
    for kind, record_class, rows in (("gpu", GpuRecord, reference_gpu_rows()),
                                     ("model", ModelRecord, reference_model_rows())):
        existing = {record.slug: record for record in session.scalars(select(record_class))}
        for row in rows:
            record = existing.get(row["slug"])
            if (kind, row["slug"]) in deleted_by_user or (record is not None and record.origin != ORIGIN_REFERENCE):
                kept += 1
            elif record is None:
                session.add(record_class(**row, origin=ORIGIN_REFERENCE, created_at=now, updated_at=now))
                inserted += 1
            elif any(getattr(record, column) != value for column, value in row.items()):
                for column, value in row.items():
                    setattr(record, column, value)
                record.updated_at = now
                updated += 1
            else:
                unchanged += 1
    if inserted or updated:
        session.flush()
        repository.bump_catalog_revision(session)
    return LoadReport(inserted, updated, unchanged, kept)
