"""Roofline: ridge points, ideal and expected step times, the decode knee batch.

Independent sources: the seed and SIZING.md section 5 (H100 SXM bf16 ridge ~295; an 8B model at batch 1
reads ~16 GB per token, ~4.8 ms, ~208 tok/s; batch 32 ~6,000+ tok/s), the GPU datasheet figures in
`gpus.csv` (dense peaks, HBM bandwidth), typed in below.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.sizing.hardware.efficiency import DEFAULT_EFFICIENCY
from app.sizing.hardware.roofline import (
    COMPUTE,
    MEMORY,
    default_compute_dtype,
    knee_batch_size,
    ridge_point,
    roofline,
)
from app.sizing.model.flops import decode_cost, prefill_cost
from app.sizing.specs import GpuSpec, ModelSpec
from tests.domain.models_for_tests import (
    ALL_MODELS,
    DEEPSEEK_V3,
    GEMMA_2_9B,
    LLAMA_3_8B,
    LLAMA_3_70B,
    MIXTRAL_8X7B,
    random_models,
)

# gpus.csv `h100-sxm`: 81,559 MiB reported, 3.35 TB/s, dense TFLOP/s fp32 67, tf32 494.5, bf16/fp16 989.5,
# fp8/int8 1979; NVLink 4 450 GB/s per direction; 8 per node.
H100_SXM = GpuSpec(
    name="NVIDIA H100 SXM5 80GB", slug="h100-sxm", memory_bytes=85_520_809_984,
    memory_bandwidth_bytes_per_s=3.35e12, interconnect_bandwidth_bytes_per_s=450e9,
    fp32_flops_per_s=67e12, tf32_flops_per_s=494.5e12, bf16_flops_per_s=989.5e12,
    fp16_flops_per_s=989.5e12, fp8_flops_per_s=1979e12, int8_ops_per_s=1979e12,
)
# gpus.csv `a100-80gb-sxm`: 80 GiB, 2.039 TB/s, bf16/fp16 312, tf32 156, int8 624, no fp8; NVLink 300 GB/s.
A100_80GB_SXM = GpuSpec(
    name="NVIDIA A100 80GB SXM4", slug="a100-80gb-sxm", memory_bytes=85_899_345_920,
    memory_bandwidth_bytes_per_s=2.039e12, interconnect_bandwidth_bytes_per_s=300e9,
    fp32_flops_per_s=19.5e12, tf32_flops_per_s=156e12, bf16_flops_per_s=312e12, fp16_flops_per_s=312e12,
    int8_ops_per_s=624e12,
)
# gpus.csv `v100-sxm2-32gb`: fp16 tensor cores only (no bf16), 0.9 TB/s.
V100_SXM2 = GpuSpec(
    name="NVIDIA V100 SXM2 32GB", slug="v100-sxm2-32gb", memory_bytes=34_359_738_368,
    memory_bandwidth_bytes_per_s=0.9e12, interconnect_bandwidth_bytes_per_s=150e9,
    fp32_flops_per_s=15.7e12, fp16_flops_per_s=125e12,
)
GPUS = (H100_SXM, A100_80GB_SXM, V100_SXM2)

# Llama-3-8B bf16 decode, per sequence and per step (worked out in test_flops.py):
LLAMA_8B_STEP_WEIGHT_BYTES = 15_009_849_344  # every weight but the embedding table, once per step
LLAMA_8B_FLOPS_PER_TOKEN = 15_009_316_864  # 2 x 6,979,321,856 decoder matmuls + 2 x 525,336,576 LM head
LLAMA_8B_BYTES_PER_SEQUENCE = 8_192 + 4_336_128  # its embedding row + its activations
LLAMA_8B_KV_BYTES_PER_TOKEN = 131_072  # 2 x 8 x 128 x 2 B x 32 layers
LLAMA_8B_ATTENTION_FLOPS_PER_POSITION = 524_288  # 4 x 32 heads x 128 x 32 layers


def test_ridge_point_h100_bf16_is_295() -> None:
    """989.5e12 / 3.35e12 = 295.37 FLOP/byte (SIZING.md: 989.4e12 / 3.35e12 = 295; the catalog rounds the
    computed 989.4 peak to the datasheet's 989.5); fp8 doubles it: 1979e12 / 3.35e12 = 590.7."""
    assert ridge_point(H100_SXM, "bf16") == pytest.approx(295.373, rel=1e-5)
    assert ridge_point(H100_SXM, "bf16") == pytest.approx(295, rel=0.002)
    assert ridge_point(H100_SXM, "fp8") == pytest.approx(590.746, rel=1e-5)
    assert ridge_point(A100_80GB_SXM, "bf16") == pytest.approx(312 / 2.039, rel=1e-12)  # 153.0


def test_ridge_point_needs_the_rate() -> None:
    with pytest.raises(ValueError, match="fp8"):
        ridge_point(A100_80GB_SXM, "fp8")


@pytest.mark.parametrize(("gpu", "weight_dtype", "expected"), [
    (H100_SXM, "bf16", "bf16"), (H100_SXM, "fp8", "fp8"), (H100_SXM, "int8", "int8"),
    (H100_SXM, "int4", "bf16"),  # int4 is weight-only (W4A16)
    (H100_SXM, "fp4", "bf16"),  # Hopper has no fp4 tensor rate
    (A100_80GB_SXM, "fp8", "bf16"),  # A100 FP8 checkpoints run weight-only
    (V100_SXM2, "bf16", "fp16"),  # no bf16 units
])
def test_default_compute_dtype(gpu: GpuSpec, weight_dtype: str, expected: str) -> None:
    assert default_compute_dtype(gpu, weight_dtype) == expected


def test_seed_8b_batch_1_decode_is_about_4_8_ms() -> None:
    """Llama-3-8B bf16, batch 1, 1,023 cached tokens, H100 SXM.

    bytes = 15,009,849,344 weights + 8,192 embedding row + 4,336,128 activations
            + 131,072 x (1,024 read + 1 written) KV = 15,148,542,464
    ideal = 15,148,542,464 / 3.35e12 = 4.5220 ms -> 221 tok/s.
    The seed's 16.06e9 B / 3.35e12 = 4.79 ms (~208 tok/s) is 2 bytes x all 8.03e9 parameters, which
    counts the 1.05 GB input-embedding table a decode step never reads (it gathers one row):
    16.06e9 - 1.0507e9 = 15.01e9. Our figure is within 6% of the seed's.
    """
    result = roofline(decode_cost(LLAMA_3_8B, 1023), H100_SXM, "bf16")
    assert result.bytes == 15_148_542_464
    assert result.ideal_time_s == pytest.approx(15_148_542_464 / 3.35e12, rel=1e-12)
    assert result.ideal_time_s == pytest.approx(16.06e9 / 3.35e12, rel=0.06)
    assert result.ideal_tokens_per_s == pytest.approx(221.1, rel=1e-3)
    assert result.bound == MEMORY
    assert result.arithmetic_intensity < 1.1  # ~1 FLOP/byte, far below the ridge (seed section 4)


def test_seed_batch_32_shares_the_weight_read() -> None:
    """Batch 32 at 511 cached tokens: bytes = 15,009,849,344 + 32 x (8,192 + 4,336,128 + 131,072 x 513)
    = 15,009,849,344 + 32 x 71,584,256 = 17,300,545,536 -> 5.1643 ms -> 32 / 5.1643 ms = 6,196 tok/s
    (seed: "~6,000+ tok/s aggregate"). FLOPs 32 x (15,009,316,864 + 524,288 x 512) = 488,888,074,240
    -> 0.494 ms at peak: still memory-bound."""
    result = roofline(decode_cost(LLAMA_3_8B, 511, batch_size=32), H100_SXM, "bf16")
    assert result.bytes == 17_300_545_536
    assert result.flops == 488_888_074_240
    assert result.ideal_time_s == pytest.approx(17_300_545_536 / 3.35e12, rel=1e-12)
    assert result.ideal_tokens_per_s >= 6_000
    assert result.compute_time_s == pytest.approx(488_888_074_240 / 989.5e12, rel=1e-12)
    assert result.bound == MEMORY


def test_prefill_is_compute_bound() -> None:
    """Llama-3-8B, 1,000-token prompt: 14,222,100,529,152 FLOPs over 19,351,874,048 bytes (test_flops.py)
    = 734.9 FLOP/byte > 295: ideal = 14,222,100,529,152 / 989.5e12 = 14.373 ms."""
    result = roofline(prefill_cost(LLAMA_3_8B, 1000), H100_SXM, "bf16")
    assert result.bound == COMPUTE
    assert result.arithmetic_intensity == pytest.approx(14_222_100_529_152 / 19_351_874_048, rel=1e-12)
    assert result.ideal_time_s == pytest.approx(14_222_100_529_152 / 989.5e12, rel=1e-12)


@pytest.mark.parametrize("model", ALL_MODELS, ids=lambda model: model.slug)
def test_decode_is_memory_bound_and_prefill_compute_bound(model: ModelSpec) -> None:
    assert roofline(decode_cost(model, 1000), H100_SXM, "bf16").bound == MEMORY
    assert roofline(prefill_cost(model, 16_384), H100_SXM, "bf16").bound == COMPUTE


def test_moe_prefill_stays_memory_bound_until_each_expert_sees_enough_tokens() -> None:
    """DeepSeek-V3, 2,000 prompt tokens: all 256 experts are touched but each multiplies only
    2,000 x 8 / 256 = 62.5 tokens, so the step reads ~1.34e12 B of bf16 weights (all 671e9 parameters
    but the embedding table) for ~1.5e14 FLOPs (2 x ~37e9 active x 2,000 + attention): ~111 FLOP/byte,
    below the 295 ridge."""
    result = roofline(prefill_cost(DEEPSEEK_V3, 2000), H100_SXM, "bf16")
    assert result.bound == MEMORY
    assert 100 < result.arithmetic_intensity < 130


def test_expected_decode_time_by_hand() -> None:
    """Llama-3-8B batch 1 at 1,023 cached tokens. Matmuls multiply one row, so they run at 0.33/64 of
    peak; attention at 0.6 of peak; bytes at 0.70 of 3.35e12 = 2.345e12 B/s. Per operator:
      qkv   max(1,610,612,736 / (989.5e12 x 0.33/64), 1,611,268,096 / 2.345e12) = 0.68711 ms (memory)
      attn  max(536,870,912 / (989.5e12 x 0.6), 134,873,088 / 2.345e12)        = 0.05752 ms (memory)
      out   1,074,266,112 / 2.345e12 = 0.45811 ms;  mlp 11,276,648,448 / 2.345e12 = 4.80880 ms
      lm    1,050,937,856 / 2.345e12 = 0.44816 ms;  norm 532,480 B, embedding 16,384 B
    sum 6.4600 ms + 0.3 ms + 32 x 3 us = 6.8559 ms."""
    fast_memory = 3.35e12 * 0.70
    expected = (1_611_268_096 / fast_memory + 134_873_088 / fast_memory + 1_074_266_112 / fast_memory
                + 11_276_648_448 / fast_memory + 1_050_937_856 / fast_memory + 532_480 / fast_memory
                + 16_384 / fast_memory + 0.3e-3 + 32 * 3e-6)
    result = roofline(decode_cost(LLAMA_3_8B, 1023), H100_SXM, "bf16")
    assert result.expected_time_s == pytest.approx(expected, rel=1e-12)
    assert result.expected_time_s == pytest.approx(6.8559e-3, rel=1e-4)
    assert result.overhead_time_s == pytest.approx(0.396e-3, rel=1e-12)
    assert result.comm_time_s == 0.0
    qkv = next(op for op in result.operators if op.name == "qkv")
    assert qkv.bound == MEMORY and qkv.ideal_time_s == pytest.approx(1_611_268_096 / 3.35e12, rel=1e-12)
    assert result.efficiency is DEFAULT_EFFICIENCY


def test_a_one_row_matmul_can_be_compute_slow() -> None:
    """A100, Llama-3-8B MLP at batch 1: 11,274,289,152 FLOPs at 312e12 x 0.33/64 = 1.6088e12 FLOP/s take
    7.008 ms, close to its weight read (11,276,648,448 B / (2.039e12 x 0.7) = 7.901 ms): the A100 GEMM
    sweep's small-M inefficiency is the memory bound in disguise. With fp8 weights (half the bytes,
    still computed in bf16 on A100: 3.951 ms to read) the FLOPs dominate."""
    bf16 = roofline(decode_cost(LLAMA_3_8B, 100), A100_80GB_SXM, "bf16")
    fp8 = roofline(decode_cost(LLAMA_3_8B, 100, weight_dtype="fp8"), A100_80GB_SXM, "bf16")
    mlp_bf16 = next(op for op in bf16.operators if op.name == "mlp")
    mlp_fp8 = next(op for op in fp8.operators if op.name == "mlp")
    assert mlp_bf16.expected_time_s == pytest.approx(11_276_648_448 / (2.039e12 * 0.7), rel=1e-12)
    assert mlp_fp8.expected_time_s == pytest.approx(11_274_289_152 / (312e12 * 0.33 / 64), rel=1e-12)


def test_fp8_weights_compute_at_fp8_but_attention_and_lm_head_at_bf16() -> None:
    """Llama-3-8B fp8 prefill of 1,000 tokens on H100: matmul FLOPs 13,958,643,712,000 at 1979e12, the
    attention's 262,406,144,000 and the LM head's 1,050,673,152 (16-bit operands) at 989.5e12."""
    result = roofline(prefill_cost(LLAMA_3_8B, 1000, weight_dtype="fp8"), H100_SXM, "fp8")
    assert result.compute_time_s == pytest.approx(
        13_958_643_712_000 / 1979e12 + (262_406_144_000 + 1_050_673_152) / 989.5e12, rel=1e-12)


def test_tensor_parallel_adds_two_allreduces_per_layer() -> None:
    """Llama-3-70B TP8 decode, batch 1: 160 all-reduces of 1 x 8192 x 2 = 16,384 B over NVLink 450e9:
    each 7.5e-6 x 15.0 / 7.8 (the two-GPU alpha over NCCL's 8-GPU ring, 14.4231e-6) + 2 x 7/8 x 16,384 /
    450e9 = 6.37e-8 s; 160 x 14.4868e-6 = 2.3179 ms. The latency term is 99% of it: why TP speeds decode
    up sub-linearly."""
    result = roofline(decode_cost(LLAMA_3_70B, 1000, tensor_parallel=8), H100_SXM, "bf16",
                      tensor_parallel=8, model=LLAMA_3_70B)
    assert result.comm_time_s == pytest.approx(160 * (7.5e-6 * 15.0 / 7.8 + 2 * 7 / 8 * 16_384 / 450e9), rel=1e-12)


def test_roofline_rejects_a_cost_for_another_deployment() -> None:
    cost = decode_cost(LLAMA_3_70B, 1000, tensor_parallel=8)
    with pytest.raises(ValueError, match="tensor_parallel"):
        roofline(cost, H100_SXM, "bf16", tensor_parallel=4)
    with pytest.raises(ValueError, match="layers"):
        roofline(cost, H100_SXM, "bf16", model=LLAMA_3_8B)


def test_knee_batch_llama_3_8b_h100_short_context_by_hand() -> None:
    """127 cached tokens (128 attended), bf16 on H100. Per sequence:
      FLOPs t = 15,009,316,864 + 524,288 x 128 = 15,076,425,728 -> as bytes at the ridge:
                t x 3.35e12 / 989.5e12 = 51,041,966.8
      bytes s = 8,192 + 4,336,128 + 131,072 x 129 = 21,252,608
    compute-bound when B x (51,041,966.8 - 21,252,608) >= 15,009,849,344
    -> B >= 15,009,849,344 / 29,789,358.8 = 503.87 -> B* = 504.
    """
    knee = knee_batch_size(LLAMA_3_8B, H100_SXM, 127, "bf16", "bf16", "bf16")
    assert knee == 504
    assert roofline(decode_cost(LLAMA_3_8B, 127, 504), H100_SXM, "bf16").bound == COMPUTE
    assert roofline(decode_cost(LLAMA_3_8B, 127, 503), H100_SXM, "bf16").bound == MEMORY


def test_knee_batch_is_none_at_long_context() -> None:
    """At 4,095 cached tokens a sequence brings 131,072 x 4,097 + 4,344,320 = 541,346,304 B of its own but
    only (15,009,316,864 + 524,288 x 4,096) x 3.35 / 989.5 = 58,085,176 B-equivalent of FLOPs: intensity
    saturates below the ridge, so no batch is compute-bound. (The crossover is ~357 cached tokens:
    solve 51.04e6 + 1,775 c = 4.34e6 + 131,072 c.)"""
    assert knee_batch_size(LLAMA_3_8B, H100_SXM, 4095, "bf16", "bf16", "bf16") is None
    assert knee_batch_size(LLAMA_3_8B, H100_SXM, 350, "bf16", "bf16", "bf16") is not None
    assert knee_batch_size(LLAMA_3_8B, H100_SXM, 365, "bf16", "bf16", "bf16") is None


@pytest.mark.parametrize(("model", "weight_dtype", "tp", "dp", "ep"), [
    (MIXTRAL_8X7B, "bf16", 1, 1, 1), (MIXTRAL_8X7B, "fp8", 2, 1, 1), (DEEPSEEK_V3, "fp8", 8, 1, 1),
    (GEMMA_2_9B, "bf16", 1, 1, 1), (LLAMA_3_70B, "fp8", 4, 1, 1),
    # Attention data parallelism: the batch is one rank's, dp·B tokens reach the experts, a GPU reads its 1/ep.
    (DEEPSEEK_V3, "fp8", 1, 8, 8), (DEEPSEEK_V3, "fp8", 8, 1, 8), (MIXTRAL_8X7B, "bf16", 1, 2, 2),
    (MIXTRAL_8X7B, "fp8", 2, 4, 8),
])
def test_knee_batch_is_where_the_roofline_turns_compute_bound(model: ModelSpec, weight_dtype: str,
                                                              tp: int, dp: int, ep: int) -> None:
    """MoE models read more distinct experts as the batch grows (E·(1-(1-k/E)^(dp·B))): the knee is found by
    bisection, and must agree with the roofline itself on both sides, under every layout."""
    compute_dtype = default_compute_dtype(H100_SXM, weight_dtype)
    knee = knee_batch_size(model, H100_SXM, 63, weight_dtype, "bf16", compute_dtype, tp, data_parallel=dp,
                           expert_parallel=ep)
    assert knee is not None

    def bound(batch: int) -> str:
        cost = decode_cost(model, 63, batch, weight_dtype=weight_dtype, tensor_parallel=tp, data_parallel=dp,
                           expert_parallel=ep)
        return roofline(cost, H100_SXM, compute_dtype).bound

    assert bound(knee) == COMPUTE
    assert knee == 1 or bound(knee - 1) == MEMORY


@pytest.mark.parametrize(("model", "tp", "dp", "ep"), [(DEEPSEEK_V3, 1, 8, 8), (MIXTRAL_8X7B, 1, 2, 2),
                                                   (MIXTRAL_8X7B, 2, 4, 8)])
def test_an_expert_parallel_knee_is_the_first_compute_bound_batch(model: ModelSpec, tp: int, dp: int,
                                                                  ep: int) -> None:
    """Under EP the most loaded rank's routed tokens are B x a load factor that falls with B, so the knee is
    searched rather than solved: every batch below it is memory-bound on the roofline itself (all of them
    checked, not only the neighbour), and a sequence of 32k tokens, whose KV reads outgrow its FLOPs, has none."""
    knee = knee_batch_size(model, H100_SXM, 63, "bf16", "bf16", "bf16", tp, data_parallel=dp, expert_parallel=ep)
    assert knee is not None

    def compute_bound(batch: int, context: int = 63) -> bool:
        result = roofline(decode_cost(model, context, batch, tensor_parallel=tp, data_parallel=dp,
                                      expert_parallel=ep), H100_SXM, "bf16")
        return result.compute_time_s >= result.memory_time_s

    assert compute_bound(knee)
    assert not any(compute_bound(batch) for batch in range(1, knee))
    assert knee_batch_size(model, H100_SXM, 32_768, "bf16", "bf16", "bf16", tp, data_parallel=dp,
                           expert_parallel=ep) is None
    assert not compute_bound(2**30, 32_768)


def test_moe_knee_is_later_than_if_only_active_experts_were_read() -> None:
    """Mixtral at batch B reads E·(1-(3/4)^B) experts, not 2: at the knee (hundreds of sequences) all 8,
    so its knee is ~4x that of a dense model of its active size (2 of 8 experts read)."""
    knee = knee_batch_size(MIXTRAL_8X7B, H100_SXM, 63, "bf16", "bf16", "bf16")
    assert knee is not None and knee > 2 * knee_batch_size(LLAMA_3_8B, H100_SXM, 63, "bf16", "bf16", "bf16")


@settings(max_examples=60, deadline=None)
@given(random_models(), st.sampled_from(GPUS), st.integers(1, 512), st.integers(0, 5000),
       st.sampled_from([1, 2, 4]), st.booleans())
def test_expected_is_never_below_ideal(model: ModelSpec, gpu: GpuSpec, batch: int, context: int, tp: int,
                                       prefill: bool) -> None:
    cost = (prefill_cost(model, batch, context, tensor_parallel=tp) if prefill
            else decode_cost(model, context, batch, tensor_parallel=tp))
    result = roofline(cost, gpu, default_compute_dtype(gpu, "bf16"))
    assert result.expected_time_s >= result.ideal_time_s
    for op in result.operators:
        assert op.expected_time_s >= op.ideal_time_s


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(ALL_MODELS), st.integers(1, 256), st.integers(1, 256), st.integers(0, 20_000),
       st.integers(0, 20_000), st.sampled_from([1, 2, 8]))
