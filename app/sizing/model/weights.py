"""Weight bytes, for the whole model and for the most loaded GPU of a parallel layout (SIZING.md §2).

Weights are counted by parameter group (attention, dense MLP, experts, shared experts, router,
embedding, LM head, norms and biases), each in the format its recipe gives it (`recipes.py`).
Bytes = parameters x bits / 8, rounded up to whole bytes per group; the bits carry each format's
scale overhead (int4 4.125, MXFP4 4.25, NVFP4 4.5).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

from app.sizing.layout import Layout
from app.sizing.model.params import (
    SPLIT_BEFORE_LAST,
    attention_params,
    ceil_div,
    layer_params_by_kind,
    mlp_params,
    pipeline_stages,
    shared_expert_width,
)
from app.sizing.model.recipes import (
    ATTENTION,
    DENSE_MLP,
    EMBEDDING,
    EXPERTS,
    FORMATS,
    GROUPS,
    LM_HEAD,
    NORMS_AND_BIASES,
    RECIPES,
    ROUTER,
    SHARED_EXPERTS,
    WeightRecipe,
    resolve_recipe,
)
from app.sizing.specs import WEIGHT_DTYPES, ModelSpec

WEIGHT_QUANTIZATION_SCOPE = (
    "A plain weight dtype applies to the decoder layers' linear matrices: attention projections, dense MLP, "
    "routed and shared experts. The embedding, the LM head, norms, MoE routers and bias vectors stay "
    "16-bit (bf16), as the engines' fp8/int8/int4/fp4 recipes keep them. int4 counts 4.125 bits and fp4 "
    "(MXFP4) 4.25 bits per weight, group scales included. A named weight recipe gives each parameter "
    "group its own format instead (e.g. gpt-oss: MXFP4 experts, bf16 attention)."
)


@dataclass(frozen=True, slots=True)
class GroupWeights:
    """One parameter group, in one storage format, on one GPU (or the whole model)."""

    group: str
    format: str
    params: int
    bytes: int


def weight_bytes(model: ModelSpec, weights: str | WeightRecipe) -> int:
    """All weights of the model, stored once."""
    return weight_bytes_per_gpu(model, weights)


def weight_bytes_per_gpu(model: ModelSpec, weights: str | WeightRecipe, tensor_parallel: int = 1,
                         pipeline_parallel: int = 1, expert_parallel: int = 1, data_parallel: int = 1,
                         pipeline_split: str = SPLIT_BEFORE_LAST, dense_over_dp: bool = False) -> int:
    """Weight bytes on the most loaded GPU: the sum of `weight_groups_per_gpu`."""
    return sum(group.bytes for group in weight_groups_per_gpu(model, weights, tensor_parallel, pipeline_parallel,
                                                              expert_parallel, data_parallel, pipeline_split,
                                                              dense_over_dp))


def weight_groups_for_layout(model: ModelSpec, weights: str | WeightRecipe,
                             layout: Layout) -> tuple[GroupWeights, ...]:
    """Each parameter group on the most loaded GPU of a parallel layout (`weight_groups_per_gpu`)."""
    return weight_groups_per_gpu(model, weights, layout.tensor_parallel, layout.pipeline_parallel,
                                 layout.expert_parallel, layout.data_parallel)


def weight_bytes_for_layout(model: ModelSpec, weight_dtype: str | WeightRecipe, layout: Layout) -> int:
    """Weight bytes on the most loaded GPU of a parallel layout (`weight_bytes_per_gpu`)."""
    return weight_bytes_per_gpu(model, weight_dtype, layout.tensor_parallel, layout.pipeline_parallel,
                                layout.expert_parallel, layout.data_parallel)


@lru_cache(maxsize=4096)
def weight_groups_per_gpu(model: ModelSpec, weights: str | WeightRecipe, tensor_parallel: int = 1,
                          pipeline_parallel: int = 1, expert_parallel: int = 1, data_parallel: int = 1,
                          pipeline_split: str = SPLIT_BEFORE_LAST, dense_over_dp: bool = False) -> tuple[GroupWeights, ...]:
    """Each parameter group's params and bytes on the most loaded GPU: the pipeline stage with the most
    bytes of `weight_groups_per_stage` (the first of equals)."""
    stages = weight_groups_per_stage(model, weights, tensor_parallel, pipeline_parallel, expert_parallel,
                                     data_parallel, pipeline_split, dense_over_dp)
    return max(stages, key=lambda groups: sum(g.bytes for g in groups))


def weight_bytes_per_stage(model: ModelSpec, weights: str | WeightRecipe, tensor_parallel: int = 1,
                           pipeline_parallel: int = 1, expert_parallel: int = 1, data_parallel: int = 1,
                           pipeline_split: str = SPLIT_BEFORE_LAST, dense_over_dp: bool = False) -> tuple[int, ...]:
    """Weight bytes on one GPU of each pipeline stage, first to last (the sums of `weight_groups_per_stage`)."""
    return tuple(sum(group.bytes for group in groups) for groups in weight_groups_per_stage(
        model, weights, tensor_parallel, pipeline_parallel, expert_parallel, data_parallel, pipeline_split,
        dense_over_dp))


@lru_cache(maxsize=4096)
def weight_groups_per_stage(model: ModelSpec, weights: str | WeightRecipe, tensor_parallel: int = 1,
                            pipeline_parallel: int = 1, expert_parallel: int = 1, data_parallel: int = 1,
                            pipeline_split: str = SPLIT_BEFORE_LAST,
                            dense_over_dp: bool = False) -> tuple[tuple[GroupWeights, ...], ...]:
    """Each parameter group's params and bytes on one GPU of each pipeline stage (first to last), in
    `recipes.GROUPS` order; a group split over two formats (Meta FP8's edge MLPs) appears once per format.

    - Tensor parallelism splits attention by heads (KV heads replicate when tp > Hkv, MLA
      down-projections replicate), the dense MLP, shared experts, embedding and LM head (vocabulary
      rows) by `tp`, rounding up; norms, routers and MLA LoRA norms are replicated.
    - Attention data parallelism (`data_parallel` ranks of `tp` GPUs each) replicates all of that on
      every rank: only the routed experts are shared between ranks, unless `dense_over_dp` (an engine whose
      dense MLPs and shared experts follow a TP group spanning the ranks, SGLang's:
      `engines.dense_over_attention_dp`), which splits those two, and the LM head, over all tp·dp GPUs (SGLang
      0.5.10's models build `ParallelLMHead(use_attn_tp_group=enable_dp_lm_head)`, off by default: the head
      follows the whole TP group; models/deepseek_v2.py, qwen3_moe.py, llama.py).
    - Expert parallelism: the MoE layers span all tp·dp GPUs; routed experts are dealt out to `ep`
      groups (ceil(E/ep) experts per GPU) and each expert is split over the remaining tp·dp/ep ranks
      (`layout.Layout.moe_tensor_parallel`: SGLang's `--tp 16 --ep 4` is 4; vLLM's
      --enable-expert-parallel is ep = dp·tp, whole experts per GPU).
    - Pipeline stages hold the layers of `params.pipeline_stages`, as the engine deals them (`pipeline_split`:
      vLLM's by default, TensorRT-LLM's first stages take the leftover layers); the first adds the embedding, the
      last the LM head and final norm (with tied embeddings and pp > 1 the last stage keeps its own
      copy of the table, as vLLM does).
    Bytes of a group = its params x the format's bits / 8, rounded up to whole bytes.
    """
    if isinstance(weights, str) and weights not in RECIPES and weights not in WEIGHT_DTYPES:
        raise ValueError(f"unknown weight dtype {weights!r}; expected one of {list(WEIGHT_DTYPES)} "
                         f"or a recipe {list(RECIPES)}")
    recipe = resolve_recipe(weights)
    _check_expert_parallel(model, expert_parallel)
    if data_parallel < 1:
        raise ValueError("data_parallel must be >= 1")
    ranks_per_expert = max(1, tensor_parallel * data_parallel // expert_parallel)
    dense_ranks = tensor_parallel * data_parallel if dense_over_dp else tensor_parallel
    dense_layer = _layer_shard(model, False, tensor_parallel, expert_parallel, ranks_per_expert, dense_ranks)
    moe_layer = (_layer_shard(model, True, tensor_parallel, expert_parallel, ranks_per_expert, dense_ranks)
                 if model.is_moe else dense_layer)
    vocabulary_shard = ceil_div(model.vocab_size, tensor_parallel) * model.hidden_size
    head_shard = ceil_div(model.vocab_size, dense_ranks) * model.hidden_size
    stages = pipeline_stages(model.num_hidden_layers, pipeline_parallel, pipeline_split)
    moe_layers = model.moe_layer_indices
    answer = []
    for index, stage in enumerate(stages):
        params: dict[tuple[str, str], int] = {}
        for layer in stage:
            for group, count in (moe_layer if layer in moe_layers else dense_layer):
                _add(params, recipe.format_of(group, layer, model.num_hidden_layers), group, count)
        if index == 0:
            _add(params, recipe.format_of(EMBEDDING), EMBEDDING, vocabulary_shard)
        if index == len(stages) - 1:
            has_own_head = not model.tie_word_embeddings or pipeline_parallel > 1
            _add(params, recipe.format_of(LM_HEAD), LM_HEAD, head_shard if has_own_head else 0)
            _add(params, recipe.format_of(NORMS_AND_BIASES), NORMS_AND_BIASES, model.hidden_size)
        groups = tuple(
            GroupWeights(group, fmt, count, _bytes(count, FORMATS[fmt].bits))
            for (group, fmt), count in sorted(params.items(), key=lambda item: GROUPS.index(item[0][0]))
        )
        answer.append(groups)
    return tuple(answer)


def _add(params: dict[tuple[str, str], int], fmt: str, group: str, count: int) -> None:
    if count:
        params[(group, fmt)] = params.get((group, fmt), 0) + count


def _bytes(params: int, bits: Fraction) -> int:
    total_bits = bits * params  # exact: every format's bits are a binary fraction
    return ceil_div(total_bits.numerator, total_bits.denominator * 8)


@lru_cache(maxsize=1024)
def _layer_shard(model: ModelSpec, is_moe: bool, tensor_parallel: int, expert_parallel: int,
                 ranks_per_expert: int, dense_ranks: int) -> tuple[tuple[str, int], ...]:
    """One decoder layer's parameters on one GPU, by group; the dense MLP and shared experts split over
    `dense_ranks` GPUs."""
    layer = layer_params_by_kind(model, is_moe)
    attention = attention_params(model, tensor_parallel)
    shard = {ATTENTION: attention.qkv_matrices + attention.out,
             NORMS_AND_BIASES: attention.qkv_bias + layer.norms}
    # Feed-forward blocks split their intermediate columns, so a rank holds ceil(F/tp) of them.
    if is_moe:
        shard[EXPERTS] = (ceil_div(layer.routed_experts, expert_parallel)
                          * mlp_params(model, ceil_div(model.expert_intermediate_size, ranks_per_expert)))
        shard[SHARED_EXPERTS] = model.n_shared_experts * mlp_params(
            model, ceil_div(shared_expert_width(model), dense_ranks))
        shard[ROUTER] = layer.router
    else:
        shard[DENSE_MLP] = mlp_params(model, ceil_div(model.dense_intermediate_size, dense_ranks))
    return tuple(shard.items())


def _check_expert_parallel(model: ModelSpec, expert_parallel: int) -> None:
    if expert_parallel < 1:
        raise ValueError("expert_parallel must be >= 1")
    if expert_parallel > 1 and not model.is_moe:
        raise ValueError("expert_parallel > 1 needs an MoE model")
    if expert_parallel > max(model.num_experts, 1):
        raise ValueError(f"expert_parallel {expert_parallel} exceeds the {model.num_experts} experts")
