"""Reading published Hugging Face config.json files into ModelSpec fields.

Each fixture in tests/fixtures/hf_configs/ is a config.json with its published key set (sources:
the Hugging Face repos named in each test, and the mirrors listed in the catalog notes). The
expected fields are written out by hand from the model cards, the transformers configuration
classes (transformers 5.24) and the worked values in SIZING.md / catalog-notes.md, never from
the normalizer's own output.
"""

from __future__ import annotations

import copy
import json
from dataclasses import fields as dataclass_fields
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.catalog.hf_config import ALIASES, FAMILIES, ConfigError, NormalizedConfig, normalize_hf_config
from app.sizing.specs import LAYER_CHUNKED, LAYER_FULL, LAYER_SLIDING, ModelSpec

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs"
S, F, C = LAYER_SLIDING, LAYER_FULL, LAYER_CHUNKED

# Fields of a dense model with standard attention and no windows; each case overrides the rest.
PLAIN = {
    "name": "", "dtype": "bf16", "mlp_gated": True, "attention_bias": False,
    "num_experts": 0, "num_experts_per_tok": 0, "n_shared_experts": 0, "moe_intermediate_size": None,
    "shared_expert_intermediate_size": None, "first_k_dense_replace": 0, "moe_layers": None,
    "kv_lora_rank": None, "q_lora_rank": None, "qk_rope_head_dim": None, "qk_nope_head_dim": None,
    "v_head_dim": None, "layer_types": None, "sliding_window": None, "attention_chunk_size": None,
}


