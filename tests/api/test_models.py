"""/v1/models: reads, filters and writes; POST /v1/models/import with real published configs.

Expected architecture values are written from the model cards / published config.json files
and the transformers configuration classes' defaults, not from the service's output.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.problems import assert_problem

SMALL_MODEL = {
    "name": "Tiny GQA model",
    "num_hidden_layers": 4,
    "hidden_size": 512,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 32000,
    "intermediate_size": 1408,
}

# config.json files as published on the Hugging Face Hub (all keys kept, nothing added).
LLAMA_3_70B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 8192,
    "initializer_range": 0.02, "intermediate_size": 28672, "max_position_embeddings": 8192,
    "model_type": "llama", "num_attention_heads": 64, "num_hidden_layers": 80, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 500000.0,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.40.0.dev0",
    "use_cache": True, "vocab_size": 128256,
}
MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32,
    "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
    "output_router_logits": False, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.02, "sliding_window": None, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.36.0.dev0", "use_cache": True, "vocab_size": 32000,
}
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3,
    "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02, "intermediate_size": 18432,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256,
    "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 61, "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "tie_word_embeddings": False,
    "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "transformers_version": "4.33.1",
    "use_cache": True, "v_head_dim": 128, "vocab_size": 129280,
}
GEMMA_2_9B = {
    "architectures": ["Gemma2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": 1,
    "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 3584, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 8192, "model_type": "gemma2",
    "num_attention_heads": 16, "num_hidden_layers": 42, "num_key_value_heads": 8, "pad_token_id": 0,
    "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096,
    "sliding_window_size": 4096, "torch_dtype": "float32", "transformers_version": "4.42.0.dev0",
    "use_cache": True, "vocab_size": 256000,
}
GPT_OSS_120B = {
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
    "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
    "initial_context_length": 4096, "initializer_range": 0.02, "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 18, "max_position_embeddings": 131072,
    "model_type": "gpt_oss", "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 36,
    "num_key_value_heads": 8, "num_local_experts": 128, "output_router_logits": False, "pad_token_id": 199999,
    "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                       "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                     "rope_type": "yarn", "truncate": False},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
    "tie_word_embeddings": False, "transformers_version": "4.55.0.dev0", "use_cache": True, "vocab_size": 201088,
}
# Re-saved by a newer transformers: num_kv_heads 71 next to multi_query true (the model has 1 KV head).
FALCON_7B = {
    "alibi": False, "apply_residual_connection_post_layernorm": False, "architectures": ["FalconForCausalLM"],
    "attention_dropout": 0.0, "bias": False, "bos_token_id": 11, "eos_token_id": 11, "hidden_dropout": 0.0,
    "hidden_size": 4544, "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "falcon",
    "multi_query": True, "new_decoder_architecture": False, "num_attention_heads": 71, "num_hidden_layers": 32,
    "num_kv_heads": 71, "parallel_attn": True, "torch_dtype": "bfloat16", "transformers_version": "4.33.0.dev0",
    "use_cache": True, "vocab_size": 65024,
}
# Multimodal: the language model sits under text_config, which omits most fields (library defaults).
GEMMA_3_4B_IT = {
    "_name_or_path": "google/gemma-3-4b-it",
    "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999, "eoi_token_index": 256000,
    "eos_token_id": [1, 106], "image_token_index": 262144, "initializer_range": 0.02, "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                    "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "sliding_window": 1024},
    "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
    "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                      "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
                      "patch_size": 14, "vision_use_head": False},
}


# Reads --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("params", "total"), [
    ({}, 38),
    # mixtral x2, qwen3 MoE x2, deepseek-v3/r1, gpt-oss x2, llama-4 x2
    ({"architecture": "moe"}, 10),
    ({"architecture": "dense"}, 28),
    ({"attention": "mla"}, 2),  # deepseek-v3, deepseek-r1
    ({"attention": "mqa"}, 1),  # falcon-7b
    ({"attention": "mha"}, 4),  # llama-2-7b, llama-2-13b, gpt-j-6b, opt-13b
    ({"architecture": "moe", "attention": "gqa"}, 8),
])
def test_filters(client: TestClient, params: dict[str, str], total: int) -> None:
    assert client.get("/v1/models", params={**params, "limit": 200}).json()["total"] == total


def test_mha_models_are_the_ones_with_as_many_kv_heads_as_heads(client: TestClient) -> None:
    slugs = [item["slug"] for item in client.get("/v1/models", params={"attention": "mha"}).json()["items"]]
    # Llama-2-7B/13B, GPT-J-6B and OPT-13B: full multi-head attention (models.json attention_type "mha").
    assert slugs == ["gpt-j-6b", "llama-2-13b", "llama-2-7b", "opt-13b"]


def test_list_orders_by_slug_bytes(client: TestClient) -> None:
    slugs = [item["slug"] for item in client.get("/v1/models", params={"limit": 200}).json()["items"]]
    assert slugs == sorted(slugs)
    # "-" (0x2d) sorts before "." (0x2e) on every backend.
    assert slugs.index("llama-3-70b") < slugs.index("llama-3.1-8b")


def test_get_deepseek_v3(client: TestClient) -> None:
    body = client.get("/v1/models/deepseek-v3").json()
    assert (body["architecture"], body["attention_type"]) == ("moe", "mla")
    assert (body["kv_lora_rank"], body["qk_rope_head_dim"], body["num_hidden_layers"]) == (512, 64, 61)
    assert body["moe_layers"] == list(range(3, 61))
    assert (body["total_params_published"], body["active_params_published"]) == (671_000_000_000, 37_000_000_000)


def test_unknown_model_is_404(client: TestClient) -> None:
    response = client.get("/v1/models/llama-9-1t")
    assert response.status_code == 404 and response.headers["content-type"] == "application/problem+json"


# Writes -------------------------------------------------------------------------------------

def test_put_model_derives_its_kinds(client: TestClient, write_headers: dict[str, str]) -> None:
    created = client.put("/v1/models/tiny-gqa", json=SMALL_MODEL, headers=write_headers)
    assert created.status_code == 201 and created.headers["location"] == "/v1/models/tiny-gqa"
    body = created.json()
    # 8 query heads over 2 KV heads: grouped-query attention; no experts: dense.
    assert (body["architecture"], body["attention_type"], body["origin"]) == ("dense", "gqa", "user")
    assert body["max_position_embeddings"] == 4096 and body["dtype"] == "bf16"  # documented defaults
    moe = {**SMALL_MODEL, "num_experts": 8, "num_experts_per_tok": 2}
    replaced = client.put("/v1/models/tiny-gqa", json=moe, headers={
        **write_headers, "If-Match": created.headers["etag"]})
    assert replaced.status_code == 200 and replaced.json()["architecture"] == "moe"
    assert client.delete("/v1/models/tiny-gqa", headers=write_headers).status_code == 204


@pytest.mark.parametrize(("change", "pointer"), [
    ({"num_experts": 8, "num_experts_per_tok": 9}, "/body/num_experts_per_tok"),  # 9 of 8 experts
    ({"num_key_value_heads": 3}, "/body/num_attention_heads"),  # 8 heads cannot share 3 KV heads
    ({"layer_types": ["full_attention"] * 3}, "/body/layer_types"),  # 3 entries for 4 layers
    ({"layer_types": ["sliding_attention"] * 4}, "/body/sliding_window"),  # no window given
    ({"moe_layers": [7], "num_experts": 2, "num_experts_per_tok": 1}, "/body/moe_layers"),  # layer 7 of 4
    ({"kv_lora_rank": 64}, "/body/qk_rope_head_dim"),  # MLA without its head dims
])
def test_inconsistent_architecture_is_a_422_naming_the_field(client: TestClient, write_headers: dict[str, str],
                                                           change: dict[str, Any], pointer: str) -> None:
    response = client.put("/v1/models/tiny-gqa", json={**SMALL_MODEL, **change}, headers=write_headers)
    assert response.status_code == 422
    assert response.json()["errors"][0]["pointer"] == pointer


def test_the_import_slug_is_reserved(client: TestClient, write_headers: dict[str, str]) -> None:
    response = client.put("/v1/models/import", json=SMALL_MODEL, headers=write_headers)
    assert response.status_code == 422 and response.json()["errors"][0]["pointer"] == "/path/slug"


def test_model_writes_need_a_key(client: TestClient) -> None:
    assert client.put("/v1/models/tiny-gqa", json=SMALL_MODEL).status_code == 401
    assert client.delete("/v1/models/llama-2-7b").status_code == 401


# Import -------------------------------------------------------------------------------------

def _import(client: TestClient, config: dict[str, Any], slug: str = "imported", **params: Any) -> Any:
    response = client.post("/v1/models/import", params={"slug": slug, **params}, json=config)
    assert response.status_code == 200, response.text
    return response.json()


def test_import_llama_3_70b(client: TestClient) -> None:
    result = _import(client, LLAMA_3_70B)
    model = result["model"]
    assert (model["num_hidden_layers"], model["hidden_size"], model["num_attention_heads"]) == (80, 8192, 64)
    assert (model["num_key_value_heads"], model["vocab_size"], model["intermediate_size"]) == (8, 128256, 28672)
    assert model["head_dim"] in (None, 128)  # not in the config: 8192 / 64 = 128
    assert (result["architecture"], result["attention_type"], result["stored"]) == ("dense", "gqa", False)
    assert client.get("/v1/models/imported").status_code == 404  # dry run stores nothing


def test_import_mixtral_8x7b(client: TestClient) -> None:
    model = _import(client, MIXTRAL_8X7B)["model"]
    # num_local_experts -> num_experts; one width for experts (14336).
    assert (model["num_experts"], model["num_experts_per_tok"], model["intermediate_size"]) == (8, 2, 14336)
    assert model["moe_layers"] in (None, list(range(32)))  # every layer is MoE
    assert model["sliding_window"] is None and model["layer_types"] in (None, ["full_attention"] * 32)


def test_import_deepseek_v3_and_store_it(client: TestClient, write_headers: dict[str, str]) -> None:
    response = client.post("/v1/models/import", params={"slug": "my-deepseek", "dry_run": "false"},
                           json=DEEPSEEK_V3, headers=write_headers)
    assert response.status_code == 201 and response.headers["location"] == "/v1/models/my-deepseek"
    result = response.json()
    assert (result["stored"], result["version"], result["attention_type"]) == (True, 1, "mla")
    stored = client.get("/v1/models/my-deepseek").json()
    # n_routed_experts -> num_experts; first_k_dense_replace 3 keeps layers 0-2 dense.
    assert (stored["num_experts"], stored["num_experts_per_tok"], stored["n_shared_experts"]) == (256, 8, 1)
    assert (stored["moe_intermediate_size"], stored["first_k_dense_replace"]) == (2048, 3)
    assert (stored["kv_lora_rank"], stored["q_lora_rank"], stored["qk_rope_head_dim"],
            stored["qk_nope_head_dim"], stored["v_head_dim"]) == (512, 1536, 64, 128, 128)
    assert stored["moe_layers"] in (None, list(range(3, 61)))
    assert stored["origin"] == "user" and "Hugging Face config.json" in stored["source"]
    # Importing again replaces the row (200) and bumps its version.
    again = client.post("/v1/models/import", params={"slug": "my-deepseek", "dry_run": "false"},
                        json=DEEPSEEK_V3, headers=write_headers)
    assert again.status_code == 200 and again.json()["version"] == 2


def test_a_stored_import_answers_with_the_rows_etag_for_the_next_conditional_write(
        client: TestClient, write_headers: dict[str, str]) -> None:
    """As a PUT does: the ETag of the row stored (the GET's), so an If-Match write can follow without a GET; that
    write bumps the row, and the first tag is then stale (412). A dry run stores nothing and states no tag."""
    stored = client.post("/v1/models/import", params={"slug": "tagged", "dry_run": "false"}, json=LLAMA_3_70B,
                         headers=write_headers)
    assert stored.status_code == 201
    assert stored.headers["etag"] == client.get("/v1/models/tagged").headers["etag"]
    replace = {**write_headers, "If-Match": stored.headers["etag"]}
    again = client.post("/v1/models/import", params={"slug": "tagged", "dry_run": "false"}, json=LLAMA_3_70B,
                        headers=replace)
    assert again.status_code == 200 and again.headers["etag"] == client.get("/v1/models/tagged").headers["etag"]
    stale = client.post("/v1/models/import", params={"slug": "tagged", "dry_run": "false"}, json=LLAMA_3_70B,
                        headers=replace)
    assert stale.status_code == 412
    assert "etag" not in client.post("/v1/models/import", params={"slug": "tagged"}, json=LLAMA_3_70B).headers


def test_import_gemma_2_9b_applies_the_omitted_tie_default_and_alternating_windows(client: TestClient) -> None:
    result = _import(client, GEMMA_2_9B)
    model = result["model"]
    assert model["tie_word_embeddings"] is True  # Gemma2Config default; the config omits it
    assert any(line.startswith("tie_word_embeddings") for line in result["defaults_applied"])
    assert model["head_dim"] == 256 and model["sliding_window"] == 4096
    # Gemma2Config: layer i slides when (i + 1) % 2 != 0, i.e. even indices; 21 + 21 of 42.
    assert model["layer_types"] == ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(42)]


def test_import_gpt_oss_120b(client: TestClient) -> None:
    result = _import(client, GPT_OSS_120B)
    model = result["model"]
    assert (model["num_experts"], model["num_experts_per_tok"], model["head_dim"]) == (128, 4, 64)
    assert model["attention_bias"] is True and model["sliding_window"] == 128
    assert model["layer_types"] == ["sliding_attention", "full_attention"] * 18
    assert (result["architecture"], result["attention_type"]) == ("moe", "gqa")


def test_import_with_a_malformed_exclusion_list_still_reads_the_architecture(client: TestClient) -> None:
    """gpt-oss-120b's config with `modules_to_not_convert` a number instead of a list (it crashed the import
    with a 500): the architecture is read as published and the quantization note names no excluded module."""
    config = {**GPT_OSS_120B, "quantization_config": {**GPT_OSS_120B["quantization_config"],
                                                      "modules_to_not_convert": 3}}
    result = _import(client, config)
    assert (result["model"]["num_experts"], result["model"]["num_experts_per_tok"]) == (128, 4)
    note = next(note for note in result["notes"] if "quantization_config" in note)
    assert "quant_method 'mxfp4'" in note and "excluded modules" not in note


@pytest.mark.parametrize(("kv_algo", "advice"), [
    ("FP8", "size it with weight_recipe 'modelopt_fp8'"),
    (None, "size it with weight_recipe 'modelopt_fp8' and kv_dtype 'bf16'"),
])
def test_import_of_a_modelopt_checkpoint_says_whether_it_declares_its_kv_cache(
        client: TestClient, kv_algo: str | None, advice: str) -> None:
    """A ModelOpt FP8 export of Llama-3-70B. The modelopt_fp8 recipe stands for NVIDIA's exports, which declare
    kv_cache_quant_algo FP8, and engines whose 'auto' KV dtype reads it cache 1 byte per value (ENGINES.md
    sections 1 and 4). A checkpoint whose kv_cache_quant_algo is null declares none: every engine caches K and V
    in bf16, so the note adds kv_dtype 'bf16' (sized by the recipe alone its KV would be half: 80 layers x 2 x 8
    heads x 128 x 1 B = 163,840 B per token instead of 327,680)."""
    quantization = {"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": kv_algo,
                    "exclude_modules": ["lm_head"]}
    result = _import(client, {**LLAMA_3_70B, "quantization_config": quantization})
    note = next(note for note in result["notes"] if "quantization_config" in note)
    assert note.endswith(advice) if kv_algo else advice + ": it declares no KV-cache quantization" in note
    assert ("KV cache declared fp8" in note) == (kv_algo == "FP8")


def test_import_falcon_7b_ignores_the_misleading_num_kv_heads(client: TestClient) -> None:
    result = _import(client, FALCON_7B)
    model = result["model"]
    # multi_query without new_decoder_architecture: one KV head, whatever num_kv_heads says.
    assert model["num_key_value_heads"] == 1 and result["attention_type"] == "mqa"
    assert model["mlp_gated"] is False  # plain GELU MLP
    assert model["intermediate_size"] in (None, 18176)  # 4 x 4544
    # FalconConfig defaults for the omitted fields.
    assert model["tie_word_embeddings"] is True and model["max_position_embeddings"] == 2048
    defaulted = {line.split(" ", 1)[0] for line in result["defaults_applied"]}
    assert {"tie_word_embeddings", "max_position_embeddings"} <= defaulted
    assert any("num_kv_heads" in note for note in result["notes"])


def test_import_a_multimodal_config_reads_text_config_and_its_library_defaults(client: TestClient) -> None:
    result = _import(client, GEMMA_3_4B_IT)
    model = result["model"]
    assert (model["num_hidden_layers"], model["hidden_size"], model["intermediate_size"]) == (34, 2560, 10240)
    # Gemma3TextConfig defaults for what text_config omits.
    assert (model["num_attention_heads"], model["num_key_value_heads"], model["head_dim"]) == (8, 4, 256)
    assert model["vocab_size"] == 262_208 and model["sliding_window"] == 1024
    # sliding_window_pattern 6: layer i is global when (i + 1) % 6 == 0 -> 5, 11, 17, 23, 29.
    full = [i for i, kind in enumerate(model["layer_types"]) if kind == "full_attention"]
    assert full == [5, 11, 17, 23, 29]
    defaulted = {line.split(" ", 1)[0] for line in result["defaults_applied"]}
    assert {"vocab_size", "num_attention_heads", "num_key_value_heads", "head_dim"} <= defaulted
    assert model["hf_id"] == "google/gemma-3-4b-it" and model["name"] == "google/gemma-3-4b-it"


def test_import_missing_essentials_is_a_422_listing_them(client: TestClient) -> None:
    # No model_type, so no library defaults to fall back on.
    config = {key: value for key, value in LLAMA_3_70B.items()
              if key not in ("hidden_size", "num_hidden_layers", "model_type", "architectures")}
    response = client.post("/v1/models/import", params={"slug": "broken"}, json=config)
    assert response.status_code == 422
    pointers = {error["pointer"] for error in response.json()["errors"]}
    assert {"/body/hidden_size", "/body/num_hidden_layers"} <= pointers


def test_an_imported_value_out_of_the_catalogs_range_is_named_by_the_key_sent(client: TestClient) -> None:
    """Mixtral's config states its experts as num_local_experts (the catalog's num_experts): a billion of them is
    past the catalog's bound, and the 422 points at /body/num_local_experts, the key the config sent. Layers are
    held to the catalog's bound of 1,000 once, with that limit: 5,000 (which the reader's old bound of 10,000 let
    through to a second, other limit) and 100,000 alike."""
    experts = client.post("/v1/models/import", params={"slug": "x1"},
                          json={**MIXTRAL_8X7B, "num_local_experts": 1_000_000_000})
    assert_problem(experts, 422, "/body/num_local_experts")
    for layers in (5_000, 100_000):
        deep = client.post("/v1/models/import", params={"slug": "x1"}, json={**LLAMA_3_70B, "num_hidden_layers": layers})
        problem = assert_problem(deep, 422, "/body/num_hidden_layers")
        assert [error["detail"] for error in problem["errors"]] == [f"must be between 1 and 1000, got {layers}"]
    # DeepSeek-V3's 61 layers all dense (first_k_dense_replace 61) leave its 256 experts no MoE layer: the problem
    # names num_experts, which this config states as n_routed_experts (it pointed at /body alone).
    no_moe = client.post("/v1/models/import", params={"slug": "x1"}, json={**DEEPSEEK_V3, "first_k_dense_replace": 61})
    assert_problem(no_moe, 422, "/body/n_routed_experts")
    # The catalog's name comes from _name_or_path, at most 200 characters: the key the config sent is named (it
    # was /body/name, a key the body does not have).
    long_name = client.post("/v1/models/import", params={"slug": "x1"}, json={**LLAMA_3_70B, "_name_or_path": "a" * 300})
    assert_problem(long_name, 422, "/body/_name_or_path")


@pytest.mark.parametrize("body", [b"{not json", b'{"hidden_size": NaN}', b"", b"\xff\xfe\x00garbage"])
def test_import_malformed_json_is_a_422_problem(client: TestClient, body: bytes) -> None:
    response = client.post("/v1/models/import", params={"slug": "broken"}, content=body,
                           headers={"Content-Type": "application/json"})
    assert response.status_code == 422
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["errors"][0]["pointer"] == "/body"


@pytest.mark.parametrize("body", [[1, 2, 3], "config", 42, None])
def test_import_a_non_object_is_a_422(client: TestClient, body: Any) -> None:
    response = client.post("/v1/models/import", params={"slug": "broken"}, json=body)
    assert response.status_code == 422 and response.headers["content-type"] == "application/problem+json"


def test_storing_an_import_needs_a_key_but_a_dry_run_does_not(client: TestClient) -> None:
    assert client.post("/v1/models/import", params={"slug": "x1"}, json=LLAMA_3_70B).status_code == 200
    stored = client.post("/v1/models/import", params={"slug": "x1", "dry_run": "false"}, json=LLAMA_3_70B)
    assert stored.status_code == 401 and stored.headers["www-authenticate"].startswith("Bearer")
    # The key is checked before the body is read: a bad body without a key is still a 401.
    assert client.post("/v1/models/import", params={"slug": "x1", "dry_run": "false"},
                       content=b"{oops").status_code == 401
