"""Parameter counts, checked against hand arithmetic and the published model-card totals.

Independent sources: the model cards (published totals, SIZING.md section 2) and the
`computed_total_params` cross-check column of the reference catalog (`models.json`), which was
counted from the same configs by a separate script.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.sizing.model.params import (
    SPLIT_BEFORE_LAST,
    SPLIT_FIRST,
    attention_params,
    layer_params,
    mlp_params,
    param_counts,
    pipeline_stages,
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
    QWEN2_5_72B,
    random_models,
)


def test_llama_3_8b_total_by_hand() -> None:
    """h=4096, H=32, Hkv=8, d=128, F=14336, V=128256, L=32, untied.

    per layer: Q 4096*4096 = 16,777,216; K+V 2*4096*8*128 = 8,388,608; O 16,777,216;
               MLP 3*4096*14336 = 176,160,768; norms 2*4096 = 8,192  -> 218,112,000
    32 layers = 6,979,584,000; embedding + head 2*128256*4096 = 1,050,673,152; final norm 4,096
    total = 8,030,261,248 (model card "8.03B"; catalog computed_total_params 8,030,261,248).
    """
    layer = layer_params(LLAMA_3_8B, 0)
    assert (layer.attention_qkv, layer.attention_out, layer.mlp_dense, layer.norms) == (
        25_165_824, 16_777_216, 176_160_768, 8_192)
    assert layer.total == 218_112_000
    counts = param_counts(LLAMA_3_8B)
    assert counts.embedding == counts.lm_head == 525_336_576
    assert counts.total == 8_030_261_248
    assert counts.active == counts.total  # dense: every weight is active


def test_llama_3_70b_total_by_hand() -> None:
    """h=8192, H=64, Hkv=8, d=128, F=28672, V=128256, L=80.

    per layer: Q 67,108,864 + K/V 2*8192*8*128 = 16,777,216 + O 67,108,864
               + MLP 3*8192*28672 = 704,643,072 + norms 16,384 = 855,654,400
    80 layers = 68,452,352,000; + 2*128256*8192 = 2,101,346,304; + final norm 8,192
    total = 70,553,706,496 ~ 70.6e9 published.
    """
    counts = param_counts(LLAMA_3_70B)
    assert counts.total == 70_553_706_496
    assert counts.attention == 80 * (67_108_864 + 16_777_216 + 67_108_864)
    assert counts.total == pytest.approx(70.6e9, rel=0.01)


def test_llama_3_1_405b_total_by_hand() -> None:
    """h=16384, H=128, Hkv=8, d=128, F=53248, V=128256, L=126.

    per layer: Q 268,435,456 + K/V 2*16384*8*128 = 33,554,432 + O 268,435,456
               + MLP 3*16384*53248 = 2,617,245,696 + norms 32,768 = 3,187,703,808
    126 layers = 401,650,679,808; + 2*128256*16384 = 4,202,692,608; + 16,384
    total = 405,853,388,800 (catalog: 405.85B; card 405B).
    """
    assert param_counts(LLAMA_3_1_405B).total == 405_853_388_800
    assert param_counts(LLAMA_3_1_405B).total == pytest.approx(405e9, rel=0.01)


def test_llama_2_7b_is_full_mha() -> None:
    """h=4096, H=Hkv=32, d=128, F=11008, V=32000, L=32.

    per layer: Q,K,V,O 4*4096*4096 = 67,108,864; MLP 3*4096*11008 = 135,266,304; norms 8,192
               -> 202,383,360; 32 layers = 6,476,267,520; + 2*32000*4096 = 262,144,000; + 4,096
    total = 6,738,415,616 (catalog computed_total_params 6,738,415,616).
    """
    assert param_counts(LLAMA_2_7B).total == 6_738_415_616


def test_qwen2_5_72b_counts_qkv_biases() -> None:
    """h=8192, H=64, Hkv=8, d=128, F=29568, V=152064, QKV biases.

    per layer: Q 67,108,864 + bias 8,192; K/V 16,777,216 + bias 2*1024 = 2,048; O 67,108,864;
               MLP 3*8192*29568 = 726,663,168; norms 16,384 -> 877,684,736
    80 layers = 70,214,778,880; + 2*152064*8192 = 2,491,416,576; + 8,192
    total = 72,706,203,648 (card 72.7B; catalog 72,706,203,648).
    """
    assert attention_params(QWEN2_5_72B).qkv_bias == 10_240
    assert param_counts(QWEN2_5_72B).total == 72_706_203_648


def test_qwen2_5_0_5b_tied_embedding_counted_once() -> None:
    """h=896, H=14, Hkv=2, d=64, F=4864, V=151936, tied, QKV biases.

    per layer: Q 896*896 = 802,816 + bias 896; K/V 2*896*128 = 229,376 + bias 256; O 802,816;
               MLP 3*896*4864 = 13,074,432; norms 1,792 -> 14,912,384
    24 layers = 357,897,216; embedding 151936*896 = 136,134,656 (no separate head); final norm 896
    total = 494,032,768. The card says 0.49B, and 0.36B without embeddings (357,898,112).
    """
    counts = param_counts(QWEN2_5_0_5B)
    assert counts.lm_head == 0
    assert counts.embedding == 136_134_656
    assert counts.total == 494_032_768
    assert counts.total - counts.embedding == pytest.approx(0.36e9, rel=0.01)


def test_falcon_7b_plain_mlp_and_multi_query() -> None:
    """h=4544, H=71, Hkv=1, d=64, MLP 2 matrices of 4*4544 = 18176, V=65024, tied.

    per layer: Q 4544*71*64 = 20,647,936; K/V 2*4544*64 = 581,632; O 20,647,936;
               MLP 2*4544*18176 = 165,183,488; norms 9,088 -> 207,070,080
    32 layers = 6,626,242,560; embedding 65024*4544 = 295,469,056; final norm 4,544
    total = 6,921,716,160. The catalog's 6,921,720,704 also counts the final LayerNorm's bias
    (4,544 more); the card says "7B".
    """
    assert layer_params(FALCON_7B, 0).mlp_dense == 165_183_488
    assert param_counts(FALCON_7B).total == 6_921_716_160


def test_gemma_2_9b_uses_explicit_head_dim() -> None:
    """h=3584, H=16, Hkv=8, head_dim 256 (not 3584/16 = 224), F=14336, V=256000, tied.

    per layer: Q 3584*16*256 = 14,680,064; K/V 2*3584*8*256 = 14,680,064; O 14,680,064;
               MLP 3*3584*14336 = 154,140,672; norms 7,168 -> 198,188,032
    42 layers = 8,323,897,344; embedding 256000*3584 = 917,504,000; final norm 3,584
    total = 9,241,404,928. The catalog's 9,241,705,984 counts Gemma-2's two extra norms per layer
    (42*2*3584 = 301,056), which we leave out (0.003%).
    """
    assert param_counts(GEMMA_2_9B).total == 9_241_404_928


def test_mixtral_total_and_active() -> None:
    """h=4096, Hkv=8, expert F=14336, E=8, k=2, V=32000, L=32.

    attention 41,943,040; one expert 3*4096*14336 = 176,160,768; router 4096*8 = 32,768; norms 8,192
    layer total  = 41,943,040 + 8*176,160,768 + 32,768 + 8,192 = 1,451,270,144
    layer active = 41,943,040 + 2*176,160,768 + 32,768 + 8,192 =   394,305,536
    outside layers: 2*32000*4096 + 4096 = 262,148,096
    total  = 32*1,451,270,144 + 262,148,096 = 46,702,792,704 (card 46.7B)
    active = 32*394,305,536   + 262,148,096 = 12,879,925,248 (card 12.9B, embeddings included)
    """
    layer = layer_params(MIXTRAL_8X7B, 5)
    assert (layer.expert, layer.routed_experts, layer.experts_per_token, layer.router, layer.mlp_dense) == (
        176_160_768, 8, 2, 32_768, 0)
    counts = param_counts(MIXTRAL_8X7B)
    assert counts.total == 46_702_792_704
    assert counts.active == 12_879_925_248
    assert counts.moe_routed == 32 * 8 * 176_160_768
    assert counts.total == pytest.approx(46.7e9, rel=0.01)
    assert counts.active == pytest.approx(12.9e9, rel=0.01)


def test_deepseek_v3_mla_layer_by_hand() -> None:
    """h=7168, H=128, q_lora 1536, kv_lora 512, d_rope 64, d_nope 128, d_v 128.

    Q path: 7168*1536 = 11,010,048 + 1536*128*(128+64) = 37,748,736
    KV down: 7168*(512+64) = 4,128,768; KV up: 512*128*(128+128) = 16,777,216
    -> attention_qkv = 69,664,768; O: 128*128*7168 = 117,440,512
    norms: 2*7168 + 1536 + 512 = 16,384
    """
    layer = layer_params(DEEPSEEK_V3, 0)
    assert layer.attention_qkv == 69_664_768
    assert layer.attention_out == 117_440_512
    assert layer.norms == 16_384
    assert layer.mlp_dense == 3 * 7168 * 18432  # first_k_dense_replace = 3: layer 0 is dense
    moe = layer_params(DEEPSEEK_V3, 3)
    assert moe.mlp_dense == 0
    assert moe.expert == 3 * 7168 * 2048 == 44_040_192
    assert moe.shared_experts == 44_040_192
    assert moe.router == 7168 * 256


def test_deepseek_v3_total_and_active() -> None:
    """3 dense + 58 MoE layers, V=129280.

    dense layer: 187,105,280 attention + 396,361,728 MLP + 16,384 norms = 583,483,392
    MoE layer total: 187,105,280 + 256*44,040,192 (11,274,289,152) + shared 44,040,192
                     + router 1,835,008 + norms 16,384 = 11,507,286,016
    MoE layer active: 187,105,280 + 8*44,040,192 (352,321,536) + 44,040,192 + 1,835,008 + 16,384
                      = 585,318,400
    outside: 2*129280*7168 = 1,853,358,080 + final norm 7,168
    total  = 3*583,483,392 + 58*11,507,286,016 + 1,853,365,248 = 671,026,404,352 (card 671B)
    active = 3*583,483,392 + 58*585,318,400    + 1,853,365,248 =  37,552,282,624
    The card's "37B" is rounded down: the catalog's own count is 37,552,297,472 (it adds the
    58*256 routing-bias terms, 14,848), 1.5% above 37e9.
    """
    counts = param_counts(DEEPSEEK_V3)
    assert counts.total == 671_026_404_352
    assert counts.active == 37_552_282_624
    assert counts.total == pytest.approx(671e9, rel=0.01)
    assert counts.active == pytest.approx(37e9, rel=0.02)


def test_gpt_oss_120b_counts_and_active_convention() -> None:
    """h=2880, H=64, Hkv=8, d=64, QKV biases, 128 experts of 3*2880*2880, top-4, V=201088, L=36.

    attention: Q 2880*4096 = 11,796,480 + K/V 2*2880*512 = 2,949,120 + biases (64+16)*64 = 5,120
               + O 11,796,480 = 26,547,200
    layer total  = 26,547,200 + 128*24,883,200 + router 368,640 + norms 5,760 = 3,211,971,200
    layer active = 26,547,200 +   4*24,883,200 + 368,640 + 5,760            =   126,454,400
    outside: 2*201088*2880 = 1,158,266,880 + 2,880
    total  = 36*3,211,971,200 + 1,158,269,760 = 116,789,232,960 (card 116.8B / "117B")
    active = 36*126,454,400   + 1,158,269,760 =   5,710,628,160
    OpenAI's 5.1B active leaves the input embedding out: 5,710,628,160 - 579,133,440 = 5,131,494,720.
    """
    counts = param_counts(GPT_OSS_120B)
    assert counts.total == 116_789_232_960
    assert counts.active == 5_710_628_160
    assert counts.total == pytest.approx(117e9, rel=0.01)
    assert counts.active - counts.embedding == pytest.approx(5.1e9, rel=0.01)


def test_attention_params_under_tensor_parallel_replicate_kv_heads() -> None:
    """Llama-3-70B at TP16: 64/16 = 4 query heads, but 8 KV heads over 16 ranks -> 1 per rank.

    Q 8192*4*128 = 4,194,304; K/V 2*8192*1*128 = 2,097,152 (not 1,048,576: replicated); O 4,194,304.
    """
    shard = attention_params(LLAMA_3_70B, 16)
    assert shard.qkv_matrices == 4_194_304 + 2_097_152
    assert shard.out == 4_194_304


def test_attention_params_mla_down_projections_replicate() -> None:
    """DeepSeek-V3 at TP8: q_a (11,010,048) and kv_a (4,128,768) stay whole on every rank;
    q_b 37,748,736/8 = 4,718,592, kv_b 16,777,216/8 = 2,097,152, O 117,440,512/8 = 14,680,064.
    """
    shard = attention_params(DEEPSEEK_V3, 8)
    assert shard.qkv_matrices == 11_010_048 + 4_718_592 + 4_128_768 + 2_097_152
    assert shard.out == 14_680_064


def test_pipeline_stages_follow_vllm_split() -> None:
    """floor(L/pp) each; the L mod pp extra layers go to the stages just before the last."""
    assert [len(s) for s in pipeline_stages(126, 4)] == [31, 32, 32, 31]
    assert [len(s) for s in pipeline_stages(42, 4)] == [10, 11, 11, 10]
    assert [len(s) for s in pipeline_stages(80, 4)] == [20, 20, 20, 20]
    assert [len(s) for s in pipeline_stages(5, 2)] == [3, 2]
    assert pipeline_stages(42, 4)[1] == range(10, 21)
    assert pipeline_stages(7, 1) == (range(7),)


def test_tensorrt_llms_first_stages_take_the_leftover_layers() -> None:
    """TensorRT-LLM (`SPLIT_FIRST`): floor(L/pp) each, the L mod pp extra layers to the first stages. It differs
    from vLLM's split where the leftover is neither 0 nor pp - 1 (then both give every stage but the last one more)."""
    assert [len(s) for s in pipeline_stages(126, 4, SPLIT_FIRST)] == [32, 32, 31, 31]
    assert [len(s) for s in pipeline_stages(61, 4, SPLIT_FIRST)] == [16, 15, 15, 15]
    assert [len(s) for s in pipeline_stages(61, 4, SPLIT_BEFORE_LAST)] == [15, 15, 16, 15]
    assert pipeline_stages(61, 2, SPLIT_FIRST) == pipeline_stages(61, 2) == (range(31), range(31, 61))
    assert pipeline_stages(7, 4, SPLIT_FIRST) == pipeline_stages(7, 4)  # leftover 3 = pp - 1: [2, 2, 2, 1]
    with pytest.raises(ValueError, match="unknown pipeline split"):
        pipeline_stages(61, 4, "last")


