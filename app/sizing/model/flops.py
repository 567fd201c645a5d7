"""FLOPs and bytes of one engine step, per operator (SIZING.md sections 4 and 5).

What a step costs, on ONE GPU of a `tensor_parallel`-way split, summed over all decoder layers:

- Linear layers: 2 FLOPs per weight per token (the seed's "2P"). MoE layers multiply only the k
  routed experts a token picks (plus shared experts), but READ the weights of every distinct expert
  the step's tokens touch: E·(1-(1-k/E)^T) per MoE layer for T tokens under uniform routing, so MoE
  weight traffic grows with the batch until every expert is read. A grouped GEMM multiplies each touched
  expert by its own tokens only: T·k / E·(1-(1-k/E)^T) rows on average (1 at T = 1, T·k/E at large T),
  the rows its efficiency follows (`expected_rows_per_expert`), not the step's T.
- Expert parallelism: the step waits for the most loaded EP rank, whose routed tokens exceed the mean by
  the expected max/mean load of uniform routing (`expected_expert_load_factor`): its routed-expert FLOPs
  and activations and its share of the all-to-all grow by that factor (the ROUTED_TOKENS feature).
- Attention: per query token, per layer, 2·H·(d_qk + d_v) FLOPs per attended position (= 4·H·d·c for
  plain attention; MLA prefill uses d_nope+d_rope for q·k and d_v for the weighted sum). GQA/MQA do not
  reduce it. MLA decode runs the absorbed form (DeepSeek-V2, arXiv 2405.04434, section 2.1.3: "we can
  absorb W^UK into W^Q, and W^UV into W^O"; the form FlashMLA and the vLLM/SGLang/TensorRT-LLM MLA
  decode kernels run, SIZING.md section 4): every head attends the latent itself, so per position
  2·(kv_lora_rank + d_rope) for q·k plus 2·kv_lora_rank for the weighted sum (DeepSeek-V3: 2,176 per
  head against 640 expanded, 3.4x). The absorbed up-projections cost what kv_b_proj costs: per token
  and head, W^UK maps q_nope (d_nope) into the latent (kv_lora_rank) and W^UV maps the latent output back
  to d_v, kv_lora_rank·(d_nope + d_v) multiply-adds, exactly kv_b_proj's weights applied once per token,
  so the per-token matmul FLOPs are the same in both forms. Decode and prefill positions are therefore
  separate features. (The absorbed form's wider Q and O activations are not modelled: Q/O are charged at
  the expanded widths, small next to the latent reads.) Attention is causal: the i-th of n new tokens after a cached prefix p attends p+i positions
  (itself included), so a prefill attends n·(p + (n+1)/2) positions, half of the n² peers count.
  Window layers attend at most `w` positions (chunked layers: at most the chunk, an upper bound).
- LM head: 2·h·V per sampled position only: the last prompt token of a prefill, every decode token.
- Bytes: weights read once per step (the embedding reads only the rows of the step's tokens) + the KV
  of every attended cached token read once + the new tokens' KV written + activations (below).
  FlashAttention never writes the n x n score matrix; naive attention writes it and reads it back
  (H·n·(p+n) elements each way per layer and sequence).
- Tensor parallelism splits attention by heads (KV heads replicate when tp > Hkv, MLA's latent and
  down-projections replicate), MLPs, experts and the vocabulary, exactly as `weights.py` shards them;
  routers and norms are replicated. KV bytes per GPU come from `kv.py`.

Activation traffic is modelled simply, as it is small next to weights at decode and next to FLOPs at
prefill: each matmul reads its input and writes its output once (widths per GPU), the MLP's
intermediate is written and read back once (gate/up fused with the activation), attention reads Q and
writes O, norms and residual adds are fused into their neighbours. Embedding and LM head under TP
touch their vocabulary shard; the extra all-reduce of a vocabulary-parallel embedding is not counted.

Every operator's cost is a linear form over a step's SHAPE (the tokens it processes, the positions
it samples, per attention window the positions its prompt and its decoding tokens attend to and the KV
tokens it reads, the distinct experts it touches, the routed tokens of the most loaded EP rank): `StepCostModel` holds those coefficients once per model and precision,
`prefill_cost`/`decode_cost` evaluate them at an exact shape, and the fast step-time model
(`perf.py`) evaluates the same coefficients over arrays of shapes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numpy.typing import ArrayLike

from app.sizing.hardware.comm import FFN_ALL_GATHER, PER_EXPERT, moe_exchange_bytes_per_token
from app.sizing.model import recipes as groups
from app.sizing.model.kv import kv_bytes_per_token_per_layer
from app.sizing.model.params import (
    attention_params,
    ceil_div,
    layer_params_by_kind,
    mlp_params,
    param_counts,
    shared_expert_width,
)
from app.sizing.model.recipes import FORMATS, WeightRecipe, resolve_recipe
from app.sizing.specs import WEIGHT_DTYPES, ModelSpec, bits_per_value

PREFILL = "prefill"
DECODE = "decode"

# Operators, in forward order.
EMBEDDING = "embedding"
QKV = "qkv"
ATTENTION = "attention"
OUT = "out"
MLP = "mlp"
MOE = "moe"
ROUTER = "router"
NORM = "norm"
LM_HEAD = "lm_head"
OPERATORS = (EMBEDDING, QKV, ATTENTION, OUT, MLP, MOE, ROUTER, NORM, LM_HEAD)

# Operators whose operands stay 16-bit whatever the weight dtype (weights.WEIGHT_QUANTIZATION_SCOPE):
# attention multiplies activations by the KV cache; embedding, LM head, router and norms keep bf16.
HIGH_PRECISION_OPERATORS = frozenset({EMBEDDING, ATTENTION, ROUTER, NORM, LM_HEAD})

# The step shape: the quantities every operator's cost is linear in (indices into a shape vector).
STEP = 0  # 1 when the step processes any token: the layer weights are read once per step
SAMPLED_STEP = 1  # 1 when any position is sampled: the LM head's weights are read
TOKENS = 2  # new tokens processed: prompt tokens being prefilled plus one per decoding sequence
SAMPLED = 3  # positions whose logits are computed: one per sequence in the step
DISTINCT_EXPERTS = 4  # expected routed experts touched per MoE layer
SCORE_ENTRIES = 5  # naive attention only: sum over sequences of n·(p+n) score entries per head
ROUTED_TOKENS = 6  # tokens x the expert load factor: the routed-expert work of the most loaded EP rank
FIRST_WINDOW_GROUP = 7  # then per attention window, WINDOW_FEATURES of them:
WINDOW_FEATURES = 3  # positions the prompt tokens attend, KV tokens read, positions decoding tokens attend

# Rows each operator's matmuls multiply: what its achieved efficiency depends on. The LM head
# multiplies only the sampled positions; attention is not a row-wise matmul (None), and embedding and
# norms do no matmul at all. The MoE operator's routed-expert FLOPs (its ROUTED_TOKENS coefficients)
# follow the rows per touched expert instead (`expected_rows_per_expert`); its shared experts the tokens.
MATMUL_ROWS: dict[str, int | None] = {
    EMBEDDING: None, QKV: TOKENS, ATTENTION: None, OUT: TOKENS, MLP: TOKENS, MOE: TOKENS, ROUTER: TOKENS,
    NORM: None, LM_HEAD: SAMPLED,
}

_FLOPS, _WEIGHT, _KV, _ACTIVATION = range(4)


@dataclass(frozen=True, slots=True)
class OperatorCost:
    """One operator over the whole step (all layers), on one GPU."""

    name: str
    flops: float
    weight_bytes: float
    kv_bytes: float
    activation_bytes: float

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_bytes + self.activation_bytes

    @property
    def arithmetic_intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else float("inf")


@dataclass(frozen=True, slots=True)
class PhaseCost:
    """FLOPs and bytes of one prefill or decode step on one GPU, by operator."""

    phase: str  # PREFILL or DECODE
    tokens: int  # new tokens processed this step (all sequences)
    operators: tuple[OperatorCost, ...]
    sequences: int
    tensor_parallel: int
    num_layers: int
    hidden_state_bytes_per_token: float  # h · activation bytes: one token's TP all-reduce / PP message
    activation_dtype: str
    data_parallel: int = 1  # attention data-parallel ranks: the step is one rank's (`tokens` its own)
    expert_parallel: int = 1
    num_moe_layers: int = 0
    moe_exchange_bytes_per_token: float = 0.0  # per exchanging layer and direction (comm.moe_exchange_bytes_per_token)
    num_exchange_layers: int = 0  # layers whose feed-forward block exchanges tokens (`StepCostModel`)
    # The routed experts: their share of the MOE operator's FLOPs (the rest are shared experts'), the rows
    # each touched expert's GEMM multiplies, and the most loaded EP rank's max/mean load (`StepCostModel`).
    routed_expert_flops: float = 0.0
    rows_per_expert: float = 0.0
    expert_load_factor: float = 1.0

    @property
    def flops(self) -> float:
        return sum(op.flops for op in self.operators)

    @property
    def bytes(self) -> float:
        return sum(op.bytes for op in self.operators)

    @property
    def weight_bytes(self) -> float:
        return sum(op.weight_bytes for op in self.operators)

    @property
    def kv_bytes(self) -> float:
        return sum(op.kv_bytes for op in self.operators)

    @property
    def activation_bytes(self) -> float:
        return sum(op.activation_bytes for op in self.operators)

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per byte moved (compare with the GPU's ridge point)."""
        return self.flops / self.bytes

    def operator(self, name: str) -> OperatorCost:
        for op in self.operators:
            if op.name == name:
                return op
        raise KeyError(f"no operator {name!r} in this step; it has {[op.name for op in self.operators]}")


