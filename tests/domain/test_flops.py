"""FLOPs and bytes per operator per step, worked by hand.

Independent sources: SIZING.md sections 4-5 (2 FLOPs per active weight, 4·H·d·c attention, causal
prefill 4·H·d·n·(p + (n+1)/2) vs the n² overcount, LM head on sampled positions only, E·(1-(1-k/E)^T)
distinct experts, FlashAttention vs naive score traffic), the model cards (Mixtral 12.9e9 active,
DeepSeek-V3 MLA KV 70,272 B/token), and the weight and KV modules' own published-figure tests, which
these costs must agree with (the same sharding, the same bytes per GPU).
"""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.sizing.model.flops import (
    ATTENTION,
    DECODE,
    LM_HEAD,
    MLP,
    MOE,
    OUT,
    PREFILL,
    QKV,
    attended_positions,
    attention_traffic,
    decode_cost,
    expected_distinct_experts,
    expected_expert_load_factor,
    expected_max_standard_normal,
    expected_rows_per_expert,
    kv_tokens_read,
    prefill_cost,
    score_matrix_bytes,
    step_cost_model,
)
from app.sizing.model.params import ceil_div
from app.sizing.model.weights import weight_bytes_per_gpu
from app.sizing.specs import ModelSpec
from tests.domain.models_for_tests import (
    ALL_MODELS,
    DEEPSEEK_V3,
    FALCON_7B,
    GEMMA_2_9B,
    LLAMA_3_8B,
    LLAMA_3_70B,
    MIXTRAL_8X7B,
    random_models,
)

# Llama-3-8B per layer (h=4096, H=32, Hkv=8, d=128, F=14336, L=32, V=128256):
#   qkv 4096 x (32 + 2 x 8) x 128 = 25,165,824; out 4096 x 4096 = 16,777,216; MLP 3 x 4096 x 14336 = 176,160,768
#   per layer matmuls 218,103,808; x 32 = 6,979,321,856; LM head 128256 x 4096 = 525,336,576


def test_llama_3_8b_decode_by_operator() -> None:
    """Batch 1, 1,023 cached tokens (the new token attends 1,024), bf16, tp 1.

    FLOPs: qkv 2 x 25,165,824 x 32 = 1,610,612,736; out 2 x 16,777,216 x 32 = 1,073,741,824;
           mlp 2 x 176,160,768 x 32 = 11,274,289,152; LM head 2 x 525,336,576 = 1,050,673,152;
           attention 4 x 32 x 128 x 1,024 x 32 = 536,870,912.   Total 15,546,187,776.
    Weight bytes = 2 x FLOPs-per-token for each matmul, norms (32 x 2 x 4096 + 4096) x 2 = 532,480,
           one embedding row 4096 x 2 = 8,192.
    KV: 2 x 8 x 128 x 2 = 4,096 B per token per layer; read 1,024 + write 1 -> 4,096 x 32 x 1,025.
    Activations (elements x 2 B): qkv 32 x (4096 in + 4096 q + 2048 k/v) = 655,360 B; attention
           32 x (4096 q + 4096 o) = 524,288; out 524,288; mlp 32 x (2 x 4096 + 2 x 14336) = 2,359,296;
           embedding 8,192; LM head (4096 + 128256) x 2 = 264,704.
    """
    cost = decode_cost(LLAMA_3_8B, 1023)
    by_name = {op.name: op for op in cost.operators}
    assert set(by_name) == {"embedding", "qkv", "attention", "out", "mlp", "norm", "lm_head"}
    assert by_name[QKV].flops == 1_610_612_736 and by_name[QKV].weight_bytes == 1_610_612_736
    assert by_name[OUT].flops == 1_073_741_824 and by_name[OUT].weight_bytes == 1_073_741_824
    assert by_name[MLP].flops == 11_274_289_152 and by_name[MLP].weight_bytes == 11_274_289_152
    assert by_name[LM_HEAD].flops == 1_050_673_152 and by_name[LM_HEAD].weight_bytes == 1_050_673_152
    assert by_name[ATTENTION].flops == 536_870_912
    assert by_name[ATTENTION].kv_bytes == 4_096 * 32 * 1_025 == 134_348_800
    assert by_name["norm"].weight_bytes == 532_480
    assert by_name["embedding"].weight_bytes == 8_192
    assert [by_name[name].activation_bytes for name in ("embedding", "qkv", "attention", "out", "mlp",
                                                         "lm_head")] == [8_192, 655_360, 524_288, 524_288,
                                                                         2_359_296, 264_704]
    assert cost.flops == 15_546_187_776
    assert cost.bytes == 15_148_542_464
    assert (cost.phase, cost.tokens, cost.sequences) == (DECODE, 1, 1)