def load(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def normalize(config: object) -> NormalizedConfig:
    result = normalize_hf_config(config)
    ModelSpec(**result.fields)  # the contract: every accepted config builds a spec
    return result


def defaulted(result: NormalizedConfig) -> list[str]:
    """The "field = value" part of each defaults_applied line (the reason follows in brackets)."""
    return [line.split(" (", 1)[0] for line in result.defaults_applied]


def problems_of(config: object) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as caught:
        normalize_hf_config(config)
    assert caught.value.problems, "a ConfigError always lists its problems"
    return caught.value.problems


def pointers_of(config: object) -> list[str]:
    return [pointer for pointer, _ in problems_of(config)]


# The required configs ---------------------------------------------------------------------------


def test_llama_3_70b():
    """meta-llama/Meta-Llama-3-70B. GQA 64 query / 8 KV heads; head_dim is not a key, so it is
    derived: 8192 / 64 = 128 (catalog-notes: KV = 2 * 80 * 8 * 128 = 163,840 elements/token)."""
    result = normalize(load("meta-llama-3-70b"))
    assert result.fields == {
        **PLAIN,
        "num_hidden_layers": 80, "hidden_size": 8192, "num_attention_heads": 64, "num_key_value_heads": 8,
        "head_dim": 128, "vocab_size": 128256, "intermediate_size": 28672, "tie_word_embeddings": False,
        "max_position_embeddings": 8192,
    }
    assert result.defaults_applied == ()  # every field it needs is in the file
    assert any("8192 / 64 = 128" in note for note in result.notes)


def test_mixtral_8x7b():
    """mistralai/Mixtral-8x7B-v0.1: `num_local_experts` 8, top-2, every one of the 32 layers MoE.
    There is no moe_intermediate_size key: the experts are intermediate_size (14336) wide, which
    ModelSpec reads as the expert width when moe_intermediate_size is None. sliding_window: null."""
    result = normalize(load("mixtral-8x7b-v0.1"))
    assert result.fields == {
        **PLAIN,
        "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 4096 // 32, "vocab_size": 32000, "intermediate_size": 14336,
        "tie_word_embeddings": False, "max_position_embeddings": 32768,
        "num_experts": 8, "num_experts_per_tok": 2, "moe_layers": tuple(range(32)),
    }
    assert result.defaults_applied == ()


def test_deepseek_v3():
    """deepseek-ai/DeepSeek-V3: MLA (kv_lora_rank 512, q_lora_rank 1536, rope 64, nope 128, v 128);
    256 routed experts of width 2048, top-8, 1 shared; the first 3 layers dense (width 18432), so
    layers 3..60 are MoE: 61 - 3 = 58 of them. num_key_value_heads 128 stays as stated but is not
    the cache geometry (catalog-notes: (512 + 64) * 61 elements/token), and head_dim is unused.
    The weights ship as fp8 (quantization_config); torch_dtype says bfloat16."""
    result = normalize(load("deepseek-v3"))
    assert result.fields == {
        **PLAIN,
        "num_hidden_layers": 61, "hidden_size": 7168, "num_attention_heads": 128,
        "num_key_value_heads": 128, "head_dim": None, "vocab_size": 129280, "intermediate_size": 18432,
        "tie_word_embeddings": False, "max_position_embeddings": 163840,
        "num_experts": 256, "num_experts_per_tok": 8, "n_shared_experts": 1, "moe_intermediate_size": 2048,
        "first_k_dense_replace": 3, "moe_layers": tuple(range(3, 61)),
        "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
        "v_head_dim": 128,
    }
    assert len(result.fields["moe_layers"]) == 58
    assert result.defaults_applied == ()
    notes = " | ".join(result.notes)
    assert "num_key_value_heads 128 does not size the KV cache" in notes
    assert "'fp8'" in notes
    assert "weight_recipe 'deepseek_fp8'" in notes  # weight_block_size [128, 128]


def test_gemma_2_9b():
    """google/gemma-2-9b: 42 layers alternating local (even index, 4096-token window) and global;
    head_dim 256 although 3584 / 16 = 224; the file omits tie_word_embeddings, and Gemma2Config
    defaults it to true. The base checkpoint is stored in float32."""
    result = normalize(load("gemma-2-9b"))
    assert result.fields == {
        **PLAIN,
        "num_hidden_layers": 42, "hidden_size": 3584, "num_attention_heads": 16, "num_key_value_heads": 8,
        "head_dim": 256, "vocab_size": 256000, "intermediate_size": 14336, "tie_word_embeddings": True,
        "max_position_embeddings": 8192, "dtype": "fp32",
        "layer_types": (S, F) * 21, "sliding_window": 4096,
    }
    assert defaulted(result) == ["tie_word_embeddings = true"]


def test_gpt_oss_120b():
    """openai/gpt-oss-120b: 128 experts (`num_local_experts`), 4 per token (stated both as
    `experts_per_token` and `num_experts_per_tok`), intermediate_size 2880 is the expert width;
    explicit layer_types alternate 128-token sliding (even) and full (odd); Q/K/V biases; head_dim
    64 with 64 heads = 4096 != hidden 2880. No torch_dtype key; MoE weights ship as MXFP4."""
    result = normalize(load("gpt-oss-120b"))
    assert result.fields == {
        **PLAIN,
        "num_hidden_layers": 36, "hidden_size": 2880, "num_attention_heads": 64, "num_key_value_heads": 8,
        "head_dim": 64, "vocab_size": 201088, "intermediate_size": 2880, "tie_word_embeddings": False,
        "max_position_embeddings": 131072, "attention_bias": True,
        "num_experts": 128, "num_experts_per_tok": 4, "moe_layers": tuple(range(36)),
        "layer_types": (S, F) * 18, "sliding_window": 128,
    }
    assert defaulted(result) == ['dtype = "bf16"']
    (note,) = [note for note in result.notes if "'mxfp4'" in note]
    assert "weight_recipe 'gpt_oss_mxfp4'" in note and "model.layers.*.self_attn" in note


def test_falcon_7b_with_the_lying_num_kv_heads():
    """A tiiuae/falcon-7b config re-saved by transformers 4.35 states num_kv_heads 71 next to
    multi_query true and new_decoder_architecture false: FalconAttention then uses ONE KV head
    (catalog-notes trap 5; trusting 71 overstates the KV cache 71x). head_dim = 4544 / 71 = 64.
    Plain GELU MLP of 4 * 4544 = 18176 (FalconConfig ffn_hidden_size default); embeddings tied
    (FalconConfig default)."""
    result = normalize(load("falcon-7b-resaved"))
    assert result.fields == {
        **PLAIN,
        "name": "tiiuae/falcon-7b",
        "num_hidden_layers": 32, "hidden_size": 4544, "num_attention_heads": 71, "num_key_value_heads": 1,
        "head_dim": 64, "vocab_size": 65024, "intermediate_size": 18176, "mlp_gated": False,
        "tie_word_embeddings": True, "max_position_embeddings": 2048,
    }
    assert defaulted(result) == ["tie_word_embeddings = true", "intermediate_size = 18176"]
    assert any(note.startswith("num_kv_heads 71 ignored: multi_query") for note in result.notes)


def test_falcon_7b_custom_code_config():
    """The original falcon-7b upload (model_type RefinedWebModel, n_layer/n_head keys, no
    n_head_kv): transformers' conversion maps it to falcon with new_decoder_architecture false, and
    multi_query true means one KV head. max_position_embeddings comes from FalconConfig: 2048."""
    result = normalize(load("falcon-7b-custom-code"))
    assert result.fields == {
        **PLAIN,
        "num_hidden_layers": 32, "hidden_size": 4544, "num_attention_heads": 71, "num_key_value_heads": 1,
        "head_dim": 64, "vocab_size": 65024, "intermediate_size": 4 * 4544, "mlp_gated": False,
        "tie_word_embeddings": True, "max_position_embeddings": 2048,
    }
    assert defaulted(result) == ["tie_word_embeddings = true", "max_position_embeddings = 2048",
                                 "intermediate_size = 18176"]


FALCON_40B = {
    **PLAIN,
    # 128 query heads in 8 KV groups (GQA, not MQA: catalog-notes trap 6); head_dim 8192 / 128 = 64;
    # MLP 4 * 8192 = 32768; context 2048 and tied embeddings are FalconConfig defaults.
    "num_hidden_layers": 60, "hidden_size": 8192, "num_attention_heads": 128, "num_key_value_heads": 8,
    "head_dim": 64, "vocab_size": 65024, "intermediate_size": 32768, "mlp_gated": False,
    "tie_word_embeddings": True, "max_position_embeddings": 2048,
}


def test_falcon_40b():
    """tiiuae/falcon-40b: new_decoder_architecture true with num_kv_heads 8."""
    result = normalize(load("falcon-40b"))
    assert result.fields == FALCON_40B
    assert defaulted(result) == ["tie_word_embeddings = true", "max_position_embeddings = 2048",
                                 "intermediate_size = 32768"]


def test_falcon_40b_custom_code_config():
    """The original falcon-40b upload (model_type RefinedWeb) states n_head_kv 8, which the
    transformers conversion reads as new_decoder_architecture true: the same model as above."""
    assert normalize(load("falcon-40b-custom-code")).fields == FALCON_40B


def test_falcon_40b_ignores_multi_query_under_the_new_architecture():
    config = {**load("falcon-40b"), "multi_query": True}
    result = normalize(config)
    assert result.fields["num_key_value_heads"] == 8
    assert any(note.startswith("multi_query ignored") for note in result.notes)


def test_falcon_without_multi_query_or_new_architecture_is_multi_head():
    config = {**load("falcon-7b-resaved"), "multi_query": False}
    assert normalize(config).fields["num_key_value_heads"] == 71


def test_gemma_3_27b_it_reads_text_config_and_library_defaults():
    """google/gemma-3-27b-it nests the language model under text_config, which omits the
    vocabulary (Gemma3TextConfig: 262208), the layer pattern (sliding_window_pattern 6: layer i is
    global when (i + 1) % 6 == 0, i.e. 5, 11, ..., 59 -> 10 global, 52 local with the 1024 window),
    the context (131072) and tie_word_embeddings (true). torch_dtype is at the top level."""
    result = normalize(load("gemma-3-27b-it"))
    assert result.fields == {
        **PLAIN,
        "num_hidden_layers": 62, "hidden_size": 5376, "num_attention_heads": 32, "num_key_value_heads": 16,
        "head_dim": 128, "vocab_size": 262208, "intermediate_size": 21504, "tie_word_embeddings": True,
        "max_position_embeddings": 131072,
        "layer_types": ((S,) * 5 + (F,)) * 10 + (S, S), "sliding_window": 1024,
    }
    assert result.fields["layer_types"].count(F) == 10
    assert sorted(defaulted(result)) == sorted([
        "vocab_size = 262208", "tie_word_embeddings = true", "max_position_embeddings = 131072",
        "attention_bias = false", "sliding_window_pattern = 6",
    ])


LLAMA_4_SCOUT = {
    **PLAIN,
    # text_config: 16 routed experts of width intermediate_size 8192, top-1, plus the one shared
    # expert every Llama4TextMoe has; intermediate_size_mlp 16384 is the dense width. With
    # interleave_moe_layer_step 1 every layer is MoE. no_rope_layers [] -> interval 4: layers
    # 3, 7, ..., 47 are NoPE and global, the other 36 RoPE layers chunk at 8192 tokens.
    "num_hidden_layers": 48, "hidden_size": 5120, "num_attention_heads": 40, "num_key_value_heads": 8,
    "head_dim": 128, "vocab_size": 202048, "intermediate_size": 16384, "tie_word_embeddings": False,
    "max_position_embeddings": 10485760,
    "num_experts": 16, "num_experts_per_tok": 1, "n_shared_experts": 1, "moe_intermediate_size": 8192,
    "moe_layers": tuple(range(48)),
    "layer_types": ((C, C, C, F)) * 12, "attention_chunk_size": 8192,
}


def test_llama_4_scout_reads_text_config():
    result = normalize(load("llama-4-scout-17b-16e-instruct"))
    assert result.fields == LLAMA_4_SCOUT
    assert defaulted(result) == ["no_rope_layer_interval = 4"]


def test_llama_4_maverick_interleaves_moe_layers():
    """Llama-4-Maverick's text_config differs in 128 experts, interleave_moe_layer_step 2 and a
    1048576 context: Llama4TextConfig puts MoE at range(2 - 1, 48, 2) = the 24 odd layers."""
    config = copy.deepcopy(load("llama-4-scout-17b-16e-instruct"))
    config["text_config"].update(num_local_experts=128, interleave_moe_layer_step=2,
                                 max_position_embeddings=1048576)
    fields = normalize(config).fields
    assert fields == {**LLAMA_4_SCOUT, "num_experts": 128, "max_position_embeddings": 1048576,
                      "moe_layers": tuple(range(1, 48, 2))}
    assert len(fields["moe_layers"]) == 24


def test_llama_4_explicit_moe_layers_and_no_rope_layers_win():
    config = copy.deepcopy(load("llama-4-scout-17b-16e-instruct"))
    config["text_config"].update(moe_layers=[47, 0], no_rope_layers=[1, 0] * 24)
    fields = normalize(config).fields
    assert fields["moe_layers"] == (0, 47)
    assert fields["layer_types"] == (C, F) * 24


def test_llama_4_without_chunk_size_is_all_global():
    config = copy.deepcopy(load("llama-4-scout-17b-16e-instruct"))
    config["text_config"]["attention_chunk_size"] = None
    fields = normalize(config).fields
    assert fields["layer_types"] is None and fields["attention_chunk_size"] is None


# More families ---------------------------------------------------------------------------------


def test_qwen2_5_7b():
    """Qwen/Qwen2.5-7B: sliding_window 131072 but use_sliding_window false, so no window;
    Qwen2Attention always has Q/K/V biases; head_dim 3584 / 28 = 128."""
    result = normalize(load("qwen2.5-7b"))
    assert result.fields == {
        **PLAIN,
        "num_hidden_layers": 28, "hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4,
        "head_dim": 128, "vocab_size": 152064, "intermediate_size": 18944, "tie_word_embeddings": False,
        "max_position_embeddings": 131072, "attention_bias": True,
    }
    assert "sliding_window 131072 ignored: use_sliding_window is false" in result.notes


def test_qwen2_sliding_window_applies_from_max_window_layers():
    """Qwen2Config with use_sliding_window true: layer i slides when i >= max_window_layers (20):
    20 full layers, then 8 sliding ones of the 28."""
    config = {**load("qwen2.5-7b"), "use_sliding_window": True, "sliding_window": 4096,
              "max_window_layers": 20}
    fields = normalize(config).fields
    assert fields["layer_types"] == (F,) * 20 + (S,) * 8
    assert fields["sliding_window"] == 4096


def test_qwen3_30b_a3b():
    """Qwen/Qwen3-30B-A3B: `num_experts` 128, top-8, experts 768 wide; decoder_sparse_step 1 and
    mlp_only_layers [] -> all 48 layers MoE; explicit head_dim 128 (32 * 128 = 4096 != 2048)."""
    result = normalize(load("qwen3-30b-a3b"))
    assert result.fields == {
        **PLAIN,
        "num_hidden_layers": 48, "hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 4,
        "head_dim": 128, "vocab_size": 151936, "intermediate_size": 6144, "tie_word_embeddings": False,
        "max_position_embeddings": 40960,
        "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
        "moe_layers": tuple(range(48)),
    }
    assert result.defaults_applied == ()


def test_qwen_moe_sparse_step_and_mlp_only_layers():
    """Qwen MoE: layer i is MoE when (i + 1) % decoder_sparse_step == 0 and i not in
    mlp_only_layers. Step 2 over 48 layers: 1, 3, ..., 47; dropping 1 and 47 leaves 3, 5, ..., 45."""
    config = {**load("qwen3-30b-a3b"), "decoder_sparse_step": 2, "mlp_only_layers": [1, 47]}
    assert normalize(config).fields["moe_layers"] == tuple(range(3, 46, 2))


def test_qwen1_5_moe_shared_expert():
    """Qwen/Qwen1.5-MoE-A2.7B (model_type qwen2_moe): 60 experts of width 1408, top-4, and one
    shared expert of shared_expert_intermediate_size 5632 (no n_shared_experts key). Q/K/V biases
    come from Qwen2MoeConfig's qkv_bias default (true); mlp_only_layers defaults to []."""
    result = normalize(load("qwen1.5-moe-a2.7b"))
    assert result.fields == {
        **PLAIN,
        "num_hidden_layers": 24, "hidden_size": 2048, "num_attention_heads": 16, "num_key_value_heads": 16,
        "head_dim": 128, "vocab_size": 151936, "intermediate_size": 5632, "tie_word_embeddings": False,
        "max_position_embeddings": 8192, "attention_bias": True,
        "num_experts": 60, "num_experts_per_tok": 4, "n_shared_experts": 1, "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632, "moe_layers": tuple(range(24)),
    }
    assert defaulted(result) == ["attention_bias = true", "mlp_only_layers = []"]


def test_qwen2_moe_sliding_layers_follow_its_config_class():
    """Qwen2MoeConfig (transformers 5.24): with use_sliding_window, layer i slides when (i + 1) is
    odd and i < max_window_layers. Over 8 layers with max_window_layers 4: layers 0 and 2."""
    config = {**load("qwen1.5-moe-a2.7b"), "num_hidden_layers": 8, "use_sliding_window": True,
              "max_window_layers": 4}
    assert normalize(config).fields["layer_types"] == (S, F, S, F, F, F, F, F)


def test_mistral_7b_v0_1():
    """mistralai/Mistral-7B-v0.1: a 4096-token sliding window on all 32 layers."""
    result = normalize(load("mistral-7b-v0.1"))
    assert result.fields == {
        **PLAIN,
        "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 128, "vocab_size": 32000, "intermediate_size": 14336, "tie_word_embeddings": False,
        "max_position_embeddings": 32768, "layer_types": (S,) * 32, "sliding_window": 4096,
    }
    assert result.defaults_applied == ()


def test_mistral_window_null_is_no_window_and_absent_is_the_class_default():
    """Mistral-7B-v0.3 states sliding_window: null (no window). A file without the key gets
    MistralConfig's default of 4096, on every layer."""
    without_window = normalize({**load("mistral-7b-v0.1"), "sliding_window": None}).fields
    assert without_window["layer_types"] is None and without_window["sliding_window"] is None
    config = load("mistral-7b-v0.1")
    del config["sliding_window"]
    result = normalize(config)
    assert result.fields["layer_types"] == (S,) * 32 and result.fields["sliding_window"] == 4096
    assert defaulted(result) == ["sliding_window = 4096"]


def test_gpt_j_6b_gpt2_style_keys():
    """EleutherAI/gpt-j-6b: n_embd 4096, n_layer 28, n_head 16 (MHA, 16 KV heads), n_positions
    2048, n_inner null -> 4 * 4096 = 16384 (plain GELU MLP); head_dim 4096 / 16 = 256; no Q/K/V
    biases (GPTJAttention); no torch_dtype key."""
    result = normalize(load("gpt-j-6b"))
    assert result.fields == {
        **PLAIN,
        "num_hidden_layers": 28, "hidden_size": 4096, "num_attention_heads": 16, "num_key_value_heads": 16,
        "head_dim": 256, "vocab_size": 50400, "intermediate_size": 16384, "mlp_gated": False,
        "tie_word_embeddings": False, "max_position_embeddings": 2048,
    }
    assert defaulted(result) == ['dtype = "bf16"', "num_key_value_heads = 16", "intermediate_size = 16384"]


def test_opt_13b():
    """facebook/opt-13b: ffn_dim 20480 is the (ReLU, ungated) MLP width; 40 heads of 5120 / 40 = 128;
    tied embeddings and linear biases are OPTConfig defaults; weights in float16."""
    result = normalize(load("opt-13b"))
    assert result.fields == {
        **PLAIN,
        "name": "facebook/opt-13b",
        "num_hidden_layers": 40, "hidden_size": 5120, "num_attention_heads": 40, "num_key_value_heads": 40,
        "head_dim": 128, "vocab_size": 50272, "intermediate_size": 20480, "mlp_gated": False,
        "tie_word_embeddings": True, "max_position_embeddings": 2048, "attention_bias": True,
        "dtype": "fp16",
    }
    assert defaulted(result) == ["tie_word_embeddings = true", "attention_bias = true",
                                 "num_key_value_heads = 40"]


def test_deepseek_v2_lite_style_uncompressed_queries_and_layer_frequency():
    """DeepSeek-V2-Lite states q_lora_rank: null (queries not compressed). DeepSeek's remote code
    also skips layers with i % moe_layer_freq != 0: freq 2 after 3 dense layers over 8 layers
    leaves 4 and 6."""
    config = {**load("deepseek-v3"), "model_type": "deepseek_v2", "q_lora_rank": None,
              "num_hidden_layers": 8, "moe_layer_freq": 2}
    fields = normalize(config).fields
    assert fields["q_lora_rank"] is None and fields["kv_lora_rank"] == 512
    assert fields["moe_layers"] == (4, 6)


def test_gemma3_text_config_without_model_type_uses_gemma3_text_defaults():
    config = copy.deepcopy(load("gemma-3-27b-it"))
    del config["text_config"]["model_type"]
    assert normalize(config).fields["vocab_size"] == 262208


def test_multimodal_wrapper_of_a_known_text_family():
    """A LLaVA-style config: unknown wrapper, text_config of model_type llama."""
    config = {"model_type": "llava", "text_config": load("meta-llama-3-70b"), "vision_config": {}}
    assert normalize(config).fields["num_key_value_heads"] == 8


def test_explicit_layer_types_win_over_the_family_rule():
    config = {**load("gemma-2-9b"), "layer_types": [F] * 41 + [S]}
    assert normalize(config).fields["layer_types"] == (F,) * 41 + (S,)


def test_sliding_window_ignored_where_the_family_has_none():
    result = normalize({**load("meta-llama-3-70b"), "sliding_window": 4096})
    assert result.fields["layer_types"] is None and result.fields["sliding_window"] is None
    assert any(note.startswith("sliding_window 4096 ignored: LlamaConfig") for note in result.notes)


def test_fixed_attention_bias_overrides_the_config_and_says_so():
    result = normalize({**load("qwen2.5-7b"), "attention_bias": False})
    assert result.fields["attention_bias"] is True
    assert any(note.startswith("attention_bias ignored") for note in result.notes)


def test_integral_floats_are_integers():
    config = {**load("meta-llama-3-70b"), "hidden_size": 8192.0, "num_hidden_layers": 80.0}
    fields = normalize(config).fields
    assert fields["hidden_size"] == 8192 and type(fields["hidden_size"]) is int


def test_dtype_from_dtype_key_and_unknown_dtypes():
    assert normalize({**load("opt-13b"), "torch_dtype": None, "dtype": "bfloat16"}).fields["dtype"] == "bf16"
    result = normalize({**load("opt-13b"), "torch_dtype": "float8_e4m3fn"})
    assert result.fields["dtype"] == "bf16"
    assert 'dtype = "bf16"' in defaulted(result)


# Unknown families: no library defaults -------------------------------------------------------------


def test_unknown_model_type_with_everything_stated():
    """No library defaults: untied embeddings, gated MLP, no Q/K/V bias and MHA are stated
    assumptions, and a context the file does not give falls back to the service default."""
    config = {"model_type": "mystery", "num_hidden_layers": 2, "hidden_size": 64,
              "num_attention_heads": 4, "vocab_size": 100, "intermediate_size": 128}
    result = normalize(config)
    assert result.fields == {
        **PLAIN,
        "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4,
        "head_dim": 16, "vocab_size": 100, "intermediate_size": 128, "tie_word_embeddings": False,
        "max_position_embeddings": 4096,
    }
    assert defaulted(result) == [
        "tie_word_embeddings = false", "max_position_embeddings = 4096", "attention_bias = false",
        'dtype = "bf16"', "mlp_gated = true", "num_key_value_heads = 4",
    ]
    assert any("'mystery'" in note for note in result.notes)


def test_unknown_model_type_sliding_window_is_not_guessed():
    config = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 100,
              "intermediate_size": 128, "sliding_window": 256}
    result = normalize(config)
    assert result.fields["layer_types"] is None
    assert any(note.startswith("sliding_window 256 not applied") for note in result.notes)


