"""POST /v1/kv-cache: KV-cache bytes from the architecture, with hand-derived expectations.

Architectures used (Hugging Face config.json values, as in the reference catalog):
- Llama-3-70B: 80 layers, 64 query heads, 8 KV heads, head_dim 128 (8192 / 64).
- DeepSeek-V3: 61 layers, MLA with kv_lora_rank 512 and qk_rope_head_dim 64; 128 heads with
  qk_nope_head_dim 128 and v_head_dim 128; weights published in fp8.
- Gemma-2-9B: 42 layers alternating sliding (window 4096, even indices) and global; 8 KV heads of 256.
- gpt-oss-120b: 36 layers alternating sliding (window 128) and global; 8 KV heads of 64.
- Falcon-7B: multi-query (1 KV head), 71 heads of 64, 32 layers.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.api.problems import assert_problem

URL = "/v1/kv-cache"
GIB = 2**30


def post(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post(URL, json=body)
    assert response.status_code == 200, response.text
    return response.json()


# The seed's worked example ------------------------------------------------------------------

def test_llama_3_70b_matches_the_seed(client: TestClient) -> None:
    """Seed: "Per token: 2 · 80 · 8 · 128 · 2 bytes = 327,680 bytes ≈ 320 KB/token"; at 8k context
    327,680 x 8,192 = 2,684,354,560 B (the seed's "≈ 2.56 GB" is 2.5 GiB); at batch 32
    x 32 = 85,899,345,920 B (80 GiB: "more than a single 80 GB H100 holds").
    MHA would cache 64 heads instead of 8: 2·80·64·128·2·8192 = 21,474,836,480 B, so GQA saves 1 - 8/64."""
    answer = post(client, {"model": "llama-3-70b", "context_tokens": 8192, "batch_size": 32})
    assert answer["bytes_per_token"] == 327_680
    assert answer["bytes_per_sequence"] == 2_684_354_560
    assert answer["total_bytes"] == 85_899_345_920
    assert answer["bytes_per_gpu"] == 85_899_345_920  # one GPU holds it all at tp = pp = 1
    assert answer["sizes_for_people"]["bytes_per_sequence"] == {"gb": 2.684355, "gib": 2.5}
    assert answer["sizes_for_people"]["total_bytes"] == {"gb": 85.899346, "gib": 80.0}
    assert answer["breakdown"] == [{"kind": "full_attention", "window_tokens": None, "layers": 80,
                                    "bytes_per_token_per_layer": 4096, "tokens_cached": 8192,
                                    "bytes_per_sequence": 2_684_354_560}]
    assert answer["mha_equivalent_bytes_per_sequence"] == 21_474_836_480
    assert answer["mha_saving_ratio"] == pytest.approx(1 - 8 / 64)
    assert answer["curve"] is None  # no window layers: one slope
    assert answer["kv_dtype"] == "bf16"
    assert "kv_dtype = bf16" in " ".join(answer["assumptions"]["defaults_used"])
    assert "2 (K and V) x 8 KV heads x 128 head_dim x 2 bytes (bf16) = 4,096 B" in answer["formula"]
    assert answer["calculation_version"] == "2026.12.07.7"


@pytest.mark.parametrize("tensor_parallel", [8, 16])
def test_kv_heads_replicate_beyond_their_count(client: TestClient, tensor_parallel: int) -> None:
    """Llama-3-70B has 8 KV heads: at TP8 each GPU holds ceil(8/8) = 1 and at TP16 still
    ceil(8/16) = 1 (replicated), so 2·80·1·128·2 = 40,960 B per token per GPU in both cases.
    1,000 tokens x 4 sequences: 40,960 x 1,000 x 4 = 163,840,000 B per GPU."""
    answer = post(client, {"model": "llama-3-70b", "context_tokens": 1000, "batch_size": 4,
                           "tensor_parallel": tensor_parallel})
    assert answer["bytes_per_sequence_per_gpu"] == 40_960_000
    assert answer["bytes_per_gpu"] == 163_840_000
    assert answer["bytes_per_sequence"] == 327_680_000  # the logical size does not change
    assert f"ceil(8/{tensor_parallel}) = 1 KV heads" in answer["formula"]


def test_deepseek_v3_mla_latent_is_not_split_by_tensor_parallelism(client: TestClient) -> None:
    """MLA caches one latent of kv_lora_rank + qk_rope_head_dim = 512 + 64 = 576 values per token
    per layer, no factor 2: 61 x 576 x 2 B = 70,272 B per token (SIZING.md). 10,000 tokens:
    702,720,000 B = 0.65446 GiB (SIZING.md). The latent is replicated on every rank, so TP8 leaves
    each GPU the full 702,720,000 B.
    MHA equivalent: 128 heads x (128 + 64 + 128) = 40,960 values per token per layer:
    40,960 x 2 x 61 x 10,000 = 49,971,200,000 B; saving 1 - 576/40,960."""
    answer = post(client, {"model": "deepseek-v3", "kv_dtype": "bf16", "context_tokens": 10_000,
                           "tensor_parallel": 8})
    assert answer["bytes_per_token"] == 70_272
    assert answer["bytes_per_sequence"] == 702_720_000
    assert answer["bytes_per_sequence_per_gpu"] == 702_720_000
    assert answer["sizes_for_people"]["bytes_per_gpu"]["gib"] == pytest.approx(0.65446, abs=5e-6)
    assert answer["breakdown"][0]["kind"] == "mla"
    assert answer["mha_equivalent_bytes_per_sequence"] == 49_971_200_000
    assert answer["mha_saving_ratio"] == pytest.approx(1 - 576 / 40_960)
    assert "latent is replicated on every GPU" in answer["formula"]


def test_quantized_checkpoint_keeps_a_16_bit_kv_cache_by_default(client: TestClient) -> None:
    """DeepSeek-V3 ships fp8 weights, but engines cache KV at the activation precision unless KV
    quantization is asked for: the default is bf16, 70,272 B per token, and the answer says why."""
    answer = post(client, {"model": "deepseek-v3", "context_tokens": 100})
    assert answer["kv_dtype"] == "bf16"
    assert answer["bytes_per_sequence"] == 7_027_200
    assert "fp8" in answer["assumptions"]["kv_dtype_source"]


def test_fp8_kv_halves_the_cache(client: TestClient) -> None:
    """One byte per value: 2·80·8·128·1 = 163,840 B per token; x 8,192 = 1,342,177,280 B."""
    answer = post(client, {"model": "llama-3-70b", "kv_dtype": "fp8", "context_tokens": 8192})
    assert answer["bytes_per_token"] == 163_840
    assert answer["bytes_per_sequence"] == 1_342_177_280
    assert answer["assumptions"]["kv_dtype_source"] == "requested"
    assert answer["assumptions"]["defaults_used"] == []


def test_falcon_7b_is_multi_query(client: TestClient) -> None:
    """One KV head of 64 for all 71 query heads: 2·32·1·64·2 = 8,192 B per token; 2,048 tokens:
    16,777,216 B. MHA would hold 71 heads: 71 x 16,777,216 = 1,191,182,336 B; saving 1 - 1/71."""
    answer = post(client, {"model": "falcon-7b", "context_tokens": 2048})
    assert answer["bytes_per_sequence"] == 16_777_216
    assert answer["mha_equivalent_bytes_per_sequence"] == 1_191_182_336
    assert answer["mha_saving_ratio"] == pytest.approx(1 - 1 / 71)


def test_paged_blocks_round_each_sequence_up(client: TestClient) -> None:
    """1,000 tokens in blocks of 16: ceil(1000/16) = 63 blocks = 1,008 tokens;
    327,680 x 1,008 = 330,301,440 B; per token of context 330,301,440 / 1,000 = 330,301.44 B.
    The MHA comparison stays unpaged: saving 1 - 8/64."""
    answer = post(client, {"model": "llama-3-70b", "context_tokens": 1000, "block_size": 16})
    assert answer["tokens_cached_per_sequence"] == 1008
    assert answer["bytes_per_sequence"] == 330_301_440
    assert answer["bytes_per_token"] == pytest.approx(330_301.44)
    assert answer["mha_saving_ratio"] == pytest.approx(0.875)


def test_pipeline_parallel_counts_the_most_loaded_stage(client: TestClient) -> None:
    """80 layers over 3 stages: 26 each, the 2 left over go to the stages before the last
    (27, 27, 26). The most loaded stage: 27 x 4,096 B x 1,000 tokens = 110,592,000 B."""
    answer = post(client, {"model": "llama-3-70b", "context_tokens": 1000, "pipeline_parallel": 3})
    assert answer["bytes_per_sequence_per_gpu"] == 110_592_000
    assert answer["bytes_per_gpu"] == 110_592_000


# Window layers: a curve, not a slope ------------------------------------------------------

def test_gemma_2_9b_curve_has_a_kink_at_the_window(client: TestClient) -> None:
    """Per token per layer 2·8·256·2 = 8,192 B. Up to 4,096 tokens all 42 layers grow:
    42 x 8,192 = 344,064 B per token (4,096 tokens: 1,409,286,144 B). Beyond, only the 21 global
    layers do: 21 x 8,192 = 172,032 B per token on top of 21 x 8,192 x 4,096 = 704,643,072 B of
    full windows. 2,048 tokens: 344,064 x 2,048 = 704,643,072 B; 8,192 tokens (the model's
    maximum): 172,032 x 8,192 + 704,643,072 = 2,113,929,216 B."""
    answer = post(client, {"model": "gemma-2-9b", "context_tokens": 2048})
    assert answer["bytes_per_sequence"] == 704_643_072
    curve = answer["curve"]
    assert curve["breakpoints_tokens"] == [4096]
    assert curve["points"] == [
        {"context_tokens": 0, "bytes_per_sequence": 0},
        {"context_tokens": 2048, "bytes_per_sequence": 704_643_072},
        {"context_tokens": 4096, "bytes_per_sequence": 1_409_286_144},
        {"context_tokens": 8192, "bytes_per_sequence": 2_113_929_216},
    ]
    assert "No single bytes-per-token slope" in curve["note"]
    assert "344,064 B per token" in curve["note"] and "172,032 B per token" in curve["note"]
    kinds = {group["kind"]: group for group in answer["breakdown"]}
    assert kinds["sliding_attention"]["layers"] == kinds["full_attention"]["layers"] == 21
    assert kinds["sliding_attention"]["window_tokens"] == 4096


def test_gemma_2_9b_window_layers_stop_at_the_window(client: TestClient) -> None:
    """At 8,192 tokens the sliding layers hold 4,096: 21 x 8,192 x 4,096 + 21 x 8,192 x 8,192
    = 704,643,072 + 1,409,286,144 = 2,113,929,216 B; the average per token 258,048 B is neither
    slope. A single-slope calculator would say 344,064 x 8,192 = 2,818,572,288 B."""
    answer = post(client, {"model": "gemma-2-9b", "context_tokens": 8192})
    assert answer["bytes_per_sequence"] == 2_113_929_216
    assert answer["bytes_per_token"] == 258_048


def test_paged_window_layers_hold_the_blocks_their_window_can_straddle(client: TestClient) -> None:
    """Blocks of 16 at 8,192 tokens: a global layer holds 512 blocks = 8,192 tokens; a window of
    4,096 rarely starts on a block boundary and spans up to ceil(4095/16) + 1 = 257 blocks = 4,112
    tokens. 21 x 8,192 x (8,192 + 4,112) = 2,116,681,728 B."""
    answer = post(client, {"model": "gemma-2-9b", "context_tokens": 8192, "block_size": 16})
    assert answer["bytes_per_sequence"] == 2_116_681_728
    kinds = {group["kind"]: group["tokens_cached"] for group in answer["breakdown"]}
    assert kinds == {"sliding_attention": 4112, "full_attention": 8192}


def test_gpt_oss_120b_windows_of_128(client: TestClient) -> None:
    """2·8·64·2 = 2,048 B per token per layer. At 1,000 tokens the 18 sliding layers hold 128
    tokens and the 18 global ones 1,000: 18 x 2,048 x 128 + 18 x 2,048 x 1,000
    = 4,718,592 + 36,864,000 = 41,582,592 B. The weights are fp4; the KV default is bf16."""
    answer = post(client, {"model": "gpt-oss-120b", "context_tokens": 1000})
    assert answer["kv_dtype"] == "bf16"
    assert answer["bytes_per_sequence"] == 41_582_592
    points = {point["context_tokens"]: point["bytes_per_sequence"] for point in answer["curve"]["points"]}
    assert points[128] == 36 * 2048 * 128  # below the window every layer grows
    assert answer["curve"]["breakpoints_tokens"] == [128]


# Inline architectures ----------------------------------------------------------------------

SMALL_MODEL = {
    "num_hidden_layers": 4, "hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 2,
    "vocab_size": 1000, "intermediate_size": 1024,
}


def test_inline_model_spec(client: TestClient) -> None:
    """head_dim 512/8 = 64; 2·4·2·64·2 = 2,048 B per token; 100 tokens x 3 sequences = 614,400 B."""
    answer = post(client, {"model_spec": SMALL_MODEL, "context_tokens": 100, "batch_size": 3})
    assert answer["model"] == "model_spec (inline)"
    assert answer["bytes_per_sequence"] == 204_800
    assert answer["total_bytes"] == 614_400


def test_inline_model_spec_with_windows(client: TestClient) -> None:
    """Layers full, sliding(64), full, sliding(64): 2,048 / 4 = 512 B per token per layer. At 100
    tokens: 2 x 512 x 100 + 2 x 512 x 64 = 102,400 + 65,536 = 167,936 B."""
    spec = {**SMALL_MODEL, "sliding_window": 64,
            "layer_types": ["full_attention", "sliding_attention", "full_attention", "sliding_attention"]}
    answer = post(client, {"model_spec": spec, "context_tokens": 100})
    assert answer["bytes_per_sequence"] == 167_936
    assert answer["curve"]["breakpoints_tokens"] == [64]


# Bad input ---------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/v1/kv-cache", "/v1/capacity", "/v1/roofline"])
def test_an_inline_model_whose_derived_head_dim_is_zero_is_a_422(client: TestClient, path: str) -> None:
    """hidden_size 8 over 16 heads without head_dim: 8 // 16 = 0 values per head, which divided by zero in the
    KV, roofline and capacity answers (a 500). The spec is refused naming head_dim; given, it is read."""
    spec = {"num_hidden_layers": 2, "hidden_size": 8, "num_attention_heads": 16, "num_key_value_heads": 16,
            "vocab_size": 100}
    body = {"model_spec": spec, "gpu": "h100-sxm", "context_tokens": 10, "input_tokens": 10, "output_tokens": 10,
            "phase": "decode"}
    body = {key: value for key, value in body.items()
            if key in {"/v1/kv-cache": ("model_spec", "context_tokens"),
                       "/v1/capacity": ("model_spec", "gpu", "input_tokens", "output_tokens"),
                       "/v1/roofline": ("model_spec", "gpu", "phase", "context_tokens")}[path]}
    problem = assert_problem(client.post(path, json=body), 422, "/body/model_spec/head_dim")
    assert "hidden_size // num_attention_heads would be 0" in problem["detail"]
    assert client.post(path, json={**body, "model_spec": {**spec, "head_dim": 4}}).status_code == 200


@pytest.mark.parametrize("body", [
    {"context_tokens": 10},
    {"model": "llama-3-70b", "model_spec": SMALL_MODEL, "context_tokens": 10},
])
def test_exactly_one_of_model_and_model_spec(client: TestClient, body: dict[str, Any]) -> None:
    problem = assert_problem(client.post(URL, json=body), 422, "/body/model_spec")
    assert "exactly one of model" in problem["errors"][0]["detail"]


def test_unknown_model_is_404(client: TestClient) -> None:
    problem = assert_problem(client.post(URL, json={"model": "no-such-model", "context_tokens": 10}), 404)
    assert "no-such-model" in problem["detail"]


@pytest.mark.parametrize(("field", "value"), [
    ("context_tokens", -1),
    ("context_tokens", 0),
    ("context_tokens", 10_000_001),
    ("context_tokens", "8192"),  # strict: a number, not a string
    ("context_tokens", 8192.5),
    ("batch_size", 0),
    ("batch_size", 1_000_001),
    ("tensor_parallel", 0),
    ("pipeline_parallel", -2),
    ("block_size", 0),
    ("kv_dtype", "int4"),
    ("model", "Llama 3"),
    ("unexpected", 1),
])
def test_out_of_range_fields_are_422_naming_the_field(client: TestClient, field: str, value: Any) -> None:
    body = {"model": "llama-3-70b", "context_tokens": 8192, field: value}
    assert_problem(client.post(URL, json=body), 422, f"/body/{field}")


def test_nan_literal_is_422(client: TestClient) -> None:
    response = client.post(URL, content=b'{"model": "llama-3-70b", "context_tokens": NaN}',
                           headers={"content-type": "application/json"})
    assert_problem(response, 422, "/body/context_tokens")


def test_tensor_parallel_must_divide_the_heads(client: TestClient) -> None:
    """Llama-3-70B has 64 query heads; 3 does not divide them."""
    problem = assert_problem(client.post(URL, json={"model": "llama-3-70b", "context_tokens": 10,
                                                    "tensor_parallel": 3}), 422, "/body/tensor_parallel")
    assert "64" in problem["errors"][0]["detail"]


def test_more_pipeline_stages_than_layers_is_422(client: TestClient) -> None:
    assert_problem(client.post(URL, json={"model": "llama-3-70b", "context_tokens": 10,
                                          "pipeline_parallel": 81}), 422, "/body/pipeline_parallel")


def test_inconsistent_inline_architecture_is_422_inside_model_spec(client: TestClient) -> None:
    """8 query heads cannot be shared evenly by 3 KV heads."""
    spec = {**SMALL_MODEL, "num_key_value_heads": 3}
    problem = assert_problem(client.post(URL, json={"model_spec": spec, "context_tokens": 10}), 422)
    assert all(error["pointer"].startswith("/body/model_spec") for error in problem["errors"])


def test_absurd_but_valid_sizes_answer_without_overflow(client: TestClient) -> None:
    """The largest bounds: 10,000,000 tokens x 1,000,000 sequences of Llama-3-70B
    = 327,680 x 10^7 x 10^6 = 3,276,800,000,000,000,000 B, exact."""
    answer = post(client, {"model": "llama-3-70b", "context_tokens": 10_000_000, "batch_size": 1_000_000})
    assert answer["total_bytes"] == 3_276_800_000_000_000_000


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(model=st.sampled_from(["llama-3-70b", "deepseek-v3", "gemma-2-9b", "gpt-oss-120b", "falcon-7b",
                              "mixtral-8x7b", "llama-4-scout"]),
       context_tokens=st.integers(1, 10_000_000), batch_size=st.integers(1, 1_000_000),
       tensor_parallel=st.sampled_from([1, 2, 3, 8, 16, 128]), pipeline_parallel=st.integers(1, 100),
       block_size=st.sampled_from([None, 1, 16, 32, 1000]), kv_dtype=st.sampled_from([None, "bf16", "fp8", "int8"]))
def test_any_in_bounds_request_answers_200_or_a_422(
        client: TestClient, model: str, context_tokens: int, batch_size: int, tensor_parallel: int,
        pipeline_parallel: int, block_size: int | None, kv_dtype: str | None) -> None:
    """In-bounds requests answer, or are a 422 naming the parallelism that does not fit the model. Sharding
    never puts more on one GPU than the whole batch holds, paging rounds the context up to whole blocks, and
    GQA/MQA/MLA never cache more than multi-head attention would."""
    body = {"model": model, "context_tokens": context_tokens, "batch_size": batch_size,
            "tensor_parallel": tensor_parallel, "pipeline_parallel": pipeline_parallel, "block_size": block_size,
            "kv_dtype": kv_dtype}
    response = client.post(URL, json={key: value for key, value in body.items() if value is not None})
    event(f"status {response.status_code}")
    if response.status_code == 422:
        assert {error["pointer"] for error in response.json()["errors"]} <= {
            "/body/tensor_parallel", "/body/pipeline_parallel"}
        return
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["total_bytes"] == answer["bytes_per_sequence"] * batch_size
    assert answer["bytes_per_gpu"] <= answer["total_bytes"]
    # Every model here has global layers, which hold the whole context, rounded up to whole blocks.
    blocks = context_tokens if block_size is None else -(-context_tokens // block_size) * block_size
    assert answer["tokens_cached_per_sequence"] == blocks
    assert 0 <= answer["mha_saving_ratio"] < 1
