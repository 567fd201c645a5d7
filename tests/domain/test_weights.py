"""Weight bytes per precision and per GPU, worked by hand.

Policy under test (`WEIGHT_QUANTIZATION_SCOPE`): the weight dtype covers the decoder layers' linear
matrices; embedding, LM head, norms, routers and biases stay bf16 (2 bytes).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.sizing.model.params import SPLIT_FIRST, param_counts
from app.sizing.model.weights import (
    WEIGHT_QUANTIZATION_SCOPE,
    weight_bytes,
    weight_bytes_per_gpu,
    weight_bytes_per_stage,
)
from app.sizing.specs import ModelSpec
from tests.domain.models_for_tests import (
    DEEPSEEK_V3,
    FALCON_7B,
    GEMMA_2_9B,
    LLAMA_3_1_405B,
    LLAMA_3_8B,
    LLAMA_3_70B,
    MIXTRAL_8X7B,
    QWEN2_5_72B,
    random_models,
)

# Llama-3-70B split by precision (see test_params for the per-layer arithmetic):
# linear matrices 80 * (67,108,864 + 16,777,216 + 67,108,864 + 704,643,072) = 80 * 855,638,016
LLAMA_3_70B_LINEAR = 68_451_041_280
# bf16 parts: embedding + head 2*128256*8192 = 2,101,346,304; norms 80*16,384 + 8,192 = 1,318,912
LLAMA_3_70B_BF16_PARAMS = 2_102_665_216


def test_bf16_is_two_bytes_per_parameter() -> None:
    """Seed / SIZING §5: an 8B model reads ~16 GB per decode step: 8,030,261,248 * 2 = 16,060,522,496."""
    assert weight_bytes(LLAMA_3_8B, "bf16") == 16_060_522_496
    assert weight_bytes(LLAMA_3_8B, "fp16") == 16_060_522_496
    # Seed section 11: "70B params. FP16 = 140 GB": 70,553,706,496 * 2 = 141,107,412,992.
    assert weight_bytes(LLAMA_3_70B, "bf16") == 141_107_412_992


def test_fp8_and_int8_quantize_only_the_linear_matrices() -> None:
    """68,451,041,280 * 1 + 2,102,665,216 * 2 = 68,451,041,280 + 4,205,330,432 = 72,656,371,712.

    Seed section 11: "INT8 weights ~ 70 GB".
    """
    assert LLAMA_3_70B_LINEAR + LLAMA_3_70B_BF16_PARAMS == param_counts(LLAMA_3_70B).total
    assert weight_bytes(LLAMA_3_70B, "fp8") == 72_656_371_712
    assert weight_bytes(LLAMA_3_70B, "int8") == 72_656_371_712


def test_biases_stay_bf16() -> None:
    """Qwen2.5-72B fp8. Linear: 80 * (67,108,864 + 16,777,216 + 67,108,864 + 726,663,168)
    = 80 * 877,658,112 = 70,212,648,960 params at 1 byte.
    bf16: embedding + head 2,491,416,576 + norms 80*16,384 + 8,192 = 1,318,912
          + QKV biases 80 * (8,192 + 2,048) = 819,200 -> 2,493,554,688 params = 4,987,109,376 bytes.
    total 75,199,758,336 bytes.
    """
    assert weight_bytes(QWEN2_5_72B, "fp8") == 75_199_758_336


def test_int4_counts_its_group_scales() -> None:
    """int4 + one fp16 scale per 128 weights = 4.125 bits:
    68,451,041,280 * 4.125 / 8 = 35,295,068,160; + 4,205,330,432 bf16 = 39,500,398,592.
    """
    assert weight_bytes(LLAMA_3_70B, "int4") == 39_500_398_592


def test_fp4_counts_its_shared_exponents() -> None:
    """MXFP4: 4 bits + one 8-bit exponent per 32 values = 4.25 bits:
    68,451,041,280 * 4.25 / 8 = 36,364,615,680; + 4,205,330,432 = 40,569,946,112.
    """
    assert weight_bytes(LLAMA_3_70B, "fp4") == 40_569_946_112


def test_fractional_bytes_round_up() -> None:
    """A toy layer: h=8, 2 heads of 4, 2 KV heads, F=4 gated, V=3, untied, one layer.

    linear: Q 64 + K/V 128 + O 64 + MLP 3*8*4 = 96 -> 352 params; 352 * 4.125 / 8 = 181.5 -> 182 bytes
    bf16: embedding 24 + head 24 + norms 16 + final norm 8 = 72 params -> 144 bytes; total 326.
    """
    toy = ModelSpec(num_hidden_layers=1, hidden_size=8, num_attention_heads=2, num_key_value_heads=2,
                    vocab_size=3, intermediate_size=4)
    assert weight_bytes(toy, "int4") == 326


def test_uneven_splits_round_up_per_rank() -> None:
    """The toy layer above (2 heads, 2 KV heads, F=4, V=3) in bf16.
    TP2: Q 1 head 8*4 = 32; K/V 1 head 2*8*4 = 64; O 32; MLP 3*8*ceil(4/2) = 48; norms 16 -> 192;
         vocabulary ceil(3/2) = 2 rows * 8 * 2 (embedding, head) = 32; final norm 8 -> 232 -> 464 bytes.
    TP3: heads ceil(2/3) = 1 each: 32 + 64 + 32; MLP 3*8*ceil(4/3) = 48; norms 16 -> 192;
         vocabulary 1 row * 8 * 2 = 16; final norm 8 -> 216 -> 432 bytes.
    """
    toy = ModelSpec(num_hidden_layers=1, hidden_size=8, num_attention_heads=2, num_key_value_heads=2,
                    vocab_size=3, intermediate_size=4)
    assert weight_bytes_per_gpu(toy, "bf16", tensor_parallel=2) == 464
    assert weight_bytes_per_gpu(toy, "bf16", tensor_parallel=3) == 432


def test_tensor_parallel_shards_by_heads_and_vocabulary() -> None:
    """Llama-3-70B bf16 at TP8, one GPU:
    per layer: Q 8 heads 8192*128*8 = 8,388,608; K/V 1 head 2*8192*128 = 2,097,152; O 8,388,608;
               MLP 704,643,072/8 = 88,080,384; norms 16,384 (replicated) -> 106,971,136
    80 layers = 8,557,690,880; embedding + head ceil(128256/8) = 16032 rows * 8192 * 2 = 262,668,288;
    final norm 8,192 -> 8,820,367,360 params -> 17,640,734,720 bytes (~ 141.1e9 / 8).
    """
    assert weight_bytes_per_gpu(LLAMA_3_70B, "bf16", tensor_parallel=8) == 17_640_734_720


def test_tensor_parallel_beyond_kv_heads_replicates_kv_projections() -> None:
    """TP16: Q 4 heads 4,194,304; K/V still 1 whole head 2,097,152; O 4,194,304; MLP 44,040,192;
    norms 16,384 -> 54,542,336 per layer; 80 layers = 4,363,386,880; vocabulary 8016 rows * 8192 * 2
    = 131,334,144; final norm 8,192 -> 4,494,729,216 params -> 8,989,458,432 bytes (> 141.1e9/16).
    """
    assert weight_bytes_per_gpu(LLAMA_3_70B, "bf16", tensor_parallel=16) == 8_989_458_432


def test_uneven_head_split_counts_the_busiest_rank() -> None:
    """Falcon-7B bf16 at TP2: 71 query heads -> ceil(71/2) = 36 on the busiest rank; the one KV head
    is on both ranks.
    per layer: Q 4544*36*64 = 10,469,376; K/V 2*4544*64 = 581,632; O 10,469,376;
               MLP 165,183,488/2 = 82,591,744; norms 9,088 -> 104,121,216; 32 layers = 3,331,878,912
    tied embedding ceil(65024/2) = 32512 rows * 4544 = 147,734,528; final norm 4,544
    -> 3,479,617,984 params -> 6,959,235,968 bytes (not 13,843,432,320 / 2 = 6,921,716,160).
    """
    assert weight_bytes_per_gpu(FALCON_7B, "bf16", tensor_parallel=2) == 6_959_235_968


def test_pipeline_parallel_takes_the_largest_stage() -> None:
    """Llama-3.1-405B bf16 at pp=4: stages of 31, 32, 32, 31 layers of 3,187,703,808 params.

    first: 31 layers + embedding 2,101,346,304 = 100,920,164,352
    middle: 32 layers = 102,006,521,856   <- largest (the split keeps the extras off the end stages,
    last: 31 layers + head + final norm = 100,920,180,736          but a layer outweighs the table)
    -> 102,006,521,856 * 2 = 204,013,043,712 bytes.
    """
    assert weight_bytes_per_gpu(LLAMA_3_1_405B, "bf16", pipeline_parallel=4) == 204_013_043_712


def test_pipeline_parallel_two_even_stages() -> None:
    """Llama-3-70B at pp=2: 40 layers each of 855,654,400 = 34,226,176,000.
    first: + embedding 1,050,673,152 = 35,276,849,152; last: + head + final norm 8,192 = 35,276,857,344
    -> 70,553,714,688 bytes.
    """
    assert weight_bytes_per_gpu(LLAMA_3_70B, "bf16", pipeline_parallel=2) == 70_553_714_688


def test_tensorrt_llms_split_changes_which_stage_is_heaviest() -> None:
    """Llama-3.1-405B bf16 at pp=4 under TensorRT-LLM: stages of 32, 32, 31, 31 layers; the first is 32 layers +
    the embedding: 102,006,521,856 + 2,101,346,304 = 104,107,868,160 params -> 208,215,736,320 bytes, the
    embedding's 4,202,692,608 bytes more than under vLLM's split (test above).

    DeepSeek-V3 fp8 at TP8 x PP4 (61 layers: 3 dense, then MoE). One MoE layer on a GPU: attention
    7,168 x 1,536 + 4,128,768 (replicated down-projections) + (1,536 x 24,576 + 512 x 32,768 + 16,384 x 7,168) / 8
    = 36,634,624; routed experts 256 x 3 x 7,168 x 256 = 1,409,286,144; shared 3 x 7,168 x 256 = 5,505,024 (all
    fp8, 1 B); router 256 x 7,168 x 2 B = 3,670,016; norms (2 x 7,168 + 1,536 + 512) x 2 B = 32,768: 1,455,128,576 B.
    - vLLM (15, 15, 16, 15): the third stage, 16 MoE layers = 23,282,057,216 B.
    - TensorRT-LLM (16, 15, 15, 15): the last stage, 15 MoE layers + LM head 16,160 x 7,168 x 2 B = 231,669,760
      + final norm 14,336 = 22,058,612,736 B. (The first, 13 MoE + 3 dense layers + the embedding, is
      2,651,633,664 B lighter.) 1,223,444,480 B less than under vLLM's split.
    """
    assert weight_bytes_per_gpu(LLAMA_3_1_405B, "bf16", pipeline_parallel=4,
                                pipeline_split=SPLIT_FIRST) == 208_215_736_320
    assert weight_bytes_per_gpu(DEEPSEEK_V3, "fp8", 8, 4) == 16 * 1_455_128_576 == 23_282_057_216
    assert weight_bytes_per_gpu(DEEPSEEK_V3, "fp8", 8, 4, pipeline_split=SPLIT_FIRST) == 22_058_612_736


def test_each_pipeline_stage_holds_its_own_layers() -> None:
    """DeepSeek-V3 fp8 at TP8 x PP4 under TensorRT-LLM's split (16, 15, 15, 15 layers). A dense layer on a GPU:
    attention 36,634,624 + MLP 3 x 7,168 x ceil(18,432 / 8) = 49,545,216 (fp8) + norms 32,768 = 86,212,608 B.
    - first: 3 dense layers 258,637,824 + 13 MoE layers of 1,455,128,576 (above) 18,916,671,488 + the embedding
      16,160 x 7,168 x 2 = 231,669,760 -> 19,406,979,072 B (2,651,633,664 B lighter than the last);
    - second and third: 15 MoE layers = 21,826,928,640 B;
    - last: 15 MoE layers + the LM head 231,669,760 + the final norm 14,336 = 22,058,612,736 B.
    The most loaded GPU is the last stage's (`weight_bytes_per_gpu`)."""
    stages = weight_bytes_per_stage(DEEPSEEK_V3, "fp8", 8, 4, pipeline_split=SPLIT_FIRST)
    assert stages == (19_406_979_072, 21_826_928_640, 21_826_928_640, 22_058_612_736)
    assert max(stages) == weight_bytes_per_gpu(DEEPSEEK_V3, "fp8", 8, 4, pipeline_split=SPLIT_FIRST)
    assert weight_bytes_per_stage(DEEPSEEK_V3, "fp8", 8) == (weight_bytes_per_gpu(DEEPSEEK_V3, "fp8", 8),)


