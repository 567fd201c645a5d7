"""Domain specs the sizing core computes over: a GPU, a model architecture, precisions.

Pure data: frozen, slotted dataclasses with their invariants checked on construction.
SI units inside (bytes, bytes/s, FLOP/s, seconds). Architecture fields use Hugging Face
`config.json` names so a pasted config needs no translation table.
"""

from __future__ import annotations

from dataclasses import dataclass

# Bits per stored value, including group-scale overhead where the format has one
# (SIZING.md section 1): int4 with one fp16 scale per 128 weights = 4 + 16/128 = 4.125;
# MXFP4 = 4-bit values + one 8-bit shared exponent per 32 values = 4 + 8/32 = 4.25.
BITS_PER_VALUE: dict[str, float] = {
    "fp32": 32.0,
    "bf16": 16.0,
    "fp16": 16.0,
    "fp8": 8.0,
    "int8": 8.0,
    "int4": 4.125,
    "fp4": 4.25,
}

WEIGHT_DTYPES = ("bf16", "fp16", "fp8", "int8", "int4", "fp4")
KV_DTYPES = ("bf16", "fp16", "fp8", "int8", "fp32")  # fp32: models served in fp32 ("auto")
COMPUTE_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8", "fp4")

LAYER_FULL = "full_attention"
LAYER_SLIDING = "sliding_attention"
LAYER_CHUNKED = "chunked_attention"
LAYER_TYPES = (LAYER_FULL, LAYER_SLIDING, LAYER_CHUNKED)

# The most GPUs one host joins (an HGX or OAM baseboard of 8, as many PCIe cards or Gaudi OAMs per server: the
# catalog's node rules, `catalog.reference.node_topology`, read it from here): an NVLink domain larger than that
# spans hosts (GB200/GB300 NVL72).
MAX_GPUS_PER_HOST = 8