def test_llama_3_8b_causal_prefill_by_operator() -> None:
    """1,000-token prompt, no cache. Per token the matmuls cost 2 x 6,979,321,856 = 13,958,643,712 FLOPs:
    qkv 1,610,612,736,000; out 1,073,741,824,000; mlp 11,274,289,152,000.
    Attention is causal: token i attends i positions, sum 1000 x 1001 / 2 = 500,500:
      4 x 32 x 128 x 500,500 x 32 = 262,406,144,000 FLOPs (the n² count, 524,288,000,000, is 2x).
    LM head on the last position only: 1,050,673,152 (1,000x that if every position were sampled).
    Total 14,222,100,529,152 FLOPs.
    Bytes: weights 15,009,849,344 + 1,000 embedding rows 8,192,000 + KV 131,072 x 1,000 written and
    read 262,144,000 + activations 1,000 x 4,071,424 + LM head 264,704 = 19,351,874,048.
    """
    cost = prefill_cost(LLAMA_3_8B, 1000)
    assert cost.operator(QKV).flops == 1_610_612_736_000
    assert cost.operator(OUT).flops == 1_073_741_824_000
    assert cost.operator(MLP).flops == 11_274_289_152_000
    assert cost.operator(ATTENTION).flops == 262_406_144_000
    assert cost.operator(ATTENTION).flops == pytest.approx(4 * 32 * 128 * 1000**2 * 32 / 1.998, rel=1e-3)
    assert cost.operator(LM_HEAD).flops == 1_050_673_152
    assert cost.flops == 14_222_100_529_152
    assert cost.bytes == 19_351_874_048
    assert (cost.phase, cost.tokens) == (PREFILL, 1000)


def test_lm_head_runs_on_the_last_prompt_position_of_each_sequence() -> None:
    """4 sequences x 100 prompt tokens: 4 sampled positions -> 4 x 2 x 128256 x 4096 = 4,202,692,608."""
    cost = prefill_cost(LLAMA_3_8B, 100, batch_size=4)
    assert cost.operator(LM_HEAD).flops == 4_202_692_608
    assert cost.operator(LM_HEAD).weight_bytes == 1_050_673_152  # the head's weights once per step


def test_prefix_cache_prefill_attends_the_cached_prefix() -> None:
    """100 new tokens after 900 cached: sum of positions 100 x 900 + 100 x 101 / 2 = 95,050;
    attention FLOPs 16,384 x 32 x 95,050 = 524,288 x 95,050 = 49,833,574,400; KV read (900 + 100) + written 100 tokens."""
    cost = prefill_cost(LLAMA_3_8B, 100, cached_tokens=900)
    assert cost.operator(ATTENTION).flops == 16_384 * 32 * 95_050 == 49_833_574_400
    assert cost.operator(ATTENTION).kv_bytes == 131_072 * (1000 + 100)
    assert cost.operator(MLP).flops == 100 * 2 * 176_160_768 * 32  # only the new tokens are multiplied


