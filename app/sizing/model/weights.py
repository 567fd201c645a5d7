"""Weight bytes, for the whole model and for the most loaded GPU of a parallel layout (SIZING.md §2).

Bytes = parameters x bits / 8, rounded up to whole bytes; the bits of int4 (4.125) and fp4 (4.25)
already carry their group-scale overhead (`specs.BITS_PER_VALUE`).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

from app.sizing.layout import Layout
from app.sizing.model.params import (
    attention_params,
    ceil_div,
    layer_params_by_kind,
    mlp_params,
    pipeline_stages,
    shared_expert_width,
)
from app.sizing.specs import WEIGHT_DTYPES, ModelSpec, bits_per_value

WEIGHT_QUANTIZATION_SCOPE = (
    "The weight dtype applies to the decoder layers' linear matrices: attention projections, dense MLP, "
    "routed and shared experts. The embedding, the LM head, norms, MoE routers and bias vectors stay "
    "16-bit (bf16), as the engines' fp8/int8/int4/fp4 recipes keep them. int4 counts 4.125 bits and fp4 "
    "4.25 bits per weight, group scales included."
)

HIGH_PRECISION_BITS = 16  # what the unquantized parts (embedding, head, norms, router, biases) keep


@dataclass(frozen=True, slots=True)
class _Params:
    """Parameters split by the precision they are stored in."""

    quantized: int  # stored in the requested weight dtype
    high_precision: int  # stored in bf16

    def __add__(self, other: _Params) -> _Params:
        return _Params(self.quantized + other.quantized, self.high_precision + other.high_precision)

    def __mul__(self, count: int) -> _Params:
        return _Params(self.quantized * count, self.high_precision * count)

    def bytes(self, weight_bits: float) -> int:
        quantized_bits = Fraction(weight_bits) * self.quantized  # exact: 4.125 and 4.25 are binary fractions
        return ceil_div(quantized_bits.numerator, quantized_bits.denominator * 8) + (
            self.high_precision * HIGH_PRECISION_BITS // 8
        )


def weight_bytes(model: ModelSpec, weight_dtype: str) -> int:
    """All weights of the model, stored once."""
    return weight_bytes_per_gpu(model, weight_dtype)


def weight_bytes_for_layout(model: ModelSpec, weight_dtype: str, layout: Layout) -> int:
    """Weight bytes on the most loaded GPU of a parallel layout (`weight_bytes_per_gpu`)."""
    return weight_bytes_per_gpu(model, weight_dtype, layout.tensor_parallel, layout.pipeline_parallel,
                                layout.expert_parallel, layout.data_parallel)


@lru_cache(maxsize=4096)
def weight_bytes_per_gpu(model: ModelSpec, weight_dtype: str, tensor_parallel: int = 1,
                         pipeline_parallel: int = 1, expert_parallel: int = 1, data_parallel: int = 1) -> int:
    """Weight bytes on the most loaded GPU.

    - Tensor parallelism splits attention by heads (KV heads replicate when tp > Hkv, MLA
      down-projections replicate), the dense MLP, shared experts, embedding and LM head (vocabulary
      rows) by `tp`, rounding up; norms, routers and MLA LoRA norms are replicated.
    - Attention data parallelism (`data_parallel` ranks of `tp` GPUs each) replicates all of that on
      every rank: only the routed experts are shared between ranks.
    - Expert parallelism: the MoE layers span all tp·dp GPUs; routed experts are dealt out to `ep`
      groups (ceil(E/ep) experts per GPU) and each expert is split over the remaining tp·dp/ep ranks
      (`layout.Layout.moe_tensor_parallel`: SGLang's `--tp 16 --ep 4` is 4; vLLM's
      --enable-expert-parallel is ep = dp·tp, whole experts per GPU).
    - Pipeline stages hold the layers of `params.pipeline_stages`; the first adds the embedding, the
      last the LM head and final norm (with tied embeddings and pp > 1 the last stage keeps its own
      copy of the table, as vLLM does). The answer is the largest stage.
    """
    if weight_dtype not in WEIGHT_DTYPES:
        raise ValueError(f"unknown weight dtype {weight_dtype!r}; expected one of {list(WEIGHT_DTYPES)}")
    bits = bits_per_value(weight_dtype)
    _check_expert_parallel(model, expert_parallel)
    if data_parallel < 1:
        raise ValueError("data_parallel must be >= 1")
    ranks_per_expert = max(1, tensor_parallel * data_parallel // expert_parallel)
    dense_layer = _layer_shard(model, False, tensor_parallel, expert_parallel, ranks_per_expert)
    moe_layer = (_layer_shard(model, True, tensor_parallel, expert_parallel, ranks_per_expert) if model.is_moe
                 else dense_layer)
    vocabulary_shard = ceil_div(model.vocab_size, tensor_parallel) * model.hidden_size
    stages = pipeline_stages(model.num_hidden_layers, pipeline_parallel)
    moe_counts = _moe_layers_per_stage(model, pipeline_parallel)
    largest = 0
    for index, (stage, moe_count) in enumerate(zip(stages, moe_counts, strict=True)):
        params = dense_layer * (len(stage) - moe_count) + moe_layer * moe_count
        if index == 0:
            params += _Params(0, vocabulary_shard)
        if index == len(stages) - 1:
            has_own_head = not model.tie_word_embeddings or pipeline_parallel > 1
            params += _Params(0, (vocabulary_shard if has_own_head else 0) + model.hidden_size)
        largest = max(largest, params.bytes(bits))
    return largest


def _layer_shard(model: ModelSpec, is_moe: bool, tensor_parallel: int, expert_parallel: int,
                 ranks_per_expert: int) -> _Params:
    """One decoder layer's parameters on one GPU."""
    layer = layer_params_by_kind(model, is_moe)
    attention = attention_params(model, tensor_parallel)
    # Feed-forward blocks split their intermediate columns, so a rank holds ceil(F/tp) of them.
    if is_moe:
        feed_forward = (
            ceil_div(layer.routed_experts, expert_parallel)
            * mlp_params(model, ceil_div(model.expert_intermediate_size, ranks_per_expert))
            + model.n_shared_experts * mlp_params(model, ceil_div(shared_expert_width(model), tensor_parallel))
        )
    else:
        feed_forward = mlp_params(model, ceil_div(model.dense_intermediate_size, tensor_parallel))
    quantized = attention.qkv_matrices + attention.out + feed_forward
    return _Params(quantized, attention.qkv_bias + layer.router + layer.norms)


@lru_cache(maxsize=256)
def _moe_layers_per_stage(model: ModelSpec, pipeline_parallel: int) -> tuple[int, ...]:
    moe_indices = sorted(model.moe_layer_indices)
    return tuple(
        bisect_left(moe_indices, stage.stop) - bisect_left(moe_indices, stage.start)
        for stage in pipeline_stages(model.num_hidden_layers, pipeline_parallel)
    )


def _check_expert_parallel(model: ModelSpec, expert_parallel: int) -> None:
    if expert_parallel < 1:
        raise ValueError("expert_parallel must be >= 1")
    if expert_parallel > 1 and not model.is_moe:
        raise ValueError("expert_parallel > 1 needs an MoE model")
    if expert_parallel > max(model.num_experts, 1):
        raise ValueError(f"expert_parallel {expert_parallel} exceeds the {model.num_experts} experts")