def test_tied_embedding_is_copied_onto_the_last_stage() -> None:
    """Gemma-2-9B (tied) at pp=2: 21 layers of 198,188,032 = 4,161,948,672 per stage.
    The last stage computes logits, so it holds its own 256000*3584 = 917,504,000 table:
    4,161,948,672 + 917,504,000 + 3,584 = 5,079,456,256 params -> 10,158,912,512 bytes.
    """
    assert weight_bytes_per_gpu(GEMMA_2_9B, "bf16", pipeline_parallel=2) == 10_158_912_512
    assert weight_bytes(GEMMA_2_9B, "bf16") == 2 * 9_241_404_928  # stored once when whole


def test_expert_parallel_deals_out_whole_experts() -> None:
    """Mixtral bf16, tp=1, ep=3: ceil(8/3) = 3 experts of 176,160,768 on the busiest GPU.
    per layer: attention 41,943,040 + experts 528,482,304 + router 32,768 + norms 8,192 = 570,466,304
    32 layers = 18,254,921,728; + embedding/head 262,144,000 + final norm 4,096 = 18,517,069,824
    -> 37,034,139,648 bytes.
    """
    assert weight_bytes_per_gpu(MIXTRAL_8X7B, "bf16", expert_parallel=3) == 37_034_139_648


