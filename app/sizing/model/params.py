"""Parameter counts from the architecture (SIZING.md section 2), and the pipeline-stage split.

Counts come from the config, never from a model's name. Per decoder layer:
- attention (MHA/MQA/GQA): Q `h·H·d`, K and V `2·h·Hkv·d`, O `H·d·h`, plus Q/K/V biases when the
  config has them (Qwen2, gpt-oss);
- attention (MLA): Q path `h·q_lora + q_lora·H·(d_nope+d_rope)` (or `h·H·(d_nope+d_rope)` without q
  LoRA), KV down `h·(kv_lora + d_rope)`, KV up `kv_lora·H·(d_nope+d_v)`, O `H·d_v·h`;
- MLP: `3·h·F` gated (SwiGLU/GeGLU), `2·h·F` plain; MoE layers instead hold `E` routed experts of
  `3·h·F_e`, the shared experts and a router `h·E`;
- norms: two RMSNorm vectors of `h` (input and post-attention), plus MLA's q/kv LoRA norms; one final
  norm of `h` after the last layer. (Gemma-2's extra pre/post-feedforward norms and LayerNorm biases
  are not modelled: a few thousand parameters per layer, under 0.01% of any total.)

The count of "active" parameters includes the embedding table and the LM head, as Mixtral's 12.9B and
Qwen3-MoE's published figures do; gpt-oss publishes active counts without the input embedding
(5.1B = our 5.71B minus one 201088 x 2880 table).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from app.sizing.specs import ModelSpec


def ceil_div(numerator: int, denominator: int) -> int:
    """Integer ceiling division (no float round trip, exact for any size)."""
    return -(-numerator // denominator)


@dataclass(frozen=True, slots=True)
class AttentionParams:
    """One decoder layer's attention weights as held by one tensor-parallel rank.

    Heads are the unit of the split: a rank holds ceil(H/tp) query heads and ceil(Hkv/tp) KV heads,
    so K/V projections are replicated when tp > Hkv (vLLM's QKVParallelLinear does this, and the KV
    cache follows it). MLA's down-projections (q_a, kv_a) feed every head and are replicated on every
    rank (vLLM builds them as ReplicatedLinear); its up-projections split by query head.
    """

    qkv_matrices: int  # Q, K, V projections (MLA: q path + kv down + kv up), weights only
    qkv_bias: int  # their bias vectors
    out: int  # O projection

    @property
    def total(self) -> int:
        return self.qkv_matrices + self.qkv_bias + self.out


def attention_params(model: ModelSpec, tensor_parallel: int = 1) -> AttentionParams:
    """Attention weights of one layer on one rank of a `tensor_parallel`-way split (1 = the whole layer)."""
    _check_degree("tensor_parallel", tensor_parallel)
    h = model.hidden_size
    query_heads = ceil_div(model.num_attention_heads, tensor_parallel)
    if model.is_mla:
        # ModelSpec guarantees these on MLA models; the asserts narrow the Optional types.
        assert model.kv_lora_rank is not None and model.qk_rope_head_dim is not None
        assert model.qk_nope_head_dim is not None and model.v_head_dim is not None
        qk_head_dim = model.qk_nope_head_dim + model.qk_rope_head_dim
        if model.q_lora_rank:
            query = h * model.q_lora_rank + model.q_lora_rank * query_heads * qk_head_dim
        else:
            query = h * query_heads * qk_head_dim
        kv_down = h * (model.kv_lora_rank + model.qk_rope_head_dim)
        kv_up = model.kv_lora_rank * query_heads * (model.qk_nope_head_dim + model.v_head_dim)
        # With attention_bias, DeepSeek's reference code puts biases on the two down-projections only.
        bias = (model.q_lora_rank or 0) + model.kv_lora_rank + model.qk_rope_head_dim
        return AttentionParams(
            qkv_matrices=query + kv_down + kv_up,
            qkv_bias=bias if model.attention_bias else 0,
            out=query_heads * model.v_head_dim * h,
        )
    d = model.resolved_head_dim
    kv_heads = ceil_div(model.num_key_value_heads, tensor_parallel)
    return AttentionParams(
        qkv_matrices=h * query_heads * d + 2 * h * kv_heads * d,
        qkv_bias=(query_heads + 2 * kv_heads) * d if model.attention_bias else 0,
        out=query_heads * d * h,
    )


@dataclass(frozen=True, slots=True)
class LayerParams:
    """Weights of ONE decoder layer, by operator."""

    attention_qkv: int  # Q, K, V projections (MLA: q path incl. q LoRA + kv down + kv up), incl. biases
    attention_out: int  # O projection
    mlp_dense: int  # dense MLP matrices (0 on MoE layers)
    expert: int  # ONE routed expert (0 on dense layers)
    routed_experts: int  # number of routed experts in this layer (0 on dense layers)
    experts_per_token: int  # routed experts each token activates (0 on dense layers)
    shared_experts: int  # all shared experts' weights together (0 if none)
    router: int  # h * E gate (0 on dense layers)
    norms: int  # layer norm vectors (incl. MLA LoRA norms)

    @property
    def attention(self) -> int:
        return self.attention_qkv + self.attention_out

    @property
    def total(self) -> int:
        return (self.attention + self.mlp_dense + self.routed_experts * self.expert + self.shared_experts
                + self.router + self.norms)

    @property
    def active(self) -> int:
        """Weights one token touches: the routed experts count only `experts_per_token` times."""
        return (self.attention + self.mlp_dense + self.experts_per_token * self.expert
                + self.shared_experts + self.router + self.norms)


def layer_params(model: ModelSpec, layer_index: int) -> LayerParams:
    if not 0 <= layer_index < model.num_hidden_layers:
        raise ValueError(f"layer_index {layer_index} outside 0..{model.num_hidden_layers - 1}")
    return layer_params_by_kind(model, layer_index in model.moe_layer_indices)


@lru_cache(maxsize=512)
def layer_params_by_kind(model: ModelSpec, is_moe: bool) -> LayerParams:
    """A dense or an MoE layer of this model (all layers of one kind have the same weights)."""
    if is_moe and not model.is_moe:
        raise ValueError("a dense model has no MoE layers")
    h = model.hidden_size
    attention = attention_params(model)
    norms = 2 * h + (model.q_lora_rank or 0) + (model.kv_lora_rank or 0)
    if not is_moe:
        return LayerParams(
            attention_qkv=attention.qkv_matrices + attention.qkv_bias, attention_out=attention.out,
            mlp_dense=mlp_params(model, model.dense_intermediate_size),
            expert=0, routed_experts=0, experts_per_token=0, shared_experts=0, router=0, norms=norms,
        )
    return LayerParams(
        attention_qkv=attention.qkv_matrices + attention.qkv_bias, attention_out=attention.out,
        mlp_dense=0,
        expert=mlp_params(model, model.expert_intermediate_size),
        routed_experts=model.num_experts,
        experts_per_token=model.num_experts_per_tok,
        shared_experts=model.n_shared_experts * mlp_params(model, shared_expert_width(model)),
        router=h * model.num_experts,
        norms=norms,
    )


def mlp_params(model: ModelSpec, intermediate_size: int) -> int:
    """One feed-forward block (a dense MLP or one expert): 3 matrices when gated, 2 otherwise."""
    matrices = 3 if model.mlp_gated else 2
    return matrices * model.hidden_size * intermediate_size


def shared_expert_width(model: ModelSpec) -> int:
    """Intermediate size of one shared expert (DeepSeek and Llama 4 reuse the routed width)."""
    return model.shared_expert_intermediate_size or model.expert_intermediate_size


@dataclass(frozen=True, slots=True)
class ParamCounts:
    """Whole-model parameter counts by operator.

    `active` counts the embedding table and the LM head (see the module docstring for conventions);
    with tied embeddings the shared table is counted once, as `embedding`, and `lm_head` is 0.
    """

    embedding: int
    lm_head: int  # 0 when tied to the embedding
    attention: int
    mlp_dense: int
    moe_routed: int  # every routed expert of every MoE layer
    moe_shared: int
    router: int
    norms: int  # incl. the final norm
    total: int
    active: int  # per token: k routed experts per MoE layer, everything else once

    def __post_init__(self) -> None:
        parts = (self.embedding + self.lm_head + self.attention + self.mlp_dense + self.moe_routed
                 + self.moe_shared + self.router + self.norms)
        if parts != self.total:
            raise ValueError("total must equal the sum of its parts")
        if not 0 < self.active <= self.total:
            raise ValueError("active must be in 1..total")


@lru_cache(maxsize=256)
def param_counts(model: ModelSpec) -> ParamCounts:
    moe_layers = len(model.moe_layer_indices)
    dense_layers = model.num_hidden_layers - moe_layers
    dense = layer_params_by_kind(model, False)
    moe = layer_params_by_kind(model, True) if moe_layers else dense

    def summed(field: str) -> int:
        return dense_layers * getattr(dense, field) + moe_layers * getattr(moe, field)

    embedding = model.vocab_size * model.hidden_size
    lm_head = 0 if model.tie_word_embeddings else embedding
    outside_layers = embedding + lm_head + model.hidden_size  # + the final norm
    return ParamCounts(
        embedding=embedding,
        lm_head=lm_head,
        attention=summed("attention"),
        mlp_dense=summed("mlp_dense"),
        moe_routed=moe_layers * moe.routed_experts * moe.expert,
        moe_shared=summed("shared_experts"),
        router=summed("router"),
        norms=summed("norms") + model.hidden_size,
        total=outside_layers + summed("total"),
        active=outside_layers + summed("active"),
    )


# How an engine deals the L mod pp leftover layers to its pipeline stages (`pipeline_stages`, ENGINES.md section 2).
SPLIT_BEFORE_LAST = "before_last"  # vLLM `get_pp_indices`: one each to the stages just before the last
SPLIT_FIRST = "first"  # TensorRT-LLM `mapping.py` (`tensor_split`): one each to the first stages
PIPELINE_SPLITS = (SPLIT_BEFORE_LAST, SPLIT_FIRST)


@lru_cache(maxsize=256)
def pipeline_stages(num_layers: int, pipeline_parallel: int, split: str = SPLIT_BEFORE_LAST) -> tuple[range, ...]:
    """The decoder layers each pipeline stage holds, as an engine deals them (`split`).

    Every stage gets floor(L/pp) layers; the L mod pp leftover layers go one each to the stages just
    before the last under vLLM (`SPLIT_BEFORE_LAST`, its `get_pp_indices`: the first stage already holds
    the embedding and the last the LM head), to the first stages under TensorRT-LLM (`SPLIT_FIRST`).
    Llama-3.1-405B (126 layers) on pp=4: 31, 32, 32, 31 under vLLM, 32, 32, 31, 31 under TensorRT-LLM.
    """
    _check_degree("pipeline_parallel", pipeline_parallel)
    if pipeline_parallel > num_layers:
        raise ValueError(f"pipeline_parallel {pipeline_parallel} exceeds the {num_layers} layers")
    if split not in PIPELINE_SPLITS:
        raise ValueError(f"unknown pipeline split {split!r}; expected one of {list(PIPELINE_SPLITS)}")
    sizes = [num_layers // pipeline_parallel] * pipeline_parallel
    leftover = num_layers % pipeline_parallel
    for i in (range(leftover) if split == SPLIT_FIRST else range(-2, -leftover - 2, -1)):
        sizes[i] += 1
    stages, start = [], 0
    for size in sizes:
        stages.append(range(start, start + size))
        start += size
    return tuple(stages)


def _check_degree(name: str, degree: int) -> None:
    if degree < 1:
        raise ValueError(f"{name} must be >= 1")