def test_invalid_inputs_are_rejected() -> None:
    with pytest.raises(ValueError):
        layer_params(LLAMA_3_8B, 32)
    with pytest.raises(ValueError):
        layer_params(LLAMA_3_8B, -1)
    with pytest.raises(ValueError):
        pipeline_stages(4, 5)
    with pytest.raises(ValueError):
        pipeline_stages(4, 0)
    with pytest.raises(ValueError):
        attention_params(LLAMA_3_8B, 0)


# Properties ----------------------------------------------------------------------------------------

@given(random_models())
def test_totals_equal_the_sum_over_every_layer(model: ModelSpec) -> None:
    """Grouping layers by kind must give what a layer-by-layer walk gives."""
    counts = param_counts(model)
    head = 0 if model.tie_word_embeddings else model.vocab_size * model.hidden_size
    outside = model.vocab_size * model.hidden_size + head + model.hidden_size
    layers = [layer_params(model, i) for i in range(model.num_hidden_layers)]
    assert counts.total == outside + sum(layer.total for layer in layers)
    assert counts.active == outside + sum(layer.active for layer in layers)
    assert counts.active <= counts.total
    assert (counts.active == counts.total) == (not model.is_moe or all(
        layer.experts_per_token == layer.routed_experts for layer in layers))


