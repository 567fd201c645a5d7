"""KV-cache bytes, worked by hand and checked against the seed and SIZING.md section 3.

Formula (seed section 3): bytes = 2 * layers * kv_heads * head_dim * tokens * bytes_per_element,
with MLA caching one latent of (kv_lora_rank + qk_rope_head_dim) per token per layer instead.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.sizing.model.kv import (
    kv_breakpoints,
    kv_bytes_per_token_full,
    kv_bytes_per_token_per_layer,
    kv_cache_bytes_for_batch,
    kv_cache_size,
    kv_curve,
    layer_mix,
    mha_equivalent_bytes_per_sequence,
)
from app.sizing.specs import ModelSpec
from tests.domain.models_for_tests import (
    DEEPSEEK_V3,
    FALCON_7B,
    GEMMA_2_9B,
    GPT_OSS_120B,
    LLAMA_2_7B,
    LLAMA_3_1_405B,
    LLAMA_3_8B,
    LLAMA_3_70B,
    MIXTRAL_8X7B,
    QWEN2_5_0_5B,
    random_models,
)

GIB = 2**30


def per_token(model: ModelSpec, kv_dtype: str = "bf16", tp: int = 1, pp: int = 1) -> int:
    """Bytes per cached token of a model without windows: the size of a 1-token sequence."""
    return kv_cache_size(model, 1, kv_dtype, tp, pp).bytes_per_sequence_per_gpu


def test_llama_3_70b_seed_numbers() -> None:
    """Seed: 2 * 80 layers * 8 KV heads * 128 * 2 bytes = 327,680 B/token (320 KiB).
    8k context: 327,680 * 8192 = 2,684,354,560 B (2.68e9); batch 32 at 8k: * 32 = 85,899,345,920
    (85.9e9 B, more than one 80 GB GPU).
    """
    assert kv_bytes_per_token_per_layer(LLAMA_3_70B, 0, "bf16") == 2 * 8 * 128 * 2 == 4096
    size = kv_cache_size(LLAMA_3_70B, 8192, "bf16")
    assert size.bytes_per_sequence == 2_684_354_560
    assert size.bytes_per_sequence_per_gpu == 2_684_354_560
    assert kv_cache_bytes_for_batch(LLAMA_3_70B, [8192] * 32, "bf16") == 85_899_345_920
    assert kv_curve(LLAMA_3_70B, "bf16", [1, 8192]) == [(1, 327_680), (8192, 2_684_354_560)]


def test_seed_worked_example_per_sequence() -> None:
    """Seed section 11: ~1k prompt + ~500 answer = 1.5k tokens * 320 KB ~ 0.48-0.49 GB per sequence.
    1500 * 327,680 = 491,520,000 B.
    """
    assert kv_cache_size(LLAMA_3_70B, 1500, "bf16").bytes_per_sequence == 491_520_000


@pytest.mark.parametrize(("model", "expected"), [
    (LLAMA_3_8B, 131_072),      # 2 * 32 * 8 * 128 * 2
    (MIXTRAL_8X7B, 131_072),    # 2 * 32 * 8 * 128 * 2 (same attention as Llama-3-8B)
    (QWEN2_5_0_5B, 12_288),     # 2 * 24 * 2 * 64 * 2
    (FALCON_7B, 8_192),         # MQA: 2 * 32 * 1 * 64 * 2
    (LLAMA_2_7B, 524_288),      # MHA: 2 * 32 * 32 * 128 * 2 (catalog: 512 KiB, more than Llama-3-70B)
    (LLAMA_3_1_405B, 516_096),  # 2 * 126 * 8 * 128 * 2
    (DEEPSEEK_V3, 70_272),      # MLA: 61 * (512 + 64) * 2
])
def test_bytes_per_token(model: ModelSpec, expected: int) -> None:
    assert per_token(model) == expected


def test_fp8_kv_halves_every_model() -> None:
    """fp8/int8 store 1 byte per value: Llama-3-70B 327,680 / 2 = 163,840; DeepSeek 70,272 / 2 = 35,136."""
    assert per_token(LLAMA_3_70B, "fp8") == 163_840
    assert per_token(LLAMA_3_70B, "int8") == 163_840
    assert per_token(DEEPSEEK_V3, "fp8") == 35_136


def test_tensor_parallel_replicates_kv_heads_beyond_their_count() -> None:
    """Llama-3-70B: TP8 -> 1 KV head per GPU: 2 * 80 * 1 * 128 * 2 = 40,960 B/token/GPU.
    TP16 cannot split 8 heads further: still 1 head per GPU, still 40,960.
    """
    assert per_token(LLAMA_3_70B, tp=8) == 40_960
    assert per_token(LLAMA_3_70B, tp=16) == 40_960
    assert kv_bytes_per_token_per_layer(LLAMA_3_70B, 79, "bf16", tensor_parallel=16) == 512
    assert per_token(LLAMA_3_70B, tp=2) == 327_680 // 2
    assert per_token(FALCON_7B, tp=4) == 8_192  # its single KV head is on every GPU
    # An uneven split puts ceil(8/3) = 3 heads on the busiest GPU: 2 * 80 * 3 * 128 * 2 = 122,880.
    assert per_token(LLAMA_3_70B, tp=3) == 122_880


def test_mla_latent_is_not_divided_by_tensor_parallel() -> None:
    """DeepSeek-V3 at TP8 keeps the whole 576-value latent per layer on every GPU: 70,272 B/token.
    10,000 tokens: 702,720,000 B = 702,720,000 / 2^30 = 0.65446 GiB.
    """
    size = kv_cache_size(DEEPSEEK_V3, 10_000, "bf16", tensor_parallel=8)
    assert size.bytes_per_sequence == size.bytes_per_sequence_per_gpu == 702_720_000
    assert size.bytes_per_sequence / GIB == pytest.approx(0.65446, abs=5e-6)
    assert [(g.kind, g.window, g.layers) for g in size.groups] == [("mla", None, 61)]


def test_gemma_2_window_layers_short_context() -> None:
    """Gemma-2-9B: 2 * 8 KV heads * 256 * 2 bytes = 8,192 B per token per layer, 42 layers.
    At 2k both kinds hold all 2048 tokens: 42 * 8,192 * 2048 = 704,643,072 B.
    """
    size = kv_cache_size(GEMMA_2_9B, 2048, "bf16")
    assert size.bytes_per_sequence == 704_643_072
    assert [(g.kind, g.window, g.layers, g.tokens_cached) for g in size.groups] == [
        ("sliding_attention", 4096, 21, 2048), ("full_attention", None, 21, 2048)]


def test_gemma_2_window_layers_long_context() -> None:
    """At 16k the 21 global layers hold 16384 tokens, the 21 window layers 4096:
    21 * 8,192 * 16384 = 2,818,572,288 + 21 * 8,192 * 4096 = 704,643,072 -> 3,523,215,360 B.
    Catalog note: elems(T) = 2*8*256*(21*T + 21*min(T,4096)), times 2 bytes: the same.
    """
    size = kv_cache_size(GEMMA_2_9B, 16384, "bf16")
    assert size.bytes_per_sequence == 3_523_215_360
    assert size.tokens_cached_max == 16384
    assert {g.kind: g.bytes for g in size.groups} == {
        "sliding_attention": 704_643_072, "full_attention": 2_818_572_288}
    # The slope past 4096 is the global layers only: 21 * 8,192 = 172,032 B/token.
    assert kv_bytes_per_token_full(GEMMA_2_9B, "bf16") == 172_032
    assert kv_breakpoints(GEMMA_2_9B) == (4096,)


def test_gpt_oss_sliding_128_and_full() -> None:
    """gpt-oss-120b: 2 * 8 * 64 * 2 = 2,048 B per token per layer; 18 sliding (128) + 18 full.
    At 8192: 18 * 2,048 * 8192 = 301,989,888 + 18 * 2,048 * 128 = 4,718,592 -> 306,708,480 B.
    At 100 (inside the window): 36 * 2,048 * 100 = 7,372,800 B.
    """
    assert kv_cache_size(GPT_OSS_120B, 8192, "bf16").bytes_per_sequence == 306_708_480
    assert kv_cache_size(GPT_OSS_120B, 100, "bf16").bytes_per_sequence == 7_372_800
    assert kv_bytes_per_token_full(GPT_OSS_120B, "bf16") == 18 * 2_048 == 36_864
    assert kv_breakpoints(GPT_OSS_120B) == (128,)


def test_models_without_windows_have_no_breakpoints() -> None:
    assert kv_breakpoints(LLAMA_3_70B) == ()
    assert kv_breakpoints(DEEPSEEK_V3) == ()
    assert kv_bytes_per_token_full(LLAMA_3_70B, "bf16") == 327_680


def test_block_rounding_of_global_layers() -> None:
    """1000 tokens in blocks of 16: ceil(1000/16) = 63 blocks = 1008 tokens.
    Llama-3-8B: 131,072 * 1008 = 132,120,576 B. TensorRT-LLM blocks of 32: 32 blocks = 1024 tokens.
    """
    size = kv_cache_size(LLAMA_3_8B, 1000, "bf16", block_size=16)
    assert size.rounded_context_tokens == 1008
    assert size.bytes_per_sequence == 132_120_576
    assert kv_cache_size(LLAMA_3_8B, 1000, "bf16", block_size=32).rounded_context_tokens == 1024
    assert kv_cache_size(LLAMA_3_8B, 1024, "bf16", block_size=16).rounded_context_tokens == 1024


def test_block_rounding_of_window_layers() -> None:
    """gpt-oss, 1000 tokens, blocks of 16. Global layers: 1008 tokens. A 128-token window that does
    not start on a block boundary straddles ceil(127/16) + 1 = 9 blocks = 144 tokens.
    18 * 2,048 * 1008 = 37,158,912 + 18 * 2,048 * 144 = 5,308,416 -> 42,467,328 B.
    Inside the window (100 tokens) the window layers hold ceil(100/16) = 7 blocks = 112 tokens, as
    the global ones do: 36 * 2,048 * 112 = 8,257,536 B.
    """
    size = kv_cache_size(GPT_OSS_120B, 1000, "bf16", block_size=16)
    assert {g.kind: g.tokens_cached for g in size.groups} == {
        "sliding_attention": 144, "full_attention": 1008}
    assert size.bytes_per_sequence == 42_467_328
    assert kv_cache_size(GPT_OSS_120B, 100, "bf16", block_size=16).bytes_per_sequence == 8_257_536


def test_pipeline_stage_holds_only_its_layers() -> None:
    """Llama-3-70B TP8 x PP4: 20 layers per stage * 1 KV head * 2 * 128 * 2 = 20 * 512 = 10,240 B/token.
    Llama-3.1-405B PP4 splits 31/32/32/31: the busiest stage has 32 * 4,096 = 131,072 B/token.
    """
    assert per_token(LLAMA_3_70B, tp=8, pp=4) == 10_240
    assert per_token(LLAMA_3_1_405B, pp=4) == 131_072
    assert kv_bytes_per_token_full(LLAMA_3_1_405B, "bf16", 8, 4) == 32 * 512


def test_pipeline_stage_with_windows_picks_the_busiest_stage() -> None:
    """Gemma-2-9B PP4 splits 42 layers 10/11/11/10. Stage 1 (layers 10-20) has 6 sliding + 5 global,
    stage 2 (layers 21-31) 5 sliding + 6 global, so at 16k stage 2 is busiest:
    (6 * 16384 + 5 * 4096) * 8,192 = 118,784 * 8,192 = 973,078,528 B.
    At 2k every layer holds 2048 tokens; stages 1 and 2 tie: 11 * 2048 * 8,192 = 184,549,376 B.
    """
    assert kv_cache_size(GEMMA_2_9B, 16384, "bf16", pipeline_parallel=4).bytes_per_sequence_per_gpu == (
        973_078_528)
    assert kv_cache_size(GEMMA_2_9B, 2048, "bf16", pipeline_parallel=4).bytes_per_sequence_per_gpu == (
        184_549_376)
    assert kv_bytes_per_token_full(GEMMA_2_9B, "bf16", pipeline_parallel=4) == 6 * 8_192


def test_mha_equivalent_shows_what_gqa_and_mla_save() -> None:
    """Llama-3-70B with 64 KV heads: 2 * 80 * 64 * 128 * 2 = 2,621,440 B/token; at 8192 tokens
    21,474,836,480 B, 8x the GQA 2,684,354,560.
    DeepSeek-V3 with per-head keys of 128+64 and values of 128: 61 * 128 * 320 * 2 = 4,997,120 B/token
    (catalog: "4.997 MB/token, about 71x" the 70,272 latent).
    """
    assert mha_equivalent_bytes_per_sequence(LLAMA_3_70B, 8192, "bf16") == 21_474_836_480
    assert mha_equivalent_bytes_per_sequence(DEEPSEEK_V3, 1, "bf16") == 4_997_120
    assert mha_equivalent_bytes_per_sequence(LLAMA_2_7B, 4096, "bf16") == (
        kv_cache_size(LLAMA_2_7B, 4096, "bf16").bytes_per_sequence)  # already MHA
    # Windows are kept: gpt-oss 64 heads * 2 * 64 * 2 = 16,384 B per layer per token;
    # at 8192: 18 * 16,384 * 8192 + 18 * 16,384 * 128 = 2,415,919,104 + 37,748,736 = 2,453,667,840.
    assert mha_equivalent_bytes_per_sequence(GPT_OSS_120B, 8192, "bf16") == 2_453_667_840


def test_batch_of_mixed_lengths() -> None:
    """Llama-3-8B, sequences of 1000 and 3000 tokens: 131,072 * 4000 = 524,288,000 B."""
    assert kv_cache_bytes_for_batch(LLAMA_3_8B, [1000, 3000], "bf16") == 524_288_000
    assert kv_cache_bytes_for_batch(LLAMA_3_8B, [], "bf16") == 0


def test_invalid_inputs_are_rejected() -> None:
    with pytest.raises(ValueError):
        kv_cache_size(LLAMA_3_8B, -1, "bf16")
    with pytest.raises(ValueError):
        kv_cache_size(LLAMA_3_8B, 10, "int4")  # not a KV format
    with pytest.raises(ValueError):
        kv_cache_size(LLAMA_3_8B, 10, "bf16", block_size=0)
    with pytest.raises(ValueError):
        kv_cache_size(LLAMA_3_8B, 10, "bf16", tensor_parallel=0)
    with pytest.raises(ValueError):
        kv_cache_size(LLAMA_3_8B, 10, "bf16", pipeline_parallel=33)
    with pytest.raises(ValueError):
        kv_bytes_per_token_per_layer(LLAMA_3_8B, 32, "bf16")


# Properties ----------------------------------------------------------------------------------------

block_sizes = st.none() | st.sampled_from([1, 16, 32])
kv_dtypes = st.sampled_from(["bf16", "fp8"])


@given(random_models(), st.integers(0, 300), st.integers(0, 300), kv_dtypes, block_sizes, st.integers(1, 4))
def test_kv_never_shrinks_as_context_grows(model: ModelSpec, a: int, b: int, dtype: str,
                                           block: int | None, pp: int) -> None:
    short, long = sorted((a, b))
    pp = min(pp, model.num_hidden_layers)
    small, large = (kv_cache_size(model, c, dtype, 1, pp, block) for c in (short, long))
    assert small.bytes_per_sequence <= large.bytes_per_sequence
    assert small.bytes_per_sequence_per_gpu <= large.bytes_per_sequence_per_gpu


@given(random_models(), st.lists(st.integers(0, 300), max_size=6), st.integers(0, 300), kv_dtypes,
       block_sizes)
def test_kv_never_shrinks_as_batch_grows(model: ModelSpec, lengths: list[int], extra: int, dtype: str,
                                         block: int | None) -> None:
    before = kv_cache_bytes_for_batch(model, lengths, dtype, block_size=block)
    assert kv_cache_bytes_for_batch(model, [*lengths, extra], dtype, block_size=block) >= before
    assert before == sum(kv_cache_size(model, c, dtype, block_size=block).bytes_per_sequence
                         for c in lengths)


@given(random_models(), st.integers(0, 300), st.integers(1, 16), kv_dtypes)
def test_more_tensor_parallel_never_adds_kv_per_gpu(model: ModelSpec, context: int, tp: int,
                                                    dtype: str) -> None:
    fewer = kv_cache_size(model, context, dtype, tp).bytes_per_sequence_per_gpu
    assert kv_cache_size(model, context, dtype, tp + 1).bytes_per_sequence_per_gpu <= fewer


@given(random_models(), st.integers(0, 300), st.integers(1, 16), kv_dtypes)
def test_tensor_parallel_ranks_together_hold_the_whole_cache(model: ModelSpec, context: int, tp: int,
                                                             dtype: str) -> None:
    size = kv_cache_size(model, context, dtype, tp)
    assert tp * size.bytes_per_sequence_per_gpu >= size.bytes_per_sequence


@given(random_models(), st.integers(0, 300), st.integers(1, 8), st.integers(1, 4), block_sizes)
def test_per_gpu_kv_within_the_sequence_when_heads_split(model: ModelSpec, context: int, tp: int,
                                                         pp: int, block: int | None) -> None:
    tp = min(tp, model.num_key_value_heads)
    pp = min(pp, model.num_hidden_layers)
    size = kv_cache_size(model, context, "bf16", tp, pp, block)
    assert size.bytes_per_sequence_per_gpu <= size.bytes_per_sequence
    assert size.bytes_per_sequence == sum(group.bytes for group in size.groups)
    assert sum(group.layers for group in size.groups) == model.num_hidden_layers


@given(random_models(), st.integers(0, 200))
def test_slope_beyond_every_window_is_the_full_layers(model: ModelSpec, beyond: int) -> None:
    """Past the largest window only unbounded layers grow: one more token adds exactly their bytes."""
    context = max(kv_breakpoints(model), default=0) + beyond
    grow = (kv_cache_size(model, context + 1, "bf16").bytes_per_sequence
            - kv_cache_size(model, context, "bf16").bytes_per_sequence)
    assert grow == kv_bytes_per_token_full(model, "bf16")


def test_the_layer_mix_a_scheduler_counts_window_layers_apart_with() -> None:
    """gpt-oss-120b: 36 layers alternating a 128-token window and full attention, 18 each. With blocks of
    16 a window's live tokens straddle ceil(127 / 16) + 1 = 9 blocks = 144 slots; with blocks of 32,
    ceil(127 / 32) + 1 = 5 = 160. Two pipeline stages of 18 layers hold 9 of each. Gemma-2-9B (42 layers,
    4,096-token windows): 21 and 21, 4,096 + 16 = 4,112 slots. Llama-3-8B (all full): nothing apart."""
    assert layer_mix(GPT_OSS_120B, 16) == (18, ((18, 144),))
    assert layer_mix(GPT_OSS_120B, 32, 2) == (9, ((9, 160),))
    assert layer_mix(GEMMA_2_9B, 16) == (21, ((21, 4112),))
    assert layer_mix(LLAMA_3_8B, 16) == (0, ())
