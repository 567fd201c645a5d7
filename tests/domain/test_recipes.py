"""Quantization recipes: each parameter group in its checkpoint's format, worked by hand.

Parameter counts per layer are derived in the docstrings from the configs in `models_for_tests`
(h hidden, H query heads, Hkv KV heads, d head dim, F MLP width, V vocabulary, L layers).
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from app.sizing.model.flops import QKV, decode_cost
from app.sizing.model.recipes import (
    FORMATS,
    RECIPES,
    WeightRecipe,
    declared_kv_cache,
    recipe_from_quantization_config,
    resolve_recipe,
    uniform_recipe,
)
from app.sizing.model.weights import weight_bytes, weight_bytes_per_gpu, weight_groups_per_gpu
from tests.domain.models_for_tests import DEEPSEEK_V3, GPT_OSS_120B, LLAMA_3_1_405B, LLAMA_3_8B, LLAMA_3_70B


def test_format_bits_include_their_scales() -> None:
    """NVFP4 4 + 8/16 = 4.5 (ModelOpt effective_bits 4.5); MXFP4 4 + 8/32 = 4.25; AWQ 4 + (16 + 4)/128
    = 4.15625; symmetric int4 4 + 16/128 = 4.125; FP8 block 8 + 32/(128*128) = 8.001953125."""
    assert FORMATS["nvfp4"].bits == Fraction(9, 2)
    assert FORMATS["mxfp4"].bits == Fraction(17, 4)
    assert float(FORMATS["int4_awq"].bits) == 4.15625
    assert float(FORMATS["int4"].bits) == 4.125
    assert float(FORMATS["fp8_block"].bits) == 8.001953125


def test_gpt_oss_120b_checkpoint_has_mxfp4_experts_and_bf16_rest() -> None:
    """h 2880, H 64, Hkv 8, d 64, 128 experts of F 2880 (gated), L 36, V 201088, untied, QKV biases.

    per layer: attention Q 2880*64*64 = 11,796,480 + K/V 2*2880*8*64 = 2,949,120 + O 11,796,480
               = 26,542,080; experts 128 * 3*2880*2880 = 3,185,049,600; router 2880*128 = 368,640;
               norms 2*2880 + QKV biases (64 + 16)*64 = 10,880
    36 layers: attention 955,514,880 -> bf16 1,911,029,760 B
               experts 114,661,785,600 * 17/32 (MXFP4 4.25 bits) = 60,914,073,600 B
               router 13,271,040 -> 26,542,080 B
               norms/biases 391,680 + final norm 2,880 = 394,560 -> 789,120 B
    embedding and LM head 201088*2880 = 579,133,440 each -> 1,158,266,880 B each
    total 60,914,073,600 + 1,911,029,760 + 26,542,080 + 2*1,158,266,880 + 789,120 = 65,168,968,320 B.
    The plain fp4 count (attention MXFP4 too) is 1,403,412,480 B less: 955,514,880 * (2 - 17/32).
    """
    groups = {g.group: (g.format, g.params, g.bytes) for g in weight_groups_per_gpu(GPT_OSS_120B, "gpt_oss_mxfp4")}
    assert groups == {
        "attention": ("bf16", 955_514_880, 1_911_029_760),
        "experts": ("mxfp4", 114_661_785_600, 60_914_073_600),
        "router": ("bf16", 13_271_040, 26_542_080),
        "embedding": ("bf16", 579_133_440, 1_158_266_880),
        "lm_head": ("bf16", 579_133_440, 1_158_266_880),
        "norms_and_biases": ("bf16", 394_560, 789_120),
    }
    assert weight_bytes(GPT_OSS_120B, "gpt_oss_mxfp4") == 65_168_968_320
    assert weight_bytes(GPT_OSS_120B, "gpt_oss_mxfp4") - weight_bytes(GPT_OSS_120B, "fp4") == 1_403_412_480


def test_meta_fp8_405b_at_tp8_keeps_attention_and_edge_mlps_in_bf16() -> None:
    """Llama-3.1-405B (h 16384, H 128, Hkv 8, d 128, F 53248, L 126, V 128256) at TP8, one GPU:
    attention: Q 16 heads 16384*16*128 = 33,554,432 + K/V 1 head 2*16384*128 = 4,194,304 + O 33,554,432
               = 71,303,168 per layer, bf16: 126 * 142,606,336 = 17,968,398,336 B
    MLP: 3*16384*6656 = 327,155,712 per layer; layers 0 and 125 bf16: 2 * 654,311,424 = 1,308,622,848 B;
         124 layers fp8: 40,567,308,288 B
    norms 126*32,768 + 16,384 = 4,145,152 -> 8,290,304 B
    embedding, head: 16032 rows * 16384 = 262,668,288 each -> 525,336,576 B each
    total 17,968,398,336 + 1,308,622,848 + 40,567,308,288 + 8,290,304 + 1,050,673,152 = 60,903,292,928 B.
    An all-linear fp8 count: 126 * (71,303,168 + 327,155,712) + 4,145,152 * 2 + 1,050,673,152
    = 51,264,782,336 B; the published recipe is 18.8% more per GPU.
    """
    assert weight_bytes_per_gpu(LLAMA_3_1_405B, "meta_fp8", tensor_parallel=8) == 60_903_292_928
    assert weight_bytes_per_gpu(LLAMA_3_1_405B, "fp8", tensor_parallel=8) == 51_264_782_336
    mlp = [(g.format, g.params) for g in weight_groups_per_gpu(LLAMA_3_1_405B, "meta_fp8", 8)
           if g.group == "dense_mlp"]
    assert sorted(mlp) == [("bf16", 2 * 327_155_712), ("fp8", 124 * 327_155_712)]


def test_meta_fp8_edge_layers_follow_the_pipeline_stages() -> None:
    """At PP2 each stage holds one edge MLP (layer 0 on the first, 125 on the last) among its 63 layers.
    At TP1 attention is Q 16384*128*128 = 268,435,456 + K/V 2*16384*8*128 = 33,554,432 + O 268,435,456
    = 570,425,344 params per layer; the MLP 3*16384*53248 = 2,617,245,696.
    first: attention 63*570,425,344*2 = 71,873,593,344 B; MLP 1 bf16 5,234,491,392 B + 62 fp8
           162,269,233,152 B; norms 63*32,768*2 = 4,128,768 B; embedding 128256*16384*2 = 4,202,692,608 B
           -> 243,584,139,264 B
    last: the same plus the final norm (32,768 B) -> 243,584,172,032 B, the larger.
    """
    assert weight_bytes_per_gpu(LLAMA_3_1_405B, "meta_fp8", pipeline_parallel=2) == 243_584_172_032


def test_nvfp4_70b() -> None:
    """Llama-3-70B, ModelOpt NVFP4: all 68,451,041,280 linear params (test_weights) at 4.5 bits:
    68,451,041,280 * 9/16 = 38,503,710,720 B; bf16 embedding, head and norms 2,102,665,216 params
    = 4,205,330,432 B; total 42,709,041,152 B (MXFP4 would be 40,569,946,112)."""
    assert weight_bytes(LLAMA_3_70B, "modelopt_nvfp4") == 42_709_041_152
    assert RECIPES["modelopt_nvfp4"].checkpoint_kv_dtype == "fp8"


def test_awq_int4_8b() -> None:
    """Llama-3-8B AWQ: linear per layer Q 16,777,216 + K/V 8,388,608 + O 16,777,216 + MLP 176,160,768
    = 218,103,808; 32 layers = 6,979,321,856 params at 4 + 20/128 bits = 133/256 bytes each
    = 3,625,975,808 B; bf16: embedding + head 1,050,673,152 + norms 266,240 = 1,050,939,392 params
    = 2,101,878,784 B; total 5,727,854,592 B."""
    assert weight_bytes(LLAMA_3_8B, "awq_int4") == 5_727_854_592


def test_deepseek_block_scales_add_one_part_in_4096() -> None:
    """DeepSeek-V3 at TP8 (test_weights: 84,441,235,456 fp8 params, 678,213,632 bf16 bytes): FP8 block
    scales add 32/16384 bits per value = 1/4096 byte: 84,441,235,456 / 4096 = 20,615,536 B.
    85,119,449,088 + 20,615,536 = 85,140,064,624 B."""
    assert weight_bytes_per_gpu(DEEPSEEK_V3, "deepseek_fp8", tensor_parallel=8) == 85_140_064_624


def test_a_plain_dtype_is_the_uniform_recipe() -> None:
    assert weight_bytes(LLAMA_3_70B, uniform_recipe("int4")) == weight_bytes(LLAMA_3_70B, "int4")
    assert resolve_recipe("bf16") == uniform_recipe("bf16")
    # fp32 is a recipe only (checkpoints loaded in fp32): 8,030,261,248 params * 4 = 32,121,044,992 B.
    assert weight_bytes(LLAMA_3_8B, uniform_recipe("fp32")) == 32_121_044_992
    assert RECIPES["gpt_oss_mxfp4"].dtype == "fp4" and RECIPES["meta_fp8"].dtype == "fp8"


def test_invalid_recipes_are_rejected() -> None:
    with pytest.raises(ValueError):
        uniform_recipe("int3")
    with pytest.raises(ValueError):
        WeightRecipe(name="x", formats=(("attention", "bf16"),), description="", source="")
    with pytest.raises(ValueError):
        weight_bytes(LLAMA_3_8B, "no_such_recipe")


@pytest.mark.parametrize(("config", "recipe"), [
    ({"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "lm_head"]}, "gpt_oss_mxfp4"),
    ({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}, "deepseek_fp8"),
    ({"quant_method": "fp8"}, "fp8_dynamic"),
    ({"quant_method": "fbgemm_fp8", "modules_to_not_convert": ["model.layers.0.mlp", "model.layers.0.self_attn"],
      "activation_scale_ub": 1200.0}, "meta_fp8"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128}, "awq_int4"),
    ({"quant_method": "gptq", "bits": 8}, None),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8"}, "modelopt_nvfp4"),
    ({"quant_method": "modelopt", "quantization": {"quant_algo": "FP8"}}, "modelopt_fp8"),
    # ModelOpt's config.json form (ENGINES.md section 4): the scheme in config_groups, no quant_algo.
    ({"quant_method": "modelopt", "ignore": ["lm_head"],
      "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float"}}}}, "modelopt_fp8"),
    ({"quant_method": "modelopt",
      "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "float", "group_size": 16}}}},
     "modelopt_nvfp4"),
    ({"quant_method": "modelopt", "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "int"}}}}, None),
    ({"quant_method": "compressed-tensors", "ignore": ["lm_head"],
      "config_groups": {"group_0": {"weights": {"type": "int", "num_bits": 8}}}}, "w8a8_int8"),
    ({"quant_method": "compressed-tensors",
      "config_groups": {"group_0": {"weights": {"type": "float", "num_bits": 8}}}}, "fp8_dynamic"),
    ({"quant_method": "bitsandbytes"}, None),
])
def test_quantization_config_names_its_recipe(config: dict[str, object], recipe: str | None) -> None:
    """quant_method and its scheme keys as ENGINES.md section 4 lists them."""
    name, read = recipe_from_quantization_config(config)
    assert name == recipe
    assert repr(config["quant_method"]) in read


@pytest.mark.parametrize(("config", "declared"), [
    ({"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}, "fp8"),
    # hf_quant_config.json's nesting, and ModelOpt's null for a checkpoint without KV quantization
    ({"quant_method": "modelopt", "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "NVFP4"}}, "nvfp4"),
    ({"quant_method": "modelopt", "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": None}}, None),
    ({"quant_method": "modelopt", "quant_algo": "FP8"}, None),
    # config.json's form: a kv_cache_scheme of 8-bit floats, or none
    ({"quant_method": "modelopt", "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor"}}, "fp8"),
    ({"quant_method": "modelopt", "kv_cache_scheme": None}, None),
    ({"quant_method": "modelopt", "kv_cache_scheme": {"num_bits": 8, "type": "int"}}, "int8"),
])
def test_a_modelopt_config_declares_its_kv_cache_or_none(config: dict[str, object], declared: str | None) -> None:
    """ENGINES.md section 4: `kv_cache_quant_algo` "FP8" | null (hf_quant_config.json, under `quantization`),
    `kv_cache_scheme` in config.json's form; an engine's 'auto' KV dtype adopts only a declared one."""
    assert declared_kv_cache(config) == declared


@pytest.mark.parametrize(("excluded", "named"), [
    (3, None), (True, None), ({"lm_head": True}, None),  # no quantizer writes these: nothing is read as excluded
    ("model.layers.0.self_attn", "['model.layers.0.self_attn']"),  # a lone name is a list of one
    (["lm_head", 7], "['lm_head', '7']"),
])
def test_an_exclusion_list_of_another_shape_is_read_without_failing(excluded: object, named: str | None) -> None:
    """fbgemm_fp8 is Meta's FP8 recipe only when an attention module is excluded; an exclusion that is not
    a list (3 crashed the import with a TypeError) names no module, or the one name it is."""
    name, read = recipe_from_quantization_config({"quant_method": "fbgemm_fp8", "modules_to_not_convert": excluded})
    assert name == ("meta_fp8" if named and "self_attn" in named else "fp8_dynamic")
    assert (f"excluded modules {named}" in read) if named else ("excluded" not in read)


def test_the_step_model_reads_each_group_in_its_format() -> None:
    """gpt-oss-120b decode, one token: the Q/K/V projections per layer are Q 11,796,480 + K/V 2,949,120
    = 14,745,600 weights + 5,120 biases. As published (bf16 attention): (14,745,600 + 5,120) x 2 B x 36 layers
    = 1,062,051,840 B; with a plain fp4 count: (14,745,600 x 17/32 + 5,120 x 2) x 36 = (7,833,600 + 10,240)
    x 36 = 282,378,240 B."""
    recipe = decode_cost(GPT_OSS_120B, 100, 1, RECIPES["gpt_oss_mxfp4"]).operator(QKV)
    plain = decode_cost(GPT_OSS_120B, 100, 1, "fp4").operator(QKV)
    assert recipe.weight_bytes == 1_062_051_840
    assert plain.weight_bytes == 282_378_240