def test_unknown_moe_with_expert_width_needs_no_dense_width():
    config = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 100,
              "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
    fields = normalize(config).fields
    assert fields["intermediate_size"] is None and fields["moe_layers"] == (0, 1)


# Problems ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("raw", [[], "config", None, 42, 4.5, True])
def test_non_object_input(raw):
    assert pointers_of(raw) == [""]


def test_missing_essentials_are_listed_together():
    problems = problems_of({"model_type": "mystery"})
    assert problems == [("/num_hidden_layers", "missing"), ("/hidden_size", "missing"),
                        ("/num_attention_heads", "missing"), ("/vocab_size", "missing"),
                        ("/intermediate_size", "missing")]


def test_missing_essentials_without_model_type():
    assert set(pointers_of({"hidden_size": 4096})) == {
        "/num_hidden_layers", "/num_attention_heads", "/vocab_size", "/intermediate_size"}


@pytest.mark.parametrize(("key", "value", "message"), [
    ("hidden_size", "4096", 'expected an integer, got "4096"'),
    ("hidden_size", True, "expected an integer, got true"),
    ("hidden_size", 4096.5, "expected an integer, got 4096.5"),
    ("hidden_size", float("nan"), "expected an integer, got NaN"),
    ("hidden_size", [4096], "expected an integer, got a list"),
    ("hidden_size", {"value": 4096}, "expected an integer, got an object"),
    ("hidden_size", -8192, "must be between 1 and 9007199254740992, got -8192"),
    ("hidden_size", 10**30, "must be between 1 and 9007199254740992, got an integer of 100 bits"),
    ("num_hidden_layers", 0, "must be between 1 and 1000, got 0"),
    ("num_hidden_layers", 10**6, "must be between 1 and 1000, got 1000000"),
    ("tie_word_embeddings", 0, "expected true or false, got 0"),
    ("torch_dtype", 16, "expected a string, got 16"),
])
def test_wrong_types_are_reported_at_their_pointer(key, value, message):
    assert problems_of({**load("meta-llama-3-70b"), key: value}) == [(f"/{key}", message)]