# Skewed routing instead of uniform: tried on 2026-12-08, recorded at step_time._experts_table.
def expected_distinct_experts(num_experts: int, experts_per_token: int,
                              routed_tokens: ArrayLike) -> float | np.ndarray:
    """Expected distinct routed experts T tokens touch in one MoE layer: E·(1 − (1 − k/E)^T).

    Each token picks k of E experts (uniform routing), so one expert escapes a token with probability
    1 − k/E and escapes all T tokens with (1 − k/E)^T. Accepts a number or an array of token counts.
    """
    if num_experts < 1 or not 1 <= experts_per_token <= num_experts:
        raise ValueError("need num_experts >= 1 and 1 <= experts_per_token <= num_experts")
    miss = 1.0 - experts_per_token / num_experts
    distinct = num_experts * (1.0 - miss ** np.asarray(routed_tokens, dtype=float))
    return float(distinct) if distinct.ndim == 0 else distinct


def expected_rows_per_expert(num_experts: int, experts_per_token: int,
                             routed_tokens: ArrayLike) -> float | np.ndarray:
    """Expected rows each touched expert's GEMM multiplies when T tokens route to k experts each:
    T·k / E·(1 − (1 − k/E)^T), the T·k token copies shared by the distinct experts they touch (1 at T = 1,
    where every touched expert gets the one token; T·k/E once T is large). 0 for no tokens."""
    tokens = np.asarray(routed_tokens, dtype=float)
    distinct = np.asarray(expected_distinct_experts(num_experts, experts_per_token, tokens))
    rows = np.divide(tokens * experts_per_token, distinct, out=np.zeros_like(distinct), where=distinct > 0)
    return float(rows) if rows.ndim == 0 else rows