def test_expert_parallel_equals_tensor_split_of_experts_when_even() -> None:
    """Mixtral at TP8: each rank holds 1/8 of every expert (ep=1) or 1 whole expert (ep=8): same bytes.
    per layer: Q 4 heads 2,097,152 + K/V 1 head 1,048,576 + O 2,097,152 + experts 176,160,768
               + router 32,768 + norms 8,192 = 181,444,608; 32 layers = 5,806,227,456
    vocabulary 4000 rows * 4096 * 2 = 32,768,000; final norm 4,096 -> 5,838,999,552 params
    -> 11,677,999,104 bytes.
    """
    assert weight_bytes_per_gpu(MIXTRAL_8X7B, "bf16", tensor_parallel=8) == 11_677_999_104
    assert weight_bytes_per_gpu(MIXTRAL_8X7B, "bf16", tensor_parallel=8, expert_parallel=8) == 11_677_999_104


def test_deepseek_v3_fp8_on_eight_gpus() -> None:
    """DeepSeek-V3 fp8 at TP8 (e.g. one 8 x H200 node).

    attention per rank: q_a 11,010,048 + q_b 4,718,592 + kv_a 4,128,768 + kv_b 2,097,152
                        + O 14,680,064 = 36,634,624 (fp8)
    dense layer: + MLP 396,361,728/8 = 49,545,216 -> 86,179,840 fp8; norms 16,384 bf16
    MoE layer: + 256 experts * 44,040,192/8 = 1,409,286,144 + shared 5,505,024 -> 1,451,425,792 fp8;
               router 1,835,008 + norms 16,384 = 1,851,392 bf16
    fp8: 3*86,179,840 + 58*1,451,425,792 = 84,441,235,456 bytes
    bf16: 3*16,384 + 58*1,851,392 = 107,429,888; vocabulary ceil(129280/8) = 16160 rows * 7168 * 2
          = 231,669,760; final norm 7,168 -> 339,106,816 params = 678,213,632 bytes
    total 85,119,449,088 bytes (~ 671e9 / 8 fp8, plus the bf16 parts).
    """
    assert weight_bytes_per_gpu(DEEPSEEK_V3, "fp8", tensor_parallel=8) == 85_119_449_088