def test_every_wrong_field_is_reported_at_once():
    config = {**load("meta-llama-3-70b"), "hidden_size": "big", "vocab_size": None, "num_hidden_layers": -1}
    assert problems_of(config) == [
        ("/num_hidden_layers", "must be between 1 and 1000, got -1"),
        ("/hidden_size", 'expected an integer, got "big"'),
        ("/vocab_size", "expected an integer, got null"),
    ]


def test_null_is_absent_only_where_transformers_derives_a_none():
    """LlamaConfig(num_key_value_heads=None) means one KV head per attention head, and
    head_dim=None means hidden_size / num_attention_heads; tie_word_embeddings is a plain bool."""
    fields = normalize({**load("meta-llama-3-70b"), "num_key_value_heads": None, "head_dim": None}).fields
    assert fields["num_key_value_heads"] == 64 and fields["head_dim"] == 128
    assert problems_of({**load("meta-llama-3-70b"), "tie_word_embeddings": None}) == [
        ("/tie_word_embeddings", "expected true or false, got null")]


def test_alias_spellings_must_agree():
    problems = problems_of({**load("gpt-j-6b"), "hidden_size": 5120})
    assert problems == [("/n_embd", "conflicts with /hidden_size (5120)")]


def test_pointers_reach_into_text_config():
    config = copy.deepcopy(load("gemma-3-27b-it"))
    config["text_config"]["num_key_value_heads"] = "sixteen"
    assert pointers_of(config) == ["/text_config/num_key_value_heads"]