def bits_per_value(dtype: str) -> float:
    try:
        return BITS_PER_VALUE[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(BITS_PER_VALUE)}") from None


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One accelerator. Peak rates are dense (no structured sparsity), in FLOP/s."""

    name: str
    memory_bytes: int  # what the driver reports as total
    memory_bandwidth_bytes_per_s: float
    interconnect_bandwidth_bytes_per_s: float  # per GPU, per direction, inside one node
    gpus_per_node: int = 8
    # Per-GPU, per-direction bandwidth between nodes (scale-out NIC). 50e9 B/s = one
    # 400 Gb/s InfiniBand NDR / Ethernet NIC per GPU, the common H100/H200 node design.
    scale_out_bandwidth_bytes_per_s: float = 50e9
    fp32_flops_per_s: float | None = None
    tf32_flops_per_s: float | None = None
    bf16_flops_per_s: float | None = None
    fp16_flops_per_s: float | None = None
    fp8_flops_per_s: float | None = None
    int8_ops_per_s: float | None = None
    fp4_flops_per_s: float | None = None
    tdp_w: float | None = None
    price_per_hour_usd: float | None = None
    # What CUDA reports as total (torch.cuda.mem_get_info()[1]), below the driver's total by what the
    # driver reserves; None = not measured. vLLM and TensorRT-LLM size their KV cache from it.
    cuda_memory_bytes: int | None = None
    slug: str = ""
    family: str = ""  # vendor generation used to group calibration (e.g. "hopper", "ampere")
    # Its maker, as the catalog writes it ("NVIDIA", "AMD"): a calibration profile's fallback for a GPU whose
    # family has no entry of its own (`fit.CalibrationProfile.entry_for`). "" = not stated.
    vendor: str = ""
    # The GPUs of a node talk over PCIe (no NVLink or other scale-up fabric): their collectives reach a
    # fraction of the link's rate that a calibration fits (`Efficiency.pcie_link_fraction`).
    pcie_links: bool = False

    def __post_init__(self) -> None:
        if self.memory_bytes <= 0:
            raise ValueError("memory_bytes must be positive")
        if self.cuda_memory_bytes is not None and not 0 < self.cuda_memory_bytes <= self.memory_bytes:
            raise ValueError("cuda_memory_bytes must be in 1..memory_bytes")
        if self.memory_bandwidth_bytes_per_s <= 0:
            raise ValueError("memory_bandwidth_bytes_per_s must be positive")
        if self.interconnect_bandwidth_bytes_per_s <= 0:
            raise ValueError("interconnect_bandwidth_bytes_per_s must be positive")
        if self.gpus_per_node < 1:
            raise ValueError("gpus_per_node must be >= 1")
        if not any(self.peak_flops_per_s(d) for d in COMPUTE_DTYPES):
            raise ValueError("at least one peak compute rate is required")

    @property
    def nvlink_spans_hosts(self) -> bool:
        """Whether its fast-interconnect domain (`gpus_per_node`) joins GPUs of several hosts (multi-node NVLink,
        as in an NVL72): more than MAX_GPUS_PER_HOST."""
        return self.gpus_per_node > MAX_GPUS_PER_HOST

    def peak_flops_per_s(self, compute_dtype: str) -> float | None:
        """Dense tensor rate for a compute precision, or None when the chip has no such unit."""
        return {
            "fp32": self.fp32_flops_per_s,
            "tf32": self.tf32_flops_per_s,
            "bf16": self.bf16_flops_per_s,
            "fp16": self.fp16_flops_per_s,
            "fp8": self.fp8_flops_per_s,
            "int8": self.int8_ops_per_s,
            "fp4": self.fp4_flops_per_s,
        }.get(compute_dtype)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A decoder-only transformer architecture, in Hugging Face config.json field names.

    Conventions:
    - `intermediate_size` is the dense MLP width; for MoE models whose config has only one
      width (Mixtral, gpt-oss) the expert width falls back to it.
    - `moe_intermediate_size` is the routed-expert width; each shared expert has
      `shared_expert_intermediate_size` (default: the expert width, as in DeepSeek and Llama 4).
    - `moe_layers` lists the indices of MoE layers; None with `num_experts` > 0 means every
      layer from `first_k_dense_replace` on is MoE.
    - `layer_types` gives each layer's attention kind; None means all `full_attention`.
      `sliding_window` bounds `sliding_attention` layers, `attention_chunk_size` bounds
      `chunked_attention` layers (both cache at most that many tokens per sequence).
    - MLA (DeepSeek-V2/V3) is on when `kv_lora_rank` is set.
    """

    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    head_dim: int | None = None  # None -> hidden_size // num_attention_heads
    intermediate_size: int | None = None  # None -> 4 * hidden_size (GPT-J, Falcon)
    mlp_gated: bool = True  # SwiGLU/GeGLU (3 matrices) vs plain (2 matrices)
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 4096
    attention_bias: bool = False  # Q/K/V projection biases (Qwen2)
    # MoE
    num_experts: int = 0  # routed experts (num_local_experts / n_routed_experts / num_experts)
    num_experts_per_tok: int = 0
    n_shared_experts: int = 0
    moe_intermediate_size: int | None = None
    shared_expert_intermediate_size: int | None = None
    first_k_dense_replace: int = 0
    moe_layers: tuple[int, ...] | None = None
    # MLA
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None
    v_head_dim: int | None = None
    # Attention layout
    layer_types: tuple[str, ...] | None = None
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    # Identity / defaults (not used by the formulas)
    name: str = ""
    slug: str = ""
    dtype: str = "bf16"
    total_params_published: int | None = None
    active_params_published: int | None = None

    def __post_init__(self) -> None:
        for name in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
                     "vocab_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.num_attention_heads % self.num_key_value_heads and not self.is_mla:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.head_dim is not None and self.head_dim < 1:
            raise ValueError("head_dim must be >= 1")
        if self.head_dim is None and self.hidden_size < self.num_attention_heads:
            raise ValueError(f"head_dim must be given when hidden_size ({self.hidden_size}) is below "
                             f"num_attention_heads ({self.num_attention_heads}): hidden_size // num_attention_heads "
                             "would be 0")
        if self.num_experts and not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ValueError("num_experts_per_tok must be in 1..num_experts")
        if self.is_mla and (self.qk_rope_head_dim is None or self.qk_nope_head_dim is None
                            or self.v_head_dim is None):
            raise ValueError("MLA needs qk_rope_head_dim, qk_nope_head_dim and v_head_dim")
        if self.layer_types is not None:
            if len(self.layer_types) != self.num_hidden_layers:
                raise ValueError("layer_types must have one entry per layer")
            unknown = set(self.layer_types) - set(LAYER_TYPES)
            if unknown:
                raise ValueError(f"unknown layer types {sorted(unknown)}")
            if LAYER_SLIDING in self.layer_types and not self.sliding_window:
                raise ValueError("sliding_attention layers need sliding_window")
            if LAYER_CHUNKED in self.layer_types and not self.attention_chunk_size:
                raise ValueError("chunked_attention layers need attention_chunk_size")
        if self.moe_layers is not None and any(
            not 0 <= i < self.num_hidden_layers for i in self.moe_layers
        ):
            raise ValueError("moe_layers indices must be within the layers")
        if self.moe_layers is not None and len(set(self.moe_layers)) != len(self.moe_layers):
            raise ValueError("moe_layers lists a layer more than once")
        if self.moe_layers is not None and not self.num_experts:
            raise ValueError("moe_layers needs num_experts: a model without routed experts has no MoE layer")
        for name in ("num_experts_per_tok", "n_shared_experts"):
            if getattr(self, name) and not self.num_experts:
                raise ValueError(f"{name} needs num_experts: a model without routed experts has no MoE block "
                                 "(give 0, or the experts)")
        if self.num_experts and not self.moe_layer_indices:
            raise ValueError(f"num_experts {self.num_experts} with no MoE layer: first_k_dense_replace "
                             f"({self.first_k_dense_replace}) or moe_layers leaves none of the "
                             f"{self.num_hidden_layers} layers")
        if self.q_lora_rank is not None and not self.is_mla:
            raise ValueError("q_lora_rank applies to multi-head latent attention: give kv_lora_rank too")
        if (self.active_params_published is not None and self.total_params_published is not None
                and self.active_params_published > self.total_params_published):
            raise ValueError("active_params_published exceeds total_params_published")
        if self.dtype not in BITS_PER_VALUE:
            raise ValueError(f"unknown dtype {self.dtype!r}")

    # Derived geometry -------------------------------------------------------------------

    @property
    def is_mla(self) -> bool:
        return bool(self.kv_lora_rank)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_attention_heads

    @property
    def dense_intermediate_size(self) -> int:
        return self.intermediate_size if self.intermediate_size is not None else 4 * self.hidden_size

    @property
    def expert_intermediate_size(self) -> int:
        return self.moe_intermediate_size or self.dense_intermediate_size

    @property
    def resolved_layer_types(self) -> tuple[str, ...]:
        return self.layer_types if self.layer_types is not None else (LAYER_FULL,) * self.num_hidden_layers

    @property
    def moe_layer_indices(self) -> frozenset[int]:
        if not self.is_moe:
            return frozenset()
        if self.moe_layers is not None:
            return frozenset(self.moe_layers)
        return frozenset(range(self.first_k_dense_replace, self.num_hidden_layers))

    def layer_window(self, layer_type: str) -> int | None:
        """Tokens a layer of this kind caches at most per sequence (None = unbounded)."""
        if layer_type == LAYER_SLIDING:
            return self.sliding_window
        if layer_type == LAYER_CHUNKED:
            return self.attention_chunk_size
        return None