@given(random_models(), st.integers(1, 16))
def test_attention_shard_never_exceeds_the_layer(model: ModelSpec, tp: int) -> None:
    whole, shard = attention_params(model), attention_params(model, tp)
    assert shard.total <= whole.total
    assert attention_params(model, tp + 1).total <= shard.total


def test_mlp_params_gated_vs_plain() -> None:
    """SwiGLU: gate, up, down = 3*h*F; plain: up, down = 2*h*F."""
    assert mlp_params(LLAMA_3_8B, 14336) == 3 * 4096 * 14336
    assert mlp_params(FALCON_7B, 18176) == 2 * 4544 * 18176


@pytest.mark.parametrize(("change", "message"), [
    # Mixtral-8x7B (32 layers, 8 experts): an inconsistent MoE description is refused, never sized as something else.
    ({"moe_layers": (1, 1)}, "more than once"),
    ({"first_k_dense_replace": 500}, "no MoE layer"),
    ({"moe_layers": ()}, "no MoE layer"),
    ({"num_experts": 0, "num_experts_per_tok": 0, "moe_layers": (0,)}, "moe_layers needs num_experts"),
    # A dense model with leftover MoE counts: sized as if they were not there, without a word.
    ({"num_experts": 0, "num_experts_per_tok": 2}, "num_experts_per_tok needs num_experts"),
    ({"num_experts": 0, "num_experts_per_tok": 0, "n_shared_experts": 2}, "n_shared_experts needs num_experts"),
    ({"q_lora_rank": 1536}, "give kv_lora_rank too"),
    ({"total_params_published": 1, "active_params_published": 10**13}, "exceeds total_params_published"),
    ({"hidden_size": 8, "num_attention_heads": 16, "num_key_value_heads": 16}, "head_dim must be given"),
])
def test_an_inconsistent_architecture_is_refused(change: dict[str, object], message: str) -> None:
    """Found by fuzzing the catalog writes: each of these was stored and sized (a 32-layer model with
    first_k_dense_replace 500 is an MoE model without an MoE layer; 8 // 16 heads is a head of 0 values)."""
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(MIXTRAL_8X7B, **change)