@pytest.mark.parametrize(("change", "pointer"), [
    ({"text_config": [1, 2]}, "/text_config"),
    ({"model_type": 7}, "/model_type"),
    ({"_name_or_path": 7}, "/_name_or_path"),
])
def test_malformed_structure(change, pointer):
    assert pointer in pointers_of({**load("gemma-3-27b-it"), **change})


def test_multimodal_wrapper_without_text_config():
    assert pointers_of({"model_type": "llama4", "vision_config": {}}) == ["/text_config"]


def test_heads_must_group_evenly_into_kv_heads():
    assert problems_of({**load("meta-llama-3-70b"), "num_key_value_heads": 7}) == [
        ("/num_key_value_heads", "num_attention_heads (64) must be a multiple of num_key_value_heads (7)")]


def test_more_heads_than_width():
    assert pointers_of({**load("mistral-7b-v0.1"), "num_attention_heads": 8192}) == ["/num_attention_heads"]


def test_experts_per_token_must_fit_the_experts():
    assert problems_of({**load("mixtral-8x7b-v0.1"), "num_experts_per_tok": 9}) == [
        ("/num_experts_per_tok", "must be at most the 8 routed experts")]


def test_unknown_moe_without_experts_per_token():
    config = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 100,
              "intermediate_size": 128, "n_routed_experts": 4}
    assert problems_of(config) == [("/num_experts_per_tok", "missing")]