def test_scope_is_stated() -> None:
    for word in ("linear matrices", "embedding", "LM head", "norms", "16-bit"):
        assert word in WEIGHT_QUANTIZATION_SCOPE


def test_invalid_layouts_are_rejected() -> None:
    with pytest.raises(ValueError):
        weight_bytes(LLAMA_3_8B, "int3")
    with pytest.raises(ValueError):
        weight_bytes(LLAMA_3_8B, "fp32")  # a storage format the service does not quote
    with pytest.raises(ValueError):
        weight_bytes_per_gpu(LLAMA_3_8B, "bf16", expert_parallel=2)  # dense model
    with pytest.raises(ValueError):
        weight_bytes_per_gpu(MIXTRAL_8X7B, "bf16", expert_parallel=9)  # only 8 experts
    with pytest.raises(ValueError):
        weight_bytes_per_gpu(LLAMA_3_8B, "bf16", tensor_parallel=0)
    with pytest.raises(ValueError):
        weight_bytes_per_gpu(LLAMA_3_8B, "bf16", pipeline_parallel=33)


# Properties ----------------------------------------------------------------------------------------

@given(random_models(), st.integers(1, 16), st.sampled_from(["bf16", "fp8", "int4", "fp4"]))
def test_more_tensor_parallel_never_adds_bytes_per_gpu(model: ModelSpec, tp: int, dtype: str) -> None:
    assert weight_bytes_per_gpu(model, dtype, tp + 1) <= weight_bytes_per_gpu(model, dtype, tp)
    assert weight_bytes_per_gpu(model, dtype, tp) <= weight_bytes(model, dtype)


@given(random_models(), st.integers(1, 16), st.sampled_from(["bf16", "fp8", "int4"]))
def test_tensor_parallel_ranks_together_hold_every_weight(model: ModelSpec, tp: int, dtype: str) -> None:
    assert tp * weight_bytes_per_gpu(model, dtype, tp) >= weight_bytes(model, dtype)


@given(random_models(), st.integers(1, 4), st.integers(1, 4))
def test_every_gpu_holds_at_most_the_model(model: ModelSpec, pp: int, ep: int) -> None:
    pp = min(pp, model.num_hidden_layers)
    ep = min(ep, model.num_experts) if model.is_moe else 1
    assert weight_bytes_per_gpu(model, "bf16", 1, pp, ep) <= weight_bytes(model, "bf16")


@given(random_models())
def test_fewer_bits_never_more_bytes(model: ModelSpec) -> None:
    sizes = [weight_bytes(model, dtype) for dtype in ("bf16", "fp8", "fp4", "int4")]
    assert sizes == sorted(sizes, reverse=True)
    assert sizes[0] == 2 * param_counts(model).total