@lru_cache(maxsize=64)
def expected_max_standard_normal(count: int) -> float:
    """E[max of `count` independent standard normal values], by numerical integration of
    E[max] = ∫_0^∞ (1 − Φ(x)^n) dx − ∫_−∞^0 Φ(x)^n dx = a − ∫_−a^a Φ(x)^n dx for a large a (a = 12;
    trapezoids of 1e-3 on the smooth Φ^n: error < 1e-7). Tabulated values (Tippett 1925; Harter 1961):
    0 for 1, 1/√π = 0.5642 for 2, 1.0294 for 4, 1.4236 for 8."""
    if count < 1:
        raise ValueError("count must be >= 1")
    x = np.linspace(-12.0, 12.0, 24_001)
    cdf = np.array([0.5 * math.erfc(-value / math.sqrt(2.0)) for value in x]) ** count
    return 12.0 - float(np.sum((cdf[1:] + cdf[:-1]) / 2) * (x[1] - x[0]))


def expected_expert_load_factor(num_experts: int, experts_per_token: int, routed_tokens: ArrayLike,
                                expert_parallel: int) -> float | np.ndarray:
    """Expected max/mean routed token copies per expert-parallel rank when T tokens (all ranks' of the
    exchange) route to k experts each, uniformly: the most loaded rank's extra work, which the step waits for.

    N = T·k copies fall on ep ranks, each with probability 1/ep (copies taken as independent), so a rank's
    load is Binomial(N, 1/ep) and the loads are multinomial. For large N the load vector is
    N/ep + sqrt(N/ep)·(Z_i − mean Z) with Z_i independent standard normals (the same covariances:
    N/ep·(1 − 1/ep) on the diagonal, −N/ep² off it), so E[max] = N/ep + sqrt(N/ep)·E[max Z] and the factor
    is 1 + E[max of ep standard normals] / sqrt(N/ep): 1 with one rank, falling to 1 as N grows. It is
    capped where the most loaded rank takes every copy it can: min(k, ceil(E/ep)) of each token's k, a
    factor ep·min(k, ceil(E/ep))/k. This is the floor uniform routing sets; skewed routing adds to it
    (what DeepSeek-V3's EPLB, redundant hot experts, counters). Accepts a number or an array of T.
    """
    if expert_parallel < 1:
        raise ValueError("expert_parallel must be >= 1")
    tokens = np.asarray(routed_tokens, dtype=float)
    if expert_parallel == 1:
        factor = np.ones_like(tokens)
    else:
        mean = tokens * experts_per_token / expert_parallel
        cap = expert_parallel * min(experts_per_token, ceil_div(num_experts, expert_parallel)) / experts_per_token
        spread = expected_max_standard_normal(expert_parallel) / np.sqrt(np.maximum(mean, 1e-300))
        factor = np.where(mean > 0, np.minimum(1.0 + spread, cap), 1.0)
    return float(factor) if factor.ndim == 0 else factor