def test_unknown_mla_without_head_dims():
    config = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 100,
              "intermediate_size": 128, "kv_lora_rank": 32}
    assert pointers_of(config) == ["/qk_rope_head_dim", "/qk_nope_head_dim", "/v_head_dim"]


def test_moe_layer_index_outside_the_model():
    config = copy.deepcopy(load("llama-4-scout-17b-16e-instruct"))
    config["text_config"]["moe_layers"] = [0, 1, 48]
    assert problems_of(config) == [("/text_config/moe_layers/2", "must be between 0 and 47, got 48")]


@pytest.mark.parametrize(("layer_types", "pointer"), [
    ([F] * 35, "/layer_types"),
    ([F] * 35 + ["linear_attention"], "/layer_types/35"),
    ([F] * 35 + [3], "/layer_types/35"),
    ("alternating", "/layer_types"),
])
def test_bad_layer_types(layer_types, pointer):
    assert pointers_of({**load("gpt-oss-120b"), "layer_types": layer_types}) == [pointer]


def test_sliding_layers_need_a_window():
    assert problems_of({**load("gpt-oss-120b"), "sliding_window": None}) == [("/sliding_window", "missing")]


def test_chunked_layers_need_a_chunk_size():
    config = {**load("meta-llama-3-70b"), "layer_types": [C] * 80}
    assert problems_of(config) == [("/attention_chunk_size", "missing")]