def test_decode_time_is_monotone_in_batch_and_context(model: ModelSpec, batch_a: int, batch_b: int,
                                                      context_a: int, context_b: int, tp: int) -> None:
    (small_batch, large_batch), (short, long) = sorted((batch_a, batch_b)), sorted((context_a, context_b))

    def times(batch: int, context: int) -> tuple[float, float]:
        result = roofline(decode_cost(model, context, batch, tensor_parallel=tp), H100_SXM, "bf16")
        return result.ideal_time_s, result.expected_time_s

    base = times(small_batch, short)
    for ideal, expected in (times(large_batch, short), times(small_batch, long), times(large_batch, long)):
        assert ideal >= base[0] * (1 - 1e-12)
        assert expected >= base[1] * (1 - 1e-12)


def test_an_integer_batch_gets_each_operators_own_compute_fraction() -> None:
    """`compute_fractions` times an integer batch's two row counts in one numpy call (as a float batch's): each
    matmul must still get `Efficiency.compute_fraction` of its own rows (tokens, or sampled sequences), and
    attention its fixed fraction, exactly as one call per value gives them."""
    from app.sizing.hardware.roofline import compute_fractions
    from app.sizing.model.flops import ATTENTION, MATMUL_ROWS, SAMPLED, TOKENS

    names = [operator.name for operator in decode_cost(LLAMA_3_8B, 1024, 64).operators]
    tokens, sampled = 3 * 64, 64  # e.g. three speculative tokens per sequence: the two row counts differ
    by_rows = {TOKENS: DEFAULT_EFFICIENCY.compute_fraction(tokens),
               SAMPLED: DEFAULT_EFFICIENCY.compute_fraction(sampled),
               None: DEFAULT_EFFICIENCY.attention_compute_fraction}
    assert by_rows[TOKENS] != by_rows[SAMPLED]
    expected = [by_rows[MATMUL_ROWS[name]] for name in names]
    assert compute_fractions(names, tokens, sampled, DEFAULT_EFFICIENCY) == expected
    assert ATTENTION in names