def attended_positions(cached_tokens: int, new_tokens: int, window: int | None) -> int:
    """Sum over `new_tokens` causal query tokens after `cached_tokens` of the positions each attends.

    The i-th new token sits at position p+i and attends min(p+i, w) positions (itself included).
    Without a window: n·p + n·(n+1)/2.
    """
    if window is None:
        return new_tokens * cached_tokens + new_tokens * (new_tokens + 1) // 2
    below_window = min(max(window - cached_tokens, 0), new_tokens)  # new tokens at positions <= w
    return (below_window * cached_tokens + below_window * (below_window + 1) // 2
            + (new_tokens - below_window) * window)


def kv_tokens_read(cached_tokens: int, new_tokens: int, window: int | None) -> int:
    """KV entries one sequence's attention reads per layer: the cached tokens any new token still sees
    (a window of w keeps the last w-1 before the first new token) plus the new tokens themselves."""
    if new_tokens == 0:
        return 0
    visible_cache = cached_tokens if window is None else min(cached_tokens, window - 1)
    return new_tokens + visible_cache


@dataclass(frozen=True, slots=True, eq=False)
class StepCostModel:
    """Each operator's FLOPs and bytes (one GPU, all layers) as a linear form over a step shape.

    Matrices are (operators, shape features); feature indices are the module constants above, then
    WINDOW_FEATURES per attention window in `windows` (positions prompt tokens attend, KV tokens read,
    positions decoding tokens attend).
    """

    operator_names: tuple[str, ...]
    windows: tuple[int | None, ...]  # distinct attention windows, None = global attention
    flops: np.ndarray
    weight_bytes: np.ndarray
    kv_bytes: np.ndarray
    activation_bytes: np.ndarray
    num_experts: int
    experts_per_token: int
    num_layers: int
    tensor_parallel: int
    activation_dtype: str
    hidden_state_bytes_per_token: float
    # Attention data parallelism: the MoE layers see the tokens of all `moe_token_scale` (= dp) ranks, so
    # the distinct experts are those dp·T tokens touch (this GPU owns 1/ep of them: in the coefficients).
    moe_token_scale: int = 1
    num_moe_layers: int = 0
    moe_exchange_bytes_per_token: float = 0.0  # comm.moe_exchange_bytes_per_token, per exchanging layer and direction
    num_exchange_layers: int = 0  # layers exchanging tokens: the MoE ones, or all under `FFN_ALL_GATHER` (dp > 1)
    expert_parallel: int = 1
    moe_exchange: str = PER_EXPERT  # how the engine moves the MoE layers' tokens (`comm.MOE_EXCHANGES`)

    def shape(self, tokens: ArrayLike, sampled: ArrayLike, attended: Sequence[ArrayLike],
              kv_read: Sequence[ArrayLike], score_entries: ArrayLike = 0.0,
              decode_attended: Sequence[ArrayLike] | None = None) -> list[ArrayLike]:
        """A step's shape: its feature values in feature order (numbers, or arrays that broadcast).

        Per window of `windows`, summed over sequences: `attended` the positions the prompt (prefill)
        tokens attend to, `kv_read` the KV tokens read, `decode_attended` the positions the decoding tokens
        attend to (default none).
        """
        if decode_attended is None:
            decode_attended = [0.0] * len(self.windows)
        distinct = self.distinct_experts(tokens) if self.num_experts else 0.0
        routed = self.routed_tokens(tokens) if self.num_experts else 0.0
        per_window = [value for group in zip(attended, kv_read, decode_attended, strict=True) for value in group]
        return [tokens > 0, sampled > 0, tokens, sampled, distinct, score_entries, routed,  # type: ignore[operator]
                *per_window]

    def distinct_experts(self, tokens: ArrayLike) -> float | np.ndarray:
        """Distinct routed experts one MoE layer touches when every data-parallel rank brings `tokens`."""
        return expected_distinct_experts(self.num_experts, self.experts_per_token,
                                         np.multiply(tokens, self.moe_token_scale))

    def routed_tokens(self, tokens: ArrayLike) -> float | np.ndarray:
        """The ROUTED_TOKENS feature: `tokens` times the load factor of the most loaded EP rank when every
        data-parallel rank brings as many (exactly `tokens` without expert parallelism)."""
        return np.multiply(tokens, expected_expert_load_factor(
            self.num_experts, self.experts_per_token, np.multiply(tokens, self.moe_token_scale),
            self.expert_parallel)) if self.expert_parallel > 1 else tokens  # type: ignore[return-value]

    @property
    def moe_exchange_routed(self) -> bool:
        """Whether the exchange follows the routing (`comm.PER_EXPERT` under EP: the most loaded EP rank's
        tokens set its time) or moves every rank's tokens alike (an all-gather: the rank's own tokens set it)."""
        return self.expert_parallel > 1 and self.moe_exchange == PER_EXPERT

    def rows_per_expert(self, tokens: ArrayLike) -> float | np.ndarray:
        """Rows each touched routed expert's GEMM multiplies when every data-parallel rank brings `tokens`."""
        return expected_rows_per_expert(self.num_experts, self.experts_per_token,
                                        np.multiply(tokens, self.moe_token_scale))

    def evaluate(self, shape: Sequence[float]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(flops, weight bytes, KV bytes, activation bytes) per operator at one step shape."""
        vector = np.array(shape, dtype=float)
        return (self.flops @ vector, self.weight_bytes @ vector, self.kv_bytes @ vector,
                self.activation_bytes @ vector)

    @property
    def bytes(self) -> np.ndarray:
        """Total bytes coefficients (weights + KV + activations)."""
        return self.weight_bytes + self.kv_bytes + self.activation_bytes

    @property
    def weight_bytes_per_step(self) -> float:
        """Weights read once by any step that processes and samples tokens (all but routed experts)."""
        return float(self.weight_bytes[:, STEP].sum() + self.weight_bytes[:, SAMPLED_STEP].sum())

    @property
    def bytes_per_distinct_expert(self) -> float:
        """Weight bytes of one routed expert in every MoE layer together (0 for dense models)."""
        return float(self.weight_bytes[:, DISTINCT_EXPERTS].sum())


@lru_cache(maxsize=256)
def step_cost_model(model: ModelSpec, weight_dtype: str | WeightRecipe = "bf16", kv_dtype: str = "bf16",
                    activation_dtype: str = "bf16", tensor_parallel: int = 1, data_parallel: int = 1,
                    expert_parallel: int = 1, moe_exchange: str = PER_EXPERT) -> StepCostModel:
    """The per-operator linear forms of a model at these precisions and layout (computed once), on one GPU
    of one attention data-parallel rank, per token of that rank; `moe_exchange`: how the engine moves the
    MoE layers' tokens between data-parallel ranks (`comm.moe_exchange_bytes_per_token`).

    Attention, dense MLP, shared experts, embedding and LM head split by `tensor_parallel` (and are
    replicated across data-parallel ranks). The routed experts of one MoE layer serve the tokens of all dp
    ranks and are spread over tp·dp GPUs: this GPU owns 1/ep of them, each split over moe_tp = tp·dp/ep,
    so per own token it multiplies k·dp/ep expert shares of width F_e/moe_tp (with dp = ep = 1: k experts
    at F_e/tp, plain TP), and reads the distinct experts that dp·T tokens touch, divided by ep.
    Under an `FFN_ALL_GATHER` exchange (SGLang's attention DP) the dense MLPs and shared experts span tp·dp GPUs
    too (`weights.weight_groups_per_stage`): this GPU reads 1/(tp·dp) of their columns and multiplies the dp·T
    gathered tokens by them, and every layer gathers and scatters (`num_exchange_layers`); their GEMMs are timed
    at the rank's own rows (dp times fewer than gathered: an upper bound where the rows are few).
    `weight_dtype` is a plain dtype (the decoder's linear matrices in it, the rest bf16) or a checkpoint's
    recipe: each operator then reads its weights in its parameter group's format.
    """
    if isinstance(weight_dtype, str) and weight_dtype not in WEIGHT_DTYPES:
        raise ValueError(f"unknown weight dtype {weight_dtype!r}; expected one of {list(WEIGHT_DTYPES)}")
    if min(tensor_parallel, data_parallel, expert_parallel) < 1:
        raise ValueError("tensor_parallel, data_parallel and expert_parallel must be >= 1")
    if (tensor_parallel * data_parallel) % expert_parallel:
        raise ValueError("expert_parallel must divide tensor_parallel x data_parallel")
    tp = tensor_parallel
    moe_tp = tp * data_parallel // expert_parallel
    moe_share = data_parallel / expert_parallel  # expert work per own token, relative to plain TP's split
    recipe = resolve_recipe(weight_dtype)

    def weight_b(group: str, layer: int | None = None) -> float:
        """Bytes per weight of a parameter group (scales included)."""
        return float(FORMATS[recipe.format_of(group, layer, model.num_hidden_layers)].bits) / 8

    act_b = bits_per_value(activation_dtype) / 8
    kv_value_b = bits_per_value(kv_dtype) / 8
    h = model.hidden_size
    heads = ceil_div(model.num_attention_heads, tp)  # the most loaded rank's query heads
    qk_dim, v_dim = _head_dims(model)
    decode_width = _decode_attention_width(model)
    windows = tuple(dict.fromkeys(model.layer_window(kind) for kind in model.resolved_layer_types))
    cost = {name: np.zeros((4, FIRST_WINDOW_GROUP + WINDOW_FEATURES * len(windows))) for name in OPERATORS}
    attention = attention_params(model, tp)
    moe_layers = model.moe_layer_indices
    # Feed-forward blocks split their intermediate columns: a rank holds ceil(F/tp) of them (weights.py); the dense
    # and shared ones ceil(F/(tp·dp)) where every block spans the tp·dp GPUs, on the `gathered` ranks' tokens.
    gathered = data_parallel if moe_exchange == FFN_ALL_GATHER else 1
    dense_width = ceil_div(model.dense_intermediate_size, tp * gathered)
    expert_width = ceil_div(model.expert_intermediate_size, moe_tp)
    shared_width = ceil_div(shared_expert_width(model), tp * gathered)
    expert = mlp_params(model, expert_width)  # one routed expert's weights on this rank
    shared = model.n_shared_experts * mlp_params(model, shared_width)

    # Embedding: the rows of this step's tokens, from this rank's vocabulary shard.
    cost[EMBEDDING][_WEIGHT, TOKENS] = h * weight_b(groups.EMBEDDING) / tp
    cost[EMBEDDING][_ACTIVATION, TOKENS] = h * act_b
    for index, kind in enumerate(model.resolved_layer_types):
        layer = layer_params_by_kind(model, index in moe_layers)
        attended = FIRST_WINDOW_GROUP + WINDOW_FEATURES * windows.index(model.layer_window(kind))
        kv_token = kv_bytes_per_token_per_layer(model, index, kv_dtype, tp)
        kv_width = kv_token / kv_value_b  # K and V values (MLA: the latent) one token adds on this GPU

        cost[QKV][_FLOPS, TOKENS] += 2 * attention.qkv_matrices
        cost[QKV][_WEIGHT, STEP] += (attention.qkv_matrices * weight_b(groups.ATTENTION)
                                     + attention.qkv_bias * weight_b(groups.NORMS_AND_BIASES))
        cost[QKV][_ACTIVATION, TOKENS] += (h + heads * qk_dim + kv_width) * act_b

        cost[ATTENTION][_FLOPS, attended] += 2 * heads * (qk_dim + v_dim)
        cost[ATTENTION][_FLOPS, attended + 2] += 2 * heads * decode_width
        cost[ATTENTION][_KV, attended + 1] += kv_token  # read every visible cached token once
        cost[ATTENTION][_KV, TOKENS] += kv_token  # write the new tokens' K/V
        cost[ATTENTION][_ACTIVATION, TOKENS] += heads * (qk_dim + v_dim) * act_b  # read Q, write O
        cost[ATTENTION][_ACTIVATION, SCORE_ENTRIES] += 2 * heads * act_b  # naive: scores out and back

        cost[OUT][_FLOPS, TOKENS] += 2 * attention.out
        cost[OUT][_WEIGHT, STEP] += attention.out * weight_b(groups.ATTENTION)
        cost[OUT][_ACTIVATION, TOKENS] += (heads * v_dim + h) * act_b

        if layer.mlp_dense:
            mlp = mlp_params(model, dense_width)
            cost[MLP][_FLOPS, TOKENS] += 2 * mlp * gathered
            cost[MLP][_WEIGHT, STEP] += mlp * weight_b(groups.DENSE_MLP, index)
            cost[MLP][_ACTIVATION, TOKENS] += (2 * h + 2 * dense_width) * gathered * act_b  # intermediate out and back
        if layer.routed_experts:
            k = layer.experts_per_token
            cost[MOE][_FLOPS, TOKENS] += 2 * shared * gathered
            cost[MOE][_FLOPS, ROUTED_TOKENS] += 2 * k * moe_share * expert
            cost[MOE][_WEIGHT, STEP] += shared * weight_b(groups.SHARED_EXPERTS)
            cost[MOE][_WEIGHT, DISTINCT_EXPERTS] += expert * weight_b(groups.EXPERTS) / expert_parallel
            # Block input and output, then each expert's intermediate out and back.
            cost[MOE][_ACTIVATION, TOKENS] += (2 * h + 2 * model.n_shared_experts * shared_width * gathered) * act_b
            cost[MOE][_ACTIVATION, ROUTED_TOKENS] += 2 * k * moe_share * expert_width * act_b
            cost[ROUTER][_FLOPS, TOKENS] += 2 * layer.router
            cost[ROUTER][_WEIGHT, STEP] += layer.router * weight_b(groups.ROUTER)
            cost[ROUTER][_ACTIVATION, TOKENS] += layer.routed_experts * act_b  # router logits
    cost[NORM][_WEIGHT, STEP] = param_counts(model).norms * weight_b(groups.NORMS_AND_BIASES)  # + final norm

    vocabulary_shard = ceil_div(model.vocab_size, tp)  # LM head rows on this rank, as weights.py splits
    cost[LM_HEAD][_FLOPS, SAMPLED] = 2 * vocabulary_shard * h
    head = groups.EMBEDDING if model.tie_word_embeddings else groups.LM_HEAD  # tied or not, the table is read
    cost[LM_HEAD][_WEIGHT, SAMPLED_STEP] = vocabulary_shard * h * weight_b(head)
    cost[LM_HEAD][_ACTIVATION, SAMPLED] = (h + vocabulary_shard) * act_b  # hidden state in, logits out

    names = tuple(name for name in OPERATORS if cost[name].any())
    stacked = np.stack([cost[name] for name in names], axis=1)  # (4, operators, features)
    for matrix in stacked:
        matrix.setflags(write=False)
    return StepCostModel(
        operator_names=names, windows=windows,
        flops=stacked[_FLOPS], weight_bytes=stacked[_WEIGHT], kv_bytes=stacked[_KV],
        activation_bytes=stacked[_ACTIVATION],
        num_experts=model.num_experts, experts_per_token=model.num_experts_per_tok,
        num_layers=model.num_hidden_layers, tensor_parallel=tp, activation_dtype=activation_dtype,
        hidden_state_bytes_per_token=h * act_b,
        moe_token_scale=data_parallel, num_moe_layers=len(moe_layers),
        moe_exchange_bytes_per_token=moe_exchange_bytes_per_token(
            h, act_b, model.num_experts_per_tok, tensor_parallel=tp, data_parallel=data_parallel,
            expert_parallel=expert_parallel, exchange=moe_exchange) if model.is_moe or gathered > 1 else 0.0,
        num_exchange_layers=model.num_hidden_layers if gathered > 1 else len(moe_layers),
        expert_parallel=expert_parallel,
        moe_exchange=moe_exchange,
    )


def prefill_cost(model: ModelSpec, prompt_tokens: int, cached_tokens: int = 0, batch_size: int = 1,
                 weight_dtype: str | WeightRecipe = "bf16", kv_dtype: str = "bf16", activation_dtype: str = "bf16",
                 tensor_parallel: int = 1, flash_attention: bool = True, data_parallel: int = 1,
                 expert_parallel: int = 1) -> PhaseCost:
    """One step prefilling `prompt_tokens` new tokens for each of `batch_size` sequences, each after
    `cached_tokens` already in the KV cache (a prefix-cache hit or earlier chunks). The LM head runs
    on the last prompt position of each sequence only. With attention data parallelism the sequences are
    one rank's, and every rank brings as many (`step_cost_model`)."""
    if prompt_tokens < 1:
        raise ValueError("prompt_tokens must be >= 1")
    return _phase_cost(PREFILL, model, prompt_tokens, cached_tokens, batch_size, weight_dtype, kv_dtype,
                       activation_dtype, tensor_parallel, flash_attention, data_parallel, expert_parallel)


def decode_cost(model: ModelSpec, context_tokens: int, batch_size: int = 1, weight_dtype: str | WeightRecipe = "bf16",
                kv_dtype: str = "bf16", activation_dtype: str = "bf16",
                tensor_parallel: int = 1, data_parallel: int = 1, expert_parallel: int = 1) -> PhaseCost:
    """One decode step: `batch_size` sequences each hold `context_tokens` in the KV cache and generate
    one token, which attends its context plus itself (a one-token prefill that samples). With attention
    data parallelism the sequences are one rank's."""
    return _phase_cost(DECODE, model, 1, context_tokens, batch_size, weight_dtype, kv_dtype,
                       activation_dtype, tensor_parallel, True, data_parallel, expert_parallel)


def attention_traffic(model: ModelSpec, tokens: int, kv_dtype: str = "bf16",
                      activation_dtype: str = "bf16") -> tuple[float, float]:
    """HBM bytes of the attention operator prefilling one `tokens`-token prompt (whole model, one GPU):
    (with FlashAttention, naive). The gap is the n x n score matrix, written and read back per head and
    layer by naive attention and kept on chip by FlashAttention (the seed's FlashAttention lesson)."""
    flash = prefill_cost(model, tokens, kv_dtype=kv_dtype, activation_dtype=activation_dtype).operator(ATTENTION).bytes
    return flash, flash + score_matrix_bytes(model, tokens, kv_dtype=kv_dtype, activation_dtype=activation_dtype)


def score_matrix_bytes(model: ModelSpec, new_tokens: int, cached_tokens: int = 0, batch_size: int = 1,
                       weight_dtype: str | WeightRecipe = "bf16", kv_dtype: str = "bf16",
                       activation_dtype: str = "bf16", tensor_parallel: int = 1, data_parallel: int = 1,
                       expert_parallel: int = 1) -> float:
    """HBM bytes naive attention adds to a step over FlashAttention (one GPU, all layers): each sequence's
    n·(p+n) score entries per head, written and read back (`SCORE_ENTRIES`). The same term `prefill_cost(...,
    flash_attention=False)` adds to its attention operator, without pricing the rest of the step again."""
    model_costs = step_cost_model(model, weight_dtype, kv_dtype, activation_dtype, tensor_parallel,
                                  data_parallel, expert_parallel)
    per_entry = model_costs.activation_bytes[model_costs.operator_names.index(ATTENTION), SCORE_ENTRIES]
    return float(per_entry) * batch_size * new_tokens * (cached_tokens + new_tokens)


# Internals ----------------------------------------------------------------------------------------

def _phase_cost(phase: str, model: ModelSpec, new_tokens: int, cached_tokens: int, batch_size: int,
                weight_dtype: str | WeightRecipe, kv_dtype: str, activation_dtype: str, tensor_parallel: int,
                flash_attention: bool, data_parallel: int = 1, expert_parallel: int = 1) -> PhaseCost:
    if cached_tokens < 0:
        raise ValueError("cached/context tokens must be >= 0")
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    model_costs = step_cost_model(model, weight_dtype, kv_dtype, activation_dtype, tensor_parallel,
                                  data_parallel, expert_parallel)
    windows = model_costs.windows
    tokens = batch_size * new_tokens
    attended = [batch_size * attended_positions(cached_tokens, new_tokens, w) for w in windows]
    none = [0] * len(windows)
    shape = model_costs.shape(
        tokens=tokens,
        sampled=batch_size,
        attended=none if phase == DECODE else attended,
        kv_read=[batch_size * kv_tokens_read(cached_tokens, new_tokens, w) for w in windows],
        score_entries=0 if flash_attention else batch_size * new_tokens * (cached_tokens + new_tokens),
        decode_attended=attended if phase == DECODE else none,
    )
    flops, weight, kv, activation = (values.tolist() for values in model_costs.evaluate(shape))
    moe = model_costs.operator_names.index(MOE) if MOE in model_costs.operator_names else None
    operators = tuple(
        OperatorCost(name, flops[i], weight[i], kv[i], activation[i])
        for i, name in enumerate(model_costs.operator_names)
    )
    return PhaseCost(
        phase=phase, tokens=batch_size * new_tokens, operators=operators, sequences=batch_size,
        tensor_parallel=tensor_parallel, num_layers=model.num_hidden_layers,
        hidden_state_bytes_per_token=model_costs.hidden_state_bytes_per_token,
        activation_dtype=activation_dtype, data_parallel=data_parallel, expert_parallel=expert_parallel,
        num_moe_layers=model_costs.num_moe_layers,
        moe_exchange_bytes_per_token=model_costs.moe_exchange_bytes_per_token,
        num_exchange_layers=model_costs.num_exchange_layers,
        routed_expert_flops=0.0 if moe is None else float(model_costs.flops[moe, ROUTED_TOKENS] * shape[ROUTED_TOKENS]),
        rows_per_expert=float(model_costs.rows_per_expert(tokens)) if model.is_moe else 0.0,
        expert_load_factor=float(shape[ROUTED_TOKENS]) / tokens if model.is_moe else 1.0,
    )


def _decode_attention_width(model: ModelSpec) -> int:
    """FLOPs / 2 per head and position a decoding token's attention costs: MLA's absorbed form works in
    the latent, kv_lora_rank + d_rope for q·k and kv_lora_rank for the weighted sum (module docstring);
    other attention as in prefill, d_qk + d_v."""
    if model.is_mla:
        assert model.kv_lora_rank is not None and model.qk_rope_head_dim is not None
        return 2 * model.kv_lora_rank + model.qk_rope_head_dim
    return sum(_head_dims(model))


def _head_dims(model: ModelSpec) -> tuple[int, int]:
    """(query/key width, value width) of one attention head."""
    if model.is_mla:
        assert model.qk_nope_head_dim is not None and model.qk_rope_head_dim is not None
        assert model.v_head_dim is not None
        return model.qk_nope_head_dim + model.qk_rope_head_dim, model.v_head_dim
    return model.resolved_head_dim, model.resolved_head_dim