def test_mixtral_active_flops_per_token() -> None:
    """Per layer: qkv 25,165,824 + out 16,777,216 + 2 of 8 experts x 3 x 4096 x 14336 = 352,321,536
    + router 4096 x 8 = 32,768 = 394,297,344; x 32 = 12,617,515,008; + LM head 32000 x 4096 = 131,072,000
    -> 2 x 12,748,587,008 = 25,497,174,016 FLOPs per token (plus attention).
    Cross-check: active params 12,879,925,248 (catalog computed_active_params; card "12.9B") minus the
    131,072,000 embedding table and 266,240 norm weights, which are not multiplied, = 12,748,587,008."""
    cost = prefill_cost(MIXTRAL_8X7B, 1)
    matmul_flops = cost.flops - cost.operator(ATTENTION).flops
    assert matmul_flops == 25_497_174_016
    assert matmul_flops == 2 * (12_879_925_248 - 131_072_000 - 266_240)
    assert matmul_flops == pytest.approx(2 * 12.9e9, rel=0.02)
    assert cost.operator(MOE).flops == 2 * 352_321_536 * 32


@pytest.mark.parametrize(("tokens", "experts"), [
    (0, 0.0), (1, 2.0), (2, 3.5), (16, 7.919819234), (1000, 8.0),
])
def test_distinct_experts_mixtral(tokens: int, experts: float) -> None:
    """E=8, k=2: one token -> 2; two -> 8 x (1 - (3/4)^2) = 3.5; sixteen -> 8 x (1 - 0.75^16)
    = 8 x (1 - 0.0100226) = 7.91982; many -> all 8."""
    assert expected_distinct_experts(8, 2, tokens) == pytest.approx(experts, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize(("experts", "per_token", "tokens"), [(4, 1, 2), (4, 2, 2), (5, 2, 3), (6, 3, 2)])
def test_distinct_experts_matches_enumeration(experts: int, per_token: int, tokens: int) -> None:
    """Average |union| over every equally likely way T tokens can each pick k of E experts."""
    choices = list(itertools.combinations(range(experts), per_token))
    picks = list(itertools.product(choices, repeat=tokens))
    mean = sum(len(set().union(*pick)) for pick in picks) / len(picks)
    assert expected_distinct_experts(experts, per_token, tokens) == pytest.approx(mean, rel=1e-12)


def test_moe_weight_traffic_grows_with_the_batch() -> None:
    """One Mixtral expert is 3 x 4096 x 14336 = 176,160,768 weights x 2 B x 32 layers = 11,274,289,152 B.
    Decode batch 1 reads 2 experts per layer, batch 2 reads 3.5, batch 16 reads 7.91982 (not 8 x 2)."""
    expert_bytes = 11_274_289_152
    assert decode_cost(MIXTRAL_8X7B, 100, 1).operator(MOE).weight_bytes == 2 * expert_bytes
    assert decode_cost(MIXTRAL_8X7B, 100, 2).operator(MOE).weight_bytes == 3.5 * expert_bytes
    assert decode_cost(MIXTRAL_8X7B, 100, 16).operator(MOE).weight_bytes == pytest.approx(
        7.919819234 * expert_bytes, rel=1e-9)
    assert step_cost_model(MIXTRAL_8X7B).bytes_per_distinct_expert == expert_bytes


def test_deepseek_v3_mla_attention_and_kv() -> None:
    """DeepSeek-V3 config (app/data/models.json): 128 heads, kv_lora_rank 512, qk_rope 64, qk_nope 128,
    v_head 128, 61 layers.

    Prefill runs MLA expanded: q·k over d_nope + d_rope = 192, weighted sum over d_v = 128:
    2 x 128 x (192 + 128) = 81,920 FLOPs per attended position per layer (4·H·d with d=192 would say
    98,304). A 10,000-token prompt attends 10,000 x 10,001 / 2 = 50,005,000 positions per layer:
    81,920 x 50,005,000 x 61 = 249,880,985,600,000.
    Decode runs the absorbed form in the latent (DeepSeek-V2 section 2.1.3; SIZING.md section 4):
    q·k over kv_lora_rank + d_rope = 576, weighted sum over kv_lora_rank = 512:
    2 x 128 x (576 + 512) = 278,528 FLOPs per position per layer, 278,528 / 81,920 = 3.4x. 9,999 cached
    tokens: the new one attends 10,000: 278,528 x 10,000 x 61 = 169,902,080,000.
    KV caches the latent: (512 + 64) x 2 B = 1,152 B per layer, 70,272 B per token (SIZING.md), read
    10,000 + written 1 in both forms. Under TP8 heads split (16 per rank) but the latent is replicated:
    FLOPs / 8, KV unchanged; under attention DP a rank keeps all 128 heads."""
    prefill = prefill_cost(DEEPSEEK_V3, 10_000).operator(ATTENTION)
    assert prefill.flops == 249_880_985_600_000
    attention = decode_cost(DEEPSEEK_V3, 9999).operator(ATTENTION)
    assert attention.flops == 169_902_080_000
    assert attention.kv_bytes == 70_272 * 10_001
    sharded = decode_cost(DEEPSEEK_V3, 9999, tensor_parallel=8).operator(ATTENTION)
    assert sharded.flops == 169_902_080_000 / 8
    assert sharded.kv_bytes == 70_272 * 10_001
    # Attention DP8 (tp 1 per rank): each rank runs all 128 heads of its own sequences.
    rank = decode_cost(DEEPSEEK_V3, 9999, tensor_parallel=1, data_parallel=8, expert_parallel=8).operator(ATTENTION)
    assert rank.flops == 169_902_080_000
    # The absorbed up-projections (W_UK on q_nope, W_UV on the latent output) are kv_b_proj's weights
    # once per token, 512 x 128 x (128 + 128) = 8,388,608 per layer: the QKV matmul FLOPs of a decode
    # token and of a one-token prompt are the same.
    assert decode_cost(DEEPSEEK_V3, 0).operator(QKV).flops == prefill_cost(DEEPSEEK_V3, 1).operator(QKV).flops


def test_non_mla_decode_attention_is_not_absorbed() -> None:
    """Llama-3-8B: 4 x 32 x 128 = 16,384 FLOPs per position per layer in either phase. A decode token
    after 4 cached tokens attends 5; a 5-token prompt attends 1+2+3+4+5 = 15: 16,384 x 32 layers x
    5 = 2,621,440 and x 15 = 7,864,320."""
    assert decode_cost(LLAMA_3_8B, 4).operator(ATTENTION).flops == 2_621_440
    assert prefill_cost(LLAMA_3_8B, 5).operator(ATTENTION).flops == 7_864_320


def test_gqa_and_mqa_do_not_reduce_attention_flops() -> None:
    """Falcon-7B (71 heads of 64, ONE KV head): 4 x 71 x 64 = 18,176 FLOPs per position per layer, as
    for MHA, while its KV is 2 x 1 x 64 x 2 = 256 B per token per layer (MHA would be 18,176 B)."""
    attention = decode_cost(FALCON_7B, 999).operator(ATTENTION)
    assert attention.flops == 18_176 * 1000 * 32
    assert attention.kv_bytes == 256 * 32 * 1001


def test_gemma_2_window_layers_attend_at_most_the_window() -> None:
    """Gemma-2-9B: 21 sliding layers (window 4096), 21 global, 2 x 16 x (256 + 256) = 16,384 FLOPs per
    position per layer, 2 x 8 x 256 x 2 = 8,192 KV bytes per token per layer. Decode at 5,999 cached:
    global layers attend 6,000, sliding ones 4,096:
      FLOPs 16,384 x 21 x (6,000 + 4,096) = 3,473,670,144
      KV    8,192 x 21 x (6,000 + 4,096) read + 8,192 x 42 written = 1,737,179,136"""
    attention = decode_cost(GEMMA_2_9B, 5999).operator(ATTENTION)
    assert attention.flops == 3_473_670_144
    assert attention.kv_bytes == 1_737_179_136
    assert step_cost_model(GEMMA_2_9B).windows == (4096, None)


def test_window_prefill_positions() -> None:
    """6,000-token prompt, window 4,096: sum of min(i, 4096) = 4096 x 4097 / 2 + 1,904 x 4,096
    = 8,390,656 + 7,798,784 = 16,189,440 (global: 6000 x 6001 / 2 = 18,003,000).
    Ten tokens after 4,090 cached: positions 4,091..4,100 -> 4,091 + ... + 4,096 (= 24,561) + 4 x 4,096
    = 40,945. KV read after 5,000 cached: the 4,095 before the first new token + the 10 new ones."""
    assert attended_positions(0, 6000, 4096) == 16_189_440
    assert attended_positions(0, 6000, None) == 18_003_000
    assert attended_positions(4090, 10, 4096) == 40_945
    assert kv_tokens_read(5000, 10, 4096) == 4_105
    assert kv_tokens_read(5000, 10, None) == 5_010


@given(st.integers(0, 300), st.integers(0, 300), st.none() | st.integers(1, 200))
def test_attended_positions_and_kv_reads_match_enumeration(cached: int, new: int, window: int | None) -> None:
    """Token at position j attends positions max(1, j-w+1)..j; count them, and the union, one by one."""
    spans = [range(max(1, j - window + 1) if window else 1, j + 1) for j in range(cached + 1, cached + new + 1)]
    assert attended_positions(cached, new, window) == sum(len(span) for span in spans)
    assert kv_tokens_read(cached, new, window) == len(set().union(*spans))


def test_flash_attention_never_writes_the_score_matrix() -> None:
    """Llama-3-8B, one 1,000-token prompt, per layer: Q read 1,000 x 4,096 x 2 = 8,192,000; O written
    8,192,000; K/V written and read back 2 x 1,000 x 4,096 = 8,192,000 -> 24,576,000 x 32 = 786,432,000.
    Naive attention also writes and reads the 32 x 1,000² scores: 2 x 32,000,000 x 2 B = 128,000,000 per
    layer -> + 4,096,000,000 = 4,882,432,000 (6.2x). At 8,192 tokens: flash 201,326,592 x 32 =
    6,442,450,944; scores 2 x 32 x 8,192² x 2 x 32 = 274,877,906,944 -> naive 281,320,357,888 (43.7x)."""
    assert attention_traffic(LLAMA_3_8B, 1000) == (786_432_000, 4_882_432_000)
    assert attention_traffic(LLAMA_3_8B, 8192) == (6_442_450_944, 281_320_357_888)


def test_score_matrix_bytes_of_a_batch_after_a_cached_prefix() -> None:
    """Llama-3-8B, 4 sequences of 100 new tokens after 900 cached: each holds 100 x (900 + 100) = 100,000
    score entries per head; written and read back in bf16 over 32 heads and 32 layers:
    4 x 100,000 x 2 x 2 B x 32 x 32 = 1,638,400,000 B. At TP2 a GPU holds 16 heads: 819,200,000 B. Without a
    cache and batch 1, 1,000 tokens: 1,000² x 2 x 2 x 32 x 32 = 4,096,000,000 B, the gap in the test above."""
    assert score_matrix_bytes(LLAMA_3_8B, 100, 900, 4) == 1_638_400_000
    assert score_matrix_bytes(LLAMA_3_8B, 100, 900, 4, tensor_parallel=2) == 819_200_000
    assert score_matrix_bytes(LLAMA_3_8B, 1000) == 4_096_000_000


def test_tensor_parallel_splits_work_and_replicates_kv_heads() -> None:
    """Llama-3-70B decode: 80 layers of qkv 8192 x (64 + 16) x 128 = 83,886,080 weights.
    TP8: 8 query heads + 1 KV head per rank: 8192 x (8 + 2) x 128 = 10,485,760 (exactly 1/8);
    KV 2 x 1 x 128 x 2 x 80 = 40,960 B per token per GPU (SIZING.md).
    TP16: 4 query heads + the KV head replicated: 8192 x (4 + 2) x 128 = 6,291,456 (not 1/16);
    KV still 40,960 B per token."""
    tp8 = decode_cost(LLAMA_3_70B, 999, tensor_parallel=8)
    tp16 = decode_cost(LLAMA_3_70B, 999, tensor_parallel=16)
    assert tp8.operator(QKV).weight_bytes == 10_485_760 * 2 * 80
    assert tp16.operator(QKV).weight_bytes == 6_291_456 * 2 * 80
    assert tp8.operator(ATTENTION).kv_bytes == tp16.operator(ATTENTION).kv_bytes == 40_960 * 1001
    assert tp8.operator(MLP).flops == 2 * 3 * 8192 * 28672 * 80 / 8
    assert tp8.hidden_state_bytes_per_token == 8192 * 2


@settings(max_examples=80, deadline=None)
@given(random_models(), st.integers(1, 16), st.sampled_from(["bf16", "fp8", "int8"]))
def test_weights_read_per_step_match_the_weights_per_gpu(model: ModelSpec, tp: int, weight_dtype: str) -> None:
    """A step that touches every expert reads every weight on the GPU once, except the embedding table
    (a step gathers rows of it; with tied embeddings the LM head reads that same table)."""
    costs = step_cost_model(model, weight_dtype, tensor_parallel=tp)
    read = costs.weight_bytes_per_step + model.num_experts * costs.bytes_per_distinct_expert
    embedding_table = 0 if model.tie_word_embeddings else ceil_div(model.vocab_size, tp) * model.hidden_size * 2
    assert read + embedding_table == pytest.approx(weight_bytes_per_gpu(model, weight_dtype, tp), rel=1e-12)


@settings(max_examples=80, deadline=None)
@given(random_models(), st.integers(1, 8), st.integers(1, 8), st.integers(1, 64), st.integers(0, 300),
       st.booleans(), st.sampled_from(["bf16", "fp8"]))
def test_more_tensor_parallelism_never_increases_per_gpu_bytes_or_flops(
        model: ModelSpec, tp: int, more: int, tokens: int, context: int, prefill: bool, kv_dtype: str) -> None:
    def cost(degree: int):  # type: ignore[no-untyped-def]
        if prefill:
            return prefill_cost(model, tokens, context, kv_dtype=kv_dtype, tensor_parallel=degree)
        return decode_cost(model, context, tokens, kv_dtype=kv_dtype, tensor_parallel=degree)

    fewer, larger = cost(tp), cost(tp + more)
    assert larger.bytes <= fewer.bytes
    assert larger.flops <= fewer.flops
    assert larger.kv_bytes <= fewer.kv_bytes


@settings(max_examples=80, deadline=None)
@given(random_models(), st.integers(1, 200), st.integers(1, 200), st.integers(0, 200), st.booleans())
def test_chunked_prefill_costs_add_up_to_the_whole_prompt(model: ModelSpec, first: int, second: int,
                                                          cached: int, flash: bool) -> None:
    """Causal attention FLOPs and the matmuls of two chunks sum to one prefill of both (only the KV of
    the first chunk is read back once more, and the LM head runs once per chunk)."""
    whole = prefill_cost(model, first + second, cached, flash_attention=flash)
    chunks = (prefill_cost(model, first, cached, flash_attention=flash),
              prefill_cost(model, second, cached + first, flash_attention=flash))
    assert sum(chunk.operator(ATTENTION).flops for chunk in chunks) == pytest.approx(
        whole.operator(ATTENTION).flops, rel=1e-12)
    assert sum(chunk.operator(QKV).flops for chunk in chunks) == pytest.approx(whole.operator(QKV).flops,
                                                                               rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(random_models(), st.integers(0, 500), st.integers(1, 16))
def test_decode_is_a_one_token_prefill(model: ModelSpec, context: int, batch: int) -> None:
    """Except MLA's attention FLOPs: decode runs the absorbed form, per head and position
    2·(kv_lora_rank + d_rope) + 2·kv_lora_rank instead of 2·(d_nope + d_rope) + 2·d_v."""
    decode = decode_cost(model, context, batch)
    prefill = prefill_cost(model, 1, context, batch)
    if not model.is_mla:
        assert decode.operators == prefill.operators
        return
    assert [op for op in decode.operators if op.name != ATTENTION] == [
        op for op in prefill.operators if op.name != ATTENTION]
    absorbed = 2 * model.kv_lora_rank + model.qk_rope_head_dim  # type: ignore[operator]
    expanded = model.qk_nope_head_dim + model.qk_rope_head_dim + model.v_head_dim  # type: ignore[operator]
    assert decode.operator(ATTENTION).flops == pytest.approx(
        prefill.operator(ATTENTION).flops * absorbed / expanded, rel=1e-12)
    assert decode.operator(ATTENTION).bytes == prefill.operator(ATTENTION).bytes


@settings(max_examples=60, deadline=None)
@given(random_models(), st.integers(1, 64), st.integers(1, 64), st.integers(0, 3000), st.integers(0, 3000))
def test_decode_cost_grows_with_batch_and_context(model: ModelSpec, batch_a: int, batch_b: int,
                                                  context_a: int, context_b: int) -> None:
    (small, large), (short, long) = sorted((batch_a, batch_b)), sorted((context_a, context_b))
    base = decode_cost(model, short, small)
    for other in (decode_cost(model, short, large), decode_cost(model, long, small),
                  decode_cost(model, long, large)):
        assert other.flops >= base.flops
        assert other.bytes >= base.bytes


@pytest.mark.parametrize("model", ALL_MODELS, ids=lambda model: model.slug)
def test_every_catalog_model_has_positive_costs(model: ModelSpec) -> None:
    cost = decode_cost(model, 100, 4, weight_dtype="int4", kv_dtype="fp8", tensor_parallel=2)
    assert cost.flops > 0 and cost.weight_bytes > 0 and cost.kv_bytes > 0 and cost.activation_bytes > 0
    assert all(op.bytes >= 0 and op.flops >= 0 for op in cost.operators)


def test_invalid_steps_are_rejected() -> None:
    with pytest.raises(ValueError):
        prefill_cost(LLAMA_3_8B, 0)
    with pytest.raises(ValueError):
        decode_cost(LLAMA_3_8B, -1)
    with pytest.raises(ValueError):
        decode_cost(LLAMA_3_8B, 10, batch_size=0)
    with pytest.raises(ValueError):
        decode_cost(LLAMA_3_8B, 10, weight_dtype="fp64")
    with pytest.raises(ValueError):
        expected_distinct_experts(8, 9, 1)
    with pytest.raises(KeyError):
        decode_cost(LLAMA_3_8B, 10).operator(MOE)


# Kernel shapes: rows per touched expert, expert-parallel load --------------------------------------

def test_rows_per_touched_expert_mixtral() -> None:
    """Mixtral (E = 8, k = 2). T = 1: the token touches its 2 experts, 1 row each: 1 x 2 / 2 = 1.
    T = 64: 128 copies over 8·(1 − 0.75^64) experts; 0.75^64 = e^(64 x −0.2876821) = e^−18.41165 =
    1.0095e-8, so 8 x (1 − 1.0095e-8) = 7.99999992 experts and 128 / 7.99999992 = 16.0000002 rows (T·k/E
    = 16 at large T), not the 64 of the whole step. No tokens: no rows."""
    assert expected_rows_per_expert(8, 2, 1) == pytest.approx(1.0, rel=1e-12)
    assert expected_rows_per_expert(8, 2, 64) == pytest.approx(16.0000002, rel=1e-8)
    assert expected_rows_per_expert(8, 2, 0) == 0.0
    # With attention DP the exchange brings every rank's tokens: 8 ranks of 8 tokens are the 64 above.
    dp8 = step_cost_model(MIXTRAL_8X7B, tensor_parallel=1, data_parallel=8, expert_parallel=8)
    assert dp8.rows_per_expert(8) == pytest.approx(16.0000002, rel=1e-8)


def test_expected_max_of_standard_normals_matches_the_tables() -> None:
    """E[max of n standard normals]: 0 for n = 1; 1/√π = 0.5641896 for n = 2 (exact: E|Z1 − Z2|/2 =
    √2·√(2/π)/2); 1.02938 for 4 and 1.42360 for 8 (Tippett 1925, Biometrika 17; Harter 1961)."""
    assert expected_max_standard_normal(1) == pytest.approx(0.0, abs=1e-9)
    assert expected_max_standard_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-8)
    assert expected_max_standard_normal(4) == pytest.approx(1.02938, rel=1e-5)
    assert expected_max_standard_normal(8) == pytest.approx(1.42360, rel=1e-5)


def test_expert_load_factor_by_hand() -> None:
    """DeepSeek-V3 (E = 256, k = 8), 2 EP ranks, 32 tokens from all DP ranks: 256 copies, 128 per rank on
    average; max/mean = 1 + (1/√π) / √128 = 1 + 0.5641896 / 11.3137085 = 1.0498678.
    Capped where a rank takes all it can: Mixtral (E = 8, k = 2) on 8 EP ranks holds 1 expert per rank,
    so a token puts at most 1 of its 2 copies on one rank: max/mean <= 8 x 1 / 2 = 4; half a token
    (a mean micro-batch) would otherwise give 1 + 1.42360 / √(0.5 x 2 / 8) = 5.03.
    Large T tends to 1: 100,000 tokens x 8 / 8 ranks: 1 + 1.42360 / √100,000 = 1.0045018."""
    assert expected_expert_load_factor(256, 8, 32, 2) == pytest.approx(1.0498678, rel=1e-7)
    assert expected_expert_load_factor(8, 2, 0.5, 8) == 4.0
    assert expected_expert_load_factor(256, 8, 100_000, 8) == pytest.approx(1.0045018, rel=1e-6)
    assert expected_expert_load_factor(256, 8, 0, 8) == 1.0


@pytest.mark.parametrize(("tp", "dp"), [(8, 1), (1, 8), (2, 4)])
def test_one_expert_parallel_rank_has_no_imbalance(tp: int, dp: int) -> None:
    """EP = 1 (plain TP, or attention DP with tensor-split experts): factor exactly 1, routed tokens = tokens,
    and the routed FLOPs are k experts' per token as before: DeepSeek-V3 TP8 batch 64, 58 MoE layers of 8
    routed experts of 3 x 7168 x 2048 / 8 = 5,505,024 weights each per rank: 2 x 8 x 58 x 64 = 59,392, and
    5,505,024 x 59,392 = 330,301,440,000 − 5,505,024 x 608 (3,347,054,592) = 326,954,385,408 routed FLOPs per GPU (plus 1 shared expert of the same size on MOE's token rows)."""
    assert expected_expert_load_factor(256, 8, 5, 1) == 1.0
    costs = step_cost_model(DEEPSEEK_V3, tensor_parallel=tp, data_parallel=dp)
    assert costs.routed_tokens(64) == 64
    cost = decode_cost(DEEPSEEK_V3, 100, 64, tensor_parallel=tp, data_parallel=dp)
    assert cost.expert_load_factor == 1.0
    if tp == 8:
        assert cost.routed_expert_flops == 326_954_385_408
        assert cost.operator(MOE).flops == 326_954_385_408 * 9 / 8


def test_the_most_loaded_ep_rank_multiplies_more_rows() -> None:
    """DeepSeek-V3 DP2 + EP2 (tp 1): 16 sequences per rank decode, the exchange carries 32 tokens, the load
    factor is 1.0498678 (above). This GPU owns 128 whole experts; per own token it multiplies k·dp/ep = 8
    expert copies of 3 x 7168 x 2048 = 44,040,192 weights, 58 layers: 2 x 8 x 44,040,192 x 58 = 40,869,298,176
    FLOPs per token, x 16 tokens = 653,908,770,816, x 1.0498678 = 686.5178e9 routed FLOPs."""
    cost = decode_cost(DEEPSEEK_V3, 100, 16, tensor_parallel=1, data_parallel=2, expert_parallel=2)
    assert cost.expert_load_factor == pytest.approx(1.0498678, rel=1e-7)
    assert cost.routed_expert_flops == pytest.approx(40_869_298_176 * 16 * 1.0498678, rel=1e-7)