# Properties ------------------------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
FIXTURE_NAMES = sorted(path.stem for path in FIXTURES.glob("*.json"))
MODEL_SPEC_FIELDS = {f.name for f in dataclass_fields(ModelSpec)}


def assert_contract(raw: object) -> None:
    try:
        result = normalize_hf_config(raw)
    except ConfigError as exc:
        assert exc.problems
        for pointer, message in exc.problems:
            assert isinstance(pointer, str) and (pointer == "" or pointer.startswith("/"))
            assert isinstance(message, str) and message
        return
    assert set(result.fields) <= MODEL_SPEC_FIELDS
    ModelSpec(**result.fields)


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_any_json_value_gives_a_spec_or_a_config_error(raw):
    assert_contract(raw)


# Every key the reader consults, under every spelling, plus the structural ones.
READ_KEYS = sorted(
    {alias for spellings in ALIASES.values() for alias in spellings}
    | {key for family in FAMILIES.values() for key in family.defaults}
    | {"model_type", "text_config", "_name_or_path", "quantization_config", "head_dim", "layer_types",
       "moe_layers", "moe_layer_freq", "no_rope_layers", "shared_expert_intermediate_size", "n_shared_experts"}
)
PLAUSIBLE = st.one_of(
    st.integers(-2, 70), st.sampled_from([None, True, False, [], 4096, 8192.0, 2**60]),
    st.lists(st.integers(0, 50), max_size=5), st.lists(st.integers(0, 1), min_size=48, max_size=48),
    st.lists(st.sampled_from([F, S, C]), min_size=1, max_size=62),
    st.sampled_from(sorted(FAMILIES) + ["gemma3", "llama4", "RefinedWeb", "RefinedWebModel", "other"]),
)


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(FIXTURE_NAMES), st.lists(st.tuples(st.sampled_from(READ_KEYS), JSON | PLAUSIBLE),
                                                 min_size=1, max_size=6))
def test_real_configs_with_garbage_values_give_a_spec_or_a_config_error(name, edits):
    """Set keys the reader consults (in text_config when there is one) to arbitrary or plausible JSON."""
    config = load(name)
    section = config.get("text_config", config)
    for key, value in edits:
        section[key] = value
    assert_contract(config)
