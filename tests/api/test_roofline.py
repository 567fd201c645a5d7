"""POST /v1/roofline: FLOPs, bytes, bound and times of one step, with hand-derived expectations.

Llama-3-8B (meta-llama/Meta-Llama-3-8B config): 32 layers, hidden h = 4096, 32 query heads and 8 KV
heads of d = 128, SwiGLU width F = 14336, vocabulary V = 128,256, untied LM head. bf16 = 2 bytes.
Per layer: QKV 4096·4096 + 2·4096·1024 = 25,165,824 weights; O 4096·4096 = 16,777,216;
MLP 3·4096·14336 = 176,160,768; together 218,103,808 (x 32 = 6,979,321,856).

H100 SXM (catalog): 989.5e12 dense bf16 FLOP/s, 1979e12 fp8, 3.35e12 B/s HBM, NVLink 450e9 B/s
per direction.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.api.problems import assert_problem

URL = "/v1/roofline"
H100_BF16 = 989.5e12
H100_FP8 = 1979e12
H100_BANDWIDTH = 3.35e12

# Llama-3-8B in bf16, derived above.
LINEAR_WEIGHTS = 6_979_321_856  # all decoder-layer matmul weights
LM_HEAD = 128_256 * 4096  # 525,336,576
LINEAR_FLOPS_PER_TOKEN = 2 * LINEAR_WEIGHTS  # 13,958,643,712
LM_HEAD_FLOPS = 2 * LM_HEAD  # 1,050,673,152 per sampled position
ATTENTION_FLOPS_PER_POSITION = 2 * 32 * (128 + 128) * 32  # 524,288 per attended position, all layers


def post(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post(URL, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def operator(answer: dict[str, Any], name: str) -> dict[str, Any]:
    return next(op for op in answer["operators"] if op["name"] == name)


def test_h100_ridge_point(client: TestClient) -> None:
    """SIZING.md / seed: 989.5e12 / 3.35e12 = 295.37 FLOP per byte (the seed's "~295")."""
    answer = post(client, {"model": "llama-3-8b", "gpu": "h100-sxm", "phase": "decode", "context_tokens": 0})
    assert answer["ridge_point"] == pytest.approx(989.5e12 / 3.35e12)
    assert round(answer["ridge_point"]) == 295


def test_llama_3_8b_decode_at_batch_1_is_memory_bound(client: TestClient) -> None:
    """One decode step at 1,024 cached tokens.

    Bytes (bf16): weights once: QKV 32 x 25,165,824 x 2 = 1,610,612,736; O 1,073,741,824;
    MLP 11,274,289,152; norms (2·4096·32 + 4096) x 2 = 532,480; LM head 525,336,576 x 2 =
    1,050,673,152; embedding: one row, 4096 x 2 = 8,192.
    KV: read 1,024 cached + the new token and write the new one: 32 x 4,096 B x 1,026 = 134,479,872.
    Activations per layer: QKV in/out (4096 + 4096 + 2048) x 2 = 20,480; attention Q in, O out
    32 x 256 x 2 = 16,384; O projection (4096 + 4096) x 2 = 16,384; MLP (2·4096 + 2·14336) x 2 = 73,728;
    x 32 layers = 4,063,232; embedding output 8,192; LM head (4096 + 128,256) x 2 = 264,704.
    Total 15,148,673,536 B.
    FLOPs: 13,958,643,712 (linear) + 1,050,673,152 (LM head) + 524,288 x 1,025 (attention)
    = 15,546,712,064. Intensity 1.03, far below 295: memory-bound.
    Ideal time 15,148,673,536 / 3.35e12 = 4.522 ms. The seed's "~4.8 ms/token" reads all 16.06e9 B of
    weights, the 1.05 GB embedding table included; a step reads only one row of it."""
    answer = post(client, {"model": "llama-3-8b", "gpu": "h100-sxm", "phase": "decode", "context_tokens": 1024})
    expected_bytes = 15_148_673_536
    expected_flops = LINEAR_FLOPS_PER_TOKEN + LM_HEAD_FLOPS + ATTENTION_FLOPS_PER_POSITION * 1025
    assert expected_flops == 15_546_712_064
    assert answer["bytes"] == pytest.approx(expected_bytes, rel=1e-12)
    assert answer["flops"] == pytest.approx(expected_flops, rel=1e-12)
    assert answer["bound"] == "memory"
    assert answer["arithmetic_intensity"] == pytest.approx(expected_flops / expected_bytes)
    assert answer["ideal_time_ms"] == pytest.approx(expected_bytes / H100_BANDWIDTH * 1e3)
    assert answer["ideal_time_ms"] == pytest.approx(4.8, rel=0.07)  # the seed's figure, see above
    assert answer["ideal_tokens_per_s"] == pytest.approx(H100_BANDWIDTH / expected_bytes)
    assert answer["tokens"] == 1
    assert answer["compute_dtype"] == "bf16"
    assert operator(answer, "lm_head")["flops"] == pytest.approx(LM_HEAD_FLOPS)


def test_expected_time_applies_the_echoed_efficiencies(client: TestClient) -> None:
    """Expected never beats ideal; the overhead is the builtin profile's 0.3 ms per step plus
    3 us per layer: 0.3 + 32 x 0.003 = 0.396 ms. No all-reduce at TP1. Every operator is memory-bound
    here, so its expected time is at least its bytes at 70% of the bandwidth."""
    answer = post(client, {"model": "llama-3-8b", "gpu": "h100-sxm", "phase": "decode", "context_tokens": 1024})
    assert answer["expected_time_ms"] > answer["ideal_time_ms"]
    assert answer["overhead_time_ms"] == pytest.approx(0.396)
    assert answer["comm_time_ms"] == 0
    efficiency = answer["assumptions"]["efficiency"]
    assert efficiency["calibration_profile"] == "builtin"
    assert efficiency["bandwidth_fraction_ratio"] == 0.7
    mlp = operator(answer, "mlp")
    assert mlp["expected_time_ms"] >= mlp["bytes"] / (0.7 * H100_BANDWIDTH) * 1e3 * (1 - 1e-12)
    assert answer["expected_time_ms"] == pytest.approx(
        sum(op["expected_time_ms"] for op in answer["operators"]) + 0.396)
    assert answer["expected_tokens_per_s"] == pytest.approx(1e3 / answer["expected_time_ms"])
    assert "calibration = builtin" in answer["assumptions"]["defaults_used"]


def test_llama_3_8b_prefill_is_compute_bound_and_causal(client: TestClient) -> None:
    """Prefill of 2,048 tokens: linear 13,958,643,712 x 2,048 = 28,587,302,322,176 FLOPs; causal
    attention attends 2,048 x 2,049 / 2 = 2,098,176 positions: 524,288 x 2,098,176 =
    1,100,048,498,688 (the full n² would be ~2x); the LM head runs on the last position only:
    1,050,673,152. Total 29,688,401,494,016 FLOPs over ~24 GB: intensity ~1,200 > 295, compute-bound.
    Ideal time = FLOPs / 989.5e12 (every operator runs at the bf16 rate) = 30.0 ms."""
    answer = post(client, {"model": "llama-3-8b", "gpu": "h100-sxm", "phase": "prefill", "prompt_tokens": 2048})
    attention = ATTENTION_FLOPS_PER_POSITION * 2048 * 2049 // 2
    assert attention == 1_100_048_498_688
    total = LINEAR_FLOPS_PER_TOKEN * 2048 + attention + LM_HEAD_FLOPS
    assert total == 29_688_401_494_016
    assert answer["flops"] == pytest.approx(total, rel=1e-12)
    assert operator(answer, "attention")["flops"] == pytest.approx(attention, rel=1e-12)
    assert operator(answer, "lm_head")["flops"] == pytest.approx(LM_HEAD_FLOPS, rel=1e-12)
    assert answer["bound"] == "compute"
    assert answer["arithmetic_intensity"] > answer["ridge_point"]
    assert answer["ideal_time_ms"] == pytest.approx(total / H100_BF16 * 1e3)
    assert answer["tokens"] == 2048
    assert answer["ideal_tokens_per_s"] == pytest.approx(2048 / (total / H100_BF16))
    assert "context_tokens = 0 (no cached prefix)" in answer["assumptions"]["defaults_used"]


def test_prefill_after_a_cached_prefix(client: TestClient) -> None:
    """512 new tokens after 1,536 cached: positions attended 512 x (1,536 + 513/2) = 917,760;
    attention FLOPs 524,288 x 917,760 = 481,170,554,880."""
    answer = post(client, {"model": "llama-3-8b", "gpu": "h100-sxm", "phase": "prefill", "prompt_tokens": 512,
                           "context_tokens": 1536})
    assert 512 * (2 * 1536 + 513) // 2 == 917_760
    assert ATTENTION_FLOPS_PER_POSITION * 917_760 == 481_170_554_880
    assert operator(answer, "attention")["flops"] == pytest.approx(481_170_554_880, rel=1e-12)
    assert answer["context_tokens"] == 1536


def test_flash_attention_keeps_the_score_matrix_off_hbm(client: TestClient) -> None:
    """Naive attention writes the n x n scores and reads them back: 32 heads x 2,048 x 2,048 entries
    x 2 B x 2 directions x 32 layers = 17,179,869,184 B more than FlashAttention moves."""
    answer = post(client, {"model": "llama-3-8b", "gpu": "h100-sxm", "phase": "prefill", "prompt_tokens": 2048})
    traffic = answer["attention_traffic"]
    assert traffic["score_matrix_bytes"] == pytest.approx(17_179_869_184, rel=1e-12)
    assert traffic["flash_bytes"] == pytest.approx(operator(answer, "attention")["bytes"])
    assert traffic["naive_bytes"] == pytest.approx(traffic["flash_bytes"] + 17_179_869_184)
    assert traffic["naive_to_flash_ratio"] > 10


def test_mixtral_counts_active_experts_for_flops_and_distinct_experts_for_bytes(client: TestClient) -> None:
    """Mixtral-8x7B: 32 MoE layers of 8 experts (3 x 4096 x 14336 = 176,160,768 weights each), top-2.
    Decode of 4 sequences: FLOPs 2 x 2 experts x 176,160,768 x 32 layers x 4 tokens = 90,194,313,216.
    Bytes: 4 tokens touch 8 x (1 - (6/8)^4) = 5.46875 distinct experts per layer on average:
    5.46875 x 176,160,768 x 2 B x 32 = 61,656,268,800 B of weights, plus activations per token and
    layer (2 x 4096 + 2 x 2 x 14336) x 2 = 131,072 B: x 32 x 4 = 16,777,216. Total 61,673,046,016 B."""
    answer = post(client, {"model": "mixtral-8x7b", "gpu": "h100-sxm", "phase": "decode", "batch_size": 4,
                           "context_tokens": 100})
    moe = operator(answer, "moe")
    assert moe["flops"] == pytest.approx(90_194_313_216, rel=1e-12)
    assert moe["bytes"] == pytest.approx(61_673_046_016, rel=1e-12)


def test_tensor_parallel_adds_two_all_reduces_per_layer(client: TestClient) -> None:
    """Llama-3-70B decode, one sequence, TP8 on H100 (NVLink 450e9 B/s): 2 x 80 all-reduces of
    1 token x 8192 x 2 B = 16,384 B, each the two-GPU 7.5 us over NCCL's 8-GPU ring, 7.5 x 15.0 / 7.8
    = 14.4231 us, + 2 x 7/8 x 16,384 / 450e9 = 0.0637 us: 160 x 14.4868 us = 2.31789 ms."""
    answer = post(client, {"model": "llama-3-70b", "gpu": "h100-sxm", "phase": "decode", "context_tokens": 512,
                           "tensor_parallel": 8})
    assert answer["comm_time_ms"] == pytest.approx(160 * (7.5e-6 * 15.0 / 7.8 + 2 * 7 / 8 * 16_384 / 450e9) * 1e3)
    assert answer["comm_time_ms"] == pytest.approx(2.31789, rel=1e-5)
    single = post(client, {"model": "llama-3-70b", "gpu": "h100-sxm", "phase": "decode", "context_tokens": 512})
    assert answer["bytes"] < single["bytes"] / 7  # weights and KV split eight ways (norms replicated)


def test_fp8_weights_compute_in_fp8_on_hopper(client: TestClient) -> None:
    """H100 has an fp8 tensor rate: fp8 weights compute in fp8, ridge 1979e12 / 3.35e12 = 590.7."""
    answer = post(client, {"model": "llama-3-8b", "gpu": "h100-sxm", "phase": "decode", "context_tokens": 10,
                           "weight_dtype": "fp8"})
    assert answer["compute_dtype"] == "fp8"
    assert answer["ridge_point"] == pytest.approx(H100_FP8 / H100_BANDWIDTH)


def test_fp8_weights_on_ampere_are_weight_only(client: TestClient) -> None:
    """A100 has no fp8 tensor cores: fp8 weights are dequantized and computed in bf16,
    ridge 312e12 / 2.039e12 = 153.0."""
    answer = post(client, {"model": "llama-3-8b", "gpu": "a100-80gb-sxm", "phase": "decode",
                           "context_tokens": 10, "weight_dtype": "fp8"})
    assert answer["compute_dtype"] == "bf16"
    assert answer["ridge_point"] == pytest.approx(312e12 / 2.039e12)
    assert any(line.startswith("compute_dtype = bf16") for line in answer["assumptions"]["defaults_used"])


def test_fp4_weights_on_hopper_are_weight_only(client: TestClient) -> None:
    """H100 has no fp4 tensor rate: fp4 weights are dequantized and computed in bf16 (the rule the
    measurement predictor applies to gpt-oss MXFP4 rows on H100/H200), ridge 989.5e12 / 3.35e12 = 295.4;
    asking for fp4 compute stays a 422 (test_batch_sweep.py)."""
    answer = post(client, {"model": "llama-3-8b", "gpu": "h100-sxm", "phase": "decode", "context_tokens": 10,
                           "weight_dtype": "fp4"})
    assert answer["compute_dtype"] == "bf16"
    assert answer["ridge_point"] == pytest.approx(989.5e12 / 3.35e12)


def test_gpt_oss_in_fp4_reads_its_published_checkpoints_bf16_attention(client: TestClient) -> None:
    """gpt-oss-120b ships in fp4 only as OpenAI's MXFP4 checkpoint, whose attention is bf16: a decode step of one
    sequence at context 0 on one GPU reads the attention projections' weights at 2 B: qkv 36 x 2,880 x (64 x 64 +
    2 x 8 x 64) = 530,841,600 and out 36 x 4,096 x 2,880 = 424,673,280 params, 955,514,880 x 2 = 1,911,029,760 B,
    plus the token's activations (under 2 MB). Read as MXFP4 they would be 507,617,280 B. The batch sweep's
    weights are the recipe's 65,168,968,320 B (tests/api/test_capacity.py)."""
    answer = post(client, {"model": "gpt-oss-120b", "gpu": "h100-sxm", "phase": "decode", "context_tokens": 0})
    projections = sum(op["bytes"] for op in answer["operators"] if op["name"] in ("qkv", "out"))
    assert 1_911_029_760 < projections < 1_911_029_760 + 2_000_000
    assert any(line.startswith("weight_recipe = gpt_oss_mxfp4") for line in answer["assumptions"]["defaults_used"])
    sweep = client.post("/v1/roofline/batch-sweep", json={"model": "gpt-oss-120b", "gpu": "h100-sxm",
                                                           "context_tokens": 0, "batch_sizes": [1]}).json()
    point = sweep["points"][0]
    assert point["weights_and_kv_bytes_per_gpu"] - point["kv_bytes_per_gpu"] == 65_168_968_320


GPU_SPEC = {"name": "Hypothetical X1", "memory_bytes": 100 * 10**9, "memory_bandwidth_bytes_per_s": 2e12,
            "interconnect_bandwidth_bytes_per_s": 4e11, "bf16_tflops": 500.0}


def test_inline_gpu_and_model(client: TestClient) -> None:
    """A chip with 500 TFLOP/s bf16 and 2e12 B/s: ridge 250. A 4-layer model (h 512, 8 heads of 64,
    2 KV heads, F 1024, V 1000), decode of one token at context 0: FLOPs = 2 x linear weights
    (QKV 512·512 + 2·512·128 = 393,216; O 262,144; MLP 3·512·1024 = 1,572,864; per layer 2,228,224;
    x 4 = 8,912,896) + 2 x 512 x 1000 LM head + 2 x 8 x 128 x 1 position x 4 layers attention
    = 17,825,792 + 1,024,000 + 8,192 = 18,857,984."""
    model = {"num_hidden_layers": 4, "hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 2,
             "vocab_size": 1000, "intermediate_size": 1024}
    answer = post(client, {"model_spec": model, "gpu_spec": GPU_SPEC, "phase": "decode", "context_tokens": 0})
    assert answer["ridge_point"] == pytest.approx(250)
    assert answer["flops"] == pytest.approx(18_857_984, rel=1e-12)
    assert answer["gpu"] == "Hypothetical X1"
    assert answer["model"] == "model_spec (inline)"


def test_absurd_but_valid_sizes_answer(client: TestClient) -> None:
    """The largest bounds: a 10M-token prompt for 1M sequences is a finite (huge) answer, not an error."""
    answer = post(client, {"model": "deepseek-v3", "gpu": "h100-sxm", "phase": "prefill",
                           "prompt_tokens": 10_000_000, "batch_size": 1_000_000, "context_tokens": 10_000_000})
    assert answer["bound"] == "compute"
    answer = post(client, {"model": "mixtral-8x7b", "gpu": "h100-sxm", "phase": "decode",
                           "context_tokens": 10_000_000, "batch_size": 1_000_000})
    assert answer["bound"] == "memory"


# Bad input ---------------------------------------------------------------------------------

BASE = {"model": "llama-3-8b", "gpu": "h100-sxm", "phase": "decode", "context_tokens": 100}


@pytest.mark.parametrize(("change", "pointer"), [
    ({"phase": "train"}, "/body/phase"),
    ({"context_tokens": None}, "/body/context_tokens"),  # decode needs its cached context
    ({"prompt_tokens": 10}, "/body/prompt_tokens"),  # decode processes one token per sequence
    ({"phase": "prefill"}, "/body/prompt_tokens"),  # prefill needs its prompt
    ({"context_tokens": -1}, "/body/context_tokens"),
    ({"batch_size": 0}, "/body/batch_size"),
    ({"batch_size": 10**12}, "/body/batch_size"),
    ({"tensor_parallel": 3}, "/body/tensor_parallel"),  # 32 heads
    ({"weight_dtype": "int2"}, "/body/weight_dtype"),
    ({"kv_dtype": "int4"}, "/body/kv_dtype"),
    ({"gpu_spec": GPU_SPEC}, "/body/gpu_spec"),  # both gpu and gpu_spec
    ({"gpu": None}, "/body/gpu_spec"),  # neither
    ({"model": None}, "/body/model_spec"),
    ({"calibration": "Not A Profile!"}, "/body/calibration"),
])
def test_bad_input_is_422_naming_the_field(client: TestClient, change: dict[str, Any], pointer: str) -> None:
    body = {**BASE, **change}
    body = {key: value for key, value in body.items() if value is not None}
    assert_problem(client.post(URL, json=body), 422, pointer)


def test_compute_dtype_the_gpu_cannot_run_is_422(client: TestClient) -> None:
    """A100 has no fp8 tensor cores."""
    problem = assert_problem(client.post(URL, json={**BASE, "gpu": "a100-80gb-sxm", "compute_dtype": "fp8"}),
                             422, "/body/compute_dtype")
    assert "fp8" in problem["detail"]


@pytest.mark.parametrize("field", ["model", "gpu"])
def test_unknown_slugs_are_404(client: TestClient, field: str) -> None:
    assert_problem(client.post(URL, json={**BASE, field: "does-not-exist"}), 404)


def test_unknown_calibration_profile_is_404(client: TestClient) -> None:
    assert_problem(client.post(URL, json={**BASE, "calibration": "no-such-profile"}), 404, "/body/calibration")


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity"])
def test_non_finite_numbers_are_422(client: TestClient, literal: bytes) -> None:
    body = (b'{"model": "llama-3-8b", "phase": "decode", "context_tokens": 1, "gpu_spec": {"memory_bytes": '
            b'80000000000, "memory_bandwidth_bytes_per_s": ' + literal + b', "interconnect_bandwidth_bytes_per_s": '
            b'4e11, "bf16_tflops": 500}}')
    response = client.post(URL, content=body, headers={"content-type": "application/json"})
    assert_problem(response, 422, "/body/gpu_spec/memory_bandwidth_bytes_per_s")


# Anything in bounds answers; nothing is a 500 --------------------------------------------

MODELS = ["llama-3-8b", "mixtral-8x7b", "deepseek-v3", "gemma-2-9b", "gpt-oss-120b", "falcon-7b", "qwen3-30b-a3b"]
GPUS = ["h100-sxm", "a100-80gb-sxm", "t4", "mi300x", "b200", "tpu-v5e"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(model=st.sampled_from(MODELS), gpu=st.sampled_from(GPUS), phase=st.sampled_from(["prefill", "decode"]),
       batch_size=st.integers(1, 1_000_000), tokens=st.integers(1, 10_000_000), cached=st.integers(0, 10_000_000),
       tensor_parallel=st.sampled_from([1, 2, 3, 4, 8, 16, 64]),
       weight_dtype=st.sampled_from([None, "bf16", "fp16", "fp8", "int8", "int4", "fp4"]),
       kv_dtype=st.sampled_from([None, "bf16", "fp8"]),
       compute_dtype=st.sampled_from([None, None, "bf16", "fp8", "fp4", "int8"]))
def test_any_in_bounds_request_answers_200_or_a_422(
        client: TestClient, model: str, gpu: str, phase: str, batch_size: int, tokens: int, cached: int,
        tensor_parallel: int, weight_dtype: str | None, kv_dtype: str | None, compute_dtype: str | None) -> None:
    """Valid-looking requests either answer (finite numbers, expected never faster than ideal) or are a 422
    naming a field (a TP that does not divide the heads, a compute dtype the GPU lacks)."""
    body: dict[str, Any] = {"model": model, "gpu": gpu, "phase": phase, "batch_size": batch_size,
                            "context_tokens": cached, "tensor_parallel": tensor_parallel,
                            "weight_dtype": weight_dtype, "kv_dtype": kv_dtype, "compute_dtype": compute_dtype}
    if phase == "prefill":
        body["prompt_tokens"] = tokens
    response = client.post(URL, json={key: value for key, value in body.items() if value is not None})
    event(f"status {response.status_code}")
    if response.status_code == 422:
        assert {error["pointer"] for error in response.json()["errors"]} <= {
            "/body/tensor_parallel", "/body/compute_dtype"}
        return
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["expected_time_ms"] >= answer["ideal_time_ms"] > 0
    assert math.isfinite(answer["expected_tokens_per_s"]) and answer["expected_tokens_per_s"] > 0
    assert answer["ideal_time_ms"] == pytest.approx(max(answer["compute_time_ms"], answer["memory_time_ms"]))


def test_a_dp_ep_layout_times_one_rank_and_its_exchange(client: TestClient) -> None:
    """DeepSeek-V3 decode, 64 sequences on one of 8 attention data-parallel ranks (tp 1, ep 8): the answer
    echoes the layout and its communication is the MoE exchange (tp 1 has no all-reduce); an expert degree
    that does not divide tp x dp is a 422."""
    body = {"model": "deepseek-v3", "gpu": "h200-sxm", "phase": "decode", "batch_size": 64, "context_tokens": 1000,
            "weight_dtype": "fp8", "tensor_parallel": 1, "data_parallel": 8, "expert_parallel": 8}
    response = client.post("/v1/roofline", json=body)
    assert response.status_code == 200, response.text
    data = response.json()
    assert (data["tensor_parallel"], data["data_parallel"], data["expert_parallel"]) == (1, 8, 8)
    assert data["comm_time_ms"] > 116 * 6_422_528 / 450e9 * 1e3  # 1.656 ms of transfers alone
    assert client.post("/v1/roofline", json={**body, "expert_parallel": 3}).status_code == 422


def test_a_plain_fp4_dtype_says_how_its_weights_are_stored(client: TestClient) -> None:
    """A plain fp4 weight dtype is stored as MXFP4 (E2M1 + one 8-bit scale per 32 values: 4 + 8/32 = 4.25 bits),
    which the answer states (a review found it unsaid, and NVFP4's 4.5 bits would read 6% more). Llama-3-8B's MLPs
    at batch 1: 32 layers x 3 x 4,096 x 14,336 = 5,637,144,576 params x 4.25 / 8 = 2,994,733,056 B of weights."""
    answer = post(client, {"model": "llama-3-8b", "gpu": "b200", "phase": "decode", "context_tokens": 100,
                           "weight_dtype": "fp4"})
    storage = [line for line in answer["assumptions"]["defaults_used"] if line.startswith("weight storage")]
    assert len(storage) == 1 and "MXFP4: E2M1 + one E8M0 scale per 32: 4.25 bits a value" in storage[0]
    mlp = operator(answer, "mlp")
    assert 2_994_733_056 < mlp["bytes"] < 2_994_733_056 * 1.001  # the weights, and the few activations beside them
    bf16 = post(client, {"model": "llama-3-8b", "gpu": "b200", "phase": "decode", "context_tokens": 100})
    assert not any(line.startswith("weight storage") for line in bf16["assumptions"]["defaults_used"])


# Llama-3.1-405B (meta-llama/Llama-3.1-405B config): 126 layers, hidden 16,384, 128 query heads and 8 KV heads
# of 128, SwiGLU width 53,248. At TP8 one GPU holds per layer: QKV 16,384 x (16 + 2 x 1) x 128 = 37,748,736
# weights, O 16 x 128 x 16,384 = 33,554,432, MLP 3 x 16,384 x 53,248 / 8 = 327,155,712. Meta's FP8 checkpoint
# (recipe meta_fp8) keeps attention and the first and last layers' MLPs in bf16, the rest of the MLPs fp8.
LLAMA_405B_TP8_DECODE = {"model": "llama-3.1-405b", "gpu": "h100-sxm", "phase": "decode", "batch_size": 1,
                         "context_tokens": 0, "tensor_parallel": 8}


def test_a_checkpoint_recipe_sets_each_groups_bytes(client: TestClient) -> None:
    """weight_recipe meta_fp8 against a plain fp8 weight_dtype, one decode step at TP8: the step reads the
    attention weights in bf16 (2 bytes, not 1) and two of the 126 MLPs in bf16. Per GPU:
    QKV 126 x 37,748,736 = 4,756,340,736 bytes more; O 126 x 33,554,432 = 4,227,858,432 more;
    MLP 2 x 327,155,712 = 654,311,424 more. The activations and the KV of the step are the same."""
    plain = post(client, {**LLAMA_405B_TP8_DECODE, "weight_dtype": "fp8"})
    meta = post(client, {**LLAMA_405B_TP8_DECODE, "weight_recipe": "meta_fp8"})
    by_name = {name: {op["name"]: op["bytes"] for op in answer["operators"]}
               for name, answer in (("plain", plain), ("meta", meta))}
    assert by_name["meta"]["qkv"] - by_name["plain"]["qkv"] == 4_756_340_736
    assert by_name["meta"]["out"] - by_name["plain"]["out"] == 4_227_858_432
    assert by_name["meta"]["mlp"] - by_name["plain"]["mlp"] == 654_311_424
    assert meta["bytes"] - plain["bytes"] == 4_756_340_736 + 4_227_858_432 + 654_311_424
    assert meta["assumptions"]["weight_dtype"] == "fp8"
    assert meta["assumptions"]["weight_recipe"].startswith("meta_fp8: ")
    assert plain["assumptions"]["weight_recipe"].startswith("fp8: ")


@pytest.mark.parametrize(("change", "pointer"), [
    ({"weight_recipe": "meta_fp8", "weight_dtype": "fp4"}, "/body/weight_dtype"),  # the recipe's dtype is fp8
    ({"weight_recipe": "gpt_oss_mxfp4"}, "/body/weight_recipe"),  # MXFP4 experts: a dense model has none
    ({"weight_recipe": "no_such_recipe"}, "/body/weight_recipe"),
])
def test_a_recipe_the_request_contradicts_is_a_422(client: TestClient, change: dict[str, Any], pointer: str) -> None:
    assert_problem(client.post(URL, json={**LLAMA_405B_TP8_DECODE, **change}), 422, pointer)
